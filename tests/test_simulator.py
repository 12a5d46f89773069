"""The simulator as an independent verifier: hand-built schedules with hand-computed results.

Epoch rules (flowride.topology.timing): a chunk sent in epoch k into a GPU or a switch arrives at
the start of epoch k + 1 + a + b; a switch forwards it in that very epoch, and the switch -> GPU
hop adds only its a. Finish = (epoch at whose start the last needed chunk is held) * tau.

All schedules below use 1 MB chunks on 50 GB/s links (20 us per chunk) unless noted, so with
tau = 20 us: cap 1, b = 0; with tau = 10 us: cap 0.5, b = 1, one chunk per two epochs.
"""

from __future__ import annotations

import json
import random

import pytest

from flowride.collectives import make_demand
from flowride.errors import InputError
from flowride.schedule import Schedule, Send, load_schedule, simulate
from flowride.schedule.prune import drop_switch_cycles, prune_redundant
from flowride.synth.bounds import epoch_lower_bound, lower_bounds
from flowride.synth.greedy import baseline_sends, direct_alltoall, ring_allgather
from flowride.synth.highs import SolveOptions, solve
from flowride.synth.milp import build_model, sends_from_solution
from flowride.topology import (
    Link,
    Node,
    Topology,
    dgx1,
    dgx2,
    full,
    mesh,
    mi250,
    ndv2,
    ring,
    switch,
    torus,
)
from flowride.topology.timing import epoch_timing

TAU = 2e-5  # one 1 MB chunk per epoch on 50 GB/s
SW = 3  # the switch's node id in switch(3)


def make(topo, sends, collective="allgather", chunks=1, tau=TAU, per_chunk=10**6):
    """Schedule of (epoch, (u, v), source, chunk) sends, links named by their ends."""
    size = per_chunk * topo.buffer_ranks * chunks
    demand = make_demand(topo, collective, size, chunks)
    assert demand.chunk_bytes == per_chunk
    li = topo.link_index
    tuples = [(k, li[uv] if isinstance(uv, tuple) else uv, s, c) for k, uv, s, c in sends]
    return Schedule.from_tuples(topo, demand, tau, tuples)


def only(sim, *fragments):
    """Every violation contains one of ``fragments``."""
    return all(any(f in v for f in fragments) for v in sim.violations)


# ----------------------------------------------------------------------- valid, ring(3)

RING_ALL_NEIGHBOURS = [(0, (s, d), s, 0) for s in range(3) for d in range(3) if d != s]
RING_RELAY = [
    (0, (0, 1), 0, 0),
    (0, (1, 2), 1, 0),
    (0, (2, 0), 2, 0),
    (1, (1, 2), 0, 0),  # GPU 1 holds chunk 0 of GPU 0 from epoch 1 and relays it at once
    (1, (2, 0), 1, 0),
    (1, (0, 1), 2, 0),
]


def test_ring_direct_allgather_one_epoch():
    sim = simulate(make(ring(3), RING_ALL_NEIGHBOURS))
    assert sim.valid, sim.violations
    assert sim.epochs == 1
    assert sim.finish_time_s == pytest.approx(2e-5)
    assert sim.tau == TAU
    assert sim.first_violation is None


def test_ring_relay_allgather_two_epochs():
    sim = simulate(make(ring(3), RING_RELAY))
    assert sim.valid, sim.violations
    assert sim.epochs == 2
    assert sim.finish_time_s == pytest.approx(4e-5)
    assert sim.holds[(0, 0, 1)] == 1 and sim.holds[(0, 0, 2)] == 2
    assert sim.holds[(2, 0, 0)] == 1 and sim.holds[(2, 0, 1)] == 2


def test_send_order_does_not_matter():
    sends = list(RING_RELAY)
    random.Random(7).shuffle(sends)
    a, b = simulate(make(ring(3), RING_RELAY)), simulate(make(ring(3), sends))
    assert (a.valid, a.epochs, a.holds) == (b.valid, b.epochs, b.holds)


