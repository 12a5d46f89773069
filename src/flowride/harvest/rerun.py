"""Re-runs: the tasks a run names are the tasks it runs (docs/harvest.md, "Re-runs").

The task store outlives the run that filled it, so a second run into the same run directory
finds the first one's unfinished tasks. The rule, the same for ``flowride train --side-tasks``,
``attach``/``connect`` and either store:

- a task's identity across runs is its name and its parameters as canonical JSON
  (:func:`identity`);
- a run that names tasks takes, for each naming, the oldest unfinished task of the same identity
  that it has not already taken (``pagerank,pagerank`` takes two), and submits only the namings
  it found no task for (:func:`choose`);
- the unfinished tasks it does not name, left from other runs, stay in the store as they are
  (PAUSED or SUBMITTED, resumable later) and do not run, unless the run asks for them
  (``--resume-leftovers``, ``resume_leftovers=True``). The manager is told which tasks are the
  run's (``ManagerOptions.run_tasks``) and when the run began (``run_since``): it runs those,
  and the tasks submitted while it runs (``flowride tasks submit``), and nothing else
  (:func:`runs`), in its start-up recovery too;
- every task records where it came from (the store's ``origin`` column, set per run).

The cluster queue (PostgreSQL) holds the cluster's work, which outlives jobs and which any host
leases: a run there submits only the named tasks that have no unfinished twin in the queue, and
the tasks left in it are leased by any manager, as before (``--resume-leftovers`` is implied).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from flowride.harvest.store import TaskRecord

SUBMITTED = "submitted by this run"
RESUMED = "resumed from an earlier run (same name and parameters)"
LEFTOVER = "left from an earlier run (--resume-leftovers)"
WHILE_RUNNING = "submitted while running"
BY_HAND = "submitted with flowride tasks submit"


def identity(name: str, params: dict | None) -> tuple[str, str]:
    """What makes two tasks the same task across runs: the name and the parameters as canonical JSON."""
    return name, json.dumps(params or {}, sort_keys=True, separators=(",", ":"))


def choose(unfinished: Sequence[TaskRecord], named: Sequence[tuple[str, dict]]
           ) -> tuple[list[TaskRecord], list[tuple[str, dict]], list[TaskRecord]]:
    """(the unfinished tasks the namings resume, the namings to submit, the unfinished tasks left
    over). Each naming takes the oldest unfinished twin not yet taken; a task whose cancel was
    asked for is never taken (it is not resumed against its user's wish)."""
    free = sorted((t for t in unfinished if not t.cancel_requested), key=lambda t: t.id)
    resume: list[TaskRecord] = []
    submit: list[tuple[str, dict]] = []
    for name, params in named:
        key = identity(name, params)
        twin = next((t for t in free if identity(t.name, t.params) == key), None)
        if twin is None:
            submit.append((name, params))
        else:
            free.remove(twin)
            resume.append(twin)
    taken = {t.id for t in resume}
    return resume, submit, [t for t in unfinished if t.id not in taken]


def prepare_run(store: Any, named: Sequence[tuple[str, dict]], resume_leftovers: bool = False) -> dict:
    """Apply the rule to ``store`` for a run naming ``named`` (name, params) pairs: resume the
    twins, submit the rest, and, with ``resume_leftovers``, take the leftovers too (always in the
    queue, whose leftovers any manager leases). Returns ``ids`` (the run's tasks), ``tasks``
    (id, name, origin of each), ``left`` (the unfinished tasks it does not run) and ``since``
    (when the run began: later submissions count as submitted while running)."""
    since = time.time()
    with store.run_lock():
        resume, submit, left = choose(store.unfinished(), named)
        chosen = [(t, RESUMED) for t in resume]
        if store.is_queue:
            left = []  # the cluster's work: any host's manager leases it, as before
        elif resume_leftovers:  # ... but not one whose cancel was asked for
            chosen += [(t, LEFTOVER) for t in left if not t.cancel_requested]
            left = [t for t in left if t.cancel_requested]
        tasks = []
        for t, origin in chosen:
            store.resume_for_run(t.id, origin)
            tasks.append({"id": t.id, "name": t.name, "origin": origin})
        for name, params in submit:
            tasks.append({"id": store.submit(name, params, origin=SUBMITTED), "name": name, "origin": SUBMITTED})
    return {"ids": [t["id"] for t in tasks], "tasks": tasks, "since": since,
            "left": [{"id": t.id, "name": t.name, "state": str(t.state), "origin": t.origin} for t in left]}


def runs(rec: TaskRecord, opts: Any) -> bool:
    """Whether the manager started with ``opts`` runs ``rec``: one of the run's tasks, or one
    submitted while it runs (every task, for options that name none: an older manager.json)."""
    ids = getattr(opts, "run_tasks", None)
    if ids is None:
        return True
    since = getattr(opts, "run_since", None)
    return rec.id in ids or (since is not None and rec.created >= since)


def takes(store: Any, rec: TaskRecord, opts: Any) -> bool:
    """:func:`runs`, and a task submitted while the run runs is labelled so when first taken."""
    if not runs(rec, opts):
        return False
    if opts.run_tasks is not None and rec.id not in opts.run_tasks and rec.origin != WHILE_RUNNING:
        store.set_origin(rec.id, WHILE_RUNNING)
    return True


def split_tasks(tasks: Sequence[TaskRecord], opts: Any) -> tuple[list[TaskRecord], list[TaskRecord]]:
    """(the tasks of the run: its own and those submitted while it ran; the unfinished tasks left
    from other runs, which it did not run)."""
    mine = [t for t in tasks if runs(t, opts)]
    ids = {t.id for t in mine}
    return mine, [t for t in tasks if t.id not in ids and not t.state.terminal]


def by_origin(tasks: Sequence[dict]) -> dict[str, int]:
    """How many of a run's tasks came from where."""
    return dict(Counter(t.get("origin") or "unknown" for t in tasks))


SHORT = {RESUMED: "resumed (same name and parameters)", LEFTOVER: "resumed from earlier runs (--resume-leftovers)"}


def summary_line(tasks: Sequence[dict], left: Sequence[dict]) -> str:
    """``2 side tasks: 1 submitted by this run, 1 resumed (same name and parameters); 3 left from
    earlier runs not run (--resume-leftovers runs them)``."""
    counts = by_origin(tasks)
    parts = ", ".join(f"{n} {SHORT.get(o, o)}" for o, n in counts.items())
    out = f"{len(tasks)} side task{'s' if len(tasks) != 1 else ''}" + (f": {parts}" if parts else "")
    if left:
        names = ", ".join(f"{t['id']}:{t['name']}" for t in left)
        out += f"; {len(left)} left from earlier runs not run ({names}; --resume-leftovers runs them)"
    return out
