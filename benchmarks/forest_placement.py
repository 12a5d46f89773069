"""The packed trees' list scheduler (``forest_sends``) against an earlier commit's, paired.

The chunk sweep of ``--chunks auto`` reaches a large count only when each count is quick, and at
many chunks the trees' list schedule is a large share of a count's time. This times it alone, for
the working tree and for ``--against REV`` (a git revision, checked out in a temporary worktree),
interleaved: each repeat runs both, one after the other in fresh processes, in alternating order,
so the machine's drift falls on both alike. Per case it prints both medians, the median of the
paired ratios (earlier / now) with a bootstrap 95% interval, and both schedules' epochs (a faster
placement that changed the schedule shows here).

    .venv/bin/python benchmarks/forest_placement.py --against 661f88e
    .venv/bin/python benchmarks/forest_placement.py --against 661f88e --cases mi250x4:64 --repeats 5

Wall times on this machine's CPU; epochs are the epoch simulator's replay of each schedule.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ["mi250x2:128", "mi250x4:64", "a800x4-clos:32", "dgx-h100x2:64", "dgx2x4:16"]

# run in a fresh process with PYTHONPATH at one checkout's src/: the instance, its packing (not
# timed), then forest_sends timed, then the replay's epochs
ONE = r"""
import json, sys, time
sys.path.insert(0, {bench!r})
from fabrics import INSTANCES
from flowride.collectives.demand import make_demand
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.synth.forest import forest_sends
from flowride.synth.trees import packing_for
from flowride.topology.timing import epoch_timing
topo = INSTANCES[{name!r}]()
d = make_demand(topo, "allgather", 10**9, {chunks})
tm = epoch_timing(topo, d.chunk_bytes, "fast")
pk = packing_for(topo, tm, d.chunk_bytes, 120)
t0 = time.perf_counter()
s = forest_sends(topo, d, tm, pk)
wall = time.perf_counter() - t0
sim = simulate(Schedule.from_tuples(topo, d, tm.tau, s))
assert sim.valid, sim.first_violation
print(json.dumps({{"seconds": wall, "epochs": int(sim.epochs)}}))
"""


def run_one(src: str, name: str, chunks: int) -> dict:
    code = ONE.format(bench=os.path.join(ROOT, "benchmarks"), name=name, chunks=chunks)
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def interval(ratios: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """Bootstrap 95% interval of the median paired ratio."""
    if len(ratios) < 2:
        return float(ratios[0]), float(ratios[0])
    meds = np.median(rng.choice(ratios, size=(2000, len(ratios))), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the earlier git revision to compare with")
    ap.add_argument("--cases", default=",".join(CASES), help="instance:chunks, comma separated (instances of fabrics.py)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="keep the rows in this file")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old = os.path.join(tmp, "old")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", old, args.against], check=True, capture_output=True)
        try:
            for case in args.cases.split(","):
                name, chunks = case.split(":")
                pairs = []
                for r in range(args.repeats):
                    order = [("old", old), ("new", ROOT)] if r % 2 == 0 else [("new", ROOT), ("old", old)]
                    got = {tag: run_one(os.path.join(path, "src"), name, int(chunks)) for tag, path in order}
                    pairs.append(got)
                    print(f"{case} repeat {r + 1}: earlier {got['old']['seconds']:.2f} s, now {got['new']['seconds']:.2f} s", file=sys.stderr, flush=True)
                t_old = np.array([p["old"]["seconds"] for p in pairs])
                t_new = np.array([p["new"]["seconds"] for p in pairs])
                ratio = t_old / t_new
                lo, hi = interval(ratio, rng)
                rows.append({"case": case, "earlier_s": float(np.median(t_old)), "now_s": float(np.median(t_new)),
                             "speedup": float(np.median(ratio)), "ci95": [lo, hi], "repeats": args.repeats,
                             "epochs_earlier": pairs[0]["old"]["epochs"], "epochs_now": pairs[0]["new"]["epochs"]})
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old], check=False, capture_output=True)
    print(f"| case (AllGather 1 GB) | earlier {args.against} (s) | now (s) | speedup (earlier / now) | 95% CI | epochs earlier | epochs now |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['earlier_s']:.2f} | {r['now_s']:.2f} | {r['speedup']:.2f} | {r['ci95'][0]:.2f}-{r['ci95'][1]:.2f} | "
              f"{r['epochs_earlier']} | {r['epochs_now']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
