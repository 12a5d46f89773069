"""Synthesis against the published TE-CCL results (NDv2, 2 chassis, TE-CCL compat variant).

Prints, per case: our epochs and finish time beside the published ones, their ratio, our solver
time beside the published Gurobi time, and the lower bound. Default: the cases issue #2 targets
(AllGather slow 1MB/16MB/1GB, fast 1GB). ``--all`` runs every AllGather row of the reference file.

    python benchmarks/synth.py [--all] [--time-limit 600] [--markdown]
"""

from __future__ import annotations

import argparse
import csv
import platform
import statistics
import time
from pathlib import Path

from flowride.api import synthesize
from flowride.topology import ndv2
from flowride.units import parse_size

REF = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "teccl_published_ndv2_2chassis.csv"
TARGETS = {("Slow", "1MB"), ("Slow", "16MB"), ("Slow", "1GB"), ("Fast", "1GB")}


def load_reference(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every AllGather Fast/Slow row, not only the targets")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds per case")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--reference", type=Path, default=REF)
    a = ap.parse_args()

    rows = [
        r for r in load_reference(a.reference)
        if r["collective"] == "AllGather" and r["variant"] in ("Fast", "Slow") and (a.all or (r["variant"], r["size"]) in TARGETS)
    ]
    topo = ndv2(2, teccl_compat=True)
    header = ["size", "preset", "epochs", "pub epochs", "finish us", "pub finish us", "finish ratio",
              "solver s", "pub solver s", "solver ratio", "bound us", "status"]
    out = []
    for r in rows:
        size = parse_size(r["size"])
        t0 = time.perf_counter()
        o = synthesize(topo, "allgather", size, r["variant"].lower(), time_limit=a.time_limit)
        wall = time.perf_counter() - t0
        rep = o.report()
        pub_fin = float(r["collective_finish_time_us"])
        pub_solver = float(r["solver_time_s"])
        out.append([
            r["size"], r["variant"].lower(), rep["epochs"], int(r["epochs_required"]), rep["finish_time_us"], pub_fin,
            rep["finish_time_us"] / pub_fin, wall, pub_solver, wall / pub_solver, rep["lower_bound_us"],
            rep["status"] + ("" if rep["verified"] else " UNVERIFIED"),
        ])
        print(*(f"{v:.4g}" if isinstance(v, float) else v for v in out[-1]), sep="\t", flush=True)
    if a.markdown:
        print()
        print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}, "
              f"CPU only; solver HiGHS via highspy; our solver time is wall time of the whole search")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in out:
            print("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
        ratios = [row[9] for row in out]
        print(f"\nmedian solver-time ratio (ours / published): {statistics.median(ratios):.3g}; "
              f"finish ratio max: {max(row[6] for row in out):.4g}")


if __name__ == "__main__":
    main()
