"""Packed trees (:mod:`flowride.synth.packing`) turned into an epoch schedule.

Each root's block is cut into the demand's chunks; chunk c of root r rides one of r's trees, the
trees taking chunks in proportion to their shares (weighted round robin, so the first chunks
already use every tree). A tree edge out of a GPU is one transfer: the GPU puts the chunk on its
route, and where the route ends at a copying switch, that switch's own edges follow in the same
placement (a switch forwards in the epoch a chunk arrives), so one placement is a small tree of
(link, offset) hops.

Transfers are list-scheduled in time order: the one that can start earliest is placed first (ties:
the older chunk, then the one with more of its tree below it), each at the earliest epoch where
every hop has room in its capacity window (:meth:`flowride.schedule.links.LinkBook.place`). A
transfer whose earliest start moved past its turn goes back in the queue at that start, so a
relay of an old chunk is never stuck behind a root's later chunks on a shared link.

Slotted (a variant): where whole paths run over links that take one chunk per window of w epochs
(MI250's NIC uplinks and downlinks), their transfers start on a grid every w epochs and each
slot's transfers are matched, uplinks to downlinks, instead of taken greedily.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import numpy as np

from flowride.schedule.links import LinkBook, OrbitBook, SlotOverflow
from flowride.synth.packing import PackedTree, Packing, TreeEdge
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming


def deal_chunks(trees: list[PackedTree], chunks: int) -> list[int]:
    """Tree index per chunk: chunks in proportion to the trees' shares (largest remainders), dealt
    so that every prefix of the chunks is as close to those shares as whole chunks allow."""
    w = np.array([t.weight for t in trees], dtype=np.float64)
    w = w / w.sum()
    quota = w * chunks
    n = np.floor(quota).astype(np.int64)
    short = chunks - int(n.sum())
    if short:
        n[np.argsort(-(quota - n), kind="stable")[:short]] += 1
    keep = n > 0
    out = []
    given = np.zeros(len(trees))
    for _ in range(chunks):
        # the tree furthest behind its share of what has been dealt so far
        lag = np.where(keep & (given < n), (given + 0.5) / np.maximum(n, 1), np.inf)
        t = int(np.argmin(lag))
        out.append(t)
        given[t] += 1
    return out


@dataclass
class _Unit:
    """One transfer of a tree: ``sender`` puts the chunk on ``prefix`` (its route to a GPU, or to a
    copying switch), and at a copying switch each of ``branches`` carries it on to one child's
    subtree in the epoch it arrives. Offsets count from the send."""

    sender: int
    prefix: list[tuple[int, int]]  # (link, offset)
    reached: list[tuple[int, int, int]]  # GPUs the prefix reaches: (gpu, last link, its offset)
    branches: list[tuple[list[tuple[int, int]], list[tuple[int, int, int]]]]  # (hops, reached) per child
    height: int = 0  # epochs on the longest way down from here (this transfer and those after it)
    splittable: bool = False  # the prefix is on one-epoch links: a copy may be sent again for some children

    def hops(self, branches=None) -> list[tuple[int, int]]:
        return self.prefix + [h for hops, _ in (self.branches if branches is None else branches) for h in hops]

    def all_reached(self, branches=None) -> list[tuple[int, int, int]]:
        return self.reached + [r for _, reached in (self.branches if branches is None else branches) for r in reached]


def _bundles(branches: list, timing: EpochTiming) -> list[list]:
    """The children of a copying switch, grouped so that no link carries more than its window's
    worth in one epoch within a group: two different tree edges leaving the switch over the same
    forwarding link in the same epoch would need two slots where there may be one."""
    out: list[tuple[list, dict]] = []
    for br in branches:
        need: dict[tuple[int, int], int] = {}
        for h in br[0]:
            need[h] = need.get(h, 0) + 1
        for bundle, used in out:
            if all(used.get(h, 0) + c <= int(timing.window_cap[h[0]]) for h, c in need.items()):
                bundle.append(br)
                for h, c in need.items():
                    used[h] = used.get(h, 0) + c
                break
        else:
            out.append(([br], dict(need)))
    return [b for b, _ in out]


def _units(topo: Topology, timing: EpochTiming, tree: PackedTree) -> tuple[list[_Unit], dict[int, list[int]]]:
    """The tree's transfers and, per GPU, the indices of those it sends."""
    out_of: dict[int, list[TreeEdge]] = {}
    for e in tree.edges:
        out_of.setdefault(e.parent, []).append(e)
    nodes = topo.nodes

    def grow(e: TreeEdge, start: int, hops: list, reached: list) -> None:
        off, last = start, start
        for li in e.links:
            hops.append((li, off))
            last = off
            off += int(timing.hop_delay[li])
        if nodes[e.child].is_gpu:
            reached.append((e.child, e.links[-1], last))
        else:  # a copying switch: its edges leave in the epoch the chunk arrives
            for f in out_of.get(e.child, []):
                grow(f, off, hops, reached)

    units: list[_Unit] = []
    for g in [tree.root] + [e.child for e in tree.edges if nodes[e.child].is_gpu]:
        for e in out_of.get(g, []):
            prefix: list[tuple[int, int]] = []
            reached: list[tuple[int, int, int]] = []
            if nodes[e.child].is_gpu:
                grow(e, 0, prefix, reached)
                units.append(_Unit(g, prefix, reached, []))
                continue
            off = 0
            for li in e.links:
                prefix.append((li, off))
                off += int(timing.hop_delay[li])
            branches = []
            for f in out_of.get(e.child, []):
                hops: list[tuple[int, int]] = []
                got: list[tuple[int, int, int]] = []
                grow(f, off, hops, got)
                branches.append((hops, got))
            single_epoch = all(int(timing.beta_epochs[li]) == 0 for li, _ in prefix)
            for bundle in _bundles(branches, timing):  # children whose hops would collide go in separate sends
                units.append(_Unit(g, prefix, [], bundle, splittable=single_epoch and len(bundle) > 1))
    by_sender: dict[int, list[int]] = {}
    for i, u in enumerate(units):
        by_sender.setdefault(u.sender, []).append(i)
    done: dict[int, int] = {}

    def tall(i: int) -> int:
        if i not in done:
            u = units[i]
            span = max(off + int(timing.hop_delay[li]) + int(timing.beta_epochs[li]) for li, off in u.hops())
            done[i] = span + max((tall(j) for v, _, _ in u.all_reached() for j in by_sender.get(v, [])), default=0)
        return done[i]

    for i, u in enumerate(units):
        u.height = tall(i)
    return units, by_sender


