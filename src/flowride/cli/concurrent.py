"""``flowride synth --concurrent SPEC``: several collectives on shared links, scheduled jointly;
parsed, handed to :func:`flowride.concurrent.synthesize_concurrent`, printed."""

from __future__ import annotations

import argparse
import re
import time

from rich.table import Table

from flowride.cli.common import as_options, console, err, refuse_unused
from flowride.cli.topology import load_topology
from flowride.errors import InputError
from flowride.files import check_output_tree, write_json_atomic
from flowride.units import format_size

DEFAULT_SECONDS = 60.0
_WHEN = "without --concurrent (with it, each collective's kind, group and size are in the SPEC)"
_FIX = "put it in the SPEC, or leave out --concurrent"
# options of one synthesis that the joint one does not take, with the defaults the parser gives them
_DEFAULTED = {"method": ("--method", "auto"), "speedups": ("--speedups", "default"), "objective": ("--objective", "makespan"),
              "memory_limit": ("--memory-limit", 8.0)}


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80] or "c"


def cmd_concurrent(a: argparse.Namespace, epoch) -> int:
    from flowride.concurrent import read_spec, report, synthesize_concurrent

    refuse_unused(a, _WHEN, _FIX, ranks="--ranks", relay="--relay", collective="--collective", size="--size",
                  chunks="--chunks", out="--out", mip_gap="--mip-gap", threads="--threads", minbytes="-b", maxbytes="-e",
                  stepfactor="-f", stepbytes="-i", sizes="--sizes", json="--json", no_warm_start="--no-warm-start")
    for dest, (flag, default) in _DEFAULTED.items():
        if getattr(a, dest, default) != default:
            raise InputError(flag, f"is used only {_WHEN}", "leave it out: every collective is synthesized with --chunks auto")
    topo = load_topology(a)
    items = read_spec(a.concurrent, topo)
    files_of = [_safe(it.name) for it in items]
    if len(set(files_of)) < len(files_of):
        raise InputError("--concurrent", "two names give the same file name (letters, digits, _ . - are kept)",
                         "give the collectives names that differ in those characters")
    if a.out_dir:
        files = [f"{_safe(it.name)}.{ext}" for it in items for ext in ("json", "xml")] + ["report.json"]
        files += [f"mscclpp/{_safe(it.name)}.json" for it in items]
        check_output_tree(a.out_dir, files, "--out-dir", dirs=("mscclpp",))
    seconds = DEFAULT_SECONDS if a.time_limit is None else a.time_limit
    t0 = time.perf_counter()
    with err.status("[bold]synth --concurrent[/bold] each collective alone") as st, as_options(epoch="--epoch"):
        def progress(ev: dict) -> None:
            if ev.get("stage") == "concurrent":
                what = {"alone": "alone (whole links)", "equal": "on even shares", "load": "on shares by load",
                        "spines apart": "on spines of its own"}[ev["phase"]]
                st.update(f"[bold]synth --concurrent[/bold] {ev['name']} {what} ({ev['i']}/{ev['of']} distinct)  "
                          f"[{time.perf_counter() - t0:.0f}s]")
        out = synthesize_concurrent(topo, items, seconds, epoch, progress)
    rep = report(out)
    if a.out_dir:
        rep["exports"] = _export(out, a.out_dir)
        write_json_atomic(f"{a.out_dir}/report.json", rep, indent=1)
    if a.report:
        write_json_atomic(a.report, rep, indent=1)
    console.print(_table(rep))
    console.print(f"joint last finish {rep['joint']['last_finish_us']:.1f} us ({rep['joint']['how']}): "
                  f"{rep['ratio_to_joint_bound']:.3f}x the joint bound ({rep['joint_bound_kind']}"
                  + (f": {rep['joint_bound_cut']}" if rep["joint_bound_kind"].startswith("cut") else "") + "); "
                  f"{rep['speedup_vs_independent']:.2f}x flowride's independent schedules run together, "
                  f"{rep['speedup_vs_nccl_epoch_model']:.2f}x NCCL's ({rep['speedup_vs_independent_as_routed']:.2f}x and "
                  f"{rep['speedup_vs_nccl_as_routed']:.2f}x with every flow on the links it chose alone); all in the epoch model",
                  soft_wrap=True)
    cal = rep.get("calibrated")
    if cal:
        e = cal["model_error"]
        console.print(f"calibrated model ({cal['calibration']}; model error {'unknown' if e is None else f'{100 * e:.0f}%'}): "
                      f"NCCL together {cal['nccl_together_us']:.1f} us, joint {cal['joint_us']:.1f} us as the runtime runs it: "
                      f"{cal['speedup_vs_nccl']:.2f}x NCCL's (each alone by that model, stretched by the epoch model's "
                      "contention); all modelled", soft_wrap=True)
    use = rep["joint"]["link_use"]
    how = rep["joint"]["how"]
    where = ("on its share of every shared link" if how in ("equal", "load", "spines apart") else
             "on whole links, never two on a shared link at once" + (" (held back in turn)" if how.startswith("in turn") else ""))
    console.print(f"verified: every collective {where}; busiest link {use['busiest_link']} busy "
                  f"{use['busiest_link_busy']:.0%} of the joint run; peak windowed use {use['peak_window_use']:.3f} of capacity")
    for note in rep["notes"]:
        err.print(f"[yellow]note: {note}[/yellow]")
    if a.out_dir:
        console.print(f"schedules, MSCCL XML, MSCCL++ plans (mscclpp/) and report written to {a.out_dir}")
    return 0


