"""Issue #35, gap 3: several collectives at once on shared links, joint vs independent vs NCCL.

Rows (each in its own process, so its wall time and peak memory are its own):

- k = 2, 4, 8 data-parallel reduce-scatters of 1 GB (one per rail: GPU j of each of 16 DGX H100
  nodes), on a leaf/spine Clos oversubscribed 2:1 and 4:1 (128 GPUs);
- the tensor-parallel all-gathers (256 MB, one per node) with the data-parallel reduce-scatters
  (1 GB, one per rail) of a 4-node DGX H100 job on rails;
- one TP all-gather with one DP reduce-scatter whose GPUs may relay through the others (the DP
  traffic then shares the NVSwitch ports with the TP group).

Columns: the joint schedule's last finish (verified by the simulator, every collective on its
share of the links, or whole links when they never meet), its ratio to the joint lower bound,
flowride's schedules made alone and NCCL's modelled algorithms run together in the fluid model
(flowride.concurrent.contention), with flows spread over interchangeable spines ("spread", the
kindest case for them) and kept on the links they chose alone ("as routed"). The first columns
restate the joint run on the calibrated model (docs/calibration.md): each collective alone by that
model (NCCL's prediction, flowride's schedule priced as the runtime runs it) stretched by the
contention the epoch model found. All figures are modelled on this CPU machine; no GPU or network
was used.

    .venv/bin/python benchmarks/joint_collectives.py                  # every row, 60 s each
    .venv/bin/python benchmarks/joint_collectives.py --only clos4-k8 --time-limit 120
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

ROWS = {
    **{f"clos{o}-k{k}": ("fabric:dgx-h100:16:clos:" + str(o),
                         [{"name": f"dp{j}", "collective": "reducescatter", "ranks": f"every:8+{j}", "size": "1GB"} for j in range(k)])
       for o in (2, 4) for k in (2, 4, 8)},
    "rail-tp4-dp8": ("fabric:dgx-h100:4:rail:1",
                     [{"name": f"tp{n}", "collective": "allgather", "ranks": f"{8 * n}-{8 * n + 7}", "size": "256MB"} for n in range(4)]
                     + [{"name": f"dp{j}", "collective": "reducescatter", "ranks": f"every:8+{j}", "size": "1GB"} for j in range(8)]),
    "rail-tp1-dp1-relay": ("fabric:dgx-h100:4:rail:1",
                           [{"name": "tp0", "collective": "allgather", "ranks": "0-7", "size": "256MB"},
                            {"name": "dp0", "collective": "reducescatter", "ranks": "every:8", "size": "1GB", "relay": True}]),
}


def _topology(text: str):
    from flowride.topology.fabrics import build_fabric

    _, node, nodes, network, over = text.split(":")
    return build_fabric(node, int(nodes), network, oversubscription=float(over))


def one(name: str, seconds: float) -> dict:
    from flowride.concurrent import parse_spec, report, synthesize_concurrent

    topo_text, spec = ROWS[name]
    topo = _topology(topo_text)
    t0 = time.perf_counter()
    rep = report(synthesize_concurrent(topo, parse_spec(spec, topo), seconds))
    rep["row"] = name
    rep["bench_wall_s"] = time.perf_counter() - t0
    rep["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return rep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(ROWS), help="comma list of: " + ", ".join(ROWS))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--json", help="write every row's report here")
    ap.add_argument("--row", help=argparse.SUPPRESS)  # internal: run one row in this process
    a = ap.parse_args()
    if a.row:
        print(json.dumps(one(a.row, a.time_limit)))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"concurrent collectives, --time-limit {a.time_limit:g} s per row (CPU, epoch model)")
    for col in ("row", "NCCL cal. us", "joint cal. us", "vs NCCL cal.", "model error", "joint us", "how", "x bound", "indep. us",
                "NCCL us", "vs indep.", "vs NCCL", "vs indep. routed", "vs NCCL routed", "wall s", "peak GB"):
        t.add_column(col, justify="left" if col in ("row", "how") else "right")
    out = []
    for name in a.only.split(","):
        p = subprocess.run([sys.executable, __file__, "--row", name, "--time-limit", str(a.time_limit)], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{name}: {p.stderr[-2000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        out.append(r)
        j, c = r["joint"], r.get("calibrated") or {}
        err = "-" if c.get("model_error") is None else f"{100 * c['model_error']:.0f}%"
        t.add_row(name, f"{c.get('nccl_together_us', 0):.0f}", f"{c.get('joint_us', 0):.0f}", f"{c.get('speedup_vs_nccl', 0):.2f}", err,
                  f"{j['last_finish_us']:.0f}", j["how"], f"{r['ratio_to_joint_bound']:.3f}", f"{r['independent_together_us']:.0f}",
                  f"{r['nccl_together_us']:.0f}", f"{r['speedup_vs_independent']:.2f}", f"{r['speedup_vs_nccl_epoch_model']:.2f}",
                  f"{r['speedup_vs_independent_as_routed']:.2f}", f"{r['speedup_vs_nccl_as_routed']:.2f}", f"{r['bench_wall_s']:.0f}",
                  f"{r['peak_rss_gb']:.2f}")
        print(f"{name}: done", file=sys.stderr, flush=True)
    Console(width=200).print(t)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
