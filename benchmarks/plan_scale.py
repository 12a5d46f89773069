"""How long ``flowride plan`` takes at 1k, 4k and 10k GPUs: the first time (its collectives
priced: NCCL's algorithms modelled and flowride's synthesized, within the job's time limit per
collective) and again with them cached. CPU, 2 cores.

    python benchmarks/plan_scale.py [--gpus 1024,4096,10240] [--synth-time-limit 30] [--no-synth]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from flowride.plan import Pricer, job_from_dict, plan_job

BASE = Path(__file__).resolve().parents[1] / "examples" / "plans" / "llama70b-8k-h100.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="1024,4096,10240")
    ap.add_argument("--synth-time-limit", type=float, default=30.0)
    ap.add_argument("--no-synth", action="store_true")
    a = ap.parse_args()
    base = json.loads(BASE.read_text())
    print(f"# CPU, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; llama-2-70b, tp 8, pp 16, interleaved v=5, m=32, dgx-h100 "
          f"on 400 Gb/s rails; synthesis {'off' if a.no_synth else f'on, {a.synth_time_limit:g} s per collective'}\n")
    print("| GPUs | dp | first plan (s) | collectives priced | cached plan (s) | iteration (s) | NCCL's (s) | bubbles | synthesis saves |")
    print("|---|---|---|---|---|---|---|---|---|")
    for gpus in (int(g) for g in a.gpus.split(",")):
        d = json.loads(json.dumps(base))
        d["parallel"]["dp"] = gpus // (8 * 16)
        d["synthesis"] = {"enabled": not a.no_synth, "time_limit_s": a.synth_time_limit}
        job = job_from_dict(d)
        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(tmp) / "c.json"
            t0 = time.perf_counter()
            first = Pricer(cache=cache, synth=not a.no_synth, time_limit_s=a.synth_time_limit)
            plan_job(job, first)
            t_first = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = Pricer(cache=cache, synth=not a.no_synth, time_limit_s=a.synth_time_limit)
            rep = plan_job(job, again).report()
            t_cached = time.perf_counter() - t0
        print(f"| {job.gpus:,} | {job.parallel.dp} | {t_first:.1f} | {first.solved} | {t_cached:.2f} | {rep['iteration_s']:.3f} | "
              f"{rep['iteration_s_nccl']:.3f} | {rep['shares']['bubbles']:.1%} | {rep['synthesis_saves_share']:.2%} |", flush=True)


if __name__ == "__main__":
    main()
