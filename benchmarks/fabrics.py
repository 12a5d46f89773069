"""Synthesis on the clusters people run, against the bound and NCCL's own algorithms (issue: fabrics).

Every figure is a modelled time, never a wall-clock measurement. The headline: NCCL's time as
the calibrated model predicts it (NCCL's cost model fitted to published nccl-tests runs, with its
median error near that size) and our schedule priced by the same model as the runtime would run
it; then, as detail, the epoch simulator's replay of a verified schedule (ours, and NCCL's
algorithms built as schedules on the same topology and epochs). Both are modelled, so the machine's load changes only how far a search gets within its time limit. The
synthesis runs with the default options (``--chunks auto``) and the time limit given.

    .venv/bin/python benchmarks/fabrics.py                      # the target table (1 GB, 1 MB, AlltoAll)
    .venv/bin/python benchmarks/fabrics.py --only dgx-h100x2 --cases ag1g
    .venv/bin/python benchmarks/fabrics.py --nccl-sweep         # 1 KB .. 1 GB against NCCL's best, per size
    .venv/bin/python benchmarks/fabrics.py --scale 16           # 16 x dgx-h100 (128 GPUs), 10 minutes
    .venv/bin/python benchmarks/fabrics.py --scale 128          # 128 x dgx-h100 (1024 GPUs), 30 minutes

Prints a markdown table (instance, collective, size, ours, NCCL's best and which, the bound and
its kind, ratios, chunks, method, wall seconds, peak memory); ``--json FILE`` keeps the rows.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from flowride.api import synthesize
from flowride.topology.builtins import dgx2, mi250
from flowride.topology.fabrics import FabricSpec, fabric
from flowride.units import format_size, parse_size

INSTANCES = {
    "dgx-h100x2": lambda: fabric(FabricSpec("dgx-h100", 2)),
    "dgx-h100x4": lambda: fabric(FabricSpec("dgx-h100", 4)),
    "dgx-h100x8": lambda: fabric(FabricSpec("dgx-h100", 8)),
    "dgx2x4": lambda: dgx2(4),
    "mi250x2": lambda: mi250(2),
    "mi250x4": lambda: mi250(4),
    # ForestColl's A100 model: a 200 Gb/s NIC per GPU, even and odd NICs on two InfiniBand switches
    "a100x2-ib": lambda: fabric(FabricSpec("dgx-a100", 2, rails=2)),
    "a100x4-ib": lambda: fabric(FabricSpec("dgx-a100", 4, rails=2)),
    "a800x4-clos": lambda: fabric(FabricSpec("a800", 4, "clos", nic_share=2)),
    "h800x2": lambda: fabric(FabricSpec("h800", 2)),  # issue #35's held-out AlltoAll 64 MiB
}
CASES = {
    "ag1g": ("allgather", "1GB"),
    "ag1m": ("allgather", "1MB"),
    "rs1g": ("reducescatter", "1GB"),
    "rs1m": ("reducescatter", "1MB"),
    "a2a64m": ("alltoall", "64MB"),
    "a2a1g": ("alltoall", "1GB"),
    "a2a64mi": ("alltoall", "64MiB"),
}
SWEEP = ["1KB", "32KB", "1MB", "32MB", "1GB"]


def run(name: str, topo, coll: str, size: str, limit: float) -> dict:
    t0 = time.perf_counter()
    out = synthesize(topo, coll, parse_size(size, "size"), "fast", "auto", limit)
    wall = time.perf_counter() - t0
    r = out.report()
    n = r["nccl"]
    pred = r["nccl_predicted"] or {}
    return {"instance": name, "gpus": r["gpus"], "collective": coll, "size": size, "ours_us": r["finish_time_us"],
            "nccl_us": n["best_us"] if n else None, "nccl_best": n["best"] if n else None,
            "nccl_how": n["how"][n["best"]] if n else None, "bound_us": r["lower_bound_us"], "bound_kind": r["lower_bound_kind"],
            "ratio": r["ratio_to_lower_bound"], "speedup_vs_nccl_epoch_model": r["speedup_vs_nccl_epoch_model"],
            # the headline: NCCL's calibrated prediction and ours priced as the runtime runs it (api/priced.py)
            "nccl_predicted_us": pred.get("time_us"), "nccl_predicted": f"{pred.get('algorithm')}/{pred.get('protocol')}" if pred else None,
            "calibration": pred.get("calibration"), "model_error": pred.get("model_error"), "runtime_us": r["runtime_us"],
            "speedup_vs_nccl": r["speedup_vs_nccl"], "chunks": r["chunks"],
            "method": r["method"], "wall_s": wall, "time_limit_s": limit,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def table(rows: list[dict]) -> str:
    """Headline first (NCCL's calibrated prediction, ours as the runtime runs it, both modelled by
    one model, with its error near that size), then the epoch model's figures as detail."""
    head = ("| instance | GPUs | collective | size | NCCL predicted (us) | NCCL's pick | model error | ours, runtime (us) | "
            "speedup | ours, epoch (us) | NCCL best, epoch (us) | epoch speedup | bound (us) | ours / bound | chunks | method | "
            "wall (s) / limit |")
    lines = [head, "|---" * 17 + "|"]
    for r in rows:
        err = "unknown" if r["model_error"] is None else f"{100 * r['model_error']:.0f}%"
        sp = "-" if r["speedup_vs_nccl"] is None else f"{r['speedup_vs_nccl']:.2f}"
        rt = "-" if r["runtime_us"] is None else f"{r['runtime_us']:.2f}"
        pred = "-" if r["nccl_predicted_us"] is None else f"{r['nccl_predicted_us']:.2f}"
        ep = "-" if r["nccl_us"] is None else f"{r['nccl_us']:.2f} ({r['nccl_best']})"
        esp = "-" if r["speedup_vs_nccl_epoch_model"] is None else f"{r['speedup_vs_nccl_epoch_model']:.2f}"
        lines.append(f"| {r['instance']} | {r['gpus']} | {r['collective']} | {r['size']} | {pred} | {r['nccl_predicted'] or '-'} | "
                     f"{err} | {rt} | {sp} | {r['ours_us']:.2f} | {ep} | {esp} | {r['bound_us']:.2f} | {r['ratio']:.3f} | "
                     f"{r['chunks']} | {r['method']} | {r['wall_s']:.0f} / {r['time_limit_s']:.0f} |")
    return "\n".join(lines)


