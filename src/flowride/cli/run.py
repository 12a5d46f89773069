"""``flowride run``: a schedule (JSON) or an MSCCL algorithm (XML) executed over torch.distributed
on local processes, checked against torch's own collective, with a progress bar and a table."""

from __future__ import annotations

import argparse
import sys

from rich.table import Table

from flowride.argtypes import COUNT, SECONDS, integer, out_file
from flowride.cli.common import as_options, console, err
from flowride.files import write_json_atomic
from flowride.units import format_size, parse_size


def cmd_run(a: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from flowride.comm.launch import CommFailed, run_schedule
    from flowride.program import load_as_program

    target = load_as_program(a.schedule)
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
            with as_options(size_bytes="--size", timeout_s="--timeout"):
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
    rn.set_defaults(func=cmd_run)
