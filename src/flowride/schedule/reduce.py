"""ReduceScatter and AllReduce schedules from an AllGather schedule run backwards.

An AllGather delivers chunk (s, c) from s to every GPU along a tree. Run that tree backwards in
time and every GPU sends its partial sum of (s, c) to the GPU it got the chunk from, after adding
the partials of the GPUs it had passed the chunk on to; the root s ends with every contribution:
a ReduceScatter. Two things keep the plain mirror image from being valid, so each reversed hop is
re-placed by list scheduling instead of copied:

- a switch cannot add: where the AllGather multicast a chunk at a switch, the reversed partials
  reach the switch separately and each needs its own trip out, so the link out of the switch
  carries more than the link in did;
- the reversed link may be slower or missing (asymmetric topologies).

Messages are placed in reversed-AllGather order (the GPUs that received last go first), each at
the earliest epoch after every partial it must include has arrived, where every link of its path
has room in its capacity window (a switch forwards in the epoch it receives). On a topology with
symmetric links and no switch the result is the exact mirror image of the AllGather (tested);
through cut-through switches whose links differ in speed it need not be, since a path's epochs
into and out of a switch then differ by direction.

The AllGather may be given on the *reversed* topology (every link turned around): reversing it in
time then uses exactly the links of the target topology, which is how ``flowride synth`` builds
reductions on topologies whose links are not symmetric (the TE-CCL NDv2 model has one-way links
between chassis). Then the hops keep their links' latency and bandwidth; only the order of hops
through switches changes epochs.

AllReduce is that ReduceScatter followed by an AllGather on the target topology, shifted to start
once every reduced block is complete and every ReduceScatter send has left its capacity window.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.schedule.ir import SEND_ORDER, Schedule, Send
from flowride.schedule.links import LinkBook
from flowride.schedule.prune import prune_redundant
from flowride.schedule.simulate import simulate
from flowride.topology.model import Topology
from flowride.topology.timing import epoch_timing


@dataclass(frozen=True)
class _Hop:
    """GPU v's copy of (s, c) came from GPU ``parent`` over ``links`` (through switches)."""

    source: int
    chunk: int
    gpu: int
    parent: int
    links: tuple[int, ...]
    held: int  # epoch v held it in the AllGather


def allgather_tree(ag: Schedule) -> list[_Hop]:
    """For each GPU and chunk, the path its first copy came over in a (pruned) AllGather."""
    sim = simulate(ag)
    if not sim.valid:
        raise InputError("schedule", f"the AllGather to run backwards is invalid: {sim.first_violation}", "verify it with flowride verify")
    topo, timing = ag.topology, ag.timing
    nodes, links = topo.nodes, topo.links
    into_gpu: dict[tuple[int, int, int], Send] = {}
    into_switch: dict[tuple[int, int, int, int], Send] = {}
    for s in sorted(ag.sends, key=lambda s: (s.epoch, s.link)):
        v = links[s.link].dst
        t = timing.arrival(s.link, s.epoch)
        if nodes[v].is_gpu:
            if sim.holds.get((s.source, s.chunk, v)) == t:
                into_gpu.setdefault((s.source, s.chunk, v), s)
        else:
            into_switch.setdefault((s.source, s.chunk, v, t), s)
    hops = []
    for (src, c, v), s in into_gpu.items():
        path = [s.link]
        u = links[s.link].src
        while not nodes[u].is_gpu:
            s = into_switch[(src, c, u, s.epoch)]
            path.append(s.link)
            u = links[s.link].src
        hops.append(_Hop(src, c, v, u, tuple(reversed(path)), sim.holds[(src, c, v)]))
    return hops


def _reverse_links(ag: Schedule, target: Topology, path: tuple[int, ...]) -> list[int]:
    out = []
    for li in reversed(path):
        lk = ag.topology.links[li]
        back = target.link_index.get((lk.dst, lk.src))
        if back is None:
            raise InputError(
                "topology",
                f"{target.name} has no link {lk.dst}->{lk.src}, the reverse of the AllGather's {lk.src}->{lk.dst}",
                "synthesize the AllGather on topology.reversed() (flowride synth does) or add the reverse links",
            )
        out.append(back)
    return out


def place_path(book: LinkBook, timing, path: list[int], ready: int, busy: set, key: tuple[int, int]) -> list[int]:
    """Earliest start >= ready where every hop fits; a switch hop goes out the epoch it arrives.
    Two partials of one chunk never meet at a switch in one epoch, so which one leaves on which
    link is never in doubt."""
    hops = book.offsets(path)
    k = book.place(hops, ready, blocked=lambda i, li, e: i > 0 and (key, li, e) in busy)
    epochs = [k + off for _, off in hops]
    busy.update((key, li, e) for i, (li, e) in enumerate(zip(path, epochs, strict=True)) if i > 0)
    return epochs


