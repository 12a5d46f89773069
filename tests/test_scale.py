"""Synthesis at scale: the fluid bounds (forest, concurrent flow), the packed trees, the static LP,
coarse-to-fine retiming, the symmetric model, parallel probes, the method switch and the memory
guard. The simulator judges every schedule; the bounds are checked against brute force."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowride.api import synthesize
from flowride.cli import main
from flowride.collectives import make_demand
from flowride.errors import InputError
from flowride.schedule import Schedule, simulate
from flowride.synth.bounds import epoch_lower_bound, forest_bound, lower_bounds
from flowride.synth.flow import schedule_paths
from flowride.synth.greedy import retime
from flowride.synth.lp_static import concurrent_flow, static_paths
from flowride.synth.options import Speedups, parse_speedups
from flowride.synth.symmetry import expand_sends, source_symmetry
from flowride.synth.trees import synthesize_trees, tree_sends
from flowride.topology import dgx1, ndv2, ring, switch, torus
from flowride.topology.timing import epoch_timing
from test_properties import topologies

NONE = Speedups(incumbent=False, bounds=False, warm_start=False, symmetry=False, parallel=False)


def _cut_ratios(topo):
    """Every node set S holding a GPU, with (bandwidth into S, GPUs outside S)."""
    n = topo.num_nodes
    gpus = set(topo.gpus)
    for k in range(1, n + 1):
        for S in itertools.combinations(range(n), k):
            inside = set(S)
            outside = len(gpus - inside)
            if not (inside & gpus) or outside == 0:
                continue
            bw = sum(lk.bytes_per_s for lk in topo.links if lk.dst in inside and lk.src not in inside)
            yield inside, bw, outside


# ------------------------------------------------------------------------ forest bound


@given(topo=topologies(max_gpus=5))
def test_forest_bound_is_the_worst_cut_over_every_node_set(topo):
    """Max-flow finds the same rate as enumerating every node set (ForestColl's bound)."""
    brute = min(bw / outside for _, bw, outside in _cut_ratios(topo))
    assert forest_bound(topo).rate_Bps == pytest.approx(brute, rel=1e-6)


def test_forest_bound_on_known_topologies():
    # a bidirectional ring: every GPU takes its n-1 blocks in through two links
    assert forest_bound(ring(6, bandwidth=50.0)).rate_Bps == pytest.approx(2 * 50e9 / 5)
    # NDv2 x 2: one 12.5 GB/s link into each chassis for the other chassis' 8 GPUs
    assert forest_bound(ndv2(2)).rate_Bps == pytest.approx(12.5e9 / 8)


# ------------------------------------------------------------------------ concurrent flow


@settings(max_examples=15)
@given(topo=topologies(max_gpus=4))
def test_concurrent_flow_is_at_least_every_cut(topo):
    """The static LP's time is a floor at least as high as every node set's cut bound."""
    theta = concurrent_flow(topo).seconds_per_GB
    gpus = set(topo.gpus)
    for inside, bw, _ in _cut_ratios(topo):
        crossing = len(gpus & inside) * len(gpus - inside)  # GB that must enter, one per pair
        assert theta * 1e9 >= crossing / bw * 1e9 * (1 - 1e-6)


def test_flow_bound_sees_the_torus_bisection():
    """On an 8x8 torus the bisection (16 links each way for 32 x 32 blocks) binds, not ingress."""
    topo = torus(8, 8)
    d = make_demand(topo, "alltoall", 10**9)
    b = lower_bounds(topo, d)
    assert b.binding == "flow"
    block = d.chunk_bytes
    assert b.flow_s == pytest.approx(32 * 32 * block / (16 * 50e9), rel=1e-3)
    assert b.flow_s > 3 * b.ingress_s


@settings(max_examples=15)
@given(topo=topologies(max_gpus=4), size=st.sampled_from([10**5, 10**8]), epoch=st.sampled_from(["fast", "slow"]))
def test_static_lp_paths_schedule_and_verify(topo, size, epoch):
    demand = make_demand(topo, "alltoall", size)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    paths = static_paths(topo, demand, concurrent_flow(topo))
    sends, fallback = schedule_paths(topo, demand, timing, paths, 1, at_lp_epochs=False)
    sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, sends))
    assert sim.valid, sim.first_violation
    assert sim.epochs >= max(epoch_lower_bound(topo, demand, timing).values())


