"""Reducing collectives (ReduceScatter, AllReduce): the simulator's contribution tracking, the
schedules built by running an AllGather backwards, their lower bounds, their lowering to per-GPU
programs, their JSON form, and ``Topology.reversed()``.

Hand-built schedules use 1 MB chunks on 50 GB/s links with tau = 20 us: one chunk per link per
epoch, alpha (0.7 us) is free, a GPU -> GPU or GPU -> switch hop takes one epoch and a
switch -> GPU hop none (the switch forwards in the epoch the chunk arrives, and the GPU holds it
from that same epoch). Ring(3) links: 0:0->1 1:0->2 2:1->0 3:1->2 4:2->0 5:2->1; switch(3) links:
0:0->S 1:S->0 2:1->S 3:S->1 4:2->S 5:S->2 with the switch S = node 3.
"""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from flowride.api import synthesize
from flowride.collectives import Collective, make_demand
from flowride.errors import InputError
from flowride.program import Step, check_program, lower, transfers
from flowride.schedule import Schedule, Send, load_schedule, simulate
from flowride.schedule.prune import prune_redundant
from flowride.schedule.reduce import (
    allgather_tree,
    allreduce_from_allgather,
    reduce_scatter_from_allgather,
)
from flowride.synth.bounds import lower_bounds
from flowride.synth.greedy import baseline_sends
from flowride.topology import Link, Node, Topology, dgx1, full, mesh, ndv2, ring, switch, torus
from flowride.topology.timing import epoch_timing

TAU = 2e-5  # one 1 MB chunk per epoch on 50 GB/s
SW = 3  # the switch's node id in switch(3)
R, C_ = 1, 0  # reduce flag: a reduction (rrc) / a copy


def make(topo, sends, collective="reducescatter", chunks=1, tau=TAU, per_chunk=10**6):
    """Schedule of (epoch, (u, v) or link index, block/source, chunk[, reduce]) sends."""
    demand = make_demand(topo, collective, per_chunk * topo.buffer_ranks * chunks, chunks)
    assert demand.chunk_bytes == per_chunk
    li = topo.link_index
    tuples = [(s[0], li[s[1]] if isinstance(s[1], tuple) else s[1], *s[2:]) for s in sends]
    return Schedule.from_tuples(topo, demand, tau, tuples)


