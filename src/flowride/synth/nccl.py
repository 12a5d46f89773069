"""NCCL's own algorithms as schedules in flowride's IR, timed by the same simulator and epochs.

A report compares a synthesized schedule with what users already run: NCCL. The comparison is
like for like when NCCL's algorithms are schedules in the same epoch model on the same topology,
so each algorithm NCCL would consider is built here as sends (after NVIDIA/nccl src/graph and
src/device, v2.29; docs/synthesis.md "NCCL's algorithms, modelled") and replayed by
:func:`flowride.schedule.simulate.simulate`:

- **ring** (every collective but AlltoAll): one ring per channel. On several hosts a channel per
  NIC: channel k enters each host at the GPU of NIC k, visits the host's GPUs and leaves through
  NIC k again (the last GPU relaying to that NIC's GPU over NVLink when the NIC is not its own:
  NCCL's PXN), so each channel crosses hosts on its own rail. On one host, one ring in GPU order
  (NCCL's channels there repeat the same ring). Data is dealt to the channels chunk by chunk and
  pipelined in pieces of at most 512 KiB per channel, as NCCL's Simple protocol moves it.
  ReduceScatter is the ring run backwards with sums; AllReduce is that, then the AllGather.
- **nvls** (AllGather, one host whose NVSwitch multicasts): each GPU puts each piece (128 KiB) on
  the switch once, which writes it to every other GPU.
- **pat** (AllGather, ReduceScatter; one GPU per host): Bruck-style doubling from the farthest
  distance, every step sending what the peer lacks.
- **p2p** (AlltoAll: NCCL has no algorithm, only grouped sends): every pair at once in NCCL's
  round order, a message to another host relayed over NVLink to the GPU on the destination's rail
  (PXN), received by the destination's own NIC.

Where the epoch IR cannot express an algorithm (NVLS's in-switch reduction for ReduceScatter and
AllReduce, NVLS-tree, and the double binary tree's overlapped reduce and broadcast), only NCCL's
own estimate (:mod:`flowride.synth.nccl_tuning`) is given, labelled so. Where a schedule would
exceed the send budget (rings on a thousand GPUs), its time comes from the ring's epoch
recurrence, also labelled. Simplifications are listed in docs/synthesis.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from flowride.collectives.demand import Collective, Demand, make_demand
from flowride.schedule.ir import Schedule
from flowride.schedule.reduce import allreduce_from_allgather, reduce_scatter_from_allgather
from flowride.schedule.simulate import simulate
from flowride.synth.greedy import GreedyScheduler, ring_order
from flowride.synth.nccl_tuning import NCCL_TUNING_SOURCE, Estimate, Machine, best_per_algorithm
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming, epoch_timing

PIPE_BYTES = 512 * 1024  # NCCL Simple: what one ring step moves per channel (stepSize)
NVLS_BYTES = 128 * 1024  # NCCL_NVLS_CHUNKSIZE
SEND_BUDGET = 2_000_000  # sends of one modelled algorithm that the simulator replays in seconds
# Pipelining depth kept where more pieces change little and cost seconds: a p2p message is
# independent of the others (its pieces only pipeline a PXN relay), and an NVLS multicast is
# one hop each way.
P2P_MAX_PIECES = 8
NVLS_MAX_PIECES = 32


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


class _Paths:
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


def _segments(paths: _Paths, u: int, v: int, via: int | None = None) -> list[list[int]] | None:
    """u -> v as store-and-forward segments between GPUs: one switch-only route, or two through
    ``via`` (a GPU that relays, as NCCL's PXN does)."""
    if via is not None and via not in (u, v):
        a, b = paths.route(u, via), paths.route(via, v)
        return None if a is None or b is None else [a, b]
    r = paths.route(u, v)
    return None if r is None else [r]


def _move(gs: GreedyScheduler, s: int, c: int, segs: list[list[int]], ready: int) -> int:
    """Place (s, c) along ``segs`` from ``ready``; the epoch the last GPU holds it."""
    t = ready
    for seg in segs:
        dst = gs.topo.links[seg[-1]].dst
        t = gs.place_segment(s, c, seg, t)
        prev = gs.hold.get((s, c, dst))
        if prev is None or t < prev:
            gs.hold[(s, c, dst)] = t
    return t


# ---------------------------------------------------------------------------- rings


def ring_channels(topo: Topology) -> list[list[tuple[int, int | None]]]:
    """NCCL's rings: per channel, the GPUs in ring order, each with the GPU that relays its send
    to the next (PXN) or None. Several hosts with the same NICs: a channel per NIC, entering each
    host at a GPU that receives through that NIC and leaving at one that sends through it; one
    host: the rings :func:`single_host_rings` finds."""
    hs = hosts(topo)
    k = len(hs[0].nics)
    if len(hs) > 1 and k and all(len(h.nics) == k and len(h.gpus) == len(hs[0].gpus) for h in hs):
        chans = []
        for c in range(k):
            order: list[tuple[int, int | None]] = []
            for h in hs:
                nic = h.nics[c]
                entry = nic.into[0]
                local = h.gpus
                i = local.index(entry)
                ring = [local[(i - j) % len(local)] for j in range(len(local))]  # entry, entry-1, ... entry+1
                leave = next((g for g in nic.out if g != entry), None)
                if leave is not None:  # leave by a GPU the NIC serves: no relay
                    ring.remove(leave)
                    ring.append(leave)
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


def _hamilton(gpus: list[int], bw: dict[tuple[int, int], float], budget: int = 20_000) -> list[int] | None:
    """A directed cycle through every GPU on the links of ``bw``, widest links tried first."""
    adj: dict[int, list[int]] = {g: [] for g in gpus}
    for (a, b), _ in sorted(bw.items(), key=lambda kv: -kv[1]):
        adj[a].append(b)
    start = gpus[0]
    path, used = [start], {start}
    steps = 0

    def dfs() -> bool:
        nonlocal steps
        steps += 1
        if steps > budget:
            return False
        if len(path) == len(gpus):
            return start in adj[path[-1]]
        for v in adj[path[-1]]:
            if v not in used:
                used.add(v)
                path.append(v)
                if dfs():
                    return True
                path.pop()
                used.discard(v)
        return False

    return list(path) if dfs() else None


def _ring_schedule(topo: Topology, demand: Demand, timing: EpochTiming, chans) -> list:
    paths = _Paths(topo, timing)
    gs = GreedyScheduler(topo, timing)
    nch = len(chans)
    hop_segs = []
    for order in chans:
        segs = []
        n = len(order)
        for i in range(n):
            u, via = order[i]
            v = order[(i + 1) % n][0]
            sg = _segments(paths, u, v, via)
            if sg is None:  # no switch-only route: fewest epochs through anything (greedy routing)
                sg = None
            segs.append(sg)
        hop_segs.append(segs)
    pos = [{g: i for i, (g, _) in enumerate(order)} for order in chans]
    for c in range(demand.chunks):
        ch = c % nch
        order, segs, where = chans[ch], hop_segs[ch], pos[ch]
        n = len(order)
        for step in range(n - 1):
            for s in topo.gpus:
                i = (where[s] + step) % n
                u, v = order[i][0], order[(i + 1) % n][0]
                ready = gs.held_at(s, c, u)
                if segs[i] is None:
                    gs.transfer(s, c, u, v)
                else:
                    _move(gs, s, c, segs[i], ready)
    return sorted(gs.sends)


def ring_epochs_estimate(topo: Topology, timing: EpochTiming, chans, chunks: int) -> int:
    """The ring's epochs from its recurrence, for rings too large to replay: each channel a
    pipeline whose slowest hop starts a chunk every p epochs and whose hops take d epochs; a
    channel of n GPUs with C chunks ends at max(((n-1)C - 1) p + d_max, (n-1) d_avg + (C-1) p).
    Channels are taken as independent (they share only NVLink, which rarely binds)."""
    paths = _Paths(topo, timing)
    worst = 0
    per = max(1, chunks // len(chans))
    for order in chans:
        n = len(order)
        ds, ps = [], []
        for i in range(n):
            u, via = order[i]
            v = order[(i + 1) % n][0]
            sg = _segments(paths, u, v, via) or [[]]
            d = sum(int(timing.hop_delay[li]) for seg in sg for li in seg)
            p = max((int(timing.beta_epochs[li]) + 1) / max(1, int(timing.window_cap[li])) for seg in sg for li in seg) if any(sg) else 1
            ds.append(max(1, d))
            ps.append(p)
        p, dmax, davg = max(ps), max(ds), sum(ds) / n
        worst = max(worst, int(math.ceil(max(((n - 1) * per - 1) * p + dmax, (n - 1) * davg + (per - 1) * p))))
    return worst


# ---------------------------------------------------------------------------- NVLS, PAT, p2p


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


def _nvls_schedule(topo: Topology, demand: Demand, timing: EpochTiming, w: int) -> list:
    gs = GreedyScheduler(topo, timing)
    idx = topo.link_index
    for c in range(demand.chunks):
        for g in topo.gpus:
            up = idx[(g, w)]
            hops = [(up, 0)] + [(idx[(w, v)], int(timing.hop_delay[up])) for v in topo.gpus if v != g]
            k = gs.book.place(hops, 0)
            gs.sends.extend((k + off, li, g, c) for li, off in hops)
    return sorted(gs.sends)


def _pat_schedule(topo: Topology, demand: Demand, timing: EpochTiming) -> list:
    gpus = list(topo.gpus)
    n = len(gpus)
    gs = GreedyScheduler(topo, timing)
    have = {r: {r} for r in range(n)}
    d = 1 << max(0, math.ceil(math.log2(n)) - 1)
    while d >= 1:
        moves = []
        for r in range(n):
            t = (r + d) % n
            moves.append((r, t, sorted(have[r] - have[t])))
        for r, t, blocks in moves:
            for b in blocks:
                for c in range(demand.chunks):
                    gs.transfer(gpus[b], c, gpus[r], gpus[t])
            have[t] |= set(blocks)
        d //= 2
    return sorted(gs.sends)


def _p2p_order(n: int, ppn: int) -> list[int]:
    """NCCL's peer deltas (init.cc ncclP2pSchedule): on one host (s + d) % n in turn; across
    hosts, host deltas in the quadratic order (x^2 + x)/2 mod the next power of two, each with
    local deltas 0..ppn-1."""
    nodes = n // ppn
    if nodes <= 1:
        return list(range(1, n))
    p2 = 1 << (nodes - 1).bit_length()
    gds = []
    x = 0
    while len(gds) < nodes:
        g = ((x * x + x) // 2) % p2
        if g < nodes and g not in gds:
            gds.append(g)
        x += 1
    return [gd * ppn + ld for gd in gds for ld in range(ppn) if gd * ppn + ld]


def _p2p_schedule(topo: Topology, demand: Demand, timing: EpochTiming) -> list:
    hs = hosts(topo)
    gpus = list(topo.gpus)
    n = len(gpus)
    ppn = len(hs[0].gpus) if all(len(h.gpus) == len(hs[0].gpus) for h in hs) else n
    host_of = {g: hi for hi, h in enumerate(hs) for g in h.gpus}
    local = {g: h.gpus.index(g) for h in hs for g in h.gpus}
    nic_gpu = {}  # (host, local index of the destination) -> the GPU of this host on that rail
    for hi, h in enumerate(hs):
        for nic in h.nics:
            for g in nic.into:
                nic_gpu[(hi, h.gpus.index(g))] = nic.out[0]
        for i in range(len(h.gpus)):
            nic_gpu.setdefault((hi, i), h.nics[i * len(h.nics) // len(h.gpus)].out[0] if h.nics else h.gpus[i])
    paths = _Paths(topo, timing)
    gs = GreedyScheduler(topo, timing)
    pos = {g: i for i, g in enumerate(gpus)}
    route = {}
    for delta in _p2p_order(n, ppn):
        for s in gpus:
            d = gpus[(pos[s] + delta) % n]
            via = None if host_of[s] == host_of[d] else nic_gpu[(host_of[s], local[d])]
            route[(s, d)] = _segments(paths, s, d, via)
    # every pair progresses at once (NCCL runs all peers concurrently): pieces interleaved
    for c in range(demand.chunks):
        for delta in _p2p_order(n, ppn):
            for s in gpus:
                d = gpus[(pos[s] + delta) % n]
                chunk = pos[d] * demand.chunks + c
                segs = route[(s, d)]
                if segs is None:
                    gs.transfer(s, chunk, s, d)
                else:
                    _move(gs, s, chunk, segs, 0)
    return sorted(gs.sends)


# ---------------------------------------------------------------------------- the model


@dataclass
class Modelled:
    """One NCCL algorithm on this topology: its time and how it was obtained."""

    name: str
    time_us: float
    how: str  # "simulated" | "recurrence" | "tuning model"
    chunks: int = 0
    channels: int = 0
    protocol: str = "Simple"
    schedule: Schedule | None = field(default=None, repr=False)


@dataclass
class NcclModel:
    algorithms: dict[str, Modelled]
    tuning: dict[str, Estimate]

    @property
    def best(self) -> Modelled:
        return min(self.algorithms.values(), key=lambda m: m.time_us)

    def report(self) -> dict:
        tb = min(self.tuning.values(), key=lambda e: e.time_us) if self.tuning else None
        return {
            "algorithms": {k: m.time_us for k, m in self.algorithms.items()},
            "best": self.best.name,
            "best_us": self.best.time_us,
            "how": {k: m.how for k, m in self.algorithms.items()},
            "chunks": {k: m.chunks for k, m in self.algorithms.items() if m.chunks},
            "channels": {k: m.channels for k, m in self.algorithms.items() if m.channels},
            "tuning": {"source": NCCL_TUNING_SOURCE, "algorithms": {k: e.time_us for k, e in self.tuning.items()},
                       "protocols": {k: e.protocol for k, e in self.tuning.items()},
                       "best": tb.algorithm if tb else None, "best_us": tb.time_us if tb else None},
        }


def machine(topo: Topology) -> Machine:
    """The figures NCCL's cost model takes, read off the topology."""
    hs = hosts(topo)
    nodes = topo.nodes
    g0 = hs[0].gpus[0]
    intra = sum(lk.bandwidth_GBps for lk in topo.links if lk.src == g0 and nodes[lk.dst].group == nodes[g0].group)
    nic = 0.0
    nics = len(hs[0].nics)
    if len(hs) > 1 and nics:
        grp = nodes[g0].group
        outs = [lk.bandwidth_GBps for lk in topo.links if nodes[lk.src].group == grp and nodes[lk.dst].group != grp]
        nic = min(outs) if outs else 0.0
    fab = topo.params.get("fabric", {})
    node = str(fab.get("node", ""))
    arch = {"dgx-a100": "ampere", "a800": "ampere", "dgx-h100": "hopper", "h800": "hopper", "hgx-b200": "blackwell",
            "dgx2": "volta", "ndv2": "volta"}.get(node, "hopper")
    if len(hs[0].gpus) == 1:
        intra = max(intra, nic * max(1, nics))
    return Machine(len(topo.gpus), len(hs), intra, nic, nics, nvls_switch(topo) is not None or (
        fab.get("multicast", None) is not False and any(nodes[w].copy for w in topo.switches if nodes[w].group is not None)), arch)


def _chunks(block: float, channels: int, piece: int) -> int:
    return channels * max(1, math.ceil(block / channels / piece))


def _fit_budget(chunks: int, channels: int, per_chunk_sends: int) -> int:
    while chunks > channels and chunks * per_chunk_sends > SEND_BUDGET:
        chunks = max(channels, channels * ((chunks // channels) // 2))
    return chunks


def _timed(topo: Topology, coll: Collective, size: int, chunks: int, build, name: str, channels: int = 1) -> Modelled:
    demand = make_demand(topo, coll, size, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    sends = build(topo, demand, timing)
    sched = Schedule.from_tuples(topo, demand, timing.tau, sends, {"method": f"nccl {name}"})
    sim = simulate(sched)
    if not sim.valid:  # built by the same rules; this guards the builder
        raise AssertionError(f"NCCL {name} schedule failed verification: {sim.first_violation}")
    return Modelled(name, sim.finish_time_s * 1e6, "simulated", chunks, channels, schedule=sched)


def model_nccl(topo: Topology, collective: Collective | str, size_bytes: int) -> NcclModel:
    """Every NCCL algorithm for ``collective`` of ``size_bytes`` on ``topo``: modelled as schedules
    where the IR can express them (replayed by the simulator), NCCL's own estimate for each."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    n = len(topo.gpus)
    block = size_bytes / topo.buffer_ranks
    out: dict[str, Modelled] = {}
    m = machine(topo)
    tuning = best_per_algorithm(coll, m, size_bytes)
    if coll is Collective.ALLTOALL:
        chunks = _fit_budget(min(P2P_MAX_PIECES, max(1, math.ceil(block / PIPE_BYTES))), 1, n * (n - 1) * 3)
        out["p2p"] = _timed(topo, coll, size_bytes, chunks, _p2p_schedule, "p2p")
    else:
        chans = ring_channels(topo)
        nch = len(chans)
        hops = 2 * n * (n - 1) * 3 if coll is Collective.ALLREDUCE else n * (n - 1) * 3
        want = _chunks(block, nch, PIPE_BYTES)
        chunks = _fit_budget(want, nch, hops // nch)
        if chunks * (hops // nch) <= SEND_BUDGET:
            out["ring"] = _timed(topo, coll, size_bytes, chunks, _reduction(coll, lambda t, d, tm: _ring_schedule(t, d, tm, ring_channels(t))),
                                 "ring", nch)
        else:
            d = make_demand(topo, Collective.ALLGATHER, size_bytes, chunks)
            tm = epoch_timing(topo, d.chunk_bytes, "fast")
            ep = ring_epochs_estimate(topo, tm, chans, chunks) * (2 if coll is Collective.ALLREDUCE else 1)
            out["ring"] = Modelled("ring", ep * tm.tau * 1e6, "recurrence", chunks, nch)
        w = nvls_switch(topo)
        if coll is Collective.ALLGATHER and w is not None:
            c = _fit_budget(min(NVLS_MAX_PIECES, max(1, math.ceil(block / NVLS_BYTES))), 1, n * n)
            out["nvls"] = _timed(topo, coll, size_bytes, c, lambda t, d, tm: _nvls_schedule(t, d, tm, w), "nvls")
        hs = hosts(topo)
        if coll in (Collective.ALLGATHER, Collective.REDUCESCATTER) and len(hs) > 1 and all(len(h.gpus) == 1 for h in hs):
            c = _fit_budget(max(1, math.ceil(block / PIPE_BYTES)), 1, n * n * 2)
            out["pat"] = _timed(topo, coll, size_bytes, c, _reduction(coll, _pat_schedule), "pat")
    for name, e in tuning.items():
        if name not in out:  # not expressible in the IR: NCCL's own estimate stands in
            out[name] = Modelled(name, e.time_us, "tuning model", protocol=e.protocol)
    return NcclModel(out, tuning)


def _reduction(coll: Collective, build_ag):
    """A builder of ``coll``'s sends from an AllGather builder: ReduceScatter is the AllGather on
    the reversed links run backwards with sums, AllReduce that and then the AllGather."""
    if not coll.reduces:
        return build_ag

    def build(topo: Topology, demand: Demand, timing: EpochTiming) -> list:
        rev = topo.reversed()
        ag_d = make_demand(rev, Collective.ALLGATHER, demand.size_bytes, demand.chunks)
        rev_timing = epoch_timing(rev, ag_d.chunk_bytes, timing.tau)
        ag_rev = Schedule.from_tuples(rev, ag_d, timing.tau, build_ag(rev, ag_d, rev_timing))
        if coll is Collective.REDUCESCATTER:
            out = reduce_scatter_from_allgather(ag_rev, topo)
        else:
            fwd_d = make_demand(topo, Collective.ALLGATHER, demand.size_bytes, demand.chunks)
            ag = Schedule.from_tuples(topo, fwd_d, timing.tau, build_ag(topo, fwd_d, timing))
            out = allreduce_from_allgather(ag_rev, ag, topo)
        return [(s.epoch, s.link, s.source, s.chunk, 1 if s.reduce else 0) for s in out.sends]

    return build
