"""``flowride synth``, ``verify`` and ``show``: schedules synthesized, checked and drawn, each parsed,
handed to one library call and printed."""

from __future__ import annotations

import argparse
import math
import sys
import time

from rich.markup import escape
from rich.table import Table

from flowride.argtypes import SECONDS, THREADS, integer, number, out_file
from flowride.cli.common import (
    as_options,
    calibration_args,
    chosen_calibration,
    console,
    err,
    refuse_unused,
    topology_args,
)
from flowride.cli.sweep import sweep_args, sweep_of, synth_sweep
from flowride.cli.topology import load_topology
from flowride.errors import InputError
from flowride.files import write_json_atomic
from flowride.sizes import MAX_CHUNKS, MAX_EPOCH_S, MIN_EPOCH_S
from flowride.units import format_size, parse_size


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


def _chunks(text: str) -> int | str:
    """``auto`` or a whole number of chunks (argparse type of ``--chunks``)."""
    if text.strip().lower() == "auto":
        return "auto"
    return integer(1, MAX_CHUNKS, "chunks, or auto")(text)


class _ProgressView:
    """Live one-line status while solving: method, stage (chunk count, window, probe or tree
    shape), the best finish so far in microseconds (as the report will state it) and its ratio to
    the lower bound, elapsed time."""

    def __init__(self, status) -> None:
        self.status = status
        self.t0 = time.perf_counter()
        self.method = "bounds"
        self.best_us: float | None = None  # finish of the best verified schedule so far
        self.bound_us: float | None = None

    def _best(self) -> str:
        if self.best_us is None:
            return ""
        ratio = f" ({self.best_us / self.bound_us:.3f}x the bound)" if self.bound_us else ""
        return f" | best {self.best_us:.4g} us{ratio}"

    def __call__(self, ev: dict) -> None:
        el = time.perf_counter() - self.t0
        stage = ev["stage"]
        if ev.get("best_us") is not None:
            self.best_us = ev["best_us"] if self.best_us is None else min(self.best_us, ev["best_us"])
        if ev.get("bound_us"):
            self.bound_us = ev["bound_us"]
        loud = False
        # the method each stage belongs to (auto runs several in turn)
        self.method = {"trees": "trees", "window": "astar", "probe": "milp", "probed": "milp", "lp": "lp",
                       "lp-probed": "lp", "integral": "lp", "static-lp": "lp", "matched": "lp"}.get(stage, self.method)
        if stage == "bounds":
            msg = f"baseline {ev['baseline']}"
        elif stage == "nccl":
            msg = f"NCCL's best modelled algorithm: {ev['algorithm']}, {ev['nccl_us']:.4g} us"
        elif stage == "chunks":
            msg = f"{ev['chunks']} chunk(s) per block ({ev['i']}/{ev['of']})" + (f", {ev['search']} search" if ev.get("search") else "")
        elif stage == "method":
            if ev["method"] != "incumbent":
                self.method = ev["method"]
            msg = f"MILP of {ev['columns']:,} columns" if ev["method"] == "milp" and ev.get("columns") else "best so far"
        elif stage == "trees":
            msg = f"tree shape {ev['variant']} ({ev['i']}/{ev['of']}): {ev['epochs']} epochs"
        elif stage == "probe":
            msg = f"probe {ev['T']} epochs (search [{ev['lo']}, {ev['hi']}])"
        elif stage == "probed":
            msg = f"probe {ev['T']} epochs: {ev['outcome']} (search [{ev['lo']}, {ev['hi']}])"
            loud = True
        elif stage == "window":
            msg = f"window {ev['window']} at epoch {ev['start_epoch']}: {ev['delivered']}/{ev['needed']} delivered"
        elif stage == "done":
            self.best_us = ev["best_us"]  # the report's schedule (NCCL's own, where it won)
            msg = f"done: {ev['chunks']} chunk(s) per block"
        elif stage == "decompose":
            msg = "LP flow decomposed into sends"
            loud = True
        elif stage == "matched":
            msg = f"matched rounds (spread {ev['spread']:g}): {ev['epochs']} epochs, bound {ev['lower']}"
        else:  # the LP method's other stages: print what they report
            msg = f"{stage}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in ev.items()
                                           if k not in ("stage", "elapsed", "best_us", "bound_us"))
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
    if rep.get("group"):
        g = rep["group"]
        from flowride.topology.group import format_ranks

        t.add_row("process group", f"ranks {format_ranks(g['ranks'])} of {g['of']}; relay {'on' if g['relay'] else 'off'}")
    pred = rep.get("nccl_predicted")
    if pred:  # the headline: one calibrated model on both sides
        e = pred["model_error"]
        err_s = f"model error {100 * e:.0f}% near this size" if e is not None else "model error unknown (no measured curve)"
        t.add_row("NCCL, predicted", f"{pred['time_us']:.3f} us, {pred['algorithm']}/{pred['protocol']} (modelled: {pred['calibration']}; "
                  f"{err_s})")
        if rep.get("runtime_us"):
            t.add_row("ours, as the runtime runs it", f"{rep['runtime_us']:.3f} us ({rep['runtime_protocol']}, modelled); "
                      f"{rep['speedup_vs_nccl']:.2f}x NCCL's predicted time")
        else:
            t.add_row("ours, as the runtime runs it", f"not priced: {rep.get('runtime_unpriced')}")
    t.add_row("finish time (epoch model)", f"{rep['finish_time_us']:.3f} us  ({rep['epochs']} epochs x {rep['epoch_duration_us']:.4g} us)")
    t.add_row("algorithmic bandwidth", f"{rep['algbw_GBps']:.3f} GB/s (epoch model)")
    t.add_row("lower bound", f"{rep['lower_bound_us']:.3f} us ({rep['lower_bound_kind']}); ratio {rep['ratio_to_lower_bound']:.3f}")
    for kind, what in (("forest", "forest (max-flow) bound"), ("flow", "concurrent-flow bound")):
        if rep["lower_bounds_us"].get(kind):
            t.add_row(what, f"{rep['lower_bounds_us'][kind]:.3f} us")
    if rep.get("nccl"):  # detail: the epoch model's figures
        n = rep["nccl"]
        algos = ", ".join(f"{k} {v:.4g}{'' if n['how'][k] == 'simulated' else ' (' + n['how'][k] + ')'}" for k, v in n["algorithms"].items())
        t.add_row("detail: NCCL in the epoch model", f"best {n['best']} {n['best_us']:.3f} us; ours {rep['speedup_vs_nccl_epoch_model']:.2f}x "
                  f"there ({algos} us)")
        for note in n.get("notes", []):
            t.add_row("detail: NCCL model note", note)
        tb = n["tuning"]
        if tb.get("best"):
            t.add_row("detail: NCCL's own estimate", f"{tb['best']} ({tb['protocols'][tb['best']]}) {tb['best_us']:.3f} us (uncalibrated)")
    t.add_row(f"detail: {rep['baseline']} baseline", f"{rep['baseline_us']:.3f} us in the epoch model")
    if rep.get("chunks_requested") == "auto" and rep.get("chunk_search"):
        tried = sorted({r["chunks"] for r in rep["chunk_search"]})
        t.add_row("chunks", f"{rep['chunks']} per block (auto: tried {', '.join(map(str, tried))})")
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
    from flowride.synth.options import parse_speedups

    epoch = _epoch(a.epoch)
    if a.concurrent is not None:
        from flowride.cli.concurrent import cmd_concurrent

        return cmd_concurrent(a, epoch)
    a.collective = a.collective or "allgather"
    a.chunks = a.chunks or "auto"
    topo = load_topology(a)
    with as_options(speedups="--speedups"):
        speedups = parse_speedups(a.speedups)
    chosen = chosen_calibration(a, topo)  # a bad profile is refused before any work
    sizes = sweep_of(a)  # --sizes or -b/-e/-f: one synthesis per size (cli/sweep.py)
    if sizes is not None:
        return synth_sweep(a, topo, sizes, epoch, speedups, chosen)
    if a.size is None:
        raise InputError("--size", "is missing", "give --size, or a size sweep with --sizes or -b/-e/-f")
    refuse_unused(a, "with a size sweep (-b/-e/-f or --sizes)", "give a sweep, or leave it out for one size",
                  out_dir="--out-dir", json="--json", no_warm_start="--no-warm-start")
    size = parse_size(a.size, "--size")
    opts = as_options(chunks="--chunks", time_limit="--time-limit", epoch="--epoch", mip_gap="--mip-gap",
                       threads="--threads", size="--size", collective="--collective", method="--method",
                       objective="--objective")
    with err.status("[bold]synth[/bold] building bounds and baseline") as st, opts:
        out = synthesize(topo, a.collective, size, epoch, a.chunks, a.time_limit, a.mip_gap, a.threads, _ProgressView(st),
                         method=a.method, memory_limit=int(a.memory_limit * 2**30), speedups=speedups, objective=a.objective,
                         calibration=chosen)
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


