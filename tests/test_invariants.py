"""Property tests on random small topologies: every synthesized schedule verifies, never beats the
lower bound, never loses to the baseline, and the simulator rejects a schedule with a send removed."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flowride.api import synthesize
from flowride.schedule import Schedule, simulate
from flowride.topology import Link, Node, Topology


@st.composite
def topologies(draw) -> Topology:
    n = draw(st.integers(3, 5))
    with_switch = draw(st.booleans())
    bw = st.sampled_from([12.5, 25.0, 50.0])
    alpha = st.sampled_from([0.0, 0.7e-6])
    nodes = [Node(i) for i in range(n)]
    links: dict[tuple[int, int], Link] = {}
    for i in range(n):  # a directed ring keeps every GPU reachable
        j = (i + 1) % n
        links[(i, j)] = Link(i, j, draw(bw), draw(alpha))
    for _ in range(draw(st.integers(0, n))):
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if a != b and (a, b) not in links:
            links[(a, b)] = Link(a, b, draw(bw), draw(alpha))
    if with_switch:
        sw = n
        nodes.append(Node(sw, "switch", copy=draw(st.booleans())))
        for g in draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=n, unique=True)):
            links[(g, sw)] = Link(g, sw, draw(bw), draw(alpha))
            links[(sw, g)] = Link(sw, g, draw(bw), draw(alpha))
    return Topology("random", tuple(nodes), tuple(links.values()))


cases = st.tuples(
    topologies(),
    st.sampled_from(["allgather", "alltoall"]),
    st.sampled_from([1, 2]),
    st.sampled_from([10**5, 10**6, 10**8]),
    st.sampled_from(["fast", "slow"]),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_synthesized_schedules_verify_and_respect_bounds(case):
    topo, coll, chunks, size, epoch = case
    out = synthesize(topo, coll, size, epoch, chunks=chunks, time_limit=5)
    rep = out.report()
    sim = simulate(out.schedule)
    assert sim.valid, sim.violations[:3]
    assert rep["verified"]
    assert sim.epochs == rep["epochs"]
    assert rep["finish_time_us"] >= rep["lower_bound_us"] * (1 - 1e-9)
    assert rep["epochs"] >= rep["epoch_lower_bound"] or rep["status"] != "optimal"
    assert rep["epochs"] >= max(out.epoch_bounds.values())
    assert rep["finish_time_us"] <= rep["baseline_us"] * (1 + 1e-9)
    # every demand is met: each destination holds each chunk it needs
    for q in out.demand.commodities:
        for d in q.dests:
            assert (q.source, q.chunk, d) in sim.holds

    # removing any one send breaks the (pruned) schedule: nothing in it is redundant
    sends = out.schedule.sends
    for drop in range(0, len(sends), max(1, len(sends) // 5)):
        mutated = dataclasses.replace(out.schedule, sends=sends[:drop] + sends[drop + 1 :])
        assert not simulate(mutated).valid


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases)
def test_simulator_rejects_a_send_moved_before_its_chunk_is_held(case):
    topo, coll, chunks, size, epoch = case
    out = synthesize(topo, coll, size, epoch, chunks=chunks, time_limit=5)
    sched = out.schedule
    # a relay's send (from a GPU that is not the chunk's source) moved to epoch 0
    relays = [
        i for i, s in enumerate(sched.sends)
        if topo.nodes[topo.links[s.link].src].is_gpu and topo.links[s.link].src != s.source and s.epoch > 0
    ]
    assume(relays)
    i = relays[0]
    s = sched.sends[i]
    moved = dataclasses.replace(s, epoch=0)
    bad = Schedule(sched.topology, sched.collective, sched.size_bytes, sched.chunks, sched.tau,
                   sched.sends[:i] + [moved] + sched.sends[i + 1:])
    res = simulate(bad)
    assert not res.valid
    assert any("holds" in v for v in res.violations)