def test_alpha_adds_whole_epochs():
    # alpha 30 us / tau 20 us = 1.5 -> a = 2: one hop takes 1 + 2 = 3 epochs
    sim = simulate(make(ring(3, alpha_us=30.0), RING_ALL_NEIGHBOURS))
    assert sim.valid
    assert sim.epochs == 3
    assert sim.finish_time_s == pytest.approx(6e-5)


def test_small_alpha_is_free():
    # 1.5 us / 20 us = 0.075 <= 0.1 -> a = 0
    sim = simulate(make(ring(3, alpha_us=1.5), RING_ALL_NEIGHBOURS))
    assert sim.epochs == 1


def test_beta_delays_arrival():
    # tau 10 us: a chunk needs two epochs on the link (b = 1), arriving at k + 2
    sim = simulate(make(ring(3), RING_ALL_NEIGHBOURS, tau=1e-5))
    assert sim.valid
    assert sim.epochs == 2
    assert sim.finish_time_s == pytest.approx(2e-5)


def test_beta_window_allows_one_chunk_per_two_epochs():
    sends = [(0, (s, d), s, 0) for s in range(3) for d in range(3) if d != s]
    sends += [(2, (s, d), s, 1) for s in range(3) for d in range(3) if d != s]
    sim = simulate(make(ring(3), sends, chunks=2, tau=1e-5))
    assert sim.valid, sim.violations
    assert sim.epochs == 4
    assert sim.finish_time_s == pytest.approx(4e-5)


# --------------------------------------------------------------------- valid, switch(3)
# links of switch(3): 0: 0->3, 1: 3->0, 2: 1->3, 3: 3->1, 4: 2->3, 5: 3->2

NOCOPY_ALLGATHER = [
    (0, (0, SW), 0, 0),
    (0, (1, SW), 1, 0),
    (0, (2, SW), 2, 0),
    (1, (SW, 1), 0, 0),
    (1, (SW, 2), 1, 0),
    (1, (SW, 0), 2, 0),
    (1, (0, SW), 0, 0),
    (1, (1, SW), 1, 0),
    (1, (2, SW), 2, 0),
    (2, (SW, 2), 0, 0),
    (2, (SW, 0), 1, 0),
    (2, (SW, 1), 2, 0),
]

COPY_ALLGATHER = [
    (0, (0, SW), 0, 0),
    (1, (SW, 1), 0, 0),
    (1, (SW, 2), 0, 0),
    (1, (1, SW), 1, 0),
    (2, (SW, 0), 1, 0),
    (2, (SW, 2), 1, 0),
    (2, (2, SW), 2, 0),
    (3, (SW, 0), 2, 0),
    (3, (SW, 1), 2, 0),
]


def test_switch_link_ids():
    li = switch(3).link_index
    assert [li[(0, SW)], li[(SW, 0)], li[(1, SW)], li[(SW, 1)], li[(2, SW)], li[(SW, 2)]] == list(range(6))


@pytest.mark.parametrize("copy", [False, True])
def test_nocopy_style_allgather_on_a_switch(copy):
    # one transmission GPU -> switch -> GPU: sent in k, forwarded in k + 1, held from k + 1
    sim = simulate(make(switch(3, copy=copy), NOCOPY_ALLGATHER))
    assert sim.valid, sim.violations
    assert sim.epochs == 2
    assert sim.finish_time_s == pytest.approx(4e-5)
    assert sim.holds[(0, 0, 1)] == 1 and sim.holds[(0, 0, 2)] == 2


def test_copy_switch_multicast():
    sim = simulate(make(switch(3, copy=True), COPY_ALLGATHER))
    assert sim.valid, sim.violations
    assert sim.epochs == 3
    assert sim.finish_time_s == pytest.approx(6e-5)
    assert sim.holds[(0, 0, 1)] == sim.holds[(0, 0, 2)] == 1


