"""Maintenance: turn a collection of published nccl-tests curves (a JSON list of curves, each with
its system, settings, source and points) into the project's own data file,
src/flowride/runtime/data/nccl_measured.json.

Only figures and their sources carry over (sizes, times, the settings each run used, where it was
published); to each curve this adds what flowride needs to price the same machine: its node type,
NIC count and rate, whether NCCL's algorithm was forced, and whether times are derived from a
busbw-only table. Run it again when the collection grows:

    python benchmarks/nccl_measured_import.py SRC [DST]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DST = ROOT / "src" / "flowride" / "runtime" / "data" / "nccl_measured.json"

COLLECTIVE = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter", "alltoall": "alltoall"}

# id prefix -> (flowride node type, NICs per node, Gb/s each, what flowride assumes and why)
MACHINE = {
    "aws_p4de": ("dgx-a100", 4, 100.0, "p4de: 4 x 100 Gb/s EFA per node"),
    "aws_p5": ("dgx-h100", 8, 400.0, "p5: 32 x 100 Gb/s EFA per node, modelled as 4 per GPU = 8 x 400 Gb/s"),
    "amd_mi300x": ("mi300x", 8, 400.0, "single node: the NICs play no part"),
    "azure_ndv4_a100": ("dgx-a100", 8, 200.0, "single node: the NICs play no part"),
    "azure_ndv5_h100": ("dgx-h100", 8, 400.0, "single node: the NICs play no part"),
    "azure_ndmv4_a100": ("dgx-a100", 8, 200.0, "NDm A100 v4: 8 x 200 Gb/s HDR, one per GPU"),
    "h20": ("dgx-h100", 8, 400.0, "H20: the same NVLink4 + NVSwitch fabric as an H100 node (900 GB/s both ways); "
            "only sizes up to 4 KiB, where compute plays no part"),
    "hgx_h100": ("dgx-h100", 8, 400.0, "8 x ConnectX-7 400 Gb/s, one per GPU"),
    "h100_2node": ("dgx-h100", 8, 400.0, "8 x 400 Gb/s InfiniBand, one per GPU (NVIDIA's reply in the thread)"),
}


def forced_algorithm(curve: dict) -> str | None:
    """NCCL_ALGO as the run set it, when NCCL could honour it (A100 has no NVLS: NCCL fell back)."""
    env = curve.get("env", "")
    if "NCCL_ALGO=Ring" in env:
        return "ring"
    if "NCCL_ALGO=NVLS" in env and "H100" in curve["system"].get("gpu", ""):
        return "nvls"
    return None


# NCCL's choice where a source states it: (curve id, up to bytes inclusive, algorithm). NVIDIA's
# reply in NVIDIA/nccl-tests#309 (NCCL 2.26.2, one node of 8 x H100): "8 B-1 MB Ring/LL, 2 MB-16 GB
# NVLS/Simple"; applied to the one-node H100 curve run with NCCL's defaults.
KNOWN = [("aws_p5_1node_allreduce", 1 << 20, "ring"), ("aws_p5_1node_allreduce", 1 << 34, "nvls")]
OUTLIER_STEP = 1.15  # a time this much above the next larger size's: the run was disturbed


def outliers(points: list[dict]) -> dict[int, str]:
    """Points slower than the next larger size by more than 15%: moving more bytes cannot take
    less time, so such a point measured something else (a warm-up, a stall). Kept, and marked."""
    out = {}
    for a, b in zip(points, points[1:], strict=False):
        if a["time_us"] and b["time_us"] and a["time_us"] > OUTLIER_STEP * b["time_us"]:
            out[a["bytes"]] = f"{a['time_us']:g} us, above the next size's {b['time_us']:g} us ({b['bytes']} B)"
    return out


def convert(curve: dict) -> dict:
    prefix = next(p for p in MACHINE if curve["id"].startswith(p))
    node, nics, gbps, why = MACHINE[prefix]
    points = []
    for p in curve["points"]:
        derived = p.get("time_us") is None
        t = p["time_us_derived"] if derived else p["time_us"]
        points.append({"bytes": p["bytes"], "time_us": t, "time_us_in_place": p.get("time_us_inplace"), "derived": derived})
    odd = outliers(points)
    for p in points:
        if p["bytes"] in odd:
            p["outlier"] = odd[p["bytes"]]
        known = [a for cid, upto, a in KNOWN if cid == curve["id"] and p["bytes"] <= upto]
        if known:
            p["nccl_algorithm"] = known[0]
    return {
        "id": curve["id"], "collective": COLLECTIVE[curve["collective"]],
        "runtime": "rccl" if "MI300" in curve["system"].get("gpu", "") else "nccl",
        "gpu": curve["system"].get("gpu"), "node_type": node, "nodes": curve["system"]["nodes"],
        "gpus_per_node": curve["system"]["gpus_per_node"], "ranks": curve["system"]["ranks"],
        "nics": nics, "nic_Gbps": gbps, "machine_note": why,
        "forced_algorithm": forced_algorithm(curve), "cuda_graph": "-G 1" in curve.get("command", ""),
        "gpus_per_thread": int(m.group(1)) if (m := re.search(r" -g (\d+)", curve.get("command", ""))) else 1,
        "nccl_version": curve.get("nccl_version"), "algo_proto": curve.get("algo_proto"), "env": curve.get("env"),
        "command": curve.get("command"), "confidence": curve.get("confidence"), "notes": curve.get("notes"),
        "source": curve["source"], "points": points,
    }


def main(src: Path, dst: Path = DST) -> None:
    curves = json.loads(src.read_text())
    doc = {"about": ("Published nccl-tests / rccl-tests runs (out-of-place time, us, per nccl-tests size). "
                     "Figures copied from their sources (each curve's 'source'); 'derived' times come from a "
                     "busbw-only table (rounded busbw, good to tens of % at small sizes). Converted by "
                     "benchmarks/nccl_measured_import.py."),
           "curves": [convert(c) for c in curves]}
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python benchmarks/nccl_measured_import.py SRC [DST]  (SRC: the curves' JSON)")
    main(*(Path(a) for a in sys.argv[1:3]))
