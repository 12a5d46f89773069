"""The planner against this machine: for CPU pipelines that ``flowride train`` runs, the plan's
iteration time and bubble fraction, from the run's own measured per-stage profile
(:func:`flowride.plan.measured.profile_from_ranks`), next to the measured ones.

Then the planner against the closed forms and published settings (uniform stages, no
communication): GPipe/1F1B (p-1)/(m+p-1), interleaved (p-1)/(vm+p-1), ZB-H1 (p-1)/(3m+p-1), and
FreeRide's p = 4, m = 4/6/8. CPU only.

    python benchmarks/plan_validation.py [--model small] [--stages 4] [--microbatches 8] [--iters 12]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import train
from flowride.plan import Pricer, job_from_dict, plan_job
from flowride.plan.measured import PROFILE_KEYS, profile_from_ranks

RUNS = [("builtin", "gpipe", 1), ("builtin", "1f1b", 1), ("builtin", "interleaved", 2), ("torch", "gpipe", 1),
        ("torch", "1f1b", 1), ("torch", "interleaved1f1b", 2)]


def job_for(prof: dict, schedule: str, p: int, m: int, v: int) -> dict:
    return {"model": {"layers": p * v, "hidden": 64, "seq_len": 16, **{k: prof[k] for k in PROFILE_KEYS}},
            "parallel": {"pp": p, "virtual": v, "microbatches": m, "schedule": schedule},
            "hardware": {"node": "dgx-h100"}, "synthesis": {"enabled": False}}


def uniform(schedule: str, p: int, m: int, v: int = 1) -> float:
    d = {"model": {"layers": p * v, "hidden": 64, "seq_len": 16, "forward_s": [1.0] * p, "backward_s": [2.0] * p, "p2p_s": 0.0},
         "parallel": {"pp": p, "virtual": v, "microbatches": m, "schedule": schedule},
         "hardware": {"node": "dgx-h100"}, "synthesis": {"enabled": False}}
    return plan_job(job_from_dict(d), Pricer(cache=None, synth=False)).report()["shares"]["bubbles"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--stages", type=int, default=2, help="one stage per core is what the machine can time faithfully")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--iters", type=int, default=12)
    a = ap.parse_args()
    p, m = a.stages, a.microbatches
    print(f"# CPU, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; model {a.model}, p={p}, m={m}, {a.iters} iterations "
          "(2 warm-up)\n")
    print("| engine | schedule | iteration measured (ms) | planned (ms) | error | bubble fraction measured | planned | error |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for engine, sched, v in RUNS:
            cfg = TrainConfig(schedule=sched, stages=p, microbatches=m, model=a.model, iters=a.iters, engine=engine, chunks=v,
                              warmup_iters=2, run_dir=str(Path(tmp) / f"{engine}-{sched}"))
            res = train(cfg)
            rep = res.report()
            prof = profile_from_ranks(res.ranks, warmup=2)
            plan_name = "interleaved" if sched == "interleaved" else sched
            pl = plan_job(job_from_dict(job_for(prof, plan_name, p, m, v)), Pricer(cache=None, synth=False)).report()
            t_m, t_p = rep["iteration_time_s"], pl["iteration_s"]
            b_m, b_p = rep["bubble_fraction_measured"], pl["shares"]["bubbles"]
            print(f"| {engine} | {sched} | {t_m * 1e3:.1f} | {t_p * 1e3:.1f} | {(t_p / t_m - 1) * 100:+.1f}% | {b_m:.3f} | {b_p:.3f} | "
                  f"{(b_p / b_m - 1) * 100:+.1f}% |", flush=True)
    print("\n| schedule | p | m | v | closed form | planned (uniform stages) |")
    print("|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    for sched, pp, mm, v, closed in [("gpipe", 4, 4, 1, 3 / 7), ("1f1b", 4, 4, 1, 3 / 7), ("1f1b", 4, 6, 1, 3 / 9), ("1f1b", 4, 8, 1, 3 / 11),
                                     ("1f1b", 8, 24, 1, 7 / 31), ("interleaved", 8, 24, 2, 7 / 55), ("zbh1", 8, 24, 1, 7 / 79),
                                     ("interleaved1f1b", 8, 24, 2, 7 / 55), ("zbv", 8, 24, 2, None), ("dualpipev", 8, 24, 2, None)]:
        got = uniform(sched, pp, mm, v)
        print(f"| {sched} | {pp} | {mm} | {v} | {'-' if closed is None else f'{closed:.4f}'} | {got:.4f} |")
    print(f"\n(closed-form table in {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
