"""The static LP for copy-free demands too large to expand in time: a max-concurrent flow.

The time-expanded LP (:mod:`flowride.synth.lp`) has a column per (source, link, epoch). On a
256-GPU torus an AlltoAll spans hundreds of epochs and even the coarsest epochs leave millions of
columns (every source's data still needs the diameter's worth of epochs). Bandwidth, not timing,
decides such instances, so this form drops time altogether: one commodity per source, a flow
``f[s, l] >= 0`` (GB) on every link for one GB per (source, destination) pair, and the time
``theta`` (seconds) it takes:

- :func:`flow_conserved_at_every_node`: what enters a node for source s leaves it, except at a
  GPU that needs s's data, which keeps exactly its need (the source supplies the sum);
- :func:`links_carry_their_rate`: over theta seconds a link carries at most ``cap * theta`` GB:
  ``sum_s f[s, l] - cap_l * theta <= 0``;
- objective: the smallest theta, plus a tiny cost per GB per hop so no flow wanders.

theta is a sound floor for any AlltoAll schedule (the multi-commodity analogue of ForestColl's
cut bound, and at least every cut bound): averaged over its finish time, any schedule is a
concurrent flow, which needs at least theta per GB. Flows and theta scale with the bytes per
pair, so one solve per topology (:func:`concurrent_flow`, cached) gives the bound of every size
(:mod:`flowride.synth.bounds`) and the paths of the method: the flow is split into paths per
(source, destination) (:func:`decompose_static`) and list-scheduled at the caller's epochs by
:func:`flowride.synth.flow.schedule_paths`, in rounds of increasing ring offset (as the direct
AlltoAll) so every link is fed from the start.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from flowride.collectives.demand import Demand
from flowride.synth.flow import FLOW_EPS, FlowPath, unicast_needs
from flowride.synth.highs import MipModel, SolveOptions, solve
from flowride.topology.model import Topology


def flow_conserved_at_every_node(topo: Topology, need: np.ndarray, f_s: np.ndarray, f_l: np.ndarray,
                                 sources: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows (s, v): inflow - outflow of s's data at node v = need[s, v] (the source: minus its
    whole supply). Returns COO (rows, cols, vals) and the right-hand sides."""
    S, N = need.shape
    l_src, l_dst = topo.link_ends
    col = np.arange(len(f_s))
    rows = np.concatenate([f_s * N + l_dst[f_l], f_s * N + l_src[f_l]])
    vals = np.concatenate([np.ones(len(f_s)), -np.ones(len(f_s))])
    rhs = need.astype(np.float64).copy()
    rhs[np.arange(S), sources] = -need.sum(axis=1)
    return rows, np.concatenate([col, col]), vals, rhs.ravel()


def links_carry_their_rate(cap: np.ndarray, f_l: np.ndarray, theta_col: int, row0: int, nlinks: int):
    """Rows l: sum_s f[s, l] - cap_l * theta <= 0 (over theta seconds a link carries at most
    cap_l * theta GB)."""
    rows = np.concatenate([row0 + f_l, row0 + np.arange(nlinks)])
    cols = np.concatenate([np.arange(len(f_l)), np.full(nlinks, theta_col)])
    vals = np.concatenate([np.ones(len(f_l)), -np.asarray(cap, dtype=np.float64)])
    return rows, cols, vals


@dataclass(frozen=True)
class ConcurrentFlow:
    """The static LP of the uniform AlltoAll on a topology, for one GB per (source, destination)
    pair: its time and flows. Both scale with the bytes per pair, so one solve serves every size
    and chunk count (the bound and the method share it)."""

    seconds_per_GB: float  # theta: fluid finish time per GB each source sends each destination
    sources: np.ndarray
    need: np.ndarray  # [S, N], 1 where the node needs the source's data
    f_s: np.ndarray
    f_l: np.ndarray
    flow: np.ndarray  # GB per flow column
    status: str
    seconds: float  # solver time

    def finish_s(self, pair_bytes: float) -> float:
        """The fluid floor of an AlltoAll that moves ``pair_bytes`` per pair, less what the hop
        cost may have added to theta (1e-6 of it) and a margin for the solver's tolerance."""
        return self.seconds_per_GB * (1 - 1e-5) * pair_bytes / 1e9


