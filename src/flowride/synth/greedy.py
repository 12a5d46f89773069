"""Path-based list scheduling in the epoch model: the ring AllGather and direct AlltoAll baselines.

Each transfer follows a fixed path; every hop is placed at the earliest epoch where its link has
room in every capacity window it touches. Hops through switches happen at forced epochs (a switch
forwards in the epoch a chunk arrives), so a GPU -> switch -> GPU segment is placed as one piece.
The result is a feasible schedule, so its epoch count is also an upper bound for the MILP search.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import numpy as np
from scipy.sparse.csgraph import dijkstra

from flowride.collectives.demand import Collective, Demand
from flowride.schedule.links import LinkBook
from flowride.synth.reach import delay_graph
from flowride.synth.result import Send
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming


def _routes(topo: Topology, timing: EpochTiming) -> np.ndarray:
    """Predecessor matrix of fewest-epoch paths (ties broken by fewer hops)."""
    _, pred = dijkstra(delay_graph(topo, timing, per_hop=1e-3), directed=True, return_predecessors=True)
    return pred


def _path_links(topo: Topology, pred: np.ndarray, u: int, v: int) -> list[int]:
    return walk_links(topo, pred[u], u, v)


def walk_links(topo: Topology, pred_u: np.ndarray, u: int, v: int) -> list[int]:
    """The links from u to v along ``pred_u``, u's row of a Dijkstra predecessor matrix."""
    nodes = [v]
    while nodes[-1] != u:
        p = int(pred_u[nodes[-1]])
        if p < 0:
            raise ValueError(f"no path {u}->{v}")
        nodes.append(p)
    nodes.reverse()
    return [topo.link_index[(a, b)] for a, b in zip(nodes, nodes[1:], strict=False)]


class Outpaced(Exception):  # noqa: N818 (a signal, not an error)
    """A construction whose links' own load already takes longer than the best schedule so far:
    scheduling it cannot win, so it is not scheduled."""


def load_epochs(timing: EpochTiming, load: np.ndarray) -> float:
    """Fewer epochs than any schedule needs that puts ``load[l]`` chunks on each link l, all of
    them needed (each a GPU's one delivery of its chunk, as along trees): the busiest link at its
    window rate, less one window. A schedule with redundant sends may finish before its last one,
    so this bounds trees, not routes that may deliver twice (doubling's)."""
    rate = timing.window_cap / (timing.beta_epochs + 1)
    busy = (load > 0) & (rate > 0)
    if not busy.any():
        return 0.0
    return float(np.max(load[busy] / rate[busy] - (timing.beta_epochs[busy] + 1)))


class GreedyScheduler:
    def __init__(self, topo: Topology, timing: EpochTiming) -> None:
        self.topo = topo
        self.timing = timing
        self.book = LinkBook(timing)
        self.pred = _routes(topo, timing)
        self.hold: dict[tuple[int, int, int], int] = {}  # (source, chunk, gpu) -> epoch held
        self.sends: list[Send] = []

    def held_at(self, s: int, c: int, g: int) -> int | None:
        if g == s:
            return 0
        return self.hold.get((s, c, g))

    def place_segment(self, s: int, c: int, links: list[int], ready: int) -> int:
        """Place GPU -> switch* -> GPU at the earliest start >= ready; return the hold epoch."""
        hops = self.book.offsets(links)
        k = self.book.place(hops, ready)
        self.sends.extend((k + off, li, s, c) for li, off in hops)
        li, off = hops[-1]
        return self.timing.arrival(li, k + off)

    def transfer(self, s: int, c: int, u: int, v: int) -> int:
        """Move chunk (s, c) from GPU u (which holds it) to GPU v along a fewest-epoch path."""
        have = self.held_at(s, c, v)
        if have is not None:
            return have
        ready = self.held_at(s, c, u)
        assert ready is not None, "transfer from a GPU that does not hold the chunk"
        path = _path_links(self.topo, self.pred, u, v)
        seg: list[int] = []
        for li in path:
            seg.append(li)
            dst = self.topo.links[li].dst
            if self.topo.nodes[dst].is_gpu:
                t = self.place_segment(s, c, seg, ready)
                prev = self.held_at(s, c, dst)
                if prev is None or t < prev:
                    self.hold[(s, c, dst)] = t
                ready = self.held_at(s, c, dst)
                seg = []
        return self.held_at(s, c, v)


def ring_order(topo: Topology, budget: int = 200_000) -> list[int]:
    """A cycle through all GPUs using direct (or switch-only) hops when one can be found, preferring
    fast links; falls back to id order (routed along shortest paths)."""
    gpus = list(topo.gpus)
    adj: dict[int, list[tuple[float, int]]] = {g: [] for g in gpus}
    for g in gpus:
        # GPUs reachable from g directly or through switches only
        seen = {g}
        frontier = [(g, float("inf"))]
        while frontier:
            node, bw = frontier.pop()
            for li in topo.out_links(node):
                lk = topo.links[li]
                if lk.dst in seen:
                    continue
                seen.add(lk.dst)
                b = min(bw, lk.bandwidth_GBps)
                if topo.nodes[lk.dst].is_gpu:
                    adj[g].append((b, lk.dst))
                else:
                    frontier.append((lk.dst, b))
        adj[g].sort(key=lambda t: (-t[0], t[1]))
    start = gpus[0]
    path = [start]
    used = {start}
    steps = 0

    def dfs() -> bool:
        nonlocal steps
        steps += 1
        if steps > budget:
            return False
        if len(path) == len(gpus):
            return any(v == start for _, v in adj[path[-1]])
        for _, v in adj[path[-1]]:
            if v not in used:
                used.add(v)
                path.append(v)
                if dfs():
                    return True
                path.pop()
                used.discard(v)
        return False

    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10 * len(gpus) + 100))
    try:
        found = dfs()
    finally:
        sys.setrecursionlimit(old)
    return path if found else gpus


