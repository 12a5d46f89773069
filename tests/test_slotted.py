"""Packed trees scheduled on a grid of slots (flowride.synth.forest, ``slotted``): each slot's
transfers matched, not only taken greedily. What comes out replays as a valid AllGather over the
same trees, the swap finds the larger matching, and on MI250 the tree method keeps it because it
finishes sooner."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowride.collectives import make_demand
from flowride.schedule import Schedule, simulate
from flowride.schedule.links import LinkBook
from flowride.synth.forest import _matched_slot, forest_sends
from flowride.synth.packing import pack_trees
from flowride.synth.trees import packing_for, synthesize_trees
from flowride.topology.builtins import mi250, ring
from flowride.topology.model import Link, Node, Topology
from flowride.topology.shifts import shift_symmetry
from flowride.topology.timing import EpochTiming, epoch_timing


@st.composite
def forwarding_fabrics(draw) -> Topology:
    """GPUs on switches that forward (no copy), every switch link at one speed, so whole paths
    through them keep to one grid; some direct GPU links at other speeds beside them."""
    n = draw(st.integers(2, 6))
    k = draw(st.integers(1, 3))
    bw = draw(st.sampled_from([12.5, 25.0]))
    nodes = [Node(i) for i in range(n)] + [Node(n + j, "switch", copy=False) for j in range(k)]
    links = []
    for g in range(n):
        w = n + draw(st.integers(0, k - 1))
        links += [Link(g, w, bw, draw(st.sampled_from([0.0, 1.3e-6]))), Link(w, g, bw, 0.0)]
    for j in range(1, k):
        links += [Link(n, n + j, bw, 1.3e-6), Link(n + j, n, bw, 1.3e-6)]
    for a in range(n):
        for b in range(n):
            if a != b and draw(st.integers(0, 3)) == 0:
                links.append(Link(a, b, draw(st.sampled_from([bw, 50.0, 100.0])), 0.7e-6))
    return Topology("random-forwarding", tuple(nodes), tuple(links))


def _plain_and_variant(topo: Topology, chunks: int, size: int, **variant) -> tuple[list, list]:
    """The packed trees' plain AllGather sends and the variant's; the variant's (when it gives a
    schedule) replay as valid: every demand met, no chunk sent before it is held, capacities kept."""
    demand = make_demand(topo, "allgather", size, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    packed = pack_trees(topo, None, time_limit=20, symmetry=shift_symmetry(topo))
    got = forest_sends(topo, demand, timing, packed, **variant)
    if got:
        sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, got))
        assert sim.valid, sim.first_violation
    return forest_sends(topo, demand, timing, packed), got


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forwarding_fabrics(), st.sampled_from([1, 2, 4, 8]), st.sampled_from([10**6, 10**8]))
def test_slotted_schedules_verify_on_the_same_trees(topo, chunks, size):
    plain, got = _plain_and_variant(topo, chunks, size, slotted=True)
    if not got:  # no transfer on a grid here: the plain schedule stands
        return
    # the same trees: the same (link, source, chunk) sends, only at other epochs
    assert sorted((li, s, c) for _, li, s, c in got) == sorted((li, s, c) for _, li, s, c in plain)


def _book() -> LinkBook:
    """Four links that take one chunk per 4 epochs: uplinks 0 and 1, downlinks 2 and 3."""
    n = 4
    b = np.full(n, 3, dtype=np.int64)
    cap = np.ones(n, dtype=np.int64)
    zeros = np.zeros(n, dtype=np.int64)
    return LinkBook(EpochTiming(1e-6, 1.0, 1e-6, cap / (b + 1), zeros, b, cap, b + 1, np.zeros(n, bool), np.zeros(n, bool)))


def test_the_slot_swap_finds_the_larger_matching():
    """Greedy in priority order takes up0->down3 first and then neither up1->down3 nor up0->down2
    fits: one transfer. The swap takes the first out for the other two."""
    book = _book()
    hops = [[(0, 0), (3, 2)], [(1, 0), (3, 2)], [(0, 0), (2, 2)]]
    placed, out, took = _matched_slot(book, 8, [0, 1, 2], [[h] for h in hops])
    assert placed == [1, 2] and out == [0] and took == {1: hops[1], 2: hops[2]}
    assert [book.count(li, 8 + off) for li, off in [(0, 0), (1, 0), (2, 2), (3, 2)]] == [1, 1, 1, 1]


def test_a_slot_keeps_the_greedy_choice_when_no_swap_adds_one():
    book = _book()
    book.place([(2, 2)], 8)  # an earlier transfer holds down2 at this slot
    hops = [[(0, 0), (3, 2)], [(1, 0), (3, 2)], [(0, 0), (2, 2)]]
    placed, out, _ = _matched_slot(book, 8, [0, 1, 2], [[h] for h in hops])
    assert placed == [0] and out == [1, 2]
    assert book.count(0, 8) == 1 and book.count(3, 10) == 1 and book.count(1, 8) == 0


def test_a_slot_takes_a_twin_route_where_the_first_is_full():
    """Both transfers go up0 -> down3, or over the twin link 2 in its place: the second takes the
    twin instead of waiting a slot."""
    book = _book()
    first, twin = [(0, 0), (3, 2)], [(0, 0), (2, 2)]
    other, other_twin = [(1, 0), (3, 2)], [(1, 0), (2, 2)]
    placed, out, took = _matched_slot(book, 8, [0, 1], [[first, twin], [other, other_twin]])
    assert placed == [0, 1] and out == [] and took == {0: first, 1: other_twin}


def test_nothing_on_a_grid_gives_no_slotted_schedule():
    """A ring's links at 1 MB carry a chunk in one epoch: no window to keep starts on."""
    topo = ring(4)
    demand = make_demand(topo, "allgather", 10**6, 2)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    assert forest_sends(topo, demand, timing, packing_for(topo, timing, demand.chunk_bytes), slotted=True) == []


