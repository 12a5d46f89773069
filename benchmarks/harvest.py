"""Harvesting bubbles on this machine: overhead, harvest efficiency and savings per mode.

p=2, 1F1B, m in {4, 8}; each built-in task and a mix; modes none / freeride / naive / priority,
each repeated (default 5), every repeat against its own fresh `none` run. Prints medians.

    python benchmarks/harvest.py [--repeats 5] [--microbatches 4,8] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from flowride.harvest.session import harvest_report, profiles_for, run_harvest
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import train

TASKSETS = {"pagerank": ["pagerank"], "cnn": ["cnn"], "image": ["image"], "mix": ["pagerank", "cnn", "image"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--microbatches", default="4,8")
    ap.add_argument("--tasks", default="pagerank,cnn,image,mix")
    ap.add_argument("--modes", default="freeride,naive,priority")
    ap.add_argument("--model", default="small")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    modes = a.modes.split(",")
    tasksets = {k: TASKSETS[k] for k in a.tasks.split(",")}
    rows: dict[tuple, list[dict]] = {}
    nones: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        profiles = profiles_for(sorted({t for ts in tasksets.values() for t in ts}), tmpd / "profiles.json")
        for m in (int(x) for x in a.microbatches.split(",")):
            cfg = TrainConfig(schedule="1f1b", stages=2, microbatches=m, model=a.model, iters=a.iters, pin_cores=True)
            for r in range(a.repeats):
                base = train(replace(cfg, run_dir=str(tmpd / f"none-{m}-{r}")))
                nones.setdefault(m, []).append(base.report()["iteration_time_s"])
                print(m, "none", r, f"iteration {base.report()['iteration_time_s'] * 1e3:.1f} ms", flush=True)
                prof = tmpd / f"bubbles-{m}-{r}.json"
                prof.write_text(json.dumps(base.profile()))
                order = modes[r % len(modes):] + modes[: r % len(modes)]  # rotate against drift
                for name, tasks in tasksets.items():
                    for mode in order:
                        cfg_h = replace(cfg, run_dir=str(tmpd / f"{mode}-{name}-{m}-{r}"))
                        res, rec = run_harvest(cfg_h, mode, tasks, profiles, bubble_profile=str(prof))
                        h = harvest_report(base.report(), res.report(), rec, mode, profiles)
                        rows.setdefault((m, name, mode), []).append(h)
                        print(m, name, mode, r, f"overhead {h['overhead_pct']:+.2f}%", f"eff {h['harvest_efficiency']:.3f}",
                              f"savings {h['cost']['savings']:+.4f}", f"identical {h['losses_identical']}",
                              f"failures {len(h['failures'])}", flush=True)
    print()
    for m, ts in nones.items():  # how much the baseline itself moves between repeats
        med = statistics.median(ts)
        print(f"m={m}: none iteration ms median {med * 1e3:.1f}, spread {(min(ts) / med - 1) * 100:+.1f}%..{(max(ts) / med - 1) * 100:+.1f}%")
    header = "| m | tasks | mode | overhead % (median) | overhead % (min..max) | harvest efficiency | value term | savings | losses identical |"
    if a.markdown:
        print(f"CPU only: {platform.machine()}, torch {torch.__version__}, p=2 1F1B, model {a.model}, {a.iters} iterations "
              f"(2 warm-up), {a.repeats} repeats, each against its own none run; stage r and its side tasks pinned to core r")
    print(header)
    print("|---|---|---|---|---|---|---|---|---|")
    for (m, name, mode), hs in rows.items():
        ov = [h["overhead_pct"] for h in hs]
        print(f"| {m} | {name} | {mode} | {statistics.median(ov):+.1f} | {min(ov):+.1f}..{max(ov):+.1f} | "
              f"{statistics.median(h['harvest_efficiency'] for h in hs):.2f} | "
              f"{statistics.median(h['cost']['value_term'] for h in hs):+.3f} | "
              f"{statistics.median(h['cost']['savings'] for h in hs):+.3f} | {all(h['losses_identical'] for h in hs)} |")


if __name__ == "__main__":
    main()
