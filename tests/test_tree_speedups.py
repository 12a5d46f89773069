"""What makes more chunks affordable for the packed trees: the packing taken up again after a
short first try, and the shapes dropped by a sound load bound before they are scheduled."""

from __future__ import annotations

import numpy as np
import pytest

from flowride.collectives.demand import make_demand
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.synth import trees
from flowride.synth.greedy import Outpaced, load_epochs
from flowride.topology.builtins import dgx2, mi250
from flowride.topology.timing import epoch_timing


def test_an_unfinished_packing_is_taken_up_again_with_more_time():
    topo = mi250(2)
    d = make_demand(topo, "allgather", 1 << 30, 8)
    timing = epoch_timing(topo, d.chunk_bytes, "fast")
    trees._PACKINGS.clear()
    first = trees.packing_for(topo, timing, d.chunk_bytes, time_limit=1e-4)  # one LP round at most
    again = trees.packing_for(topo, timing, d.chunk_bytes, time_limit=1e-4 * 1.2)  # not clearly more: kept
    assert again is first
    full = trees.packing_for(topo, timing, d.chunk_bytes, time_limit=60.0)
    assert full.optimal and full.rate_Bps >= first.rate_Bps
    assert first.optimal or full.rate_Bps > first.rate_Bps


@pytest.mark.parametrize("make", [lambda: mi250(1), lambda: dgx2(2)], ids=["mi250", "dgx2x2"])
def test_load_epochs_never_exceeds_a_real_schedule(make):
    """The prune's bound: no tree schedule that puts these loads on the links finishes sooner
    (every send along a tree is a GPU's one delivery of its chunk)."""
    topo = make()
    for size, chunks in ((1 << 20, 1), (64 << 20, 4)):
        d = make_demand(topo, "allgather", size, chunks)
        timing = epoch_timing(topo, d.chunk_bytes, "fast")
        for shape, spread in (("cheapest", 2.0), ("cheapest", 0.1), ("shortest", 0.5)):
            sends = trees.tree_sends(topo, d, timing, spread, shape)
            load = np.bincount([li for _, li, _, _ in sends], minlength=len(topo.links)).astype(float)
            sim = simulate(Schedule.from_tuples(topo, d, timing.tau, sends))
            assert sim.valid
            assert load_epochs(timing, load) <= sim.epochs


def test_shapes_that_cannot_beat_the_best_are_not_scheduled():
    topo = mi250(1)
    d = make_demand(topo, "allgather", 64 << 20, 4)
    timing = epoch_timing(topo, d.chunk_bytes, "fast")
    with pytest.raises(Outpaced):
        trees.tree_sends(topo, d, timing, 0.5, "shortest", beat=1)
    assert trees.tree_sends(topo, d, timing, 0.5, "shortest", beat=10**9)  # a bound far off: scheduled as before
    r = trees.synthesize_trees(topo, d, timing)  # the packed trees first, then what may still win
    assert r.sends and all(p.T >= r.T for p in r.probes)
