"""Every lower bound on a collective's finish, in seconds (what a schedule is measured against)
and in epochs (where the horizon searches start). Each is sound: no schedule beats it.

In seconds (:func:`lower_bounds`, one :class:`Bounds`):

- ingress: a GPU must receive every chunk it needs through its in-links;
- cut: chunks that must enter a chassis (group) cross the links into it (for AllGather once per
  chunk, copies are made inside; for AlltoAll once per destination);
- latency: the alpha of the lowest-latency path between the farthest source/destination pair;
- forest (AllGather, ReduceScatter, AllReduce): ForestColl's bound, the cut bound over *every*
  set of nodes rather than the declared chassis, found by max-flow (:func:`forest_bound`);
- flow (AlltoAll): the multi-commodity analogue, the time of the maximum concurrent flow (a static
  LP, :func:`flowride.synth.lp_static.flow_bound_s`), at least every cut bound, the bisection of a
  torus included.

The largest is the floor a schedule is measured against. Reducing collectives are bounded by
duality: a ReduceScatter run backwards in time is an AllGather on the reversed links (each
reduction becomes a copy), so its floor is the AllGather floor with in-links and out-links
swapped: every GPU must send its contribution to each other block out (egress), and each block
owned outside a group must leave the group once (cut). AllReduce is at least its ReduceScatter and
its AllGather (we take the larger; the sum is not a valid floor when the two phases overlap on
different links).

The forest bound. An AllGather must move every GPU's block into every set S of nodes that holds a
GPU: at least ``|GPUs outside S|`` blocks cross into S, whatever the schedule, so

    T >= (M/N) * max over S of |GPUs outside S| / (bandwidth entering S).

There are exponentially many S, but the largest ratio is found with max-flow (ForestColl, after
Edmonds' branching theorem): give a super source an edge of capacity x into every GPU and the
links their bandwidth; every cut separating the source from GPU v costs
``x * |GPUs inside S| + bandwidth into S``, which is at least ``N * x`` exactly when
``bandwidth into S >= x * |GPUs outside S|``. The largest x for which every GPU's max-flow reaches
``N * x`` is the best rate per root; the bound is (M/N) / x. Without switches it is also reached by
packing spanning out-trees (ForestColl; :mod:`flowride.synth.trees` builds trees in its spirit), so
on switchless topologies it is the bandwidth optimum; the epoch model adds latency and whole chunks
on top. x is found by Dinkelbach iteration: start from the ingress ratio, find a GPU whose min cut
is violated, move x to that cut's own ratio, repeat; each step strictly lowers x and there are
finitely many cuts, so it ends (in a handful of rounds in practice).

In epochs (:func:`epoch_lower_bound`, by kind): the latency of the farthest delivery, each GPU's
ingress and each chassis cut counted in whole chunks through each link's capacity window (with the
spread inside after the cut, :func:`cut_bound`), and the fluid floor (forest or flow) in epochs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, dijkstra, maximum_flow

from flowride.collectives.demand import Collective, Demand, make_demand
from flowride.synth.lp_static import flow_bound_s
from flowride.synth.reach import epoch_distances
from flowride.topology.model import Topology
from flowride.topology.timing import ALPHA_IGNORED_BELOW, EpochTiming, epoch_timing

# ---------------------------------------------------------------------------- in seconds


@dataclass(frozen=True)
class Bounds:
    ingress_s: float
    cut_s: float
    latency_s: float
    forest_s: float = 0.0  # ForestColl's max-flow bound over every cut (AllGather-like collectives)
    flow_s: float = 0.0  # the maximum concurrent flow's time (AlltoAll)
    cut_latency_s: float = 0.0  # bandwidth and latency together, over each GPU and each chassis (:func:`cut_latency_bound`)
    reduction_s: float = 0.0  # AllReduce where only GPUs reduce: 2(n-1) sends per element (:func:`reduction_bound_s`)

    def kinds(self) -> dict[str, float]:
        return {"ingress": self.ingress_s, "cut": self.cut_s, "latency": self.latency_s, "forest": self.forest_s,
                "flow": self.flow_s, "cut+latency": self.cut_latency_s, "reduction": self.reduction_s}

    @property
    def best_s(self) -> float:
        return max(self.kinds().values())

    @property
    def binding(self) -> str:
        k = self.kinds()
        return max(k, key=k.__getitem__)


def reduction_bound_s(topo: Topology, size_bytes: float) -> float:
    """AllReduce of ``size_bytes`` per GPU. Whoever reduces, every element of a GPU's buffer must
    leave it once (the others' sums need it) and reach it once (its sum needs theirs): the GPU's
    egress and ingress each carry ``size_bytes``. Where only GPUs reduce (no switch copies, so none
    reduces in the reversed schedule), each element's sum is first whole at some GPU, which takes
    n - 1 sends into it (partial sums along a tree), and every other GPU then needs one send made
    after that, n - 1 more: the GPUs send and receive 2(n-1) x ``size_bytes`` in all, however the
    work is spread (Patarasuk and Yuan's 2(n-1)/n per GPU where every GPU has the same links),
    bounded over the GPUs' egress and their ingress added up."""
    nodes = topo.nodes
    n = topo.buffer_ranks
    if n < 2:
        return 0.0
    gpus = list(topo.gpus)
    out = {g: 0.0 for g in gpus}
    into = {g: 0.0 for g in gpus}
    for lk in topo.links:
        if lk.src in out:
            out[lk.src] += lk.bytes_per_s
        if lk.dst in into:
            into[lk.dst] += lk.bytes_per_s
    if min(out.values()) <= 0 or min(into.values()) <= 0:
        return 0.0
    t = size_bytes / min(min(out.values()), min(into.values()))
    if n == len(gpus) and not any(nodes[w].copy for w in topo.switches):  # (TE-CCL's compat NDv2 keeps a GPU as a switch)
        t = max(t, 2 * (n - 1) * size_bytes / min(sum(out.values()), sum(into.values())))
    return t


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


def lower_bounds(topo: Topology, demand: Demand, time_limit: float | None = None, timing: EpochTiming | None = None) -> Bounds:
    """Every bound of the collective. ``time_limit`` caps the fluid bounds (forest, flow), which
    are anytime: cut short they stay sound, only weaker (:func:`forest_bound`,
    :func:`~flowride.synth.lp_static.flow_bound_s`); both are cached per topology. ``timing``
    (the schedules' epochs) adds :func:`cut_latency_bound`, which counts latency as the epoch
    model does."""
    if demand.collective is Collective.ALLREDUCE:
        rs = lower_bounds(topo, make_demand(topo, Collective.REDUCESCATTER, demand.size_bytes, demand.chunks), timing=timing)
        ag = lower_bounds(topo, make_demand(topo, Collective.ALLGATHER, demand.size_bytes, demand.chunks), timing=timing)
        return Bounds(max(rs.ingress_s, ag.ingress_s), max(rs.cut_s, ag.cut_s), max(rs.latency_s, ag.latency_s),
                      max(rs.forest_s, ag.forest_s), 0.0, max(rs.cut_latency_s, ag.cut_latency_s),
                      reduction_bound_s(topo, demand.size_bytes))
    if demand.collective is Collective.REDUCESCATTER:
        b = _reduce_scatter_bounds(topo, demand)
        if timing is not None:
            rev = topo.reversed()
            ag = make_demand(rev, Collective.ALLGATHER, demand.size_bytes, demand.chunks)
            b = replace(b, cut_latency_s=cut_latency_bound(rev, ag, epoch_timing(rev, ag.chunk_bytes, timing.tau)))
        return b
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
        flow = flow_bound_s(topo, demand.chunk_bytes * demand.chunks, time_limit)
    cl = cut_latency_bound(topo, demand, timing) if timing is not None else 0.0
    return Bounds(ingress, cut, max(0.0, lat - 1e-12), forest, flow, cl)


def cut_latency_bound(topo: Topology, demand: Demand, timing: EpochTiming) -> float:
    """Bandwidth and latency together: for a set S (each GPU alone, and each chassis), a byte that
    GPU g in S needs from outside crosses some link l into S no earlier than the latency from the
    nearest outside GPU to l's tail (a_l), arrives alpha_l later, and reaches g after the latency
    from l's head to g; by time T link l has delivered at most B_l (T - a_l - alpha_l - d(head, g))
    of those bytes. So T is at least the T at which these sums reach what g needs from outside
    (per GPU for AlltoAll, whose bytes are distinct, also summed over S with d = 0).

    Latencies count as the epoch model counts them: a link whose alpha is at most a tenth of an
    epoch costs no epoch there, so it counts 0 here; and one epoch is taken off for whole-chunk
    rounding. AllGather and AlltoAll (ReduceScatter: the AllGather on the reversed links)."""
    if demand.collective.reduces or topo.teccl_compat:  # the published model's switch hops skip beta: no fluid count
        return 0.0
    gpus = list(topo.gpus)
    alpha = np.array([0.0 if lk.alpha_s / timing.tau <= ALPHA_IGNORED_BELOW else lk.alpha_s for lk in topo.links])
    src, dst = topo.link_ends
    n = topo.num_nodes
    A = dijkstra(sp.csr_matrix((alpha + 1e-15, (src, dst)), shape=(n, n)), directed=True)
    bw = np.array([lk.bytes_per_s for lk in topo.links])
    block = demand.chunk_bytes * demand.chunks
    sets = [frozenset([g]) for g in gpus] + [s for s in topo.cut_sets() if any(g in s for g in gpus)]
    best = 0.0
    gpu_arr = np.array(gpus)
    for S in sets:
        inside = np.zeros(n, dtype=bool)
        inside[list(S)] = True
        into = np.flatnonzero(inside[dst] & ~inside[src])
        outside = gpu_arr[~inside[gpu_arr]]
        if not into.size or not outside.size:
            continue
        a = A[np.ix_(outside, src[into])].min(axis=0) + alpha[into]  # earliest arrival at each head
        members = [g for g in gpus if inside[g]]
        per_gpu = len(outside) * block  # AllGather: every outside block; AlltoAll: one block from each outside GPU
        for g in members:
            best = max(best, _fill_time(per_gpu, bw[into], a + A[dst[into], g]))
        if demand.collective is Collective.ALLTOALL and len(members) > 1:
            best = max(best, _fill_time(per_gpu * len(members), bw[into], a))
    return max(0.0, best - timing.tau)


def _fill_time(volume: float, rate: np.ndarray, start: np.ndarray) -> float:
    """The T at which sum(rate * max(0, T - start)) reaches ``volume``."""
    ok = np.isfinite(start)
    order = np.argsort(start[ok])
    r, c = rate[ok][order], start[ok][order]
    cr, crc = np.cumsum(r), np.cumsum(r * c)
    for k in range(len(r)):
        t = (volume + crc[k]) / cr[k]
        if k + 1 == len(r) or t <= c[k + 1]:
            return float(max(t, c[k]))
    return float("inf")


def _forest_s(topo: Topology, demand: Demand, reverse: bool, time_limit: float | None = None) -> float:
    """ForestColl's bound for the whole block of each GPU, less a hair so a schedule that meets
    it exactly is not reported below its floor by rounding."""
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


# ---------------------------------------------------------------------------- forest (max-flow)


_REL = 1e-9


@dataclass(frozen=True)
class ForestBound:
    rate_Bps: float  # x: bytes/s each GPU's block can spread at, the same for every root
    cut: frozenset[int]  # the binding set S (sink side), nodes of the topology
    gpus_outside: int
    bandwidth_in_Bps: float
    rounds: int
    complete: bool = True  # False: cut short by its time limit (still sound, maybe weaker)

    def seconds(self, block_bytes: float) -> float:
        """Finish-time floor for blocks of ``block_bytes`` (AllGather: output / ranks)."""
        return block_bytes / self.rate_Bps


_FOREST_CACHE: dict[tuple, ForestBound] = {}


FOREST_SECONDS = 20.0  # the bound's own cap: on a 1024-GPU torus a round is ~1k max-flows


def forest_bound(topo: Topology, reverse: bool = False, time_limit: float | None = None) -> ForestBound:
    """The best common per-root rate of an AllGather on ``topo`` (``reverse``: on its reversed
    links, i.e. the ReduceScatter floor). Cached per link set: every report asks for it.

    Anytime: every x the iteration holds is the ratio of a real cut, so stopping early (after
    ``time_limit`` seconds, at most FOREST_SECONDS) still gives a sound, if weaker, bound; such a
    result says ``complete=False`` and is not cached."""
    key = (topo.gpus, tuple((lk.src, lk.dst, lk.bytes_per_s) for lk in topo.links), reverse)
    if key in _FOREST_CACHE:
        return _FOREST_CACHE[key]
    budget = FOREST_SECONDS if time_limit is None else min(FOREST_SECONDS, time_limit)
    out = _forest_bound(topo, reverse, time.perf_counter() + budget)
    if out.complete:
        if len(_FOREST_CACHE) > 64:
            _FOREST_CACHE.clear()
        _FOREST_CACHE[key] = out
    return out


_SCALE_TOTAL = 2.0**28  # integer capacities for scipy's max-flow: the whole graph's within int32


_VIOLATION = 1e-4  # relative shortfall of a max-flow that counts as a violated cut (integer rounding)


def _forest_bound(topo: Topology, reverse: bool, deadline: float) -> ForestBound:
    gpus = np.array(topo.gpus, dtype=np.int64)
    n, N = len(gpus), topo.num_nodes
    tail, head = topo.link_ends
    if reverse:
        tail, head = head, tail
    cap = np.array([lk.bytes_per_s for lk in topo.links], dtype=float)
    into = np.bincount(head, weights=cap, minlength=N)
    best = int(gpus[np.argmin(into[gpus])])
    x = into[best] / (n - 1)
    binding = (frozenset([best]), n - 1, float(into[best]))
    scale = _SCALE_TOTAL / max(cap.sum(), n * x)
    link_cap = np.floor(cap * scale).astype(np.int32)  # rounding down only weakens a test, never the bound
    rows = np.concatenate([tail, np.full(n, N)])  # node N: the super source
    cols = np.concatenate([head, gpus])
    rounds, complete = 0, True
    while complete:
        rounds += 1
        xi = int(np.floor(x * scale))
        C = sp.csr_matrix((np.concatenate([link_cap, np.full(n, xi, dtype=np.int32)]), (rows, cols)), shape=(N + 1, N + 1))
        C.sum_duplicates()
        worst = None
        for v in gpus:
            if time.perf_counter() > deadline:
                complete = False
                break
            res = maximum_flow(C, N, int(v))
            if res.flow_value >= n * xi * (1 - _VIOLATION):
                continue
            resid = (C - res.flow).tocsr()
            resid.data[resid.data < 0] = 0
            resid.eliminate_zeros()
            sink_side = np.ones(N + 1, dtype=bool)
            sink_side[breadth_first_order(resid, N, directed=True, return_predecessors=False)] = False
            inside = sink_side[:N]
            outside_gpus = n - int(inside[gpus].sum())
            if outside_gpus == 0:
                continue
            bw_in = float(cap[inside[head] & ~inside[tail]].sum())  # exact, from the real capacities
            ratio = bw_in / outside_gpus
            if worst is None or ratio < worst[0]:
                worst = (ratio, frozenset(np.flatnonzero(inside).tolist()), outside_gpus, bw_in)
        if worst is None or worst[0] >= x * (1 - _REL):
            break
        x = worst[0]
        binding = worst[1:]
    return ForestBound(float(x), binding[0], binding[1], binding[2], rounds, complete)


# ---------------------------------------------------------------------------- in epochs


def _arrivals(timing: EpochTiming, links: np.ndarray, A: np.ndarray, T: np.ndarray) -> np.ndarray:
    """Most chunks that can arrive over all of ``links`` together with arrival epoch in [A, T],
    for each (A, T) pair: each link starts chunks from epoch ``first`` on (1 behind a switch: it
    forwards only what arrived), at most window_cap per b + 1 epochs, and delivers d later."""
    first = timing.src_is_switch[links].astype(np.int64)[None, :]
    d = timing.hop_delay[links].astype(np.int64)[None, :]
    b = timing.beta_epochs[links].astype(np.int64)[None, :]
    cap = timing.window_cap[links].astype(np.int64)[None, :]
    n = T[:, None] - d - np.maximum(A[:, None] - d, first) + 1
    per = -(-np.maximum(n, 0) // (b + 1)) * cap
    return per.sum(axis=1)


def _last_entry_epoch(links: list[int], releases: np.ndarray, timing: EpochTiming) -> int:
    """Earliest epoch by which all chunks with the given earliest arrivals can have crossed
    ``links``: for every threshold A, the chunks that cannot arrive before A must fit the
    arrival slots in [A, T]. Vectorized over thresholds, binary search on T (arrivals grow with T)."""
    releases = np.asarray(releases, dtype=np.int64)
    if releases.size == 0:
        return 0
    lk = np.asarray(links, dtype=np.int64)
    A, counts = np.unique(releases, return_counts=True)
    later = counts[::-1].cumsum()[::-1]  # chunks released at A or after
    T0 = int(A[-1])
    capsum = int(timing.window_cap[lk].sum())
    span = int(timing.hop_delay[lk].max()) + 1 + int(timing.beta_epochs[lk].max() + 1) * (-(-int(later[0]) // max(capsum, 1)) + 1)
    lo = np.full(A.shape, T0, dtype=np.int64)  # smallest T that may do, per threshold
    hi = np.full(A.shape, T0 + span, dtype=np.int64)  # a T that does (shown in the docstring's count)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        ok = _arrivals(timing, lk, A, mid) >= later
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid + 1)
    return int(hi.max())


class DemandIncidence:
    """The demand as arrays, built once per bound: each commodity's source and its destinations
    (a sparse commodity x node incidence), so a cut's entering chunks are a few numpy ops."""

    def __init__(self, topo: Topology, demand: Demand):
        self.source = np.array([q.source for q in demand.commodities], dtype=np.int64)
        lens = np.array([len(q.dests) for q in demand.commodities], dtype=np.int64)
        cols = np.fromiter((d for q in demand.commodities for d in q.dests), dtype=np.int64, count=int(lens.sum()))
        rows = np.repeat(np.arange(len(lens)), lens)
        self.M = sp.csc_matrix((np.ones(len(cols), dtype=np.int64), (rows, cols)), shape=(len(lens), topo.num_nodes))


def cut_bound(topo: Topology, demand: Demand, timing: EpochTiming, D: np.ndarray, inside: set[int],
              needs: DemandIncidence | None = None) -> int:
    """Epochs needed to bring every chunk that must enter ``inside`` across its boundary, plus the
    epochs the last one then needs to reach every GPU inside that wants it (from the entry point
    nearest to each)."""
    into = [i for i, lk in enumerate(topo.links) if lk.dst in inside and lk.src not in inside]
    if not into:
        return 0
    nd = needs or DemandIncidence(topo, demand)
    tails = np.array([topo.links[i].src for i in into])
    heads = sorted({topo.links[i].dst for i in into})
    ins = np.array(sorted(inside), dtype=np.int64)
    MI = nd.M[:, ins]  # commodity x inside node
    per_q = np.asarray(MI.sum(axis=1)).ravel()
    outside = ~np.isin(nd.source, ins)
    q = np.flatnonzero(outside & (per_q > 0))
    if q.size == 0:
        return 0
    rho = (D[:, tails] + timing.hop_delay[into][None, :]).min(axis=1)[nd.source[q]].astype(np.int64)
    # after its first entry a chunk still has to reach every destination inside, from the
    # nearest entry point (copies may cross several boundary links)
    E = D[np.ix_(heads, ins)].min(axis=0).astype(np.int64)  # per inside node
    sub = MI[q].tocsr()
    rows = np.repeat(np.arange(len(q)), np.diff(sub.indptr))
    dist = E[sub.indices]
    if demand.collective is Collective.ALLGATHER:
        releases = rho  # one copy must enter; more may, through other links
        need = np.full(len(q), np.iinfo(np.int64).min)
        np.maximum.at(need, rows, dist)
    else:
        releases = np.repeat(rho, per_q[q])
        need = np.full(len(q), np.iinfo(np.int64).max)
        np.minimum.at(need, rows, dist)
    return _last_entry_epoch(into, releases, timing) + int(need.min())


def epoch_lower_bound(topo: Topology, demand: Demand, timing: EpochTiming, D: np.ndarray | None = None,
                      time_limit: float | None = None) -> dict[str, int]:
    """Sound lower bounds on the epochs any schedule needs, by kind: the latency of the farthest
    delivery, each GPU's ingress, each chassis cut (with the spread inside after the cut), and
    the fluid floor over every cut (forest or flow). ``time_limit`` caps the static LP of the flow
    bound (see :func:`flowride.synth.lp_static.concurrent_flow`)."""
    if D is None:
        D = epoch_distances(topo, timing)
    needs = DemandIncidence(topo, demand)
    coo = needs.M.tocoo()
    lat = int(D[needs.source[coo.row], coo.col].max())
    ingress = max(cut_bound(topo, demand, timing, D, {int(g)}, needs) for g in np.flatnonzero(needs.M.getnnz(axis=0)))
    cut = max((cut_bound(topo, demand, timing, D, set(inside), needs) for inside in topo.cut_sets()), default=0)
    out = {"latency": lat, "ingress": ingress, "cut": cut}
    if not topo.teccl_compat and not demand.collective.reduces:
        # ForestColl's cut over every node set (AllGather), the maximum concurrent flow (AlltoAll).
        # A send must arrive by T, so a link starts chunks in at most T - a + 1 epochs, at most
        # window_cap per b + 1 of them: it carries at most (T + 1) * cap chunks, and (T + 1) * tau
        # is at least the fluid floor. (The TE-CCL compat model lets switch -> GPU hops skip beta,
        # which breaks that count: no such bound there.)
        block = demand.chunk_bytes * demand.chunks
        if demand.collective.multicast:
            kind, fluid = "forest", forest_bound(topo, time_limit=time_limit).seconds(block)
        else:
            kind, fluid = "flow", flow_bound_s(topo, block, time_limit)
        out[kind] = max(0, int(math.ceil(fluid / timing.tau - 1e-6)) - 1)
    return out
