"""The exact state the A* windows hand on (what each GPU holds from when, what each link has
started), and the greedy completion that finishes a schedule from any state.

See :mod:`flowride.synth.astar` for the method; this module holds what a window starts from
(:class:`State`, :class:`Context`: the instance's arrays computed once) and the rarest-first list
scheduling over direct links and fewest-epoch switch routes (:func:`greedy_epochs`) that fills
spare room after each window and completes the schedule when time runs out.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from flowride.collectives.demand import Demand
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming

NEVER = np.int64(1) << 40  # hold epoch of a chunk a GPU neither holds nor has in flight


class State:
    """What the committed windows have done: holds, link use, switch traffic, sends."""

    def __init__(self, topo: Topology, demand: Demand, timing: EpochTiming) -> None:
        self.topo, self.demand, self.timing = topo, demand, timing
        n, nl, nq = topo.num_nodes, len(topo.links), len(demand.commodities)
        self.lsrc, self.ldst = topo.link_ends
        self.is_gpu = np.array([nd.is_gpu for nd in topo.nodes], dtype=bool)
        self.copy = np.array([(not nd.is_gpu) and nd.copy for nd in topo.nodes], dtype=bool)
        self.delay = timing.hop_delay.astype(np.int64)
        self.beta = timing.beta_epochs.astype(np.int64)
        self.wcap = timing.window_cap.astype(np.int64)
        self.src = np.array([q.source for q in demand.commodities], dtype=np.int64)
        self.hold = np.full((nq, n), NEVER, dtype=np.int64)
        self.hold[np.arange(nq), self.src] = 0
        self.need = np.zeros((nq, n), dtype=bool)
        for qi, q in enumerate(demand.commodities):
            self.need[qi, list(q.dests)] = True
        self.used = np.zeros((nl, 256), dtype=np.int32)
        self.sw_in: dict[tuple[int, int, int], int] = defaultdict(int)  # (q, switch, epoch) -> arrivals
        self.sw_out: dict[tuple[int, int, int], int] = defaultdict(int)
        self.sends: list[tuple[int, int, int]] = []  # (epoch, link, q)

    # ---------------------------------------------------------------- link book
    def ensure(self, epoch: int) -> None:
        if epoch >= self.used.shape[1]:
            grow = max(epoch + 1, 2 * self.used.shape[1])
            more = np.zeros((self.used.shape[0], grow - self.used.shape[1]), dtype=np.int32)
            self.used = np.concatenate([self.used, more], axis=1)

    def fits(self, link: int, k: int) -> bool:
        """One more chunk may start on ``link`` in epoch k: every b+1 window through k has room."""
        b, cap = int(self.beta[link]), int(self.wcap[link])
        self.ensure(k + b + 1)
        row = self.used[link]
        if b == 0:
            return int(row[k]) < cap
        seg = row[max(0, k - b) : k + b + 1].astype(np.int64)
        off = k - max(0, k - b)  # position of k in seg
        c = np.concatenate([[0], np.cumsum(seg)])
        for s in range(off - b, off + 1):
            lo = max(0, s)
            if c[min(len(seg), s + b + 1)] - c[lo] + 1 > cap:
                return False
        return True

    def window_use(self, lo: int, hi: int) -> np.ndarray:
        """used[:, lo:hi] with zeros for negative epochs."""
        self.ensure(hi)
        out = np.zeros((self.used.shape[0], hi - lo), dtype=np.int64)
        a = max(lo, 0)
        out[:, a - lo :] = self.used[:, a:hi]
        return out

    # ---------------------------------------------------------------- committing sends
    def can_send(self, k: int, link: int, q: int) -> bool:
        u = int(self.lsrc[link])
        if self.is_gpu[u]:
            if self.hold[q, u] > k:
                return False
        else:
            key = (q, u, k)
            arrived = self.sw_in.get(key, 0)
            if arrived == 0 or (not self.copy[u] and self.sw_out.get(key, 0) >= arrived):
                return False
        return self.fits(link, k)

    def commit(self, k: int, link: int, q: int) -> None:
        u, v = int(self.lsrc[link]), int(self.ldst[link])
        self.ensure(k + 1)
        self.used[link, k] += 1
        if not self.is_gpu[u]:
            self.sw_out[(q, u, k)] += 1
        t = k + int(self.delay[link])
        if self.is_gpu[v]:
            if t < self.hold[q, v]:
                self.hold[q, v] = t
        else:
            self.sw_in[(q, v, t)] += 1
        self.sends.append((k, link, q))

    def try_send(self, k: int, link: int, q: int) -> bool:
        if not self.can_send(k, link, q):
            return False
        self.commit(k, link, q)
        return True

    # ---------------------------------------------------------------- progress
    def missing(self) -> np.ndarray:
        """(Q, N) bool: needed and neither held nor in flight."""
        return self.need & (self.hold >= NEVER)

    def delivered(self) -> int:
        return int((self.need & (self.hold < NEVER)).sum())


def _switch_reach(topo: Topology, timing: EpochTiming, st: State) -> tuple[np.ndarray, np.ndarray]:
    """late[w]: most epochs from a GPU's send to switch w forwarding it, over fewest-epoch
    switch-only routes; reach[w, g]: GPU g is reachable from switch w through switches only."""
    n = topo.num_nodes
    late = np.zeros(n, dtype=np.int64)
    reach = np.zeros((n, n), dtype=bool)
    if not topo.switches:
        return late, reach
    tail_sw = ~st.is_gpu[st.lsrc]
    head_sw = ~st.is_gpu[st.ldst]
    into = head_sw  # GPU -> switch and switch -> switch
    g = sp.csr_matrix((st.delay[into].astype(float) + 1e-6, (st.lsrc[into], st.ldst[into])), shape=(n, n))
    d = dijkstra(g, directed=True, indices=list(topo.gpus))
    for w in topo.switches:
        col = d[:, w]
        fin = np.isfinite(col)
        late[w] = int(np.floor(col[fin].max() + 1e-3)) if fin.any() else 0
    # switch-only reach to GPUs: out of a switch through switches, ending at a GPU
    sw_edges = tail_sw
    g2 = sp.csr_matrix((np.ones(int(sw_edges.sum())), (st.lsrc[sw_edges], st.ldst[sw_edges])), shape=(n, n))
    d2 = dijkstra(g2, directed=True, indices=list(topo.switches), unweighted=True)
    for i, w in enumerate(topo.switches):
        reach[w] = np.isfinite(d2[i]) & st.is_gpu
    return late, reach


class Context:
    def __init__(self, topo: Topology, demand: Demand, timing: EpochTiming, D: np.ndarray, st: State) -> None:
        self.topo, self.demand, self.timing, self.D = topo, demand, timing, D.astype(np.int64)
        self.gpus = np.array(topo.gpus, dtype=np.int64)
        self.late, self.reach = _switch_reach(topo, timing, st)
        self.n = topo.num_nodes
        # the cheapest GPU-to-GPU hop, and every GPU's neighbours within it
        Dg = self.D[np.ix_(self.gpus, self.gpus)]
        off = ~np.eye(len(self.gpus), dtype=bool)
        self.radius = max(1, int(Dg[off].min())) if off.any() else 1
        near_g = (Dg <= self.radius) & off  # (G, G)
        self.near_dense = np.zeros((len(self.gpus), self.n), dtype=np.int32)
        self.near_dense[:, self.gpus] = near_g
        self.near = sp.csr_matrix(self.near_dense.astype(bool))
        self.gpu_pos = np.full(self.n, -1, dtype=np.int64)
        self.gpu_pos[self.gpus] = np.arange(len(self.gpus))


def virtual_links(topo: Topology, st: State) -> list[tuple[int, int, tuple[int, ...], tuple[int, ...]]]:
    """Every way one GPU can hand a chunk to another in one transfer: a direct GPU -> GPU link, or
    the fewest-epoch GPU -> switch* -> GPU route (switches forward on arrival). Each as
    (tail GPU, head GPU, links, send-epoch offsets)."""
    import heapq

    out_links: dict[int, list[int]] = defaultdict(list)
    for li in range(len(st.lsrc)):
        out_links[int(st.lsrc[li])].append(li)
    vl: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []
    for u in topo.gpus:
        best: dict[int, tuple[int, tuple[int, ...]]] = {}
        heap: list[tuple[int, int, int, tuple[int, ...]]] = []
        for li in out_links[u]:
            v = int(st.ldst[li])
            if st.is_gpu[v]:
                vl.append((u, v, (li,), (0,)))
            else:
                heapq.heappush(heap, (int(st.delay[li]), 1, v, (li,)))
        seen: set[int] = set()
        while heap:
            d, hops, w, path = heapq.heappop(heap)
            if w in seen:
                continue
            seen.add(w)
            for li in out_links[w]:
                x = int(st.ldst[li])
                nd = d + int(st.delay[li])
                if st.is_gpu[x]:
                    if x != u and (x not in best or nd < best[x][0]):
                        best[x] = (nd, path + (li,))
                elif x not in seen:
                    heapq.heappush(heap, (nd, hops + 1, x, path + (li,)))
        for x, (_, path) in sorted(best.items()):
            if any(e[1] == x and len(e[2]) == 1 for e in vl if e[0] == u):
                continue  # a direct link exists
            offs = [0]
            for li in path[:-1]:
                offs.append(offs[-1] + int(st.delay[li]))
            vl.append((u, x, path, tuple(offs)))
    return vl


class OutOfTime(Exception):
    """The greedy completion passed its deadline (only where a schedule is not required of it)."""


def greedy_epochs(st: State, vlinks, k0: int, k1: int | None = None, deadline: float | None = None) -> int:
    """Rarest-first list scheduling, epoch by epoch from ``k0`` (to ``k1`` exclusive, or until
    every demand is held or in flight): every transfer with room in that epoch hands its head the
    chunk it lacks, holds no copy of in flight, that the tail holds and that the fewest GPUs have.
    Returns sends added; raises :class:`OutOfTime` once ``time.perf_counter()`` passes ``deadline``
    (on a thousand GPUs a completion takes minutes)."""
    if not vlinks:
        return 0
    tails = np.array([v[0] for v in vlinks], dtype=np.int64)
    heads = np.array([v[1] for v in vlinks], dtype=np.int64)
    added = 0
    k = k0
    idle = 0
    slack = int(st.delay.max()) + int(st.beta.max()) + 2 if len(st.delay) else 2
    while k1 is None or k < k1:
        if deadline is not None and time.perf_counter() > deadline:
            raise OutOfTime
        miss = st.missing()
        if not miss.any():
            break
        active = np.flatnonzero(miss.any(axis=1))
        hold = st.hold[active]
        holders = (hold < NEVER).sum(axis=1).astype(np.int64)
        cand = (hold[:, tails] <= k) & miss[active][:, heads]  # (Qa, V)
        useful = np.flatnonzero(cand.any(axis=0))
        before = added
        for vi in useful.tolist():
            _, v, links, offs = vlinks[vi]
            cq = np.flatnonzero(cand[:, vi] & (st.hold[active, v] >= NEVER))
            if len(cq) == 0:
                continue
            if not all(st.fits(li, k + o) for li, o in zip(links, offs, strict=True)):
                continue
            pick = int(cq[np.argmin(holders[cq])])
            q = int(active[pick])
            for li, o in zip(links, offs, strict=True):
                if not st.try_send(k + o, li, q):
                    raise AssertionError("greedy transfer rejected after fitting")
            holders[pick] += 1
            added += len(links)
        idle = idle + 1 if added == before else 0
        if k1 is None and idle > slack and not in_flight_after(st, k) and not links_busy_after(st, k):
            raise AssertionError("greedy completion makes no progress")
        k += 1
    return added


def greedy_complete(st: State, vlinks, k0: int = 0, deadline: float | None = None) -> int:
    """Finish the schedule: :func:`greedy_epochs` from ``k0`` until every demand is met (or the
    deadline passes: :class:`OutOfTime`)."""
    return greedy_epochs(st, vlinks, k0, None, deadline)


def in_flight_after(st: State, t0: int) -> bool:
    h = st.hold[st.hold < NEVER]
    return bool((h >= t0).any())


def links_busy_after(st: State, t0: int) -> bool:
    """Some link is still carrying a chunk in epoch t0 or later (a send in epoch e holds its link
    through e + beta): until then a transfer may be waiting for room, not stuck."""
    lo = max(0, t0 - int(st.beta.max(initial=0)))
    st.ensure(t0 + 1)
    links, epochs = np.nonzero(st.used[:, lo:])
    return bool((epochs + lo + st.beta[links] >= t0).any())
