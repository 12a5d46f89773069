"""Calibrating the noisy neighbour: the jitter of training's iterations at a few duty cycles.

For each duty (0: quiet, no neighbour), trains one preset (p = 2, pinned to cores 0 and 1, as
benchmarks/guard.py does) beside a flowride.neighbour.Neighbour busy that fraction of every
``--period-ms`` on ``--cores`` floating processes, and prints the measured iterations' median,
slowdown against the quiet run, coefficient of variation and ±% band = (p90 - p10) / 2 / median.
The duty whose band is nearest ``--target-pct`` is the one to pass as ``--noise`` to
benchmarks/guard.py and benchmarks/harvest.py to reproduce a node that noisy.

    python benchmarks/noise_calibrate.py [--duties 0,0.3,0.5,0.7] [--period-ms 100] [--cores 1]
        [--model small] [--iters 10] [--target-pct 20] [--run-dir DIR] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from flowride.argtypes import out_dir
from flowride.neighbour import DEFAULT_PERIOD_MS, Neighbour, iteration_jitter
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duties", default="0,0.3,0.5,0.7", help="duty cycles to try, each in [0, 1] (0: quiet)")
    ap.add_argument("--period-ms", type=float, default=DEFAULT_PERIOD_MS)
    ap.add_argument("--cores", type=int, default=1, help="neighbour processes")
    ap.add_argument("--jitter", type=float, default=0.0, help="each period's duty drawn from duty ± this")
    ap.add_argument("--model", default="small")
    ap.add_argument("--engine", default="builtin")
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10, help="measured iterations per duty (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--target-pct", type=float, default=20.0, help="the ±% band to pick a duty for")
    ap.add_argument("--run-dir", type=out_dir, help="a fresh (absent or empty) directory for the runs' files (default: a temporary one)")
    ap.add_argument("--json", help="also write every row to this JSON file")
    a = ap.parse_args()
    if a.run_dir and Path(a.run_dir).exists() and any(Path(a.run_dir).iterdir()):
        ap.error(f"argument --run-dir: {a.run_dir} is not empty: give a fresh directory, so runs do not mix with old files")
    try:
        duties = [float(d) for d in a.duties.split(",") if d.strip()]
        neighbours = [None if d == 0 else Neighbour(d, a.period_ms / 1e3, a.cores, seed=i, jitter=a.jitter)
                      for i, d in enumerate(duties)]
    except ValueError as e:  # InputError is one
        ap.error(f"argument --duties/--period-ms/--cores/--jitter: {e}")
    if a.iters < 2:
        ap.error("argument --iters: give 2 or more measured iterations")
    print(f"# CPU only: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, load {os.getloadavg()[0]:.2f} "
          f"at start; {a.model}, {a.engine} {a.schedule}, p=2 pinned, m={a.microbatches}, {a.iters} measured iterations "
          f"({a.warmup} warm-up); neighbour period {a.period_ms:g} ms on {a.cores} floating process(es), jitter {a.jitter:g}",
          flush=True)
    rows, t0 = [], time.time()
    with tempfile.TemporaryDirectory() if a.run_dir is None else nullcontext(a.run_dir) as tmp:
        tmpd = Path(tmp)
        tmpd.mkdir(parents=True, exist_ok=True)
        for duty, nb in zip(duties, neighbours, strict=True):
            cfg = TrainConfig(schedule=a.schedule, stages=2, microbatches=a.microbatches, model=a.model, iters=a.warmup + a.iters,
                              pin_cores=True, engine=a.engine, warmup_iters=a.warmup, run_dir=str(tmpd / f"duty-{duty:g}"))
            with nb if nb is not None else nullcontext():
                rep = train(cfg).report()
            j = iteration_jitter(rep["iteration_times_s"])
            row = {"duty": duty, "period_ms": a.period_ms, "cores": a.cores, "noise": nb.spec() if nb else None,
                   "median_ms": j["median_s"] * 1e3, "cv": j["cv"], "band_pct": j["band_pct"], "n": j["n"],
                   "iteration_ms": [round(t * 1e3, 1) for t in rep["iteration_times_s"]], "load": os.getloadavg()[0]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    quiet = next((r["median_ms"] for r in rows if r["duty"] == 0), None)
    print(f"\n{time.time() - t0:.0f} s in all\n")
    print("| duty | period (ms) | cores | median iteration (ms) | slowdown vs quiet | cv | jitter ±% (p10-p90) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        slow = "-" if quiet is None else f"{(r['median_ms'] / quiet - 1) * 100:+.1f}%"
        print(f"| {r['duty']:g} | {r['period_ms']:g} | {r['cores']} | {r['median_ms']:.1f} | {slow} | {r['cv']:.3f} | {r['band_pct']:.1f} |")
    best = min(rows, key=lambda r: abs(r["band_pct"] - a.target_pct))
    print(f"\nnearest ±{a.target_pct:g}%: duty {best['duty']:g} (±{best['band_pct']:.1f}%): "
          f"--noise {best['duty']:g}:{a.period_ms:g}:{a.cores}")


if __name__ == "__main__":
    main()
