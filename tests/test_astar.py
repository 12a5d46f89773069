"""Round-by-round (A*) AllGather: windows of epochs solved one after another, stitched into one
schedule. The simulator is the judge: every stitched schedule here is replayed and checked.

Measured before the bounds below were set (default call: the portfolio of window
configurations, receding commit of one epoch): on every small preset checked (dgx1, torus 4x4,
ring 6, mesh 3x3, switch 6 with and without copies, ndv2 2 chassis; 1 MB and 1 GB; fast and slow
epochs) the stitched schedule needs as many epochs as the full MILP's minimum, except dgx1 1 GB
fast (4 against 3). On 200 random small topologies (the strategy of test_properties, its
derandomized draws) the mean ratio to the full MILP was 1.025, the worst 1.5, never more than 3
epochs over. Hence the bound asserted: at most 1.5 x the full MILP's epochs, or one epoch over on
the tiniest horizons (where one epoch is already a ratio of 1.33 or 2).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from flowride.api import synthesize
from flowride.collectives import make_demand
from flowride.schedule import Schedule, simulate
from flowride.synth.astar import synthesize_astar
from flowride.synth.astar_state import NEVER, State, greedy_complete, virtual_links
from flowride.synth.bounds import epoch_lower_bound
from flowride.synth.greedy import ring_allgather
from flowride.topology import Link, Node, Topology, dgx1, dgx2, mesh, ndv2, ring, switch, torus
from flowride.topology.timing import epoch_timing
from test_properties import topologies

FACTOR = 1.5  # stitched epochs <= FACTOR x full-MILP epochs (+1 on tiny horizons), see above


def _run(topo, size, epoch="fast", chunks=1, **kw):
    demand = make_demand(topo, "allgather", size, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    res = synthesize_astar(topo, demand, timing, **kw)
    sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, res.sends))
    return demand, timing, res, sim


def _check(topo, demand, timing, res, sim):
    assert sim.valid, sim.first_violation
    assert res.T == sim.epochs
    assert res.lower == max(epoch_lower_bound(topo, demand, timing).values())
    assert res.T >= res.lower
    assert all(isinstance(v, int) for s in res.sends for v in s)


def test_rejects_alltoall():
    topo = dgx1()
    demand = make_demand(topo, "alltoall", 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    with pytest.raises(ValueError, match="AllGather"):
        synthesize_astar(topo, demand, timing)


def test_rejects_bad_window_and_commit():
    topo = ring(4)
    demand = make_demand(topo, "allgather", 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    with pytest.raises(ValueError):
        synthesize_astar(topo, demand, timing, window=0)
    with pytest.raises(ValueError):
        synthesize_astar(topo, demand, timing, window=2, commit=3)


PRESETS = [
    ("dgx1", dgx1()),
    ("ndv2-2", ndv2(2)),
    ("ndv2-3", ndv2(3)),  # copy-capable NIC switch, slow IB links (beta > 0)
    ("dgx2-1", dgx2(1)),  # NVSwitch that cannot copy
    ("switch-chain", None),  # chains of copy switches: NIC -> global -> NIC (as in mi250 x 2)
    ("torus-4x4", torus(4, 4)),
    ("switch-6-copy", switch(6, copy=True)),
]


def _switch_chain() -> Topology:
    """Two pairs of GPUs, each pair on a NIC switch, the NICs joined through a global switch (all
    copy-capable); slow NIC links, fast links within a pair."""
    nodes = tuple(Node(i, group=i // 2) for i in range(4)) + (
        Node(4, "switch", copy=True), Node(5, "switch", copy=True), Node(6, "switch", copy=True))
    links = [Link(0, 1, 50.0, 7e-7), Link(1, 0, 50.0, 7e-7), Link(2, 3, 50.0, 7e-7), Link(3, 2, 50.0, 7e-7)]
    for g, nic in [(0, 4), (1, 4), (2, 5), (3, 5)]:
        links += [Link(g, nic, 25.0, 1.3e-6), Link(nic, g, 25.0, 1.3e-6)]
    links += [Link(4, 6, 25.0, 1.3e-6), Link(6, 4, 25.0, 1.3e-6), Link(5, 6, 25.0, 1.3e-6), Link(6, 5, 25.0, 1.3e-6)]
    return Topology("switch-chain", nodes, tuple(links))


@pytest.mark.parametrize("name,topo", PRESETS, ids=[p[0] for p in PRESETS])
@pytest.mark.parametrize("size", [10**6, 10**9])
def test_presets_verify_and_beat_the_ring(name, topo, size):
    topo = topo or _switch_chain()
    demand, timing, res, sim = _run(topo, size)
    _check(topo, demand, timing, res, sim)
    ring_epochs = simulate(Schedule.from_tuples(topo, demand, timing.tau, ring_allgather(topo, demand, timing))).epochs
    assert res.T <= ring_epochs
    assert not res.timed_out
    assert all(p.outcome != "greedy" for p in res.probes)  # the windows alone finished it


@pytest.mark.parametrize("window,commit", [(1, 1), (2, 1), (3, 1), (3, 3)])
def test_state_carries_in_flight_chunks_and_busy_links(window, commit):
    """dgx2 x 2 at 1 MB: IB hops take 21 epochs and keep their link busy 9 more, so chunks are in
    flight and capacity windows straddle every window boundary; the stitch still verifies."""
    topo = dgx2(2)
    demand, timing, res, sim = _run(topo, 10**6, window=window, commit=commit)
    _check(topo, demand, timing, res, sim)
    slow = [li for li in range(len(topo.links)) if timing.beta_epochs[li] > 0]
    used_slow = [s for s in res.sends if s[1] in slow]
    assert used_slow, "the cut links were never used"
    # chunks sent in one window arrive windows later
    assert any(timing.arrival(s[1], s[0]) > s[0] + window for s in used_slow)
    assert res.T >= res.lower


def test_progress_reports_every_window():
    topo = ndv2(2)
    events: list[dict] = []
    demand, timing, res, sim = _run(topo, 10**6, "slow", progress=events.append)
    _check(topo, demand, timing, res, sim)
    assert len(events) == sum(1 for p in res.probes if p.outcome != "greedy")
    assert [e["window"] for e in events] == list(range(len(events)))
    for e in events:
        assert e["stage"] == "window"
        assert {"start_epoch", "delivered", "needed", "elapsed", "try"} <= set(e)
        assert e["needed"] == demand.num_deliveries
    for t in {e["try"] for e in events}:
        run = [e for e in events if e["try"] == t]
        assert [e["delivered"] for e in run] == sorted(e["delivered"] for e in run)
        assert [e["start_epoch"] for e in run] == sorted(e["start_epoch"] for e in run)
    assert events[0]["try"] == 0 and events[-1]["delivered"] <= demand.num_deliveries


def test_time_limit_still_returns_a_complete_verified_schedule():
    # a limit no machine can meet (untimed the search takes seconds): the outcome does not depend
    # on how fast the machine is
    topo = torus(12, 12)
    demand, timing, res, sim = _run(topo, 10**9, time_limit=1e-9)
    _check(topo, demand, timing, res, sim)
    assert res.timed_out
    assert res.probes[-1].outcome == "greedy"  # the greedy completion finished it


def test_windows_that_need_not_finish_stop_at_the_limit():
    """Where the caller holds another schedule, the windows stop at the limit, completion included
    (on 1024 GPUs the greedy completion alone ran for over half an hour past a 30-minute limit)."""
    topo = torus(12, 12)
    demand = make_demand(topo, "allgather", 10**9)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    res = synthesize_astar(topo, demand, timing, time_limit=1e-9, must_finish=False)
    assert res.sends is None and res.timed_out
    out = synthesize(topo, "allgather", 10**9, "fast", 1, 1e-3, method="astar", nccl=False)
    assert out.sim.valid and out.schedule.meta["method"] != "astar"  # the incumbent stood in


def test_committed_state_refuses_invalid_sends():
    """Correctness by construction: the state a window commits into accepts only sends that the
    simulator would accept."""
    # 0 -> 1 at one chunk per epoch; 1 -> switch 2 (no copy) -> 0 and 3
    nodes = (Node(0), Node(1), Node(2, "switch", copy=False), Node(3))
    links = (Link(0, 1, 50.0), Link(1, 0, 50.0), Link(1, 2, 50.0), Link(2, 0, 50.0), Link(2, 3, 50.0), Link(3, 1, 50.0))
    topo = Topology("tiny", nodes, links)
    demand = make_demand(topo, "allgather", 3 * 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    stt = State(topo, demand, timing)
    q0 = next(i for i, q in enumerate(demand.commodities) if q.source == 0)
    q3 = next(i for i, q in enumerate(demand.commodities) if q.source == 3)
    l01, l12, l20, l23 = (topo.link_index[p] for p in [(0, 1), (1, 2), (2, 0), (2, 3)])
    assert not stt.try_send(0, l12, q0)  # GPU 1 does not hold chunk 0 yet
    assert stt.try_send(0, l01, q0)
    assert not stt.try_send(0, l01, q0)  # link 0 -> 1 already carries its one chunk in epoch 0
    assert not stt.try_send(1, l01, q3)  # GPU 0 never holds chunk 3 here
    assert stt.hold[q0, 1] == timing.arrival(l01, 0)
    k = int(stt.hold[q0, 1])
    assert stt.try_send(k, l12, q0)
    t = timing.arrival(l12, k)
    assert not stt.try_send(t + 1, l23, q0)  # a switch forwards only in the epoch it arrives
    assert stt.try_send(t, l23, q0)
    assert not stt.try_send(t, l20, q0)  # this switch cannot copy: one arrival, one forward
    assert stt.hold[q0, 3] == timing.arrival(l23, t)
    assert stt.hold[q3, 0] == NEVER
    sends = sorted((k_, li, int(stt.src[q]), demand.commodities[q].chunk) for k_, li, q in stt.sends)
    replay = simulate(Schedule.from_tuples(topo, demand, timing.tau, sends))
    assert replay.violations == [] or all(v.startswith("demand not met") for v in replay.violations)


@settings(max_examples=25)
@given(
    topo=topologies(),
    size=st.sampled_from([10**5, 10**6, 10**8]),
    epoch=st.sampled_from(["fast", "slow"]),
    chunks=st.sampled_from([1, 2]),
    window=st.sampled_from([None, 1, 2, 3]),
)
def test_random_topologies_verify_and_stay_near_the_full_milp(topo, size, epoch, chunks, window):
    demand, timing, res, sim = _run(topo, size, epoch, chunks, window=window)
    _check(topo, demand, timing, res, sim)
    full = synthesize(topo, "allgather", size, epoch, chunks=chunks, time_limit=20)
    ratio = res.T / full.sim.epochs
    event(f"ratio to full MILP {'=1' if ratio == 1 else '<=1.25' if ratio <= 1.25 else '>1.25'}")
    assert res.T <= max(FACTOR * full.sim.epochs, full.sim.epochs + 1), (res.T, full.sim.epochs, full.status)


SMALL = [
    (dgx1(), 10**6, "fast"), (dgx1(), 10**9, "fast"), (dgx1(), 10**9, "slow"),
    (torus(4, 4), 10**6, "fast"), (torus(4, 4), 10**9, "fast"),
    (ring(6), 10**6, "fast"), (mesh(3, 3), 10**9, "fast"),
    (switch(6, copy=True), 10**9, "fast"), (switch(6), 10**6, "slow"),
    (ndv2(2), 10**6, "fast"), (ndv2(2), 10**9, "slow"),
]


def test_small_presets_within_factor_of_the_full_milp():
    total_a = total_m = 0
    for topo, size, epoch in SMALL:
        demand, timing, res, sim = _run(topo, size, epoch)
        _check(topo, demand, timing, res, sim)
        full = synthesize(topo, "allgather", size, epoch, time_limit=20)
        assert res.T <= max(FACTOR * full.sim.epochs, full.sim.epochs + 1), (topo.name, size, epoch, res.T, full.sim.epochs)
        total_a += res.T
        total_m += full.sim.epochs
    # measured: equal on all but dgx1 1 GB fast (one epoch over); allow a little drift
    assert total_a <= 1.1 * total_m, (total_a, total_m)


def test_larger_torus_reaches_its_lower_bound_well_within_the_target():
    """torus 8 x 8, 1 GB: 64 GPUs, far past what the test suite runs the full MILP on. Measured 16
    epochs = the ingress lower bound (ring: 63)."""
    topo = torus(8, 8)
    demand, timing, res, sim = _run(topo, 10**9)
    _check(topo, demand, timing, res, sim)
    assert res.T <= 1.5 * res.lower
    assert np.isfinite(res.solver_seconds)


def test_greedy_completion_waits_for_a_link_still_carrying_a_chunk():
    """A link busy with a long transfer that delivers nothing new (so nothing is in flight) is not
    a dead end: the completion waits for it (it used to give up with an AssertionError, seen on
    MI250 x 2 at 1 GB, where one chunk holds a link for 8 epochs)."""
    topo = Topology("pair", (Node(0), Node(1)), (Link(0, 1, 10.0), Link(1, 0, 80.0)))  # fast epochs: 0 -> 1 takes 8
    demand = make_demand(topo, "allgather", 10**9)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    stt = State(topo, demand, timing)
    l01 = topo.link_index[(0, 1)]
    b = int(stt.beta[l01])
    assert b >= 1
    busy = list(range(0, 6 * (b + int(stt.delay.max()) + 2), b + 1))  # the link is never free before the last of these ends
    stt.ensure(busy[-1] + 1)
    stt.used[l01, busy] = 1
    greedy_complete(stt, virtual_links(topo, stt), 0)
    assert not stt.missing().any()
    q0 = next(i for i, q in enumerate(demand.commodities) if q.source == 0)
    assert stt.hold[q0, 1] > busy[-1] + b
