"""Harvesting bubbles on this machine, both engines: paired overhead with its 95% CI, harvest
efficiency, bubble prediction error and savings, per mode and task set.

Each harvesting run switches harvesting on and off in randomized blocks of iterations
(``--block``), so both arms share the machine's drift; the overhead is the median over pairs of
blocks with a bootstrap CI (flowride.harvest.stats). ``none`` is the same paired run with no side
tasks at all: an A/A test whose interval is the noise floor. Each engine also trains once alone
(the separate-runs overhead and the losses check). CPU only.

``--noise DUTY[:PERIOD_MS[:CORES]]`` runs every measured run (training alone and each paired run;
not the side tasks' profiling) beside a neighbour process busy DUTY of every PERIOD_MS
(flowride.neighbour); each row states the measured jitter of its off iterations (the off blocks
of the paired run; training alone: every iteration) as ±% = (p90 - p10) / 2 / median.
``--run-dir`` keeps every run's files in a fresh directory (default: a temporary one).

    python benchmarks/harvest.py [--engines builtin,torch] [--model large] [--pairs 10] [--block 2]
        [--tasks mix,pagerank,cnn,image] [--modes none,freeride,naive,priority] [--noise 0.5:100:1]
        [--run-dir DIR] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch

from flowride.argtypes import out_dir
from flowride.harvest.session import DEFAULT_BUDGET_PCT, compare, profiles_for
from flowride.neighbour import describe_jitter, iteration_jitter, noise_arg
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import train

TASKSETS = {"pagerank": ["pagerank"], "cnn": ["cnn"], "image": ["image"], "mix": ["pagerank", "cnn", "image"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="builtin,torch")
    ap.add_argument("--model", default="large")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=10, help="pairs of on/off blocks per run")
    ap.add_argument("--block", type=int, default=2, help="iterations per block")
    ap.add_argument("--tasks", default="mix,pagerank,cnn,image", help="task sets for freeride (naive and priority use the first)")
    ap.add_argument("--modes", default="none,freeride,naive,priority")
    ap.add_argument("--noise", type=noise_arg, default=None, metavar="DUTY[:PERIOD_MS[:CORES]]",
                    help="run every measured run beside a neighbour busy DUTY of every PERIOD_MS (default 100) on CORES "
                         "processes (default 1); default: none (quiet)")
    ap.add_argument("--run-dir", type=out_dir, help="a fresh (absent or empty) directory for every run's files (default: a temporary one)")
    ap.add_argument("--json", help="also write every row to this JSON file")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if a.run_dir and Path(a.run_dir).exists() and any(Path(a.run_dir).iterdir()):
        ap.error(f"argument --run-dir: {a.run_dir} is not empty: give a fresh directory, so runs do not mix with old files")
    noisy = a.noise if a.noise is not None else nullcontext()
    noise_text = a.noise.describe() if a.noise is not None else "none (quiet)"
    print(f"# noise: {noise_text}", flush=True)
    warm = 2
    iters = warm + 2 * a.block * a.pairs
    tasksets = [t for t in a.tasks.split(",") if t]
    rows = []
    t_start = time.time()
    with tempfile.TemporaryDirectory() if a.run_dir is None else nullcontext(a.run_dir) as tmp:
        tmpd = Path(tmp)
        tmpd.mkdir(parents=True, exist_ok=True)
        profiles = profiles_for(sorted({t for ts in tasksets for t in TASKSETS[ts]}), tmpd / "profiles.json")
        for engine in a.engines.split(","):
            cfg = TrainConfig(schedule="1f1b", stages=2, microbatches=a.microbatches, model=a.model, iters=iters,
                              pin_cores=True, engine=engine, warmup_iters=warm)
            with noisy:
                base = train(replace(cfg, run_dir=str(tmpd / f"{engine}-alone"))).report()
            print(f"{engine}: alone, iteration {base['iteration_time_s'] * 1e3:.0f} ms, bubble fraction "
                  f"{base['bubble_fraction_measured']:.3f}, bubbles {[round(b['median_s'], 3) for b in base['bubbles'] if b['type'] != 'S']} s, "
                  f"jitter {describe_jitter(iteration_jitter(base['iteration_times_s']))}", flush=True)
            plan = []
            for mode in a.modes.split(","):
                if mode == "none":
                    plan.append((mode, "-", []))
                elif mode == "freeride":
                    plan += [(mode, ts, TASKSETS[ts]) for ts in tasksets]
                else:
                    plan.append((mode, tasksets[0], TASKSETS[tasksets[0]]))
            for mode, name, tasks in plan:
                with noisy:
                    c = compare(replace(cfg, run_dir=str(tmpd / f"{engine}-{mode}-{name}")), mode, tasks, paired_block=a.block,
                                baseline_report=base, profiles=profiles)
                h = c.report
                off = iteration_jitter(h["iteration_times_s"], h["iteration_harvest"])
                row = {"engine": engine, "tasks": name, "mode": mode, "overhead_pct": h["overhead_pct"],
                       "ci95": h["overhead_ci95"], "separate_runs_pct": h["overhead_pct_unpaired"],
                       "in_run_unpaired_pct": h["overhead_pct_unpaired_in_run"],
                       "efficiency": h["harvest_efficiency"], "prediction_error": h["bubble_prediction_error"],
                       "overhead_term": h["cost"]["overhead_term"], "value_term": h["cost"]["value_term"],
                       "savings": h["cost"]["savings"], "losses_identical": h["losses_identical"],
                       "within_budget": h["within_budget"], "budget_verdict": h.get("budget_verdict"),
                       "noise_floor": (h.get("overhead_noise_floor") or {}).get("median_pct"),
                       "pairs": h["overhead_pairs"], "failures": len(h["failures"]),
                       "overruns": sum(d["overruns"] for d in h["side_work"].values()),
                       "noise": a.noise.spec() if a.noise is not None else None,
                       "jitter_off_pct": off["band_pct"], "jitter_off_cv": off["cv"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print()
    if a.markdown:
        print(f"CPU only: {platform.machine()}, {platform.processor() or 'cpu'}, 1 torch thread per rank, torch {torch.__version__}; "
              f"p=2 1F1B, model {a.model}, m={a.microbatches}; {iters} iterations per run ({warm} warm-up, {a.pairs} pairs of "
              f"{a.block}-iteration on/off blocks); budget {DEFAULT_BUDGET_PCT:g}%; noise: {noise_text}; "
              f"{time.time() - t_start:.0f} s in all")
    print("| engine | tasks | mode | overhead % (median of pairs) | 95% CI | separate runs % | efficiency | prediction error | "
          "overhead term | value term | savings | losses identical | budget | A/A floor % | off jitter ±% |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["ci95"]
        pe = "-" if r["prediction_error"] is None else f"{r['prediction_error'] * 100:.1f}%"
        print(f"| {r['engine']} | {r['tasks']} | {r['mode']} | {r['overhead_pct']:+.2f} | [{lo:+.2f}, {hi:+.2f}] | "
              f"{r['separate_runs_pct']:+.1f} | {'n/a' if r['efficiency'] is None else format(r['efficiency'], '.2f')} | {pe} | {r['overhead_term']:+.3f} | "
              f"{r['value_term']:+.3f} | {r['savings']:+.3f} | {r['losses_identical']} | {r['budget_verdict']} | "
              f"{'-' if r['noise_floor'] is None else format(r['noise_floor'], '+.2f')} | {r['jitter_off_pct']:.1f} |")


if __name__ == "__main__":
    main()