def test_lp_method_uses_the_static_lp_when_the_time_expanded_one_is_too_large():
    out = synthesize(torus(4, 4), "alltoall", 10**6, "fast", method="lp")
    assert out.sim.valid and out.search.static is False
    from flowride.synth.lp_search import synthesize_lp

    topo = torus(4, 4)
    d = make_demand(topo, "alltoall", 10**6)
    t = epoch_timing(topo, d.chunk_bytes, "fast")
    _, res = synthesize_lp(topo, d, t, max_columns=1)
    assert res.static
    sim = simulate(Schedule.from_tuples(topo, d, t.tau, res.sends))
    assert sim.valid and sim.epochs == res.T
    assert res.T >= res.lower


# ------------------------------------------------------------------------ trees


@given(topo=topologies(max_gpus=5), size=st.sampled_from([10**5, 10**8]), chunks=st.sampled_from([1, 2]),
       shape=st.sampled_from([("shortest", 0.5), ("cheapest", 2.0), ("cheapest", 0.1)]))
def test_tree_schedules_verify_on_random_topologies(topo, size, chunks, shape):
    demand = make_demand(topo, "allgather", size, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    sends = tree_sends(topo, demand, timing, shape[1], shape[0])
    sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, sends))
    assert sim.valid, sim.first_violation
    assert sim.epochs >= max(epoch_lower_bound(topo, demand, timing).values())


def test_trees_meet_the_published_ndv2_optimum():
    """On the published NDv2 x 2 (compat) instances the trees alone reach the proven minimum."""
    topo = ndv2(2, teccl_compat=True)
    for size, epoch, published in [(10**9, "slow", 10), (10**9, "fast", 35), (10**6, "fast", 39), (16_000, "fast", 222)]:
        d = make_demand(topo, "allgather", size)
        t = epoch_timing(topo, d.chunk_bytes, epoch)
        res = synthesize_trees(topo, d, t)
        assert res.T == published


@pytest.mark.parametrize("side", [12, pytest.param(16, marks=pytest.mark.slow)], ids=["144-gpus", "256-gpus"])
def test_trees_on_a_large_torus_stay_within_the_target(side):
    """No time limit: with one, a loaded machine decides the result (45 s gave 1.21x on a quiet day
    and 1.79x under a load of 4, the trees' scheduling cut short). NCCL's modelled algorithms are
    left out (a third of the time, and not what is tested). 12 x 12: 1.29x in ~12 s of CPU; the
    256-GPU torus (1.21x in ~35 s of CPU) runs with the slow tests."""
    out = synthesize(torus(side, side), "allgather", 10**9, "fast", method="trees", time_limit=None, nccl=False)
    rep = out.report()
    assert rep["verified"] and rep["gpus"] == side * side
    assert rep["ratio_to_lower_bound"] <= 1.5


# ------------------------------------------------------------------------ coarse to fine


@settings(max_examples=10)
@given(topo=topologies(max_gpus=4), size=st.sampled_from([10**5, 10**8]), chunks=st.sampled_from([1, 2]))
def test_retimed_slow_schedules_verify_at_fast_epochs(topo, size, chunks):
    slow = synthesize(topo, "allgather", size, "slow", chunks, time_limit=20, method="milp")
    fast = epoch_timing(topo, slow.demand.chunk_bytes, "fast")
    sends = retime(topo, [(s.epoch, s.link, s.source, s.chunk) for s in slow.schedule.sends], slow.schedule.timing, fast)
    sim = simulate(Schedule.from_tuples(topo, slow.demand, fast.tau, sends))
    assert sim.valid, sim.first_violation


