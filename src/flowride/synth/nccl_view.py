"""How NCCL sees a machine (after NVIDIA/nccl src/graph): its hosts, each host's NICs, the rings
it builds through them, and the routes between GPUs through switches only. The schedules built on
this view are in :mod:`flowride.synth.nccl`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from flowride.synth.greedy import ring_order
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming


@dataclass
class Nic:
    """Where a channel leaves and enters a host: the GPUs that receive from the network through
    this NIC and those that send through it (the same GPUs on a real NIC; the TE-CCL DGX-2 model
    has one-way links, in at an even GPU, out at an odd one)."""

    into: list[int]
    out: list[int]


@dataclass
class Host:
    """One machine as NCCL sees it: its GPUs (local order) and its NICs."""

    gpus: list[int]
    nics: list[Nic] = field(default_factory=list)


def hosts(topo: Topology) -> list[Host]:
    """The GPUs per host (the nodes' ``group``; all one host when none is given) and each host's
    NICs. A NIC is a node of the host with links to and from outside it: a GPU (its own NIC) or a
    forwarding switch (a NIC the GPUs beside it share). A node with links only out is paired with
    one with links only in through the outside switch they share."""
    nodes = topo.nodes
    by: dict[int | None, list[int]] = {}
    for g in topo.gpus:
        by.setdefault(nodes[g].group, []).append(g)
    if None in by and len(by) > 1:  # some GPUs have no host: one host for all
        by = {None: list(topo.gpus)}
    out = []
    for grp, gpus in sorted(by.items(), key=lambda kv: kv[1][0]):
        outs: dict[int, set[int]] = {}
        ins: dict[int, set[int]] = {}
        if len(by) > 1:
            for lk in topo.links:
                if nodes[lk.src].group == grp and nodes[lk.dst].group != grp:
                    outs.setdefault(lk.src, set()).add(lk.dst)
                if nodes[lk.dst].group == grp and nodes[lk.src].group != grp:
                    ins.setdefault(lk.dst, set()).add(lk.src)

        def gpus_at(x: int, grp=grp) -> list[int]:
            if nodes[x].is_gpu:
                return [x]
            return sorted({lk.src for lk in topo.links if lk.dst == x and nodes[lk.src].is_gpu and nodes[lk.src].group == grp})

        nics = [Nic(gpus_at(x), gpus_at(x)) for x in sorted(set(outs) & set(ins))]
        only_in = sorted(set(ins) - set(outs))
        for x in sorted(set(outs) - set(ins)):
            mate = next((y for y in only_in if outs[x] & ins[y]), None)
            if mate is not None:
                only_in.remove(mate)
                nics.append(Nic(gpus_at(mate), gpus_at(x)))
        out.append(Host(gpus, [n for n in nics if n.into and n.out]))
    return out


class Routes:
    """Fewest-epoch routes between GPUs through switches only (no other GPU on the way). Among
    routes of equal length the choice is spread as a fabric's ECMP spreads flows: the pair's
    ``(source + destination) mod ways`` picks its own tie-break, so a Clos's spines share the load."""

    def __init__(self, topo: Topology, timing: EpochTiming, ways: int = 16) -> None:
        self.topo = topo
        n = topo.num_nodes
        src, dst = topo.link_ends
        is_gpu = np.array([nd.is_gpu for nd in topo.nodes])
        # a GPU may only start or end a route: split each GPU into an "out" (its id) and an "in" (n + id)
        head = np.where(is_gpu[dst], n + dst, dst)
        self.w = timing.hop_delay.astype(np.float64) + 1e-3
        self.src, self.head = src, head
        self.link_of = {(int(a), int(b)): li for li, (a, b) in enumerate(zip(src, head, strict=True))}
        self.n = n
        self.ways = ways
        self.cache: dict[tuple[int, int], np.ndarray] = {}

    def route(self, u: int, v: int) -> list[int] | None:
        way = (u + v) % self.ways
        key = (u, way)
        if key not in self.cache:  # way w prefers, among equal routes, links whose index is w past a multiple of ways
            tie = ((np.arange(len(self.w)) + way) % self.ways) * (1e-4 / self.ways)
            g = sp.csr_matrix((self.w + tie, (self.src, self.head)), shape=(2 * self.n, 2 * self.n))
            _, pred = dijkstra(g, directed=True, indices=u, return_predecessors=True)
            self.cache[key] = pred
        pred = self.cache[key]
        t = self.n + v
        if pred[t] < 0:
            return None
        out = []
        while t != u:
            p = int(pred[t])
            out.append(self.link_of[(p, t)])
            t = p
        return out[::-1]


def segments(paths: Routes, u: int, v: int, via: int | None = None) -> list[list[int]] | None:
    """u -> v as store-and-forward segments between GPUs: one switch-only route, or two through
    ``via`` (a GPU that relays, as NCCL's PXN does)."""
    if via is not None and via not in (u, v):
        a, b = paths.route(u, via), paths.route(via, v)
        return None if a is None or b is None else [a, b]
    r = paths.route(u, v)
    return None if r is None else [r]


def ring_channels(topo: Topology) -> list[list[tuple[int, int | None]]]:
    """NCCL's rings: per channel, the GPUs in ring order, each with the GPU that relays its send
    to the next (PXN) or None. Several hosts with the same NICs: a channel per NIC, entering each
    host at a GPU that receives through that NIC and leaving at one that sends through it; one
    host: the rings :func:`single_host_rings` finds."""
    hs = hosts(topo)
    k = len(hs[0].nics)
    if len(hs) > 1 and k and all(len(h.nics) == k and len(h.gpus) == len(hs[0].gpus) for h in hs):
        direct = {(lk.src, lk.dst): lk.bandwidth_GBps for lk in topo.links if topo.nodes[lk.src].is_gpu and topo.nodes[lk.dst].is_gpu}
        hub = _copy_switch_pairs(topo)
        parts: list[list[list[int]]] = []  # per host, per channel: its GPUs in ring order
        for h in hs:
            rings = []
            for nic in h.nics:
                entry = nic.into[0]
                i = h.gpus.index(entry)
                ring = [h.gpus[(i - j) % len(h.gpus)] for j in range(len(h.gpus))]  # entry, entry-1, ... entry+1
                leave = next((g for g in nic.out if g != entry), None)
                if leave is not None:  # leave by a GPU the NIC serves: no relay
                    ring.remove(leave)
                    ring.append(leave)
                rings.append(ring)
            if not all((a, b) in direct or (a, b) in hub for r in rings for a, b in itertools.pairwise(r)):
                # a mesh of direct links (xGMI): the host's part of each ring follows them, as
                # NCCL's (RCCL's) search does, from the GPU it enters by to the one it leaves by
                inside = {ab: bw for ab, bw in direct.items() if ab[0] in h.gpus and ab[1] in h.gpus}
                rings = _mesh_paths(h.gpus, inside, [(r[0], r[-1]) for r in rings]) or rings
            parts.append(rings)
        chans = []
        for c in range(k):
            order: list[tuple[int, int | None]] = []
            for h, rings in zip(hs, parts, strict=True):
                nic, ring = h.nics[c], rings[c]
                exit_ = ring[-1]
                for g in ring[:-1]:
                    order.append((g, None))
                order.append((exit_, None if exit_ in nic.out else nic.out[0]))
            chans.append(order)
        return chans
    return [[(g, None) for g in r] for r in single_host_rings(topo)]


def single_host_rings(topo: Topology, most: int = 8) -> list[list[int]]:
    """Rings through every GPU, as NCCL's search finds them on one host: on a switch (or one
    ring only) the GPUs in order; on a mesh of direct links, rings found one after another on the
    bandwidth the earlier ones left (fast links first), as long as each still has a link of at
    least half the first ring's slowest."""
    first = ring_order(topo)
    gpus = list(topo.gpus)
    direct = {(lk.src, lk.dst): lk.bandwidth_GBps for lk in topo.links if topo.nodes[lk.src].is_gpu and topo.nodes[lk.dst].is_gpu}
    if not all((a, b) in direct for a, b in zip(first, first[1:] + first[:1], strict=True)):
        return [first]  # the ring goes through switches: every channel is the same ring
    left = dict(direct)
    rings: list[list[int]] = []
    floor = None
    while len(rings) < most:
        ring = _hamilton(gpus, left)
        if ring is None:
            break
        bw = min(left[(a, b)] for a, b in zip(ring, ring[1:] + ring[:1], strict=True))
        floor = bw / 2 if floor is None else floor
        if bw < floor:
            break
        rings.append(ring)
        for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
            left[(a, b)] -= bw
            if left[(a, b)] <= 1e-9:
                del left[(a, b)]
    return rings or [first]


def _mesh_paths(gpus: list[int], bw: dict[tuple[int, int], float], ends: list[tuple[int, int]],
                tries: int = 12) -> list[list[int]] | None:
    """One path through every GPU of a host per channel, from its entry to its exit, on direct
    links that the channels share: each channel prefers the links the earlier ones left widest;
    a few seeded reorderings are tried and the one whose busiest link carries least (channels
    over bandwidth) is kept. None where some channel has no such path."""
    rng = np.random.default_rng(0)
    best, best_peak = None, float("inf")
    for t in range(tries):
        load = dict.fromkeys(bw, 0)
        paths = []
        for a, b in ends:
            noise = {ab: 1.0 if t == 0 else float(rng.uniform(0.7, 1.4)) for ab in bw}
            path = _hamilton(gpus, {ab: w * noise[ab] / (1 + load[ab]) for ab, w in bw.items()}, start=a, end=b)
            if path is None:
                return None
            for ab in itertools.pairwise(path):
                load[ab] += 1
            paths.append(path)
        peak = max(n / bw[ab] for ab, n in load.items())
        if peak < best_peak:
            best, best_peak = paths, peak
    return best


def _copy_switch_pairs(topo: Topology) -> set[tuple[int, int]]:
    """GPU pairs joined through one copying switch (an NVSwitch): any order of them is a ring."""
    nodes = topo.nodes
    pairs: set[tuple[int, int]] = set()
    for w in topo.switches:
        if nodes[w].copy:
            ins = [lk.src for lk in topo.links if lk.dst == w and nodes[lk.src].is_gpu]
            outs = [lk.dst for lk in topo.links if lk.src == w and nodes[lk.dst].is_gpu]
            pairs.update((a, b) for a in ins for b in outs if a != b)
    return pairs


def _hamilton(gpus: list[int], bw: dict[tuple[int, int], float], budget: int = 20_000,
              start: int | None = None, end: int | None = None) -> list[int] | None:
    """A directed cycle through every GPU on the links of ``bw``, widest links tried first; with
    ``end``, a path from ``start`` to ``end`` instead."""
    adj: dict[int, list[int]] = {g: [] for g in gpus}
    for (a, b), _ in sorted(bw.items(), key=lambda kv: -kv[1]):
        adj[a].append(b)
    start = gpus[0] if start is None else start
    path, used = [start], {start}
    steps = 0

    def dfs() -> bool:
        nonlocal steps
        steps += 1
        if steps > budget:
            return False
        if len(path) == len(gpus):
            return path[-1] == end if end is not None else start in adj[path[-1]]
        for v in adj[path[-1]]:
            if v == end and len(path) < len(gpus) - 1:
                continue
            if v not in used:
                used.add(v)
                path.append(v)
                if dfs():
                    return True
                path.pop()
                used.discard(v)
        return False

    return list(path) if dfs() else None


def nvls_switch(topo: Topology) -> int | None:
    """The one copying switch every GPU of a single-host topology hangs on (NVLS), or None."""
    if len(hosts(topo)) != 1:
        return None
    for w in topo.switches:
        if topo.nodes[w].copy:
            peers = {lk.src for lk in topo.links if lk.dst == w} & {lk.dst for lk in topo.links if lk.src == w}
            if set(topo.gpus) <= peers:
                return w
    return None