def greedy_allgather(topo: Topology, chunks: int = 1, size: int = 10**6, epoch: str | float = "fast") -> Schedule:
    """The ring AllGather baseline (no solver) on ``topo``."""
    demand = make_demand(topo, "allgather", size, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    name, sends = baseline_sends(topo, demand, timing)
    return Schedule.from_tuples(topo, demand, timing.tau, sends, {"method": name})


# ------------------------------------------------------------------ hand-built, ring(3)


def chain_rs(epoch0: int = 0) -> list:
    """ReduceScatter on ring(3) by chains: for block d, GPU d+2 adds into d+1, which adds into d."""
    out = []
    for d in range(3):
        a, b = (d + 2) % 3, (d + 1) % 3
        out += [(epoch0, (a, b), d, 0, R), (epoch0 + 1, (b, d), d, 0, R)]
    return out


def direct_rs(epoch: int, blocks=(0, 1, 2), chunk: int = 0) -> list:
    """Every GPU sends its partial of each block in ``blocks`` straight to the owner."""
    return [(epoch, (g, d), d, chunk, R) for d in blocks for g in range(3) if g != d]


def gather(start: int) -> list:
    """AllReduce's second phase on ring(3): each owner copies its reduced block to both others."""
    return [(start, (d, g), d, 0, C_) for d in range(3) for g in range(3) if g != d]


def test_reducing_collectives_and_their_demands():
    assert Collective.REDUCESCATTER.reduces and Collective.ALLREDUCE.reduces
    assert not Collective.ALLGATHER.reduces and not Collective.ALLTOALL.reduces
    assert Collective.ALLREDUCE.multicast and not Collective.REDUCESCATTER.multicast
    assert Collective.parse("Reduce_Scatter") is Collective.REDUCESCATTER
    assert Collective.parse("all-reduce") is Collective.ALLREDUCE
    topo = ring(4)
    rs = make_demand(topo, "reducescatter", 4 * 10**6, 2)
    assert [(q.source, q.chunk, q.dests) for q in rs.commodities] == [(d, c, (d,)) for d in range(4) for c in range(2)]
    assert rs.chunk_bytes == 5 * 10**5
    ar = make_demand(topo, "allreduce", 4 * 10**6, 2)
    assert all(q.dests == (0, 1, 2, 3) for q in ar.commodities) and len(ar.commodities) == 8
    assert ar.num_deliveries == 32


def test_chain_reduce_scatter_valid_with_exact_finish():
    s = make(ring(3), chain_rs())
    sim = simulate(s)
    assert sim.valid, sim.violations
    assert sim.epochs == 2
    assert sim.finish_time_s == pytest.approx(4e-5)
    # holds: when each owner's block became complete
    assert sim.holds == {(0, 0, 0): 2, (1, 0, 1): 2, (2, 0, 2): 2}
    assert all(x.reduce for x in s.sends)
    assert len(transfers(s)) == 2 * 3 * 1
    assert check_program(lower(s)) == []


def test_chain_reduce_scatter_later_start_shifts_finish():
    sim = simulate(make(ring(3), chain_rs(epoch0=3)))
    assert sim.valid and sim.epochs == 5


def test_direct_reduce_scatter_meets_the_lower_bound():
    topo = ring(3)
    s = make(topo, direct_rs(0))
    sim = simulate(s)
    assert sim.valid, sim.violations
    assert sim.epochs == 1
    b = lower_bounds(topo, s.demand)
    # egress: 2 partials out over 2 x 50 GB/s = one epoch; reported in the ingress field
    assert b.ingress_s == pytest.approx(2e-5)
    assert b.binding == "ingress"
    assert b.best_s == pytest.approx(sim.finish_time_s)
    assert b.latency_s == pytest.approx(0.7e-6)


def test_two_chunks_on_one_link_in_one_epoch_exceed_capacity():
    topo = ring(3)
    sim = simulate(make(topo, direct_rs(0, chunk=0) + direct_rs(0, chunk=1), chunks=2))
    assert not sim.valid
    assert sim.first_violation == "link 0 (0->1) carries 2 chunks in epoch 0, capacity 1"
    assert all("capacity 1" in v for v in sim.violations) and len(sim.violations) == 6
    ok = simulate(make(topo, direct_rs(0, chunk=0) + direct_rs(1, chunk=1), chunks=2))
    assert ok.valid and ok.epochs == 2


def test_contribution_counted_twice():
    # block 0: GPU 1 forwards its partial {1}, then adds GPU 2's and forwards {1, 2} again
    sends = [(1, (1, 0), 0, 0, R), (1, (2, 1), 0, 0, R), (2, (1, 0), 0, 0, R)] + direct_rs(0, blocks=(1, 2))
    sim = simulate(make(ring(3), sends))
    assert not sim.valid
    assert sim.violations == [
        "GPU 0 adds contributions of GPU(s) 1 to (block 0, chunk 0) twice (epoch 3)",
        "demand not met: GPU 0 lacks the contributions of GPU(s) 2 to (block 0, chunk 0)",
    ]


def test_contribution_counted_twice_via_two_paths():
    # GPU 2's partial reaches GPU 0 directly and inside GPU 1's sum
    sends = chain_rs() + [(1, (2, 0), 0, 0, R)]
    sim = simulate(make(ring(3), sends))
    assert not sim.valid
    assert sim.violations == ["GPU 0 adds contributions of GPU(s) 2 to (block 0, chunk 0) twice (epoch 2)"]


def test_forwarding_too_early_loses_a_contribution():
    # GPU 1 forwards in epoch 0, before GPU 2's partial (sent in epoch 0) has arrived
    sends = [(0, (2, 1), 0, 0, R), (0, (1, 0), 0, 0, R)] + direct_rs(1, blocks=(1, 2))
    sim = simulate(make(ring(3), sends))
    assert sim.violations == ["demand not met: GPU 0 lacks the contributions of GPU(s) 2 to (block 0, chunk 0)"]
    assert sim.epochs is None and sim.finish_time_s is None


def test_missing_block_reports_every_missing_contribution():
    sim = simulate(make(ring(3), direct_rs(0, blocks=(1, 2))))
    assert sim.violations == ["demand not met: GPU 0 lacks the contributions of GPU(s) 1, 2 to (block 0, chunk 0)"]


@pytest.mark.parametrize(
    "send,msg",
    [
        ((0, 99, 0, 0, R), "no link 99 in ring"),
        ((-1, (1, 0), 0, 0, R), "negative epoch"),
        ((0, (1, 0), 0, 1, R), "there is no (block 0, chunk 1) in this reducescatter"),
        ((0, (1, 0), 7, 0, R), "there is no (block 7, chunk 0) in this reducescatter"),
    ],
)
def test_reject_malformed_reduction_sends(send, msg):
    sim = simulate(make(ring(3), chain_rs() + [send]))
    assert not sim.valid
    assert len(sim.violations) == 1 and msg in sim.violations[0]


def test_reduction_in_an_allgather_is_rejected():
    sends = [(0, (s, d), s, 0) for s in range(3) for d in range(3) if d != s]
    assert simulate(make(ring(3), sends, collective="allgather")).valid
    sends[0] = (*sends[0], R)
    sim = simulate(make(ring(3), sends, collective="allgather"))
    assert not sim.valid
    assert "a reduction in a allgather, which only moves chunks" in sim.violations[0]
    assert sim.violations[1:] == ["demand not met: GPU 1 never receives chunk 0 of GPU 0"]


def test_copies_in_a_reduce_scatter_overwrite():
    # a copy replaces the receiver's partial: GPU 0 ends with GPU 1's {1, 2}, without its own
    sends = [(0, (2, 1), 0, 0, R), (1, (1, 0), 0, 0, C_)] + direct_rs(2, blocks=(1, 2))
    sim = simulate(make(ring(3), sends))
    assert sim.violations == ["demand not met: GPU 0 lacks the contributions of GPU(s) 0 to (block 0, chunk 0)"]


# ------------------------------------------------------------------- AllReduce, ring(3)


def test_allreduce_copies_overwrite_partials_correctly():
    # GPU 1 holds {1, 2} of block 0 when block 0's full sum arrives as a copy: overwritten, complete
    s = make(ring(3), chain_rs() + gather(2), collective="allreduce")
    sim = simulate(s)
    assert sim.valid, sim.violations
    assert sim.epochs == 3
    assert sim.finish_time_s == pytest.approx(6e-5)
    assert sim.holds[(0, 0, 0)] == 2 and sim.holds[(0, 0, 1)] == 3 and sim.holds[(0, 0, 2)] == 3
    assert len(transfers(s)) == 2 * 2 * 3
    assert check_program(lower(s)) == []
    b = lower_bounds(ring(3), s.demand)
    # ReduceScatter's egress and AllGather's ingress bound it at 2e-5; only GPUs reduce on a ring,
    # so its 2(n-1) = 4 sends per element over the three GPUs' egress added up bound it at 4e-5
    assert b.best_s == pytest.approx(4e-5) and b.binding == "reduction"
    assert sim.finish_time_s >= b.best_s


def test_allreduce_copy_from_an_incomplete_gpu_loses_a_contribution():
    sends = chain_rs() + [x for x in gather(2) if x[1] not in ((0, 2), (1, 2))]
    sends += [(2, (1, 2), 0, 0, C_), (3, (1, 2), 1, 0, C_)]  # GPU 1 holds only {1, 2} of block 0 in epoch 2
    sim = simulate(make(ring(3), sends, collective="allreduce"))
    assert sim.violations == ["demand not met: GPU 2 lacks the contributions of GPU(s) 0 to (block 0, chunk 0)"]


def test_allreduce_complete_sum_overwritten_by_a_partial():
    good = chain_rs() + [x for x in gather(2) if not (x[1] == (1, 0))] + [(3, (1, 0), 1, 0, C_)]
    sim = simulate(make(ring(3), good, collective="allreduce"))
    assert sim.valid and sim.epochs == 4
    # GPU 1 copies its partial {1, 2} of block 0 onto GPU 0, which completed block 0 in epoch 2
    sim = simulate(make(ring(3), good + [(2, (1, 0), 0, 0, C_)], collective="allreduce"))
    assert sim.violations == ["demand not met: GPU 0 lacks the contributions of GPU(s) 0 to (block 0, chunk 0)"]


def test_allreduce_gather_as_reduction_counts_twice():
    sends = chain_rs() + gather(2)
    sends[sends.index((2, (0, 1), 0, 0, C_))] = (2, (0, 1), 0, 0, R)
    sim = simulate(make(ring(3), sends, collective="allreduce"))
    assert sim.violations == [
        "GPU 1 adds contributions of GPU(s) 1, 2 to (block 0, chunk 0) twice (epoch 3)",
        "demand not met: GPU 1 lacks the contributions of GPU(s) 0 to (block 0, chunk 0)",
    ]


# ------------------------------------------------------------------ switches, switch(3)


def switch_rs(first: int = 0) -> list:
    """Every partial straight to its owner through the switch, one GPU -> S link use per epoch:
    epoch k: GPU -> S, epoch k + 1: S -> owner (held from k + 1)."""
    out = []
    for step, off in enumerate((1, 2)):
        for d in range(3):
            g = (d + off) % 3
            out += [(first + step, (g, SW), d, 0, R), (first + step + 1, (SW, d), d, 0, R)]
    return out


def test_switch_forwards_partials_separately():
    topo = switch(3)
    timing = epoch_timing(topo, 10**6, TAU)
    assert list(timing.hop_delay) == [1, 0, 1, 0, 1, 0]
    s = make(topo, switch_rs())
    sim = simulate(s)
    assert sim.valid, sim.violations
    assert sim.epochs == 2
    assert len(transfers(s)) == 6 and all(len(t.links) == 2 for t in transfers(s))
    assert check_program(lower(s)) == []


@pytest.mark.parametrize("copy_ok", [False, True])
def test_switch_cannot_copy_a_partial_sum(copy_ok):
    # GPU 1's partial of block 0 reaches the switch in epoch 1; the switch sends it to GPU 0 and GPU 2
    sends = switch_rs() + [(1, (SW, 2), 0, 0, R)]
    sim = simulate(make(switch(3, copy=copy_ok), sends))
    assert sim.violations == [
        "send (epoch 1, link 5, block 0, chunk 0): switch 3 sends (block 0, chunk 0) 2 times with 1 arrival(s); a switch cannot copy a partial sum"
    ]


def test_switch_cannot_turn_a_reduction_into_a_copy():
    sends = switch_rs()
    i = sends.index((1, (SW, 0), 0, 0, R))
    sends[i] = (1, (SW, 0), 0, 0, C_)
    sim = simulate(make(switch(3), sends))
    assert "switch 3 turns a reduction into a copy" in sim.violations[0]


def test_switch_forwards_only_what_arrives_that_epoch():
    sends = switch_rs()
    i = sends.index((1, (SW, 0), 0, 0, R))
    sends[i] = (3, (SW, 0), 0, 0, R)  # it arrived in epoch 1; a switch holds nothing
    sim = simulate(make(switch(3), sends))
    assert sim.violations == [
        "send (epoch 3, link 1, block 0, chunk 0): switch 3 forwards (block 0, chunk 0) that does not arrive in epoch 3",
        "demand not met: GPU 0 lacks the contributions of GPU(s) 1 to (block 0, chunk 0)",
    ]
    # moved to epoch 2, it takes the place of GPU 2's partial arriving then, so one is sent twice
    sends[i] = (2, (SW, 0), 0, 0, R)
    assert "switch 3 sends (block 0, chunk 0) 2 times with 1 arrival(s)" in simulate(make(switch(3), sends)).first_violation


def switch_ar() -> list:
    """switch_rs, then each owner multicasts its sum through the switch (owner d in epoch 3 + d)."""
    out = switch_rs()
    for d in range(3):
        out.append((3 + d, (d, SW), d, 0, C_))
        out += [(4 + d, (SW, g), d, 0, C_) for g in range(3) if g != d]
    return out


def test_copy_switch_may_multicast_a_plain_copy():
    s = make(switch(3, copy=True), switch_ar(), collective="allreduce")
    sim = simulate(s)
    assert sim.valid, sim.violations
    assert sim.epochs == 6
    assert len(transfers(s)) == 12
    assert check_program(lower(s)) == []


def test_nocopy_switch_may_not_multicast_a_plain_copy():
    sim = simulate(make(switch(3, copy=False), switch_ar(), collective="allreduce"))
    assert not sim.valid
    assert "switch 3 cannot copy, yet sends (block 0, chunk 0) 2 times with 1 arrival(s)" in sim.first_violation


# A switch -> GPU hop here takes no epoch: the GPU holds a chunk in the epoch the switch forwards it
# and may send it on in that epoch (the AllGather simulator allows exactly this; see
# test_simulator.test_gpu_may_resend_in_the_epoch_a_switch_delivers). The mirror image of that
# relay in a ReduceScatter: GPU 2 -> S -> GPU 1 (epochs 0, 1), GPU 1 adds its own and sends the sum
# on in epoch 1: GPU 1 -> S -> GPU 0 (epochs 1, 2).
RELAY_RS = [
    (0, (2, SW), 0, 0, R),
    (1, (SW, 1), 0, 0, R),
    (1, (1, SW), 0, 0, R),
    (2, (SW, 0), 0, 0, R),
    (0, (0, SW), 1, 0, R),
    (1, (SW, 2), 1, 0, R),
    (1, (2, SW), 1, 0, R),
    (2, (SW, 1), 1, 0, R),
    (0, (1, SW), 2, 0, R),
    (1, (SW, 0), 2, 0, R),
    (1, (0, SW), 2, 0, R),
    (2, (SW, 2), 2, 0, R),
]



def test_relay_through_a_switch_is_a_correct_program():
    # the lowered program runs it correctly...
    assert check_program(lower(make(switch(3), RELAY_RS), check=False)) == []
    # ...and the time-mirrored AllGather (GPU s -> S -> s+1, which relays at once: S -> s+2) verifies
    ag = []
    for s in range(3):
        a, b = (s + 1) % 3, (s + 2) % 3
        ag += [(0, (s, SW), s, 0), (1, (SW, a), s, 0), (1, (a, SW), s, 0), (2, (SW, b), s, 0)]
    sim = simulate(make(switch(3), ag, collective="allgather"))
    assert sim.valid and sim.epochs == 2


def test_relay_through_a_switch_verifies():
    sim = simulate(make(switch(3), RELAY_RS))
    assert sim.valid, sim.violations
    assert sim.epochs == 2


@pytest.mark.parametrize("copy_ok", [False, True])
def test_reversed_allgather_on_a_zero_latency_switch_verifies(copy_ok):
    topo = switch(3, copy=copy_ok, alpha_us=0.0)
    ag = greedy_allgather(topo.reversed())
    assert simulate(ag).valid
    rs = reduce_scatter_from_allgather(ag, topo)
    assert check_program(lower(rs, check=False)) == []  # the program is right...
    sim = simulate(rs)
    assert sim.valid, sim.first_violation  # ...the replay is not


# ------------------------------------------------------- building from reversed AllGathers


def _check_rs(topo: Topology, ag: Schedule, rs: Schedule, verify: bool = True) -> None:
    """Invariants of a ReduceScatter built from AllGather ``ag`` (on ``topo.reversed()`` or ``topo``)."""
    n, C = len(topo.gpus), ag.chunks
    assert rs.collective is Collective.REDUCESCATTER and rs.topology == topo
    assert (rs.size_bytes, rs.chunks, rs.tau) == (ag.size_bytes, ag.chunks, ag.tau)
    assert rs.sends == sorted(rs.sends)
    assert all(s.reduce for s in rs.sends)
    assert all(0 <= s.link < len(topo.links) for s in rs.sends)
    # every hop runs over the reverse of a link the AllGather used
    ag_pairs = {(ag.topology.links[s.link].src, ag.topology.links[s.link].dst) for s in prune_redundant(ag).sends}
    rs_pairs = {(topo.links[s.link].src, topo.links[s.link].dst) for s in rs.sends}
    assert rs_pairs <= {(v, u) for u, v in ag_pairs}
    # each GPU sends its partial of each other block, each chunk, exactly once; owners never send theirs
    moves = transfers(rs)
    assert len(moves) == (n - 1) * n * C
    assert all(t.reduce for t in moves)
    per = Counter((t.src, t.key) for t in moves)
    assert set(per) == {(g, (d, c)) for d in topo.gpus for c in range(C) for g in topo.gpus if g != d}
    assert set(per.values()) == {1}
    assert check_program(lower(rs, check=False)) == []
    if verify:
        sim = simulate(rs)
        assert sim.valid, sim.first_violation
        assert sim.finish_time_s >= lower_bounds(topo, rs.demand).best_s * (1 - 1e-9)


def _check_ar(topo: Topology, rev: Schedule, fwd: Schedule, ar: Schedule, verify: bool = True) -> None:
    n, C = len(topo.gpus), rev.chunks
    assert ar.collective is Collective.ALLREDUCE and ar.topology == topo
    red = [s for s in ar.sends if s.reduce]
    cp = [s for s in ar.sends if not s.reduce]
    assert red and cp and max(s.epoch for s in red) < min(s.epoch for s in cp)
    offset = ar.meta["gather_offset_epochs"]
    assert sorted(Send(s.epoch - offset, s.link, s.source, s.chunk) for s in cp) == sorted(prune_redundant(fwd).sends)
    moves = transfers(ar)
    assert len(moves) == 2 * (n - 1) * n * C
    assert sum(t.reduce for t in moves) == (n - 1) * n * C
    assert check_program(lower(ar, check=False)) == []
    if verify:
        sim = simulate(ar)
        assert sim.valid, sim.first_violation
        assert sim.finish_time_s >= lower_bounds(topo, ar.demand).best_s * (1 - 1e-9)
        assert sim.epochs >= simulate(reduce_scatter_from_allgather(rev, topo)).epochs


def _check_tree(ag: Schedule) -> None:
    topo = ag.topology
    hops = allgather_tree(prune_redundant(ag))
    assert len(hops) == (len(topo.gpus) - 1) * len(topo.gpus) * ag.chunks
    parent = {(h.source, h.chunk, h.gpu): h.parent for h in hops}
    holds = simulate(ag).holds
    for h in hops:
        assert h.gpu != h.source and holds[(h.source, h.chunk, h.gpu)] <= h.held
        ends = [topo.links[h.links[0]].src] + [topo.links[li].dst for li in h.links]
        assert ends[0] == h.parent and ends[-1] == h.gpu
        assert all(not topo.nodes[x].is_gpu for x in ends[1:-1])
        g, seen = h.gpu, set()
        while g != h.source:  # the parents lead back to the source without a cycle
            assert g not in seen
            seen.add(g)
            g = parent[(h.source, h.chunk, g)]


BANDWIDTHS = (12.5, 25.0, 50.0)
ALPHAS = (0.0, 0.7e-6)


@st.composite
def topologies(draw, with_switch: bool | None = None, symmetric: bool = False, max_gpus: int = 6) -> Topology:
    """As tests/test_properties.topologies, with 3-6 GPUs and the switch chosen by the caller:
    a directed ring plus random extra links (both ways, equal, when ``symmetric``); optionally two
    locality groups; optionally one switch (copy-capable or not) joined both ways to some GPUs."""
    n = draw(st.integers(3, max_gpus))
    bw = st.sampled_from(BANDWIDTHS)
    alpha = st.sampled_from(ALPHAS)
    pairs = {(i, (i + 1) % n) for i in range(n)}
    others = sorted((i, j) for i in range(n) for j in range(n) if i != j and (i, j) not in pairs)
    pairs |= set(draw(st.lists(st.sampled_from(others), unique=True, max_size=len(others))))
    if symmetric:
        links = []
        for i, j in sorted({tuple(sorted(p)) for p in pairs}):
            b, a = draw(bw), draw(alpha)
            links += [Link(i, j, b, a), Link(j, i, b, a)]
    else:
        links = [Link(i, j, draw(bw), draw(alpha)) for i, j in sorted(pairs)]
    groups = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)) if draw(st.booleans()) else [None] * n
    nodes = [Node(i, group=groups[i]) for i in range(n)]
    if with_switch if with_switch is not None else draw(st.booleans()):
        sw = n
        nodes.append(Node(sw, "switch", copy=draw(st.booleans())))
        members = draw(st.lists(st.integers(0, n - 1), unique=True, min_size=2, max_size=n))
        for g in sorted(members):
            links.append(Link(g, sw, draw(bw), draw(alpha)))
            links.append(Link(sw, g, draw(bw), draw(alpha)))
    return Topology("random", tuple(nodes), tuple(links))


