"""Several collectives at once on shared links (flowride.concurrent, ``synth --concurrent``): the
SPEC and its refusals, the fluid model of schedules run together, the joint bound, and joint
schedules that verify per collective and hold every link's capacity with all of them together."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clirun import assert_clean_error, cli
from flowride.cli import main
from flowride.collectives.demand import Collective, make_demand
from flowride.concurrent import joint, parse_spec, report, synthesize_concurrent
from flowride.concurrent.bound import candidate_sets, cut_bytes, joint_bound
from flowride.concurrent.contention import fair_speeds, run_together
from flowride.concurrent.sharing import ecmp_classes, equal_shares, member, pooled, users
from flowride.errors import InputError
from flowride.schedule.simulate import simulate
from flowride.synth.bounds import entering
from flowride.topology.fabrics import build_fabric
from flowride.topology.group import group_topology
from flowride.topology.model import Link, Node, Topology
from synth_helpers import auto_sweeps_in_virtual_time, refused_here

CLOS = build_fabric("dgx-h100", 4, "clos", oversubscription=4)  # 32 GPUs, two leaves, 4:1 up
CLOS_ARGS = ("-t", "fabric", "--node", "dgx-h100", "--nodes", "4", "--network", "clos", "--oversubscription", "4")
SLOW = settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))


# ----------------------------------------------------------------------------------- the SPEC


def test_spec_reads_groups_sizes_and_starts():
    items = parse_spec([{"name": "dp", "collective": "reduce-scatter", "ranks": "every:8", "size": "1GB"},
                        {"collective": "allgather", "ranks": [0, 1, 2, 3], "size": 4096, "start_us": 12.5}], CLOS)
    assert items[0].ranks == (0, 8, 16, 24) and items[0].collective is Collective.REDUCESCATTER and items[0].size_bytes == 10**9
    assert items[1].name == "c1" and items[1].start_s == pytest.approx(12.5e-6) and items[1].ranks == (0, 1, 2, 3)


@pytest.mark.parametrize("entry, field, words", [
    ({"collective": "allgather", "ranks": "0,99", "size": "1MB"}, "--concurrent[0].ranks", "outside 0..31"),
    ({"collective": "allgather", "ranks": [0, 40], "size": "1MB"}, "--concurrent[0].ranks", "outside 0..31"),
    ({"collective": "allgather", "ranks": "0,1,1", "size": "1MB"}, "--concurrent[0].ranks", "appears twice"),
    ({"collective": "allgather", "ranks": "0-3", "size": "1MB", "start_us": "soon"}, "--concurrent[0].start_us", "not a number"),
    ({"collective": "allgather", "ranks": "0-3", "size": "1MB", "start_us": True}, "--concurrent[0].start_us", "not a number"),
    ({"collective": "allgather", "ranks": "0-3", "size": "1MB", "start_us": -1}, "--concurrent[0].start_us", "outside"),
    ({"collective": "allgather", "ranks": "0-3", "size": "1MB", "when": 3}, "--concurrent[0].when", "not a known key"),
    ({"collective": "broadcast", "ranks": "0-3", "size": "1MB"}, "--concurrent[0].collective", "unknown collective"),
    ({"collective": "allgather", "ranks": "0-3"}, "--concurrent[0].size", "missing"),
    ({"collective": "allgather", "ranks": "0-3", "size": "lots"}, "--concurrent[0].size", "cannot read"),
])
def test_spec_refusals_name_the_entry_and_field(entry, field, words):
    with pytest.raises(InputError) as e:
        parse_spec([entry], CLOS)
    assert e.value.field == field and words in e.value.problem, str(e.value)


def test_cli_refuses_bad_specs_in_one_line(tmp_path, capsys):
    """One refusal end to end in a subprocess, as a user sees it; the others through the same
    ``main`` in this process (no interpreter start per case)."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"collective": "allgather", "ranks": "0,1,1", "size": "1MB"}]))
    assert_clean_error(cli("synth", *CLOS_ARGS, "--concurrent", str(bad)), 2, "--concurrent[0].ranks", "appears twice", within=20)
    base = ["synth", *CLOS_ARGS, "--concurrent"]
    refused_here(capsys, [*base, '[{"collective": "allgather", "ranks": "0,77", "size": "1MB"}]'], "--concurrent[0].ranks", "outside 0..31")
    refused_here(capsys, [*base, '[{"collective": "allgather", "ranks": "0,1", "size": "1MB", "start_us": "later"}]'],
             "--concurrent[0].start_us", "not a number")
    refused_here(capsys, [*base, "[{"], "--concurrent", "not valid JSON")
    refused_here(capsys, [*base, str(tmp_path / "none.json")], "--concurrent", "neither")
    same = '[{"name": "a/b", "collective": "allgather", "ranks": "0,1", "size": "1MB"}, ' \
           '{"name": "a_b", "collective": "allgather", "ranks": "2,3", "size": "1MB"}]'
    refused_here(capsys, [*base, same], "--concurrent", "same file name")
    ok = '[{"collective": "allgather", "ranks": "0,1", "size": "1MB"}]'
    refused_here(capsys, [*base, ok, "--size", "1MB"], "--size", "without --concurrent")
    refused_here(capsys, [*base, ok, "--ranks", "0-3"], "--ranks", "without --concurrent")
    refused_here(capsys, [*base, ok, "--method", "milp"], "--method", "without --concurrent")


