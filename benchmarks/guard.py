"""The budget guard against the budget: paired overhead with its 95% CI, harvest efficiency and
bubble prediction error, guard on (and optionally off), per preset, engine and schedule.

Each row is one paired run (harvesting on and off in randomized blocks of ``--block``
iterations, so both arms share the machine's drift; flowride.harvest.stats): the interval is the
training owner's view of the overhead. With the guard on, the manager pairs those same blocks
(harvest/guard.py) and backs off while the interval's upper end is above ``--budget``. Each
configuration also trains once alone (the baseline the report's losses are checked against).
CPU only; run it on a quiet machine (``uptime``), since other load widens every interval.

``--noise DUTY[:PERIOD_MS[:CORES]]`` runs every measured run (training alone and each paired run;
not the side tasks' profiling) beside a neighbour process busy DUTY of every PERIOD_MS
(flowride.neighbour); each row states the measured jitter of its off iterations (training alone:
every iteration of the alone run, the off blocks of the paired run) as ±% = (p90 - p10) / 2 /
median. ``--run-dir`` keeps every run's files in a fresh directory (default: a temporary one).

    python benchmarks/guard.py [--models small,large] [--engines builtin,torch]
        [--schedules gpipe,1f1b,interleaved1f1b] [--guard on,off] [--pairs 12] [--block 2]
        [--tasks pagerank,image] [--budget 2] [--noise 0.5:100:1] [--run-dir DIR] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch

from flowride.argtypes import out_dir
from flowride.harvest.session import compare, profiles_for
from flowride.neighbour import iteration_jitter, noise_arg
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import train

# the built-in engine calls torch's Interleaved1F1B "interleaved" (its own instruction lists)
BUILTIN_NAME = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved1f1b": "interleaved"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="small,large")
    ap.add_argument("--engines", default="builtin,torch")
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved1f1b")
    ap.add_argument("--guard", default="on", help="on, off or on,off (off: the same run without the guard, for comparison)")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=12, help="pairs of on/off blocks per run")
    ap.add_argument("--block", type=int, default=2, help="iterations per block")
    ap.add_argument("--tasks", default="pagerank,image")
    ap.add_argument("--budget", type=float, default=2.0)
    ap.add_argument("--noise", type=noise_arg, default=None, metavar="DUTY[:PERIOD_MS[:CORES]]",
                    help="run every measured run beside a neighbour busy DUTY of every PERIOD_MS (default 100) on CORES "
                         "processes (default 1); default: none (quiet)")
    ap.add_argument("--run-dir", type=out_dir, help="a fresh (absent or empty) directory for every run's files (default: a temporary one)")
    ap.add_argument("--json", help="also write every row to this JSON file")
    a = ap.parse_args()
    if a.run_dir and Path(a.run_dir).exists() and any(Path(a.run_dir).iterdir()):
        ap.error(f"argument --run-dir: {a.run_dir} is not empty: give a fresh directory, so runs do not mix with old files")
    noisy = a.noise if a.noise is not None else nullcontext()
    noise_text = a.noise.describe() if a.noise is not None else "none (quiet)"
    warm = 2
    iters = warm + 2 * a.block * a.pairs
    tasks = [t for t in a.tasks.split(",") if t]
    rows, t0 = [], time.time()
    print(f"# CPU only: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, load {os.getloadavg()[0]:.2f} at start; "
          f"p=2, m={a.microbatches}, {iters} iterations per run ({warm} warm-up, {a.pairs} pairs of {a.block}-iteration "
          f"blocks); tasks {'+'.join(tasks)}; budget {a.budget:g}%; noise: {noise_text}", flush=True)
    with tempfile.TemporaryDirectory() if a.run_dir is None else nullcontext(a.run_dir) as tmp:
        tmpd = Path(tmp)
        tmpd.mkdir(parents=True, exist_ok=True)
        profiles = profiles_for(tasks, tmpd / "profiles.json")
        for model in a.models.split(","):
            for engine in a.engines.split(","):
                for sched in a.schedules.split(","):
                    name = BUILTIN_NAME[sched] if engine == "builtin" else sched
                    cfg = TrainConfig(schedule=name, stages=2, microbatches=a.microbatches, model=model, iters=iters,
                                      pin_cores=True, engine=engine, warmup_iters=warm,
                                      chunks=2 if sched == "interleaved1f1b" else 1, run_dir=str(tmpd / "x"))
                    tag = f"{model}-{engine}-{sched}"
                    with noisy:
                        base = train(replace(cfg, run_dir=str(tmpd / f"{tag}-alone"))).report()
                    alone = iteration_jitter(base["iteration_times_s"])
                    for g in a.guard.split(","):
                        with noisy:
                            c = compare(replace(cfg, run_dir=str(tmpd / f"{tag}-{g}")), "freeride", tasks, paired_block=a.block,
                                        baseline_report=base, profiles=profiles, budget_pct=a.budget, guard=g == "on")
                        h = c.report
                        gd = h.get("guard") or {}
                        off = iteration_jitter(h["iteration_times_s"], h["iteration_harvest"])
                        row = {"model": model, "engine": engine, "schedule": sched, "guard": g,
                               "overhead_pct": h["overhead_pct"], "ci95": h["overhead_ci95"], "within_budget": h["within_budget"],
                               "efficiency": h["harvest_efficiency"], "efficiency_note": h.get("harvest_efficiency_note"),
                               "prediction_error": h["bubble_prediction_error"], "pairs": h["overhead_pairs"],
                               "iteration_ms": base["iteration_time_s"] * 1e3,
                               "bubbles_ms": sorted({round(b["median_s"] * 1e3, 1) for b in base["bubbles"] if b["type"] != "S"}),
                               "guard_level": gd.get("level"), "guard_actions": len(gd.get("actions", [])),
                               "guard_verdict": gd.get("verdict"), "guard_verdict_text": gd.get("verdict_text"),
                               "budget_verdict": h["budget_verdict"], "budget_note": h.get("budget_note"),
                               "noise_floor": h.get("overhead_noise_floor"),
                               "prediction_error_by_type": h.get("bubble_prediction_error_by_type"),
                               "side_steps": sum(d["steps"] for d in h["side_work"].values()),
                               "bubbles_unused_by_reason": h.get("bubbles_unused_by_reason"),
                               "losses_identical": h["losses_identical"], "load": os.getloadavg()[0],
                               "noise": a.noise.spec() if a.noise is not None else None,
                               "jitter_off_pct": off["band_pct"], "jitter_off_cv": off["cv"],
                               "jitter_alone_pct": alone["band_pct"], "jitter_alone_cv": alone["cv"]}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{time.time() - t0:.0f} s in all; noise: {noise_text}\n")
    print("| preset | engine | schedule | guard | overhead % (median of pairs) | 95% CI | budget | A/A floor % | efficiency | "
          "side steps | prediction error (by type) | guard rung (actions), verdict | iteration (ms) | bubbles (ms) | "
          "jitter ±% off (alone) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["ci95"]
        eff = "n/a" if r["efficiency"] is None else f"{r['efficiency']:.2f}"
        pe = "-" if r["prediction_error"] is None else f"{r['prediction_error'] * 100:.1f}%"
        by = r.get("prediction_error_by_type") or {}
        if by:
            pe += " (" + ", ".join(f"{t} {d['median'] * 100:.0f}" for t, d in by.items()) + ")"
        rung = "-" if r["guard_level"] is None else f"{r['guard_level']} ({r['guard_actions']}), {r['guard_verdict']}"
        nf = r.get("noise_floor") or {}
        floor = "-" if not nf else f"{nf['median_pct']:+.2f} ({nf['pairs']})"
        print(f"| {r['model']} | {r['engine']} | {r['schedule']} | {r['guard']} | {r['overhead_pct']:+.2f} | [{lo:+.2f}, {hi:+.2f}] | "
              f"{r['budget_verdict']} | {floor} | {eff} | {r['side_steps']} | {pe} | {rung} | {r['iteration_ms']:.0f} | "
              f"{', '.join(f'{b:g}' for b in r['bubbles_ms'])} | {r['jitter_off_pct']:.1f} ({r['jitter_alone_pct']:.1f}) |")
    for r in rows:  # what a row that could not decide its budget, or did no work, says
        if r["budget_verdict"] == "unresolved":
            print(f"- {r['model']} {r['engine']} {r['schedule']} guard {r['guard']}: {r['budget_note']}")
        if r["efficiency_note"]:
            print(f"- {r['model']} {r['engine']} {r['schedule']} guard {r['guard']}: efficiency: {r['efficiency_note']}")


if __name__ == "__main__":
    main()