CHUNKS = st.sampled_from([1, 2])
SIZES = st.sampled_from([10**5, 10**6, 10**8])
EPOCHS = st.sampled_from(["fast", "slow"])


def _describe(topo: Topology, chunks: int, epoch: str) -> None:
    event(f"{len(topo.gpus)} GPUs")
    sw = [topo.nodes[w] for w in topo.switches]
    event("copy switch" if sw and sw[0].copy else "plain switch" if sw else "no switch")
    event(f"epoch {epoch}, chunks {chunks}")


@settings(max_examples=30, deadline=None)
@given(topologies(with_switch=False), CHUNKS, SIZES, EPOCHS)
def test_reductions_from_reversed_allgathers(topo, chunks, size, epoch):
    _describe(topo, chunks, epoch)
    rev = greedy_allgather(topo.reversed(), chunks, size, epoch)
    fwd = greedy_allgather(topo, chunks, size, epoch)
    _check_tree(rev)
    rs = reduce_scatter_from_allgather(rev, topo)
    _check_rs(topo, rev, rs)
    # no switch: the exact mirror image (same finish) is a valid ReduceScatter; re-placing each hop
    # at its earliest epoch never does worse, and may do better where the greedy AllGather left slack
    r, a = simulate(rs).epochs, simulate(rev).epochs
    assert r <= a
    event("mirror: same finish" if r == a else "mirror: earlier than the AllGather")
    ar = allreduce_from_allgather(rev, fwd, topo)
    _check_ar(topo, rev, fwd, ar)


