"""The LP form for copy-free demands (AlltoAll) and its decomposition into verified sends.

What is held to account here, and why:

- every schedule the LP route returns is replayed by the simulator (the only judge): every demand
  met, nothing sent before it is held, no capacity window exceeded;
- the returned demand moves the same bytes (chunks cut into pieces, never more data) at the
  caller's epoch length;
- the LP is a relaxation: any verified schedule (here the direct AlltoAll) is a feasible point of
  the LP at its epochs, so the LP horizon and ``lower`` never exceed a schedule's epochs;
- against the direct AlltoAll baseline: on these small instances the integral polish runs to its
  end, so the result is the optimum at its granularity and never later than the baseline (it is
  a schedule of the same demand). On the presets it is also proven minimal (epochs == lower).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from flowride.api import synthesize
from flowride.collectives import make_demand
from flowride.schedule import Schedule, simulate
from flowride.synth.flow import round_to_pieces, schedule_paths, unicast_needs
from flowride.synth.greedy import direct_alltoall
from flowride.synth.lp import build_lp, decompose_flow
from flowride.synth.lp_search import LpSearch, min_lp_horizon, synthesize_lp
from flowride.topology import Topology, dgx1, full, mesh, ring, switch
from flowride.topology.timing import epoch_timing
from test_properties import topologies  # tests/ is on sys.path (rootdir conftest, no package)


def _run(topo: Topology, size: int, epoch: str, chunks: int = 1, **kw):
    demand = make_demand(topo, "alltoall", size, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    dem, res = synthesize_lp(topo, demand, timing, **kw)
    sim = simulate(Schedule.from_tuples(topo, dem, timing.tau, res.sends))
    base = simulate(Schedule.from_tuples(topo, demand, timing.tau, direct_alltoall(topo, demand, timing)))
    return demand, timing, dem, res, sim, base


def _check(demand, timing, dem, res: LpSearch, sim, base) -> None:
    assert isinstance(res, LpSearch)
    assert sim.valid, sim.first_violation
    assert sim.epochs == res.T
    assert sim.tau == pytest.approx(timing.tau)  # the caller's epoch length, pieces or not
    # the same collective and bytes; chunks only ever cut into whole pieces
    assert dem.collective is demand.collective and dem.size_bytes == demand.size_bytes
    assert dem.chunks == demand.chunks * res.pieces
    assert dem.chunk_bytes * res.pieces == pytest.approx(demand.chunk_bytes)
    # bounds: the LP horizon and the lower bound never exceed the schedule
    assert res.lower <= res.T
    if res.lp_T is not None:
        assert res.lp_T <= res.T
    # the LP bound is a relaxation of the baseline too (at whole chunks), and the polish is exact
    assert res.T <= base.epochs, (res.T, base.epochs)


PRESETS = [
    pytest.param(ring(4), 10**6, "fast", id="ring4-1MB-fast"),
    pytest.param(ring(6, bidirectional=False), 10**6, "fast", id="uniring6-1MB-fast"),
    pytest.param(switch(4), 10**6, "fast", id="switch4-1MB-fast"),
    pytest.param(switch(5, copy=True), 10**9, "slow", id="copyswitch5-1GB-slow"),
    pytest.param(full(4), 10**6, "fast", id="full4-1MB-fast"),
    pytest.param(mesh(2, 3), 10**6, "fast", id="mesh2x3-1MB-fast"),
    pytest.param(dgx1(), 10**6, "fast", id="dgx1-1MB-fast"),
    pytest.param(dgx1(), 10**9, "slow", id="dgx1-1GB-slow"),
]


@pytest.mark.parametrize(("topo", "size", "epoch"), PRESETS)
def test_lp_schedules_on_presets_verify_and_are_minimal(topo, size, epoch):
    demand, timing, dem, res, sim, base = _run(topo, size, epoch, matched=False)  # the LP itself
    _check(demand, timing, dem, res, sim, base)
    assert res.method == "lp" and res.fallback_chunks == 0
    assert res.proven_minimal, (res.T, res.lower)
    assert res.probes and res.solver_seconds > 0
    demand, timing, dem, full, sim, base = _run(topo, size, epoch)  # the matched rounds first: never later
    _check(demand, timing, dem, full, sim, base)
    assert full.proven_minimal and full.T <= res.T  # epochs of one tau


def test_dgx1_beats_the_direct_alltoall():
    """On the hybrid cube-mesh the direct route misses half the links; the LP relays."""
    demand, timing, dem, res, sim, base = _run(dgx1(), 10**6, "fast")
    assert sim.epochs < base.epochs


@pytest.mark.parametrize("collective", ["allgather", "allreduce", "reducescatter"])
def test_rejects_demands_that_copy_or_reduce(collective):
    topo = ring(4)
    demand = make_demand(topo, collective, 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    with pytest.raises(ValueError, match="copy-free"):
        synthesize_lp(topo, demand, timing)


@pytest.mark.parametrize("topo", [switch(8), dgx1(), mesh(2, 3)], ids=["switch8", "dgx1", "mesh2x3"])
def test_without_polish_never_later_than_the_direct_alltoall(topo):
    """Without the integer polish the result is the best of the LP's paths (whole chunks or cut
    into pieces), the matched rounds and the direct AlltoAll: never later than the direct one,
    bytes and tau kept."""
    demand, timing, dem, res, sim, base = _run(topo, 10**6, "fast", polish_seconds=0)
    _check(demand, timing, dem, res, sim, base)
    assert res.method in ("lp", "matched", "direct")


@pytest.mark.parametrize("k", [1, 2, 4])
def test_paths_carry_chunks_cut_into_pieces(k):
    """The LP's paths carry the demand cut into k pieces per chunk (k pieces per unit of flow):
    every piece arrives, the schedule verifies at the caller's epoch length."""
    topo = dgx1()
    demand = make_demand(topo, "alltoall", 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    hz = min_lp_horizon(topo, demand, timing)
    paths = decompose_flow(topo, timing, hz.idx, hz.x)
    dk = make_demand(topo, "alltoall", 10**6, k)
    tk = epoch_timing(topo, dk.chunk_bytes, timing.tau)
    sends, fallback = schedule_paths(topo, dk, tk, paths, k)
    sim = simulate(Schedule.from_tuples(topo, dk, timing.tau, sends))
    assert sim.valid, sim.first_violation
    assert fallback == 0
    assert sim.tau == pytest.approx(timing.tau)
    got = {(s, c) for _, _, s, c in sends}
    assert len(got) == len(dk.commodities)


def test_time_limit_falls_back_to_a_verified_direct_schedule():
    demand, timing, dem, res, sim, base = _run(dgx1(), 10**6, "fast", time_limit=1e-9)
    assert res.method == "direct" and res.timed_out
    assert dem is demand and sim.valid and sim.epochs == base.epochs


def test_progress_reports_each_lp_probe():
    seen: list[dict] = []
    topo = ring(4)
    demand = make_demand(topo, "alltoall", 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    _, res = synthesize_lp(topo, demand, timing, progress=seen.append)
    lp = [e for e in seen if e["stage"] == "lp"]
    assert lp and all({"T", "elapsed"} <= e.keys() for e in lp)
    assert len(lp) == sum(1 for p in res.probes if not p.outcome.startswith("integral"))


def test_decomposed_paths_carry_every_demand_through_the_time_expanded_graph():
    topo = dgx1()
    demand = make_demand(topo, "alltoall", 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    hz = min_lp_horizon(topo, demand, timing)
    assert hz.T is not None and hz.lower == hz.T
    paths = decompose_flow(topo, timing, hz.idx, hz.x)
    got: dict[tuple[int, int], float] = defaultdict(float)
    for p in paths:
        got[(p.source, p.dest)] += p.amount
        node, t = p.source, 0
        for li, k in p.hops:
            lk = topo.links[li]
            assert lk.src == node
            if topo.nodes[node].is_gpu:
                assert k >= t  # sent only once held (kept in the buffer meanwhile)
            else:
                assert k == t  # a switch forwards in the epoch the chunk arrives
            node, t = lk.dst, timing.arrival(li, k)
        assert node == p.dest and t <= hz.T
    sources, need = unicast_needs(topo, demand)
    for si, g in zip(*np.nonzero(need), strict=True):
        assert got[(int(sources[si]), int(g))] == pytest.approx(float(need[si, g]), abs=1e-6)


def test_round_to_pieces_deals_whole_pieces_close_to_the_flow():
    r = round_to_pieces(np.array([0.5, 1.25, 0.25]), 8)
    assert r.sum() == 8 and list(r) == [2, 5, 1]
    r = round_to_pieces(np.array([0.34, 0.33, 0.33]), 1)
    assert list(r) == [1, 0, 0]
    assert round_to_pieces(np.array([]), 0).size == 0


def _lp_point(topo, demand, timing, sends, T):
    """The LP point of a schedule in which every chunk travels one path: F counts sends, X the
    epochs a chunk waits in a GPU's buffer, Y its arrival at its destination."""
    model, idx = build_lp(topo, demand, timing, T)
    pos = {int(s): i for i, s in enumerate(idx.sources)}
    col_f = {(int(a), int(b), int(c)): j for j, (a, b, c) in enumerate(zip(idx.f_s, idx.f_l, idx.f_k, strict=True))}
    col_x = {(int(a), int(b), int(c)): idx.x0 + j for j, (a, b, c) in enumerate(zip(idx.x_s, idx.x_g, idx.x_t, strict=True))}
    col_y = {(int(a), int(b), int(c)): idx.y0 + j for j, (a, b, c) in enumerate(zip(idx.y_s, idx.y_g, idx.y_t, strict=True))}
    x = np.zeros(model.num_cols)
    per_chunk = defaultdict(list)
    for s in sends:
        per_chunk[(s[2], s[3])].append(s)
    dest = {(q.source, q.chunk): q.dests[0] for q in demand.commodities}
    for (src, c), ss in per_chunk.items():
        si = pos[src]
        ss.sort(key=lambda s: (s[0], topo.nodes[topo.links[s[1]].src].is_gpu))
        node, held = src, 0
        for k, li, _, _ in ss:
            assert topo.links[li].src == node
            if topo.nodes[node].is_gpu:
                for t in range(held, k):
                    x[col_x[(si, node, t)]] += 1
            x[col_f[(si, li, k)]] += 1
            node, held = topo.links[li].dst, timing.arrival(li, k)
        assert node == dest[(src, c)]
        x[col_y[(si, node, held)]] += 1
    ax = model.A @ x
    return model, ax


@given(topo=topologies(max_gpus=4), size=st.sampled_from([10**5, 10**8]), epoch=st.sampled_from(["fast", "slow"]))
def test_every_schedule_is_a_point_of_the_lp(topo, size, epoch):
    """The relaxation claim, checked row by row: the direct AlltoAll (a verified schedule) is a
    feasible point of the LP at its epochs, so no LP horizon exceeds a schedule's epochs."""
    demand = make_demand(topo, "alltoall", size)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    sends = direct_alltoall(topo, demand, timing)
    sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, sends))
    assert sim.valid
    model, ax = _lp_point(topo, demand, timing, sends, int(sim.epochs))
    assert (ax >= model.row_lo - 1e-9).all() and (ax <= model.row_hi + 1e-9).all()
    assert min_lp_horizon(topo, demand, timing).T <= sim.epochs


@given(topo=topologies(max_gpus=5), size=st.sampled_from([10**5, 10**6, 10**8]), epoch=st.sampled_from(["fast", "slow"]), chunks=st.sampled_from([1, 2]))
def test_lp_decomposed_alltoall_verifies_on_random_topologies(topo, size, epoch, chunks):
    demand, timing, dem, res, sim, base = _run(topo, size, epoch, chunks)
    event(f"pieces {res.pieces}")
    event("minimal" if res.proven_minimal else "open")
    event("beats direct" if res.T < base.epochs else "ties direct")
    _check(demand, timing, dem, res, sim, base)
    # the LP's own schedule is a point of its LP at its epochs (sends follow one path per piece)
    model, ax = _lp_point(topo, dem, epoch_timing(topo, dem.chunk_bytes, timing.tau), res.sends, res.T)
    assert (ax >= model.row_lo - 1e-9).all() and (ax <= model.row_hi + 1e-9).all()


@pytest.mark.parametrize(("topo", "epoch"), [(ring(4), "fast"), (switch(3), "fast"), (dgx1(), "slow")], ids=["ring4", "switch3", "dgx1"])
def test_lp_horizon_is_below_the_milp_optimum(topo, epoch):
    """The LP relaxes the MILP: its horizon is at most the MILP's proven minimal epochs, and the
    LP route (exact once polished) finishes no later than the MILP's schedule."""
    out = synthesize(topo, "alltoall", 10**6, epoch, time_limit=30)
    demand = make_demand(topo, "alltoall", 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    hz = min_lp_horizon(topo, demand, timing)
    assert hz.T <= out.sim.epochs
    _, res = synthesize_lp(topo, demand, timing)
    assert res.T * timing.tau <= out.sim.finish_time_s * (1 + 1e-9)
    if out.status == "optimal":
        assert res.T <= out.sim.epochs


def test_an_lp_over_the_memory_limit_leaves_auto_with_the_direct_alltoall():
    """--method lp refuses an LP over the memory limit in one line; the default (auto) keeps the
    direct AlltoAll instead of failing (1024 GPUs: the static LP needs 16 GiB, and the whole
    synthesis used to end in that refusal)."""
    from flowride.errors import InputError
    from flowride.topology.builtins import dgx2

    with pytest.raises(InputError, match="memory limit"):
        synthesize(dgx2(4), "alltoall", 16_000, "fast", 1, 20, method="lp", memory_limit=2**20, nccl=False)
    out = synthesize(dgx2(4), "alltoall", 16_000, "fast", 1, 20, memory_limit=2**20, nccl=False)
    assert out.sim.valid and "direct" in out.report()["method"]


def test_the_pieces_lp_is_skipped_where_the_cut_paths_meet_its_bound():
    """h800 x 2 AlltoAll 64 MiB: the LP's whole-chunk paths list-schedule in 34 epochs; cut in two
    pieces they take 32, the pieces' lower bound, so no LP over the pieces is solved (it took the
    rest of a 7 s budget for nothing)."""
    from flowride.topology.fabrics import FabricSpec, fabric

    topo = fabric(FabricSpec("h800", 2))
    seen: list[dict] = []
    demand = make_demand(topo, "alltoall", 64 * 2**20, 1)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    # the search ends on its own in ~3 s of CPU, 20 x inside the limit (untimed it takes longer: steps the limit skips)
    dem, res = synthesize_lp(topo, demand, timing, time_limit=60, progress=seen.append, polish_seconds=0.0)
    cut = [e for e in seen if e["stage"] == "decompose" and e["pieces"] == 2]
    assert cut and cut[-1]["epochs"] == res.T == res.lower
    assert res.pieces == 2 and dem.chunks == 2
    assert not [e for e in seen if e["stage"] == "lp" and e.get("pieces") == 2]
    assert simulate(Schedule.from_tuples(topo, dem, timing.tau, res.sends)).epochs == res.T