def _export(out, out_dir: str) -> dict:
    """Each collective's schedule JSON, MSCCL XML and MSCCL++ execution plan (in mscclpp/; one that
    cannot be lowered or written says why)."""
    from pathlib import Path

    from flowride.program import lower, write_msccl, write_mscclpp

    done = {}
    for it, s in zip(out.items, out.best.solved, strict=True):
        base = f"{out_dir}/{_safe(it.name)}"
        s.schedule.save(f"{base}.json")
        row: dict = {"schedule": f"{base}.json", "msccl": None, "mscclpp": None}
        try:
            prog = lower(s.schedule)
            write_msccl(prog, f"{base}.xml")
            row["msccl"] = f"{base}.xml"
            row["mscclpp"] = str(write_mscclpp(prog, s.schedule.topology, Path(out_dir) / "mscclpp" / f"{_safe(it.name)}.json",
                                               name=f"flowride {it.collective.value} {it.name}"))
        except InputError as e:
            row["why"] = str(e)
        done[it.name] = row
    return done


def _table(rep: dict) -> Table:
    t = Table(title=f"{len(rep['collectives'])} collectives at once on {rep['topology']} ({rep['gpus']} GPUs); finish times in us "
                    "from the first start")
    for col, just in (("collective", "left"), ("group", "left"), ("start", "right"), ("joint", "right"), ("alone", "right"),
                      ("own bound", "right"), ("independent together", "right"), ("NCCL alone", "right"),
                      ("NCCL together", "right"), ("chunks", "right")):
        t.add_column(col, justify=just)
    for c in rep["collectives"]:
        t.add_row(f"{c['name']}: {c['collective']} {format_size(c['size_bytes'])}", f"{c['ranks']}"[:40], f"{c['start_us']:.1f}",
                  f"{c['finish_us']:.1f}", f"{c['alone_us']:.1f}", f"{c['own_bound_us']:.1f}", f"{c['independent_together_us']:.1f}",
                  f"{c['nccl_alone_us']:.1f} ({c['nccl_algorithm']})", f"{c['nccl_together_us']:.1f}", str(c["chunks"]))
    t.add_row("last finish", "", "", f"{rep['joint']['last_finish_us']:.1f}", "", f"{rep['joint_bound_us']:.1f} (joint)",
              f"{rep['independent_together_us']:.1f}", "", f"{rep['nccl_together_us']:.1f}", "")
    return t
