"""Built-in side tasks. Importing this package registers nothing: each task is declared by name
in pyproject.toml's ``[project.entry-points."flowride.sidetasks"]`` table, which
:mod:`flowride.harvest.task` reads when a name is looked up (another package adds its own tasks
the same way). Harvest sits below these tasks and never imports them by name.

Each task uses only the public interface in :mod:`flowride.harvest.task` (plus numpy, scipy and
torch), so it is also an example of how to write one:

========== ============ ========= ==============================================================
name       form         unit      work (entry point)
========== ============ ========= ==============================================================
cnn        iterative    samples   small ResNet-style CNN, one SGD batch per step
                                  (``flowride.sidetasks.cnn:CnnTask``)
pagerank   iterative    sweeps    PageRank power iteration on a generated power-law digraph
                                  (``flowride.sidetasks.graph:PageRankTask``)
sssp       iterative    sweeps    Bellman-Ford relaxation sweeps on the same graph, weighted
                                  (``flowride.sidetasks.graph:SsspTask``)
image      iterative    images    resize + watermark, one batch per step
                                  (``flowride.sidetasks.image:ImageTask``)
image-proc imperative   images    the same image work as a free-form process (SIGTERM = save)
                                  (``flowride.sidetasks.image:IMAGE_PROC``, an ImperativeSpec)
========== ============ ========= ==============================================================

The task classes are also importable from here (on first use, so that importing one task's
module does not import the others, and torch with them).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "CnnTask": "flowride.sidetasks.cnn",
    "PageRankTask": "flowride.sidetasks.graph",
    "SsspTask": "flowride.sidetasks.graph",
    "ImageTask": "flowride.sidetasks.image",
    "image_proc_main": "flowride.sidetasks.image",
    "IMAGE_PROC": "flowride.sidetasks.image",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'flowride.sidetasks' has no attribute {name!r}")
