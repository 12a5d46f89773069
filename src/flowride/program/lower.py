"""A verified schedule lowered to per-GPU programs (:mod:`flowride.program.model`).

A schedule speaks of links, switches and epochs; a runtime sees only GPUs and the order of their
steps. Lowering rules:

- switches disappear: a GPU -> switch -> ... -> GPU path becomes one GPU-to-GPU transfer (a
  runtime sees only GPUs); a switch's copies become one transfer per receiving GPU. Which arrival
  a switch forwards follows the simulator's rule (the i-th send out, by link, takes the i-th
  arrival, by link);
- store and forward: a GPU that relays a chunk it does not need receives it into scratch and sends
  it from there later; a chunk it needs goes straight to its output slot;
- reductions: the first partial a GPU receives for (block, chunk) is added to its own input
  contribution and written to an accumulator (scratch, or the output slot where the result
  belongs); later partials are added into that accumulator; the GPU sends the accumulator;
- buffers follow :func:`~flowride.program.model.buffer_layout`.

Steps are ordered by epoch (receives that arrive by an epoch come before that epoch's sends);
each step lists the earlier steps of its GPU it must wait for
(:func:`~flowride.program.model.slot_hazards`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from flowride.collectives.demand import Collective
from flowride.errors import InputError, InvalidSchedule
from flowride.program.model import GpuProgram, Program, Slot, Step, buffer_layout, slot_hazards
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.topology.group import relay_ranks


@dataclass(frozen=True)
class Transfer:
    """One GPU-to-GPU message: ``key`` = (source or block owner, chunk) as in the schedule."""

    tag: int
    src: int  # node id of the sending GPU
    dst: int  # node id of the receiving GPU
    key: tuple[int, int]
    send_epoch: int
    arrive_epoch: int
    reduce: bool
    links: tuple[int, ...]


def transfers(schedule: Schedule) -> list[Transfer]:
    """The schedule's GPU-to-GPU messages, switch hops folded into them."""
    topo, timing = schedule.topology, schedule.timing
    nodes, links = topo.nodes, topo.links
    # arrivals at each switch, per (key, switch, epoch), in link order: (in-link, origin)
    arrivals: dict[tuple, list[tuple[int, tuple[int, int, tuple[int, ...]]]]] = defaultdict(list)
    out_count: dict[tuple, int] = defaultdict(int)
    result: list[Transfer] = []
    for s in _switch_order(schedule, arrivals):
        lk = links[s.link]
        key = (s.source, s.chunk)
        if nodes[lk.src].is_gpu:
            origin = (lk.src, s.epoch, (s.link,))
        else:
            k = (key, lk.src, s.epoch, s.reduce)
            queue = sorted(arrivals.get(k, []))
            if not queue:
                raise InvalidSchedule("schedule", f"switch {lk.src} forwards {key} that never reaches it in epoch {s.epoch}", "verify the schedule with flowride verify")
            n = out_count[k]
            out_count[k] += 1
            _, (u, e0, path) = queue[n] if n < len(queue) else queue[0]
            origin = (u, e0, path + (s.link,))
        t = timing.arrival(s.link, s.epoch)
        if nodes[lk.dst].is_gpu:
            u, e0, path = origin
            result.append(Transfer(len(result), u, lk.dst, key, e0, t, s.reduce, path))
        else:
            arrivals[(key, lk.dst, t, s.reduce)].append((s.link, origin))
    return result


def _switch_order(schedule: Schedule, arrivals: dict) -> Iterator:
    """The schedule's sends in the order :func:`transfers` folds them: epoch by epoch, a switch's
    sends before the GPUs' (a GPU's send reaches nothing in its own epoch), and among a switch's,
    one only once what it forwards has reached the switch: cut-through hops between switches take
    no epoch, so a chunk may cross several switches in one epoch, in path order, not link order.
    ``arrivals`` is the live table :func:`transfers` fills as it goes."""
    links, nodes = schedule.topology.links, schedule.topology.nodes
    by_epoch: dict[int, list] = defaultdict(list)
    for s in schedule.sends:
        by_epoch[s.epoch].append(s)
    for e in sorted(by_epoch):
        sends = sorted(by_epoch[e], key=lambda s: s.link)
        waiting = [s for s in sends if not nodes[links[s.link].src].is_gpu]
        while waiting:
            ready = [s for s in waiting if arrivals.get(((s.source, s.chunk), links[s.link].src, e, s.reduce))]
            if not ready:  # nothing reaches these switches: the caller names the first
                ready = waiting[:1]
            yield from ready
            waiting = [s for s in waiting if all(s is not r for r in ready)]
        yield from (s for s in sends if nodes[links[s.link].src].is_gpu)


