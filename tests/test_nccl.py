"""NCCL's algorithms modelled as schedules (synth/nccl.py, nccl_view.py) and NCCL's own cost model
(synth/nccl_tuning.py): every modelled algorithm verifies in the simulator, the ring equals its
closed form on a ring and on a switch, channels cross hosts on their own rails, and the report
carries the ``nccl`` entry."""

from __future__ import annotations

import itertools

import pytest

from flowride.api import synthesize
from flowride.collectives.demand import Collective, make_demand
from flowride.runtime.nccl_tuning import Machine, best_per_algorithm, nccl_protocol
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.synth.nccl import _ring_schedule, model_nccl, ring_epochs_estimate
from flowride.synth.nccl_view import hosts, nvls_switch, ring_channels, single_host_rings
from flowride.topology.builtins import dgx1, dgx2, h100, mi250, ring, switch
from flowride.topology.fabrics import FabricSpec, fabric
from flowride.topology.group import select_group
from flowride.topology.timing import epoch_timing

TOPOLOGIES = {
    "dgx-h100x2-rail": lambda: fabric(FabricSpec("dgx-h100", 2)),
    "a800x4-clos-shared-nic": lambda: fabric(FabricSpec("a800", 4, "clos", nic_share=2)),
    "h100-one-host": lambda: h100(1),
    "dgx1": dgx1,
    "dgx2x4-teccl-rails": lambda: dgx2(4),
    "one-gpu-per-host": lambda: select_group(fabric(FabricSpec("dgx-h100", 4)), "every:8"),
}


@pytest.mark.parametrize("name", TOPOLOGIES)
@pytest.mark.parametrize("coll", ["allgather", "reducescatter", "allreduce", "alltoall"])
def test_every_modelled_algorithm_is_a_verified_schedule(name, coll):
    topo = TOPOLOGIES[name]()
    m = model_nccl(topo, coll, 4 * 10**6)
    assert m.algorithms
    for a in m.algorithms.values():
        if a.how == "simulated":
            sim = simulate(a.schedule)
            assert sim.valid, (a.name, sim.first_violation)
            timing = a.schedule.timing
            last = max(timing.arrival(s.link, s.epoch) for s in a.schedule.sends)  # it ends with its own last send
            assert a.time_us == pytest.approx(max(sim.finish_time_s, last * timing.tau) * 1e6)
            assert a.schedule.topology is topo and a.schedule.collective.value == coll
        else:
            assert a.how == "tuning model" and a.name in m.tuning
    r = m.report()
    assert set(r) >= {"algorithms", "best", "best_us", "how", "tuning"}
    assert r["best_us"] == min(r["algorithms"].values()) and r["algorithms"][r["best"]] == r["best_us"]


def test_which_algorithms_apply_where():
    assert set(model_nccl(h100(1), "allgather", 10**6).algorithms) == {"ring", "nvls"}  # NVLS on one host
    assert set(model_nccl(fabric(FabricSpec("dgx-h100", 2)), "allgather", 10**6).algorithms) == {"ring"}  # no SHARP across hosts
    assert set(model_nccl(TOPOLOGIES["one-gpu-per-host"](), "allgather", 10**6).algorithms) == {"ring", "pat"}
    ar = model_nccl(fabric(FabricSpec("dgx-h100", 2)), "allreduce", 10**6).algorithms
    assert set(ar) == {"ring", "tree", "nvls_tree"} and ar["tree"].how == ar["nvls_tree"].how == "tuning model"
    assert set(model_nccl(dgx1(), "alltoall", 10**6).algorithms) == {"p2p"}


@pytest.mark.parametrize("make", [lambda n, a: ring(n, alpha_us=a, bidirectional=False), lambda n, a: ring(n, alpha_us=a),
                                  lambda n, a: switch(n, alpha_us=a)], ids=["one-way ring", "ring", "switch"])