@pytest.mark.parametrize("case", ["dgx1", "torus4x4"])
def test_warm_started_and_cold_searches_agree_on_epochs(request, case):
    """Untimed (with a limit, whether both reach "optimal" was the machine's speed). On the DGX-1
    the ladder's level at 2x epochs gives the incumbent; the torus's links are all alike (no level)."""
    topo, size, chunks = DGX1_4MB if case == "dgx1" else (torus(4, 4), 10**6, 2)
    cold = request.getfixturevalue("dgx1_cold") if case == "dgx1" else \
        synthesize(topo, "allgather", size, "fast", chunks, None, method="milp", speedups=NONE)
    levels: list[dict] = []
    warm = synthesize(topo, "allgather", size, "fast", chunks, None, method="milp", progress=levels.append,
                      speedups=Speedups(incumbent=False, bounds=False, warm_start=True, symmetry=False, parallel=False))
    assert cold.status == warm.status == "optimal"
    assert cold.sim.epochs == warm.sim.epochs
    assert bool([e for e in levels if e.get("stage") == "ladder-done"]) == (case == "dgx1")


# ------------------------------------------------------------------------ symmetry, parallel probes


SYMMETRY_SECONDS = 600.0  # an "it ends" bound for the automorphism search (these take well under a second): no verdict rests on it


def test_automorphisms_group_the_sources():
    assert source_symmetry(torus(4, 4), SYMMETRY_SECONDS).reps == (0,)
    assert source_symmetry(ring(6), SYMMETRY_SECONDS).reps == (0,)
    assert len(source_symmetry(dgx1(), SYMMETRY_SECONDS).reps) < 8
    compat = source_symmetry(ndv2(2, teccl_compat=True), SYMMETRY_SECONDS)
    assert compat is None or len(compat.reps) > 1


@pytest.mark.parametrize(("topo", "as_short"), [(ring(6), True), (dgx1(), True), (switch(4, copy=True), True), (torus(4, 4), True)],
                         ids=["ring", "dgx1", "copy-switch", "torus"])
def test_symmetric_model_schedules_are_valid(topo, as_short):
    """The symmetric model's schedules, copied over the orbits, verify. It is a restriction: on
    the ring, dgx1, a copy switch and the 4x4 torus a symmetric schedule meets the proven minimum
    (on the torus since the orbits are its translations, found by VF2++ with link labels: with
    the rotations VF2 found first it needed 15 epochs against 12)."""
    from flowride.synth.highs import SolveOptions, solve
    from flowride.synth.milp import build_model, restrict_to_sources, sends_from_solution
    from flowride.synth.rows import Infeasible

    d = make_demand(topo, "allgather", 10**6, 2)
    t = epoch_timing(topo, d.chunk_bytes, "fast")
    sym = source_symmetry(topo, SYMMETRY_SECONDS)
    full = synthesize(topo, "allgather", 10**6, "fast", 2, method="milp", speedups=NONE)  # untimed
    assert full.status == "optimal"
    T = full.sim.epochs
    while True:
        try:
            model, idx = build_model(topo, d, t, T, symmetry=sym)
        except Infeasible:
            T += 1
            continue
        out = solve(model, SolveOptions(first_feasible=True))  # untimed: a limit could skip a feasible T on a busy machine
        if out.x is not None:
            break
        T += 1
    assert model.num_cols < build_model(topo, d, t, T)[0].num_cols
    sends = expand_sends(sym, sends_from_solution(idx, restrict_to_sources(d, sym.reps), out.x))
    sim = simulate(Schedule.from_tuples(topo, d, t.tau, sends))
    assert sim.valid, sim.first_violation
    assert sim.epochs <= T
    assert (T == full.sim.epochs) == as_short


DGX1_4MB = (dgx1(), 4 * 10**6, 2)  # the plain bisection needs an infeasible probe (5 then 10, 8, 7, 6): the speedups have work


@pytest.fixture(scope="module")
def dgx1_cold():
    """The plain MILP search (no speedup) on DGX1_4MB, untimed: proven minimal on any machine."""
    topo, size, chunks = DGX1_4MB
    return synthesize(topo, "allgather", size, "fast", chunks, None, method="milp", speedups=NONE)


