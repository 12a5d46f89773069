"""Collectives in matched rounds: the slow links of a fabric kept busy every slot (König's theorem).

On a fabric whose GPUs share slow NIC links through switches that cannot buffer (MI250's NIC
switches, one per two GCDs; an A800 Clos with one NIC per two GPUs), a chunk crossing the fabric
holds a whole path of slow links at once: its sender's uplink and its receiver's downlink, in the
same window. The direct AlltoAll and the LP's paths are list-scheduled chunk by chunk at the
earliest epoch with room, and the windows they leave are fragments: an uplink waits because the
one downlink its next chunk needs is busy, while other downlinks idle. On MI250 x 2 that lost
41% against the cut bound (AlltoAll 1 GB: 362 epochs for a bound of 256).

Here the slow links are scheduled in slots, each one slow window long (``b + 1`` epochs of the
slowest link class). A chunk that crosses them is an edge from the busiest slow link on its way
out (its uplink) to the busiest on its way in (its downlink): a bipartite multigraph whose largest
degree is the busiest link's load in slots. König's theorem colours such a graph's edges with
exactly that many colours, each colour a set of chunks no two of which share an uplink or a
downlink: one slot each. The colouring is built as that many perfect matchings of the graph made
regular with placeholder edges (a regular bipartite multigraph always has one; scipy's
Hopcroft-Karp finds it). Each slot's chunks are then placed at the slot's start through the
shared :class:`~flowride.schedule.links.LinkBook` (so every capacity window is still checked, and a
chunk whose other links are busy moves to the earliest start that fits), and the chunks that
never touch a slow link fill the fast links around them.

Routes hold the least link time (:func:`lean_routes`), with equal routes sharing the load. Where
the bipartite picture fits the fabric (each chunk's slow links conflict only through its uplink and
downlink: MI250's NIC switches) the schedule meets the busiest link's load exactly, plus one path's
latency; where it does not (a Clos, whose spines are a third shared link), the LinkBook moves the
chunks that collide, and what is lost is measured (docs/synthesis.md).

The same slots carry an AllGather's crossings between groups (:func:`matched_allgather`): without
copies in the fabric each block must cross to every other group once, which is what the cut
bound counts.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra, maximum_bipartite_matching

from flowride.collectives.demand import Demand
from flowride.schedule.links import LinkBook
from flowride.synth.greedy import load_epochs, walk_links
from flowride.synth.result import Send
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming


def _segments(topo: Topology, links: list[int]) -> list[list[int]]:
    """A path cut into GPU -> switch* -> GPU segments (each placed as one piece)."""
    segs, cur = [], []
    for li in links:
        cur.append(li)
        if topo.nodes[topo.links[li].dst].is_gpu:
            segs.append(cur)
            cur = []
    return segs


def matched_rounds(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """A slot per edge of the bipartite multigraph (``left[i]``, ``right[i]``) such that no two
    edges of one slot share a vertex, using exactly the largest degree's count of slots (König).

    The graph is made regular: both sides padded to the same size, and placeholder edges joining
    vertices short of the largest degree. Every slot is then one perfect matching of the edges
    still uncoloured (a regular bipartite multigraph has one: Hall's condition), real edges taken
    before placeholders between the same two vertices. A matching is used for as many slots in a
    row as all its edges have copies left (the graph stays regular), so the rounds of matching
    number the distinct edges, not the slots."""
    m = len(left)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    n = max(int(left.max()), int(right.max())) + 1
    dl, dr = np.bincount(left, minlength=n), np.bincount(right, minlength=n)
    delta = int(max(dl.max(), dr.max()))
    edge: dict[tuple[int, int], int] = {}  # (u, v) -> index into the distinct edges
    members: list[list[int]] = []  # real edges per distinct edge
    count: list[int] = []  # real and placeholder copies left per distinct edge
    for e, uv in enumerate(zip(left.tolist(), right.tolist(), strict=True)):
        i = edge.setdefault(uv, len(edge))
        if i == len(members):
            members.append([])
            count.append(0)
        members[i].append(e)
        count[i] += 1
    need_l, need_r = (delta - dl).tolist(), (delta - dr).tolist()
    j = 0
    for u in range(n):  # pair up the shortfalls (each side's total is n * delta - m)
        while need_l[u] > 0:
            while need_r[j] == 0:
                j += 1
            k = min(need_l[u], need_r[j])
            i = edge.setdefault((u, j), len(edge))
            if i == len(members):
                members.append([])
                count.append(0)
            count[i] += k
            need_l[u] -= k
            need_r[j] -= k
    eu = np.array([uv[0] for uv in edge], dtype=np.int64)
    ev = np.array([uv[1] for uv in edge], dtype=np.int64)
    cnt = np.array(count, dtype=np.int64)
    slot = np.full(m, -1, dtype=np.int64)
    rows = np.arange(n)
    t = 0
    while t < delta:
        live = np.flatnonzero(cnt > 0)
        g = sp.csr_matrix((np.ones(len(live)), (eu[live], ev[live])), shape=(n, n))
        match = maximum_bipartite_matching(g, perm_type="column")
        chosen = np.array([edge[(u, v)] for u, v in zip(rows.tolist(), match.tolist(), strict=True)], dtype=np.int64)
        reps = int(cnt[chosen].min())  # the same matching this many slots in a row
        for i in chosen.tolist():
            take = members[i]
            for r in range(min(reps, len(take))):
                slot[take.pop()] = t + r
        cnt[chosen] -= reps
        t += reps
    return slot


SPREAD = 0.01  # a link's weight grows by at most 1% with its load: ties are spread, nothing longer is taken
# the spreads the LP route tries (each a fraction of a second): 1% keeps MI250's chunks on their own
# NICs (the bound); 100% moves A800 Clos chunks off the busiest spines too (1.057 -> 1.006 at 1 GB)
MATCHED_SPREADS = (SPREAD, 1.0)


def lean_routes(topo: Topology, timing: EpochTiming, pairs: dict[int, dict[int, int]],
                spread: float = SPREAD) -> dict[tuple[int, int], list[int]]:
    """A route per (source, destination) of ``pairs`` (source -> destination -> chunks) that holds
    little link time and spreads the load.

    Each link weighs the epochs one chunk holds it, (b + 1) / window cap: fewest-epoch routes send
    some chunks between GPUs of one MI250 chassis out through the NIC switches and back (8 slow
    epochs beat three fast hops), loading the very uplinks whose busy time is the bound. Sources
    are routed one after another, each link's weight growing with the busy time already routed
    over it by at most ``spread`` (a share of its own weight): equal routes (the spines of a Clos)
    then share the load instead of one shortest-path tree taking them all. At 1% a longer route
    (out through the NICs and back, or over a neighbour's NIC) is never taken to spread load; at
    100% it may be (MI250 x 2: from the bound to 1.5x; A800 Clos: 1.057 to 1.006)."""
    hold = _hold(timing)
    busy = np.zeros(len(topo.links))
    routes: dict[tuple[int, int], list[int]] = {}
    for s in sorted(pairs):
        pred = _lean_pred(topo, timing, hold * spread * busy / max(1.0, float(busy.max())), s)
        for d, k in pairs[s].items():
            links = walk_links(topo, pred, s, d)
            routes[(s, d)] = links
            np.add.at(busy, links, hold[links] * k)
    return routes


def _hold(timing: EpochTiming) -> np.ndarray:
    """Epochs one chunk holds each link: (b + 1) / window cap."""
    return ((timing.beta_epochs + 1) / np.maximum(timing.window_cap, 1)).astype(np.float64)


def _lean_pred(topo: Topology, timing: EpochTiming, extra: np.ndarray | None = None, source: int | None = None) -> np.ndarray:
    """Dijkstra predecessors under the link-time weights (plus ``extra`` per link), ties to fewer
    epochs of delay: all sources, or one (``source``: its row)."""
    n = topo.num_nodes
    src, dst = topo.link_ends
    w = _hold(timing) + 1e-3 * (timing.hop_delay + 1) + (0.0 if extra is None else extra)
    _, pred = dijkstra(sp.csr_matrix((w, (src, dst)), shape=(n, n)), directed=True, indices=source,
                       return_predecessors=True)
    return pred


Piece = tuple[int, int, list[list[int]]]  # (source, chunk, the route's segments)


def matched_slots(timing: EpochTiming, pieces: list[Piece]) -> tuple[int, dict[tuple[int, int], int]]:
    """The slot length S (one window of the slowest links the pieces use) and a slot per (piece,
    segment) that crosses those links: König's colouring of each segment's busiest slow link on the
    way out against its busiest on the way in (module doc)."""
    b1 = timing.beta_epochs.astype(np.int64) + 1
    used = sorted({li for _, _, segs in pieces for seg in segs for li in seg})
    S = int(b1[used].max()) if used else 1
    slow = (b1 == S) & (timing.window_cap == 1)  # one chunk per slot on these
    load = np.zeros(len(timing.beta_epochs), dtype=np.int64)
    for _, _, segs in pieces:
        for seg in segs:
            load[[li for li in seg if slow[li]]] += 1  # a route crosses a link once
    outs: dict[int, int] = {}
    ins: dict[int, int] = {}
    left: list[int] = []
    right: list[int] = []
    colored: list[tuple[int, int]] = []  # (piece, segment) per edge
    for p, (_, _, segs) in enumerate(pieces):
        for j, seg in enumerate(segs):
            sl = [li for li in seg if slow[li]]
            if not sl:
                continue
            half = (len(sl) + 1) // 2  # the busiest slow link on the way out, and on the way in
            out = max(sl[:half], key=lambda li: load[li])
            into = max(sl[half:], key=lambda li: load[li]) if len(sl) > 1 else -1 - out  # one slow link: it alone
            left.append(outs.setdefault(out, len(outs)))
            right.append(ins.setdefault(into, len(ins)))
            colored.append((p, j))
    slots = matched_rounds(np.array(left, dtype=np.int64), np.array(right, dtype=np.int64))
    return S, dict(zip(colored, slots.tolist(), strict=True))


def place_pieces(book: LinkBook, timing: EpochTiming, pieces: list[Piece]) -> tuple[list[Send], list[int]]:
    """Sends for ``pieces``, slot by slot (:func:`matched_slots`), the pieces that never touch a
    slow link after them: a coloured segment at its slot's start where every hop fits there, else
    (and every other segment) at the earliest start that fits once it is held (each source holds
    its pieces from epoch 0). Returns the sends and each piece's arrival."""
    S, slot_of = matched_slots(timing, pieces)
    first = [min((slot_of.get((p, j), 1 << 40) for j in range(len(segs))), default=0) for p, (_, _, segs) in enumerate(pieces)]
    sends: list[Send] = []
    arrive = [0] * len(pieces)
    for p in sorted(range(len(pieces)), key=first.__getitem__):
        s, c, segs = pieces[p]
        at = 0
        for j, seg in enumerate(segs):
            hops = book.offsets(seg)
            t = slot_of.get((p, j))
            k = book.place(hops, t * S, until=t * S) if t is not None and t * S >= at else None
            if k is None:  # its slot is taken on another link (or it is not held yet): the earliest fit
                k = book.place(hops, at if t is None else max(at, t * S))
            sends.extend((k + off, li, s, c) for li, off in hops)
            li, off = hops[-1]
            at = timing.arrival(li, k + off)
        arrive[p] = at
    return sends, arrive


def matched_alltoall(topo: Topology, demand: Demand, timing: EpochTiming, spread: float = SPREAD) -> list[Send]:
    """A copy-free demand along :func:`lean_routes`, placed by :func:`place_pieces`. Every (link,
    epoch) goes through one LinkBook, so the schedule keeps every window's capacity whatever the
    fabric; how close it comes to the bound depends on how bipartite the fabric is."""
    pairs: dict[int, dict[int, int]] = defaultdict(dict)
    for q in demand.commodities:
        for d in q.dests:
            pairs[q.source][d] = pairs[q.source].get(d, 0) + 1
    routes = lean_routes(topo, timing, pairs, spread)
    pieces = [(q.source, q.chunk, _segments(topo, routes[(q.source, d)])) for q in demand.commodities for d in q.dests]
    sends, _ = place_pieces(LinkBook(timing), timing, pieces)
    sends.sort()
    return sends


def matched_allgather(topo: Topology, demand: Demand, timing: EpochTiming, spread: float = SPREAD,
                      outpace: int | None = None) -> list[Send] | None:
    """AllGather on a fabric of groups (nodes, chassis) joined by switches that cannot copy: each
    block crosses to every other group once, to one GPU there, in matched slots, and is spread
    inside each group from whoever holds it.

    Why: without copies in the fabric, a block bound for g groups must leave its own g times; the
    cut bound counts exactly those crossings. Each crossing is the AlltoAll's kind of chunk (an
    uplink and a downlink held together), so :func:`place_pieces` keeps every uplink busy; the
    receiver in each group is the one whose way in is least loaded so far (downlinks and
    receivers share the blocks evenly). Inside a group the block goes down the least-link-time
    tree from its holder (a star on a switch, relays on a mesh), each hop once its GPU holds it.
    None for a topology with fewer than two groups (nothing to cross), and, given ``outpace`` (the
    best schedule's epochs so far), where the links' load alone already takes that long: on MI250,
    whose chassis are meshes, spreading each block from one holder loads the xGMI links twice what
    the packed trees do, and placing it would only cost time."""
    gpus = sorted({q.source for q in demand.commodities} | {d for q in demand.commodities for d in q.dests})
    group = {g: topo.nodes[g].group for g in gpus}
    members: dict[object, list[int]] = defaultdict(list)
    for g in gpus:
        members[group[g]].append(g)
    if len(members) < 2 or None in members:
        return None
    hold = _hold(timing)
    pred = _lean_pred(topo, timing)
    # the crossings: each (source, chunk) to one GPU of every other group, the least loaded way in
    way = {(u, v): walk_links(topo, pred[u], u, v) for u in gpus for v in gpus if group[u] != group[v]}
    pad = len(topo.links)  # a padded route index reads a link with no load
    into_load = np.zeros(pad + 1)
    ways: dict[tuple[int, object], np.ndarray] = {}  # (source, group): its members' routes, one row each
    for u in gpus:
        for gid, ms in members.items():
            if gid != group[u]:
                rows = [way[(u, g)] for g in ms]
                m = np.full((len(ms), max(map(len, rows))), pad, dtype=np.int64)
                for i, r in enumerate(rows):
                    m[i, : len(r)] = r
                ways[(u, gid)] = m
    got = {gid: np.zeros(len(ms)) for gid, ms in members.items()}
    hold_p = np.append(hold, 0.0)
    cross: list[tuple[int, int, int]] = []  # (source, chunk, receiver)
    pairs: dict[int, dict[int, int]] = defaultdict(dict)
    for q in sorted(demand.commodities, key=lambda q: (q.chunk, q.source)):
        for gid, ms in members.items():
            if gid == group[q.source]:
                continue
            m = ways[(q.source, gid)]
            cost = into_load[m].max(axis=1)  # the busiest link on each member's way in so far
            i = int(np.lexsort((got[gid], cost))[0])  # then the fewest blocks received, then the lowest id
            into_load[m[i]] += hold_p[m[i]]
            got[gid][i] += 1
            r = ms[i]
            cross.append((q.source, q.chunk, r))
            pairs[q.source][r] = pairs[q.source].get(r, 0) + 1
    routes = lean_routes(topo, timing, pairs, spread)
    pieces = [(s, c, _segments(topo, routes[(s, r)])) for s, c, r in cross]
    holders = [q.source for q in demand.commodities] + [r for _, _, r in cross]
    plans: dict[int, list[tuple[int, int, list[int]]] | None] = {}
    for h in set(holders):
        plans[h] = _group_tree(topo, pred[h], members[group[h]], group, h)
        if plans[h] is None:
            return None  # a way between two GPUs of one group leaves it: not a fabric of groups
    if outpace is not None:  # each send is some GPU's one delivery, so the links' load bounds the finish
        # (a crossing relayed through a GPU may reach it twice; then the check may decline a
        # schedule that would have won, never pass a wrong one: it only skips work)
        load = np.zeros(len(topo.links))
        for _, _, segs in pieces:
            for seg in segs:
                load[seg] += 1
        for h, k in Counter(holders).items():
            for _, _, seg in plans[h]:
                load[seg] += k
        if load_epochs(timing, load) >= outpace:
            return None
    book = LinkBook(timing)
    sends, arrive = place_pieces(book, timing, pieces)
    # inside each group: from the holder (the source at 0, a receiver when its crossing arrives)
    heap = [(0, q.source, q.chunk, q.source) for q in demand.commodities]
    heap += [(t, s, c, r) for (s, c, r), t in zip(cross, arrive, strict=True)]
    heapq.heapify(heap)
    while heap:
        t, s, c, h = heapq.heappop(heap)
        plan = plans[h]
        held = {h: t}
        for v, u, seg in plan:  # each segment once its GPU holds the chunk, nearest GPUs first
            hops = book.offsets(seg)
            k = book.place(hops, held[u])
            sends.extend((k + off, li, s, c) for li, off in hops)
            li, off = hops[-1]
            held[v] = timing.arrival(li, k + off)
    sends.sort()
    return sends


def _group_tree(topo: Topology, pred_h: np.ndarray, ms: list[int], group: dict[int, object], h: int
                ) -> list[tuple[int, int, list[int]]] | None:
    """The least-link-time tree from h to the other GPUs of its group, as (GPU, the GPU it gets
    the chunk from, the GPU -> switch* -> GPU segment between them), nearest first; None if a
    way passes a GPU of another group."""
    parent: dict[int, tuple[int, list[int]]] = {}
    depth: dict[int, int] = {}
    for g in ms:
        if g == h:
            continue
        at = h
        for i, seg in enumerate(_segments(topo, walk_links(topo, pred_h, h, g))):
            v = topo.links[seg[-1]].dst
            if group.get(v) != group[h]:
                return None
            parent.setdefault(v, (at, seg))
            depth.setdefault(v, i)
            at = v
    return [(v, *parent[v]) for v in sorted(parent, key=lambda v: (depth[v], v))]
