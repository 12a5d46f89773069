"""Training with harvesting, end to end: submit tasks, start the manager, train, report.

The manager runs as its own process (so a crash of it, or of any side task, never touches
training). Its port goes to the trainer's bubble publisher. In ``naive`` and ``priority`` modes
it ignores bubbles and runs tasks all the time. The report adds the harvest fields to the train
report, measured against a ``none`` run of the same configuration.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from flowride.errors import InputError
from flowride.harvest.cost import harvest_efficiency, savings
from flowride.harvest.profile import profile_task
from flowride.harvest.store import TaskStore
from flowride.harvest.task import resolve
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import TrainResult, train

HARVEST_MODES = ("none", "freeride", "naive", "priority")

# Built-in tasks submitted by name from `flowride train --side-tasks` run as long jobs: they keep
# working until training ends (then they are checkpointed and stay resumable). PageRank runs a
# fixed number of sweeps, as graph benchmarks such as GAP do, rather than stopping at convergence.
JOB_PARAMS: dict[str, dict] = {
    "pagerank": {"tol": 0.0, "max_sweeps": 10**7, "sweeps_per_step": 4},
    "cnn": {"total_steps": 10**7},
    "image": {"total_batches": 10**7},
    "image-proc": {"total_batches": 10**7},
}


def _idle_priority() -> None:
    """The manager itself only works while a stage idles: on CPU it runs at idle priority, so it
    can never take a core from training (its side tasks run at idle priority too)."""
    os.nice(19)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def start_manager(run_dir: Path, stages: int, mode: str, profiles: dict, timeout: float = 60.0) -> tuple[subprocess.Popen, int]:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "manager.ready").unlink(missing_ok=True)
    prof_file = run_dir / "task-profiles.json"
    prof_file.write_text(json.dumps(profiles))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    log = open(run_dir / "manager.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowride.harvest.manager", "--run-dir", str(run_dir), "--stages", str(stages),
         "--mode", mode, "--profiles", str(prof_file)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=_idle_priority,
    )
    t0 = time.monotonic()
    ready = run_dir / "manager.ready"
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the side-task manager exited: {(run_dir / 'manager.log').read_text()[-500:]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise RuntimeError("the side-task manager did not start")
        time.sleep(0.02)
    return proc, int(ready.read_text())


def wait_until_created(run_dir: Path, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    """Side tasks are created (process started, setup done) before training starts, so the first
    bubbles find them ready; creation itself runs at idle priority."""
    from flowride.harvest.states import TaskState

    store = TaskStore.in_run_dir(run_dir)
    t0 = time.monotonic()
    try:
        while True:
            states = [t.state for t in store.list()]
            if all(s not in (TaskState.SUBMITTED, TaskState.CREATED) for s in states):
                return
            if proc.poll() is not None or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"side tasks were not created in time (states: {[str(s) for s in states]})")
            time.sleep(0.05)
    finally:
        store.close()


def stop_manager(proc: subprocess.Popen, run_dir: Path, timeout: float = 90.0) -> dict:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    f = run_dir / "harvest.json"
    return json.loads(f.read_text()) if f.exists() else {"steps": [], "failures": [], "tasks": []}


def profiles_for(tasks: list[str], cache: Path | None = None) -> dict[str, dict]:
    cached = json.loads(cache.read_text()) if cache and cache.exists() else {}
    out = {}
    for name in dict.fromkeys(tasks):
        if resolve(name).__class__.__name__ == "ImperativeSpec":
            continue  # profiled through its iterative twin, if any
        out[name] = cached.get(name) or profile_task(name, JOB_PARAMS.get(name, {}))
    if cache:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({**cached, **out}, indent=1))
    return out


def run_harvest(cfg: TrainConfig, mode: str, tasks: list[str], profiles: dict[str, dict], on_progress=None,
                bubble_profile: str | None = None) -> tuple[TrainResult, dict]:
    """Train ``cfg`` with side ``tasks`` under ``mode``; returns the training result and the
    manager's record (side-task steps, failures, final task states)."""
    if mode not in HARVEST_MODES:
        raise InputError("--harvest", f"unknown mode {mode!r}", f"choose one of {', '.join(HARVEST_MODES)}")
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    pinned = replace(cfg, pin_cores=True)
    if mode == "none" or not tasks:
        return train(pinned, on_progress), {"steps": [], "failures": [], "tasks": [], "mode": mode}
    store = TaskStore.in_run_dir(run_dir)
    for name in tasks:
        store.submit(name, JOB_PARAMS.get(name, {}))
    store.close()
    proc, port = start_manager(run_dir, cfg.stages, mode, profiles)
    try:
        wait_until_created(run_dir, proc)
        res = train(replace(pinned, bubble_port=port, profile=bubble_profile), on_progress)
    finally:
        record = stop_manager(proc, run_dir)
    return res, record


def harvest_report(base_rep: dict, rep: dict, record: dict, mode: str, profiles: dict[str, dict],
                   p_ref: float = 1.0, p_main: float | None = None) -> dict:
    """The harvest fields of the train report (see README), against the ``none`` run ``base_rep``."""
    p_main = float(rep["stages"]) if p_main is None else p_main
    t_v = float(np.sum(base_rep["iteration_times_s"]))
    t_f = float(np.sum(rep["iteration_times_s"]))
    side: dict[str, dict] = {}
    lo, hi = rep["window_monotonic"]
    for st in record.get("steps", []):
        if st["t0"] < lo or st["t1"] > hi:
            continue  # only work done while training ran counts
        d = side.setdefault(str(st["task"]), {"name": st["name"], "steps": 0, "units": 0.0, "busy_s": 0.0, "overruns": 0, "overrun_s": 0.0})
        d["steps"] += 1
        d["units"] += st["units"]
        d["busy_s"] += st["t1"] - st["t0"]
        d["overruns"] += 1 if st.get("overrun_s", 0) > 0 else 0
        d["overrun_s"] += st.get("overrun_s", 0.0)
    wall = float(np.sum(rep["iteration_times_s"]))
    dedicated = 0.0
    for d in side.values():
        prof = profiles.get(d["name"], {})
        d["unit"] = prof.get("unit", "units")
        d["throughput"] = d["units"] / wall if wall > 0 else 0.0  # units per second of training
        d["dedicated_throughput"] = prof.get("throughput", 0.0)
        if d["dedicated_throughput"] > 0:
            dedicated += d["units"] / d["dedicated_throughput"]
    # the bubbles there were to fill: the none run's idle time, scaled to this run's iterations
    bub = base_rep["bubble_seconds_total"] * len(rep["losses"]) / max(1, len(base_rep["losses"]))
    return {
        "harvest_mode": mode,
        "overhead_pct": (rep["iteration_time_s"] / base_rep["iteration_time_s"] - 1.0) * 100.0,
        "side_work": side,
        "harvest_efficiency": harvest_efficiency(dedicated, bub),
        "bubble_seconds": bub,
        "cost": savings(t_v, t_f, dedicated, p_ref, p_main),
        "losses_identical": rep["losses"] == base_rep["losses"],
        "failures": record.get("failures", []),
        "tasks": record.get("tasks", []),
    }
