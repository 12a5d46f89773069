"""Size sweeps on the command line, shared by ``flowride synth``, ``run`` and ``export``: nccl-tests'
options (``-b/-e/-f/-i``) or ``--sizes``, and the tables they print (nccl-tests' columns). Each
command parses here, calls one library function (:func:`flowride.sweep.synthesize_sweep`,
:func:`flowride.comm.run_sweep`, :func:`flowride.sweep.export_ranges`) and prints."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
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
        g.add_argument("--out-dir", type=out_dir, help="sweep: write each size's schedule JSON here (--concurrent: each collective's)")
        g.add_argument("--no-warm-start", action="store_true", help="sweep: synthesize every size from scratch (default: each size "
                       "starts from the previous size's schedule, retimed)")


def sweep_of(a: argparse.Namespace) -> list[int] | None:
    """The requested sizes, or None when no sweep option was given; one ``--size`` given with a
    sweep is refused here, once for every command."""
    sizes = sweep_sizes(a.minbytes, a.maxbytes, a.stepfactor, a.stepbytes, a.sizes)
    if sizes is not None and getattr(a, "size", None):
        raise InputError("--size", "is given together with a sweep (-b/-e/-f or --sizes)", "give one size or a sweep")
    return sizes


def sweep_option(a: argparse.Namespace) -> str:
    """The option the user gave the sweep's largest size with, for errors about a size too large
    (a memory limit): ``--sizes``, ``-e/--maxbytes``, or ``-b/--minbytes`` when -e was left out."""
    if a.sizes is not None:
        return "--sizes"
    return "-e/--maxbytes" if a.maxbytes is not None else "-b/--minbytes"


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


@dataclass
class SweepTable:
    """A sweep's table: a rich table on a terminal, nccl-tests' fixed-width plain text elsewhere.

    Piped or in CI, rich falls back to 80 columns and squeezes a 13-column table until size,
    type and redop come out empty or cut to "…"; so when stdout is not a terminal every column
    is printed whole, right-aligned (``left`` names the exceptions), one line per row, with the
    headers on ``#`` lines as nccl-tests prints them."""

    title: str
    columns: list[tuple[str, str, str]]  # (group, name, unit): group "" for none, unit "" for none
    rows: list[list[str]] = field(default_factory=list)
    left: frozenset[str] = frozenset()  # column names left-aligned in both forms

    def add_row(self, *cells: str) -> None:
        self.rows.append([str(c) for c in cells])

    def rich(self) -> Table:
        t = Table(title=escape(self.title), title_justify="left")
        grouped, last = any(g for g, _, _ in self.columns), None
        for group, name, unit in self.columns:
            head = "\n".join(([group if group != last else ""] if grouped else []) + [name, unit]).rstrip("\n")
            last = group
            t.add_column(escape(head), justify="left" if name in self.left else "right", no_wrap=True)
        for r in self.rows:
            t.add_row(*map(escape, r))
        return t

    def plain(self) -> str:
        """nccl-tests' layout: ``#`` header lines (group, name, unit), then one line per row."""
        groups, last = [], None
        for g, _, _ in self.columns:  # a group's label over its first column only
            groups.append(g if g != last else "")
            last = g
        heads = [groups] if any(groups) else []
        heads.append([n for _, n, _ in self.columns])
        if any(u for _, _, u in self.columns):
            heads.append([u for _, _, u in self.columns])
        widths = [max(len(c) for c in col) for col in zip(*heads, *self.rows, strict=True)]

        def line(cells: list[str], lead: str) -> str:
            out = [c.ljust(w) if self.columns[k][1] in self.left else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True))]
            return (lead + "  ".join(out)).rstrip()

        return "\n".join([f"# {self.title}", *(line(h, "# ") for h in heads), *(line(r, "  ") for r in self.rows)])

    def print(self) -> None:
        if console.is_terminal:
            console.print(self.rich())
        else:
            print(self.plain())


_NCCL_COLUMNS = [("", "size", "(B)"), ("", "count", "(elements)"), ("", "type", ""), ("", "redop", "")]


# ---- flowride synth --sizes ----

