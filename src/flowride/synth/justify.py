"""An AllGather placed again in the order its reversal finishes: one forward-backward pass.

A forward list schedule starts every tree as early as it can and leaves its tail to whatever
links are left; on meshes and on switches that cannot copy the last chunks then wait on links
that the first ones no longer need (MI250 x 2, 1 MB: 314 epochs where its ReduceScatter, the same
trees run backwards, takes 300). The remedy is the classic one of project scheduling
(forward-backward improvement): run the schedule backwards, as the ReduceScatter of its trees, each
partial sent as early as it can in the order the AllGather delivered last-first, and then place the
AllGather again, forwards, hop by hop in the mirror of that order (the hop the backward pass sent
last goes first). The backward pass packs the tail; mirrored, the tail becomes the start, and the
forward pass that follows packs it again.

The trees stay the AllGather's own (each GPU's first copy of each chunk and the path it came
over, :func:`~flowride.schedule.reduce.allgather_tree`); only epochs change. The backward pass
runs on the reversed topology (same link ids, every link turned around), so it needs no reverse
links; the forward pass places each hop on the topology itself with
:func:`~flowride.schedule.reduce.place_path`, so what it returns is a schedule of the same
demand, which the caller replays and keeps only if it finishes sooner. A switch that copies gets
one send per child here (the forward pass places hops, not multicasts): on NVSwitch fabrics the
pass costs load and rarely wins, and the caller's replay turns it away.
"""

from __future__ import annotations

import time

from flowride.schedule.ir import Schedule
from flowride.schedule.links import LinkBook
from flowride.schedule.prune import prune_redundant
from flowride.schedule.reduce import allgather_tree, place_path
from flowride.topology.timing import epoch_timing

SECONDS_PER_SEND = 40e-6  # both passes and the tree's replay, per send, on one core (MI250 x 4, 1 GB: 36 us)


def justified_allgather(ag: Schedule, deadline: float | None = None) -> list[tuple[int, int, int, int]] | None:
    """``ag``'s trees placed backwards, then forwards in the mirror of that order: the sends
    (epoch, link, source, chunk) of an AllGather of the same demand on the same topology, or None
    when ``deadline`` (a ``time.perf_counter()`` value) passed before the forward pass began."""
    topo, timing = ag.topology, ag.timing
    hops = allgather_tree(prune_redundant(ag))
    back_timing = epoch_timing(topo.reversed(), timing.chunk_bytes, timing.tau)
    book = LinkBook(back_timing)
    ready: dict[tuple[int, int, int], int] = {}  # (source, chunk, gpu): its subtree's partials all arrived
    busy: set = set()
    sent: dict[int, int] = {}  # hop -> the epoch its partial left, backwards
    order = sorted(range(len(hops)), key=lambda i: (-hops[i].held, hops[i].source, hops[i].chunk, hops[i].gpu))
    for i in order:
        h = hops[i]
        path = list(reversed(h.links))  # the same link ids, turned around
        epochs = place_path(book, back_timing, path, ready.get((h.source, h.chunk, h.gpu), 0), busy, (h.source, h.chunk))
        sent[i] = epochs[0]
        key = (h.source, h.chunk, h.parent)
        ready[key] = max(ready.get(key, 0), back_timing.arrival(path[-1], epochs[-1]))
    if deadline is not None and time.perf_counter() > deadline:
        return None
    # forwards: the hop sent last backwards goes first. A parent's partial left after its child's
    # arrived, so a parent's hop always comes before its children's and its hold is known
    book = LinkBook(timing)
    hold: dict[tuple[int, int, int], int] = {}
    busy = set()
    sends: list[tuple[int, int, int, int]] = []
    for i in sorted(range(len(hops)), key=lambda i: (-sent[i], hops[i].source, hops[i].chunk, hops[i].gpu)):
        h = hops[i]
        start = 0 if h.parent == h.source else hold[(h.source, h.chunk, h.parent)]
        epochs = place_path(book, timing, list(h.links), start, busy, (h.source, h.chunk))
        sends.extend((k, li, h.source, h.chunk) for li, k in zip(h.links, epochs, strict=True))
        hold[(h.source, h.chunk, h.gpu)] = timing.arrival(h.links[-1], epochs[-1])
    sends.sort()
    return sends
