"""What warm-starting a size sweep saves: each case synthesized over its sizes cold (every size from
scratch) and warm (each size's search given the previous size's schedule, retimed), in wall time
and in epochs. Times are CPU wall seconds on this machine (the solver is HiGHS on the CPU).

    python benchmarks/sweep_warm.py [--markdown] [--repeats 1]
"""

from __future__ import annotations

import argparse
import platform
import time

from flowride.sweep import synthesize_sweep
from flowride.synth.options import SynthOptions
from flowride.topology.builtins import build_topology
from flowride.units import parse_size_list

# (topology, params, collective, sizes, chunks, seconds per size or None)
CASES = [
    ("dgx1", {}, "allgather", "1KB:1GB:x4", 1, None),
    ("dgx1", {}, "allgather", "1KB:1GB:x4", 2, None),
    ("dgx1", {}, "allgather", "1KB:1GB:x4", 4, None),
    ("dgx1", {}, "alltoall", "1KB:256MB:x4", 1, None),
    ("ndv2", {"chassis": 1}, "allgather", "1KB:1GB:x4", 2, None),
    ("torus", {"rows": 3, "cols": 3}, "allgather", "1KB:1GB:x4", 1, None),
    ("torus", {"rows": 4, "cols": 4}, "allgather", "1KB:1GB:x16", 2, None),
    ("mi250", {}, "allgather", "1KB:1GB:x16", 2, 5.0),
]


def run(case: tuple, warm: bool) -> tuple[float, list[int], int]:
    name, params, coll, spec, chunks, limit = case
    topo = build_topology(name, **params)
    t0 = time.perf_counter()
    pts = synthesize_sweep(topo, coll, parse_size_list(spec), chunks, SynthOptions(time_limit=limit), warm_start=warm)
    return time.perf_counter() - t0, [int(p.outcome.sim.epochs) for p in pts], sum(p.warm_won for p in pts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--repeats", type=int, default=1, help="runs per case and mode; the fastest counts")
    a = ap.parse_args()
    print(f"# CPU: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    if a.markdown:
        print("| case | sizes | cold s | warm s | saved | epochs cold (sum) | epochs warm (sum) | sizes fewer - more epochs | warm kept |")
        print("|---|---|---|---|---|---|---|---|---|")
    for case in CASES:
        cold = min((run(case, False) for _ in range(a.repeats)), key=lambda r: r[0])
        warm = min((run(case, True) for _ in range(a.repeats)), key=lambda r: r[0])
        fewer = sum(w < c for w, c in zip(warm[1], cold[1], strict=True)) - sum(w > c for w, c in zip(warm[1], cold[1], strict=True))
        if case[-1] is None:  # untimed: the warm search has every incumbent the cold one has, and one more
            assert all(w <= c for w, c in zip(warm[1], cold[1], strict=True)), (case, cold[1], warm[1])
        name, params, coll, spec, chunks, limit = case
        label = f"{name}{''.join(f' {k}={v}' for k, v in params.items())} {coll} C={chunks}" + (f", {limit:g} s/size" if limit else "")
        saved = 1 - warm[0] / cold[0] if cold[0] else 0.0
        if a.markdown:
            print(f"| {label} | {spec} ({len(cold[1])}) | {cold[0]:.2f} | {warm[0]:.2f} | {saved:.0%} | {sum(cold[1])} | {sum(warm[1])} "
                  f"| {fewer} | {warm[2]}/{len(warm[1]) - 1} |")
        else:
            print(f"{label:40s} {spec:14s} cold {cold[0]:7.2f} s  warm {warm[0]:7.2f} s  saved {saved:4.0%}  "
                  f"epochs {sum(cold[1])} -> {sum(warm[1])} (sizes fewer - more: {fewer})  warm kept {warm[2]}/{len(warm[1]) - 1}")


if __name__ == "__main__":
    main()