def _distinct(plans: dict) -> dict[tuple[int, int, int], tuple[_Unit, list[tuple[int, int]]]]:
    """Each distinct transfer of the plans once, as (units' id, move's id, unit index) -> (the
    unit, its hops moved to its root): the plans repeat them for every chunk."""
    out: dict[tuple[int, int, int], tuple[_Unit, list[tuple[int, int]]]] = {}
    for units, _, mv in plans.values():
        if (id(units), id(mv), 0) not in out:
            for i, u in enumerate(units):
                out[(id(units), id(mv), i)] = (u, mv.hops(u.hops()))
    return out


def _grid(plans: dict, timing: EpochTiming) -> dict[tuple[int, int, int], int]:
    """The transfers kept on a grid of starts, as (units' id, move's id, unit index) -> the grid's
    step: those whose hops on links with a window (b > 0) are all on links that take one chunk per
    window of the same w epochs (w >= 2), links that only such transfers use, each at one phase
    (offset mod w). On those links, starts on the grid fill every window end to end; a link that
    other transfers or other phases also use would only be cut into gaps. Links that take a chunk
    an epoch have no window to cut: any start suits them."""
    b, cap = timing.beta_epochs.tolist(), timing.window_cap.tolist()
    distinct = _distinct(plans)
    seen = {key: hops for key, (_, hops) in distinct.items()}
    cand: dict[tuple[int, int, int], int] = {}
    for key, (u, hops) in distinct.items():
        w = {b[li] + 1 if cap[li] == 1 else 0 for li, _ in hops if b[li] > 0}
        if len(w) == 1 and min(w) >= 2 and not u.branches:  # a multicast's children leave at their own times
            cand[key] = w.pop()
    while True:
        phase: dict[int, set] = {}
        for key, hops in seen.items():
            w = cand.get(key)
            for li, off in hops:
                if b[li] > 0:
                    phase.setdefault(li, set()).add(None if w is None else (w, off % w))
        drop = [key for key in cand if any(len(phase.get(li, ())) > 1 for li, _ in seen[key])]
        if not drop:
            return cand
        for key in drop:
            del cand[key]


