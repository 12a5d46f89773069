"""``flowride export``: a schedule written as an MSCCL algorithm XML."""

from __future__ import annotations

import argparse

from flowride.argtypes import out_file
from flowride.cli.common import console
from flowride.errors import InputError


def cmd_export(a: argparse.Namespace) -> int:
    from flowride.program import lower, write_msccl
    from flowride.schedule import load_schedule

    if not a.msccl:
        raise InputError("--msccl", "no output given", "name the XML file to write, e.g. --msccl algo.xml")
    sched = load_schedule(a.schedule)
    prog = lower(sched)
    write_msccl(prog, a.msccl, unfused=a.unfused, proto=a.proto)
    steps = sum(len(g.steps) for g in prog.gpus)
    kind = "unfused (s/r/rrc/nop)" if a.unfused else "MSCCL"
    console.print(f"{kind} algorithm for {prog.collective.value} on {prog.ngpus} GPUs, {steps} steps, written to {a.msccl}")
    return 0


def add_export(sub) -> None:
    """``flowride export``."""
    ex = sub.add_parser("export", help="write a schedule as an MSCCL algorithm XML")
    ex.add_argument("schedule")
    ex.add_argument("--msccl", type=out_file, help="the XML file to write")
    ex.add_argument("--unfused", action="store_true", help="only s, r, rrc and nop steps (what ASTRA-sim's converter reads)")
    ex.add_argument("--proto", default="Simple", choices=["Simple", "LL128", "LL"], help="MSCCL protocol attribute")
    ex.set_defaults(func=cmd_export)
