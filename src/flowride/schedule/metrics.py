"""Lower bounds on a collective's finish time, in seconds, independent of any schedule.

- ingress: a GPU must receive every chunk it needs through its in-links;
- cut: chunks that must enter a chassis (group) cross the links into it (for AllGather once per
  chunk, copies are made inside; for AlltoAll once per destination);
- latency: the alpha of the lowest-latency path between the farthest source/destination pair;
- forest (AllGather, ReduceScatter, AllReduce): ForestColl's bound, the cut bound over *every*
  set of nodes rather than the declared chassis, found by max-flow (:mod:`flowride.synth.trees`);
- flow (AlltoAll): the multi-commodity analogue, the time of the maximum concurrent flow (a static
  LP, :mod:`flowride.synth.lp_static`), at least every cut bound, the bisection of a torus included.
The largest is the floor a schedule is measured against.

Reducing collectives are bounded by duality: a ReduceScatter run backwards in time is an AllGather
on the reversed links (each reduction becomes a copy), so its floor is the AllGather floor with
in-links and out-links swapped: every GPU must send its contribution to each other block out
(egress), and each block owned outside a group must leave the group once (cut). AllReduce is at
least its ReduceScatter and its AllGather (we take the larger; the sum is not a valid floor when the
two phases overlap on different links).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from flowride.collectives.demand import Collective, Demand, make_demand
from flowride.topology.model import Topology


@dataclass(frozen=True)
class Bounds:
    ingress_s: float
    cut_s: float
    latency_s: float
    forest_s: float = 0.0  # ForestColl's max-flow bound over every cut (AllGather-like collectives)
    flow_s: float = 0.0  # the maximum concurrent flow's time (AlltoAll)

    def kinds(self) -> dict[str, float]:
        return {"ingress": self.ingress_s, "cut": self.cut_s, "latency": self.latency_s, "forest": self.forest_s,
                "flow": self.flow_s}

    @property
    def best_s(self) -> float:
        return max(self.kinds().values())

    @property
    def binding(self) -> str:
        k = self.kinds()
        return max(k, key=k.__getitem__)


def entering(demand: Demand, inside: frozenset[int]) -> int:
    """Chunks that must cross into ``inside`` (node set)."""
    n = 0
    for q in demand.commodities:
        if q.source in inside:
            continue
        k = sum(1 for d in q.dests if d in inside)
        if k:
            n += 1 if demand.collective.multicast else k
    return n


def lower_bounds(topo: Topology, demand: Demand, time_limit: float | None = None) -> Bounds:
    """Every bound of the collective. ``time_limit`` caps the fluid bounds (forest, flow), which
    are anytime: cut short they stay sound, only weaker (:func:`~flowride.synth.trees.forest_bound`,
    :func:`~flowride.synth.lp_static.flow_bound_s`); both are cached per topology."""
    if demand.collective is Collective.ALLREDUCE:
        rs = lower_bounds(topo, make_demand(topo, Collective.REDUCESCATTER, demand.size_bytes, demand.chunks))
        ag = lower_bounds(topo, make_demand(topo, Collective.ALLGATHER, demand.size_bytes, demand.chunks))
        return Bounds(max(rs.ingress_s, ag.ingress_s), max(rs.cut_s, ag.cut_s), max(rs.latency_s, ag.latency_s),
                      max(rs.forest_s, ag.forest_s))
    if demand.collective is Collective.REDUCESCATTER:
        return _reduce_scatter_bounds(topo, demand)
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
    A = _alpha_distances(topo)
    lat = 0.0
    for q in demand.commodities:
        for d in q.dests:
            lat = max(lat, float(A[q.source, d]))
    forest = flow = 0.0
    if demand.collective.multicast:
        forest = _forest_s(topo, demand, reverse=False, time_limit=time_limit)
    elif demand.collective is Collective.ALLTOALL:
        from flowride.synth.lp_static import flow_bound_s

        flow = flow_bound_s(topo, demand.chunk_bytes * demand.chunks, time_limit)
    return Bounds(ingress, cut, max(0.0, lat - 1e-12), forest, flow)


def _forest_s(topo: Topology, demand: Demand, reverse: bool, time_limit: float | None = None) -> float:
    """ForestColl's bound for the whole block of each GPU, less a hair so a schedule that meets
    it exactly is not reported below its floor by rounding."""
    from flowride.synth.trees import forest_bound

    return max(0.0, forest_bound(topo, reverse, time_limit).seconds(demand.chunk_bytes * demand.chunks) * (1 - 1e-9))


def _alpha_distances(topo: Topology) -> np.ndarray:
    src, dst = topo.link_ends
    w = np.array([lk.alpha_s for lk in topo.links]) + 1e-15
    return dijkstra(sp.csr_matrix((w, (src, dst)), shape=(topo.num_nodes,) * 2), directed=True)


def _reduce_scatter_bounds(topo: Topology, demand: Demand) -> Bounds:
    """The AllGather bounds on the reversed links: egress, cut leaving a group, latency to the owner."""
    cb = demand.chunk_bytes
    gpus = topo.gpus
    blocks = len(gpus) - 1
    egress = 0.0
    for g in gpus:
        bw = sum(topo.links[li].bytes_per_s for li in topo.out_links(g))
        egress = max(egress, blocks * demand.chunks * cb / bw)
    cut = 0.0
    for s in topo.cut_sets():
        if not any(g in s for g in gpus):
            continue
        n = sum(1 for q in demand.commodities if q.source not in s)
        if n == 0:
            continue
        bw = sum(lk.bytes_per_s for lk in topo.links if lk.src in s and lk.dst not in s)
        cut = max(cut, n * cb / bw)
    A = _alpha_distances(topo)
    lat = max((float(A[g, q.source]) for q in demand.commodities for g in gpus if g != q.source), default=0.0)
    return Bounds(egress, cut, max(0.0, lat - 1e-12), _forest_s(topo, demand, reverse=True))


def algbw_GBps(size_bytes: float, seconds: float) -> float:
    """Algorithmic bandwidth: the output buffer over the finish time (decimal GB/s)."""
    return size_bytes / seconds / 1e9