def cmd_verify(a: argparse.Namespace) -> int:
    from flowride.program import (
        is_msccl_path,
        is_mscclpp_path,
        load_as_schedule,
        verify_msccl,
        verify_mscclpp,
    )
    from flowride.schedule import simulate
    from flowride.synth.bounds import lower_bounds

    if is_msccl_path(a.schedule):
        # the executor's rules judge (InvalidSchedule, exit 1); the schedule model times it where it can
        with as_options(sms="--sms"):
            v = verify_msccl(a.schedule, sms=a.sms)
        rep = v.report
        if a.strict and rep.findings:
            more = f" (and {len(rep.findings) - 1} more)" if len(rep.findings) > 1 else ""
            print(f"invalid: {rep.findings[0]}{more} (--strict)", file=sys.stderr)
            return 1
        for f in rep.findings:
            err.print(f"warning: {escape(str(f))}", highlight=False, soft_wrap=True)
        ran = (f"executor rules: {' and '.join(rep.modes)} run{'s' if len(rep.modes) > 1 else ''} correct ({rep.proto}, "
               f"{rep.room} unreceived send(s) per connection, {rep.transfers} chunk transfers, up to {rep.thread_blocks} thread blocks per GPU)")
        if v.schedule is None:
            console.print(escape(f"valid: {v.collective} on {v.ngpus} GPUs by the executor's rules; not timed, the schedule model "
                                 f"cannot place it ({v.unplaced})\n{ran}"), highlight=False, soft_wrap=True)
            return 0
        sched, sim = v.schedule, v.sim
    elif is_mscclpp_path(a.schedule):
        # the plan's rules and its symbolic run judge (InvalidSchedule, exit 1); the schedule model times it where it can
        if a.sms is not None:
            raise InputError("--sms", "applies to MSCCL algorithm XML only", "leave it out for an MSCCL++ plan")
        vp = verify_mscclpp(a.schedule)
        if vp.limits:  # the executor would refuse to launch it (MAX_OPERATION, MAX_CHANNEL)
            more = f" (and {len(vp.limits) - 1} more)" if len(vp.limits) > 1 else ""
            print(f"invalid: over the MSCCL++ executor's limits: {vp.limits[0]}{more}", file=sys.stderr)
            return 1
        ran = vp.summary()
        if vp.schedule is None:
            console.print(escape(f"valid: {vp.collective} on {vp.ngpus} GPUs by the MSCCL++ executor's rules; not timed, the schedule "
                                 f"model cannot place it ({vp.unplaced})\n{ran}"), highlight=False, soft_wrap=True)
            return 0
        sched, sim = vp.schedule, vp.sim
    else:
        if a.sms is not None:
            raise InputError("--sms", "applies to MSCCL algorithm XML only", "leave it out for a schedule JSON")
        sched = load_as_schedule(a.schedule)
        sim = simulate(sched)
        ran = ""
    if not sim.valid:
        print(f"invalid: {sim.first_violation}", file=sys.stderr)
        if len(sim.violations) > 1:
            err.print(f"({len(sim.violations) - 1} more violation(s))")
        return 1
    lb = lower_bounds(sched.topology, sched.demand).best_s
    where = ("modelled on its own topology (epoch model)" if not ran else
             f"modelled on a generic full mesh of its GPUs, one chunk of {format_size(int(sched.demand.chunk_bytes))} a link per "
             "epoch, not the cluster it was written for")
    console.print(
        f"valid: {len(sched.sends)} sends, {sim.epochs} epochs, finish {sim.finish_time_s * 1e6:.3f} us "
        f"(lower bound {lb * 1e6:.3f} us); times {where}", soft_wrap=True
    )
    if ran:
        console.print(escape(ran), highlight=False, soft_wrap=True)
    return 0


