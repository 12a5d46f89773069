"""Measured against theoretical bubble fraction at p=2, one core per stage.

For GPipe, 1F1B and interleaved 1F1B (v=2) and m in {2, 4, 8, 16}, runs a short training and
prints the measured bubble fraction (mean over stages of idle / iteration time, median-free:
mean over the iterations after warm-up) beside (p-1)/(m+p-1) (interleaved: (p-1)/(v*m+p-1)).

    python benchmarks/bubbles.py [--engine builtin|torch] [--model small] [--iters 8] [--markdown]
"""

from __future__ import annotations

import argparse
import platform
import tempfile

import torch

from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--microbatch-size", type=int, default=4)
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved")
    ap.add_argument("--microbatches", default="2,4,8,16")
    ap.add_argument("--engine", default="builtin", help="builtin or torch (interleaved runs as torch's interleaved1f1b)")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    rows = []
    for sched in a.schedules.split(","):
        for m in (int(x) for x in a.microbatches.split(",")):
            v = 2 if sched == "interleaved" else 1
            name = "interleaved1f1b" if (sched == "interleaved" and a.engine == "torch") else sched
            with tempfile.TemporaryDirectory() as d:
                cfg = TrainConfig(schedule=name, stages=2, microbatches=m, chunks=v, model=a.model, iters=a.iters,
                                  microbatch_size=a.microbatch_size, run_dir=d, threads=1, device="cpu", engine=a.engine)
                rep = train(cfg).report()
            meas, theo = rep["bubble_fraction_measured"], rep["bubble_fraction_theory"]
            rows.append((sched, m, v, meas, theo, meas - theo, rep["iteration_time_s"] * 1e3))
            print(*(f"{x:.4f}" if isinstance(x, float) else x for x in rows[-1]), sep="\t", flush=True)
    if a.markdown:
        print(f"\nCPU only: {platform.machine()}, torch {torch.__version__}, {a.engine} engine, p=2 (one process and one torch thread "
              f"per stage), model {a.model}, micro-batch size {a.microbatch_size}, {a.iters} iterations (2 warm-up)")
        print("| schedule | m | v | measured | theory | measured - theory | iteration ms |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:+.3f} | {r[6]:.1f} |")


if __name__ == "__main__":
    main()
