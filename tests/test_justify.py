"""The forward-backward pass over an AllGather's trees (flowride.synth.justify): whatever it is
given, what it returns replays as a valid AllGather of the same demand over the same trees, and the
tree method keeps it only where it finishes sooner."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.test_reductions import topologies

from flowride.api import synthesize
from flowride.collectives import make_demand
from flowride.schedule import Schedule, simulate
from flowride.schedule.prune import prune_redundant
from flowride.synth.greedy import baseline_sends
from flowride.synth.justify import justified_allgather
from flowride.synth.trees import packed_sends
from flowride.topology.builtins import mi250
from flowride.topology.timing import epoch_timing


def _allgather(topo, chunks: int, size: int, epoch: str, packed: bool) -> Schedule:
    demand = make_demand(topo, "allgather", size, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    sends = packed_sends(topo, demand, timing, 10.0) if packed else None
    if sends is None:
        sends = baseline_sends(topo, demand, timing)[1]
    return Schedule.from_tuples(topo, demand, timing.tau, sends)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies(), st.sampled_from([1, 2, 3]), st.sampled_from([10**5, 10**6, 10**8]), st.sampled_from(["fast", "slow"]),
       st.booleans())
def test_the_pass_gives_a_valid_allgather_on_the_same_trees(topo, chunks, size, epoch, packed):
    ag = _allgather(topo, chunks, size, epoch, packed)
    got = justified_allgather(ag)
    out = Schedule.from_tuples(topo, ag.demand, ag.tau, got)
    sim = simulate(out)
    assert sim.valid, sim.first_violation  # every demand met, no chunk sent before it is held, capacities kept
    # the same trees: every (link, source, chunk) it uses, the pruned original used too
    used = {(s.link, s.source, s.chunk) for s in prune_redundant(ag).sends}
    assert {(li, s, c) for _, li, s, c in got} <= used


def test_a_deadline_already_past_gives_nothing():
    ag = _allgather(mi250(2), 2, 10**6, "fast", packed=False)
    assert justified_allgather(ag, deadline=0.0) is None


def test_mi250_1mb_allgather_takes_the_justified_trees():
    """MI250 x 2, 1 MB, 4 chunks: the packed trees' forward list schedule takes 314 epochs, the same
    trees placed backwards then forwards 300 (1.357 -> 1.297 the bound)."""
    out = synthesize(mi250(2), "allgather", 10**6, "fast", 4, None, method="trees", nccl=False)  # untimed: every shape runs
    probes = {p.outcome: p.T for p in out.search.probes}
    assert probes["trees justified"] < probes["trees packed-serial/0.0"]
    assert out.sim.epochs == probes["trees justified"] == 300