# ------------------------------------------------------------------- schedules run together


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.data())
def test_fair_speeds_respect_capacity_and_are_max_min(k, nl, data):
    rates = np.array(data.draw(st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=nl, max_size=nl),
                                        min_size=k, max_size=k)))
    caps = np.array(data.draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=nl, max_size=nl)))
    phi = fair_speeds(rates, caps)
    assert ((phi > 0) & (phi <= 1.0 + 1e-12)).all()
    assert (phi @ rates <= caps * (1 + 1e-9) + 1e-12).all()  # no link over its capacity
    full = phi @ rates >= caps * (1 - 1e-9)
    for i in range(k):  # each one is at its own pace or on a full link where nobody goes faster
        if phi[i] < 1 - 1e-9:
            assert any(full[j] and rates[i, j] > 0 and phi[i] >= phi[rates[:, j] > 0].max() - 1e-9 for j in range(nl)), (phi, i)


def test_run_together_alone_apart_and_sharing():
    caps = np.array([1.0, 1.0])
    # alone: as fast as alone; on separate links: each as alone; apart in time: each as alone
    assert run_together(np.array([2.0]), np.array([3.0]), np.array([[3.0, 0.0]]), caps)[0] == pytest.approx(5.0)
    fin = run_together(np.zeros(2), np.array([3.0, 2.0]), np.array([[3.0, 0.0], [0.0, 2.0]]), caps)
    assert fin == pytest.approx([3.0, 2.0])
    fin = run_together(np.array([0.0, 5.0]), np.array([3.0, 3.0]), np.array([[3.0, 0], [3.0, 0]]), caps)
    assert fin == pytest.approx([3.0, 8.0])
    # two that fill one link share it: both done when the link has carried both loads
    fin = run_together(np.zeros(2), np.array([2.0, 2.0]), np.array([[2.0, 0], [2.0, 0]]), caps)
    assert fin == pytest.approx([4.0, 4.0])


def test_ecmp_pools_interchangeable_spines_only():
    topo = build_fabric("dgx-h100", 4, "clos", oversubscription=2)
    classes = ecmp_classes(topo)
    up = [i for i, lk in enumerate(topo.links) if topo.nodes[lk.src].label == "leaf0" and topo.nodes[lk.dst].label.startswith("spine")]
    assert len(up) == 8 and len({int(classes[i]) for i in up}) == 1
    caps = pooled(np.array([lk.bytes_per_s for lk in topo.links]), classes)
    assert caps[classes[up[0]]] == pytest.approx(sum(topo.links[i].bytes_per_s for i in up))
    nic = [i for i, lk in enumerate(topo.links) if topo.nodes[lk.dst].label == "leaf0" and topo.nodes[lk.src].is_gpu]
    assert len({int(classes[i]) for i in nic}) == len(nic)  # each NIC stays its own link


# ---------------------------------------------------------------------------- the joint bound


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.ALLTOALL])
def test_cut_bytes_match_the_demand(coll):
    """The closed form counts what the demand itself says must cross (AllGather, AlltoAll; a
    ReduceScatter is the AllGather on reversed links, so its in and out swap)."""
    topo = group_topology(CLOS, (0, 1, 8, 16, 17))
    demand = make_demand(topo, coll, 10**6, 1)
    for r in range(1, len(topo.gpus)):
        for inside_gpus in itertools.combinations(topo.gpus, r):
            into = entering(demand, frozenset(inside_gpus)) * demand.chunk_bytes
            assert cut_bytes(coll, 10**6, len(topo.gpus), r)[0] == pytest.approx(into)
    assert cut_bytes(Collective.REDUCESCATTER, 10**6, 5, 2) == cut_bytes(Collective.ALLGATHER, 10**6, 5, 2)[::-1]