def test_mi250_1gb_keeps_the_slotted_trees():
    """MI250 x 2, AllGather 1 GB at 32 chunks: the NIC uplinks idle in the plain list schedule while
    every ready chunk waits for a taken downlink (671 epochs); matched slots take 657."""
    topo = mi250(2)
    demand = make_demand(topo, "allgather", 10**9, 32)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    out = synthesize_trees(topo, demand, timing)  # untimed: with a limit, a busy machine could cut the slotted shape
    probes = {p.outcome: p.T for p in out.probes}
    assert probes["trees packed-slotted/0.0"] < probes["trees packed/0.0"]
    assert out.T <= probes["trees packed-slotted/0.0"]


@st.composite
def leaf_spine_fabrics(draw) -> Topology:
    """GPUs on leaf switches joined through spine switches (none copies), the spines' links at
    speeds drawn per spine, so some routes have twins of the same timing and some do not."""
    n = draw(st.integers(2, 6))
    leaves = draw(st.integers(2, 3))
    spines = draw(st.integers(2, 3))
    nodes = [Node(i) for i in range(n)] + [Node(n + j, "switch", copy=False) for j in range(leaves + spines)]
    links = []
    for g in range(n):
        leaf = n + draw(st.integers(0, leaves - 1))
        links += [Link(g, leaf, 50.0, 1.3e-6), Link(leaf, g, 50.0, 0.0)]
    for s in range(spines):
        bw = draw(st.sampled_from([12.5, 25.0, 25.0]))
        for leaf in range(leaves):
            links += [Link(n + leaf, n + leaves + s, bw, 0.0), Link(n + leaves + s, n + leaf, bw, 0.0)]
    return Topology("random-leaf-spine", tuple(nodes), tuple(links))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(leaf_spine_fabrics(), st.sampled_from([1, 2, 4]), st.sampled_from([10**6, 10**8]))
