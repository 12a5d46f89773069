"""Harvesting pipeline bubbles for side tasks (after FreeRide): the public face.

For training jobs:

- :func:`attach` (``flowride.harvest.attach(schedule, run_dir=..., side_tasks=[...])``): harvest
  a torch.distributed.pipelining schedule's bubbles, one call per rank;
- :func:`connect` and :class:`BubbleReporter`: for any other training loop (hand-written,
  Megatron-LM, DeepSpeed), say "idle now" / "busy again" around the waits (docs/harvest.md
  says where);
- :func:`compare`: train alone and with side tasks, overhead measured paired (what
  ``flowride train --side-tasks`` runs).

For side-task authors (see :mod:`flowride.harvest.task` and docs/harvest.md): the two forms,
:class:`IterativeTask` and :class:`ImperativeSpec`; :func:`parse_params` for a task's config;
and, to make a task available by name, an entry point in the :data:`ENTRY_POINT_GROUP`
(``flowride.sidetasks``) group of the author's package, or :func:`register` at run time.
:class:`TaskSpec` is a submission; :func:`known_names` lists the names that resolve.

Nothing here imports :mod:`flowride.sidetasks`, :mod:`flowride.cli` or :mod:`flowride.api`:
harvest sits below them (the built-in tasks reach it through the entry-point table).

Names are imported on first use, so the side-task host process (``flowride.harvest.runner``)
does not pay for torch.distributed to start.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "attach": "flowride.harvest.training",
    "Harvest": "flowride.harvest.training",
    "connect": "flowride.harvest.training",
    "BubbleReporter": "flowride.pipeline.reporter",
    "compare": "flowride.harvest.session",
    "IterativeTask": "flowride.harvest.task",
    "ImperativeSpec": "flowride.harvest.task",
    "TaskSpec": "flowride.harvest.task",
    "register": "flowride.harvest.task",
    "known_names": "flowride.harvest.task",
    "parse_params": "flowride.harvest.task",
    "ENTRY_POINT_GROUP": "flowride.harvest.task",
    "ManagerProcess": "flowride.harvest.supervise",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'flowride.harvest' has no attribute {name!r}")
