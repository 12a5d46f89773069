"""Property tests on random small topologies: synthesis is verified, bounded and no worse than
the baseline, the bounds are sound, and the simulator catches broken schedules.

Random topologies: 3-5 GPUs on a directed ring (so every GPU reaches every other) plus random
extra directed links, each 12.5 / 25 / 50 GB/s with alpha 0 or 0.7 us; optionally one switch
(copy-capable or not) joined both ways to some GPUs, and optionally two locality groups so the
cut bounds come into play. Each switch link draws its own bandwidth, so a switch -> GPU link may
be slower than the link feeding the switch (its own beta epochs then count).
The default ``ci`` Hypothesis profile is derandomized; HYPOTHESIS_PROFILE=explore draws afresh.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from flowride.api import synthesize
from flowride.collectives import make_demand
from flowride.schedule import Schedule, simulate
from flowride.synth.bounds import epoch_lower_bound, lower_bounds
from flowride.synth.highs import SolveOptions, solve
from flowride.synth.milp import build_model
from flowride.synth.rows import Infeasible
from flowride.topology import Link, Node, Topology
from flowride.topology.timing import epoch_timing

BANDWIDTHS = (12.5, 25.0, 50.0)
ALPHAS = (0.0, 0.7e-6)
TIME_LIMIT = 20


@dataclass(frozen=True)
class Instance:
    topo: Topology
    collective: str
    chunks: int
    size: int
    epoch: str


@st.composite
def topologies(draw, min_gpus: int = 3, max_gpus: int = 5) -> Topology:
    n = draw(st.integers(min_gpus, max_gpus))
    bw = st.sampled_from(BANDWIDTHS)
    alpha = st.sampled_from(ALPHAS)
    pairs = {(i, (i + 1) % n) for i in range(n)}
    others = sorted((i, j) for i in range(n) for j in range(n) if i != j and (i, j) not in pairs)
    pairs |= set(draw(st.lists(st.sampled_from(others), unique=True, max_size=len(others))))
    links = [Link(i, j, draw(bw), draw(alpha)) for i, j in sorted(pairs)]
    if draw(st.booleans()):
        groups = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    else:
        groups = [None] * n
    nodes = [Node(i, group=groups[i]) for i in range(n)]
    if draw(st.booleans()):
        sw = n
        nodes.append(Node(sw, "switch", copy=draw(st.booleans())))
        members = draw(st.lists(st.integers(0, n - 1), unique=True, min_size=2, max_size=n))
        for g in sorted(members):
            links.append(Link(g, sw, draw(bw), draw(alpha)))
            links.append(Link(sw, g, draw(bw), draw(alpha)))
    return Topology("random", tuple(nodes), tuple(links))


@st.composite
def instances(draw, collective: str | None = None) -> Instance:
    collective = collective or draw(st.sampled_from(["allgather", "alltoall"]))
    # AlltoAll has (GPUs - 1) x more commodities: keep it smaller so every example stays quick
    topo = draw(topologies(max_gpus=5 if collective == "allgather" else 4))
    chunks = draw(st.sampled_from([1, 2])) if collective == "allgather" or len(topo.gpus) == 3 else 1
    size = draw(st.sampled_from([10**5, 10**6, 10**8]))
    epoch = draw(st.sampled_from(["fast", "slow"]))
    return Instance(topo, collective, chunks, size, epoch)


def sound_epoch_bound(bounds: dict[str, int], collective: str) -> int:
    """The epoch bounds these tests hold the code to: all of them (latency, ingress, cut)."""
    return max(bounds.values())


def _describe(inst: Instance) -> None:
    topo = inst.topo
    sw = [topo.nodes[w] for w in topo.switches]
    event(f"{len(topo.gpus)} GPUs")
    event("copy switch" if sw and sw[0].copy else "plain switch" if sw else "no switch")
    event("groups" if topo.groups else "no groups")
    event(f"epoch {inst.epoch}, chunks {inst.chunks}")


def _check_synthesis(inst: Instance):
    _describe(inst)
    out = synthesize(inst.topo, inst.collective, inst.size, inst.epoch, chunks=inst.chunks, time_limit=TIME_LIMIT)
    r = out.report()
    sched = out.schedule
    # verified by an independent replay
    sim = simulate(sched)
    assert sim.valid, sim.first_violation
    assert r["verified"] is True
    assert sim.epochs == r["epochs"] == out.sim.epochs
    assert r["finish_time_us"] == pytest.approx(sim.epochs * sim.tau * 1e6)
    # never below the physical floor, never above the baseline
    assert r["finish_time_us"] >= r["lower_bound_us"] * (1 - 1e-9), r
    assert r["finish_time_us"] <= r["baseline_us"] * (1 + 1e-9), r
    assert r["speedup_vs_baseline"] >= 1 - 1e-9
    # the epoch bounds hold for the result and for the (independent) baseline
    timing = epoch_timing(inst.topo, out.demand.chunk_bytes, inst.epoch)
    bounds = epoch_lower_bound(inst.topo, out.demand, timing)
    assert bounds == out.epoch_bounds
    eb = sound_epoch_bound(bounds, inst.collective)
    assert sim.epochs >= eb
    assert out.baseline.epochs >= eb
    assert r["status"] in ("optimal", "feasible", "timeout")
    event(f"status {r['status']}, method {r['method']}")
    assert r["epoch_gap"] == r["epochs"] - r["epoch_lower_bound"]
    if r["status"] == "optimal":
        # proven minimal: the search closed at the schedule's epochs
        assert r["epochs"] == r["epoch_lower_bound"] and r["proven_minimal_epochs"]
    # the schedule survives its own file format
    back = Schedule.from_dict(sched.to_dict())
    assert simulate(back).epochs == sim.epochs
    return out, sim


def _gpu_sends(sched: Schedule):
    topo = sched.topology
    return [s for s in sched.sends if topo.nodes[topo.links[s.link].src].is_gpu]


def _mutations(out, sim, data):
    sched: Schedule = out.schedule
    topo = sched.topology
    timing = sched.timing
    everything = 10**6

    def replay(sends) -> list[str]:
        mutated = Schedule(topo, sched.collective, sched.size_bytes, sched.chunks, sched.tau, sends)
        res = simulate(mutated, max_violations=everything)
        assert not res.valid
        return res.violations

    # 1. a destination loses every send that brings it a chunk it needs
    q = data.draw(st.sampled_from(out.demand.commodities), label="commodity")
    d = data.draw(st.sampled_from(q.dests), label="destination")
    kept = [s for s in sched.sends if not ((s.source, s.chunk) == (q.source, q.chunk) and topo.links[s.link].dst == d)]
    assert len(kept) < len(sched.sends)
    assert f"demand not met: GPU {d} never receives chunk {q.chunk} of GPU {q.source}" in replay(kept)

    # 2. a relay sends a chunk one epoch before it holds it
    relays = [s for s in _gpu_sends(sched) if topo.links[s.link].src != s.source]
    event("relayed sends" if relays else "no relays")
    if relays:
        s = data.draw(st.sampled_from(relays), label="relay send")
        u = topo.links[s.link].src
        h = sim.holds[(s.source, s.chunk, u)]
        assert 1 <= h <= s.epoch
        moved = [x if x is not s else type(s)(h - 1, s.link, s.source, s.chunk) for x in sched.sends]
        msg = f"{h - 1}, link {s.link}, source {s.source}, chunk {s.chunk}): GPU {u} sends chunk ({s.source},{s.chunk}) it holds"
        assert any(msg in v for v in replay(moved))

    # 3. one send is repeated until its link overflows
    s = data.draw(st.sampled_from(_gpu_sends(sched)), label="send to repeat")
    lk = topo.links[s.link]
    extra = [s] * int(timing.window_cap[s.link])
    assert any(v.startswith(f"link {s.link} ({lk.src}->{lk.dst}) carries") for v in replay(list(sched.sends) + extra))


@given(inst=instances(collective="allgather"), data=st.data())
def test_allgather_synthesis_properties(inst, data):
    out, sim = _check_synthesis(inst)
    _mutations(out, sim, data)


@given(inst=instances(collective="alltoall"), data=st.data())
def test_alltoall_synthesis_properties(inst, data):
    out, sim = _check_synthesis(inst)
    _mutations(out, sim, data)


@given(inst=instances())
def test_no_schedule_beats_the_epoch_lower_bound(inst):
    """The probe one epoch below the bound has no feasible point (a sound bound)."""
    demand = make_demand(inst.topo, inst.collective, inst.size, inst.chunks)
    timing = epoch_timing(inst.topo, demand.chunk_bytes, inst.epoch)
    lb = sound_epoch_bound(epoch_lower_bound(inst.topo, demand, timing), inst.collective)
    assert lb >= 1
    try:
        model, _ = build_model(inst.topo, demand, timing, lb - 1)
    except Infeasible:
        return
    res = solve(model, SolveOptions(first_feasible=True, time_limit=10))
    assert res.x is None, f"a schedule in {lb - 1} epochs exists below the bound {lb}"


@given(topo=topologies(), collective=st.sampled_from(["allgather", "alltoall"]), size=st.sampled_from([10**5, 10**8]))
def test_lower_bounds_are_positive_and_consistent(topo, collective, size):
    demand = make_demand(topo, collective, size)
    b = lower_bounds(topo, demand)
    assert b.ingress_s > 0 and b.cut_s >= 0 and b.latency_s >= 0
    assert b.best_s == max(b.ingress_s, b.cut_s, b.latency_s, b.forest_s, b.flow_s)
    assert b.binding in ("ingress", "cut", "latency", "forest", "flow")
    # ForestColl's cut (AllGather) and the concurrent flow (AlltoAll) are at least every cut
    # bound, the single GPU's (ingress) and the chassis' included
    if demand.collective.multicast:
        assert b.forest_s >= max(b.ingress_s, b.cut_s) * (1 - 1e-6) and b.flow_s == 0
    else:
        assert b.flow_s >= max(b.ingress_s, b.cut_s) * (1 - 1e-4) and b.forest_s == 0
    # ingress: the neediest GPU over the sum of its in-link bandwidths
    needs = demand.needs()
    expect = max(needs[g] * demand.chunk_bytes / sum(topo.links[i].bytes_per_s for i in topo.in_links(g)) for g in needs)
    assert b.ingress_s == pytest.approx(expect)
    # twice the bytes, twice the bandwidth-bound time
    b2 = lower_bounds(topo, make_demand(topo, collective, 2 * size))
    assert b2.ingress_s == pytest.approx(2 * b.ingress_s)
    assert b2.latency_s == pytest.approx(b.latency_s)


def test_switch_hop_slower_than_its_feed_respects_the_lower_bound():
    nodes = (Node(0), Node(1), Node(2, "switch", copy=True))
    links = (Link(0, 2, 50.0), Link(2, 1, 12.5), Link(1, 2, 50.0), Link(2, 0, 12.5))
    topo = Topology("asymmetric-switch", nodes, links)
    out = synthesize(topo, "allgather", 10**6, "fast", time_limit=TIME_LIMIT)
    r = out.report()
    # each GPU must take in 500 KB through a 12.5 GB/s link: 40 us at the very least
    assert r["lower_bound_us"] == pytest.approx(40.0)
    assert r["finish_time_us"] >= r["lower_bound_us"] * (1 - 1e-9)


def _full3_two_groups() -> Topology:
    nodes = tuple(Node(i, group=g) for i, g in enumerate([0, 1, 1]))
    links = tuple(Link(i, j, 50.0) for i in range(3) for j in range(3) if i != j)
    return Topology("full3-two-groups", nodes, links)


def test_allgather_cut_bound_allows_several_entry_links():
    topo = _full3_two_groups()
    demand = make_demand(topo, "allgather", 3 * 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    # every GPU sends its chunk straight to both others in epoch 0: done after one epoch
    direct = [(0, topo.link_index[(s, d)], s, 0) for s in range(3) for d in range(3) if d != s]
    sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, direct))
    assert sim.valid and sim.epochs == 1
    out = synthesize(topo, "allgather", 3 * 10**6, "fast", time_limit=TIME_LIMIT)
    assert out.status == "optimal"
    assert out.sim.epochs == 1
    assert max(epoch_lower_bound(topo, demand, timing).values()) <= 1
