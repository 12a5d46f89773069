"""How long the list-scheduled baselines take to build (the ring AllGather, the direct AlltoAll):
every method falls back on them and the work guard prices them, so a slow baseline eats the
time limit before any search starts.

Each case runs in a fresh interpreter, once per source tree given with ``--trees`` (e.g. the
current checkout and an older one), interleaved ``--repeats`` times so both see the same machine
load; the table prints the median seconds per tree, their ratio, and whether the sends are the
same.

    python benchmarks/baselines.py [--trees src,/path/to/old/src] [--repeats 3] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CASES = [("dgx2", {"chassis": 4}, "alltoall"), ("dgx2", {"chassis": 4}, "allgather"), ("mi250", {"chassis": 2}, "alltoall"),
         ("torus", {"rows": 8, "cols": 8}, "alltoall"), ("ndv2", {"chassis": 4}, "alltoall")]

CHILD = """
import hashlib, json, sys, time
from flowride.collectives.demand import make_demand
from flowride.synth.greedy import baseline_sends
from flowride.topology.builtins import build_topology
from flowride.topology.timing import epoch_timing
name, params, coll = json.loads(sys.argv[1])
topo = build_topology(name, **params)
d = make_demand(topo, coll, 1 << 20, 1)
tm = epoch_timing(topo, d.chunk_bytes, "fast")
t = time.perf_counter()
_, sends = baseline_sends(topo, d, tm)
s = time.perf_counter() - t
print(json.dumps({"seconds": s, "sends": len(sends), "digest": hashlib.sha1(repr(sorted(sends)).encode()).hexdigest()[:12]}))
"""


def run(tree: str, case) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(case)], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default="src", help="comma-separated source trees (directories holding flowride/)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    trees = a.trees.split(",")
    head = ["topology", "collective", "sends"] + [f"s ({t})" for t in trees] + ([f"ratio {trees[0]}/{trees[1]}", "same sends"] if len(trees) > 1 else [])
    print("| " + " | ".join(head) + " |" if a.markdown else "\t".join(head))
    if a.markdown:
        print("|" + "---|" * len(head))
    for case in CASES:
        got: dict[str, list[dict]] = {t: [] for t in trees}
        for _ in range(a.repeats):
            for t in trees:  # interleaved: both trees see the same load
                got[t].append(run(t, case))
        med = {t: statistics.median(r["seconds"] for r in got[t]) for t in trees}
        label = case[0] + " " + " ".join(f"{k}={v}" for k, v in case[1].items())
        row = [label, case[2], str(got[trees[0]][0]["sends"])] + [f"{med[t]:.3f}" for t in trees]
        if len(trees) > 1:
            row += [f"{med[trees[0]] / med[trees[1]]:.3f}", str(len({got[t][0]['digest'] for t in trees}) == 1)]
        print("| " + " | ".join(row) + " |" if a.markdown else "\t".join(row), flush=True)


if __name__ == "__main__":
    main()