def test_switch_with_alpha():
    # a = ceil(30/20) = 2: GPU -> switch 1 + 2 = 3 epochs, switch -> GPU 2 epochs
    sends = [
        (0, (0, SW), 0, 0),
        (0, (1, SW), 1, 0),
        (0, (2, SW), 2, 0),
        (1, (0, SW), 0, 0),
        (1, (1, SW), 1, 0),
        (1, (2, SW), 2, 0),
        (3, (SW, 1), 0, 0),  # arrived at 0 + 3, held at 3 + 2
        (3, (SW, 2), 1, 0),
        (3, (SW, 0), 2, 0),
        (4, (SW, 2), 0, 0),
        (4, (SW, 0), 1, 0),
        (4, (SW, 1), 2, 0),
    ]
    sim = simulate(make(switch(3, alpha_us=30.0), sends))
    assert sim.valid, sim.violations
    assert sim.holds[(0, 0, 1)] == 5 and sim.holds[(0, 0, 2)] == 6
    assert sim.epochs == 6
    assert sim.finish_time_s == pytest.approx(1.2e-4)


def test_gpu_may_resend_in_the_epoch_a_switch_delivers():
    # switch -> GPU with a = 0 delivers in the forwarding epoch; the GPU may send it on at once
    sends = [(0, (0, SW), 0, 0), (1, (SW, 1), 0, 0), (1, (1, SW), 0, 0), (2, (SW, 2), 0, 0)]
    sim = simulate(make(switch(3, copy=False), sends))
    assert sim.holds[(0, 0, 1)] == 1 and sim.holds[(0, 0, 2)] == 2
    assert not sim.valid  # the other chunks never move
    assert only(sim, "demand not met")
    assert len(sim.violations) == 4


# ---------------------------------------------------------------------- valid, full(3)

A2A_DIRECT = [(0, (s, d), s, d) for s in range(3) for d in range(3) if d != s]  # chunk = dest index


def test_full_direct_alltoall():
    sim = simulate(make(full(3), A2A_DIRECT, collective="alltoall"))
    assert sim.valid, sim.violations
    assert sim.epochs == 1
    assert sim.finish_time_s == pytest.approx(2e-5)


def test_alltoall_relay_through_another_gpu():
    sends = [s for s in A2A_DIRECT if s[1] != (0, 2)] + [(0, (0, 1), 0, 2), (1, (1, 2), 0, 2)]
    # link 0->1 now carries two chunks in epoch 0: move GPU 0's own block for 1 to epoch 1
    sends = [(1, uv, s, c) if (uv, s, c) == ((0, 1), 0, 1) else (k, uv, s, c) for k, uv, s, c in sends]
    sim = simulate(make(full(3), sends, collective="alltoall"))
    assert sim.valid, sim.violations
    assert sim.epochs == 2
    assert sim.holds[(0, 2, 1)] == 1  # the relay holds a block it does not need
    assert sim.holds[(0, 2, 2)] == 2


# --------------------------------------------------------------------------- rejections


def test_reject_send_before_arrival():
    sends = RING_ALL_NEIGHBOURS + [(0, (1, 2), 0, 0)]
    sim = simulate(make(ring(3), sends))
    assert not sim.valid
    assert sim.first_violation == "send (epoch 0, link 3, source 0, chunk 0): GPU 1 sends chunk (0,0) it holds only from epoch 1"
    assert sim.epochs is None and sim.finish_time_s is None


def test_reject_send_never_held():
    sends = [s for s in RING_RELAY if s != (1, (1, 2), 0, 0)] + [(0, (2, 0), 0, 0)]
    sim = simulate(make(ring(3), sends))
    assert not sim.valid
    assert "GPU 2 sends chunk (0,0) it holds never" in sim.first_violation