@settings(max_examples=30, deadline=None)
@given(topologies(with_switch=True), CHUNKS, SIZES, EPOCHS)
def test_reductions_through_switches_lower_to_correct_programs(topo, chunks, size, epoch):
    """With a switch: the lowered programs are right (independent of the simulator, see below)."""
    _describe(topo, chunks, epoch)
    rev = greedy_allgather(topo.reversed(), chunks, size, epoch)
    fwd = greedy_allgather(topo, chunks, size, epoch)
    _check_tree(rev)
    _check_rs(topo, rev, reduce_scatter_from_allgather(rev, topo), verify=False)
    _check_ar(topo, rev, fwd, allreduce_from_allgather(rev, fwd, topo), verify=False)


@settings(max_examples=30, deadline=None)
@given(topologies(with_switch=True), CHUNKS, SIZES, EPOCHS)
@example(switch(3, alpha_us=0.0), 1, 10**6, "fast")
def test_reductions_through_switches_verify(topo, chunks, size, epoch):
    rev = greedy_allgather(topo.reversed(), chunks, size, epoch)
    fwd = greedy_allgather(topo, chunks, size, epoch)
    rs = reduce_scatter_from_allgather(rev, topo)
    # (no comparison with the AllGather's finish here: re-placing the reversed hops through a
    # switch may come out later, or earlier when the greedy AllGather left slack)
    _check_rs(topo, rev, rs)
    _check_ar(topo, rev, fwd, allreduce_from_allgather(rev, fwd, topo))