def test_twin_routes_verify_and_keep_each_hop_on_a_link_of_its_timing(topo, chunks, size):
    plain, got = _plain_and_variant(topo, chunks, size, routed=True)
    if not got:  # no route with a twin here
        return
    # as many sends per (source, chunk) and per link speed: only the spine a route crosses may change
    speed = [lk.bytes_per_s for lk in topo.links]
    assert sorted((s, c, speed[li]) for _, li, s, c in got) == sorted((s, c, speed[li]) for _, li, s, c in plain)


def _clos_group():
    from flowride.topology.fabrics import build_fabric
    from flowride.topology.group import select_group

    return select_group(build_fabric("dgx-h100", 16, "clos", oversubscription=4.0), "every:8")


def test_a_clos_group_takes_the_idle_spines():
    """One rail's 16 GPUs of 16 DGX H100 on a 4:1 Clos (8 leaves, 8 spines of 25 GB/s a link): the
    packed trees send every edge between two leaves over one spine, and its 2-epoch windows turn
    the GPUs' sends away every other epoch (88 epochs at 4 chunks, 1.47x the NIC bound of 60).
    Over any spine with room: 68."""
    topo = _clos_group()
    demand = make_demand(topo, "allgather", 10**9, 4)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    packing = packing_for(topo, timing, demand.chunk_bytes)
    plain = simulate(Schedule.from_tuples(topo, demand, timing.tau, forest_sends(topo, demand, timing, packing)))
    routed = simulate(Schedule.from_tuples(topo, demand, timing.tau, forest_sends(topo, demand, timing, packing, routed=True)))
    assert routed.valid and plain.valid
    assert (plain.epochs, routed.epochs) == (88, 68)
    out = synthesize_trees(topo, demand, timing, 30)
    assert out.T <= 68 and out.T < {p.outcome: p.T for p in out.probes}["trees packed/0.0"]


def test_twins_need_the_same_timing_and_a_switch_that_forwards():
    """Two leaves, two spines: a route through spine A has spine B as twin only when B's links
    carry a chunk in the same epochs; a spine that copies is no twin."""
    from flowride.synth.forest import _Move, _other_routes, _Unit

    for bw_b, copy_b, twins in ((25.0, False, 1), (12.5, False, 0), (25.0, True, 0)):
        nodes = (Node(0), Node(1), Node(2, "switch", copy=False), Node(3, "switch", copy=False),
                 Node(4, "switch", copy=False), Node(5, "switch", copy=copy_b))
        links = (Link(0, 2, 50.0, 0.0), Link(2, 4, 25.0, 0.0), Link(4, 3, 25.0, 0.0), Link(3, 1, 50.0, 0.0),
                 Link(2, 5, bw_b, 0.0), Link(5, 3, bw_b, 0.0), Link(1, 3, 50.0, 0.0), Link(3, 2, 25.0, 0.0), Link(2, 0, 50.0, 0.0))
        topo = Topology("two-spines", nodes, links)
        demand = make_demand(topo, "allgather", 10**8, 1)
        timing = epoch_timing(topo, demand.chunk_bytes, "fast")
        offs = [0, int(timing.hop_delay[0]), int(timing.hop_delay[0] + timing.hop_delay[1]),
                int(timing.hop_delay[0] + timing.hop_delay[1] + timing.hop_delay[2])]
        unit = _Unit(0, [(0, offs[0]), (1, offs[1]), (2, offs[2]), (3, offs[3])], [(1, 3, offs[3])], [])
        got = _other_routes(topo, timing, {(0, 0): ([unit], {0: [0]}, _Move())})
        alts = next(iter(got.values()), [])
        assert len(alts) == twins
        if twins:
            assert alts[0] == [(0, offs[0]), (4, offs[1]), (5, offs[2]), (3, offs[3])]