def test_early_relay_message_does_not_depend_on_send_order():
    early = (0, (1, 2), 0, 0)  # GPU 1 relays chunk 0 of GPU 0 in epoch 0; it arrives at epoch 1
    a = simulate(make(ring(3), [(0, (0, 1), 0, 0), early]))
    b = simulate(make(ring(3), [early, (0, (0, 1), 0, 0)]))
    assert "it holds only from epoch 1" in a.first_violation
    assert a.first_violation == b.first_violation


def test_reject_relay_one_epoch_early():
    sends = [s if s != (1, (1, 2), 0, 0) else (0, (1, 2), 0, 0) for s in RING_RELAY]
    sim = simulate(make(ring(3), sends))
    assert not sim.valid
    assert sim.first_violation.endswith("GPU 1 sends chunk (0,0) it holds only from epoch 1")


@pytest.mark.parametrize("epoch", [0, 2])
def test_reject_switch_forwarding_what_did_not_arrive_then(epoch):
    sends = [s for s in COPY_ALLGATHER if s[0] != 1 or s[2] != 0]  # drop the epoch-1 forwards of chunk 0
    sends += [(epoch, (SW, 1), 0, 0), (epoch, (SW, 2), 0, 0)]
    sim = simulate(make(switch(3, copy=True), sends))
    assert not sim.valid
    assert f"switch {SW} forwards chunk (0,0) that does not arrive in epoch {epoch}" in sim.first_violation


def test_reject_nocopy_switch_replicating():
    sim = simulate(make(switch(3, copy=False), COPY_ALLGATHER))
    assert not sim.valid
    assert sim.first_violation == (
        f"send (epoch 1, link 5, source 0, chunk 0): switch {SW} cannot copy, yet sends (0,0) 2 times with 1 arrival(s)"
    )


def test_nocopy_switch_two_arrivals_two_copies():
    # tau 40 us: two chunks per epoch per link; two copies in, two copies out
    sends = [(0, (g, SW), g, 0) for g in range(3) for _ in range(2)]
    sends += [(1, (SW, d), s, 0) for s in range(3) for d in range(3) if d != s]
    sched = make(switch(3, copy=False), sends, tau=4e-5)
    sim = simulate(sched)
    assert sim.valid, sim.violations
    assert sim.epochs == 1
    # only one copy in per chunk: the second copy out has nothing to forward
    single = [s for i, s in enumerate(sends) if i % 2 == 0 or s[0] == 1]
    bad = simulate(make(switch(3, copy=False), single, tau=4e-5))
    assert not bad.valid
    # each second copy is refused, so its GPU never gets that chunk
    assert [("cannot copy" in v) for v in bad.violations] == [True] * 3 + [False] * 3
    assert only(bad, "cannot copy", "demand not met")


def test_reject_link_over_capacity_in_one_epoch():
    sends = [
        (0, (0, 2), 0, 0),
        (0, (1, 2), 1, 0),
        (0, (2, 0), 2, 0),
        (0, (1, 0), 1, 0),
        (1, (0, 1), 0, 0),
        (1, (0, 1), 2, 0),  # a second chunk on 0 -> 1 in epoch 1
    ]
    sim = simulate(make(ring(3), sends))
    assert not sim.valid
    assert sim.violations == ["link 0 (0->1) carries 2 chunks in epoch 1, capacity 1"]


def test_reject_link_over_capacity_in_a_beta_window():
    # tau 10 us, b = 1: one chunk per two epochs; chunk 1 follows chunk 0 one epoch later
    sends = [(0, (s, d), s, 0) for s in range(3) for d in range(3) if d != s]
    sends += [(2, (s, d), s, 1) for s in range(3) for d in range(3) if d != s]
    sends = [(1, uv, s, c) if (uv, s, c) == ((0, 1), 0, 1) else (k, uv, s, c) for k, uv, s, c in sends]
    sim = simulate(make(ring(3), sends, chunks=2, tau=1e-5))
    assert not sim.valid
    assert sim.first_violation == "link 0 (0->1) carries 2 chunks in epochs 0..1, capacity 1"
    assert only(sim, "link 0 (0->1) carries 2 chunks in epochs 0..1")


