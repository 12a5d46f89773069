"""Drop sends that serve no demand (a feasibility probe may return redundant copies, and a flow
model may return a chunk circling between cut-through switches within one epoch).

Walks back from each demand: keep the send that first delivered the chunk to its destination,
then whatever supplied that send's sender (its own first delivery, or for a switch the arrival it
forwarded), until nothing new is needed. Holds only get no later and loads only drop, so the
pruned schedule is valid whenever the original was, with the same finish time.
"""

from __future__ import annotations

from collections import defaultdict

import networkx as nx

from flowride.schedule.ir import Schedule, Send
from flowride.schedule.simulate import simulate


def drop_switch_cycles(schedule: Schedule) -> Schedule:
    """Remove chunks that circle among switches that cannot copy, within one epoch.

    With cut-through switching a hop between switches can take no epoch, so a flow model's
    per-epoch conservation (out of a switch no more than in) admits a cycle A -> B -> A of one
    chunk in one epoch. It carries nothing, yet the replay, which hands each arrival to the first
    send out that can take it, may give A's arrival to A's other send first, and the cycle then
    starves. Each such cycle is dropped whole: every switch on it loses one arrival and one send,
    so what it forwards still matches what reaches it, and the rest is acyclic, which the replay
    orders. (Cycles through a switch that copies are left alone: one arrival may feed its copies.)
    """
    topo, timing = schedule.topology, schedule.timing
    nodes, links = topo.nodes, topo.links
    groups: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for i, s in enumerate(schedule.sends):
        a, b = nodes[links[s.link].src], nodes[links[s.link].dst]
        if not a.is_gpu and not b.is_gpu and not a.copy and not b.copy and timing.arrival(s.link, s.epoch) == s.epoch:
            groups[(s.source, s.chunk, s.epoch)].append(i)
    drop: set[int] = set()
    for idx in groups.values():
        if len(idx) < 2:
            continue
        g = nx.MultiDiGraph()
        g.add_edges_from((links[schedule.sends[i].link].src, links[schedule.sends[i].link].dst, i) for i in idx)
        while True:
            try:
                cycle = nx.find_cycle(g)
            except nx.NetworkXNoCycle:
                break
            for u, v, i in cycle:
                g.remove_edge(u, v, i)
                drop.add(i)
    if not drop:
        return schedule
    kept: list[Send] = [s for i, s in enumerate(schedule.sends) if i not in drop]
    return Schedule(schedule.topology, schedule.collective, schedule.size_bytes, schedule.chunks, schedule.tau, kept, dict(schedule.meta))


def prune_redundant(schedule: Schedule) -> Schedule:
    """``schedule`` without the sends no demand needs (see the module); an invalid one is returned
    as it is (after its switch cycles are dropped), for the caller's replay to report."""
    schedule = drop_switch_cycles(schedule)
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