# ----------------------------------------------------------------------- mirror image


@settings(max_examples=20, deadline=None)
@given(topologies(with_switch=False, symmetric=True, max_gpus=4), SIZES, EPOCHS)
def test_mirror_image_on_symmetric_topologies(topo, size, epoch):
    """Symmetric, no switch: the AllGather on the topology itself runs backwards with the same
    finish when it is minimal (an earlier ReduceScatter, mirrored, would be an earlier AllGather);
    the greedy one may leave slack that the re-placed hops use."""
    out = synthesize(topo, "allgather", size, epoch, chunks=1, time_limit=20)
    greedy = greedy_allgather(topo, 1, size, epoch)
    for ag in (out.schedule, greedy):
        rs = reduce_scatter_from_allgather(ag, topo)
        a, r = simulate(ag), simulate(rs)
        assert r.valid, r.first_violation
        assert r.epochs <= a.epochs
        if ag is out.schedule and out.status == "optimal":
            assert r.epochs == a.epochs
        ar = allreduce_from_allgather(ag)
        x = simulate(ar)
        assert x.valid, x.first_violation
        # the gather starts the epoch the last block is reduced
        assert x.epochs == r.epochs + a.epochs
    event(f"allgather {out.status}")


MIRROR_TOPOS = {
    "ring-3": lambda: ring(3),
    "ring-4": lambda: ring(4),
    "ring-oneway": lambda: ring(4, bidirectional=False),
    "torus-3x3": lambda: torus(3, 3),
    "mesh-2x3": lambda: mesh(2, 3),
    "full-4": lambda: full(4),
    "dgx1": dgx1,
}