def test_reject_demand_not_met():
    sends = [s for s in RING_ALL_NEIGHBOURS if s != (0, (0, 2), 0, 0)]
    sim = simulate(make(ring(3), sends))
    assert not sim.valid
    assert sim.violations == ["demand not met: GPU 2 never receives chunk 0 of GPU 0"]
    sim = simulate(make(ring(3), []))
    assert len(sim.violations) == 6 and only(sim, "demand not met")


def test_reject_alltoall_block_at_the_wrong_gpu():
    # GPU 0's block for GPU 2 goes to GPU 1 instead: GPU 2 still misses it
    sends = [s for s in A2A_DIRECT if s[1] != (0, 2)] + [(1, (0, 1), 0, 2)]
    sim = simulate(make(full(3), sends, collective="alltoall"))
    assert sim.violations == ["demand not met: GPU 2 never receives chunk 2 of GPU 0"]


@pytest.mark.parametrize("link", [6, 99, -1])
def test_reject_bad_link_index(link):
    sends = RING_ALL_NEIGHBOURS + [(0, link, 0, 0)]
    sim = simulate(make(ring(3), sends))
    assert not sim.valid
    assert sim.violations == [f"send (epoch 0, link {link}, source 0, chunk 0): no link {link} in ring (6 links)"]


@pytest.mark.parametrize(
    "source,chunk,collective,msg",
    [
        (0, 1, "allgather", "GPU 0 has no chunk 1 in this allgather"),
        (7, 0, "allgather", "GPU 7 has no chunk 0 in this allgather"),
        (0, 0, "alltoall", "GPU 0 has no chunk 0 in this alltoall"),  # no block for itself
        (0, -1, "alltoall", "GPU 0 has no chunk -1 in this alltoall"),
    ],
)
def test_reject_bad_chunk(source, chunk, collective, msg):
    base = RING_ALL_NEIGHBOURS if collective == "allgather" else A2A_DIRECT
    sim = simulate(make(full(3), base + [(0, (0, 1), source, chunk)], collective=collective))
    assert not sim.valid
    assert len(sim.violations) == 1 and msg in sim.first_violation


def test_reject_switch_as_source():
    sim = simulate(make(switch(3), NOCOPY_ALLGATHER + [(0, (SW, 0), SW, 0)]))
    assert sim.violations == [f"send (epoch 0, link 1, source {SW}, chunk 0): GPU {SW} has no chunk 0 in this allgather"]


def test_reject_negative_epoch():
    sim = simulate(make(ring(3), RING_ALL_NEIGHBOURS + [(-1, (0, 1), 0, 0)]))
    assert sim.violations == ["send (epoch -1, link 0, source 0, chunk 0): negative epoch"]


def test_max_violations():
    sim = simulate(make(ring(3), []), max_violations=2)
    assert len(sim.violations) == 2 and not sim.valid


# ----------------------------------------------------------------------------- baselines

BASELINE_TOPOS = {
    "dgx1": dgx1,
    "ndv2-2": lambda: ndv2(2),
    "ndv2-3": lambda: ndv2(3),
    "ndv2-compat": lambda: ndv2(2, teccl_compat=True),
    "dgx2-1": lambda: dgx2(1),
    "dgx2-2": lambda: dgx2(2),
    "mi250-1": lambda: mi250(1),
    "mi250-2": lambda: mi250(2),
    "ring-5": lambda: ring(5),
    "ring-oneway": lambda: ring(4, bidirectional=False),
    "mesh-2x3": lambda: mesh(2, 3),
    "torus-3x3": lambda: torus(3, 3),
    "full-4": lambda: full(4),
    "switch-4": lambda: switch(4),
    "switch-4-copy": lambda: switch(4, copy=True),
}


