"""Issue #18 part 4: synthesis for process groups (``--ranks``, ``--relay``), a topology transform
(:mod:`flowride.topology.group`) under an unchanged synthesis stack.

Hand-checked cases: a 4-GPU ring with the group {0, 2} (relay off refused; relay on: two
store-and-forward hops), and the chassis quad 0-3 of a DGX-1 with relay off (AlltoAll ingress).
Property: on random topologies and random member subsets the group's bounds never exceed the
verified finish, every member's demand is met, and no send touches a dropped node.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tests.test_reductions import topologies

from clirun import assert_clean_error, cli
from flowride.api import synthesize
from flowride.cli import main
from flowride.errors import InputError
from flowride.program import check_program, lower, read_msccl, write_msccl
from flowride.schedule.ir import Schedule, load_schedule
from flowride.synth.reach import epoch_distances
from flowride.topology import dgx1, ndv2, ring, save_topology, switch
from flowride.topology.builtins import DGX1_ADJ
from flowride.topology.group import (
    format_ranks,
    group_info,
    group_topology,
    parse_group,
    relay_ranks,
    select_group,
)
from flowride.topology.io import load_topology
from flowride.topology.timing import epoch_timing
from synth_helpers import refused_here

MB = 1_000_000

# ---------------------------------------------------------------------------- parse_group


@pytest.mark.parametrize(("text", "n", "want"), [
    ("0,2,4,6", 8, (0, 2, 4, 6)),
    ("0-3", 8, (0, 1, 2, 3)),
    ("0,2,5-7", 8, (0, 2, 5, 6, 7)),
    (" 6 , 1 ", 8, (6, 1)),  # group order is the order written: member r is rank r of the group
    ("every:8", 32, (0, 8, 16, 24)),
    ("every:8+1", 32, (1, 9, 17, 25)),
    ("every:2+1", 8, (1, 3, 5, 7)),
    ("every:1", 3, (0, 1, 2)),
    ("0-1,every:4+2", 8, (0, 1, 2, 6)),
])
def test_parse_group(text, n, want):
    assert parse_group(text, n) == want
    assert parse_group(format_ranks(want), n) == want


@pytest.mark.parametrize(("text", "needles"), [
    ("0,99", ("rank 99 is outside 0..7", "below 8")),
    ("0-9", ("'0-9'", "rank 8 is outside")),
    ("every:0", ("'every:0'", "at least 1")),
    ("every:8+8", ("offset 8 is outside",)),
    ("0", ("names 1 rank", "at least 2")),
    ("every:8", ("names 1 rank",)),
    ("0,1,1", ("rank 1 appears twice",)),
    ("0-3,2", ("rank 2 appears twice", "'0-3'")),
    ("3-1", ("runs backwards", "1-3")),
    ("0,,1", ("empty item",)),
    ("", ("is empty",)),
    ("a,b", ("'a' is not a rank", "every:8")),
    ("every:x", ("'every:x'",)),
    ("-1", ("'-1'",)),
])
def test_parse_group_errors(text, needles):
    with pytest.raises(InputError) as e:
        parse_group(text, 8)
    assert e.value.field == "ranks"
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


# ---------------------------------------------------------------------------- the transform


@pytest.mark.parametrize("topo", [dgx1(), ring(8)], ids=["dgx1", "ring8"])
def test_whole_machine_group_is_the_machine(topo):
    g = select_group(topo, f"0-{len(topo.gpus) - 1}")
    assert g.nodes == topo.nodes and g.links == topo.links and g.buffer_ranks == topo.buffer_ranks
    assert group_info(g) == {"of": topo.name, "ranks": list(range(len(topo.gpus))), "relay": False}
    a, b = synthesize(topo, "allgather", MB), synthesize(g, "allgather", MB)
    assert (a.sim.epochs, a.finish_time_s, a.bounds) == (b.sim.epochs, b.finish_time_s, b.bounds)
    assert a.report()["group"] is None and b.report()["group"]["ranks"] == list(range(len(topo.gpus)))


def test_members_first_in_group_order_and_chunks_per_member():
    g = select_group(dgx1(), "6,0,2,4")
    assert g.gpus == (0, 1, 2, 3) and g.buffer_ranks == 4 and g.params["group"]["nodes"] == [6, 0, 2, 4]
    assert g.name == "dgx1(ranks 6,0,2,4; relay off)"
    # links among the members only: 0-2 (25), 0-4 (50), 2-6 (50), 4-6 (25), both ways
    assert len(g.links) == 8
    for lk in g.links:
        s, d = (6, 0, 2, 4)[lk.src], (6, 0, 2, 4)[lk.dst]
        assert lk.bandwidth_GBps == DGX1_ADJ[s][d]
    o = synthesize(g, "allgather", MB)
    assert o.demand.chunk_bytes == MB / 4  # the buffer is split among the 4 members


def test_dead_end_switches_dropped():
    """h100 x2, ranks 0 and 8 (rail 0 across chassis): the NVSwitches and the other rails would be
    dead ends, so only rail 0 stays."""
    from flowride.topology import h100

    g = select_group(h100(2), "0,8")
    assert len(g.gpus) == 2 and len(g.switches) == 1 and g.nodes[2].label == "rail0" and len(g.links) == 4


def test_group_of_a_group_speaks_of_the_base():
    inner = select_group(ring(8), "0-5", relay=True)
    g = select_group(inner, "1,3,5", relay=True)
    info = g.params["group"]
    assert info["of"] == "ring" and info["ranks"] == [1, 3, 5] and info["relay"]
    assert g.name == "ring(ranks 1,3,5; relay on)"
    assert relay_ranks(g) == (0, 2, 4, 6, 7)
    assert [info["nodes"][v] for v in g.gpus] == [1, 3, 5]


def test_relay_refused_on_the_published_model():
    with pytest.raises(InputError) as e:
        select_group(ndv2(2, teccl_compat=True), "1,2", relay=True)
    assert e.value.field == "relay" and "--relay off" in str(e.value)


# ---------------------------------------------------------------------------- hand-checked cases


def test_ring4_ranks_0_2_relay_off_is_refused():
    with pytest.raises(InputError) as e:
        select_group(ring(4), "0,2")
    assert e.value.field == "ranks" and "--relay on" in str(e.value) and "outside the group" in str(e.value)


def test_ring4_ranks_0_2_relay_on_by_hand():
    """ring(4): 50 GB/s, alpha 0.7 us per link. Group {0, 2}, AllGather 1 MB: chunk = 1 MB / 2
    members = 500 kB; fast epoch = 500 kB / 50 GB/s = 10 us; alpha/tau = 0.07 <= 0.1, so a = 0,
    and b = 0. GPUs 0 and 2 are not adjacent: every chunk crosses relay 1 or 3, two hops, and a
    GPU stores a chunk before it forwards it, so 2 epochs = 2 x 10 us = 20 us; the epoch bound
    (latency) is the same 2, so 20 us is proven minimal. (A relay modelled as one switch would
    cut through in 1 epoch, 10 us: less than two transmissions of 500 kB at 50 GB/s.)"""
    g = select_group(ring(4), "0,2", relay=True)
    assert g.gpus == (0, 1) and relay_ranks(g) == (1, 3) and g.buffer_ranks == 2
    t = epoch_timing(g, 500e3, "fast")
    assert t.tau == pytest.approx(10e-6)
    assert epoch_distances(g, t)[0, 1] == 2 and epoch_distances(g, t)[1, 0] == 2
    o = synthesize(g, "allgather", MB)
    assert o.sim.valid and o.sim.epochs == 2 and o.finish_time_s == pytest.approx(20e-6)
    assert o.epoch_bounds["latency"] == 2 and o.status == "optimal"
    rep = o.report()
    assert rep["group"] == {"of": "ring", "ranks": [0, 2], "relay": True}
    # the seconds bounds: GPU 2 takes 500 kB in over two 50 GB/s links (5 us); latency 2 x 0.7 us
    assert rep["lower_bounds_us"]["ingress"] == pytest.approx(5.0)
    assert rep["lower_bounds_us"]["latency"] == pytest.approx(1.4, abs=1e-5)
    # every delivery went through a relay: the member link 0 -> 2 does not exist
    assert all(not (lk.src in g.gpus and lk.dst in g.gpus) for lk in g.links)


def test_dgx1_quad_alltoall_relay_off_by_hand():
    """dgx1 ranks 0-3 (one quad of the cube mesh), relay off: the links among 0..3 stay (0-1 50,
    0-2 25, 0-3 25, 1-2 25, 1-3 50, 2-3 50 GB/s, both ways). AlltoAll 1 MB: each member sends
    1 MB / 4 = 250 kB to each of 3 peers, so each receives 750 kB. In-bandwidth inside the quad:
    GPU 0: 50+25+25 = 100, GPU 1: 125, GPU 2: 100, GPU 3: 125 GB/s: ingress = 750 kB / 100 GB/s
    = 7.5 us (on the whole DGX-1 GPU 0 takes 7 x 125 kB in over 150 GB/s: 5.83 us)."""
    g = select_group(dgx1(), "0-3")
    assert len(g.links) == 12
    assert {(lk.src, lk.dst): lk.bandwidth_GBps for lk in g.links} == {
        (i, j): DGX1_ADJ[i][j] for i in range(4) for j in DGX1_ADJ[i] if j < 4}
    o = synthesize(g, "alltoall", MB)
    rep = o.report()
    assert rep["lower_bounds_us"]["ingress"] == pytest.approx(7.5)
    assert o.sim.valid and rep["finish_time_us"] >= rep["lower_bound_us"] >= 7.5 - 1e-9
    full = synthesize(dgx1(), "alltoall", MB).report()
    assert full["lower_bounds_us"]["ingress"] == pytest.approx(7 * 125e3 / 150e9 * 1e6)


def test_reductions_through_relays():
    """A relay topology is not symmetric (the relay's internal link runs one way), so AllReduce
    takes the reversed-topology route; its ring baseline is built with the forward timing."""
    g = select_group(ring(4), "0,2", relay=True)
    for coll in ("reducescatter", "allreduce"):
        o = synthesize(g, coll, MB)
        assert o.sim.valid and o.baseline.valid, o.baseline.first_violation
        assert o.finish_time_s >= o.bounds.best_s and o.report()["group"]["relay"]


# ---------------------------------------------------------------------------- the property


@settings(max_examples=40)
@given(topo=topologies(max_gpus=6), data=st.data())
def test_group_bounds_below_finish_and_no_dropped_node(topo, data):
    n = len(topo.gpus)
    relay = data.draw(st.booleans(), label="relay")
    members = data.draw(st.lists(st.integers(0, n - 1), unique=True, min_size=2, max_size=n - 1 if relay else n), label="members")
    coll = data.draw(st.sampled_from(["allgather", "alltoall"]), label="collective")
    try:
        g = group_topology(topo, members, relay)
    except InputError as e:  # only relay off may be refused, and only when the members are cut apart
        assert not relay and e.field == "ranks"
        event("relay off refused: members cut apart")
        return
    event(f"relay {'on' if relay else 'off'}, {coll}, {len(relay_ranks(g))} relay(s)")
    info = g.params["group"]
    orig = info["nodes"]
    dropped = {topo.gpus[r] for r in range(n) if r not in members} if not relay else set()
    assert [orig[v] for v in g.gpus] == [topo.gpus[m] for m in members]
    o = synthesize(g, coll, MB, method="trees" if coll == "allgather" else "lp", time_limit=10)
    assert o.sim.valid
    assert set(o.demand.needs()) == set(g.gpus)  # every member, and only members, has demand
    assert o.finish_time_s >= o.bounds.best_s * (1 - 1e-9)
    assert o.sim.epochs >= o.search.lower
    relay_links = {(lk.src, lk.dst) for lk in g.links if orig[lk.src] == orig[lk.dst]}
    for s in o.schedule.sends:
        lk = g.links[s.link]
        a, b = orig[lk.src], orig[lk.dst]
        assert a not in dropped and b not in dropped
        if (lk.src, lk.dst) not in relay_links:  # a real link of the base topology, unchanged
            base = topo.links[topo.link_index[(a, b)]]
            assert (base.bandwidth_GBps, base.alpha_s) == (lk.bandwidth_GBps, lk.alpha_s)


# ---------------------------------------------------------------------------- export and run


def test_lower_refuses_relays_accepts_relay_off(tmp_path):
    on = synthesize(select_group(ring(4), "0,2", relay=True), "allgather", MB).schedule
    with pytest.raises(InputError) as e:
        lower(on)
    assert "relays through GPU(s) 1, 3 outside the group" in str(e.value) and "--relay off" in str(e.value)
    # the labels survive JSON: a saved relay schedule is still refused, and still verifies
    on.save(tmp_path / "on.json")
    with pytest.raises(InputError):
        lower(load_schedule(tmp_path / "on.json"))
    off = synthesize(select_group(switch(6), "1,3,5"), "allgather", MB).schedule
    prog = lower(off)
    assert prog.ngpus == 3
    write_msccl(prog, tmp_path / "off.xml")
    back = read_msccl(tmp_path / "off.xml")
    assert back.ngpus == 3 and check_program(back) == []


def test_relays_allowed_but_unused_are_no_reason_to_refuse(tmp_path):
    """dgx1's quad 0-3 is linked within itself: with relays allowed the schedule uses none, so
    it exports and runs like a relay-off one; the report names the relays all the same."""
    out = synthesize(select_group(dgx1(), "0-3", relay=True), "allgather", MB)
    links = out.schedule.topology.links
    touched = {v for s in out.schedule.sends for v in (links[s.link].src, links[s.link].dst)}
    assert not relay_ranks(out.schedule.topology, touched), "the quad needs no relay for an AllGather"
    prog = lower(out.schedule)
    assert prog.ngpus == 4
    write_msccl(prog, tmp_path / "q.xml")
    assert check_program(read_msccl(tmp_path / "q.xml")) == []
    assert out.report()["switch_model"].endswith("relays outside the group")


def test_cli_export_run_refusal_and_relay_off_export(tmp_path, capsys):
    """Export's refusal and the relay-off export end to end; verify and run's refusal through
    ``main`` in this process (the same code, no interpreter start each)."""
    on = synthesize(select_group(ring(4), "0,2", relay=True), "allgather", MB).schedule
    on.save(tmp_path / "on.json")
    assert main(["verify", str(tmp_path / "on.json")]) == 0
    assert_clean_error(cli("export", tmp_path / "on.json", "--msccl", tmp_path / "on.xml"), 2,
                       "relays through GPU(s) 1, 3 outside the group", "--relay off")
    refused_here(capsys, ["run", tmp_path / "on.json"], "relays through GPU(s) 1, 3 outside the group", "--relay off")
    assert not (tmp_path / "on.xml").exists()
    off = synthesize(select_group(dgx1(), "0-3"), "allgather", MB).schedule
    off.save(tmp_path / "off.json")
    r = cli("export", tmp_path / "off.json", "--msccl", tmp_path / "off.xml")
    assert r.code == 0 and "on 4 GPUs" in r.out, r.err
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "off.xml")]) == 0
    assert capsys.readouterr().out.startswith("valid")


# ---------------------------------------------------------------------------- CLI end to end


def test_cli_synth_with_ranks(tmp_path):
    """What is checked holds whatever the (short) limit cut off: the chunk sweep need not run its default minute."""
    rep, out = tmp_path / "r.json", tmp_path / "s.json"
    r = cli("synth", "-t", "dgx1", "-c", "allgather", "-s", "1MB", "--ranks", "0,2,4,6", "--time-limit", "2", "--report", rep,
            "--out", out)
    assert r.code == 0, r.err
    assert "process group" in r.out and "ranks 0,2,4,6 of dgx1; relay off" in r.out
    data = json.loads(rep.read_text())
    assert data["group"] == {"of": "dgx1", "ranks": [0, 2, 4, 6], "relay": False}
    assert data["gpus"] == 4 and data["verified"] and data["finish_time_us"] >= data["lower_bound_us"]
    assert load_schedule(out).topology.name == "dgx1(ranks 0,2,4,6; relay off)"


@pytest.mark.parametrize(("ranks", "needles"), [
    ("0,99", ("--ranks", "rank 99 is outside 0..7")),
    ("every:0", ("--ranks", "every:0", "at least 1")),
    ("0", ("--ranks", "at least 2")),
])
def test_cli_ranks_errors(capsys, ranks, needles):
    """Through ``main`` in this process (--ranks refused end to end: test_cli_relay_errors_and_saved_group_topology)."""
    refused_here(capsys, ["synth", "-t", "dgx1", "-s", "1MB", "--ranks", ranks], *needles)


def test_cli_relay_errors_and_saved_group_topology(tmp_path, capsys):
    refused_here(capsys, ["synth", "-t", "dgx1", "-s", "1MB", "--relay", "on"], "--relay", "--ranks")
    assert_clean_error(cli("synth", "-t", "ring", "--n", "4", "-s", "1MB", "--ranks", "0,2"), 2, "--ranks", "--relay on")
    topo = tmp_path / "g.json"
    r = cli("topology", "-t", "ring", "--n", "4", "--ranks", "0,2", "--relay", "on", "-o", topo)
    assert r.code == 0 and "2 GPUs" in r.out, r.err
    g = load_topology(topo)
    assert relay_ranks(g) == (1, 3) and g.name == "ring(ranks 0,2; relay on)"
    # the saved group synthesizes as any topology file does, with the same result
    again = synthesize(g, "allgather", MB)
    assert again.sim.epochs == 2 and isinstance(again.schedule, Schedule)
    save_topology(g, tmp_path / "g2.json")
    assert load_topology(tmp_path / "g2.json").links == g.links


def test_a_relaying_reduce_scatter_over_rails_is_built_not_crashed():
    """Packed trees that fork at a rail switch (which cannot copy) over a one-chunk slot used to
    raise out of the trees method; that shape is now skipped and the others build the schedule."""
    from flowride.api import synthesize
    from flowride.schedule.simulate import simulate
    from flowride.topology.fabrics import build_fabric

    topo = group_topology(build_fabric("dgx-h100", 4, "rail"), range(0, 32, 8), relay=True)
    out = synthesize(topo, "reducescatter", 10**9, chunks=1, time_limit=8, nccl=False)
    assert simulate(out.schedule).valid and out.finish_time_s >= out.bounds.best_s