@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("key", sorted(MIRROR_TOPOS))
def test_mirror_image_builtins(key, chunks):
    topo = MIRROR_TOPOS[key]()
    rev = greedy_allgather(topo.reversed(), chunks)
    rs = reduce_scatter_from_allgather(rev, topo)
    _check_rs(topo, rev, rs)
    assert simulate(rs).epochs == simulate(rev).epochs


@pytest.mark.parametrize("key", ["ring-4", "torus-3x3", "full-4"])
def test_mirror_image_of_synthesized_allgathers(key):
    topo = MIRROR_TOPOS[key]()
    rev = synthesize(topo.reversed(), "allgather", 10**6, "fast", chunks=1, time_limit=20).schedule
    fwd = synthesize(topo, "allgather", 10**6, "fast", chunks=1, time_limit=20).schedule
    rs = reduce_scatter_from_allgather(rev, topo)
    _check_rs(topo, rev, rs)
    assert simulate(rs).epochs == simulate(rev).epochs
    _check_ar(topo, rev, fwd, allreduce_from_allgather(rev, fwd, topo))


@pytest.mark.parametrize("n", [3, 4])
def test_switch_multicast_reversed_may_take_longer(n):
    # alpha 0.7 us costs the switch -> GPU hop an epoch here, so the replay is not affected by
    # the same-epoch bug above
    topo = switch(n, copy=True)
    rev = synthesize(topo.reversed(), "allgather", 10**6, "fast", chunks=1, time_limit=20).schedule
    fwd = synthesize(topo, "allgather", 10**6, "fast", chunks=1, time_limit=20).schedule
    rs = reduce_scatter_from_allgather(rev, topo)
    _check_rs(topo, rev, rs)
    assert simulate(rs).epochs >= simulate(rev).epochs
    _check_ar(topo, rev, fwd, allreduce_from_allgather(rev, fwd, topo))


def test_asymmetric_topology_needs_the_reversed_allgather():
    topo = ring(4, bidirectional=False)
    ag = greedy_allgather(topo)
    with pytest.raises(InputError) as e:
        reduce_scatter_from_allgather(ag, topo)
    assert e.value.field == "topology" and "ring has no link 3->2, the reverse of the AllGather's 2->3" == e.value.problem
    rev = greedy_allgather(topo.reversed())
    with pytest.raises(InputError) as e:
        allreduce_from_allgather(rev, None, topo)  # the gather phase would run on the reversed links
    assert e.value.field == "schedule"
    _check_ar(topo, rev, ag, allreduce_from_allgather(rev, ag, topo))


def test_building_reductions_rejects_bad_inputs():
    topo = ring(3)
    rs = make(topo, chain_rs())
    with pytest.raises(InputError) as e:
        reduce_scatter_from_allgather(rs)
    assert e.value.field == "collective"
    ag = greedy_allgather(topo)
    with pytest.raises(InputError) as e:
        reduce_scatter_from_allgather(ag, ring(4))
    assert e.value.field == "topology"
    bad = Schedule(topo, Collective.ALLGATHER, ag.size_bytes, 1, ag.tau, ag.sends[:-1])
    with pytest.raises(InputError) as e:
        allgather_tree(bad)
    assert e.value.field == "schedule" and "invalid" in e.value.problem


# ----------------------------------------------------------------------------- programs


def _programs():
    topo = ring(4)
    rev = greedy_allgather(topo.reversed())
    return {
        "rs-chain-ring3": lower(make(ring(3), chain_rs())),
        "ar-ring3": lower(make(ring(3), chain_rs() + gather(2), collective="allreduce")),
        "rs-ring4": lower(reduce_scatter_from_allgather(rev, topo)),
        "ar-ring4": lower(allreduce_from_allgather(rev, greedy_allgather(topo), topo)),
        "ar-switch3": lower(make(switch(3, copy=True), switch_ar(), collective="allreduce")),
    }


PROGRAMS = _programs()


@pytest.mark.parametrize("key", sorted(PROGRAMS))
def test_lowered_programs_are_correct(key):
    prog = PROGRAMS[key]
    assert check_program(prog) == []
    n, C = prog.ngpus, prog.chunks
    for g in prog.gpus:
        assert g.i_chunks == n * C
        assert g.o_chunks == (C if prog.collective is Collective.REDUCESCATTER else n * C)
        ops = Counter(st.op for st in g.steps)
        assert set(ops) <= {"s", "r", "rrc", "cpy"}
        # ReduceScatter: a GPU receives only partials, never plain copies
        if prog.collective is Collective.REDUCESCATTER:
            assert ops["r"] == 0


def _corrupt(key, rank, edit):
    prog = copy.deepcopy(PROGRAMS[key])
    edit(prog.gpus[rank].steps)
    return check_program(prog)