@pytest.mark.parametrize("epoch", ["fast", "slow"])
@pytest.mark.parametrize("collective", ["allgather", "alltoall"])
@pytest.mark.parametrize("key", sorted(BASELINE_TOPOS))
def test_baselines_verify(key, collective, epoch):
    topo = BASELINE_TOPOS[key]()
    demand = make_demand(topo, collective, 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    fn = ring_allgather if collective == "allgather" else direct_alltoall
    sends = fn(topo, demand, timing)
    name, same = baseline_sends(topo, demand, timing)
    assert name == ("ring" if collective == "allgather" else "direct")
    assert same == sends
    sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, sends))
    assert sim.valid, sim.first_violation
    # a feasible schedule can beat no sound bound
    assert sim.epochs >= max(epoch_lower_bound(topo, demand, timing).values())
    assert sim.finish_time_s >= lower_bounds(topo, demand).best_s * (1 - 1e-9)


def test_baseline_with_two_chunks():
    topo = dgx1()
    demand = make_demand(topo, "allgather", 10**6, chunks=2)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    sends = ring_allgather(topo, demand, timing)
    assert {c for *_, c in sends} == {0, 1}
    assert simulate(Schedule.from_tuples(topo, demand, timing.tau, sends)).valid


# --------------------------------------------------------------------------------- prune


@pytest.mark.parametrize(
    "base,extra",
    [
        (RING_RELAY, (3, (0, 1), 0, 0)),  # GPU 0 sends its chunk to GPU 1 again, later
        (RING_ALL_NEIGHBOURS, (1, (1, 2), 0, 0)),  # GPU 1 relays a chunk GPU 2 already has
        (RING_ALL_NEIGHBOURS, (2, (2, 1), 2, 0)),
    ],
)
def test_prune_removes_a_redundant_send(base, extra):
    topo = ring(3)
    orig = make(topo, base)
    dup = make(topo, base + [extra])
    before = simulate(dup)
    assert before.valid
    pruned = prune_redundant(dup)
    after = simulate(pruned)
    assert after.valid
    assert after.epochs == before.epochs == simulate(orig).epochs
    assert after.finish_time_s == before.finish_time_s
    assert sorted(pruned.sends, key=lambda s: (s.epoch, s.link, s.source)) == sorted(
        orig.sends, key=lambda s: (s.epoch, s.link, s.source)
    )
    assert len(pruned.sends) == len(dup.sends) - 1


def test_prune_keeps_what_is_needed():
    for topo, sends in [(ring(3), RING_RELAY), (switch(3, copy=True), COPY_ALLGATHER), (switch(3), NOCOPY_ALLGATHER)]:
        s = make(topo, sends)
        p = prune_redundant(s)
        assert p.sends == s.sends
        assert p.meta == s.meta and p.tau == s.tau


def test_prune_removes_a_late_switch_delivery():
    # GPU 2 also sends its chunk in epoch 0 and the switch forwards it to GPU 0 in epoch 1, so the
    # epoch-3 delivery of that chunk to GPU 0 is redundant (the one to GPU 1 is not)
    sends = COPY_ALLGATHER + [(0, (2, SW), 2, 0), (1, (SW, 0), 2, 0)]
    s = make(switch(3, copy=True), sends)
    sim = simulate(s)
    assert sim.valid, sim.violations
    assert sim.holds[(2, 0, 0)] == 1 and sim.epochs == 3
    p = prune_redundant(s)
    ps = simulate(p)
    assert ps.valid and ps.epochs == sim.epochs and ps.holds == sim.holds
    li = switch(3).link_index
    assert set(s.sends) - set(p.sends) == {Send(3, li[(SW, 0)], 2, 0)}


def test_prune_keeps_both_copies_into_a_nocopy_switch():
    sends = [(0, (g, SW), g, 0) for g in range(3) for _ in range(2)]
    sends += [(1, (SW, d), s, 0) for s in range(3) for d in range(3) if d != s]
    s = make(switch(3, copy=False), sends, tau=4e-5)
    p = prune_redundant(s)
    assert simulate(p).valid
    assert len(p.sends) == len(s.sends) == 12


