"""``flowride manager``, ``profile-task`` and ``tasks``: a harvesting run's side-task manager and
durable task store, inspected and driven from the command line (also while training runs)."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from flowride.cli.common import as_options, console, json_arg
from flowride.errors import InputError
from flowride.files import write_json_atomic


def cmd_profile_task(a: argparse.Namespace) -> int:
    from flowride.harvest.profile import profile_task

    params = json_arg(a.params, "--params")
    _check_params(a.task, params)
    prof = profile_task(a.task, params, a.steps, a.seconds)
    if a.out:
        write_json_atomic(a.out, prof, indent=1)
    console.print_json(json.dumps(prof))
    return 0


def _check_params(task: str, params: dict) -> None:
    from flowride.harvest.task import check_params

    try:
        check_params(task, params)
    except InputError as e:
        raise InputError("--params" if e.field == "params" else e.field, e.problem, e.fix) from None


def cmd_tasks(a: argparse.Namespace) -> int:
    from flowride.harvest.store import TaskStore, existing_run_dir
    from flowride.harvest.task import resolve

    with as_options(run_dir="--run-dir"):
        existing_run_dir(a.run_dir)
    if a.action == "submit":
        resolve(a.task)
        params = json_arg(a.params, "--params")
        _check_params(a.task, params)
    with as_options(task_store="--run-dir"):
        store = TaskStore.in_run_dir(a.run_dir)
    try:
        if a.action == "submit":
            tid = store.submit(a.task, params, a.priority, a.memory_mb)
            console.print(f"submitted task {tid} ({a.task})")
        elif a.action == "list":
            t = Table(title=f"side tasks in {a.run_dir}")
            for c in ("id", "task", "state", "stage", "steps", "units", "reason"):
                t.add_column(c)
            for r in store.list():
                t.add_row(str(r.id), r.name, str(r.state), "" if r.stage is None else str(r.stage), str(r.steps), f"{r.units:g}", r.reason or "")
            console.print(t)
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
        console.print_json(json.dumps(supervise.manager_status(d)))
    elif a.action == "stop":
        console.print("manager stopped; tasks saved" if supervise.stop_running(d) else "no manager was running")
    else:
        port = supervise.restart(d)
        console.print(f"manager restarted on 127.0.0.1:{port} (same port: running trainers keep reaching it); "
                      "unfinished tasks resume from the store")
    return 0