@pytest.mark.parametrize("key", sorted(PROGRAMS))
def test_program_with_a_wrong_rrc_source_is_caught(key):
    prog = PROGRAMS[key]
    n, C = prog.ngpus, prog.chunks
    for rank in range(n):
        steps = prog.gpus[rank].steps
        i = next(i for i, s in enumerate(steps) if s.op == "rrc" and s.src[0] == "i")
        other = ("i", (steps[i].src[1] + C) % (n * C))  # the same chunk of the next block

        def edit(steps, i=i, other=other):
            steps[i].src = other

        problems = _corrupt(key, rank, edit)
        assert problems and f"rank {rank} step {i} (rrc): adds chunk" in problems[0], problems


@pytest.mark.parametrize("key", sorted(PROGRAMS))
def test_program_missing_a_receive_is_caught(key):
    for rank in range(PROGRAMS[key].ngpus):
        i = next(i for i, s in enumerate(PROGRAMS[key].gpus[rank].steps) if s.op in ("r", "rrc"))
        problems = _corrupt(key, rank, lambda steps, i=i: steps.pop(i))
        assert problems and any(f"rank {rank} " in p for p in problems), problems


@pytest.mark.parametrize("key", sorted(PROGRAMS))
def test_program_sending_twice_is_caught(key):
    for rank in range(PROGRAMS[key].ngpus):
        steps = PROGRAMS[key].gpus[rank].steps
        i = next(i for i, s in enumerate(steps) if s.op == "s")
        problems = _corrupt(key, rank, lambda steps, i=i: steps.insert(i + 1, copy.deepcopy(steps[i])))
        assert problems == [f"rank {rank} step {i + 1} (s): transfer {steps[i].tag} is sent twice"]


def test_program_adding_a_contribution_twice_is_caught():
    # rank 0 adds the partial from rank 1 onto its own input a second time
    def edit(steps):
        j = max(i for i, s in enumerate(steps) if s.op == "rrc")
        steps[j].src = steps[j].dst = ("o", 0)
        steps.insert(j, copy.deepcopy(steps[j]))
        steps[j].src = ("i", 0)

    problems = _corrupt("rs-chain-ring3", 0, edit)
    assert problems and problems[0].startswith("rank 0 step 4 (rrc): counts the contribution of rank(s)"), problems




@pytest.mark.parametrize("side", ["send", "receive"])
def test_program_naming_the_wrong_peer_is_caught(side):
    # rank 0's first send (transfer to rank 2) names rank 1, or rank 2's receive of it names rank 1
    prog = copy.deepcopy(PROGRAMS["rs-chain-ring3"])
    send = prog.gpus[0].steps[0]
    assert (send.op, send.peer) == ("s", 2)
    if side == "send":
        send.peer = 1
    else:
        recv = next(st for st in prog.gpus[2].steps if st.op in ("r", "rrc") and st.tag == send.tag)
        assert recv.peer == 0
        recv.peer = 1
    problems = check_program(prog)
    assert problems and any("rank 0" in p or "rank 2" in p for p in problems)


def test_program_with_a_send_nobody_receives_is_caught():
    prog = copy.deepcopy(PROGRAMS["rs-chain-ring3"])
    prog.gpus[0].steps.append(Step("s", 1, ("i", 0), None, 5, tag=99))
    problems = check_program(prog)
    assert problems and any("rank 0" in p for p in problems)


def test_lower_refuses_an_invalid_reduction():
    with pytest.raises(InputError) as e:
        lower(make(ring(3), direct_rs(0, blocks=(1, 2))))
    assert e.value.field == "schedule" and "lacks the contributions" in e.value.problem


# --------------------------------------------------------------------------------- JSON


def test_reduction_schedule_round_trip(tmp_path):
    topo = ring(4)
    rev = greedy_allgather(topo.reversed(), chunks=2)
    ar = allreduce_from_allgather(rev, greedy_allgather(topo, chunks=2), topo)
    d = ar.to_dict()
    assert {len(x) for x in d["sends"]} == {4, 5}
    assert all(x[4] == 1 for x in d["sends"] if len(x) == 5)
    assert sum(len(x) == 5 for x in d["sends"]) == sum(s.reduce for s in ar.sends) > 0
    ar.save(tmp_path / "ar.json")
    back = load_schedule(tmp_path / "ar.json")
    assert back.collective is Collective.ALLREDUCE
    assert back.sends == ar.sends
    assert [s.reduce for s in back.sends] == [s.reduce for s in ar.sends]
    assert back.meta == json.loads(json.dumps(ar.meta))
    a, b = simulate(ar), simulate(back)
    assert a.valid and (a.valid, a.epochs, a.finish_time_s) == (b.valid, b.epochs, b.finish_time_s)


def test_explicit_zero_reads_as_a_copy():
    d = make(ring(3), chain_rs() + gather(2), collective="allreduce").to_dict()
    d["sends"] = [x if len(x) == 5 else [*x, 0] for x in d["sends"]]
    back = Schedule.from_dict(json.loads(json.dumps(d)))
    assert sum(s.reduce for s in back.sends) == 6
    assert simulate(back).epochs == 3


@pytest.mark.parametrize("fifth", [2, -1, 7])
def test_bad_reduce_flag_is_rejected(fifth):
    d = json.loads(json.dumps(make(ring(3), chain_rs()).to_dict()))
    d["sends"][3][4] = fifth
    with pytest.raises(InputError) as e:
        Schedule.from_dict(d)
    assert e.value.field == "sends[3][4]"
    assert f"{fifth!r} is not 0 or 1" in e.value.problem