def _keep(rows: list[dict], path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma list of instances: " + ", ".join(INSTANCES))
    ap.add_argument("--cases", help="comma list of cases: " + ", ".join(CASES))
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per synthesis (default 120)")
    ap.add_argument("--nccl-sweep", action="store_true", help="AllGather at " + ", ".join(SWEEP) + " against NCCL's best")
    ap.add_argument("--scale", type=int, help="nodes of dgx-h100 on rails: AllGather and AlltoAll at 1 GB")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    rows = []
    if a.scale:
        topo = fabric(FabricSpec("dgx-h100", a.scale))
        for coll in ("allgather", "alltoall"):
            rows.append(run(topo.name, topo, coll, "1GB", a.time_limit))
            print(table(rows[-1:]), flush=True)
            _keep(rows, a.json)
    else:
        names = a.only.split(",") if a.only else list(INSTANCES)
        cases = [(c, s) for c in ("allgather",) for s in SWEEP] if a.nccl_sweep else \
            [CASES[k] for k in (a.cases.split(",") if a.cases else CASES)]
        for name in names:
            topo = INSTANCES[name]()
            for coll, size in cases:
                rows.append(run(name, topo, coll, size, a.time_limit))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
                _keep(rows, a.json)  # each row as it comes: a crash later loses nothing measured
    print()
    print(table(rows))
    print(f"\n{len(rows)} syntheses; sizes decimal ({format_size(10**9)} = 1e9 bytes); times modelled by the epoch simulator",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