def _brute_force_bound(topo, items, own):
    """The cut bound over every node set of a small topology (not only the candidates)."""
    nodes = range(topo.num_nodes)
    best = max(own)
    for r in range(1, topo.num_nodes):
        for s in itertools.combinations(nodes, r):
            inside = set(s)
            cap_in = sum(lk.bytes_per_s for lk in topo.links if lk.dst in inside and lk.src not in inside)
            cap_out = sum(lk.bytes_per_s for lk in topo.links if lk.src in inside and lk.dst not in inside)
            moves = [cut_bytes(it.collective, it.size_bytes, len(it.ranks), sum(topo.gpus[x] in inside for x in it.ranks))
                     for it in items]
            for col, cap in ((0, cap_in), (1, cap_out)):
                for s0 in {it.start_s for it in items}:
                    need = sum(m[col] for m, it in zip(moves, items, strict=True) if it.start_s >= s0)
                    if need and cap:
                        best = max(best, s0 + need / cap)
    return best


def _two_leaves() -> Topology:
    """Two servers of three GPUs, each server on its own leaf switch, the leaves joined by one
    thin link each way: small enough to try every node set."""
    nodes = [Node(g, "gpu", group=g // 3, label=f"g{g}") for g in range(6)]
    nodes += [Node(6, "switch", copy=False, label="leaf0"), Node(7, "switch", copy=False, label="leaf1")]
    links = []
    for g in range(6):
        links += [Link(g, 6 + g // 3, 50.0, 1e-6), Link(6 + g // 3, g, 50.0, 1e-6)]
    links += [Link(6, 7, 20.0, 1e-6), Link(7, 6, 20.0, 1e-6)]
    return Topology("two-leaves", tuple(nodes), tuple(links))


SMALL = _two_leaves()


@SLOW
@given(st.lists(st.tuples(st.sampled_from(["allgather", "reducescatter", "alltoall"]),
                          st.lists(st.integers(0, 5), min_size=2, max_size=4, unique=True),
                          st.sampled_from(["64KB", "4MB"]), st.sampled_from([0, 0, 3])), min_size=2, max_size=3))
def test_joint_schedules_verify_hold_capacity_and_respect_the_bound(specs):
    """Every joint schedule verifies per collective on its own links, the shares of every link
    add up to at most one, the sends of all collectives placed in time stay within every link's
    capacity, and the last finish is at or above the joint bound, which is at or above every
    collective's own bound and no weaker than the cuts of every node set (brute force). These
    hold whatever the time limits cut off, so each collective's chunk sweep runs in virtual time
    (1 and 2 chunks) instead of waiting for its share of the limit."""
    items = parse_spec([{"collective": c, "ranks": r, "size": s, "start_us": t} for c, r, s, t in specs], SMALL)
    with pytest.MonkeyPatch.context() as mp:
        auto_sweeps_in_virtual_time(mp, joint)
        out = synthesize_concurrent(SMALL, items, time_limit=3 * len(items))
    for s in out.best.solved:
        assert simulate(s.schedule).valid
    if out.best.shares is not None:
        assert (out.best.shares.sum(axis=0) <= 1 + 1e-9).all()
        u = users(out.members, len(SMALL.links))
        assert ((out.best.shares > 0) <= u).all()  # nobody has a share of a link its group cannot use
    assert out.link_use["within_capacity"], out.link_use
    assert out.best.last_s >= out.bound.seconds * (1 - 1e-9)
    assert out.bound.seconds >= max(out.bound.own_s) - 1e-15
    brute = _brute_force_bound(SMALL, out.items, list(out.bound.own_s))
    assert out.bound.seconds <= brute * (1 + 1e-9)  # the candidates are some of all node sets
    assert out.best.last_s >= brute * (1 - 1e-9)  # and every cut is a true lower bound
    for c in out.candidates:  # the one kept is the earliest valid one
        assert not c.valid or c.last_s >= out.best.last_s - 1e-15


def test_groups_that_share_nothing_keep_their_alone_schedules():
    topo = build_fabric("dgx-h100", 2, "rail")
    items = parse_spec([{"collective": "allgather", "ranks": "0,8", "size": "1MB"},
                        {"collective": "allgather", "ranks": "1,9", "size": "1MB"}], topo)  # rails 0 and 1
    out = synthesize_concurrent(topo, items, time_limit=6)
    assert out.best.name == "alone" and out.best.shares is None
    assert out.best.finish_s == pytest.approx([s.finish_s for s in out.alone])
    assert out.together_s == pytest.approx(out.best.finish_s)


def test_even_shares_split_only_the_links_groups_share():
    items = parse_spec([{"collective": "allgather", "ranks": "0,16", "size": "1MB"},
                        {"collective": "allgather", "ranks": "1,17", "size": "1MB"}], CLOS)
    ms = [member(CLOS, it) for it in items]
    x = equal_shares(ms, len(CLOS.links))
    up = [i for i, lk in enumerate(CLOS.links) if CLOS.nodes[lk.src].label == "leaf0" and CLOS.nodes[lk.dst].label == "spine0"]
    assert x[:, up[0]] == pytest.approx([0.5, 0.5])
    own_nic = CLOS.link_index[(CLOS.gpus[0], next(n.id for n in CLOS.nodes if n.label == "leaf0"))]
    assert x[:, own_nic] == pytest.approx([1.0, 0.0])


def test_bound_sets_include_a_leaf_and_its_servers():
    names = [n for n, _ in candidate_sets(CLOS)]
    assert "switch leaf0 and its servers" in names and "server 0" in names
    items = parse_spec([{"collective": "reducescatter", "ranks": f"every:8+{j}", "size": "1GB"} for j in range(8)], CLOS)
    b = joint_bound(CLOS, items, [0.0] * 8)
    # 8 groups x 2 blocks of 250 MB out of each leaf, over 16 NICs x 50 GB/s / 4
    assert b.cut_s == pytest.approx(8 * 2 * 250e6 / (16 * 50e9 / 4)) and "leaf" in b.cut


# ---------------------------------------------------------------------------- through the CLI


def test_cli_writes_each_schedule_its_msccl_xml_and_the_report(tmp_path):
    """End to end; what is checked holds whatever the (short) limit cut off."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"name": "dp0", "collective": "reducescatter", "ranks": "0,8,16,24", "size": "4MB"},
                                {"name": "dp1", "collective": "reducescatter", "ranks": "1,9,17,25", "size": "4MB", "start_us": 2}]))
    out = tmp_path / "out"
    r = cli("synth", *CLOS_ARGS, "--concurrent", str(spec), "--time-limit", "2", "--out-dir", str(out), timeout=240)
    assert r.code == 0, r.err[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert [c["name"] for c in rep["collectives"]] == ["dp0", "dp1"]
    assert rep["joint"]["verified"] and rep["joint"]["link_use"]["within_capacity"]
    assert rep["joint"]["last_finish_us"] >= rep["joint_bound_us"] * (1 - 1e-9)
    for c in rep["collectives"]:
        assert c["finish_us"] >= c["own_bound_us"] * (1 - 1e-9) and c["nccl_together_us"] >= c["nccl_alone_us"] * (1 - 1e-9)
    assert "joint last finish" in r.out and "calibrated model" in r.out
    cal = rep["calibrated"]  # the headline: each alone by the calibrated model, stretched by the epoch model's contention
    assert rep["speedup_vs_nccl"] == pytest.approx(cal["nccl_together_us"] / cal["joint_us"])
    for c, k in zip(rep["collectives"], cal["per_collective"], strict=True):
        stretch = (c["nccl_together_us"] - c["start_us"]) / (c["nccl_alone_us"] - c["start_us"])
        assert k["nccl_together_us"] >= c["start_us"] and stretch >= 1 - 1e-9
    assert cal["joint_us"] == pytest.approx(max(k["joint_us"] for k in cal["per_collective"]))
    for name in ("dp0", "dp1"):
        assert rep["exports"][name]["msccl"] and rep["exports"][name]["mscclpp"], rep["exports"][name]
        for f in (out / f"{name}.xml", out / "mscclpp" / f"{name}.json"):  # the files verify (in this process)
            assert main(["verify", str(f)]) == 0
    assert report  # the library form is what the CLI prints


# ------------------------------------------------------------------------------- in flowride plan

CLOS_JOB = {"model": {"layers": 4, "hidden": 1024, "seq_len": 512, "params": 2e8},
            "parallel": {"tp": 8, "pp": 1, "dp": 4, "microbatches": 2, "schedule": "1f1b"},
            "hardware": {"node": "dgx-h100", "network": "clos", "oversubscription": 4},
            "synthesis": {"time_limit_s": 4, "contention": True}}


def test_plan_prices_the_dp_groups_together_and_caches_them(tmp_path, monkeypatch):
    """What is checked holds whatever the limits cut off (ours is the best of NCCL's and the
    synthesis', the joint finish is at or above its bound, the cache gives back what was priced),
    so the chunk sweeps run in virtual time instead of waiting for their limits."""
    import flowride.api
    from flowride.plan import Pricer, job_from_dict, plan_job

    auto_sweeps_in_virtual_time(monkeypatch, flowride.api, joint)
    cache = tmp_path / "c.json"
    p1 = Pricer(cache=cache, synth=True, time_limit_s=4)
    pl = plan_job(job_from_dict(CLOS_JOB), p1)
    dp = [c for c in pl.collectives if c.group.nodes == 4]
    assert {c.collective for c in dp} == {"reducescatter", "allgather"} and {c.how for c in dp} == {"joint"}
    for c in dp:
        t = c.together
        assert t["groups"] == 8  # one DP group per GPU of a node, all at once
        assert c.nccl_us == pytest.approx(t["nccl_together_us"]) and t["nccl_together_us"] >= t["nccl_alone_us"] * (1 - 1e-9)
        assert c.ours_us <= c.nccl_us * (1 + 1e-9)
        ep = t["epoch_model"]  # the contention comes from the epoch model, whose joint schedule keeps its bound
        assert ep["joint_us"] >= ep["joint_bound_us"] * (1 - 1e-9) and ep["nccl_together_us"] >= ep["nccl_alone_us"] * (1 - 1e-9)
        assert t["nccl_together_us"] == pytest.approx(t["nccl_alone_us"] * ep["nccl_together_us"] / ep["nccl_alone_us"])
    assert any("priced together" in a for a in pl.report()["assumptions"])
    p2 = Pricer(cache=cache, synth=True, time_limit_s=4)
    again = plan_job(job_from_dict(CLOS_JOB), p2)
    assert p2.solved == 0 and [c.ours_us for c in again.collectives] == [c.ours_us for c in pl.collectives]


def test_plan_contention_through_the_cli_and_its_refusal(tmp_path, capsys):
    """End to end (what is checked holds whatever the 1 s limits cut off); the refusal in this process."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps({**CLOS_JOB, "synthesis": {"time_limit_s": 1}}))
    r = cli("plan", str(job), "--contention", "--no-cache", timeout=300)
    assert r.code == 0, r.err[-2000:]
    assert "more at once" in r.out and "contention priced" in r.out
    refused_here(capsys, ["plan", str(job), "--contention", "--no-synth", "--no-cache"], "--contention", "synthesis is off")


def test_spines_are_dealt_out_whole_and_a_cut_off_group_is_refused():
    from flowride.concurrent.sharing import apart_shares, scaled, twin_switches

    items = parse_spec([{"collective": "allgather", "ranks": "0,16", "size": "1MB"},
                        {"collective": "allgather", "ranks": "1,17", "size": "1MB"}], CLOS)
    ms = [member(CLOS, it) for it in items]
    (spines,) = twin_switches(CLOS)
    assert len(spines) == 8
    x = apart_shares(ms, CLOS)
    assert (x.sum(axis=0) <= 1 + 1e-12).all()
    owned = [{w for w in spines if x[i, CLOS.link_index[(next(n.id for n in CLOS.nodes if n.label == "leaf0"), w)]] == 1.0}
             for i in range(2)]
    assert len(owned[0]) == len(owned[1]) == 4 and not owned[0] & owned[1]  # four spines each, none shared
    on_share = scaled(ms[0], x[0])
    assert on_share is not None and len(on_share.topo.links) < len(ms[0].topo.links)
    assert (on_share.base_link >= 0).all() and set(on_share.base_link.tolist()) <= set(ms[0].base_link.tolist())
    nothing = np.zeros(len(CLOS.links))
    nothing[ms[0].base_link[:1]] = 1.0  # one link of its own, the rest taken
    assert scaled(ms[0], nothing) is None
