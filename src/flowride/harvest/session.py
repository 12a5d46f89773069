"""Training with harvesting, end to end: submit tasks, start a supervised manager, train, report.

:func:`compare` is the one orchestration that the CLI (``flowride train --side-tasks``), the
demo and the benchmark use: a ``none`` baseline run (for the losses check and the separate-runs
overhead), then the harvesting run, in which harvesting is switched on and off in randomized
blocks of iterations so that the overhead is measured paired, inside one run
(:mod:`flowride.harvest.stats`). The manager runs as its own process (so a crash of it, or of
any side task, never touches training), watched by :class:`flowride.harvest.supervise.ManagerProcess`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from flowride.errors import InputError
from flowride.files import read_json, write_json_atomic
from flowride.harvest.cost import harvest_efficiency, savings
from flowride.harvest.manager_files import ManagerOptions
from flowride.harvest.profile import profile_task
from flowride.harvest.rerun import by_origin, prepare_run, runs
from flowride.harvest.stats import gpu_step_medians, overrun_by_type, paired_overhead
from flowride.harvest.stores import open_store
from flowride.harvest.supervise import ManagerProcess, ManagerUnavailable
from flowride.harvest.task import ImperativeSpec, resolve
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import TrainResult, train

HARVEST_MODES = ("none", "freeride", "naive", "priority")
DEFAULT_BUDGET_PCT = 2.0  # the training owner's overhead budget (FreeRide reports about 1%)

# Built-in tasks submitted by name from `flowride train --side-tasks` run as long jobs: they keep
# working until training ends (then they are checkpointed and stay resumable). PageRank runs a
# fixed number of sweeps, as graph benchmarks such as GAP do, rather than stopping at convergence.
JOB_PARAMS: dict[str, dict] = {
    "pagerank": {"tol": 0.0, "max_sweeps": 10**7, "sweeps_per_step": 4},
    "cnn": {"total_steps": 10**7},
    "image": {"total_batches": 10**7},
    "image-proc": {"total_batches": 10**7},
    "gpu-cnn": {"total_steps": 10**7},
    "gpu-transformer": {"total_steps": 10**7},
    "gpu-pagerank": {"tol": 0.0, "max_sweeps": 10**7},
    "gpu-sssp": {"max_sweeps": 10**7},
    "gpu-image": {"total_batches": 10**7},
}
# built-ins that compute on a GPU when side tasks run on CUDA (and on the CPU otherwise: the gpu-*
# tasks' own default, "auto", would take a GPU that training on the CPU left free)
CUDA_CAPABLE = frozenset({"cnn", "gpu-cnn", "gpu-transformer", "gpu-pagerank", "gpu-sssp", "gpu-image"})


def job_params(name: str, device: str = "cpu") -> dict:
    params = dict(JOB_PARAMS.get(name, {}))
    if name in CUDA_CAPABLE:
        params["device"] = "cuda" if device == "cuda" else "cpu"
    return params


def _created(tasks: list, host: str, queue: bool) -> bool:
    """Whether the side tasks this host's manager will run are past creation. The queue holds
    every host's tasks: there, those another host leased are its business, and one left in the
    queue counts only while this host holds none (it is at its cap, or another host's turn)."""
    from flowride.harvest.states import TaskState

    early = (TaskState.SUBMITTED, TaskState.CREATED)
    if not queue:
        return all(t.state not in early for t in tasks)
    live = [t for t in tasks if not t.state.terminal]
    mine = [t for t in live if t.host == host]
    unleased = [t for t in live if t.host is None]
    return all(t.state not in early for t in mine) and (bool(mine) or not unleased)


def wait_until_created(run_dir: Path, mp: ManagerProcess, timeout: float = 180.0) -> None:
    """Side tasks are created (process started, setup done) before training starts, so the first
    bubbles find them ready; creation itself runs at idle priority."""
    store = open_store(mp.opts.store, run_dir, mp.opts.host)
    t0 = time.monotonic()
    try:
        while True:
            tasks = [t for t in store.list() if runs(t, mp.opts)]  # other runs' leftovers wait, unstarted
            states = [t.state for t in tasks]
            if _created(tasks, mp.opts.host, store.is_queue):
                return
            if not mp.alive() or time.monotonic() - t0 > timeout:
                raise ManagerUnavailable(f"side tasks were not created in time (states: {[str(s) for s in states]}); "
                                         f"manager log: {mp.log_tail(300)}")
            time.sleep(0.05)
    finally:
        store.close()


def profiles_for(tasks: list[str], cache: Path | None = None) -> dict[str, dict]:
    """Each iterative task's profile (step time, throughput, peak memory), measured alone in a
    fresh process, or read from ``cache``."""
    from flowride.files import read_json

    cached = read_json(cache, "task profiles", "delete the file to re-profile") if cache and cache.exists() else {}
    out = {}
    for name in dict.fromkeys(tasks):
        if isinstance(resolve(name), ImperativeSpec):
            continue  # profiled through its iterative twin, if any
        out[name] = cached.get(name) or profile_task(name, JOB_PARAMS.get(name, {}))
    if cache:
        write_json_atomic(cache, {**cached, **out}, indent=1)
    return out


def run_harvest(cfg: TrainConfig, mode: str, tasks: list[str], profiles: dict[str, dict], on_progress=None,
                bubble_profile: str | None = None, side_device: str = "cpu", max_restarts: int = 3,
                budget_pct: float | None = DEFAULT_BUDGET_PCT, store: str | None = None,
                resume_leftovers: bool = False) -> tuple[TrainResult, dict]:
    """Train ``cfg`` with side ``tasks`` under ``mode``; returns the training result and the
    manager's record (side-task steps, failures, final task states, manager restarts, what the
    budget guard did). ``budget_pct``: the overhead the guard holds harvesting to (None: off).
    ``store``: None for this host's SQLite store in the run directory, or the cluster queue's URL.
    ``resume_leftovers``: also run the unfinished tasks earlier runs left in the run directory
    (:mod:`flowride.harvest.rerun`; otherwise they stay as they are)."""
    if mode not in HARVEST_MODES:
        raise InputError("--harvest", f"unknown mode {mode!r}", f"choose one of {', '.join(HARVEST_MODES)}")
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    pinned = replace(cfg, pin_cores=True)
    if mode == "none" or not tasks:
        return train(pinned, on_progress), {"steps": [], "failures": [], "tasks": [], "mode": mode,
                                            "manager_restarts": 0, "harvest_stopped": None}
    mp = ManagerProcess(run_dir, ManagerOptions(stages=cfg.stages, mode=mode, device=side_device, budget_pct=budget_pct,
                                                store=store, **paired_options(cfg)), profiles, max_restarts=max_restarts)
    submit_tasks(mp, tasks, side_device, resume_leftovers)
    port = mp.start()
    try:
        wait_until_created(run_dir, mp)
        mp.watch()
        res = train(replace(pinned, bubble_port=port, profile=bubble_profile), on_progress)
    finally:
        record = mp.stop()
    return res, record


def paired_options(cfg: TrainConfig) -> dict:
    """The manager options that let its budget guard pair the training's own on/off blocks."""
    if not cfg.paired_block:
        return {}
    return {"paired_block": cfg.paired_block, "paired_offset": min(cfg.warmup_iters, cfg.iters)}


def submit_tasks(mp: ManagerProcess, tasks: list[str], side_device: str = "cpu", resume_leftovers: bool = False) -> dict:
    """The run's ``tasks`` (as long jobs) in the store ``mp``'s manager will use, by the re-run
    rule (:mod:`flowride.harvest.rerun`): each resumes its unfinished twin (same name and
    parameters) or is submitted; other runs' unfinished tasks are left alone unless
    ``resume_leftovers``. ``mp``'s manager is told which tasks are the run's. Returns
    :func:`~flowride.harvest.rerun.prepare_run`'s account (ids, tasks and their origin, left)."""
    store = open_store(mp.opts.store, mp.run_dir, mp.opts.host)
    try:
        plan = prepare_run(store, [(name, job_params(name, side_device)) for name in tasks], resume_leftovers)
        if not store.is_queue:  # the queue's tasks are the cluster's: any manager leases them
            mp.opts = replace(mp.opts, run_tasks=plan["ids"], run_since=plan["since"])
        return plan
    finally:
        store.close()


def _in_windows(t0: float, windows: list[tuple[float, float]]) -> bool:
    return any(a <= t0 < b for a, b in windows)


def harvest_report(base_rep: dict | None, rep: dict, record: dict, mode: str, profiles: dict[str, dict],
                   p_ref: float = 1.0, p_main: float | None = None, budget_pct: float = DEFAULT_BUDGET_PCT,
                   block: int | None = None) -> dict:
    """The harvest fields of the train report (see README).

    Paired runs (``rep["iteration_harvest"]`` set): the overhead, its CI and every other figure
    come from the on and off iterations of this one run; ``base_rep`` (a separate ``none`` run,
    optional) gives the separate-runs overhead and the losses check. Unpaired runs: everything
    against ``base_rep``, as before.
    """
    p_main = float(rep["stages"]) if p_main is None else p_main
    times = [float(t) for t in rep["iteration_times_s"]]
    flags = rep.get("iteration_harvest") or [None] * len(times)
    windows = [tuple(w) for w in rep.get("iteration_windows", [])]
    paired = any(f is not None for f in flags)
    out: dict = {"harvest_mode": mode, "overhead_budget_pct": budget_pct}
    if paired:
        on = [i for i, f in enumerate(flags) if f]
        off = [i for i, f in enumerate(flags) if f is False]
        stats = paired_overhead(times, flags, block or _block_of(flags))
        t_off = statistics.median(times[i] for i in off)
        t_v = t_off * len(on)
        # the slowdown is the paired median (robust to a pair disturbed from outside), not a ratio of sums
        t_f = t_v * (1.0 + stats["median_pct"] / 100.0)
        bubble = statistics.median(rep["iteration_idle_s"][i] for i in off) * len(on)
        counted = [windows[i] for i in on]
        wall = sum(times[i] for i in on)
        out.update({"overhead_pct": stats["median_pct"], "overhead_ci95": stats["ci95_pct"],
                    "overhead_pct_unpaired_in_run": stats["unpaired_pct"],
                    "overhead_ci95_unpaired_in_run": stats["unpaired_ci95_pct"],
                    "overhead_pairs": stats["pairs"], "overhead_method": "paired on/off blocks in one run",
                    "overhead_per_pair_pct": stats["per_pair_pct"], "overhead_sd_pct": stats["sd_pct"],
                    # A/A pairs (training alone in both arms): what the measurement reads when nothing differs
                    "overhead_noise_floor": stats["noise_floor"]})
    else:
        if base_rep is None:
            raise ValueError("an unpaired harvest report needs a baseline report")
        t_v = float(np.sum(base_rep["iteration_times_s"]))
        t_f = float(np.sum(times))
        bubble = base_rep["bubble_seconds_total"] * len(rep["losses"]) / max(1, len(base_rep["losses"]))
        lo, hi = rep["window_monotonic"]
        counted = [(lo, hi)]
        wall = t_f
        out.update({"overhead_pct": (rep["iteration_time_s"] / base_rep["iteration_time_s"] - 1.0) * 100.0,
                    "overhead_ci95": None, "overhead_method": "separate none run"})
    # the old way: this run's (harvesting) iterations against a separate run of training alone
    harvesting = [t for t, f in zip(times, flags, strict=True) if f is not False]
    out["overhead_pct_unpaired"] = (
        (statistics.median(harvesting) / base_rep["iteration_time_s"] - 1.0) * 100.0 if base_rep is not None else None
    )
    side: dict[str, dict] = {}
    outside = 0
    inside: list[dict] = []
    for st in record.get("steps", []):
        if not _in_windows(st["t0"], counted):
            outside += 1
            continue  # only work done while (harvesting) training ran counts
        inside.append(st)
        d = side.setdefault(str(st["task"]), {"name": st["name"], "steps": 0, "units": 0.0, "busy_s": 0.0, "overruns": 0, "overrun_s": 0.0})
        d["steps"] += 1
        d["units"] += st["units"]
        d["busy_s"] += st["t1"] - st["t0"]
        d["overruns"] += 1 if st.get("overrun_s", 0) > 0 else 0
        d["overrun_s"] += st.get("overrun_s", 0.0)
    dedicated = 0.0
    for d in side.values():
        prof = profiles.get(d["name"], {})
        d["unit"] = prof.get("unit", "units")
        d["throughput"] = d["units"] / wall if wall > 0 else 0.0  # units per second of (harvesting) training
        d["dedicated_throughput"] = prof.get("throughput", 0.0)
        if d["dedicated_throughput"] > 0:
            dedicated += d["units"] / d["dedicated_throughput"]
    efficiency, why_not = _efficiency(side, dedicated, bubble, outside, record.get("bubbles"))
    out.update(budget_judgement(out, budget_pct, block or (_block_of(flags) if paired else None)))
    out.update({
        "side_work": side,
        "harvest_efficiency": efficiency,
        "harvest_efficiency_note": why_not,
        "side_steps_outside_measured_iterations": outside,
        # the manager's view: bubbles announced to it, why those it left unused got no step,
        # and per type how bubbles ended against their prediction (the fit rule's margin)
        "bubbles_announced": (record.get("bubbles") or {}).get("announced"),
        "bubbles_unused_by_reason": (record.get("bubbles") or {}).get("unused_by_reason"),
        "bubbles_unused_examples": (record.get("bubbles") or {}).get("unused_examples"),
        "bubble_fit_margins": (record.get("bubbles") or {}).get("prediction_by_type"),
        "bubble_seconds": bubble,
        # how late the side task left the device after the bubble's predicted end, per bubble type
        "overrun_by_type": overrun_by_type(inside),
        "gpu_step_s": gpu_step_medians(inside),
        "cost": savings(t_v, t_f, dedicated, p_ref, p_main),
        "losses_identical": (rep["losses"] == base_rep["losses"]) if base_rep is not None else None,
        "failures": record.get("failures", []),
        "tasks": record.get("tasks", []),  # the tasks this run ran, each with its origin (harvest/rerun.py)
        "tasks_by_origin": by_origin(record.get("tasks", [])),
        "tasks_left": record.get("tasks_left", []),  # other runs' unfinished tasks, not run
        "manager_restarts": record.get("manager_restarts", 0),
        "harvest_stopped": record.get("harvest_stopped"),
        "guard": record.get("guard"),
    })
    return out


def budget_judgement(out: dict, budget_pct: float, block: int | None) -> dict:
    """Whether the run's overhead interval decides the budget: ``within`` (the whole interval
    under it), ``over`` (the whole interval above it) or ``unresolved`` (it spans the budget:
    at this noise the run was too short to tell), with a note that says, when unresolved, how
    many pairs (and iterations) at the measured spread would resolve the difference seen."""
    from flowride.harvest.guard import pairs_to_resolve

    m = out["overhead_pct"]
    lo, hi = out["overhead_ci95"] if out.get("overhead_ci95") else (m, m)
    if hi <= budget_pct:
        verdict, note = "within", f"the interval [{lo:+.2f}, {hi:+.2f}]% lies under the {budget_pct:g}% budget"
    elif lo > budget_pct:
        verdict, note = "over", f"the interval [{lo:+.2f}, {hi:+.2f}]% lies above the {budget_pct:g}% budget"
    else:
        verdict = "unresolved"
        sd = out.get("overhead_sd_pct")
        n = out.get("overhead_pairs") or 0
        need = pairs_to_resolve(n, m, lo, hi, budget_pct) if n else None
        if out.get("overhead_ci95") is None:
            note = "one separate run has no interval: run paired (--paired-block) to resolve the budget"
        elif need is None:
            note = (f"cannot resolve the {budget_pct:g}% budget: the interval [{lo:+.2f}, {hi:+.2f}]% spans it and the "
                    "overhead sits on it")
        else:
            note = (f"cannot resolve the {budget_pct:g}% budget at this noise: the interval [{lo:+.2f}, {hi:+.2f}]% spans it "
                    f"(pair spread {sd:.2f} points over {n} pairs); about {need} pairs"
                    + (f" ({need * 2 * block} paired iterations)" if block else "")
                    + f" would resolve a difference of {abs(m - budget_pct):.2f} points")
    return {"within_budget": verdict == "within", "budget_verdict": verdict, "budget_resolved": verdict != "unresolved",
            "budget_note": note}


def _efficiency(side: dict[str, dict], dedicated: float, bubble: float, outside: int,
                bubbles: dict | None = None) -> tuple[float | None, str | None]:
    """Harvest efficiency and, where it is null or 0, why, in terms a user can act on (a 0.00
    would read as "no work done" when work was done but cannot be weighed; "no work done" is a
    symptom, the rule that kept the work out is the cause). ``bubbles``: the manager's count of
    announced bubbles and why those it did not use went unused."""
    if bubble <= 0:
        return None, "no bubble time was measured in the harvesting iterations"
    unweighed = sorted({d["name"] for d in side.values() if d["units"] > 0 and d["dedicated_throughput"] <= 0})
    if unweighed:
        return None, (f"no dedicated throughput for {', '.join(unweighed)}: its profile could not be measured, so its work "
                      "cannot be weighed (see flowride profile-task)")
    if not side:
        return 0.0, no_work_cause(bubbles, outside)
    return harvest_efficiency(dedicated, bubble), None


def no_work_cause(bubbles: dict | None, outside: int) -> str:
    """Why a run did no side work in its measured iterations: the rule that kept it out."""
    bubbles = bubbles or {}
    n = bubbles.get("announced", 0)
    unused = bubbles.get("unused_by_reason") or {}
    head = "no side work in the measured iterations"
    if outside:
        head += f" ({outside} side step(s) ran outside them, in warm-up or after the last)"
    if not n:
        return head + ": no bubble was announced to the manager (every wait was predicted shorter than --min-bubble, or the run was too short to learn them)"
    examples = bubbles.get("unused_examples") or {}
    top = sorted(unused.items(), key=lambda kv: -kv[1])[:3]
    why = "; ".join(f"{c} of {n} bubbles: {examples.get(r, r)}" for r, c in top)
    return f"{head}: {why}" if why else f"{head}: {n} bubbles were announced and none was used"


def _block_of(flags: list[bool | None]) -> int:
    """The block length of a paired run: the shortest run of equal flags."""
    runs, n = [], 1
    for a, b in zip(flags, flags[1:], strict=False):
        if a == b:
            n += 1
        else:
            runs.append(n)
            n = 1
    runs.append(n)
    return min(runs[:-1] or runs)


def check_comparison(cfg: TrainConfig, mode: str, tasks: list[str], paired_block: int, budget_pct: float,
                     p_ref: float, p_main: float | None) -> None:
    """Every input of :func:`compare`, checked before anything runs (InputError names the field)."""
    if mode not in HARVEST_MODES:
        raise InputError("--harvest", f"unknown mode {mode!r}", f"choose one of {', '.join(HARVEST_MODES)}")
    for t in tasks:
        try:
            resolve(t)
        except InputError as e:
            raise InputError("--side-tasks", e.problem, e.fix) from None
    if not (isinstance(budget_pct, (int, float)) and math.isfinite(budget_pct) and budget_pct >= 0):
        raise InputError("--budget", f"{budget_pct!r} is not a percentage", "give 0 or more, e.g. 2")
    for field, price in (("--price-ref", p_ref), ("--price-main", p_main)):
        if price is not None and not (isinstance(price, (int, float)) and math.isfinite(price) and price > 0):
            raise InputError(field, f"{price!r} is not a price", "give a positive number per hour")
    replace(cfg, paired_block=paired_block).validate()


@dataclass
class Comparison:
    """A harvesting run measured against training alone."""

    baseline: dict | None  # the none run's report
    result: TrainResult  # the harvesting run
    record: dict  # the manager's record
    report: dict  # the harvesting run's report with the harvest fields


BASELINE_KEYS = ("iteration_times_s", "iteration_time_s", "losses", "bubble_seconds_total")


def read_baseline_report(path: str | Path, field: str = "baseline_report") -> dict:
    """A report of training alone (``flowride train`` without side tasks), to compare against
    instead of training the baseline again; ``field`` names where the path came from in errors."""
    fix = "give a report written by flowride train"
    rep = read_json(path, field, fix)
    if not isinstance(rep, dict):
        raise InputError(field, f"holds a JSON {type(rep).__name__}, not a report", fix)
    for key in BASELINE_KEYS:
        if key not in rep:
            raise InputError(field, f"has no {key!r}", fix)
    return rep


def compare(cfg: TrainConfig, mode: str, tasks: list[str], *, paired_block: int = 2, baseline: bool = True,
            baseline_report: dict | None = None, profiles: dict[str, dict] | None = None,
            p_ref: float = 1.0, p_main: float | None = None, budget_pct: float = DEFAULT_BUDGET_PCT,
            side_device: str = "cpu", bubble_profile: str | None = None,
            on_stage: Callable[[str], None] | None = None, on_progress=None, guard: bool = True,
            store: str | None = None, resume_leftovers: bool = False) -> Comparison:
    """Train ``cfg`` alone (unless ``baseline_report`` is given or ``baseline`` is False), then
    with side ``tasks`` in ``mode``, harvesting switched on and off in randomized blocks of
    ``paired_block`` iterations (0: not paired, against the baseline run only). ``guard``: the
    manager's budget guard holds the overhead to ``budget_pct`` (off: the budget is only judged).
    ``resume_leftovers``: also run other runs' unfinished tasks (:mod:`flowride.harvest.rerun`)."""
    check_comparison(cfg, mode, tasks, paired_block, budget_pct, p_ref, p_main)
    run_dir = Path(cfg.run_dir)
    say = on_stage or (lambda _s: None)
    if profiles is None:
        say("profiling side tasks alone (dedicated throughput, step time, memory)")
        profiles = profiles_for(tasks, run_dir / "task-profiles.json")
    base_rep = baseline_report
    if base_rep is None and (baseline or not paired_block):
        say("baseline: the same training without side tasks")
        base = train(replace(cfg, run_dir=str(run_dir / "baseline"), pin_cores=True, bubble_port=None, paired_block=0), on_progress)
        base_rep = base.report()
        write_json_atomic(run_dir / "bubble-profile.json", base.profile(), indent=1)
    say(f"harvesting: {mode} with {', '.join(tasks) or 'no tasks'}"
        + (f", on/off in blocks of {paired_block} iterations" if paired_block else ""))
    res, record = run_harvest(replace(cfg, paired_block=paired_block), mode, tasks, profiles, on_progress,
                              bubble_profile=bubble_profile, side_device=side_device, budget_pct=budget_pct if guard else None,
                              store=store, resume_leftovers=resume_leftovers)
    rep = res.report()
    # a task that ran without a profile (submitted while running, or a leftover resumed) is
    # profiled now, after the last iteration, so its work can be weighed
    ran = {st["name"] for st in record.get("steps", [])}
    unprofiled = sorted(n for n in ran - set(profiles) if not isinstance(_resolve_or_none(n), ImperativeSpec | None))
    if unprofiled:
        say(f"profiling {', '.join(unprofiled)} alone (it ran without a profile)")
        profiles = {**profiles, **profiles_for(unprofiled, run_dir / "task-profiles.json")}
    rep.update(harvest_report(base_rep, rep, record, mode, profiles, p_ref, p_main, budget_pct, paired_block or None))
    return Comparison(base_rep, res, record, rep)


def _resolve_or_none(name: str):
    try:
        return resolve(name)
    except InputError:  # a task whose code is gone cannot be profiled
        return None