def _other_routes(topo: Topology, timing: EpochTiming, plans: dict) -> dict[tuple[int, int, int], list[list[tuple[int, int]]]]:
    """Twin routes of the transfers that go GPU to GPU, as (units' id, move's id, unit index) ->
    hop lists (moved): the route with one forwarding switch in the middle swapped for another
    joined to the same two neighbours by links of the same timing (a Clos's other spines), so every
    hop keeps its offset. The packing priced one route per tree edge; on a leaf/spine fabric all of
    a leaf pair's edges then take the same spine, whose links (slower than the NICs) turn the
    GPUs' sends away every other epoch, while the other spines stand idle."""
    nodes = topo.nodes
    link_of: dict[tuple[int, int], int] = {}
    for li, lk in enumerate(topo.links):
        link_of.setdefault((lk.src, lk.dst), li)
    outs: dict[int, list[int]] = {}
    for li, lk in enumerate(topo.links):
        outs.setdefault(lk.src, []).append(li)
    same = np.stack([timing.hop_delay, timing.beta_epochs, timing.window_cap], axis=1).tolist()
    out: dict[tuple[int, int, int], list[list[tuple[int, int]]]] = {}
    for key, (u, hops) in _distinct(plans).items():
        if u.branches:
            continue
        alts = []
        for j in range(len(hops) - 1):
            (a, off_a), (b, off_b) = hops[j], hops[j + 1]
            x, y, z = topo.links[a].src, topo.links[a].dst, topo.links[b].dst
            if nodes[y].is_gpu or nodes[y].copy:
                continue
            for la in outs.get(x, ()):
                y2 = topo.links[la].dst
                lb = link_of.get((y2, z))
                if y2 != y and lb is not None and not nodes[y2].is_gpu and not nodes[y2].copy and same[la] == same[a] and same[lb] == same[b]:
                    alts.append(hops[:j] + [(la, off_a), (lb, off_b)] + hops[j + 2:])
        if alts:
            out[key] = alts
    return out


def _matched_slot(book, k: int, order: list[int], options: list) -> tuple[list[int], list[int], dict]:
    """Places at start ``k`` as many of the transfers as fit together, each on one of its
    ``options`` (hop lists: its route, then twin routes), tried in ``order``: first each in turn,
    then swaps that take one placed transfer out for two that did not fit. Returns (placed, not
    placed), each in ``order``, and the hops each placed one took.

    Why: where every slow link takes one chunk per window and the starts keep to a grid of those
    windows, the transfers of one slot are a bipartite matching (MI250's NIC uplinks to downlinks),
    and taking them greedily in priority order leaves an uplink idle whenever all its ready chunks
    go to downlinks that higher-priority transfers took. The swap is the matching's augmenting path
    of three edges. Candidates are paired by the book's rows they share (a row holds one chunk per
    window here; a transfer with twin routes by the rows all its routes need), and the book itself
    has the last word on each swap."""
    chosen: dict[int, list] = {}

    def put(j: int) -> bool:
        for h in options[j]:
            if book.blocked(h, k) is None and book.place(h, k, k) == k:
                chosen[j] = h
                return True
        return False

    def lift(j: int) -> list:
        h = chosen.pop(j)
        for li, off in h:
            book.release(li, k + off)
        return h

    placed = [j for j in order if put(j)]
    if len(placed) == len(order):
        return placed, [], chosen
    need = {j: set.intersection(*({book.row_of(li) for li, _ in h} for h in options[j])) for j in order}
    rank = {j: n for n, j in enumerate(order)}
    stuck: set[int] = set()  # held back by chunks outside the slot: no swap frees them
    while True:
        done = set(placed)
        out = [j for j in order if j not in done]
        holder: dict[int, list[int]] = {}
        for j in placed:
            for r in {book.row_of(li) for li, _ in chosen[j]}:
                holder.setdefault(r, []).append(j)
        waiting: dict[int, list[int]] = {}
        for j in out:
            if j not in stuck:
                for r in need[j]:
                    waiting.setdefault(r, []).append(j)
        swap = None
        for t in out:
            if t in stuck:
                continue
            conf = {p for r in need[t] for p in holder.get(r, ())}
            if len(conf) != 1:
                continue
            (p,) = conf
            # a second transfer for p's rows that t does not take, clear of every other placed one
            qs = {q for r in {book.row_of(li) for li, _ in chosen[p]} - need[t] for q in waiting.get(r, ())
                  if q != t and not need[q] & need[t] and all(holder.get(r2, [p]) == [p] for r2 in need[q])}
            if not qs:
                continue
            was = lift(p)
            if all(book.blocked(h, k) is not None for h in options[t]):
                stuck.add(t)
            elif put(t):
                for q in sorted(qs, key=rank.__getitem__):
                    if put(q):
                        swap = (p, t, q)
                        break
                if swap:
                    break
                lift(t)
            if book.place(was, k, k) != k:  # its own hops were free a moment ago
                raise AssertionError("a transfer taken out of its slot did not fit back")
            chosen[p] = was
        if swap is None:
            return placed, out, chosen
        p, t, q = swap
        placed = sorted([j for j in placed if j != p] + [t, q], key=rank.__getitem__)


