"""Packed broadcast trees for AllGather: the polynomial-time method, in the spirit of ForestColl.

ForestColl's bound (:func:`flowride.synth.bounds.forest_bound`) is exact; the construction here is
a polynomial heuristic in its spirit, not ForestColl's exact packing: one broadcast out-tree per
(root, chunk), grown by Dijkstra under link weights that rise with the load earlier trees put on
each link (multiplicative-weights style), so the trees spread over the cut the bound names. The
trees are then list-scheduled level by level into the epoch model (every hop at the earliest epoch
its link has room), which adds latency and whole-chunk effects the fluid bound leaves out.
Switches are crossed, never used to copy (a GPU -> switch -> GPU hop is one tree edge), so the
schedule is valid for any switch. ReduceScatter and AllReduce reuse them by duality
(:mod:`flowride.schedule.reduce`).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from flowride.schedule.ir import Schedule
from flowride.schedule.links import SlotOverflow
from flowride.schedule.prune import drop_switch_cycles
from flowride.schedule.simulate import simulate
from flowride.synth.forest import forest_sends
from flowride.synth.greedy import GreedyScheduler, Outpaced, doubling_allgather, load_epochs
from flowride.synth.justify import SECONDS_PER_SEND as JUSTIFY_SECONDS_PER_SEND
from flowride.synth.justify import justified_allgather
from flowride.synth.matched import SPREAD, matched_allgather
from flowride.synth.packing import Packing, pack_trees
from flowride.synth.result import Probe, SearchResult
from flowride.topology.model import Topology
from flowride.topology.shifts import shift_symmetry


@dataclass(frozen=True)
class _Edges:
    """GPU-to-GPU tree edges: direct links, and hops through switches only."""

    src: list[int]
    dst: list[int]
    links: list[list[int]]  # physical links of each edge, in order
    delay: list[int]  # epochs from send to hold along the edge


def _gpu_edges(topo: Topology, timing) -> _Edges:
    src: list[int] = []
    dst: list[int] = []
    paths: list[list[int]] = []
    delay: list[int] = []
    nodes = topo.nodes
    for g in topo.gpus:
        # best (fewest epochs) switch-only path from g to every GPU it reaches that way
        best: dict[int, tuple[int, list[int]]] = {}
        frontier: list[tuple[int, int, list[int]]] = [(g, 0, [])]
        seen_sw: dict[int, int] = {}
        while frontier:
            node, d, path = frontier.pop()
            for li in topo.out_links(node):
                v = topo.links[li].dst
                nd = timing.arrival(li, d)
                if nodes[v].is_gpu:
                    if v != g and (v not in best or nd < best[v][0]):
                        best[v] = (nd, path + [li])
                elif seen_sw.get(v, 1 << 60) > nd:
                    seen_sw[v] = nd
                    frontier.append((v, nd, path + [li]))
        for v, (d, path) in sorted(best.items()):
            src.append(g)
            dst.append(v)
            paths.append(path)
            delay.append(d)
    return _Edges(src, dst, paths, delay)


def _tree(root: int, n: int, e: _Edges, weight: np.ndarray, index: dict[tuple[int, int], int] | None = None) -> dict[int, int]:
    """Shortest-path out-tree from ``root`` under ``weight``: GPU -> index of the edge into it."""
    m = sp.csr_matrix((weight, (e.src, e.dst)), shape=(n, n))
    _, pred = dijkstra(m, directed=True, indices=root, return_predecessors=True)
    if index is None:
        index = {(a, b): i for i, (a, b) in enumerate(zip(e.src, e.dst, strict=True))}
    reached = np.flatnonzero(pred >= 0)
    return {int(v): index[(int(pred[v]), int(v))] for v in reached if v != root}


def _grow(root: int, e: _Edges, out: dict[int, list[int]], cost: np.ndarray, delay: np.ndarray, lam: float) -> dict[int, int]:
    """Grow an out-tree from ``root`` Prim-style: repeatedly attach the GPU whose best edge from the
    tree minimises ``cost[edge] + lam * (depth of its tail + delay[edge])``. lam = 0 is Prim (the
    cheapest tree in link time: a thin cut is crossed once), a large lam is Dijkstra (the shallowest
    tree); in between trades the two. Returns GPU -> index of the edge into it."""
    depth = {root: 0.0}
    parent: dict[int, int] = {}
    heap: list[tuple[float, int, int]] = []
    for ei in out.get(root, []):
        heapq.heappush(heap, (cost[ei] + lam * delay[ei], ei, e.dst[ei]))
    while heap:
        _, ei, v = heapq.heappop(heap)
        if v in depth:
            continue
        depth[v] = depth[e.src[ei]] + delay[ei]
        parent[v] = ei
        for ej in out.get(v, []):
            if e.dst[ej] not in depth:
                heapq.heappush(heap, (cost[ej] + lam * (depth[v] + delay[ej]), ej, e.dst[ej]))
    return parent


def tree_sends(topo: Topology, demand, timing, spread: float = 1.0, shape: str = "shortest",
               deadline: float | None = None, beat: float | None = None) -> list[tuple[int, int, int, int]] | None:
    """AllGather sends along one load-balanced broadcast tree per (source, chunk).

    ``shape`` "shortest": fewest-epoch trees (Dijkstra), where ``spread`` weighs link load against
    latency: 0 gives plain fewest-epoch trees (best when latency dominates), larger values push
    later trees off loaded links. "cheapest": trees grown Prim-style (:func:`_grow`) under the link
    time each edge consumes, inflated by the load already on it, plus ``spread`` times its depth:
    a tree then crosses a thin cut once and copies on the far side (best when bandwidth
    dominates), at the price of deeper trees. ``deadline`` (a ``time.perf_counter()`` value): past
    it the building stops and None is returned. ``beat``: once the trees are grown, raise
    :class:`~flowride.synth.greedy.Outpaced` instead of scheduling them when their link load alone
    takes that many epochs."""
    if not demand.collective.multicast or demand.collective.reduces:
        raise ValueError("tree_sends builds AllGather schedules; reductions use the reversed AllGather")
    e = _gpu_edges(topo, timing)
    n = topo.num_nodes
    cap = np.array([lk.bytes_per_s for lk in topo.links])
    link_load = np.zeros(len(topo.links))  # chunks
    delay = np.array(e.delay, dtype=np.float64)
    # a chunk's time on a link, in epochs, to put load and latency in the same unit
    chunk_epochs = demand.chunk_bytes / (cap * timing.tau)
    edge_links = [np.array(p) for p in e.links]
    # the same as one padded matrix (edges x longest path; padding points at a zero-cost column),
    # so each tree's weights are two numpy ops, not a Python loop over every edge
    width = max((len(p) for p in e.links), default=1)
    EL = np.full((len(e.links), width), len(topo.links), dtype=np.int64)
    for i, p in enumerate(e.links):
        EL[i, : len(p)] = p
    index = {(a, b): i for i, (a, b) in enumerate(zip(e.src, e.dst, strict=True))}
    out: dict[int, list[int]] = {}
    for i, a in enumerate(e.src):
        out.setdefault(a, []).append(i)
    trees: list[tuple[int, int, dict[int, int]]] = []
    for qi, q in enumerate(sorted(demand.commodities, key=lambda q: (q.chunk, q.source))):
        if deadline is not None and qi % 64 == 0 and time.perf_counter() > deadline:
            return None
        if shape == "cheapest":
            per = np.append((1 + link_load) * chunk_epochs, 0.0)
            w = per[EL].sum(axis=1)
            parent = _grow(q.source, e, out, w, delay, spread)
        else:
            per = np.append(link_load * chunk_epochs, 0.0)
            w = delay + 1e-3 + spread * per[EL].max(axis=1)
            parent = _tree(q.source, n, e, w, index)
        for v in q.dests:
            if v not in parent:
                raise ValueError(f"GPU {v} is not reachable from GPU {q.source}")
        used = {parent[v] for v in parent if topo.nodes[v].is_gpu}
        for ei in used:
            link_load[edge_links[ei]] += 1
        trees.append((q.source, q.chunk, parent))
    if beat is not None and load_epochs(timing, link_load) >= beat:
        raise Outpaced

    gs = GreedyScheduler(topo, timing)
    # Place hops as they become ready (their sender holds the chunk), the hop with the tallest
    # subtree below it first: a chunk that still has far to go should not queue behind leaves.
    children: list[dict[int, list[int]]] = []
    height: list[dict[int, float]] = []
    for _s, _c, parent in trees:
        kids: dict[int, list[int]] = {}
        for v, ei in parent.items():
            kids.setdefault(e.src[ei], []).append(v)
        children.append(kids)
        h: dict[int, float] = {}

        def tall(v: int, kids=kids, h=h, parent=parent) -> float:
            if v not in h:
                h[v] = max((delay[parent[w]] + tall(w) for w in kids.get(v, [])), default=0.0)
            return h[v]

        for v in list(parent) + [_s]:
            tall(v)
        height.append(h)
    heap: list[tuple[int, float, int, int]] = []
    for ti, (s, _c, _p) in enumerate(trees):
        for v in children[ti].get(s, []):
            heapq.heappush(heap, (0, -height[ti][v] - delay[trees[ti][2][v]], ti, v))
    ticks = 0
    while heap:
        ticks += 1
        if deadline is not None and ticks % 2048 == 0 and time.perf_counter() > deadline:
            return None
        ready, _, ti, v = heapq.heappop(heap)
        s, c, parent = trees[ti]
        ei = parent[v]
        t = gs.place_segment(s, c, e.links[ei], gs.held_at(s, c, e.src[ei]))
        prev = gs.held_at(s, c, v)
        if prev is None or t < prev:
            gs.hold[(s, c, v)] = t
        for w in children[ti].get(v, []):
            heapq.heappush(heap, (t, -height[ti][w] - delay[parent[w]], ti, w))
    return sorted(gs.sends)


# Tree shapes tried by :func:`synthesize_trees`: first the trees packed to the throughput optimum
# (:mod:`flowride.synth.packing`), scheduled by :mod:`flowride.synth.forest` each transfer once in
# priority order (quick), then in time order (better where links are contended), then in time order
# on a grid of slots, each slot matched (where whole paths run on one-chunk-per-window links of one
# window: MI250's NICs; elsewhere it returns at once), then, on a fabric of groups, each block
# across once per group in matched slots
# (:func:`~flowride.synth.matched.matched_allgather`), then each (shape, spread) pair of
# :func:`tree_sends` and doubling from the farthest distance
# (:func:`~flowride.synth.greedy.doubling_allgather`), cheapest first in wall time; together they
# cover bandwidth-bound and latency-bound (shallow trees, log-step doubling) instances.
TREE_VARIANTS: tuple[tuple[str, float], ...] = (("packed-serial", 0.0), ("packed", 0.0), ("packed-slotted", 0.0), ("packed-routed", 0.0), ("matched", SPREAD), ("shortest", 0.5),
                                                ("doubling", 0.0), ("cheapest", 2.0), ("cheapest", 0.5), ("cheapest", 0.1))
PACKING_SHARE = 0.5  # of the packed variant's time the packing LP may take before its trees are scheduled
PACKED_SHARE = 0.7  # of the time limit the packed variant may take (the shapes after it are quick)
PACKED_AFTER_SHARE = 0.85  # with a schedule in hand: the shapes after it are boxed by what it takes
DOUBLING_MAX_DELIVERIES = 200_000  # the doubling shape is for latency-bound sizes; past this it only costs time
MATCHED_MAX_DELIVERIES = 200_000  # the matched crossings pick a receiver per block and group: quick below this


def packed_sends(topo: Topology, demand, timing, time_limit: float | None = None,
                 serial: bool = False, slotted: bool = False, routed: bool = False) -> list[tuple[int, int, int, int]] | None:
    """AllGather sends along the trees packed to the throughput optimum of the epoch model's link
    capacities (whole chunks per capacity window), list-scheduled (:func:`forest_sends`; ``slotted``:
    on a grid of slots, see there, and [] where no transfer is on one); None when ``time_limit``
    ran out before the schedule was complete."""
    t0 = time.perf_counter()
    packing = packing_for(topo, timing, demand.chunk_bytes, None if time_limit is None else time_limit * PACKING_SHARE)
    return forest_sends(topo, demand, timing, packing, serial=serial, deadline=None if time_limit is None else t0 + time_limit,
                        slotted=slotted, routed=routed)


_PACKINGS: dict[tuple, tuple[Packing, float]] = {}  # key -> (packing, the time limit it was made in)


def packing_for(topo: Topology, timing, chunk_bytes: float, time_limit: float | None = None) -> Packing:
    """The packing of ``topo`` at the capacities the epoch model gives its links (cached: at the
    fast preset they do not depend on the chunk size). A packing cut short by its time limit is
    made again when a later call has clearly more time (the chunk sweep's first counts have
    little, and every later count would otherwise keep their unfinished packing). It is made
    afresh, not from the unfinished one's trees: the LP has many optima, and which one a seeded
    run ends at depends on where the first was cut, i.e. on the machine's speed; their schedules
    differ by up to 3% (MI250 x2, 128 chunks), so a seeded packing made the result vary run to run."""
    eff = timing.window_cap / (timing.beta_epochs + 1) * chunk_bytes / timing.tau / 1e9  # GB/s a link carries in whole chunks
    key = (topo.gpus, tuple((lk.src, lk.dst) for lk in topo.links), tuple(np.round(eff, 6)), tuple(nd.copy for nd in topo.nodes))
    limit = PACKING_SECONDS if time_limit is None else time_limit
    got = _PACKINGS.get(key)
    if got is None or (not got[0].optimal and limit > REPACK_FACTOR * got[1]):
        got = (pack_trees(topo, None, time_limit=limit, capacity_GBps=eff, symmetry=shift_symmetry(topo)), limit)
        if len(_PACKINGS) > 32:
            _PACKINGS.clear()
        _PACKINGS[key] = got
    return got[0]


PACKING_SECONDS = 120.0  # the packing LP's own cap without a time limit
SHAPES_FLOOR_S = 2.0  # the other shapes' time after the packed trees gave a schedule: at least this,
SHAPES_FACTOR = 0.25  # or this many times what the packed trees took
REPACK_FACTOR = 1.5  # an unfinished packing is made again for a call with this much more time


def _shapes_box(packed_s: float) -> float:
    """Seconds the shapes after the packed trees may take together (and the most the backward-
    forward pass may cost): at least :data:`SHAPES_FLOOR_S`, or a share of what the packed took."""
    return max(SHAPES_FLOOR_S, SHAPES_FACTOR * packed_s)


def _justified(topo: Topology, demand, timing, sends: list, deadline: float | None) -> tuple[int, list] | None:
    """(epochs, sends) of ``sends``' AllGather placed backwards then forwards, replayed; None past
    ``deadline``."""
    got = justified_allgather(Schedule.from_tuples(topo, demand, timing.tau, sends), deadline)
    if got is None:
        return None
    sched = drop_switch_cycles(Schedule.from_tuples(topo, demand, timing.tau, got))
    sim = simulate(sched)
    if not sim.valid:  # the passes place by the model's rules; this guards them
        raise AssertionError(f"justified tree schedule failed verification: {sim.first_violation}")
    return int(sim.epochs), [(x.epoch, x.link, x.source, x.chunk) for x in sched.sends]


def synthesize_trees(topo: Topology, demand, timing, time_limit: float | None = None, progress=None, lower: int = 0):
    """The polynomial-time method: build the AllGather along packed trees in every shape of
    :data:`TREE_VARIANTS` (while time is left; the first always runs), keep the one that finishes
    first in the simulator's replay, placed once more backwards and forwards where latency rules
    (:mod:`flowride.synth.justify`). Returns a :class:`~flowride.synth.result.SearchResult`
    whose horizon is that replay's epoch count; ``lower`` is the caller's epoch lower bound."""
    t0 = time.perf_counter()
    best: tuple[int, list] | None = None
    probes: list[Probe] = []
    timed_out = False
    packed_s = 0.0  # what the packed variants took, when they gave a schedule
    shapes_end: float | None = None
    for i, (shape, spread) in enumerate(TREE_VARIANTS):
        if best is not None and time_limit is not None and time.perf_counter() - t0 >= time_limit:
            timed_out = True
            break
        ps = time.perf_counter()
        deadline = None if time_limit is None else t0 + time_limit
        if deadline is not None and packed_s and not shape.startswith("packed"):
            # the packed trees are at the throughput optimum: the other shapes together get about
            # what they took (a shape beats them where latency or whole-chunk effects rule, and
            # there it is quick), so a large count's time goes to the next count, not to shapes
            shapes_end = shapes_end or ps + _shapes_box(packed_s)
            deadline = min(deadline, shapes_end)
        if shape.startswith("packed"):
            left = None if time_limit is None else max(1e-3, time_limit - (time.perf_counter() - t0))
            try:
                sends = packed_sends(topo, demand, timing, None if left is None else left * (PACKED_SHARE if best is None else PACKED_AFTER_SHARE),
                                     shape == "packed-serial", shape == "packed-slotted", shape == "packed-routed")
            except SlotOverflow:  # a tree forks at a switch that cannot copy, both ways over one slot: the shapes below
                sends = None
            if not sends:  # out of time before the packed schedule was whole (the shapes below are quick), or no slots
                continue
            packed_s += time.perf_counter() - ps
        elif shape == "matched":  # groups joined by switches that cannot copy: each block crosses once per group
            sends = (matched_allgather(topo, demand, timing, spread, None if best is None else best[0])
                     if demand.num_deliveries <= MATCHED_MAX_DELIVERIES else None)
            if sends is None:  # one group only, outpaced by its links' load, or too many deliveries
                continue
        elif shape == "doubling":  # log2(n) steps of fewest-epoch transfers: few hops for small sizes
            sends = doubling_allgather(topo, demand, timing, deadline) if demand.num_deliveries <= DOUBLING_MAX_DELIVERIES else None
            if sends is None:  # too many deliveries, or past the shapes' box
                continue
        else:
            try:
                sends = tree_sends(topo, demand, timing, spread, shape, deadline, None if best is None else best[0])
            except Outpaced:
                continue
            if sends is None:  # out of time: the whole limit's (cut short), or the shapes' own box (done)
                timed_out = time_limit is not None and time.perf_counter() - t0 >= time_limit
                break
        sched = drop_switch_cycles(Schedule.from_tuples(topo, demand, timing.tau, sends))  # routes may meet head to tail
        sends = [(x.epoch, x.link, x.source, x.chunk) for x in sched.sends]
        sim = simulate(sched)
        if not sim.valid:  # the construction obeys the model's rules; this guards it
            raise AssertionError(f"tree schedule ({shape}, {spread}) failed verification: {sim.first_violation}")
        probes.append(Probe(int(sim.epochs), f"trees {shape}/{spread}", time.perf_counter() - ps, len(sends), 0))
        if best is None or sim.epochs < best[0]:
            best = (int(sim.epochs), sends)
        if progress:
            progress({"stage": "trees", "variant": f"{shape}/{spread}", "i": i + 1, "of": len(TREE_VARIANTS),
                      "epochs": int(sim.epochs), "best": best[0], "lo": lower, "elapsed": time.perf_counter() - t0})
        if best[0] <= lower:
            break
    if best is None:  # the time ran out before any shape was whole: the caller keeps its baseline
        return SearchResult(None, 1 << 60, lower, True, probes, solver_seconds=time.perf_counter() - t0)
    if best[0] > lower and timing.alpha_epochs.max() > timing.beta_epochs.max():
        # the best shape placed again backwards and forwards (:mod:`flowride.synth.justify`) where
        # latency rules (a hop's alpha outlasts a chunk on the slowest link), it would take no more
        # than the shapes' box and fits the limit: at 1 MB it packs the tail of latency-bound trees
        # (MI250 x 4: 1.394 -> 1.295 the bound); at 1 GB it gains little for what it costs (0.2%
        # in 10 s), and even at small counts that time is what the next chunk count needs
        ps = time.perf_counter()
        cost = len(best[1]) * JUSTIFY_SECONDS_PER_SEND
        end = None if time_limit is None else t0 + time_limit
        if end is None or (ps + cost <= end and cost <= _shapes_box(packed_s)):
            got = _justified(topo, demand, timing, best[1], end)
            if got is not None:
                probes.append(Probe(got[0], "trees justified", time.perf_counter() - ps, len(got[1]), 0))
                if got[0] < best[0]:
                    best = got
                    if progress:
                        progress({"stage": "trees", "variant": "justified", "i": len(TREE_VARIANTS), "of": len(TREE_VARIANTS),
                                  "epochs": got[0], "best": best[0], "lo": lower, "elapsed": time.perf_counter() - t0})
    return SearchResult(best[1], best[0], min(lower, best[0]), timed_out, probes, solver_seconds=time.perf_counter() - t0)
