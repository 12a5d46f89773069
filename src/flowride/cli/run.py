"""``flowride run``: a schedule (JSON) or an MSCCL algorithm (XML) executed over torch.distributed
on local processes, checked against torch's own collective, with a progress bar and a table."""

from __future__ import annotations

import argparse
import json
import sys

from rich.table import Table

from flowride.argtypes import COUNT, SECONDS, integer, out_file
from flowride.cli.common import as_options, console, err, refuse_unused
from flowride.cli.sweep import run_sweep_table, sweep_args, sweep_of, sweep_option
from flowride.errors import InputError
from flowride.files import write_json_atomic
from flowride.units import format_size, parse_size


def cmd_run(a: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from flowride.comm.launch import CommFailed, run_schedule
    from flowride.program import load_as_program
    from flowride.ranks import launched_as_rank

    if launched_as_rank():  # started by torchrun: this process is one rank (docs/execution.md, "Several nodes")
        return _run_as_rank(a)
    target = load_as_program(a.schedule)
    sizes = sweep_of(a)  # -b/-e/-f or --sizes: every size in one launch, nccl-tests' table
    if sizes is None:
        refuse_unused(a, "with a size sweep (-b/-e/-f or --sizes)", "give a sweep, or leave it out for one size", json="--json")
    size = parse_size(a.size, "--size") if a.size else None
    with Progress(TextColumn("[bold]run[/bold] {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task(f"{target.collective.value} on {target.ngpus} ranks", total=None)

        def on_progress(ev: dict) -> None:
            kind = ev.get("event")
            if kind in ("warmup", "repeat"):
                at = f" at {format_size(ev['size_bytes'])} ({ev['program']}/{ev['programs']})" if ev.get("programs", 1) > 1 else ""
                bar.update(task, total=ev.get("of"), completed=ev.get("i", 0), description=f"{kind} {ev.get('i', 0)}/{ev.get('of')}{at}")
            elif kind in ("spawned", "check"):
                bar.update(task, description=f"{kind}: {target.collective.value} on {target.ngpus} ranks")

        try:
            with as_options(size_bytes="--size" if sizes is None else sweep_option(a), timeout_s="--timeout"):
                kw = {"repeats": a.repeats, "warmup": a.warmup, "timeout_s": a.timeout, "barrier_per_epoch": a.barrier_per_epoch,
                      "progress": on_progress, "mode": a.mode}
                if sizes is not None:
                    from flowride.comm import run_sweep

                    rows = run_sweep(target, sizes, **kw)
                else:
                    res = run_schedule(target, size_bytes=size, **kw)
        except CommFailed as e:
            print(f"error: run failed: {e}", file=sys.stderr)
            if getattr(e, "details", ""):
                err.print(e.details, style="dim", markup=False, highlight=False)
            return 1
    if sizes is not None:
        return _print_sweep(a, target, rows)
    return _print_result(a, res)


def _print_result(a: argparse.Namespace, res) -> int:
    """The report file and table of one run; exit 1 when an output was wrong."""
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


def _run_as_rank(a: argparse.Namespace) -> int:
    """``flowride run`` in a process torchrun started: one rank of the run; rank 0 reports, the
    others print nothing and exit with the run's code."""
    from flowride.clocks import describe
    from flowride.comm.launch import CommFailed
    from flowride.comm.worker import run_as_rank
    from flowride.program import load_as_program

    if sweep_of(a) is not None:
        raise InputError("--sizes", "a sweep (-b/-e/-f or --sizes) runs only under flowride's own launcher", "give one --size under torchrun")
    target = load_as_program(a.schedule)
    size = parse_size(a.size, "--size") if a.size else None
    try:
        with as_options(size_bytes="--size", timeout_s="--timeout"):
            rank, results = run_as_rank([target], size, repeats=a.repeats, warmup=a.warmup, timeout_s=a.timeout,
                                        barrier_per_epoch=a.barrier_per_epoch, mode=a.mode)
    except CommFailed as e:
        print(f"error: run failed: {e}", file=sys.stderr)
        return 1
    if rank != 0:
        return 0 if results[0].ok else 1
    code = _print_result(a, results[0])
    console.print(describe(results[0].clock_offsets), soft_wrap=True)
    return code


def _print_sweep(a: argparse.Namespace, target, rows: list) -> int:
    """nccl-tests' table (or ``--json`` rows); exit 1 when any output was wrong."""
    recs = [r.as_dict() for r in rows]
    if a.report:
        write_json_atomic(a.report, {"collective": target.collective.value, "ranks": target.ngpus, "rows": recs}, indent=1)
    if a.json:
        print(json.dumps(recs))
    else:
        run_sweep_table(rows, target.collective.value, target.ngpus).print()
    bad = [r for r in rows if r.wrong or r.errors]
    for r in bad:
        for e in r.errors[:3]:
            print(f"wrong at {r.size} B: {e}", file=sys.stderr)
    return 1 if bad else 0


def add_run(sub) -> None:
    """``flowride run``."""
    rn = sub.add_parser("run", help="execute a schedule over torch.distributed and check it against torch's collective")
    rn.add_argument("schedule", help="schedule JSON or MSCCL XML")
    rn.add_argument("--size", "-s", help="buffer per rank (default: the schedule's size)")
    rn.add_argument("--repeats", type=COUNT, default=5, help="timed repeats (median reported)")
    rn.add_argument("--warmup", type=integer(0, 10**6, "repeats"), default=1, help="untimed repeats first")
    rn.add_argument("--timeout", type=SECONDS, default=120.0, help="seconds before a silent or hung rank fails the run")
    rn.add_argument("--barrier-per-epoch", action="store_true", help="synchronise all ranks after every epoch (default: point-to-point dependencies only)")
    rn.add_argument("--mode", default="auto", choices=["auto", "dataflow", "ordered", "grouped"], help="how messages are issued (auto: dataflow on gloo, grouped on nccl)")
    rn.add_argument("--report", type=out_file, help="write the report JSON here")
    sweep_args(rn, "run (one launch: ranks start once)")
    rn.set_defaults(func=cmd_run)
