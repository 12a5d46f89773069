"""Synthesized schedules executed with torch.distributed, against torch.distributed's own collectives.

For each rank count (one process per GPU of a ``switch`` topology, or ``--topology ring``; a case
whose synthesized schedule fails verification is measured on ``--fallback`` instead and flagged), each
collective and each size, synthesizes a schedule ("fast" epochs), runs it on local processes and
reports our median time, torch's median time on the same data, their ratio and whether every
rank's output was right. On a CPU this is gloo over loopback: it measures the executor's overhead
(the target is within 2x of torch), not a speed-up, since loopback has no topology to exploit.
Every schedule of one rank count runs in one launch, so process start-up is paid once.

    python benchmarks/comm.py [--ranks 4,8] [--sizes 1KB,1MB,64MB] [--collectives allgather,alltoall,reducescatter,allreduce]
                              [--repeats 5] [--warmup 1] [--chunks 1] [--topology switch] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch

from flowride.api import synthesize
from flowride.collectives.demand import Collective
from flowride.comm import run_schedules
from flowride.schedule.reduce import allreduce_from_allgather, reduce_scatter_from_allgather
from flowride.schedule.simulate import simulate
from flowride.topology.builtins import build_topology
from flowride.units import format_size, parse_size


def schedule_for(topo, coll: Collective, size: int, chunks: int):
    if coll in (Collective.ALLGATHER, Collective.ALLTOALL):
        return synthesize(topo, coll, size, "fast", chunks=chunks, time_limit=60).schedule
    rev = synthesize(topo.reversed(), Collective.ALLGATHER, size, "fast", chunks=chunks, time_limit=60).schedule
    if coll is Collective.REDUCESCATTER:
        return reduce_scatter_from_allgather(rev, topo)
    fwd = synthesize(topo, Collective.ALLGATHER, size, "fast", chunks=chunks, time_limit=60).schedule
    return allreduce_from_allgather(rev, fwd, topo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="4,8")
    ap.add_argument("--sizes", default="1KB,1MB,64MB", help="per-rank sizes (decimal KB/MB as in TE-CCL, or KiB/MiB)")
    ap.add_argument("--collectives", default="allgather,alltoall,reducescatter,allreduce")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--topology", default="switch", choices=("switch", "ring"))
    ap.add_argument("--fallback", default="ring", help="topology for cases whose schedule fails verification ('' to fail)")
    ap.add_argument("--mode", default="auto", choices=("auto", "dataflow", "ordered", "grouped"))
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per rank count")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    ranks = [int(x) for x in a.ranks.split(",")]
    sizes = [parse_size(x) for x in a.sizes.split(",")]
    colls = [Collective.parse(x) for x in a.collectives.split(",")]
    rows = []
    notes = []
    for n in ranks:
        topo = build_topology(a.topology, n=n)
        cases = [(c, s) for c in colls for s in sizes]
        scheds, tnames = [], []
        for c, s in cases:
            sched, tname = schedule_for(topo, c, s, a.chunks), f"{a.topology} n={n}"
            sim = simulate(sched)
            if not sim.valid and a.fallback:
                # a synthesis bug is reported, and the row still measured on the fallback topology
                notes.append(f"{a.topology} n={n} {c.value} {format_size(s)}: the synthesized schedule fails verification "
                             f"({sim.first_violation}); measured on {a.fallback} n={n} instead")
                sched, tname = schedule_for(build_topology(a.fallback, n=n), c, s, a.chunks), f"{a.fallback} n={n} *"
            scheds.append(sched)
            tnames.append(tname)
        t0 = time.monotonic()

        def show(ev: dict, n: int = n) -> None:
            if ev["event"] == "check":
                print(f"  {n} ranks: {ev['collective']} {format_size(ev['size_bytes'])} ({ev['program']}/{ev['programs']})",
                      file=sys.stderr, flush=True)

        results = run_schedules(scheds, [s for _, s in cases], repeats=a.repeats, warmup=a.warmup, timeout_s=a.timeout,
                                progress=show, mode=a.mode)
        print(f"{n} ranks done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        for (c, s), tname, r in zip(cases, tnames, results, strict=True):
            rows.append((n, tname, c.value, s, r))
    device = "CPU" if not torch.cuda.is_available() else "CUDA"
    backend = rows[0][4].backend if rows else "?"
    title = (f"{device} / {backend} / loopback: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
             f"{a.chunks} chunk(s) per block, median of {a.repeats} repeats after {a.warmup} warm-up, "
             f"slowest rank per repeat")
    header = ["ranks", "topology", "collective", "size", "ours ms", "torch ms", "ours/torch", "ours GB/s", "torch GB/s", "correct", "torch call"]
    table = []
    for n, tname, coll, size, r in rows:
        rep = r.report()
        table.append([str(n), tname, coll, format_size(size), f"{rep['ours_median_s'] * 1e3:.3f}", f"{rep['torch_median_s'] * 1e3:.3f}",
                      f"{rep['ratio']:.2f}", f"{rep['algbw_GBps']:.3g}", f"{rep['torch_algbw_GBps']:.3g}",
                      "yes" if r.ok else "NO: " + r.errors[0], r.reference])
    if a.markdown:
        print(f"\n{title}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in table:
            print("| " + " | ".join(row) + " |")
        for note in notes:
            print(f"\n\\* {note}")
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in header:
            t.add_column(h)
        for row in table:
            t.add_row(*row)
        Console().print(t)
        for note in notes:
            Console().print(f"* {note}")
    if any(not r.ok for *_, r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
