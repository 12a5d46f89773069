"""Drop sends that serve no demand (a feasibility probe may return redundant copies).

Walks back from each demand: keep the send that first delivered the chunk to its destination,
then whatever supplied that send's sender (its own first delivery, or for a switch the arrival it
forwarded), until nothing new is needed. Holds only get no later and loads only drop, so the
pruned schedule is valid whenever the original was, with the same finish time.
"""

from __future__ import annotations

from collections import defaultdict

from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate


def prune_redundant(schedule: Schedule) -> Schedule:
    sim = simulate(schedule)
    if not sim.valid:
        return schedule
    topo, timing = schedule.topology, schedule.timing
    nodes, links = topo.nodes, topo.links
    sends = schedule.sends
    first_into_gpu: dict[tuple[int, int, int], int] = {}  # (source, chunk, gpu) -> send index
    into_switch: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)
    for i, s in enumerate(sends):
        v = links[s.link].dst
        t = timing.arrival(s.link, s.epoch)
        if nodes[v].is_gpu:
            if sim.holds.get((s.source, s.chunk, v)) == t:
                first_into_gpu.setdefault((s.source, s.chunk, v), i)
        else:
            into_switch[(s.source, s.chunk, v, t)].append(i)
    keep: set[int] = set()
    out_count: dict[tuple[int, int, int, int], int] = defaultdict(int)
    stack = [first_into_gpu[(q.source, q.chunk, d)] for q in schedule.demand.commodities for d in q.dests]
    while stack:
        i = stack.pop()
        if i in keep:
            continue
        keep.add(i)
        s = sends[i]
        u = links[s.link].src
        if nodes[u].is_gpu:
            if u != s.source:
                stack.append(first_into_gpu[(s.source, s.chunk, u)])
        else:
            key = (s.source, s.chunk, u, s.epoch)
            out_count[key] += 1
            need = 1 if nodes[u].copy else out_count[key]
            stack.extend(into_switch[key][:need])
    kept = [s for i, s in enumerate(sends) if i in keep]
    return Schedule(schedule.topology, schedule.collective, schedule.size_bytes, schedule.chunks, schedule.tau, kept, dict(schedule.meta))