def test_prune_drops_an_exact_duplicate():
    # tau 40 us: links carry two chunks per epoch, so a duplicated send is valid but serves nothing
    sends = RING_ALL_NEIGHBOURS + [RING_ALL_NEIGHBOURS[0]]
    s = make(ring(3), sends, tau=4e-5)
    assert simulate(s).valid
    p = prune_redundant(s)
    assert len(p.sends) == len(RING_ALL_NEIGHBOURS)


def test_prune_leaves_an_invalid_schedule_alone():
    s = make(ring(3), RING_RELAY[:-1] + [(0, (1, 2), 0, 0)])
    assert not simulate(s).valid
    assert prune_redundant(s) is s


def test_prune_a_loose_milp_solution():
    topo = ring(4, bidirectional=False)
    demand = make_demand(topo, "alltoall", 4 * 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    model, idx = build_model(topo, demand, timing, 9)
    res = solve(model, SolveOptions(first_feasible=True))
    s = Schedule.from_tuples(topo, demand, timing.tau, sends_from_solution(idx, demand, res.x))
    sim = simulate(s)
    assert sim.valid
    p = prune_redundant(s)
    ps = simulate(p)
    assert ps.valid and ps.epochs == sim.epochs
    assert set(p.sends) <= set(s.sends)
    assert prune_redundant(p).sends == p.sends  # idempotent
    # after pruning, every send is needed: dropping any one breaks the schedule
    for i in range(len(p.sends)):
        rest = p.sends[:i] + p.sends[i + 1 :]
        tuples = [(x.epoch, x.link, x.source, x.chunk) for x in rest]
        assert not simulate(Schedule.from_tuples(topo, demand, timing.tau, tuples)).valid


# --------------------------------------------------------------------------------- JSON


def test_schedule_round_trip(tmp_path):
    s = make(switch(3, copy=True), COPY_ALLGATHER)
    s.meta["method"] = "hand"
    p = tmp_path / "deep" / "dir" / "s.json"
    s.save(p)
    assert not list(p.parent.glob("*.tmp"))
    back = load_schedule(p)
    assert back.to_dict() == s.to_dict()
    assert back.topology == s.topology
    assert back.sends == s.sends and all(isinstance(x, Send) for x in back.sends)
    assert back.meta == {"method": "hand"}
    assert (back.collective, back.size_bytes, back.chunks, back.tau) == (s.collective, s.size_bytes, s.chunks, s.tau)
    a, b = simulate(s), simulate(back)
    assert (a.valid, a.epochs, a.finish_time_s) == (b.valid, b.epochs, b.finish_time_s)


def test_schedule_round_trip_compat_topology(tmp_path):
    topo = ndv2(2, teccl_compat=True)
    demand = make_demand(topo, "allgather", 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "slow")
    s = Schedule.from_tuples(topo, demand, timing.tau, ring_allgather(topo, demand, timing))
    s.save(tmp_path / "s.json")
    back = load_schedule(tmp_path / "s.json")
    assert back.topology.nominal_gpus == 16
    assert back.demand.chunk_bytes == demand.chunk_bytes
    assert simulate(back).epochs == simulate(s).epochs


def _sched_dict() -> dict:
    return json.loads(json.dumps(make(ring(3), RING_ALL_NEIGHBOURS).to_dict()))


def _with(key, value):
    d = _sched_dict()
    d[key] = value
    return d


def _without(key):
    d = _sched_dict()
    del d[key]
    return d


@pytest.mark.parametrize(
    "data,field",
    [
        ([1, 2], "schedule"),
        ("s", "schedule"),
        (_with("schema", "flowride.schedule/0"), "schema"),
        (_without("schema"), "schema"),
        (_without("sends"), "sends"),
        (_without("topology"), "topology"),
        (_without("epoch_duration_s"), "epoch_duration_s"),
        (_with("sends", [[0, 0, 0]]), "sends[0]"),
        (_with("sends", [[0, 0, 0, 0], [0, 0, 0, "0"]]), "sends[1]"),
        (_with("sends", [[0, 0, 0, 0.0]]), "sends[0]"),
        (_with("sends", [[0, 0, 0, True]]), "sends[0]"),
        (_with("sends", [[0, 0, 0, 0, 2]]), "sends[0][4]"),
        (_with("sends", [[0, 0, 0, 0, 0, 0]]), "sends[0]"),
        (_with("sends", [{"epoch": 0}]), "sends[0]"),
        (_with("epoch_duration_s", 0), "epoch_duration_s"),
        (_with("epoch_duration_s", "fast"), "epoch_duration_s"),
        (_with("collective", "reduce"), "collective"),
        (_with("topology", []), "topology"),
        (_with("topology", {"nodes": [{"id": 0}], "links": []}), "nodes"),
    ],
)
def test_malformed_schedule_dict(data, field):
    with pytest.raises(InputError) as ei:
        Schedule.from_dict(data)
    assert ei.value.field == field


@pytest.mark.parametrize("text", ["", "not json", "{", '{"schema": "flowride.schedule/1",'])
def test_malformed_schedule_file(tmp_path, text):
    p = tmp_path / "s.json"
    p.write_text(text)
    with pytest.raises(InputError) as ei:
        load_schedule(p)
    assert ei.value.field == "schedule"
    assert "not valid JSON" in ei.value.problem


def test_missing_schedule_file(tmp_path):
    with pytest.raises(InputError) as ei:
        load_schedule(tmp_path / "none.json")
    assert ei.value.field == "schedule"


def test_schedule_with_bad_chunks_is_refused_on_load():
    with pytest.raises(InputError) as ei:
        Schedule.from_dict(_with("chunks", 0))
    assert ei.value.field == "chunks"


@pytest.mark.parametrize("key,value", [("sends", 5), ("size_bytes", "1MB"), ("chunks", "two")])
def test_malformed_schedule_types_raise_input_error(key, value):
    with pytest.raises(InputError):
        Schedule.from_dict(_with(key, value))


def test_a_chunk_circling_between_cut_through_switches_is_no_copy():
    """Two switches that cannot copy, joined both ways with hops of no epoch (cut-through): a flow
    model may send a chunk S3 -> S4 -> S3 in one epoch beside S3 -> GPU 1. The replay hands S3's one
    arrival to its first send out (to GPU 1), and the cycle then starves; dropping the cycle, which
    carries nothing, leaves a valid schedule (this reached the A* windows on MI250 x 2 at 16 chunks)."""
    sw = {"kind": "switch", "copy": False}
    topo = Topology("loop", (Node(0), Node(1), Node(2), Node(3, **sw), Node(4, **sw)),
                    tuple(Link(a, b, 50.0) for a, b in [(0, 3), (3, 1), (3, 4), (4, 3), (4, 2), (1, 0), (2, 0)]))
    assert topo.switching == "cut-through"
    demand = make_demand(topo, "allgather", 3 * 10**6)
    tau = epoch_timing(topo, demand.chunk_bytes, "fast").tau
    li = topo.link_index
    t = epoch_timing(topo, demand.chunk_bytes, "fast").arrival(li[(0, 3)], 0)
    assert epoch_timing(topo, demand.chunk_bytes, "fast").arrival(li[(3, 4)], t) == t  # the hop takes no epoch
    sends = [(0, li[(0, 3)], 0, 0), (t, li[(3, 4)], 0, 0), (t, li[(4, 3)], 0, 0), (t, li[(3, 1)], 0, 0)]
    sched = Schedule.from_tuples(topo, demand, tau, sends)
    assert any("cannot copy" in v for v in simulate(sched).violations)
    fixed = drop_switch_cycles(sched)
    assert sorted((s.epoch, s.link) for s in fixed.sends) == [(0, li[(0, 3)]), (t, li[(3, 1)])]
    assert all(v.startswith("demand not met") for v in simulate(fixed).violations)