def lower(schedule: Schedule, check: bool = True) -> Program:
    """Per-GPU programs of a (verified) schedule. A process-group schedule whose sends go through
    GPUs outside the group is refused: those GPUs would have to run a kernel outside the
    communicator (:mod:`flowride.topology.group`). One synthesized with relays allowed that uses
    none is lowered like any other."""
    links = schedule.topology.links
    if check:  # first: an invalid schedule may name links the topology lacks
        sim = simulate(schedule)
        if not sim.valid:
            raise InvalidSchedule("schedule", f"is invalid: {sim.first_violation}", "only verified schedules can be lowered; run flowride verify")
    relays = relay_ranks(schedule.topology, {v for s in schedule.sends for v in (links[s.link].src, links[s.link].dst)})
    if relays:
        raise InputError("schedule", f"relays through GPU(s) {', '.join(map(str, relays))} outside the group",
                         "synthesize with --relay off to export or run")
    topo = schedule.topology
    coll = schedule.collective
    gpus = list(topo.gpus)
    rank = {g: r for r, g in enumerate(gpus)}
    n, C = len(gpus), schedule.chunks
    if coll is Collective.ALLTOALL and n * n * C != n * n * schedule.demand.chunks:
        raise AssertionError("AlltoAll layout")
    i_chunks, o_chunks = buffer_layout(coll, n, C)
    demand = schedule.demand
    needs = {(q.source, q.chunk, d) for q in demand.commodities for d in q.dests}

    def block_offset(key: tuple[int, int]) -> int:
        """Offset of (source/owner, chunk) in the block-ordered buffers."""
        s, c = key
        if coll is Collective.ALLTOALL:
            return rank[s] * C + c % C
        return rank[s] * C + c

    def input_slot(g: int, key: tuple[int, int]) -> Slot | None:
        s, c = key
        if coll is Collective.ALLGATHER:
            return ("i", c) if g == s else None
        if coll is Collective.ALLTOALL:
            return ("i", c) if g == s else None  # chunk index = dest rank * C + c
        return ("i", rank[s] * C + c)  # every GPU contributes to every block

    def final_slot(g: int, key: tuple[int, int]) -> Slot | None:
        """Where the collective's output for ``key`` lives on ``g``, if ``g`` needs it."""
        if (key[0], key[1], g) not in needs and not (coll.reduces and (coll is Collective.ALLREDUCE or key[0] == g)):
            return None
        if coll is Collective.REDUCESCATTER:
            return ("o", key[1])
        return ("o", block_offset(key))

    progs = [GpuProgram(r, g, i_chunks, o_chunks, 0) for r, g in enumerate(gpus)]
    moves = transfers(schedule)
    events: dict[int, list[tuple[tuple, str, Transfer]]] = defaultdict(list)
    for t in moves:
        events[t.src].append(((t.send_epoch, 1, t.tag), "send", t))
        events[t.dst].append(((t.arrive_epoch, 0, t.tag), "recv", t))
    for prog in progs:
        g = prog.node
        where: dict[tuple[int, int], Slot] = {}  # current home of each key's value on g
        scratch: dict[tuple[int, int], Slot] = {}
        steps: list[Step] = []

        def home(key: tuple[int, int], g: int = g, scratch: dict = scratch) -> Slot:
            """Slot to write a received value of ``key`` to: its output slot, else scratch."""
            slot = final_slot(g, key)
            if slot is None:
                if key not in scratch:
                    scratch[key] = ("s", len(scratch))
                slot = scratch[key]
            return slot

        # out-of-place collectives start with the GPU's own part copied to its output
        if coll in (Collective.ALLGATHER, Collective.ALLTOALL):
            for c in range(C):
                key = (g, c) if coll is Collective.ALLGATHER else (g, rank[g] * C + c)
                src = input_slot(g, key)
                steps.append(Step("cpy", -1, src, ("o", rank[g] * C + c), 0))
        for _, kind, t in sorted(events[g], key=lambda e: e[0]):
            key = t.key
            if kind == "send":
                src = where.get(key) or input_slot(g, key)
                if src is None:
                    raise InvalidSchedule("schedule", f"GPU {g} sends {key} it never holds", "verify the schedule")
                dst_home = None  # informational: the receiver decides
                steps.append(Step("s", rank[t.dst], src, dst_home, t.send_epoch, t.tag))
            elif t.reduce:
                acc = where.get(key)
                if acc is None:
                    dst = home(key) if not coll.reduces or coll is Collective.REDUCESCATTER else ("o", block_offset(key))
                    steps.append(Step("rrc", rank[t.src], input_slot(g, key), dst, t.arrive_epoch, t.tag))
                    where[key] = dst
                else:
                    steps.append(Step("rrc", rank[t.src], acc, acc, t.arrive_epoch, t.tag))
            else:
                dst = home(key) if not coll.reduces else ("o", block_offset(key))
                steps.append(Step("r", rank[t.src], None, dst, t.arrive_epoch, t.tag))
                where[key] = dst
        # a ReduceScatter owner (or AllReduce GPU) that received nothing still owes its output
        if coll.reduces:
            for q in demand.commodities:
                for d in q.dests if coll is Collective.ALLREDUCE else (q.source,):
                    if d == g and _key(q) not in where:
                        steps.append(Step("cpy", -1, input_slot(g, _key(q)), final_slot(g, _key(q)), 0))
        prog.steps = steps
        prog.s_chunks = len(scratch)
        for st, deps in zip(steps, slot_hazards(steps), strict=True):
            st.deps = sorted(deps)
    return Program(schedule.meta.get("method") or "flowride", coll, C, progs, schedule.demand.chunk_bytes)


def _key(q) -> tuple[int, int]:
    return (q.source, q.chunk)