@pytest.mark.parametrize("n", [3, 4, 8])
@pytest.mark.parametrize("alpha", [0.0, 0.7, 5.0])
@pytest.mark.parametrize("chunks", [2, 4, 8])
def test_ring_equals_its_closed_form(make, n, alpha, chunks):
    """Per channel of n GPUs with C chunks, a hop taking d epochs and the slowest link starting a
    chunk every p: max(((n-1)C - 1) p + d, (n-1) d + (C-1) p) epochs."""
    topo = make(n, alpha)
    chans = ring_channels(topo)
    demand = make_demand(topo, Collective.ALLGATHER, 10**6, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, _ring_schedule(topo, demand, timing, chans)))
    assert sim.valid
    assert sim.epochs == ring_epochs_estimate(topo, timing, chans, chunks)


def test_a_one_way_ring_with_one_chunk_by_hand():
    # 4 GPUs, 1 MB: 250 kB chunks, 5 us each at 50 GB/s (tau); alpha 0.7 us is 0.14 of an epoch, so a = 1
    topo = ring(4, alpha_us=0.7, bidirectional=False)
    demand = make_demand(topo, Collective.ALLGATHER, 10**6, 1)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    sched = Schedule.from_tuples(topo, demand, timing.tau, _ring_schedule(topo, demand, timing, ring_channels(topo)))
    assert simulate(sched).epochs == 3 * 2  # three hops of 1 + a = 2 epochs


def test_channels_cross_hosts_on_their_own_rails():
    topo = fabric(FabricSpec("dgx-h100", 3))
    chans = ring_channels(topo)
    assert len(chans) == 8  # one per NIC
    label = {nd.id: nd.label for nd in topo.nodes}
    for k, order in enumerate(chans):
        gpus = [g for g, _ in order]
        assert sorted(gpus) == list(topo.gpus)
        entries = [g for g in gpus if label[g].endswith(f".g{k}")]
        assert [gpus.index(e) % 8 for e in entries] == [0, 0, 0]  # each host entered at the GPU of NIC k
        for _, via in order:
            if via is not None:  # PXN: the host's last GPU relays to NIC k's GPU
                assert label[via].endswith(f".g{k}")
    shared = ring_channels(fabric(FabricSpec("a800", 2, nic_share=2)))
    assert len(shared) == 4 and all(via is None for order in shared for _, via in order)  # leave by the NIC's other GPU


def test_rings_through_a_mesh_host_follow_its_direct_links_and_spread_over_them():
    """MI250: inside a host the GCDs meet on xGMI, not a switch. Each channel's part of the ring
    runs on direct links from the GCD its NIC delivers to, to the one that sends through it, and
    the channels spread over the mesh, so the ring is NIC-bound as NCCL's closed form says (it
    once routed GCD to GCD through the NICs, at 9x the closed form)."""
    topo = mi250(2)
    direct = {(lk.src, lk.dst) for lk in topo.links if topo.nodes[lk.src].is_gpu and topo.nodes[lk.dst].is_gpu}
    for order in ring_channels(topo):
        gpus = [g for g, _ in order]
        assert sorted(gpus) == list(topo.gpus)
        for h in range(2):
            part = [g for g in gpus if topo.nodes[g].group == h]
            assert all((a, b) in direct for a, b in itertools.pairwise(part))
    r = model_nccl(topo, Collective.ALLGATHER, 10**9, 60).report()
    assert r["algorithms"]["ring"] <= 1.1 * r["tuning"]["algorithms"]["ring"]


def test_hosts_and_nics_as_nccl_sees_them():
    hs = hosts(dgx2(4))
    assert len(hs) == 4 and all(len(h.nics) == 8 for h in hs)
    assert hs[0].nics[0].into == [0] and hs[0].nics[0].out == [1]  # the TE-CCL rails: in at even, out at odd
    assert len(hosts(dgx1())) == 1 and hosts(dgx1())[0].nics == []
    assert nvls_switch(h100(1)) is not None and nvls_switch(fabric(FabricSpec("dgx-a100", 1))) is None
    rings = single_host_rings(dgx1())
    assert len(rings) >= 2 and all(sorted(r) == list(range(8)) for r in rings)


