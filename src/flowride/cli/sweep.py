"""Size sweeps on the command line, shared by ``flowride synth``, ``run`` and ``export``: nccl-tests'
options (``-b/-e/-f/-i``) or ``--sizes``, and the tables they print (nccl-tests' columns). Each
command parses here, calls one library function (:func:`flowride.sweep.synthesize_sweep`,
:func:`flowride.comm.run_sweep`, :func:`flowride.sweep.export_ranges`) and prints."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from flowride.argtypes import out_dir
from flowride.cli.common import as_options, console, err
from flowride.errors import InputError
from flowride.units import MAX_SWEEP_SIZES, format_size, sweep_sizes


def sweep_args(p: argparse.ArgumentParser, what: str, synth: bool = False) -> None:
    """nccl-tests' size options and ``--sizes`` (``what``: what happens at each size); ``synth``
    adds the synthesis sweep's own (``--out-dir``, ``--no-warm-start``)."""
    g = p.add_argument_group("size sweep (nccl-tests' options; K, M, G are powers of 1024 as there; KB, MB are decimal)")
    g.add_argument("-b", "--minbytes", help=f"smallest size, e.g. 8 or 1KB: {what} at every size from -b to -e")
    g.add_argument("-e", "--maxbytes", help="largest size (inclusive; default: -b)")
    g.add_argument("-f", "--stepfactor", help="multiply the size by this at each step (default 2)")
    g.add_argument("-i", "--stepbytes", help="or add this many bytes at each step (nccl-tests' -i)")
    g.add_argument("--sizes", help=f"the sweep in one option: 8B:1GB:x2, 1KB:64KB:+1KB or 1KB,4KB,16KB (at most {MAX_SWEEP_SIZES} sizes)")
    g.add_argument("--json", action="store_true", help="print one JSON object per size (the table's fields) instead of the table")
    if synth:
        g.add_argument("--out-dir", type=out_dir, help="sweep: write each size's schedule JSON here")
        g.add_argument("--no-warm-start", action="store_true", help="sweep: synthesize every size from scratch (default: each size "
                       "starts from the previous size's schedule, retimed)")


def sweep_of(a: argparse.Namespace) -> list[int] | None:
    """The requested sizes, or None when no sweep option was given."""
    return sweep_sizes(a.minbytes, a.maxbytes, a.stepfactor, a.stepbytes, a.sizes)


class SweepView:
    """One status line: which size of the sweep, and the stage its synthesis is in."""

    def __init__(self, status) -> None:
        self.status, self.t0, self.where = status, time.perf_counter(), ""

    def __call__(self, ev: dict) -> None:
        if ev.get("stage") == "size":
            cand = f"{ev['candidate']} ({ev['candidate_i']}/{ev['candidates']}), " if "candidate" in ev else ""
            self.where = f"{cand}size {ev['i']}/{ev['of']}: {format_size(ev['size'])}"
        self.status.update(escape(f"[sweep] {self.where}: {ev.get('stage', '')}") + f"  [{time.perf_counter() - self.t0:.1f}s]")


def _f(x: float | None, fmt: str) -> str:
    return "N/A" if x is None else format(x, fmt)


def _time(us: float | None) -> str:
    """nccl-tests' time format: fewer decimals as times grow."""
    if us is None:
        return "N/A"
    return f"{us:.0f}" if us >= 10000 else f"{us:.1f}" if us >= 100 else f"{us:.2f}"


