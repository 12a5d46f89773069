"""``flowride export``: a schedule written as an MSCCL algorithm XML, or, with a topology and a
size sweep, MSCCL algorithms per message-size range (synthesized, picked and checked by
:func:`flowride.sweep.export_ranges`), or with ``--nccl-tuner FILE`` the CSV NCCL's example tuner
plugin reads (:func:`flowride.sweep.export_nccl_tuner`, docs/nccl_tuner.md)."""

from __future__ import annotations

import argparse

from flowride.argtypes import SECONDS, number, out_dir, out_file
from flowride.cli.common import (
    as_options,
    calibration_args,
    console,
    err,
    refuse_unused,
    topology_args,
)
from flowride.cli.sweep import SweepView, ranges_table, sweep_args, sweep_of
from flowride.errors import InputError
from flowride.program.mscclpp_plan import MAX_U64
from flowride.sizes import DEFAULT_MAX_LOSS
from flowride.units import parse_size

TUNER_SIZES = "1K:1G:x2"  # the default sweep of --nccl-tuner: 1 KiB to 1 GiB, doubling (21 sizes)
RANGE_DEFAULTS = {"collective": "allgather", "chunk_options": "1,2,4", "epochs": "fast", "method": "auto"}


def cmd_export(a: argparse.Namespace) -> int:
    from flowride.program import lower, write_msccl, write_mscclpp
    from flowride.schedule import load_schedule

    sizes = sweep_of(a)
    if a.nccl_tuner:
        return _export_tuner(a, sizes)
    refuse_unused(a, "with --nccl-tuner", "leave it out, or add --nccl-tuner FILE", gaps="--gaps",
                  calibration="--calibration", network_kind="--network-kind")
    if a.topology or sizes is not None or a.out_dir:
        return _export_ranges(a, sizes)
    if not a.schedule:
        raise InputError("schedule", "no schedule given", "name a schedule JSON, or give --topology, --collective, --sizes and --out-dir")
    if not (a.msccl or a.mscclpp):
        raise InputError("--msccl/--mscclpp", "no output given", "name the MSCCL XML file to write (--msccl algo.xml) or the "
                         "folder for an MSCCL++ execution plan (--mscclpp plans/), or both")
    refuse_unused(a, "in a range export (--topology, --sizes, --out-dir)", "leave it out to export one schedule",
                  collective="--collective", chunk_options="--chunk-options", epochs="--epochs", method="--method",
                  time_limit="--time-limit", max_loss="--max-loss", clean="--clean", json="--json")
    if a.mscclpp and a.unfused and not a.msccl:
        raise InputError("--unfused", "applies to MSCCL XML only", "leave it out, or add --msccl FILE")
    sched = load_schedule(a.schedule)
    prog = lower(sched)
    steps = sum(len(g.steps) for g in prog.gpus)
    if a.plan_sizes is not None and not a.mscclpp:
        raise InputError("--plan-sizes", "applies to an MSCCL++ plan", "add --mscclpp DIR, or leave it out")
    if a.mscclpp:  # built and checked before anything is written
        from pathlib import Path

        lo, hi = _plan_sizes(a.plan_sizes, sched.demand.size_bytes)
        with as_options(proto="--proto", mscclpp="--mscclpp", min_bytes="--plan-sizes"):
            path = write_mscclpp(prog, sched.topology, Path(a.mscclpp) / f"{Path(a.schedule).stem}.mscclpp-plan.json",
                                 proto=a.proto or "Simple", name=f"flowride {prog.collective.value} {sched.topology.name}",
                                 min_bytes=lo, max_bytes=hi)
        said = "the size it was synthesized for" if a.plan_sizes is None else "--plan-sizes"
        console.print(f"MSCCL++ execution plan for {prog.collective.value} on {prog.ngpus} GPUs ({a.proto or 'Simple'}), "
                      f"for messages of {lo:,}..{hi:,} bytes ({said}; MSCCL++ picks it only there), written to {path}",
                      soft_wrap=True)
    if a.msccl:
        write_msccl(prog, a.msccl, unfused=a.unfused, proto=a.proto or "Simple")
        kind = "unfused (s/r/rrc/nop)" if a.unfused else "MSCCL"
        console.print(f"{kind} algorithm for {prog.collective.value} on {prog.ngpus} GPUs, {steps} steps, written to {a.msccl}")
    return 0