def cmd_show(a: argparse.Namespace) -> int:
    from flowride.program import load_as_schedule
    from flowride.schedule import simulate
    from flowride.schedule.timeline import write_png, write_trace

    if not (a.png or a.trace):
        raise InputError("--png/--trace", "nothing to write", "give --png out.png and/or --trace out.json")
    sched = load_as_schedule(a.schedule)
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


def add_synth(sub) -> None:
    """``flowride synth``."""
    s = sub.add_parser("synth", help="synthesize a verified collective schedule")
    topology_args(s)
    s.add_argument("--collective", "-c", help="allgather (default), alltoall, reducescatter or allreduce")
    s.add_argument("--size", "-s", help="buffer per GPU (AllGather output, ReduceScatter input), e.g. 16MB, 1GiB (or a sweep: see below)")
    s.add_argument("--epoch", default="fast", help="epoch length: fast, slow or seconds")
    s.add_argument("--chunks", type=_chunks,
                   help="chunks per source block: auto (default: counts searched within --time-limit, 60 s without one, "
                        "the best kept) or a count")
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
    s.add_argument("--concurrent", metavar="SPEC",
                   help="several collectives at once on shared links, scheduled jointly: a JSON list (inline or a file) of "
                        '{"name", "collective", "ranks", "size", "start_us"}; --out-dir writes each one\'s schedule, MSCCL XML and MSCCL++ plan')
    calibration_args(s)
    sweep_args(s, "synthesize", synth=True)
    s.set_defaults(func=cmd_synth)


def add_verify(sub) -> None:
    """``flowride verify``."""
    v = sub.add_parser("verify", help="replay a schedule (JSON), an MSCCL algorithm (XML) or an MSCCL++ execution plan (JSON) and check it")
    v.add_argument("schedule")
    v.add_argument("--strict", action="store_true",
                   help="XML: fail (exit 1) on what the executor would refuse to load or run otherwise than written, not only warn")
    v.add_argument("--sms", help="XML: the target GPU, as an SM count or a name (v100, a100, h100, h200, b200, ...); "
                                 "its thread blocks per GPU must not exceed it (default: no cap below the executor's 1024, "
                                 "a warning above 80)")
    v.set_defaults(func=cmd_verify)


def add_show(sub) -> None:
    """``flowride show``."""
    sh = sub.add_parser("show", help="draw a schedule: link-utilisation PNG and/or Chrome trace")
    sh.add_argument("schedule", help="schedule JSON or MSCCL XML")
    sh.add_argument("--png", type=out_file, help="write a PNG of link utilisation over epochs")
    sh.add_argument("--trace", type=out_file, help="write a Chrome-trace JSON (one track per link and per GPU)")
    sh.set_defaults(func=cmd_show)