def ring_allgather(topo: Topology, demand: Demand, timing: EpochTiming) -> list[Send]:
    """Ring AllGather: every chunk travels the ring, each GPU forwarding what it just received."""
    order = ring_order(topo)
    n = len(order)
    gs = GreedyScheduler(topo, timing)
    chunks = sorted({q.chunk for q in demand.commodities})
    for step in range(n - 1):
        for c in chunks:
            for pos, s in enumerate(order):
                u = order[(pos + step) % n]
                v = order[(pos + step + 1) % n]
                gs.transfer(s, c, u, v)
    return sorted(gs.sends)


def doubling_allgather(topo: Topology, demand: Demand, timing: EpochTiming, deadline: float | None = None) -> list[Send] | None:
    """AllGather by doubling from the farthest distance (Bruck's, as NCCL's PAT orders it): in
    step j every GPU sends the peer n/2^(j+1) places on all it holds that the peer lacks, so the
    blocks spread in ceil(log2 n) steps, each on fewest-epoch routes: the latency-bound shape.
    ``deadline`` (a ``time.perf_counter()`` value): past it None is returned (at many chunks the
    shape costs seconds and rarely wins, so a caller's time box must hold it too)."""
    gpus = list(topo.gpus)
    n = len(gpus)
    gs = GreedyScheduler(topo, timing)
    have = {r: {r} for r in range(n)}
    d = 1 << max(0, math.ceil(math.log2(n)) - 1)
    while d >= 1:
        moves = [(r, (r + d) % n, sorted(have[r] - have[(r + d) % n])) for r in range(n)]
        for r, t, blocks in moves:
            if deadline is not None and time.perf_counter() > deadline:
                return None
            for b in blocks:
                for c in range(demand.chunks):
                    gs.transfer(gpus[b], c, gpus[r], gpus[t])
            have[t] |= set(blocks)
        d //= 2
    return sorted(gs.sends)


def direct_alltoall(topo: Topology, demand: Demand, timing: EpochTiming) -> list[Send]:
    """Direct AlltoAll: each block goes straight (shortest path) to its destination, in rounds of
    increasing ring offset so every link is shared evenly."""
    order = list(topo.gpus)
    pos = {g: i for i, g in enumerate(order)}
    n = len(order)
    gs = GreedyScheduler(topo, timing)
    by_pair: dict[tuple[int, int], list[int]] = defaultdict(list)
    for q in demand.commodities:
        for d in q.dests:
            by_pair[(q.source, d)].append(q.chunk)
    for off in range(1, n):
        for s in order:
            d = order[(pos[s] + off) % n]
            for c in by_pair.get((s, d), []):
                gs.transfer(s, c, s, d)
    return sorted(gs.sends)


def baseline_sends(topo: Topology, demand: Demand, timing: EpochTiming) -> tuple[str, list[Send]]:
    """The collective's classic baseline: ring AllGather or direct AlltoAll."""
    if demand.collective is Collective.ALLGATHER:
        return "ring", ring_allgather(topo, demand, timing)
    return "direct", direct_alltoall(topo, demand, timing)


def retime(topo: Topology, sends: list[Send], made_at: EpochTiming, timing: EpochTiming) -> list[Send]:
    """Replay a schedule made at other epochs (the slow preset's, say) at ``timing``.

    The coarse-to-fine warm start: a schedule found at long epochs keeps its routes, copies and
    order, and each transfer out of a GPU (with the switch forwards it feeds, as one tree) goes at
    the earliest epoch of ``timing`` at which its sender holds the chunk and every link of the
    tree has room at its offset. Transfers are taken in the order of their old epochs, so a chunk
    is always placed after the transfer that brought it. The result obeys every rule at
    ``timing`` (the simulator checks it where it is used)."""
    forwards: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)  # (s, c, switch, epoch) -> out-links
    from_gpus: list[Send] = []
    for e, li, s, c in sorted(tuple(x[:4]) for x in sends):
        u = topo.links[li].src
        if topo.nodes[u].is_gpu:
            from_gpus.append((e, li, s, c))
        else:
            forwards[(s, c, u, e)].append(li)
    book = LinkBook(timing)
    hold: dict[tuple[int, int, int], int] = {}
    out: list[Send] = []
    for e, li, s, c in from_gpus:
        u = topo.links[li].src
        ready = 0 if u == s else hold.get((s, c, u))
        if ready is None:
            raise ValueError(f"GPU {u} sends chunk ({s},{c}) in epoch {e} before it holds it")
        tree: list[tuple[int, int]] = []  # (link, epochs after the tree's first send)
        stack = [(li, e, 0)]
        while stack:
            lk, ek, off = stack.pop()
            tree.append((lk, off))
            w = topo.links[lk].dst
            if not topo.nodes[w].is_gpu:
                key = (s, c, w, made_at.arrival(lk, ek))
                outs = forwards.get(key, [])
                # a switch that cannot copy forwards one chunk per arrival
                take = outs if topo.nodes[w].copy else outs[:1]
                forwards[key] = [] if topo.nodes[w].copy else outs[1:]
                stack.extend((l2, key[3], off + int(timing.hop_delay[lk])) for l2 in take)
        k = book.place(tree, ready)  # a tree may cross a link twice: place takes hop by hop
        placed = [(lk, k + off) for lk, off in tree]
        for lk, ek in placed:
            out.append((ek, lk, s, c))
            v = topo.links[lk].dst
            if topo.nodes[v].is_gpu:
                t = timing.arrival(lk, ek)
                if t < hold.get((s, c, v), 1 << 60):
                    hold[(s, c, v)] = t
    out.sort()
    return out