@pytest.mark.parametrize("flags", ["symmetry", "parallel", "bounds", "incumbent", "default"])
def test_every_speedup_keeps_the_proven_epoch_count(dgx1_cold, flags):
    """Untimed searches (a limit would let a busy machine decide whether "optimal" is reached;
    each takes under a second of CPU here): every speedup proves the same minimal epoch count as
    the plain search, and each did act (the symmetric model was probed, the trees capped the
    search, the search began at the tight bounds)."""
    cold = dgx1_cold
    topo, size, chunks = DGX1_4MB
    fast = synthesize(topo, "allgather", size, "fast", chunks, None, method="milp", speedups=parse_speedups(flags))
    assert cold.status == fast.status == "optimal"
    assert cold.sim.epochs == fast.sim.epochs and fast.sim.valid
    outcomes = [p.outcome for p in fast.search.probes]
    if flags == "symmetry":
        assert any(o.startswith("symmetric") for o in outcomes), outcomes
    if flags in ("incumbent", "default"):
        assert any(o.startswith("trees") for o in outcomes), outcomes
    if flags == "bounds":
        assert len(outcomes) < len(cold.search.probes)


def test_parse_speedups_names_the_field():
    assert parse_speedups("none") == NONE
    assert parse_speedups("symmetry,bounds") == Speedups(incumbent=False, bounds=True, warm_start=False, symmetry=True, parallel=False)
    with pytest.raises(InputError, match="speedups"):
        parse_speedups("turbo")


# ------------------------------------------------------------------------ methods and memory


def test_memory_guard_refuses_an_oversized_milp_up_front():
    with pytest.raises(InputError, match="GiB") as e:
        synthesize(torus(8, 8), "allgather", 10**6, "fast", method="milp", memory_limit=2**30)
    assert e.value.field == "method"


def test_auto_picks_by_size_and_collective():
    assert synthesize(dgx1(), "allgather", 10**6, "fast").report()["method"] in ("milp", "trees")
    big = synthesize(torus(8, 8), "allgather", 10**6, "fast").report()  # too large a MILP: the windows
    assert big["method"] == "astar" and big["status"] == "optimal"  # 32 epochs, the epoch bound
    assert synthesize(dgx1(), "alltoall", 10**6, "fast").report()["method"] in ("lp", "direct")


@pytest.mark.parametrize(("args", "method"), [
    (["-t", "dgx1", "-c", "alltoall", "--method", "lp"], {"lp", "direct"}),
    (["-t", "dgx1", "--method", "trees"], {"trees"}),
    (["-t", "dgx1", "--method", "astar"], {"astar", "trees"}),
    (["-t", "dgx1", "--method", "milp", "--speedups", "none"], {"milp", "ring"}),
])
def test_cli_methods_write_verified_reports(tmp_path, capsys, args, method):
    rep = tmp_path / "r.json"
    assert main(["synth", *args, "-s", "1MB", "--chunks", "1", "--report", str(rep)]) == 0  # methods, not chunk counts
    r = json.loads(rep.read_text())
    assert r["verified"] and r["method"] in method
    assert "method" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "needle"), [
    (["--method", "simplex"], "method"),
    (["-c", "allgather", "--method", "lp"], "method"),
    (["-c", "alltoall", "--method", "trees"], "method"),
    (["--speedups", "warp"], "speedups"),
    (["-t", "torus", "--rows", "8", "--cols", "8", "--method", "milp", "--memory-limit", "0.5"], "memory limit"),
])
def test_cli_bad_method_input_is_one_line(capsys, args, needle):
    base = ["synth", "-t", "dgx1", "-s", "1MB"]
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_static_paths_refuse_a_non_uniform_demand():
    topo = ring(4)
    d = make_demand(topo, "alltoall", 10**6)
    cf = concurrent_flow(topo)
    import dataclasses

    skew = dataclasses.replace(d, commodities=d.commodities[:-1])
    with pytest.raises(ValueError, match="uniform"):
        static_paths(topo, skew, cf)
    assert np.isfinite(cf.seconds_per_GB) and cf.status == "optimal"