@pytest.mark.parametrize("fifth", [True, 1.0, "1", None])
def test_non_integer_reduce_flag_is_rejected(fifth):
    d = json.loads(json.dumps(make(ring(3), chain_rs()).to_dict()))
    d["sends"][2][4] = fifth
    with pytest.raises(InputError) as e:
        Schedule.from_dict(d)
    assert e.value.field == "sends[2]"


def test_six_element_send_is_rejected():
    d = json.loads(json.dumps(make(ring(3), chain_rs()).to_dict()))
    d["sends"][0] = [*d["sends"][0], 1]
    with pytest.raises(InputError) as e:
        Schedule.from_dict(d)
    assert e.value.field == "sends[0]"


# ---------------------------------------------------------------------- reversed topology


@pytest.mark.parametrize(
    "topo",
    [ring(4, bidirectional=False), switch(4, copy=True), ndv2(2), ndv2(2, teccl_compat=True), dgx1()],
    ids=["ring-oneway", "switch-copy", "ndv2", "ndv2-compat", "dgx1"],
)
def test_reversed_builtins(topo):
    rev = topo.reversed()
    assert rev.reversed() == topo
    assert rev.reversed().links == topo.links
    assert rev.nodes == topo.nodes
    assert (rev.nominal_gpus, rev.teccl_compat, rev.name) == (topo.nominal_gpus, topo.teccl_compat, topo.name)
    for a, b in zip(topo.links, rev.links, strict=True):
        assert (b.src, b.dst, b.bandwidth_GBps, b.alpha_s) == (a.dst, a.src, a.bandwidth_GBps, a.alpha_s)


@settings(max_examples=40, deadline=None)
@given(topologies())
def test_reversed_twice_is_the_identity(topo):
    rev = topo.reversed()
    assert rev.reversed().links == topo.links and rev.reversed() == topo
    assert {(lk.dst, lk.src): (lk.bandwidth_GBps, lk.alpha_s) for lk in rev.links} == {
        (lk.src, lk.dst): (lk.bandwidth_GBps, lk.alpha_s) for lk in topo.links
    }
    assert sorted(len(rev.in_links(v)) for v in range(topo.num_nodes)) == sorted(len(topo.out_links(v)) for v in range(topo.num_nodes))
    # duality of the bounds: a ReduceScatter here is bounded like an AllGather on the reverse
    # (egress here = ingress there, the cut leaving a group = the cut entering it there)
    rs = lower_bounds(topo, make_demand(topo, "reducescatter", 10**6))
    ag = lower_bounds(rev, make_demand(rev, "allgather", 10**6))
    assert rs.ingress_s == pytest.approx(ag.ingress_s)
    assert rs.cut_s == pytest.approx(ag.cut_s)
    assert rs.latency_s == pytest.approx(ag.latency_s, abs=1e-11)
    ar = lower_bounds(topo, make_demand(topo, "allreduce", 10**6))
    fwd = lower_bounds(topo, make_demand(topo, "allgather", 10**6))
    assert ar.best_s == pytest.approx(max(rs.best_s, fwd.best_s, ar.reduction_s))  # AllReduce's own bound on top


@pytest.mark.parametrize("coll", ["reducescatter", "allreduce"])
def test_reduction_baseline_is_the_reversed_ring_it_reuses(coll):
    """The reduction reverses the ring its AllGather synthesis already built rather than building
    it again: the reported baseline is still exactly the reversed ring's replay."""
    topo = dgx1()
    out = synthesize(topo, coll, 8 << 20, "fast", 2, 10)
    d = make_demand(topo, Collective.ALLGATHER, 8 << 20, 2)
    timing = epoch_timing(topo, d.chunk_bytes, out.sim.tau)
    ring = Schedule.from_tuples(topo, d, timing.tau, baseline_sends(topo, d, timing)[1])
    want = reduce_scatter_from_allgather(ring) if coll == "reducescatter" else allreduce_from_allgather(ring)
    assert out.baseline.epochs == simulate(want).epochs
    assert out.baseline.finish_time_s == pytest.approx(simulate(want).finish_time_s)


@settings(max_examples=60, deadline=None)
@given(topologies(with_switch=False, symmetric=True), CHUNKS, SIZES, EPOCHS)
def test_a_reversed_baseline_takes_its_allgathers_epochs_without_switches(topo, chunks, size, epoch):
    """Symmetric links and no switch: the baseline's ReduceScatter is its AllGather's mirror image,
    epoch for epoch, as schedule/reduce.py's docstring says. (Through cut-through switches whose
    links differ in speed it is not: a path's epochs into and out of a switch differ by direction;
    hypothesis found such a fabric, 5 GPUs on one forwarding switch at 25 and 50 GB/s.)"""
    assert topo.symmetric() and not topo.switches
    _describe(topo, chunks, epoch)
    ag = greedy_allgather(topo, chunks, size, epoch)
    rs = reduce_scatter_from_allgather(ag, topo)
    assert simulate(rs).finish_time_s == pytest.approx(simulate(ag).finish_time_s, rel=1e-12)



@settings(max_examples=60, deadline=None)
@given(topologies(), CHUNKS, SIZES, EPOCHS)
def test_no_allreduce_finishes_before_its_bound(topo, chunks, size, epoch):
    """The AllReduce bound (each GPU's buffer out once and in once; 2(n-1) GPU sends per element
    where only GPUs reduce) holds for the reversed ring baseline on any topology hypothesis draws."""
    _describe(topo, chunks, epoch)
    rev = greedy_allgather(topo.reversed(), chunks, size, epoch)
    fwd = greedy_allgather(topo, chunks, size, epoch)
    ar = allreduce_from_allgather(rev, fwd, topo)
    sim = simulate(ar)
    assert sim.valid, sim.first_violation
    b = lower_bounds(topo, ar.demand)
    assert sim.finish_time_s >= b.reduction_s * (1 - 1e-9) and sim.finish_time_s >= b.best_s * (1 - 1e-9)
