"""flowride command line: parse, call the library, print.

Exit codes (README, "Exit codes"): 0 success; 1 the input was understood and found wrong, or the
work failed (an invalid schedule or algorithm, a failed run or training, wrong results); 2 bad
input (an option or file the command cannot use); 130 interrupted. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flowride.argtypes import COUNT, PORT, SECONDS, THREADS, integer, number, out_dir, out_file
from flowride.errors import InputError, InvalidSchedule
from flowride.files import write_json_atomic
from flowride.sizes import (
    MAX_CHUNKS,
    MAX_EPOCH_S,
    MAX_GPUS,
    MAX_GRID_CELLS,
    MAX_MICROBATCHES,
    MAX_STAGES,
    MIN_EPOCH_S,
)
from flowride.units import format_size, parse_size

console = Console()
err = Console(stderr=True)
# schedules that hold several model chunks per rank (both engines' names)
MULTI_STAGE = frozenset({"interleaved", "interleaved1f1b", "loopedbfs", "interleavedzb", "zbv", "dualpipev"})


# the pipeline library's field names -> the options of train, profile-bubbles and schedule-show
PIPELINE_OPTIONS = {"schedule": "--schedule", "model": "--model", "chunks": "--chunks", "stages": "--stages",
                    "microbatches": "--microbatches", "engine": "--engine"}


@contextmanager
def _as_options(**option_of: str) -> Iterator[None]:
    """Within the block, the library's field ``name`` is what the user wrote as ``option_of[name]``
    (only around calls whose values came from those options, never around reading a file)."""
    try:
        yield
    except InputError as e:
        key = e.field.replace(" ", "_")
        if key not in option_of:
            raise
        raise InputError(option_of[key], e.problem, e.fix) from None


def _say_error(msg: str) -> None:
    """One plain line on stderr (no wrapping or markup, so it stays one line for scripts)."""
    print(f"error: {msg}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, exit 2
        _say_error(f"{self.prog}: {message}")
        sys.exit(2)


def _topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", "-t", required=True, help="built-in name (see `flowride topologies`) or a topology JSON file")
    p.add_argument("--chassis", type=integer(1, 64, "chassis"), help="chassis count (ndv2, dgx2, mi250)")
    p.add_argument("--teccl-compat", action="store_true", default=None,
                   help="the published TE-CCL model (ndv2, dgx2): every switch copies and a switch->GPU hop costs only its alpha; "
                        "ndv2 x2 also models GPU 0 as a bufferless switch. Default: the physical model")
    p.add_argument("--switch-copy", choices=("on", "off"),
                   help="whether every switch can replicate a chunk (on: NVLS-class multicast; off: forwarding only). "
                        "Default: each preset's physical model (only h100's NVSwitch copies)")
    p.add_argument("--n", type=integer(2, MAX_GPUS, "GPUs"), help="GPU count (ring, full, switch)")
    p.add_argument("--rows", type=integer(1, MAX_GPUS, "rows"), help="rows (mesh, torus)")
    p.add_argument("--cols", type=integer(1, MAX_GPUS, "columns"), help="columns (mesh, torus)")
    p.add_argument("--bandwidth", type=number(1e-3, 1e6, what="GB/s"), help="GB/s per link (generic topologies)")
    p.add_argument("--alpha-us", type=number(0, 1e6, what="microseconds"), help="link latency in microseconds (generic topologies)")


def _load_topology(a: argparse.Namespace):
    from flowride.topology import build_topology, load_topology
    from flowride.topology.builtins import BUILTINS

    name = a.topology
    if name.endswith(".json") or Path(name).is_file():
        extra = [k for k in ("chassis", "teccl_compat", "n", "rows", "cols", "bandwidth", "alpha_us") if getattr(a, k) is not None]
        if extra:
            raise InputError(f"--{extra[0].replace('_', '-')}", "does not apply to a topology file", "edit the JSON instead")
        topo = load_topology(name)
    else:
        params = {k: getattr(a, k) for k in ("chassis", "teccl_compat", "n", "rows", "cols", "bandwidth", "alpha_us")}
        params = {k: v for k, v in params.items() if v is not None}
        if params.get("teccl_compat") and name in BUILTINS and "teccl_compat" not in BUILTINS[name].params:
            with_model = ", ".join(n for n, spec in BUILTINS.items() if "teccl_compat" in spec.params)
            raise InputError("--teccl-compat", f"{name} has no published TE-CCL model", f"the published results cover {with_model}")
        try:
            topo = build_topology(name, **params)
        except InputError as e:
            if e.field in params:
                raise InputError(f"--{e.field.replace('_', '-')}", e.problem, e.fix) from None
            raise
    copy = getattr(a, "switch_copy", None)
    if copy is not None:
        if not topo.switches:
            raise InputError("--switch-copy", f"{topo.name} has no switches", "leave --switch-copy out")
        topo = topo.with_switch_copy(copy == "on")
    return topo


def _epoch(text: str) -> str | float:
    if text.lower() in ("fast", "slow"):
        return text.lower()
    try:
        v = float(text)
    except ValueError:
        raise InputError("--epoch", f"{text!r} is neither fast, slow nor seconds", "use fast, slow or e.g. 5e-6") from None
    if not (math.isfinite(v) and MIN_EPOCH_S <= v <= MAX_EPOCH_S):
        raise InputError("--epoch", f"{text} s is outside {MIN_EPOCH_S:g}..{MAX_EPOCH_S:g} s", "use fast, slow or seconds, e.g. 5e-6")
    return v


class _ProgressView:
    """Live one-line status while solving: method, stage (window, probe or tree shape), best
    finish so far, gap to the epoch lower bound, elapsed time."""

    def __init__(self, status) -> None:
        self.status = status
        self.t0 = time.perf_counter()
        self.method = "bounds"
        self.best: int | None = None  # epochs of the best verified schedule so far
        self.lo: int | None = None
        self.tau: float | None = None

    def _best(self) -> str:
        if self.best is None:
            return ""
        fin = f" = {self.best * self.tau * 1e6:.4g} us" if self.tau else ""
        gap = f", gap {self.best - self.lo} epochs over the bound {self.lo}" if self.lo is not None else ""
        return f" | best {self.best} epochs{fin}{gap}"

    def __call__(self, ev: dict) -> None:
        el = time.perf_counter() - self.t0
        stage = ev["stage"]
        self.tau = ev.get("tau", self.tau)
        if "lo" in ev and stage in ("bounds", "method"):
            self.lo = ev["lo"]
        if stage in ("bounds", "method"):
            self.best = ev["hi"] if self.best is None else min(self.best, ev["hi"])
        loud = False
        # the method each stage belongs to (auto runs several in turn)
        self.method = {"trees": "trees", "window": "astar", "probe": "milp", "probed": "milp", "lp": "lp",
                       "lp-probed": "lp", "integral": "lp", "static-lp": "lp"}.get(stage, self.method)
        if stage == "bounds":
            msg = f"baseline {ev['baseline']}"
        elif stage == "method":
            if ev["method"] != "incumbent":
                self.method = ev["method"]
            msg = f"MILP of {ev['columns']:,} columns" if ev["method"] == "milp" and ev.get("columns") else "best so far"
            loud = True
        elif stage == "trees":
            self.best = min(self.best or ev["best"], ev["best"])
            msg = f"tree shape {ev['variant']} ({ev['i']}/{ev['of']}): {ev['epochs']} epochs"
        elif stage == "probe":
            msg = f"probe {ev['T']} epochs (search [{ev['lo']}, {ev['hi']}])"
        elif stage == "probed":
            self.lo = max(self.lo or 0, ev["lo"])  # every horizon below is proven infeasible
            if ev["outcome"] == "feasible":
                self.best = min(self.best or ev["T"], ev["T"])
            msg = f"probe {ev['T']} epochs: {ev['outcome']} (search [{ev['lo']}, {ev['hi']}])"
            loud = True
        elif stage == "window":
            msg = f"window {ev['window']} at epoch {ev['start_epoch']}: {ev['delivered']}/{ev['needed']} delivered"
        elif stage == "decompose":
            self.best = min(self.best or ev["epochs"], ev["epochs"])
            msg = "LP flow decomposed into sends"
            loud = True
        else:  # the LP method's other stages: print what they report
            msg = f"{stage}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in ev.items()
                                           if k not in ("stage", "elapsed"))
        line = escape(f"[{self.method}] {msg}{self._best()}")
        if loud:
            err.print(f"  {line}  [{el:.1f}s]", highlight=False)
        self.status.update(f"[bold]synth[/bold] {line}  [{el:.1f}s]")


def _result_table(rep: dict) -> Table:
    t = Table(title=f"{rep['collective']} {format_size(rep['size_bytes'])} on {rep['topology']} ({rep['gpus']} GPUs)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    if rep.get("switch_model", "no switches") != "no switches":
        t.add_row("switch model", rep["switch_model"])
    t.add_row("finish time", f"{rep['finish_time_us']:.3f} us  ({rep['epochs']} epochs x {rep['epoch_duration_us']:.4g} us)")
    t.add_row("algorithmic bandwidth", f"{rep['algbw_GBps']:.3f} GB/s")
    t.add_row("lower bound", f"{rep['lower_bound_us']:.3f} us ({rep['lower_bound_kind']}); ratio {rep['ratio_to_lower_bound']:.3f}")
    for kind, what in (("forest", "forest (max-flow) bound"), ("flow", "concurrent-flow bound")):
        if rep["lower_bounds_us"].get(kind):
            t.add_row(what, f"{rep['lower_bounds_us'][kind]:.3f} us")
    t.add_row(f"{rep['baseline']} baseline", f"{rep['baseline_us']:.3f} us; ours is {rep['speedup_vs_baseline']:.2f}x faster")
    t.add_row("solver time", f"{rep['solver_time_s']:.2f} s (wall {rep['wall_time_s']:.2f} s, {len(rep['probes'])} probes)")
    asked = rep.get("method_requested")
    t.add_row("method", f"{rep['method']}" + (f" (asked: {asked})" if asked and asked != rep["method"] else "")
              + (f", objective {rep['objective']}" if rep.get("objective", "makespan") != "makespan" else "")
              + f"; peak memory {rep['peak_rss_mb']:.0f} MB")
    proven = "epochs proven minimal" if rep["proven_minimal_epochs"] else f"epoch lower bound {rep['epoch_lower_bound']}"
    t.add_row("status", f"{rep['status']} ({proven}); verified: {rep['verified']}")
    return t


def cmd_synth(a: argparse.Namespace) -> int:
    from flowride.api import synthesize
    from flowride.synth.horizon import parse_speedups

    topo = _load_topology(a)
    size = parse_size(a.size, "--size")
    epoch = _epoch(a.epoch)
    with _as_options(speedups="--speedups"):
        speedups = parse_speedups(a.speedups)
    opts = _as_options(chunks="--chunks", time_limit="--time-limit", epoch="--epoch", mip_gap="--mip-gap",
                       threads="--threads", size="--size", collective="--collective", method="--method",
                       objective="--objective")
    with err.status("[bold]synth[/bold] building bounds and baseline") as st, opts:
        out = synthesize(topo, a.collective, size, epoch, a.chunks, a.time_limit, a.mip_gap, a.threads, _ProgressView(st),
                         method=a.method, memory_limit=int(a.memory_limit * 2**30), speedups=speedups, objective=a.objective)
    rep = out.report()
    if a.out:
        out.schedule.save(a.out)
    if a.report:
        write_json_atomic(a.report, rep, indent=1)
    console.print(_result_table(rep))
    if rep["status"] == "timeout":
        err.print(f"[yellow]time limit reached: best schedule returned, {rep['epoch_gap']} epoch(s) above the proven lower bound[/yellow]")
    if a.out:
        console.print(f"schedule written to {a.out}")
    return 0


def _is_xml(path: str) -> bool:
    return Path(path).suffix.lower() == ".xml"


def _load_any_schedule(path: str):
    """A flowride schedule JSON, or an MSCCL algorithm XML turned into one (on a full mesh)."""
    from flowride.schedule import load_schedule

    if _is_xml(path):
        from flowride.schedule.msccl import program_to_schedule, read_msccl

        return program_to_schedule(read_msccl(path))
    return load_schedule(path)


def cmd_verify(a: argparse.Namespace) -> int:
    from flowride.schedule import lower_bounds, simulate

    sched = _load_any_schedule(a.schedule)  # an algorithm found wrong on reading: InvalidSchedule, exit 1
    sim = simulate(sched)
    if not sim.valid:
        print(f"invalid: {sim.first_violation}", file=sys.stderr)
        if len(sim.violations) > 1:
            err.print(f"({len(sim.violations) - 1} more violation(s))")
        return 1
    lb = lower_bounds(sched.topology, sched.demand).best_s
    console.print(
        f"valid: {len(sched.sends)} sends, {sim.epochs} epochs, finish {sim.finish_time_s * 1e6:.3f} us "
        f"(lower bound {lb * 1e6:.3f} us)"
    )
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from flowride.schedule import load_schedule
    from flowride.schedule.msccl import write_msccl
    from flowride.schedule.program import lower

    if not a.msccl:
        raise InputError("--msccl", "no output given", "name the XML file to write, e.g. --msccl algo.xml")
    sched = load_schedule(a.schedule)
    prog = lower(sched)
    write_msccl(prog, a.msccl, unfused=a.unfused, proto=a.proto)
    steps = sum(len(g.steps) for g in prog.gpus)
    kind = "unfused (s/r/rrc/nop)" if a.unfused else "MSCCL"
    console.print(f"{kind} algorithm for {prog.collective.value} on {prog.ngpus} GPUs, {steps} steps, written to {a.msccl}")
    return 0


def cmd_show(a: argparse.Namespace) -> int:
    from flowride.schedule import simulate
    from flowride.schedule.timeline import write_png, write_trace

    if not (a.png or a.trace):
        raise InputError("--png/--trace", "nothing to write", "give --png out.png and/or --trace out.json")
    sched = _load_any_schedule(a.schedule)
    sim = simulate(sched)
    if a.png:
        write_png(sched, a.png, title=f"{sched.topology.name} {sched.collective.value}")
        console.print(f"link utilisation written to {a.png}")
    if a.trace:
        write_trace(sched, a.trace)
        console.print(f"Chrome trace (open in ui.perfetto.dev) written to {a.trace}")
    if not sim.valid:  # drawn anyway (the picture shows where it goes wrong), but it is a failed check
        console.print(f"{len(sched.sends)} sends on {len(sched.topology.links)} links")
        print(f"invalid: {sim.first_violation}", file=sys.stderr)
        return 1
    console.print(f"{len(sched.sends)} sends on {len(sched.topology.links)} links; valid, {sim.epochs} epochs, "
                  f"{sim.finish_time_s * 1e6:.3f} us")
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from flowride.comm.launch import CommFailed, run_schedule
    from flowride.schedule.program import lower

    if _is_xml(a.schedule):
        from flowride.schedule.msccl import read_msccl

        target = read_msccl(a.schedule)
    else:
        from flowride.schedule import load_schedule

        target = lower(load_schedule(a.schedule))
    size = parse_size(a.size, "--size") if a.size else None
    with Progress(TextColumn("[bold]run[/bold] {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task(f"{target.collective.value} on {target.ngpus} ranks", total=None)

        def on_progress(ev: dict) -> None:
            kind = ev.get("event")
            if kind in ("warmup", "repeat"):
                bar.update(task, total=ev.get("of"), completed=ev.get("i", 0), description=f"{kind} {ev.get('i', 0)}/{ev.get('of')}")
            elif kind in ("spawned", "check"):
                bar.update(task, description=f"{kind}: {target.collective.value} on {target.ngpus} ranks")

        try:
            with _as_options(size_bytes="--size", timeout_s="--timeout"):
                res = run_schedule(target, size_bytes=size, repeats=a.repeats, warmup=a.warmup, timeout_s=a.timeout, barrier_per_epoch=a.barrier_per_epoch, progress=on_progress, mode=a.mode)
        except CommFailed as e:
            print(f"error: run failed: {e}", file=sys.stderr)
            if getattr(e, "details", ""):
                err.print(e.details, style="dim", markup=False, highlight=False)
            return 1
    rep = res.report()
    if a.report:
        write_json_atomic(a.report, rep, indent=1)
    if not res.ok:
        for e in res.errors[:10]:
            print(f"wrong: {e}", file=sys.stderr)
        if len(res.errors) > 10:
            err.print(f"({len(res.errors) - 10} more)")
        return 1
    t = Table(title=f"flowride run: {rep['collective']} on {rep['ranks']} ranks ({rep['backend']}, {rep['device']})")
    t.add_column("")
    t.add_column("value", justify="right")
    t.add_row("buffer per rank", f"{format_size(rep['actual_bytes'])} ({rep['chunks']} chunk(s) per block, {rep['repeats']} repeats)")
    t.add_row("schedule (median)", f"{rep['ours_median_s'] * 1e3:.3f} ms")
    t.add_row("torch.distributed (median)", f"{rep['torch_median_s'] * 1e3:.3f} ms")
    t.add_row("ratio ours/torch", f"{rep['ratio']:.2f}")
    t.add_row("output", "equal to torch.distributed and the definition" if rep["correct"] else "WRONG")
    console.print(t)
    return 0


def cmd_topologies(a: argparse.Namespace) -> int:
    from flowride.topology import BUILTINS, build_topology

    t = Table(title="built-in topologies")
    for c in ("name", "parameters", "example", "GPUs", "switches", "links"):
        t.add_column(c)
    for name, spec in BUILTINS.items():
        topo = build_topology(name, **spec.example)
        ex = ", ".join(f"{k}={v}" for k, v in spec.example.items()) or "-"
        t.add_row(name, ", ".join(spec.params) or "-", ex, str(len(topo.gpus)), str(len(topo.switches)), str(len(topo.links)))
    console.print(t)
    return 0


def cmd_topology(a: argparse.Namespace) -> int:
    from flowride.topology import save_topology

    topo = _load_topology(a)
    if a.out:
        save_topology(topo, a.out)
        console.print(f"{topo.summary()} written to {a.out}")
    else:
        console.print(topo.summary())
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    from flowride.api import synthesize
    from flowride.topology import dgx1, ndv2

    cases = [
        (dgx1(), "allgather", "64MB", "fast"),
        (dgx1(), "alltoall", "64MB", "slow"),
        (ndv2(2, teccl_compat=True), "allgather", "1GB", "slow"),
        (ndv2(2, teccl_compat=True), "allgather", "1GB", "fast"),
    ]
    t = Table(title="flowride demo: synthesized schedules against the baseline and the lower bound")
    for c in ("case", "finish us", "baseline us", "bound us", "solver s", "status"):
        t.add_column(c, justify="right")
    with err.status("demo") as st:
        for topo, coll, size, ep in cases:
            st.update(f"[bold]demo[/bold] {coll} {size} on {topo.name} ({ep})")
            o = synthesize(topo, coll, parse_size(size), ep, time_limit=120)
            r = o.report()
            t.add_row(
                f"{topo.name} {coll} {size} {ep}",
                f"{r['finish_time_us']:.1f}",
                f"{r['baseline_us']:.1f} ({r['baseline']}, {r['speedup_vs_baseline']:.2f}x slower)",
                f"{r['lower_bound_us']:.1f} (ours {r['ratio_to_lower_bound']:.2f}x)",
                f"{r['solver_time_s']:.2f}",
                f"{r['status']}{', verified' if r['verified'] else ', UNVERIFIED'}",
            )
    console.print(t)
    console.print("published TE-CCL (Gurobi) for ndv2 2-chassis AllGather 1GB: slow 50000 us, fast 43750 us")
    _demo_run(Path(a.out_dir))
    if not a.no_harvest:
        _demo_harvest(Path(a.out_dir))
    return 0


def _demo_run(out_dir: Path) -> None:
    """An AllReduce synthesized, exported to MSCCL XML, drawn, and executed over torch.distributed."""
    from flowride.api import synthesize
    from flowride.comm.launch import run_schedule
    from flowride.schedule.msccl import program_to_schedule, read_msccl, write_msccl
    from flowride.schedule.program import lower
    from flowride.schedule.simulate import simulate
    from flowride.schedule.timeline import write_png, write_trace
    from flowride.topology import dgx1

    out_dir.mkdir(parents=True, exist_ok=True)
    with err.status("[bold]demo[/bold] AllReduce 1MB on dgx1: synthesize, export, run on 8 local ranks (gloo)") as st:
        o = synthesize(dgx1(), "allreduce", parse_size("1MB"), "fast", chunks=1, time_limit=60)
        sched_path, xml = out_dir / "allreduce.json", out_dir / "allreduce.xml"
        o.schedule.save(sched_path)
        prog = lower(o.schedule)
        write_msccl(prog, xml)
        back = simulate(program_to_schedule(read_msccl(xml)))
        write_png(o.schedule, out_dir / "allreduce-links.png", title="dgx1 AllReduce 1MB")
        write_trace(o.schedule, out_dir / "allreduce-trace.json")
        st.update("[bold]demo[/bold] running the AllReduce on 8 local ranks (gloo) against torch.distributed")
        res = run_schedule(prog, repeats=3, warmup=1, timeout_s=300)
    r = o.report()
    rep = res.report()
    t = Table(title="flowride demo: a schedule that runs (dgx1 AllReduce 1MB, CPU gloo loopback)")
    t.add_column("")
    t.add_column("value", justify="right")
    t.add_row("synthesized", f"{r['finish_time_us']:.1f} us modelled ({r['baseline']} baseline {r['baseline_us']:.1f} us), verified {r['verified']}")
    t.add_row("MSCCL XML", f"{xml} (read back and verified: {back.valid})")
    t.add_row("executed", f"{'correct' if res.ok else 'WRONG'}; ours {rep['ours_median_s'] * 1e3:.2f} ms vs torch.distributed {rep['torch_median_s'] * 1e3:.2f} ms (x{rep['ratio']:.2f})")
    t.add_row("drawn", f"{out_dir / 'allreduce-links.png'}, {out_dir / 'allreduce-trace.json'}")
    console.print(t)


def _demo_harvest(out_dir: Path) -> None:
    """Pipeline training (p=2, 1F1B) with a mix of side tasks: freeride against naive co-location,
    each overhead measured paired (harvesting on and off in alternating blocks of one run)."""
    from flowride.harvest.session import DEFAULT_BUDGET_PCT, compare, profiles_for
    from flowride.pipeline.config import TrainConfig
    from flowride.pipeline.timeline import write_png

    tasks = ["pagerank", "cnn", "image"]
    # medium: bubbles of 0.07-0.22 s, long enough for 13 ms side-task steps; 22 iterations = 2 warm-up
    # + 5 pairs of 2-iteration on/off blocks, enough for a confidence interval
    cfg = TrainConfig(schedule="1f1b", stages=2, microbatches=4, model="medium", iters=22, pin_cores=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    with err.status("[bold]demo[/bold] profiling side tasks alone"):
        profiles = profiles_for(tasks, out_dir / "task-profiles.json")
    t = Table(title=f"flowride demo: pipeline training (p=2, {cfg.schedule} on the {cfg.engine} engine, m=4, medium GPT) with side "
                    "tasks pagerank+cnn+image (CPU), "
                    f"overhead paired on/off, budget {DEFAULT_BUDGET_PCT:g}%")
    for c in ("mode", "overhead (95% CI)", "within budget", "side work (dedicated s)", "harvest efficiency", "savings", "losses identical"):
        t.add_column(c, justify="right")
    base_rep = None
    for mode in ("freeride", "naive"):
        with err.status(f"[bold]demo[/bold] training with side tasks ({mode}), harvesting on and off in blocks") as st:
            c = compare(replace(cfg, run_dir=str(out_dir / mode)), mode, tasks, profiles=profiles, baseline_report=base_rep,
                        on_stage=lambda msg, st=st: st.update(f"[bold]demo[/bold] {msg}"))
        base_rep = c.baseline
        h = c.report
        lo, hi = h["overhead_ci95"]
        verdict = {"within": "yes", "over": "NO", "undecided": "undecided (more pairs)"}[h["budget_verdict"]]
        t.add_row(mode, f"{h['overhead_pct']:+.1f}% [{lo:+.1f}, {hi:+.1f}]", verdict,
                  f"{h['cost']['dedicated_seconds']:.2f}", f"{h['harvest_efficiency']:.2f}", f"{h['cost']['savings']:+.3f}",
                  str(h["losses_identical"]))
        if mode == "freeride":
            png = out_dir / "harvest-timeline.png"
            write_png(c.result.ranks, c.result.gaps, png, "1F1B p=2 m=4 with side tasks in the bubbles (freeride)", side_steps=c.record["steps"])
    console.print(t)
    console.print("The training owner's view: a mode is acceptable only if its overhead's upper 95% bound stays within the "
                  f"budget ({DEFAULT_BUDGET_PCT:g}%); an interval that straddles it needs a longer run (benchmarks/harvest.py "
                  "runs 10 pairs). On this CPU, naive co-location can still show positive savings: "
                  "time-sharing a core is nearly zero-sum, so the side work it gains is paid for by training's slowdown; on a "
                  "GPU the slowdown, not the savings, decides.", soft_wrap=True)
    console.print(f"timeline with side-task steps inside the bubbles: {out_dir / 'harvest-timeline.png'}")


def _train_config(a: argparse.Namespace, iters: int | None = None):
    from flowride.pipeline.config import TrainConfig

    return TrainConfig(
        schedule=a.schedule.lower(), stages=a.stages, microbatches=a.microbatches, chunks=a.chunks,
        model=a.model, iters=iters or a.iters, microbatch_size=a.microbatch_size, seed=a.seed, lr=a.lr,
        data=a.data, run_dir=a.run_dir, bubble_port=getattr(a, "bubble_port", None),
        profile=getattr(a, "bubble_profile", None), timeout_s=a.timeout, device=a.device, threads=a.threads,
        engine=a.engine.lower(), min_bubble_s=a.min_bubble,
    )


def _run_training(cfg):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from flowride.pipeline.launch import TrainingFailed
    from flowride.pipeline.trainer import check_profile, train

    with _as_options(**PIPELINE_OPTIONS):
        cfg.validate()  # bad input fails before any progress bar or process starts
    check_profile(cfg)
    with Progress(
        TextColumn("[bold]train[/bold] {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[secs]} s/iter"), TimeElapsedColumn(),
        console=err, transient=False,
    ) as prog:
        task = prog.add_task(f"{cfg.schedule} p={cfg.stages} m={cfg.microbatches}", total=cfg.iters, loss="-", secs="-")

        def on_progress(ev: dict) -> None:
            prog.update(task, completed=ev["iteration"] + 1, loss=f"{ev['loss']:.4f}", secs=f"{ev['seconds']:.3f}")

        try:
            return train(cfg, on_progress)
        except TrainingFailed as e:
            raise _RunFailed(str(e)) from None


class _RunFailed(Exception):
    """A training rank failed: shown with its error, exit code 1."""


def _bubble_table(rep: dict) -> Table:
    t = Table(title=f"{rep['schedule']}: {rep['stages']} stages, {rep['microbatches']} micro-batches, {rep['model']} model")
    for c in ("stage", "type", "per iter", "median ms", "min ms", "free memory"):
        t.add_column(c, justify="right")
    for b in rep["bubbles"]:
        if b["type"] == "S":
            continue
        t.add_row(str(b["stage"]), b["type"], f"{b['count_per_iteration']:.0f}", f"{b['median_s'] * 1e3:.2f}",
                  f"{b['min_s'] * 1e3:.2f}", f"{b['free_memory_bytes'] / 2**30:.1f} GiB")
    return t


def cmd_train(a: argparse.Namespace) -> int:
    from flowride.pipeline.timeline import write_png, write_trace

    cfg = _train_config(a)
    tasks = [t.strip() for t in (a.side_tasks or "").split(",") if t.strip()]
    mode = a.harvest.lower()
    side_steps: list[dict] = []
    if tasks and mode != "none":
        res, rep, side_steps = _train_harvesting(a, cfg, tasks, mode)
    else:
        res = _run_training(cfg)
        rep = res.report()
        rep["harvest_mode"] = "none"
    if a.report:
        write_json_atomic(a.report, rep, indent=1)
    if a.timeline:
        write_png(res.ranks, res.gaps, a.timeline, f"{cfg.schedule}, p={cfg.stages}, m={cfg.microbatches} (last iteration)", side_steps=side_steps)
    if a.trace:
        write_trace(res.ranks, res.gaps, a.trace, side_steps=side_steps)
    console.print(_bubble_table(rep))
    if rep.get("harvest_mode", "none") != "none":
        console.print(_harvest_table(rep))
    console.print(
        f"iteration {rep['iteration_time_s'] * 1e3:.1f} ms (median after warm-up); loss {rep['losses'][0]:.4f} -> "
        f"{rep['losses'][-1]:.4f}; bubble fraction measured {rep['bubble_fraction_measured']:.3f}, "
        f"theory {rep['bubble_fraction_theory']:.3f}",
        soft_wrap=True,
    )
    return 0


def _train_harvesting(a: argparse.Namespace, cfg, tasks: list[str], mode: str):
    """A `none` baseline (or a given baseline report), then the same training with side tasks,
    harvesting switched on and off in randomized blocks (the paired overhead)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from flowride.files import read_json
    from flowride.harvest.session import check_comparison, compare
    from flowride.harvest.supervise import ManagerUnavailable
    from flowride.pipeline.launch import TrainingFailed

    with _as_options(**PIPELINE_OPTIONS):
        check_comparison(cfg, mode, tasks, a.paired_block, a.budget, a.price_ref, a.price_main)
    base_rep = None
    if a.baseline_report:
        base_rep = read_json(a.baseline_report, "--baseline-report", "give a report written by flowride train")
        for key in ("iteration_times_s", "iteration_time_s", "losses", "bubble_seconds_total"):
            if key not in base_rep:
                raise InputError("--baseline-report", f"has no {key!r}", "give a report written by flowride train")
    with Progress(TextColumn("[bold]train+harvest[/bold] {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=err) as prog:
        task = prog.add_task("profiling side tasks", total=cfg.iters, loss="-")

        def on_stage(msg: str) -> None:
            prog.update(task, description=msg, completed=0)

        def on_progress(ev: dict) -> None:
            prog.update(task, completed=ev["iteration"] + 1, loss=f"{ev['loss']:.4f}")

        try:
            c = compare(cfg, mode, tasks, paired_block=a.paired_block, baseline_report=base_rep, p_ref=a.price_ref,
                        p_main=a.price_main, budget_pct=a.budget, bubble_profile=a.bubble_profile,
                        on_stage=on_stage, on_progress=on_progress)
        except (TrainingFailed, ManagerUnavailable) as e:
            raise _RunFailed(str(e)) from None
    return c.result, c.report, c.record.get("steps", [])


def _harvest_table(rep: dict) -> Table:
    ci = rep.get("overhead_ci95")
    ci_text = f" (95% CI {ci[0]:+.2f}..{ci[1]:+.2f}, {rep['overhead_pairs']} pairs)" if ci else ""
    budget = {"within": "within", "over": "OVER", "undecided": "undecided against"}[rep["budget_verdict"]]
    t = Table(title=f"harvest ({rep['harvest_mode']}): overhead {rep['overhead_pct']:+.2f}%{ci_text}, {budget} the "
                    f"{rep['overhead_budget_pct']:g}% budget; efficiency {rep['harvest_efficiency']:.2f}, savings {rep['cost']['savings']:+.4f}")
    for c in ("task", "steps", "units", "units/s", "dedicated units/s", "overruns"):
        t.add_column(c, justify="right")
    for tid, d in rep["side_work"].items():
        t.add_row(f"{tid}:{d['name']}", str(d["steps"]), f"{d['units']:.0f} {d['unit']}", f"{d['throughput']:.1f}",
                  f"{d['dedicated_throughput']:.1f}", str(d["overruns"]))
    for f in rep["failures"]:
        t.add_row(f"{f['task']}:{f['name']}", "FAILED", (f["reason"] or "")[:60], "", "", "")
    if rep.get("manager_restarts"):
        t.add_row("manager", f"restarted {rep['manager_restarts']}x", rep.get("harvest_stopped") or "", "", "", "")
    return t


def cmd_profile_task(a: argparse.Namespace) -> int:
    from flowride.harvest.profile import profile_task

    params = _json_arg(a.params, "--params")
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


def _json_arg(text: str | None, field: str) -> dict:
    if not text:
        return {}
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(field, f"is not JSON ({e.msg})", 'write e.g. \'{"n": 1000}\'') from None
    if not isinstance(v, dict):
        raise InputError(field, "is not a JSON object", 'write e.g. \'{"n": 1000}\'')
    return v


def cmd_tasks(a: argparse.Namespace) -> int:
    from flowride.harvest.store import TaskStore
    from flowride.harvest.task import resolve

    run_dir = Path(a.run_dir)
    if not run_dir.is_dir():  # a store nobody reads: refuse rather than create it
        raise InputError("--run-dir", f"{run_dir} does not exist" if not run_dir.exists() else f"{run_dir} is not a directory",
                         "give the run directory of a training run (flowride train --run-dir), or create it first")
    if a.action == "submit":
        resolve(a.task)
        params = _json_arg(a.params, "--params")
        _check_params(a.task, params)
    with _as_options(task_store="--run-dir"):
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

    d = Path(a.run_dir)
    if not (d / supervise.OPTIONS_FILE).exists():
        raise InputError("--run-dir", f"{d} holds no side-task manager (no {supervise.OPTIONS_FILE})",
                         "give the run directory of a harvesting run")
    if a.action == "status":
        console.print_json(json.dumps(supervise.manager_status(d)))
    elif a.action == "stop":
        console.print("manager stopped; tasks saved" if supervise.stop_running(d) else "no manager was running")
    else:
        port = supervise.restart(d)
        console.print(f"manager restarted on 127.0.0.1:{port} (same port: running trainers keep reaching it); "
                      "unfinished tasks resume from the store")
    return 0


def cmd_profile_bubbles(a: argparse.Namespace) -> int:
    cfg = _train_config(a)
    res = _run_training(cfg)
    prof = res.profile()
    write_json_atomic(a.out, prof, indent=1)
    console.print(_bubble_table(res.report()))
    console.print(f"bubble profile written to {a.out}")
    return 0


def cmd_schedule_show(a: argparse.Namespace) -> int:
    from flowride.pipeline.schedules import build_schedule, render_grid, theoretical_bubble_fraction

    name = a.schedule.lower()
    cells = a.stages * a.microbatches * a.chunks * 3  # forward, backward (and weight) per micro-batch and chunk
    if cells > MAX_GRID_CELLS:
        raise InputError("--microbatches", f"{a.stages} stages x {a.microbatches} micro-batches x {a.chunks} chunk(s) make about "
                         f"{cells:,} cells, over the {MAX_GRID_CELLS:,} a text grid can show", "use fewer stages or micro-batches")
    with _as_options(**PIPELINE_OPTIONS):
        instrs = build_schedule(name, a.stages, a.microbatches, a.chunks)
    console.print(render_grid(instrs, a.stages, a.microbatches, a.chunks), highlight=False, soft_wrap=True)
    console.print(f"theoretical bubble fraction: {theoretical_bubble_fraction(name, a.stages, a.microbatches, a.chunks):.4f}")
    return 0


def _train_args(p: argparse.ArgumentParser, iters: int) -> None:
    p.add_argument("--stages", "-p", type=integer(1, MAX_STAGES, "stages"), default=2, help="pipeline stages (one process each)")
    p.add_argument("--microbatches", "-m", type=integer(1, MAX_MICROBATCHES, "micro-batches"), default=8)
    p.add_argument("--schedule", default="1f1b", help="builtin engine: gpipe, 1f1b, interleaved, zbh1; torch engine: "
                   "gpipe, 1f1b, interleaved1f1b, loopedbfs, interleavedzb, zbv, dualpipev")
    p.add_argument("--engine", default="auto", help="torch (torch.distributed.pipelining), builtin (flowride's instruction "
                   "lists) or auto (default: torch for the schedules torch has, builtin for interleaved and zbh1)")
    p.add_argument("--chunks", "-v", type=integer(1, 16, "chunks"), default=None, help="model chunks per stage (interleaved; default 2 there, else 1)")
    p.add_argument("--model", default="tiny", help="tiny, small or medium")
    p.add_argument("--iters", type=integer(1, 10**7, "iterations"), default=iters)
    p.add_argument("--microbatch-size", type=integer(1, 65536, "samples"), default=4)
    p.add_argument("--seed", type=integer(0, 2**63 - 1, "a seed"), default=0)
    p.add_argument("--lr", type=number(0, 100, lo_open=True, what="a learning rate"), default=1e-3)
    p.add_argument("--data", help="a text file to train on (bytes as tokens); default: generated tokens")
    p.add_argument("--run-dir", type=out_dir, default="runs/train", help="where ranks write their logs and records")
    p.add_argument("--timeout", type=SECONDS, default=120.0, help="seconds a rank may wait on a peer before the run fails")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=THREADS, default=1, help="torch threads per rank")
    p.add_argument("--min-bubble", type=number(0, 60, what="seconds"), default=0.002, help="seconds: waits predicted shorter are not announced")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="flowride", description="Collective schedule synthesis and pipeline-bubble harvesting.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("synth", help="synthesize a verified collective schedule")
    _topology_args(s)
    s.add_argument("--collective", "-c", default="allgather", help="allgather, alltoall, reducescatter or allreduce")
    s.add_argument("--size", "-s", required=True, help="buffer per GPU (AllGather output, ReduceScatter input), e.g. 16MB, 1GiB")
    s.add_argument("--epoch", default="fast", help="epoch length: fast, slow or seconds")
    s.add_argument("--chunks", type=integer(1, MAX_CHUNKS, "chunks"), default=1, help="chunks per source block")
    s.add_argument("--time-limit", type=SECONDS, help="seconds for the whole search; the best schedule so far is returned")
    s.add_argument("--mip-gap", type=number(0, 1, what="a ratio"), help="relative MIP gap at which a probe may stop")
    s.add_argument("--threads", type=THREADS, help="solver threads")
    s.add_argument("--method", default="auto", help="milp, lp (AlltoAll), astar or trees (AllGather-like), or auto (by instance size)")
    s.add_argument("--memory-limit", type=number(0, 1e4, lo_open=True, what="GiB"), default=8.0, help="GiB the MILP may use; a larger one is refused up front")
    s.add_argument("--speedups", default="default",
                   help="MILP search speed-ups: default, none, all, or a comma list of incumbent, bounds, warm_start, symmetry, parallel")
    s.add_argument("--objective", choices=("makespan", "weighted"), default="makespan",
                   help="AlltoAll LP route: makespan (search the horizon, then integral polish; default) or weighted "
                        "(the published TE-CCL objective: one LP rewarding delivery at epoch t by 1/(t+1))")
    s.add_argument("--out", "-o", type=out_file, help="write the schedule JSON here")
    s.add_argument("--report", type=out_file, help="write the report JSON here")
    s.set_defaults(func=cmd_synth)

    v = sub.add_parser("verify", help="replay a schedule (JSON) or an MSCCL algorithm (XML) and check it")
    v.add_argument("schedule")
    v.set_defaults(func=cmd_verify)

    ex = sub.add_parser("export", help="write a schedule as an MSCCL algorithm XML")
    ex.add_argument("schedule")
    ex.add_argument("--msccl", type=out_file, help="the XML file to write")
    ex.add_argument("--unfused", action="store_true", help="only s, r, rrc and nop steps (what ASTRA-sim's converter reads)")
    ex.add_argument("--proto", default="Simple", choices=["Simple", "LL128", "LL"], help="MSCCL protocol attribute")
    ex.set_defaults(func=cmd_export)

    sh = sub.add_parser("show", help="draw a schedule: link-utilisation PNG and/or Chrome trace")
    sh.add_argument("schedule", help="schedule JSON or MSCCL XML")
    sh.add_argument("--png", type=out_file, help="write a PNG of link utilisation over epochs")
    sh.add_argument("--trace", type=out_file, help="write a Chrome-trace JSON (one track per link and per GPU)")
    sh.set_defaults(func=cmd_show)

    rn = sub.add_parser("run", help="execute a schedule over torch.distributed and check it against torch's collective")
    rn.add_argument("schedule", help="schedule JSON or MSCCL XML")
    rn.add_argument("--size", "-s", help="buffer per rank (default: the schedule's size)")
    rn.add_argument("--repeats", type=COUNT, default=5, help="timed repeats (median reported)")
    rn.add_argument("--warmup", type=integer(0, 10**6, "repeats"), default=1, help="untimed repeats first")
    rn.add_argument("--timeout", type=SECONDS, default=120.0, help="seconds before a silent or hung rank fails the run")
    rn.add_argument("--barrier-per-epoch", action="store_true", help="synchronise all ranks after every epoch (default: point-to-point dependencies only)")
    rn.add_argument("--mode", default="auto", choices=["auto", "dataflow", "ordered", "grouped"], help="how messages are issued (auto: dataflow on gloo, grouped on nccl)")
    rn.add_argument("--report", type=out_file, help="write the report JSON here")
    rn.set_defaults(func=cmd_run)

    t = sub.add_parser("topologies", help="list the built-in topologies")
    t.set_defaults(func=cmd_topologies)

    tp = sub.add_parser("topology", help="build a topology and optionally save it as JSON")
    _topology_args(tp)
    tp.add_argument("--out", "-o", type=out_file, help="write the topology JSON here")
    tp.set_defaults(func=cmd_topology)

    tr = sub.add_parser("train", help="pipeline-parallel training that reports its bubbles")
    _train_args(tr, 20)
    tr.add_argument("--report", type=out_file, help="write the report JSON here")
    tr.add_argument("--timeline", type=out_file, help="write a timeline PNG here")
    tr.add_argument("--trace", type=out_file, help="write a Chrome trace JSON here")
    tr.add_argument("--bubble-port", type=PORT, help="UDP port on 127.0.0.1 to publish bubble events to")
    tr.add_argument("--bubble-profile", help="bubble profile JSON (from profile-bubbles) for predicted bubble ends")
    tr.add_argument("--side-tasks", help="comma-separated side tasks to run in the bubbles (e.g. pagerank,cnn,image)")
    tr.add_argument("--harvest", default="freeride", help="none, freeride, naive or priority (with --side-tasks)")
    tr.add_argument("--baseline-report", help="a none-mode train report to measure overhead against (else one is run first)")
    tr.add_argument("--price-main", type=number(0, 1e9, lo_open=True, what="a price"), default=None, help="training job price per hour (default: stages x 1)")
    tr.add_argument("--price-ref", type=number(0, 1e9, lo_open=True, what="a price"), default=1.0, help="reference device price per hour (default 1)")
    tr.add_argument("--paired-block", type=integer(0, 10**6, "iterations"), default=2,
                    help="harvesting alternates on/off in randomized blocks of this many iterations (0: separate runs only)")
    tr.add_argument("--budget", type=number(0, 100, what="percent"), default=2.0, help="the training owner's overhead budget in percent (default 2)")
    tr.set_defaults(func=cmd_train)

    mg = sub.add_parser("manager", help="inspect, restart or stop a run's side-task manager (works while training runs)")
    mg.add_argument("action", choices=("status", "restart", "stop"))
    mg.add_argument("--run-dir", default="runs/train", help="the training run's directory")
    mg.set_defaults(func=cmd_manager)

    pt = sub.add_parser("profile-task", help="run a side task alone: step time, throughput, peak memory")
    pt.add_argument("task")
    pt.add_argument("--params", help="task parameters as a JSON object")
    pt.add_argument("--steps", type=COUNT, default=30, help="steps to time (at most)")
    pt.add_argument("--seconds", type=SECONDS, default=5.0, help="seconds to run (at most)")
    pt.add_argument("--out", "-o", type=out_file, help="write the profile JSON here")
    pt.set_defaults(func=cmd_profile_task)

    tk = sub.add_parser("tasks", help="side tasks in a run's durable store (works while training runs)")
    tsub = tk.add_subparsers(dest="action", required=True, parser_class=_Parser)
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
    tk.set_defaults(func=cmd_tasks)

    pb = sub.add_parser("profile-bubbles", help="run a few iterations and write a bubble profile")
    _train_args(pb, 6)
    pb.add_argument("--out", "-o", type=out_file, default="bubble-profile.json")
    pb.set_defaults(func=cmd_profile_bubbles)

    ss = sub.add_parser("schedule-show", help="print a pipeline schedule's instructions as a grid")
    ss.add_argument("schedule", help="gpipe, 1f1b, interleaved or zbh1")
    ss.add_argument("--stages", "-p", type=integer(1, MAX_STAGES, "stages"), default=4)
    ss.add_argument("--microbatches", "-m", type=integer(1, MAX_MICROBATCHES, "micro-batches"), default=8)
    ss.add_argument("--chunks", "-v", type=integer(1, 16, "chunks"), default=None)
    ss.set_defaults(func=cmd_schedule_show)

    d = sub.add_parser("demo", help="a short showcase: synthesis on built-in topologies, then harvesting bubbles")
    d.add_argument("--out-dir", type=out_dir, default="runs/demo", help="where the harvest demo writes its runs and timeline")
    d.add_argument("--no-harvest", action="store_true", help="only the synthesis part")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # a usage error (already printed) or --help: a code, for callers of main() too
        return e.code if isinstance(e.code, int) else 2
    if getattr(args, "chunks", 0) is None:  # pipeline commands: multi-stage schedules hold 2 chunks by default
        args.chunks = 2 if str(args.schedule).lower() in MULTI_STAGE else 1
    try:
        return int(args.func(args) or 0)
    except InvalidSchedule as e:  # understood and found wrong: a failed verification, not a usage error
        print(f"invalid: {e}", file=sys.stderr)
        return 1
    except InputError as e:
        _say_error(str(e))
        return 2
    except _RunFailed as e:
        print(f"error: training failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except OSError as e:  # the work ran and could not write or read what it had to (a full disk, ...)
        _say_error(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
