"""``flowride export``: a schedule written as an MSCCL algorithm XML, or, with a topology and a
size sweep, MSCCL algorithms per message-size range (synthesized, picked and checked by
:func:`flowride.sweep.export_ranges`)."""

from __future__ import annotations

import argparse

from flowride.argtypes import SECONDS, number, out_dir, out_file
from flowride.cli.common import as_options, console, err, refuse_unused, topology_args
from flowride.cli.sweep import SweepView, ranges_table, sweep_args, sweep_of
from flowride.errors import InputError
from flowride.sizes import DEFAULT_MAX_LOSS

RANGE_DEFAULTS = {"collective": "allgather", "chunk_options": "1,2,4", "epochs": "fast", "method": "auto"}


def cmd_export(a: argparse.Namespace) -> int:
    from flowride.program import lower, write_msccl
    from flowride.schedule import load_schedule

    sizes = sweep_of(a)
    if a.topology or sizes is not None or a.out_dir:
        return _export_ranges(a, sizes)
    if not a.schedule:
        raise InputError("schedule", "no schedule given", "name a schedule JSON, or give --topology, --collective, --sizes and --out-dir")
    if not a.msccl:
        raise InputError("--msccl", "no output given", "name the XML file to write, e.g. --msccl algo.xml")
    refuse_unused(a, "in a range export (--topology, --sizes, --out-dir)", "leave it out to export one schedule",
                  collective="--collective", chunk_options="--chunk-options", epochs="--epochs", method="--method",
                  time_limit="--time-limit", max_loss="--max-loss", clean="--clean", json="--json")
    sched = load_schedule(a.schedule)
    prog = lower(sched)
    write_msccl(prog, a.msccl, unfused=a.unfused, proto=a.proto or "Simple")
    steps = sum(len(g.steps) for g in prog.gpus)
    kind = "unfused (s/r/rrc/nop)" if a.unfused else "MSCCL"
    console.print(f"{kind} algorithm for {prog.collective.value} on {prog.ngpus} GPUs, {steps} steps, written to {a.msccl}")
    return 0


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
                             max_loss=DEFAULT_MAX_LOSS if a.max_loss is None else a.max_loss, clean=a.clean)
    ranges_table(plan).print()
    console.print(f"written to {a.out_dir}: {len(plan.ranges)} XML file(s) under xml/ (point MSCCL_ALGO_DIR there), ranges.json, "
                  f"ranges.md. Protocol: not chosen by the model; {plan.protocol_rule}.", soft_wrap=True)
    return 0


def add_export(sub) -> None:
    """``flowride export``."""
    ex = sub.add_parser("export", help="write a schedule as an MSCCL algorithm XML, or MSCCL algorithms per size range")
    ex.add_argument("schedule", nargs="?", help="the schedule JSON (single export, with --msccl)")
    ex.add_argument("--msccl", type=out_file, help="the XML file to write")
    ex.add_argument("--unfused", action="store_true", help="only s, r, rrc and nop steps (what ASTRA-sim's converter reads)")
    ex.add_argument("--proto", choices=["Simple", "LL128", "LL"], help="MSCCL protocol attribute (default: Simple; range export: "
                    "chosen per size by NCCL's cost model)")
    r = ex.add_argument_group("range export: synthesize across sizes, one XML per size range")
    topology_args(r, required=False)
    r.add_argument("--collective", "-c", help="allgather (default), alltoall, reducescatter or allreduce")
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
