"""``flowride manager``, ``profile-task`` and ``tasks``: a harvesting run's side-task manager and
durable task store, inspected and driven from the command line (also while training runs).

``--store`` picks the store as everywhere (:func:`flowride.harvest.stores.open_store`): left
out, this host's SQLite file in ``--run-dir``; ``postgresql://...``, the queue every host shares."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from flowride.argtypes import COUNT, SECONDS, integer, out_dir, out_file
from flowride.cli.common import Parser, as_options, console, refuse_unused, say_error
from flowride.files import write_json_atomic


def cmd_profile_task(a: argparse.Namespace) -> int:
    from flowride.harvest.profile import profile_task

    spec = _task_spec(a.task, a.params)
    prof = profile_task(spec.name, spec.params, a.steps, a.seconds)
    if a.out:
        write_json_atomic(a.out, prof, indent=1)
    console.print_json(json.dumps(prof))
    return 0


def _task_spec(task: str, params: str | None):
    """The task and its ``--params``, checked by the one task-spec parser."""
    from flowride.harvest.task import parse_task_spec

    with as_options(params="--params"):
        return parse_task_spec(task, params)


def cmd_tasks(a: argparse.Namespace) -> int:
    from flowride.harvest.store import existing_run_dir
    from flowride.harvest.stores import check_store, open_store

    url = check_store(a.store)
    if url is None:  # this host's file in the run directory: refused rather than created elsewhere
        with as_options(run_dir="--run-dir"):
            existing_run_dir(a.run_dir)
    if a.action == "submit":
        spec = _task_spec(a.task, a.params)
    with as_options(task_store="--run-dir"):
        store = open_store(url, a.run_dir)
    try:
        if a.action == "submit":
            from flowride.harvest.rerun import BY_HAND

            tid = store.submit(spec.name, spec.params, a.priority, a.memory_mb, origin=BY_HAND)
            console.print(f"submitted task {tid} ({a.task})")
        elif a.action == "list":
            t = Table(title=f"side tasks in {store.describe() if store.is_queue else a.run_dir}")
            cols = ("id", "task", "state", "stage", "steps", "units", "origin", "reason") + (("host",) if store.is_queue else ())
            for c in cols:
                t.add_column(c)
            for r in store.list():
                t.add_row(str(r.id), r.name, str(r.state), "" if r.stage is None else str(r.stage), str(r.steps), f"{r.units:g}",
                          r.origin or "", r.reason or "", *((r.host or "",) if store.is_queue else ()))
            console.print(t)
            for note in store.notes:
                console.print(f"note: {note}", soft_wrap=True, highlight=False)
        elif a.action == "show":
            console.print_json(json.dumps(store.get(a.id).to_dict()))
        elif a.action == "cancel":
            r = store.request_cancel(a.id)
            console.print(f"task {r.id}: cancel requested (state {r.state})")
    finally:
        store.close()
    return 0


def cmd_manager(a: argparse.Namespace) -> int:
    from flowride.harvest import supervise

    with as_options(run_dir="--run-dir"):
        d = supervise.check_manager_dir(a.run_dir)
    if a.action == "status":
        console.print_json(json.dumps(supervise.manager_status(d, a.store)))
    elif a.action == "stop":
        refuse_unused(a, "by status and restart", "leave it out: stop finds the manager by its run directory", store="--store")
        stopped, why = supervise.stop_running(d)
        console.print("manager stopped; tasks saved" if stopped else why)
    else:
        try:
            port = supervise.restart(d, a.store)
        except supervise.ManagerUnavailable as e:  # e.g. its port is taken now: one line, exit 1
            last = [ln for ln in str(e).splitlines() if ln.strip()]
            say_error(f"manager restart failed: {last[-1] if last else e}")
            return 1
        console.print(f"manager restarted on 127.0.0.1:{port} (same port: running trainers keep reaching it); "
                      "the run's unfinished tasks resume from the store")
    return 0


STORE_HELP = ("where the tasks are kept: left out, this host's SQLite file (RUN_DIR/<host>/tasks.sqlite); "
              "postgresql://USER@HOST[:PORT]/DB, one queue that every host's manager leases from")


def add_manager(sub) -> None:
    """``flowride manager``."""
    mg = sub.add_parser("manager", help="inspect, restart or stop a run's side-task manager (works while training runs)")
    mg.add_argument("action", choices=("status", "restart", "stop"))
    mg.add_argument("--run-dir", default="runs/train", help="the training run's directory")
    mg.add_argument("--store", help=STORE_HELP + " (default: the manager's own, from manager.json)")
    mg.set_defaults(func=cmd_manager)


def add_profile_task(sub) -> None:
    """``flowride profile-task``."""
    pt = sub.add_parser("profile-task", help="run a side task alone: step time, throughput, peak memory")
    pt.add_argument("task")
    pt.add_argument("--params", help="task parameters as a JSON object")
    pt.add_argument("--steps", type=COUNT, default=30, help="steps to time (at most)")
    pt.add_argument("--seconds", type=SECONDS, default=5.0, help="seconds to run (at most)")
    pt.add_argument("--out", "-o", type=out_file, help="write the profile JSON here")
    pt.set_defaults(func=cmd_profile_task)


def add_tasks(sub) -> None:
    """``flowride tasks``."""
    tk = sub.add_parser("tasks", help="side tasks in a run's durable store (works while training runs)")
    tsub = tk.add_subparsers(dest="action", required=True, parser_class=Parser)
    ts = tsub.add_parser("submit")
    ts.add_argument("task")
    ts.add_argument("--params")
    ts.add_argument("--priority", type=integer(-1000, 1000, "a priority"), default=0, help="higher runs first")
    ts.add_argument("--memory-mb", type=integer(1, 10**7, "MB"), help="memory cap of the task")
    tsub.add_parser("list")
    for name in ("show", "cancel"):
        tx = tsub.add_parser(name)
        tx.add_argument("id", type=integer(1, 2**62, "a task id"))
    for sp in tsub.choices.values():
        sp.add_argument("--run-dir", type=out_dir, default="runs/train", help="the training run's directory")
        sp.add_argument("--store", help=STORE_HELP)
    tk.set_defaults(func=cmd_tasks)
