"""Lowering folds switch hops into GPU-to-GPU transfers. Cut-through hops between switches take no
epoch, so a chunk can cross several switches in one epoch; they must be followed in path order,
not link order (mi250 x2 AlltoAll 1 GB was refused: "switch 33 forwards (31, 0) that never
reaches it in epoch 1")."""

from __future__ import annotations

from flowride.collectives.demand import Collective
from flowride.program.lower import transfers
from flowride.schedule.ir import Schedule, Send
from flowride.topology.builtins import build_topology


def _link(topo, a: int, b: int) -> int:
    return next(i for i, lk in enumerate(topo.links) if (lk.src, lk.dst) == (a, b))


def test_a_chunk_crossing_switches_in_one_epoch_is_one_transfer():
    topo = build_topology("mi250", chassis=2)
    path = [(31, 48), (48, 32), (32, 33), (33, 0)]  # GPU 31 -> three switches -> GPU 0
    ids = [_link(topo, a, b) for a, b in path]
    assert ids != sorted(ids)  # link order is not path order
    sends = [Send(0, ids[0], 31, 0)] + [Send(1, i, 31, 0) for i in ids[1:]]
    sched = Schedule(topo, Collective.ALLTOALL, 10**9, 1, 0.00015625, sends)
    timing = sched.timing
    assert [timing.arrival(i, 1) for i in ids[1:3]] == [1, 1]  # switch to switch: no epoch
    (t,) = transfers(sched)
    assert (t.src, t.dst, t.key, t.send_epoch, t.links) == (31, 0, (31, 0), 0, tuple(ids))
