"""Expensive results computed once per test session, even when pytest-xdist runs the tests that
share them on different workers.

A module-scoped fixture runs once per *worker*: xdist deals a module's tests out to both workers
(round robin at first), so a fixture that trains or launches torchrun for several tests would run
twice. :func:`once` keeps the result as JSON in the session's temporary root, which every worker
of one session shares; the first worker to ask computes it under a file lock, the others wait for
the lock and read it (the pattern pytest-xdist documents for session fixtures).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

# set in the environment of a test's own subprocesses (managers, side tasks, ranks): harvesting's
# processes keep normal priority (flowride.harvest.limits.idle_priority says why)
NORMAL_PRIORITY = {"FLOWRIDE_HARVEST_PRIORITY": "normal"}


def session_root(tmp_path_factory) -> Path:
    """The temporary directory all workers of this session share."""
    base = Path(tmp_path_factory.getbasetemp())
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory, name: str, make: Callable[[Path], Any]) -> Any:
    """``make(directory)``'s JSON-able result, computed once per session: ``directory`` is kept
    (``session_root/name``) for files the result names."""
    root = session_root(tmp_path_factory)
    done = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return json.loads(done.read_text())
        where = root / name
        where.mkdir(exist_ok=True)
        value = make(where)
        done.write_text(json.dumps(value))
        return value


def tiny_1f1b_report(tmp_path_factory, engine: str) -> dict:
    """The report of one small training run, shared by every test that needs just that run (its
    report contract, its losses): 1F1B, 2 stages, 4 micro-batches, the tiny preset, 4
    iterations, on ``engine`` (builtin or torch)."""
    from flowride.pipeline.config import TrainConfig
    from flowride.pipeline.trainer import train

    def make(where: Path) -> dict:
        cfg = TrainConfig(schedule="1f1b", stages=2, microbatches=4, model="tiny", iters=4, run_dir=str(where / "run"),
                          engine=engine)
        return train(cfg).report()

    return once(tmp_path_factory, f"tiny-1f1b-{engine}", make)