class _Move:
    """Maps a rep tree's node and link ids to another root's (the symmetry's element), or nothing."""

    def __init__(self, node=None, link=None) -> None:
        self.node = node
        self.link = link

    def hops(self, hops: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return hops if self.link is None else [(self.link[li], off) for li, off in hops]

    def reached(self, reached: list[tuple[int, int, int]]) -> list[tuple[int, int, int, int]]:
        """(GPU, link, offset, the GPU in the rep tree's ids)."""
        if self.node is None:
            return [(v, li, off, v) for v, li, off in reached]
        return [(self.node[v], self.link[li], off, v) for v, li, off in reached]


def _free_on(link_images: np.ndarray, links: set[int]) -> bool:
    """Whether no element but the identity fixes any of ``links`` (a link an element fixes would
    carry that many images of one transfer in one epoch: the symmetric placement must not apply)."""
    ids = np.fromiter(links, dtype=np.int64)
    return bool(((link_images[:, ids] == ids[None, :]).sum(axis=0) <= 1).all())


def forest_sends(topo: Topology, demand, timing: EpochTiming, packing: Packing, order: str = "slack",
                 split: bool = True, serial: bool = False, deadline: float | None = None, slotted: bool = False,
                 routed: bool = False) -> list[tuple[int, int, int, int]] | None:
    """The AllGather's sends along ``packing``'s trees at ``timing`` (see :func:`_forest_sends`).

    Where the packing has a symmetry that moves each rep root to |G| other roots and fixes none of
    the trees' links, the reps' transfers are placed with all their images at once (an
    :class:`~flowride.schedule.links.OrbitBook`): |G| times fewer placements. A transfer whose own
    images would collide (a multicast through a copying switch to GPUs the symmetry permutes
    among themselves needs one slot per image in one epoch) makes that schedule impossible: then
    every root is placed on its own."""
    images = packing.images
    if routed:  # other routes use links the symmetry check did not see: every root on its own
        return _forest_sends(topo, demand, timing, packing, order, split, serial, deadline, orbit=False, slotted=slotted, routed=True)
    if (images is not None and len(images.of_root) == len(images.node) * len(packing.trees)
            and _free_on(images.link, {li for ts in packing.trees.values() for t in ts for e in t.edges for li in e.links})):
        try:
            return _forest_sends(topo, demand, timing, packing, order, split, serial, deadline, orbit=True, slotted=slotted)
        except SlotOverflow:
            pass
    return _forest_sends(topo, demand, timing, packing, order, split, serial, deadline, orbit=False, slotted=slotted)


def _forest_sends(topo: Topology, demand, timing: EpochTiming, packing: Packing, order: str, split: bool, serial: bool,
                  deadline: float | None, orbit: bool, slotted: bool = False, routed: bool = False) -> list[tuple[int, int, int, int]] | None:
    """The AllGather's sends along ``packing``'s trees at ``timing`` (see the module).

    ``order`` ranks transfers that can start in the same epoch: "slack" (default: the chunk's turn
    in the packing's fluid time less the epochs still below the transfer, so the transfer that
    would fall furthest behind the fluid schedule goes first) or "chunk" (older chunks first, then
    deeper subtrees). ``split``: a multicast through a copying switch whose children's links are
    not all free may go to those that are now and be sent again for the rest later (only where the
    sender's way to the switch is on one-epoch links, so the extra copy costs little). ``serial``:
    each transfer placed once, in priority order, at its earliest fit (faster, sometimes better).
    ``deadline`` (a ``time.perf_counter()`` value): past it the scheduling stops and None is returned.
    ``slotted`` (not with ``serial``): the transfers :func:`_grid` finds start on a grid of their
    links' windows, each slot placed as a matching (:func:`_matched_slot`); [] where none is on a
    grid (the schedule would be the plain one).
    A symmetric packing's trees are moved to each root on the fly (one set of transfers per rep)."""
    chunks = demand.chunks
    ticks = 0
    per = demand.chunk_bytes / packing.rate_Bps / timing.tau  # epochs per chunk of a root, fluid

    def prio(c: int, u: _Unit) -> tuple:
        return (c, -u.height) if order == "chunk" else (c * per - u.height, c)

    images = packing.images
    # orbit: place the reps' transfers only, each with all its images at once, and copy the sends
    # to the other roots at the end
    book = OrbitBook(timing, images.link) if orbit else LinkBook(timing)
    plans: dict[tuple[int, int], tuple[list[_Unit], dict[int, list[int]], _Move]] = {}
    heap: list = []  # (start, priority, priority, seq, source, chunk, unit, branches or None); serial: priorities first
    seq = 0
    cache: dict[int, tuple] = {}
    dealt: dict[int, list[int]] = {}
    moves: dict[int, _Move] = {}
    for root in sorted(packing.trees) if orbit else packing.roots():
        g, rep = images.of_root[root] if images and not orbit else (0, root)
        trees = packing.trees[rep]
        if rep not in dealt:
            dealt[rep] = deal_chunks(trees, chunks)
        if g not in moves:
            moves[g] = _Move() if images is None or g == 0 or orbit else _Move(images.node[g].tolist(), images.link[g].tolist())
        for c, ti in enumerate(dealt[rep]):
            key = id(trees[ti])
            if key not in cache:
                cache[key] = _units(topo, timing, trees[ti])
            units, by_sender = cache[key]
            plans[(root, c)] = (units, by_sender, moves[g])
            for i in by_sender.get(rep, []):
                heap.append((*prio(c, units[i]), 0, seq, root, c, i, None) if serial else (0, *prio(c, units[i]), seq, root, c, i, None))
                seq += 1
    heapq.heapify(heap)
    slotted = slotted and not serial
    grid = _grid(plans, timing) if slotted else {}
    if slotted and not grid:  # nothing on a grid: the schedule would be the unslotted one
        return []

    others = _other_routes(topo, timing, plans) if routed and not serial else {}
    if routed and not others:  # no route has a twin: the schedule would be the plain one
        return []

    def slot(i: int, s: int, c: int) -> int:
        """The grid step of the transfer's starts (0: none): its links' window where slotted, one
        epoch for a transfer with twin routes (each epoch's transfers matched, routes picked)."""
        units, _, mv = plans[(s, c)]
        key = (id(units), id(mv), i)
        return grid.get(key, 0) or (1 if key in others else 0)

    hold: dict[tuple[int, int, int], int] = {}
    sends: list[tuple[int, int, int, int]] = []

    def commit(s: int, c: int, k: int, hops, reached) -> None:
        """``hops`` already moved to s's ids; ``reached`` in the rep tree's."""
        nonlocal seq
        sends.extend((k + off, li, s, c) for li, off in hops)
        units, by_sender, mv = plans[(s, c)]
        for v, li, off, v_rep in mv.reached(reached):
            if (s, c, v) in hold:
                continue
            t = hold[(s, c, v)] = timing.arrival(li, k + off)
            for j in by_sender.get(v_rep, []):
                heapq.heappush(heap, (*prio(c, units[j]), t, seq, s, c, j, None) if serial else (t, *prio(c, units[j]), seq, s, c, j, None))
                seq += 1

    while heap and serial:
        ticks += 1
        if deadline is not None and ticks % 4096 == 0 and time.perf_counter() > deadline:
            return None
        p1, p2, start, _, s, c, i, _ = heapq.heappop(heap)
        units, _, mv = plans[(s, c)]
        u = units[i]
        if not (split and u.splittable):
            hops = mv.hops(u.hops())
            commit(s, c, book.place(hops, start), hops, u.all_reached())
            continue
        # each child's earliest start with the prefix, then one send per distinct start
        when: dict[int, list] = {}
        for br in u.branches:
            hops = mv.hops(u.prefix + br[0])
            kb = book.place(hops, start)
            for li, off in hops:
                book.release(li, kb + off)
            when.setdefault(kb, []).append(br)
        for kb in sorted(when):
            hops = mv.hops(u.prefix + [h for hops_, _ in when[kb] for h in hops_])
            commit(s, c, book.place(hops, kb), hops, [r for _, got in when[kb] for r in got])
    while heap:
        ticks += 1
        if deadline is not None and ticks % 4096 == 0 and time.perf_counter() > deadline:
            return None
        start, p1, p2, _, s, c, i, left = heapq.heappop(heap)
        units, _, mv = plans[(s, c)]
        u = units[i]
        w = slot(i, s, c) if (grid or others) and left is None else 0
        if w:
            if start % w:  # to the grid: a start between two slots would waste part of each window
                heapq.heappush(heap, (start + w - start % w, p1, p2, seq, s, c, i, left))
                seq += 1
                continue
            batch = [(p1, p2, seq, s, c, i)]
            rest = []
            while heap and heap[0][0] == start:
                e = heapq.heappop(heap)
                (batch.append(e[1:7]) if e[7] is None and slot(e[6], e[4], e[5]) == w else rest.append(e))
            for e in rest:
                heapq.heappush(heap, e)
            options = []
            for e in batch:
                units_e, _, mv_e = plans[(e[3], e[4])]
                options.append([mv_e.hops(units_e[e[5]].hops())] + others.get((id(units_e), id(mv_e), e[5]), []))
            placed, out, chosen = _matched_slot(book, start, sorted(range(len(batch)), key=lambda j: batch[j][:3]), options)
            for j in placed:
                _, _, _, s, c, i = batch[j]
                commit(s, c, start, chosen[j], plans[(s, c)][0][i].all_reached())
            for j in out:  # back in the queue for the next slot
                heapq.heappush(heap, (start + w, *batch[j][:2], seq, *batch[j][3:], None))
                seq += 1
            continue
        branches = u.branches if left is None else left
        hops = mv.hops(u.hops(branches))
        splittable = split and u.splittable
        prefix = mv.hops(u.prefix) if splittable else hops
        # A turn that cannot start goes back in the queue at the first start its blocking hop
        # allows: one look at the hops, nothing taken (on a saturated link most turns end so).
        # A transfer that may go to some children now and the rest later needs its way to the
        # switch free now, and then the children whose subtrees have room.
        later = book.blocked(prefix, start)
        whole = later if later is not None or not splittable else book.blocked(hops, start)
        if whole is None:
            k = book.place(hops, start)
            if k == start:
                commit(s, c, k, hops, u.all_reached(branches))
                continue
            for li, off in hops:  # a link crossed twice: its start is later
                book.release(li, k + off)
            later = k
        elif later is None:  # the way to the switch is free now, some child's subtree is not
            kp = book.place(prefix, start)
            if kp == start:
                now = []  # the children whose whole subtree has room now
                for br in branches:
                    bh = mv.hops(br[0])
                    if book.blocked(bh, start) is None:
                        kb = book.place(bh, start)
                        if kb == start:
                            now.append((br, bh))
                            continue
                        for li, off in bh:  # undo a probe that had to move on
                            book.release(li, kb + off)
                if now:
                    rest = [br for br in branches if all(br is not b for b, _ in now)]
                    commit(s, c, start, prefix + [h for _, bh in now for h in bh], [r for (_, got), _ in now for r in got])
                    heapq.heappush(heap, (start + 1, p1, p2, seq, s, c, i, rest))
                    seq += 1
                    continue
            for li, off in prefix:
                book.release(li, kp + off)
            later = whole
        heapq.heappush(heap, (later, p1, p2, seq, s, c, i, left))
        seq += 1
    if orbit:
        node, link = images.node.tolist(), images.link.tolist()
        sends = [(k, lk[li], nd[s], c) for nd, lk in zip(node, link, strict=True) for k, li, s, c in sends]
    sends.sort()
    return sends