def build_static(topo: Topology) -> tuple[MipModel, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The static LP of the uniform AlltoAll (1 GB per pair, capacities in GB/s) as one bulk
    model. Returns (model, sources, need, f_s, f_l); the last column is theta in seconds."""
    gpus = np.array(topo.gpus, dtype=np.int64)
    N = topo.num_nodes
    need = np.zeros((len(gpus), N), dtype=np.int64)
    need[:, gpus] = 1
    need[np.arange(len(gpus)), gpus] = 0
    sources = gpus
    S = len(gpus)
    l_src, l_dst = topo.link_ends
    L = len(l_src)
    ok = l_dst[None, :] != sources[:, None]  # a source's data never needs to enter the source again
    f_s, f_l = np.nonzero(ok)
    nf = len(f_s)
    r1, c1, v1, rhs = flow_conserved_at_every_node(topo, need, f_s, f_l, sources)
    r2, c2, v2 = links_carry_their_rate(np.array([lk.bandwidth_GBps for lk in topo.links]), f_l, nf, S * N, L)
    A = sp.csc_matrix((np.concatenate([v1, v2]), (np.concatenate([r1, r2]), np.concatenate([c1, c2]))),
                      shape=(S * N + L, nf + 1))
    # A tiny cost per GB per hop keeps flows on short paths. An optimal flow has no cycles, so no
    # unit crosses more than N - 1 links: the hops together then weigh at most 1e-6 of the
    # ingress floor (a lower bound on theta), which is all they can move theta by.
    bw = np.array([lk.bandwidth_GBps for lk in topo.links])
    ingress = max((S - 1) / bw[l_dst == g].sum() for g in gpus.tolist())
    hop = 1e-6 * ingress / (float(need.sum()) * max(1, N - 1))
    model = MipModel(
        cost=np.concatenate([np.full(nf, hop), [1.0]]),
        lb=np.zeros(nf + 1),
        ub=np.full(nf + 1, np.inf),
        integer=np.zeros(nf + 1, dtype=bool),
        A=A,
        row_lo=np.concatenate([rhs, np.full(L, -np.inf)]),
        row_hi=np.concatenate([rhs, np.zeros(L)]),
        row_names={"flow_conserved_at_every_node": (0, S * N), "links_carry_their_rate": (S * N, S * N + L)},
    )
    return model, sources, need, f_s, f_l


def _link_key(topo: Topology) -> tuple:
    """What the static LPs and bounds of a topology depend on (the caches' key). Latency is in
    it because the orbit search matches links by bandwidth and alpha."""
    return topo.gpus, topo.num_nodes, tuple((lk.src, lk.dst, lk.bandwidth_GBps, lk.alpha_s) for lk in topo.links)


_CACHE: dict[tuple, tuple[ConcurrentFlow, float | None]] = {}  # key -> (result, time limit it had)


def concurrent_flow(topo: Topology, time_limit: float | None = None) -> ConcurrentFlow:
    """The static LP of ``topo``'s uniform AlltoAll, solved once per link set (interior point:
    simplex needs minutes on a 256-GPU torus where IPM needs half a minute). A solve cut short
    by ``time_limit`` comes back with status other than "optimal" and theta 0 (no bound); it is
    tried again only when a later call allows more time."""
    key = _link_key(topo)
    if key in _CACHE:
        out, limit = _CACHE[key]
        if out.status == "optimal" or (limit is not None and time_limit is not None and time_limit <= limit):
            return out
    model, sources, need, f_s, f_l = build_static(topo)
    res = solve(model, SolveOptions(time_limit=time_limit, solver="ipm"))
    ok = res.status == "optimal" and res.x is not None
    out = ConcurrentFlow(float(res.x[-1]) if ok else 0.0, sources, need, f_s, f_l,
                         res.x[:-1] if ok else np.zeros(len(f_s)), res.status, res.seconds)
    if len(_CACHE) > 16:
        _CACHE.clear()
    _CACHE[key] = (out, time_limit)
    return out


def static_paths(topo: Topology, demand: Demand, cf: ConcurrentFlow) -> list[FlowPath]:
    """The concurrent flow scaled to ``demand``'s chunks per pair and split into paths."""
    sources, need = unicast_needs(topo, demand)
    if not (np.array_equal(sources, cf.sources) and (need == need.max() * cf.need).all()):
        raise ValueError("the static LP is solved for the uniform AlltoAll")
    k = float(need.max())
    return decompose_static(topo, cf.sources, need, cf.f_s, cf.f_l, cf.flow * k)


def decompose_static(topo: Topology, sources: np.ndarray, need: np.ndarray, f_s: np.ndarray, f_l: np.ndarray,
                     flow: np.ndarray) -> list[FlowPath]:
    """Flow decomposition per source: walk from the source along the fattest arc with flow left
    until a GPU whose need is not yet covered, take the bottleneck (at most that need) off the
    walk; a walk that comes back to a node it passed closes a cycle, whose flow is only cancelled.
    Each path's hops carry ``(link, round + hop index)``: round = the destination's ring offset from
    the source, so scheduling pieces in that order feeds every link from the first epoch."""
    l_src, l_dst = topo.link_ends
    gpus = list(topo.gpus)
    pos = {g: i for i, g in enumerate(gpus)}
    n = len(gpus)
    paths: list[FlowPath] = []
    for si, s in enumerate(sources.tolist()):
        sel = np.flatnonzero((f_s == si) & (flow > FLOW_EPS))
        rem = dict(zip(f_l[sel].tolist(), flow[sel].tolist(), strict=True))
        out: dict[int, list[int]] = defaultdict(list)
        for li in rem:
            out[int(l_src[li])].append(li)
        left = {int(v): float(need[si, v]) for v in np.flatnonzero(need[si])}
        while any(x > FLOW_EPS for x in left.values()):
            node, arcs, seen = s, [], {s: 0}
            while True:
                cand = [li for li in out.get(node, ()) if rem[li] > FLOW_EPS]
                if not cand:
                    break
                li = max(cand, key=rem.__getitem__)
                arcs.append(li)
                node = int(l_dst[li])
                if node in seen:  # a cycle: cancel it and walk on from where it began
                    cyc = arcs[seen[node]:]
                    amt = min(rem[a] for a in cyc)
                    for a in cyc:
                        rem[a] -= amt
                    arcs = arcs[: seen[node]]
                    seen = {v: i for v, i in seen.items() if i <= seen[node]}
                    continue
                seen[node] = len(arcs)
                if left.get(node, 0.0) > FLOW_EPS:
                    break
            if not arcs or left.get(node, 0.0) <= FLOW_EPS:
                break  # only solver noise is left
            amt = min(min(rem[a] for a in arcs), left[node])
            for a in arcs:
                rem[a] -= amt
            left[node] -= amt
            r = (pos[node] - pos[s]) % n
            paths.append(FlowPath(s, node, amt, [(li, r + i) for i, li in enumerate(arcs)]))
    return paths


@dataclass(frozen=True)
class DualFlowBound:
    """A sound floor on theta (seconds per GB per pair) from link lengths, found without the LP.

    Weak duality of the concurrent flow: for any lengths w >= 0 on the links, each pair's GB
    crosses links of total w-length at least its w-shortest distance, and link l carries at most
    cap_l * theta GB, so ``theta >= sum over pairs of dist_w / sum_l cap_l w_l``. Lengths are
    improved by multiplicative weights (Garg-Koenemann): route every pair on its shortest path,
    lengthen each link by its relative load, repeat; every iterate's bound is sound, the best is
    kept. ``primal_s_per_GB`` is theta of the averaged routing (an upper end: the gap between the
    two says how close the floor is)."""

    seconds_per_GB: float
    primal_s_per_GB: float
    iterations: int
    seconds: float

    def finish_s(self, pair_bytes: float) -> float:
        return self.seconds_per_GB * (1 - 1e-9) * pair_bytes / 1e9


DUAL_SECONDS = 10.0  # the dual bound's cap: each iteration is one Dijkstra per GPU
DUAL_ITERATIONS = 1000
DUAL_STEP = 0.1  # 0.3 and 1.0 stalled at 0.95 and 0.85 of the LP on an 8x16 torus; 0.1 reached 0.98


def dual_flow_bound(topo: Topology, time_limit: float | None = None,
                    iterations: int = DUAL_ITERATIONS) -> DualFlowBound:
    """:class:`DualFlowBound` of the uniform AlltoAll, within ``time_limit`` (at most
    DUAL_SECONDS). Parallel links between two nodes are one edge with their summed capacity."""
    import time

    from scipy.sparse.csgraph import dijkstra

    t0 = time.perf_counter()
    budget = DUAL_SECONDS if time_limit is None else min(DUAL_SECONDS, time_limit)
    N = topo.num_nodes
    l_src, l_dst = topo.link_ends
    key = l_src * N + l_dst
    edges, inv = np.unique(key, return_inverse=True)  # one edge per (tail, head)
    cap = np.bincount(inv, weights=[lk.bandwidth_GBps for lk in topo.links])  # GB/s
    eu, ev = edges // N, edges % N
    gpus = np.array(topo.gpus, dtype=np.int64)
    w = 1.0 / cap  # start: lengths inverse to capacity
    best, avg_load, it = 0.0, np.zeros(len(edges)), 0
    while it < iterations and (it == 0 or time.perf_counter() - t0 < budget):
        it += 1
        w = w / (cap * w).sum()  # normalise: sum cap * w = 1
        G = sp.csr_matrix((w, (eu, ev)), shape=(N, N))
        dist, pred = dijkstra(G, directed=True, indices=gpus, return_predecessors=True)
        dg = dist[:, gpus]
        total = float(dg[np.isfinite(dg)].sum())
        best = max(best, total)  # theta >= total / sum(cap * w) = total
        load = _tree_loads(pred, gpus, eu, ev, edges, N)
        avg_load += (load - avg_load) / it
        rel = load / cap
        if rel.max() <= 0:
            break
        w = w * np.exp(DUAL_STEP * rel / rel.max())
    primal = float((avg_load / cap).max())
    return DualFlowBound(best, primal, it, time.perf_counter() - t0)


def _tree_loads(pred: np.ndarray, gpus: np.ndarray, eu: np.ndarray, ev: np.ndarray, edges: np.ndarray,
                N: int) -> np.ndarray:
    """GB on each edge when every source sends 1 GB to every other GPU along its shortest-path
    tree (``pred`` from Dijkstra, one row per source): an edge into v carries v's subtree's GPUs.
    Vectorised over sources: nodes are folded into their parents deepest first."""
    S = len(gpus)
    count = np.zeros((S, N))
    count[:, gpus] = 1.0
    count[np.arange(S), gpus] = 0.0
    depth = np.zeros((S, N), dtype=np.int64)
    has = pred >= 0
    rows, cols = np.nonzero(has)
    for _ in range(N):  # depth by pointer chasing: at most the longest path
        new = np.zeros_like(depth)
        new[rows, cols] = depth[rows, pred[rows, cols]] + 1
        if np.array_equal(new, depth):
            break
        depth = new
    load = np.zeros(len(edges))
    order = np.argsort(-depth[rows, cols], kind="stable")
    rows, cols = rows[order], cols[order]
    dep = depth[rows, cols]
    bounds = np.flatnonzero(np.diff(dep)) + 1
    for r, c in zip(np.split(rows, bounds), np.split(cols, bounds), strict=True):
        p = pred[r, c]
        np.add.at(count, (r, p), count[r, c])
        idx = np.searchsorted(edges, p * N + c)
        np.add.at(load, idx, count[r, c])
    return load


STATIC_BOUND_COLUMNS = 300_000  # the static LP is solved for the bound itself only below this
_DUAL_CACHE: dict[tuple, DualFlowBound] = {}


_SYM_CACHE: dict[tuple, SymmetricFlow | None] = {}
SYMMETRIC_MAX_COLUMNS = 1_200_000  # more representatives than this allows: too little symmetry


def symmetric_flow(topo: Topology, time_limit: float | None = None) -> SymmetricFlow | None:
    """The orbits (at most a quarter of ``time_limit``, 60 s) and the symmetric static LP of a
    topology, cached per link set (the bound and the method share it); None without symmetry."""
    from flowride.synth.symmetry import gpu_orbits

    key = _link_key(topo)
    if key not in _SYM_CACHE:
        import time

        t0 = time.perf_counter()
        orbits = gpu_orbits(topo, 60.0 if time_limit is None else min(60.0, time_limit / 4))
        if orbits is None or len(orbits.reps) * len(topo.links) > SYMMETRIC_MAX_COLUMNS:
            _SYM_CACHE[key] = None  # no symmetry, or too little of it to shrink the LP enough
        else:
            rest = None if time_limit is None else max(1e-3, time_limit - (time.perf_counter() - t0))
            sf = symmetric_concurrent_flow(topo, orbits, rest)
            _SYM_CACHE[key] = sf
            if sf.status != "optimal":  # cut short: try again next time
                del _SYM_CACHE[key]
                return sf
        if len(_SYM_CACHE) > 8:
            _SYM_CACHE.clear()
    return _SYM_CACHE.get(key)


def flow_bound_s(topo: Topology, pair_bytes: float, time_limit: float | None = None) -> float:
    """The concurrent-flow floor of a uniform AlltoAll moving ``pair_bytes`` per pair: the static
    LP's theta when it is small (or already solved for the method), the symmetric static LP's
    on larger ones with symmetry (the same optimum, :class:`SymmetricFlow`), else the dual bound, which is time-bounded by construction; the largest known (all sound)."""
    key = _link_key(topo)
    if key not in _DUAL_CACHE:
        if len(_DUAL_CACHE) > 16:
            _DUAL_CACHE.clear()
        _DUAL_CACHE[key] = dual_flow_bound(topo, None if time_limit is None else time_limit / 10)
    out = _DUAL_CACHE[key].finish_s(pair_bytes)
    cached = _CACHE.get(key)
    if cached is None and len(topo.gpus) * len(topo.links) <= STATIC_BOUND_COLUMNS:
        cached = (concurrent_flow(topo, time_limit), time_limit)
    if cached is not None and cached[0].status == "optimal":
        out = max(out, cached[0].finish_s(pair_bytes))
    elif len(topo.gpus) * len(topo.links) > STATIC_BOUND_COLUMNS:
        sf = symmetric_flow(topo, None if time_limit is None else time_limit / 2)
        if sf is not None and sf.status == "optimal":
            out = max(out, sf.seconds_per_GB * (1 - 1e-5) * pair_bytes / 1e9)
    return out


@dataclass(frozen=True)
class SymmetricFlow:
    """The static LP restricted to flows that are images of the orbit representatives' flows
    (:func:`symmetric_concurrent_flow`): one commodity per representative, every image counted
    on the capacity of the links it lands on.

    It loses nothing, so its theta is the full LP's and a sound bound: average an optimal full
    flow over the automorphism group (f'_v = mean over g of g(f_{g^-1 v})); that flow is feasible
    with the same theta (automorphisms keep capacities and the uniform demand) and invariant, so
    f'_v = pi_v(f'_r) for *any* automorphism pi_v taking r to v: it is a solution of this LP."""

    seconds_per_GB: float
    orbits: object  # flowride.synth.symmetry.GpuOrbits
    need: np.ndarray  # [reps, N]
    f_s: np.ndarray
    f_l: np.ndarray
    flow: np.ndarray
    status: str
    seconds: float


def symmetric_concurrent_flow(topo: Topology, orbits, time_limit: float | None = None) -> SymmetricFlow:
    """Max-concurrent flow of the uniform AlltoAll over the representatives' flows only: columns
    reps x links instead of GPUs x links (2,048 instead of 1,048,576 on a 16x32 torus), rows
    reps x nodes + links."""
    gpus = np.array(topo.gpus, dtype=np.int64)
    reps = np.array(orbits.reps, dtype=np.int64)
    N = topo.num_nodes
    R = len(reps)
    need = np.zeros((R, N), dtype=np.int64)
    need[:, gpus] = 1
    need[np.arange(R), reps] = 0
    l_src, l_dst = topo.link_ends
    L = len(l_src)
    ok = l_dst[None, :] != reps[:, None]
    f_s, f_l = np.nonzero(ok)
    nf = len(f_s)
    r1, c1, v1, rhs = flow_conserved_at_every_node(topo, need, f_s, f_l, reps)
    # capacity: every GPU v of rep r's orbit carries r's flow on link_map[v][l]
    col_of = -np.ones((R, L), dtype=np.int64)
    col_of[f_s, f_l] = np.arange(nf)
    pos = {int(r): i for i, r in enumerate(reps)}
    rr, cc = [], []
    for v, r in orbits.rep_of.items():
        i = pos[r]
        cols = col_of[i]
        m = cols >= 0
        rr.append(R * N + orbits.link_map[v][m])
        cc.append(cols[m])
    bw = np.array([lk.bandwidth_GBps for lk in topo.links])
    r2 = np.concatenate([*rr, R * N + np.arange(L)])
    c2 = np.concatenate([*cc, np.full(L, nf)])
    v2 = np.concatenate([np.ones(sum(len(x) for x in rr)), -bw])
    A = sp.csc_matrix((np.concatenate([v1, v2]), (np.concatenate([r1, r2]), np.concatenate([c1, c2]))), shape=(R * N + L, nf + 1))
    ingress = max((len(gpus) - 1) / bw[l_dst == g].sum() for g in gpus.tolist())
    hop = 1e-6 * ingress / (float(need.sum()) * max(1, N - 1))
    model = MipModel(
        cost=np.concatenate([np.full(nf, hop), [1.0]]), lb=np.zeros(nf + 1), ub=np.full(nf + 1, np.inf),
        integer=np.zeros(nf + 1, dtype=bool), A=A,
        row_lo=np.concatenate([rhs, np.full(L, -np.inf)]), row_hi=np.concatenate([rhs, np.zeros(L)]),
        row_names={"flow_conserved_at_every_node": (0, R * N), "links_carry_their_rate": (R * N, R * N + L)},
    )
    res = solve(model, SolveOptions(time_limit=time_limit))
    ok_ = res.status == "optimal" and res.x is not None
    return SymmetricFlow(float(res.x[-1]) if ok_ else 0.0, orbits, need, f_s, f_l,
                         res.x[:-1] if ok_ else np.zeros(nf), res.status, res.seconds)


def symmetric_paths(topo: Topology, demand: Demand, sf: SymmetricFlow) -> list[FlowPath]:
    """The representatives' flows split into paths, each copied to every GPU of its orbit
    through that GPU's automorphism (its node and link maps), scaled to ``demand``'s chunks per
    pair; hop rounds follow the image destination's ring offset, as :func:`decompose_static`."""
    sources, need = unicast_needs(topo, demand)
    k = float(need.max())
    reps = np.array(sf.orbits.reps, dtype=np.int64)
    base = decompose_static(topo, reps, sf.need, sf.f_s, sf.f_l, sf.flow * k)
    gpus = list(topo.gpus)
    pos = {g: i for i, g in enumerate(gpus)}
    n = len(gpus)
    by_rep: dict[int, list[FlowPath]] = defaultdict(list)
    for p in base:
        by_rep[p.source].append(p)
    out: list[FlowPath] = []
    for v, r in sf.orbits.rep_of.items():
        nm, lm = sf.orbits.node_map[v], sf.orbits.link_map[v]
        for p in by_rep[r]:
            d = int(nm[p.dest])
            rnd = (pos[d] - pos[v]) % n
            out.append(FlowPath(v, d, p.amount, [(int(lm[li]), rnd + i) for i, (li, _) in enumerate(p.hops)]))
    return out