def _plan_sizes(text: str | None, synthesized: int) -> tuple[int, int]:
    """``--plan-sizes MIN:MAX`` (sizes as ``--size`` takes them; ``max`` for no upper limit), or
    the one size the schedule was synthesized for."""
    if text is None:
        return synthesized, synthesized
    lo_t, sep, hi_t = text.partition(":")
    if not sep:
        raise InputError("--plan-sizes", f"{text!r} is not MIN:MAX", "write e.g. 1MiB:64MiB, or 0:max for every size")
    lo = parse_size(lo_t, "--plan-sizes") if lo_t.strip() not in ("", "0") else 0
    hi = None if hi_t.strip() == "max" else parse_size(hi_t, "--plan-sizes")
    if hi is not None and hi < lo:
        raise InputError("--plan-sizes", f"{text!r}: the maximum is below the minimum", "write MIN:MAX with MIN <= MAX")
    return lo, (hi if hi is not None else MAX_U64)


def _ints(text: str, field: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(field, f"{text!r} is not a comma list of whole numbers", "write e.g. 1,2,4") from None
    if not vals or any(v < 1 or v > 64 for v in vals):
        raise InputError(field, f"{text!r} has no value or one outside 1..64", "write e.g. 1,2,4")
    return vals


def _export_ranges(a: argparse.Namespace, sizes: list[int] | None) -> int:
    """``flowride export --topology T --collective C --sizes ... --out-dir DIR``."""
    from flowride.cli.topology import load_topology
    from flowride.sweep import export_ranges
    from flowride.synth.options import SynthOptions

    if a.schedule:
        raise InputError("schedule", "is given together with a range export", "give either a schedule (with --msccl) or "
                         "--topology/--sizes/--out-dir")
    for flag, v, fix in (("--topology", a.topology, "name the topology, e.g. -t dgx1"),
                         ("--sizes", sizes, "give the sizes, e.g. --sizes 1KB:1GB:x2 or -b 1K -e 1G -f 2"),
                         ("--out-dir", a.out_dir, "name the directory to write, e.g. --out-dir algos/")):
        if v is None:
            raise InputError(flag, "is missing for a range export", fix)
    if a.msccl:
        raise InputError("--msccl", "names one file, and a range export writes one per range", "use --out-dir only")
    refuse_unused(a, "with synth and run sweeps", "read OUT/ranges.json: a range export writes its rows there", json="--json")
    refuse_unused(a, "in a range export: each range's plan carries its own sizes", "leave it out", plan_sizes="--plan-sizes")
    for k, v in RANGE_DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    chunks = _ints(a.chunk_options, "--chunk-options")
    epochs = tuple(e.strip() for e in a.epochs.split(",") if e.strip())  # checked by the library (an empty list too)
    topo = load_topology(a)
    opts = SynthOptions(method=a.method, time_limit=a.time_limit)
    names = {"chunks": "--chunk-options", "epochs": "--epochs", "proto": "--proto", "out_dir": "--out-dir", "time_limit": "--time-limit",
             "method": "--method", "collective": "--collective", "size": "--sizes", "sizes": "--sizes", "relay": "--relay",
             "max_loss": "--max-loss"}
    with err.status("[bold]export[/bold] sweeping sizes") as st, as_options(**names):
        plan = export_ranges(topo, a.collective, sizes, a.out_dir, chunks, epochs, opts, a.proto or "auto", a.unfused, SweepView(st),
                             max_loss=DEFAULT_MAX_LOSS if a.max_loss is None else a.max_loss, clean=a.clean, mscclpp_dir=a.mscclpp)
    ranges_table(plan).print()
    wrote = sum(bool(r.mscclpp) for r in plan.ranges)
    pp = (f" {wrote} MSCCL++ execution plan(s) in {a.mscclpp} (LL ranges LL, the others Simple)"
          + (f"; {len(plan.ranges) - wrote} range(s) without one, over the MSCCL++ executor's limits (ranges.json: "
             "mscclpp_refused; MSCCL++ falls back to NCCL there)." if wrote < len(plan.ranges) else ".") if a.mscclpp else "")
    console.print(f"written to {a.out_dir}: {len(plan.ranges)} XML file(s) under xml/ (point MSCCL_ALGO_DIR there), ranges.json, "
                  f"ranges.md. Protocol: not chosen by the model; {plan.protocol_rule}.{pp}", soft_wrap=True)
    return 0


def _export_tuner(a: argparse.Namespace, sizes: list[int] | None) -> int:
    """``flowride export --nccl-tuner FILE --topology T [--collective C,...] [--sizes ...] [--calibration SPEC]``."""
    from flowride.cli.sweep import SweepTable
    from flowride.cli.topology import load_topology
    from flowride.sweep import export_nccl_tuner, side_table_path, tuner_collectives
    from flowride.units import sweep_sizes

    if a.msccl:
        raise InputError("--msccl", "is given together with --nccl-tuner", "export one at a time: an MSCCL XML or a tuner CSV")
    if a.schedule:
        raise InputError("schedule", "is given together with --nccl-tuner", "leave the schedule out: the tuner export models "
                         "NCCL's algorithms on --topology")
    if not a.topology:
        raise InputError("--topology", "is missing for --nccl-tuner", "name the topology, e.g. -t dgx1 or -t fabric --node "
                         "dgx-h100 --nodes 2")
    refuse_unused(a, "in an MSCCL export", "leave it out with --nccl-tuner", out_dir="--out-dir", chunk_options="--chunk-options",
                  epochs="--epochs", method="--method", time_limit="--time-limit", max_loss="--max-loss", clean="--clean",
                  proto="--proto", unfused="--unfused", json="--json", mscclpp="--mscclpp", plan_sizes="--plan-sizes")
    with as_options(collective="--collective"):
        colls = tuner_collectives(a.collective)
    sizes = sizes if sizes is not None else sweep_sizes(sizes=TUNER_SIZES)
    topo = load_topology(a)
    names = {"collective": "--collective", "sizes": "--sizes", "nccl_tuner": "--nccl-tuner", "calibration": "--calibration",
             "network_kind": "--network-kind"}
    with err.status("[bold]export[/bold] NCCL's model, calibrated") as st, as_options(**names):
        plan = export_nccl_tuner(topo, colls, sizes, a.nccl_tuner, SweepView(st), every_range=not a.gaps,
                                 calibration=a.calibration, network=a.network_kind)
    t = SweepTable(f"NCCL tuner overrides for {plan.topology} ({plan.gpus} ranks, {plan.nodes} node(s)): flowride's pick vs "
                   f"NCCL's default per size range; times: NCCL's model calibrated ({plan.calibration}), us; a row only where "
                   "the gain beats the model's error at that size", [("", c, "") for c in plan.COLUMNS[:-1]],
                   left=frozenset({"collective", "swept sizes", "flowride's pick", "NCCL's default", "row"}))
    for row in plan.table_rows():
        t.add_row(*row[:-1])
    t.print()
    per = ", ".join(f"{c} {plan.disagreements(c)}/{len(plan.sizes)}" for c in plan.collectives)
    won = ", ".join(f"{c} {plan.written_sizes(c)}" for c in plan.collectives)
    console.print(f"{len(plan.rows)} row(s) written to {a.nccl_tuner} (point NCCL_TUNER_CONFIG_FILE there, with "
                  f"NCCL_TUNER_PLUGIN naming the example plugin); why each range: {side_table_path(a.nccl_tuner)}. "
                  f"Calibration: {plan.calibration}. Sizes where the picks differ: {per}; of them with a gain above the "
                  f"model's error (overrides): {won}; "
                  + ("every other size range has NCCL's own pick written out, so no call falls to the plugin's one-channel "
                     "default." if plan.every_range else "the other ranges have no row."), soft_wrap=True)
    if not plan.every_range:
        err.print("[yellow]warning: --gaps: the stock example plugin runs every call no row matches on ONE channel "
                  "(pluginGetCollInfo sets *nChannels = 1); patch it to 0 before building, or export without --gaps[/yellow]",
                  soft_wrap=True)
    untuned = [c for c in ("broadcast", "reduce", "allgather", "reducescatter", "allreduce") if c not in plan.collectives]
    if untuned:
        err.print(f"note: the file has no row for {', '.join(untuned)}: with the stock plugin those calls run on one channel",
                  soft_wrap=True)
    if all(s.error is None for r in plan.ranges for s in r.sizes):
        console.print("note: no measured curve near these sizes is behind this calibration, so the model's error is unknown and no "
                      "override is written; give --calibration FILE (a profile from `flowride calibrate`) or a fabric of a node type "
                      "(-t fabric --node ...)", soft_wrap=True)
    return 0


def add_export(sub) -> None:
    """``flowride export``."""
    ex = sub.add_parser("export", help="write a schedule as an MSCCL algorithm XML, or MSCCL algorithms per size range")
    ex.add_argument("schedule", nargs="?", help="the schedule JSON (single export, with --msccl)")
    ex.add_argument("--msccl", type=out_file, help="the XML file to write")
    ex.add_argument("--mscclpp", type=out_dir, metavar="DIR",
                    help="write the schedule (or, in a range export, each range) as an MSCCL++ execution plan JSON in DIR "
                         "(--proto Simple or LL; a range keeps LL, others Simple; docs/mscclpp.md)")
    ex.add_argument("--nccl-tuner", type=out_file, metavar="FILE",
                    help="write the CSV NCCL's example tuner plugin reads (NCCL_TUNER_CONFIG_FILE): per collective and size "
                         "range, the algorithm/protocol NCCL's cost model calibrated to measured curves prefers where NCCL's "
                         "own model picks otherwise, by more than the model's error there; needs --topology; sizes from "
                         f"-b/-e/-f or --sizes (default {TUNER_SIZES}); the side table goes to FILE.md (docs/nccl_tuner.md)")
    calibration_args(ex)  # --nccl-tuner only (refused elsewhere)
    ex.add_argument("--gaps", action="store_true", default=None,
                    help="--nccl-tuner: write rows only where flowride overrides NCCL, leaving the other ranges to NCCL (the "
                         "stock example plugin runs every call no row matches on ONE channel: patch it first; docs/nccl_tuner.md). "
                         "Default: a row for every size range, NCCL's own pick where flowride has none")
    ex.add_argument("--plan-sizes", metavar="MIN:MAX", help="--mscclpp of one schedule: the message sizes MSCCL++ may pick the "
                    "plan for, e.g. 1MiB:64MiB or 0:max (default: the size the schedule was synthesized for)")
    ex.add_argument("--unfused", action="store_true", help="only s, r, rrc and nop steps (what ASTRA-sim's converter reads)")
    ex.add_argument("--proto", choices=["Simple", "LL128", "LL"], help="MSCCL protocol attribute (default: Simple; range export: "
                    "chosen per size by NCCL's cost model)")
    r = ex.add_argument_group("range export: synthesize across sizes, one XML per size range")
    topology_args(r, required=False)
    r.add_argument("--collective", "-c", help="allgather (default), alltoall, reducescatter or allreduce; --nccl-tuner: a comma "
                   "list (default allgather,reducescatter,allreduce)")
    r.add_argument("--out-dir", type=out_dir, help="write xml/*.xml, ranges.json and ranges.md here")
    r.add_argument("--chunk-options", help="chunks per block to choose from at each size (default 1,2,4)")
    r.add_argument("--epochs", help="epoch presets to choose from: fast, slow or fast,slow (default fast)")
    r.add_argument("--method", help="synthesis method (see flowride synth; default auto)")
    r.add_argument("--time-limit", type=SECONDS, help="seconds per synthesis (per size and candidate)")
    r.add_argument("--max-loss", type=number(1, 100, what="a ratio"),
                   help=f"split a range where its one schedule would run more than this many times slower (modelled) at a swept "
                        f"size than that size's own schedule (default {DEFAULT_MAX_LOSS})")
    r.add_argument("--clean", action="store_true", help="remove the *.xml files already in OUT/xml/ (and ranges.json/md) before "
                   "writing; without it an OUT/xml/ holding files is refused, since MSCCL would load old and new ranges")
    sweep_args(ex, "synthesize every candidate")
    ex.set_defaults(func=cmd_export)