def test_tuning_model_picks_protocols_and_algorithms_as_nccl_does():
    order = {"LL": 0, "LL128": 1, "Simple": 2}
    for coll in Collective:
        got = [order[nccl_protocol(coll, 8, 2**k, 450.0)] for k in range(4, 34)]
        assert got == sorted(got) and got[0] == 0 and got[-1] == 2
    m = Machine(16, 2, 450.0, 50.0, 8, True, "hopper")
    small, big = best_per_algorithm("allreduce", m, 2**12), best_per_algorithm("allreduce", m, 2**30)
    assert set(small) == {"ring", "tree", "nvls_tree"}
    assert min(small.values(), key=lambda e: e.time_us).algorithm == "tree"  # latency: the tree's log steps
    assert min(big.values(), key=lambda e: e.time_us).algorithm == "nvls_tree"  # bandwidth: NVLS inside the node
    pat = best_per_algorithm("allgather", Machine(8, 8, 50.0, 50.0, 1, False), 2**10)
    assert "pat" in pat


def test_reports_compare_with_nccl():
    out = synthesize(fabric(FabricSpec("dgx-h100", 2)), "allgather", 64 * 10**6, "fast", 8, None, method="trees")  # untimed: NCCL's ring is always simulated
    r = out.report()
    assert r["nccl"]["best"] == "ring" and r["nccl"]["how"]["ring"] == "simulated"
    assert r["speedup_vs_nccl_epoch_model"] == pytest.approx(r["nccl"]["best_us"] / r["finish_time_us"])
    # the headline: NCCL's calibrated prediction over this schedule priced as the runtime runs it
    pred = r["nccl_predicted"]
    assert pred["calibration"] == "fitted: dgx-h100 + ib" and pred["algorithm"] in ("ring", "nvls", "pat")
    assert r["speedup_vs_nccl"] == pytest.approx(pred["time_us"] / r["runtime_us"])
    assert r["runtime_us"] > r["finish_time_us"]  # the runtime sustains less than the line rate and pays per step
    assert r["nccl"]["tuning"]["best"] == "ring" and r["nccl"]["channels"]["ring"] == 8
    off = synthesize(ring(4), "allgather", 10**6, nccl=False).report()
    assert off["nccl"] is None and off["nccl_predicted"] is None and off["speedup_vs_nccl"] is None


def test_a_modelled_algorithm_ends_with_its_own_last_send():
    """AllGather 256 MB on 2 x dgx-h100 on rails: each rail's NIC link carries a ring's 60 sends of
    500 KB at 50 GB/s, so the ring takes at least 600 us of NIC time, however soon the simulator
    finds each chunk at its GPU another way (a relay over NVLink)."""
    from flowride.synth.nccl import model_nccl
    from flowride.topology.fabrics import build_fabric

    topo = build_fabric("dgx-h100", 2)
    ring = model_nccl(topo, "allgather", 256 * 10**6).algorithms["ring"]
    assert ring.time_us >= 600.0
    timing = ring.schedule.timing
    last = max(timing.arrival(s.link, s.epoch) for s in ring.schedule.sends)
    assert ring.time_us == pytest.approx(max(last * timing.tau * 1e6, ring.time_us))


def test_a_modelled_algorithm_the_simulator_rejects_falls_back_to_the_estimate_with_a_note():
    """PAT's schedule of a 1 GB AllGather on a DP group of a 2:1 Clos (one GPU of each of 16 nodes)
    is rejected by the simulator; the report keeps NCCL's estimate for PAT and says why instead of
    failing (before, `flowride synth` ended in a traceback there)."""
    from flowride.topology.fabrics import build_fabric
    from flowride.topology.group import group_topology

    g = group_topology(build_fabric("dgx-h100", 16, "clos", oversubscription=2.0), [8 * i for i in range(16)])
    model = model_nccl(g, "allgather", 10**9)
    assert model.algorithms["pat"].how == "tuning model" and model.algorithms["ring"].how == "simulated"
    assert len(model.notes) == 1 and model.notes[0].startswith("pat: its schedule was left out")
    assert model.report()["notes"] == model.notes
