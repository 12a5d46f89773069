"""The published nccl-tests curves flowride is held to (``data/nccl_measured.json``).

Each curve is one run of nccl-tests (or rccl-tests) on a named machine, with its source. The
times are nccl-tests' out-of-place averages in microseconds at nccl-tests' ``size`` (for
AllGather the gathered output per rank, for ReduceScatter the input per rank, for AllReduce the
buffer, for AlltoAll the whole send buffer per rank). ``derived`` marks a time computed from a
busbw-only table (rounded to 2 decimals: at small sizes good only to tens of per cent); fits
and targets leave those points out where they say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "nccl_measured.json"


@dataclass(frozen=True)
class Point:
    bytes: int
    time_us: float
    derived: bool  # from a busbw-only table
    outlier: str | None = None  # why the point is left out of fits and targets (slower than the next size up)
    nccl_algorithm: str | None = None  # the algorithm NCCL took there, where the source says


@dataclass(frozen=True)
class Curve:
    id: str
    collective: str  # allreduce, allgather, reducescatter, alltoall
    runtime: str  # nccl or rccl
    gpu: str
    node_type: str  # flowride's node type for the machine (topology.fabrics.NODE_TYPES)
    nodes: int
    gpus_per_node: int
    nics: int
    nic_Gbps: float
    forced_algorithm: str | None  # NCCL_ALGO as the run set it (and NCCL could honour it)
    cuda_graph: bool  # nccl-tests -G: launches replayed from a CUDA graph (a lower floor)
    gpus_per_thread: int  # nccl-tests -g: GPUs one thread drives (their launches one after another)
    confidence: str
    url: str
    points: tuple[Point, ...]

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def usable(self) -> list[Point]:
        """The points fits and targets use: not outliers, and derived ones only where the busbw
        they come from (2 decimals) is at least 1 GB/s, so rounding moves them by under 1%."""
        return [p for p in self.points if p.outlier is None and (not p.derived or p.bytes / (p.time_us * 1e3) >= 1.0)]


@cache
def load_curves(path: str | None = None) -> tuple[Curve, ...]:
    """Every curve in the data file (``path``: another file of the same shape)."""
    doc = json.loads(Path(path or DATA).read_text())
    out = []
    for c in doc["curves"]:
        pts = tuple(Point(int(p["bytes"]), float(p["time_us"]), bool(p["derived"]), p.get("outlier"), p.get("nccl_algorithm"))
                    for p in c["points"] if p["time_us"])
        out.append(Curve(c["id"], c["collective"], c["runtime"], c["gpu"], c["node_type"], int(c["nodes"]),
                         int(c["gpus_per_node"]), int(c["nics"]), float(c["nic_Gbps"]), c["forced_algorithm"],
                         bool(c["cuda_graph"]), int(c["gpus_per_thread"]), c["confidence"], c["source"].get("url", ""), pts))
    return tuple(out)


def curve(curve_id: str) -> Curve:
    for c in load_curves():
        if c.id == curve_id:
            return c
    raise KeyError(curve_id)
