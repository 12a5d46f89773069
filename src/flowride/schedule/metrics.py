"""Lower bounds on a collective's finish time, in seconds, independent of any schedule.

- ingress: a GPU must receive every chunk it needs through its in-links;
- cut: chunks that must enter a chassis (group) cross the links into it (for AllGather once per
  chunk, copies are made inside; for AlltoAll once per destination);
- latency: the alpha of the lowest-latency path between the farthest source/destination pair.
The largest is the floor a schedule is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from flowride.collectives.demand import Collective, Demand
from flowride.topology.model import Topology


@dataclass(frozen=True)
class Bounds:
    ingress_s: float
    cut_s: float
    latency_s: float

    @property
    def best_s(self) -> float:
        return max(self.ingress_s, self.cut_s, self.latency_s)

    @property
    def binding(self) -> str:
        return max((("ingress", self.ingress_s), ("cut", self.cut_s), ("latency", self.latency_s)), key=lambda t: t[1])[0]


def entering(demand: Demand, inside: frozenset[int]) -> int:
    """Chunks that must cross into ``inside`` (node set)."""
    n = 0
    for q in demand.commodities:
        if q.source in inside:
            continue
        k = sum(1 for d in q.dests if d in inside)
        if k:
            n += 1 if demand.collective is Collective.ALLGATHER else k
    return n


def lower_bounds(topo: Topology, demand: Demand) -> Bounds:
    cb = demand.chunk_bytes
    ingress = 0.0
    for g, need in demand.needs().items():
        bw = sum(topo.links[li].bytes_per_s for li in topo.in_links(g))
        ingress = max(ingress, need * cb / bw)
    cut = 0.0
    for s in topo.cut_sets():
        n = entering(demand, s)
        if n == 0:
            continue
        bw = sum(lk.bytes_per_s for lk in topo.links if lk.dst in s and lk.src not in s)
        cut = max(cut, n * cb / bw)
    src = np.array([lk.src for lk in topo.links])
    dst = np.array([lk.dst for lk in topo.links])
    w = np.array([lk.alpha_s for lk in topo.links]) + 1e-15
    A = dijkstra(sp.csr_matrix((w, (src, dst)), shape=(topo.num_nodes,) * 2), directed=True)
    lat = 0.0
    for q in demand.commodities:
        for d in q.dests:
            lat = max(lat, float(A[q.source, d]))
    return Bounds(ingress, cut, max(0.0, lat - 1e-12))


def algbw_GBps(size_bytes: float, seconds: float) -> float:
    """Algorithmic bandwidth: the output buffer over the finish time (decimal GB/s)."""
    return size_bytes / seconds / 1e9