def synth_sweep(a: argparse.Namespace, topo, sizes: list[int], epoch, speedups, chosen=None) -> int:
    """``flowride synth`` over a sweep: modelled nccl-tests columns, the bound and the search."""
    from flowride.api import WARM_TAG
    from flowride.sweep import sweep_file_name, synthesize_sweep
    from flowride.synth.options import SynthOptions

    if a.out:
        raise InputError("--out", "names one file, and a sweep makes a schedule per size", "use --out-dir DIR for a sweep")
    opts = SynthOptions(a.method, epoch, a.time_limit, a.mip_gap, a.threads, int(a.memory_limit * 2**30), speedups, a.objective)
    if a.out_dir:  # every file the sweep will write, tried before it runs
        from flowride.files import check_output_tree
        from flowride.sweep import sweep_files

        with as_options(collective="--collective"):
            check_output_tree(a.out_dir, sweep_files(topo, a.collective, sizes, a.chunks), "--out-dir")
    fields = as_options(chunks="--chunks", time_limit="--time-limit", epoch="--epoch", mip_gap="--mip-gap", threads="--threads",
                        size=sweep_option(a), sizes=sweep_option(a), collective="--collective", method="--method",
                        objective="--objective")
    with err.status("[bold]synth[/bold] sweep") as st, fields:
        points = synthesize_sweep(topo, a.collective, sizes, a.chunks, opts, SweepView(st), warm_start=not a.no_warm_start,
                                  calibration=chosen)
    rows = [p.row() for p in points]
    if a.out_dir:
        d = Path(a.out_dir)
        d.mkdir(parents=True, exist_ok=True)
        for p in points:
            p.outcome.schedule.save(d / sweep_file_name(p.outcome.demand.collective, p.size_bytes))
    if a.report:
        from flowride.files import write_json_atomic

        write_json_atomic(a.report, {"topology": topo.name, "gpus": len(topo.gpus), "rows": rows}, indent=1)
    if a.json:
        print(json.dumps(rows))
        return 0
    rep = points[0].outcome.report()
    pred = rep["nccl_predicted"]
    cal = f"; NCCL: predicted by the calibrated model ({pred['calibration']}), and the schedule priced as the runtime runs it " \
        "(runtime) by the same model; error: the model's median error near that size on measured runs" if pred else ""
    t = SweepTable(f"{rep['collective']} on {rep['topology']} ({rep['gpus']} GPUs), all times modelled; epoch: the epoch "
                   f"simulator; sizes rounded to whole float32 elements, chunks per block: {a.chunks}{cal}",
                   _NCCL_COLUMNS + [("epoch", "time", "(us)"), ("epoch", "algbw", "(GB/s)"), ("epoch", "busbw", "(GB/s)"), ("runtime", "time", "(us)"),
                                    ("NCCL", "time", "(us)"), ("NCCL", "algorithm", ""), ("model", "error", ""), ("NCCL", "speedup", ""),
                                    ("synthesis", "bound", "(us)"), ("synthesis", "ratio", ""), ("synthesis", "epochs", ""),
                                    ("synthesis", "chunks", ""), ("synthesis", "method", ""), ("synthesis", "status", "")])
    for r in rows:
        method = str(r["method"]).removesuffix(WARM_TAG) + (" +warm" if r["warm_start_won"] else "")
        t.add_row(r["size"], r["count"], r["type"], r["redop"], _time(r["time_us"]), _f(r["algbw_GBps"], ".2f"),
                  _f(r["busbw_GBps"], ".2f"), _time(r["runtime_us"]) if r["runtime_us"] else "-", _time(r["nccl_us"]) if r["nccl_us"] else "-",
                  r["nccl_best"] or "-", "-" if r["model_error"] is None else f"{100 * r['model_error']:.0f}%",
                  _f(r["speedup_vs_nccl"], ".2f") if r["speedup_vs_nccl"] else "-",
                  _time(r["lower_bound_us"]), _f(r["ratio_to_lower_bound"], ".3f"), r["epochs"],
                  r["chunks"], method, r["status"])
    t.print()
    won = sum(r["warm_start_won"] for r in rows)
    if a.no_warm_start:
        warm = "off"
    elif points[0].outcome.demand.collective.reduces:
        warm = "off (reductions run cold)"
    else:
        warm = f"{won} of {len(rows) - 1} sizes kept the previous size's schedule, retimed (+warm)"
    console.print(f"{len(rows)} sizes in {sum(r['seconds'] for r in rows):.2f} s; warm start: {warm}"
                  + (f"; schedules written to {a.out_dir}" if a.out_dir else ""), soft_wrap=True)
    return 0


# ---- flowride run -b/-e/-f ----

def run_sweep_table(rows: list, collective: str, ranks: int) -> SweepTable:
    """nccl-tests' out-of-place table, flowride's program and torch.distributed's collective side by side."""
    where = f"{rows[0].device}, {rows[0].backend}" if rows else ""
    cpu = "; times measured on CPU" if rows and rows[0].device == "cpu" else ""
    t = SweepTable(f"{collective} on {ranks} ranks ({where}); out of place, median of the repeats{cpu}",
                   _NCCL_COLUMNS + [(who, name, unit) for who in ("flowride", "torch.distributed")
                                    for name, unit in (("time", "(us)"), ("algbw", "(GB/s)"), ("busbw", "(GB/s)"), ("#wrong", ""))])
    for r in rows:
        t.add_row(r.size, r.count, r.type, r.redop, _time(r.time_us), _f(r.algbw_GBps, ".2f"), _f(r.busbw_GBps, ".2f"),
                  r.wrong, _time(r.torch_time_us), _f(r.torch_algbw_GBps, ".2f"), _f(r.torch_busbw_GBps, ".2f"), r.torch_wrong)
    return t


# ---- flowride export --sizes ----

def ranges_table(plan) -> SweepTable:
    """One row per range (the rows ``ranges.md`` holds: :meth:`~flowride.sweep.RangePlan.table_rows`);
    worst loss: the range's schedule at its worst swept size over that size's own."""
    t = SweepTable(f"MSCCL algorithms for {plan.collective} on {plan.topology} ({plan.gpus} GPUs), one per size range "
                   f"(worst loss at most {plan.max_loss:g})", [("", c, "") for c in plan.COLUMNS],
                   left=frozenset({"file", "epochs", "protocol", "swept sizes", "vs NCCL's best"}))
    for row in plan.table_rows():
        t.add_row(*row)
    return t