def reduce_scatter_sends(ag: Schedule, target: Topology) -> tuple[list[Send], dict[tuple[int, int], int]]:
    """Reduction sends (on ``target``) of the reversed AllGather, and when each block's owner
    completes each chunk."""
    timing = epoch_timing(target, ag.timing.chunk_bytes, ag.tau)
    hops = allgather_tree(ag)
    book = LinkBook(timing)
    children: dict[tuple[int, int, int], int] = {}
    for h in hops:
        children[(h.source, h.chunk, h.parent)] = children.get((h.source, h.chunk, h.parent), 0) + 1
    ready: dict[tuple[int, int, int], int] = {}  # (s, c, gpu) -> epoch its last child's partial arrived
    busy: set = set()
    sends: list[Send] = []
    for h in sorted(hops, key=lambda h: (-h.held, h.source, h.chunk, h.gpu)):
        path = _reverse_links(ag, target, h.links)
        start = ready.get((h.source, h.chunk, h.gpu), 0)
        epochs = place_path(book, timing, path, start, busy, (h.source, h.chunk))
        for li, e in zip(path, epochs, strict=True):
            sends.append(Send(e, li, h.source, h.chunk, True))
        arrive = timing.arrival(path[-1], epochs[-1])
        key = (h.source, h.chunk, h.parent)
        ready[key] = max(ready.get(key, 0), arrive)
    done = {(d, c): ready.get((d, c, d), 0) for d in target.gpus for c in range(ag.chunks)}
    return sorted(sends, key=SEND_ORDER), done


def _check(ag: Schedule, target: Topology | None, what: str) -> Topology:
    if ag.collective is not Collective.ALLGATHER:
        raise InputError("collective", f"the schedule is a {ag.collective.value}", f"build a {what} from an AllGather schedule")
    target = target or ag.topology
    if len(target.nodes) != len(ag.topology.nodes) or [n.kind for n in target.nodes] != [n.kind for n in ag.topology.nodes]:
        raise InputError("topology", f"{target.name} and the AllGather's {ag.topology.name} have different nodes", "give the AllGather's topology or its reverse")
    return target


def reduce_scatter_from_allgather(ag: Schedule, target: Topology | None = None) -> Schedule:
    """ReduceScatter on ``target`` (default: the AllGather's topology) from ``ag`` run backwards."""
    target = _check(ag, target, "ReduceScatter")
    ag = prune_redundant(ag)
    sends, _ = reduce_scatter_sends(ag, target)
    meta = {"method": f"reversed {ag.meta.get('method', 'allgather')}", "from": "allgather"}
    return Schedule(target, Collective.REDUCESCATTER, ag.size_bytes, ag.chunks, ag.tau, sends, meta)


def allreduce_from_allgather(rs_ag: Schedule, ag: Schedule | None = None, target: Topology | None = None) -> Schedule:
    """AllReduce on ``target``: ``rs_ag`` run backwards (its ReduceScatter), then ``ag`` (an
    AllGather on ``target``; default ``rs_ag`` itself, when ``target`` is its own topology)."""
    target = _check(rs_ag, target, "AllReduce")
    ag = rs_ag if ag is None else ag
    if ag.topology.links != target.links or ag.collective is not Collective.ALLGATHER:
        raise InputError("schedule", "the gather phase is not an AllGather on the target topology", "synthesize the AllGather on the target topology")
    rs, done = reduce_scatter_sends(prune_redundant(rs_ag), target)
    timing = epoch_timing(target, rs_ag.timing.chunk_bytes, rs_ag.tau)
    offset = max(done.values(), default=0)
    for s in rs:
        offset = max(offset, timing.arrival(s.link, s.epoch), s.epoch + int(timing.beta_epochs[s.link]) + 1)
    gather = [Send(s.epoch + offset, s.link, s.source, s.chunk, False) for s in prune_redundant(ag).sends]
    method = f"reversed {rs_ag.meta.get('method', 'allgather')} + {ag.meta.get('method', 'allgather')}"
    meta = {"method": method, "from": "allgather", "gather_offset_epochs": offset}
    return Schedule(target, Collective.ALLREDUCE, ag.size_bytes, ag.chunks, ag.tau, sorted(rs + gather, key=SEND_ORDER), meta)