def _nccl_table(title: str, groups: list[tuple[str, list[str]]]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("size\n(B)", "count\n(elements)", "type", "redop"):
        t.add_column(col, justify="right" if col[0] in "sc" else "left", no_wrap=True)
    for name, cols in groups:
        for k, col in enumerate(cols):
            t.add_column(f"{name if k == 0 else ''}\n{col}", justify="right", no_wrap=True)
    return t


# ---- flowride synth --sizes ----

def synth_sweep(a: argparse.Namespace, topo, sizes: list[int], epoch, speedups) -> int:
    """``flowride synth`` over a sweep: modelled nccl-tests columns, the bound and the search."""
    from flowride.api import WARM_TAG
    from flowride.sweep import synthesize_sweep
    from flowride.synth.options import SynthOptions

    if a.out:
        raise InputError("--out", "names one file, and a sweep makes a schedule per size", "use --out-dir DIR for a sweep")
    opts = SynthOptions(a.method, epoch, a.time_limit, a.mip_gap, a.threads, int(a.memory_limit * 2**30), speedups, a.objective)
    fields = as_options(chunks="--chunks", time_limit="--time-limit", epoch="--epoch", mip_gap="--mip-gap", threads="--threads",
                        size="--sizes", sizes="--sizes", collective="--collective", method="--method", objective="--objective")
    with err.status("[bold]synth[/bold] sweep") as st, fields:
        points = synthesize_sweep(topo, a.collective, sizes, a.chunks, opts, SweepView(st), warm_start=not a.no_warm_start)
    rows = [p.row() for p in points]
    if a.out_dir:
        d = Path(a.out_dir)
        d.mkdir(parents=True, exist_ok=True)
        for p in points:
            p.outcome.schedule.save(d / f"{p.outcome.demand.collective.value}_{p.size_bytes}B.json")
    if a.report:
        from flowride.files import write_json_atomic

        write_json_atomic(a.report, {"topology": topo.name, "gpus": len(topo.gpus), "rows": rows}, indent=1)
    if a.json:
        print(json.dumps(rows))
        return 0
    rep = points[0].outcome.report()
    t = _nccl_table(f"{rep['collective']} on {rep['topology']} ({rep['gpus']} GPUs), times modelled by the epoch simulator; "
                    f"sizes rounded to whole float32 elements, {a.chunks} chunk(s) per block",
                    [("modelled", ["time (us)", "algbw (GB/s)", "busbw (GB/s)"]),
                     ("synthesis", ["bound (us)", "ratio", "epochs", "chunks", "method", "status"])])
    for r in rows:
        method = str(r["method"]).removesuffix(WARM_TAG) + (" +warm" if r["warm_start_won"] else "")
        t.add_row(str(r["size"]), str(r["count"]), r["type"], r["redop"], _time(r["time_us"]), _f(r["algbw_GBps"], ".2f"),
                  _f(r["busbw_GBps"], ".2f"), _time(r["lower_bound_us"]), _f(r["ratio_to_lower_bound"], ".3f"), str(r["epochs"]),
                  str(r["chunks"]), escape(method), r["status"])
    console.print(t)
    won = sum(r["warm_start_won"] for r in rows)
    warm = "off" if a.no_warm_start else f"{won} of {len(rows) - 1} sizes kept the previous size's schedule, retimed (+warm)"
    console.print(f"{len(rows)} sizes in {sum(r['seconds'] for r in rows):.2f} s; warm start: {warm}"
                  + (f"; schedules written to {a.out_dir}" if a.out_dir else ""))
    return 0


# ---- flowride run -b/-e/-f ----

def run_sweep_table(rows: list, collective: str, ranks: int) -> Table:
    """nccl-tests' out-of-place table, flowride's program and torch.distributed's collective side by side."""
    where = f"{rows[0].device}, {rows[0].backend}" if rows else ""
    t = _nccl_table(f"{collective} on {ranks} ranks ({where}); out of place, median of the repeats",
                    [("flowride", ["time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"]),
                     ("torch.distributed", ["time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"])])
    for r in rows:
        t.add_row(str(r.size), str(r.count), r.type, r.redop, _time(r.time_us), _f(r.algbw_GBps, ".2f"), _f(r.busbw_GBps, ".2f"),
                  str(r.wrong), _time(r.torch_time_us), _f(r.torch_algbw_GBps, ".2f"), _f(r.torch_busbw_GBps, ".2f"), str(r.torch_wrong))
    return t


# ---- flowride export --sizes ----

def ranges_table(plan) -> Table:
    t = Table(title=f"MSCCL algorithms for {plan.collective} on {plan.topology} ({plan.gpus} GPUs), one per size range",
              title_justify="left")
    for col in ("minBytes", "maxBytes", "file", "chunks", "epochs", "protocol", "swept sizes", "worst loss"):
        t.add_column(col, justify="right" if col in ("minBytes", "maxBytes", "chunks", "worst loss") else "left")
    for r in plan.ranges:
        t.add_row(str(r.min_bytes), "0 (open)" if r.max_bytes == 0 else str(r.max_bytes), r.file, str(r.chunks), r.pick.epoch, r.proto,
                  ", ".join(format_size(s) for s in r.sizes), "-" if r.worst_loss is None else f"{r.worst_loss:.3f}")
    return t
