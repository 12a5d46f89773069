"""Clusters as topologies (topology/fabrics.py): hand-counted links and bandwidths per node type and
network, the JSON form, the CLI, bad input refused in one line, and the shift symmetries
(topology/shifts.py) the packings rely on."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from clirun import cli
from flowride.errors import InputError
from flowride.topology.builtins import dgx1, dgx2, h100, mi250, ndv2, resolve_topology, switch
from flowride.topology.fabrics import NODE_TYPES, FabricSpec, fabric, node_type_table, parse_nic
from flowride.topology.io import topology_from_dict, topology_to_dict
from flowride.topology.shifts import shift_symmetry


def _bw(topo, kind_src: str, kind_dst: str) -> Counter:
    """Bandwidths of the links from nodes labelled like ``kind_src`` to ones like ``kind_dst``."""
    out = Counter()
    for lk in topo.links:
        a, b = topo.nodes[lk.src].label, topo.nodes[lk.dst].label
        if kind_src in a and kind_dst in b:
            out[lk.bandwidth_GBps] += 1
    return out


# (node type, GPUs per node, in-node bandwidth per GPU per direction, multicast, NICs per node, NIC GB/s)
HAND_COUNTED = [
    ("dgx-a100", 8, 300.0, False, 8, 25.0),
    ("a800", 8, 200.0, False, 8, 25.0),
    ("dgx-h100", 8, 450.0, True, 8, 50.0),
    ("h800", 8, 200.0, True, 8, 50.0),
    ("hgx-b200", 8, 900.0, True, 8, 50.0),
]


@pytest.mark.parametrize("node,per,nvlink,copy,nics,nic", HAND_COUNTED)
def test_nvswitch_node_types_on_rails(node, per, nvlink, copy, nics, nic):
    t = fabric(FabricSpec(node, 3, "rail"))
    gpus = 3 * per
    assert len(t.gpus) == gpus
    assert len(t.switches) == 3 + nics  # one NVSwitch per node, one switch per rail
    assert len(t.links) == 2 * gpus + 2 * gpus  # every GPU to its NVSwitch and to its rail, both ways
    assert _bw(t, ".g", "nvswitch") == Counter({nvlink: gpus}) and _bw(t, "nvswitch", ".g") == Counter({nvlink: gpus})
    assert _bw(t, ".g", "rail") == Counter({nic: gpus}) and _bw(t, "rail", ".g") == Counter({nic: gpus})
    assert all(t.nodes[w].copy == copy for w in t.switches if "nvswitch" in t.nodes[w].label)
    assert not any(t.nodes[w].copy for w in t.switches if "rail" in t.nodes[w].label)  # InfiniBand forwards
    rail_of = {t.nodes[lk.src].label: t.nodes[lk.dst].label for lk in t.links if "rail" in t.nodes[lk.dst].label}
    assert rail_of["n2.g5"] == "rail5" and rail_of["n0.g0"] == "rail0"  # NIC k of every node on rail k
    assert t.switching == "cut-through"


def test_mi300x_is_a_full_mesh_of_64_GBps_links():
    t = fabric(FabricSpec("mi300x", 2))
    inside = [lk for lk in t.links if t.nodes[lk.src].group == t.nodes[lk.dst].group and t.nodes[lk.src].is_gpu and t.nodes[lk.dst].is_gpu]
    assert len(inside) == 2 * 8 * 7 and {lk.bandwidth_GBps for lk in inside} == {64.0}
    assert sum(lk.bandwidth_GBps for lk in inside if lk.src == 0) == 448.0  # AMD's 896 GB/s both ways
    assert not [w for w in t.switches if t.nodes[w].group is not None]  # no switch inside


def test_one_nic_per_two_gpus_is_a_nic_switch_on_pcie():
    t = fabric(FabricSpec("a800", 4, "clos", nic_share=2))
    nic_switches = [w for w in t.switches if ".nic" in t.nodes[w].label]
    assert len(nic_switches) == 4 * 4
    for w in nic_switches:
        gpus = sorted(lk.src for lk in t.links if lk.dst == w and t.nodes[lk.src].is_gpu)
        assert len(gpus) == 2 and gpus[1] == gpus[0] + 1 and gpus[0] % 2 == 0
        assert {lk.bandwidth_GBps for lk in t.links if lk.dst == w and t.nodes[lk.src].is_gpu} == {31.5}  # PCIe Gen4 x16
        assert [lk.bandwidth_GBps for lk in t.links if lk.src == w and "leaf" in t.nodes[lk.dst].label] == [25.0]


def test_clos_leaves_spines_and_oversubscription():
    t = fabric(FabricSpec("dgx-h100", 6, "clos", leaf_nodes=3, spines=4, oversubscription=2.0))
    leaves = [w for w in t.switches if t.nodes[w].label.startswith("leaf")]
    spines = [w for w in t.switches if t.nodes[w].label.startswith("spine")]
    assert len(leaves) == 2 and len(spines) == 4
    down = 3 * 8 * 50.0  # three nodes' NICs per leaf
    up = [lk.bandwidth_GBps for lk in t.links if lk.src in leaves and lk.dst in spines]
    assert len(up) == 2 * 4 and all(u == pytest.approx(down / 2 / 4) for u in up)  # 2:1, spread over 4 spines


def test_rails_fewer_than_nics_take_nic_k_mod_rails():
    t = fabric(FabricSpec("dgx-a100", 2, "rail", rails=2))  # ForestColl's A100 model: even and odd NICs
    rails = [w for w in t.switches if t.nodes[w].label.startswith("rail")]
    assert len(rails) == 2
    for r, w in enumerate(rails):
        members = sorted(lk.src for lk in t.links if lk.dst == w)
        assert members == [g for g in t.gpus if g % 8 % 2 == r]


def test_single_switch_and_one_node():
    t = fabric(FabricSpec("dgx-h100", 3, "single"))
    assert len([w for w in t.switches if t.nodes[w].label == "switch"]) == 1
    one = fabric(FabricSpec("dgx-h100", 1))
    assert len(one.gpus) == 8 and len(one.switches) == 1 and len(one.links) == 16


def test_te_ccl_node_types_keep_their_inside():
    """dgx2, ndv2 and mi250 nodes are the built-ins' chassis, with a network of their own."""
    d = fabric(FabricSpec("dgx2", 2))
    assert _bw(d, ".g", "nvswitch") == Counter({125.0: 32}) and len([w for w in d.switches if ".nic" in d.nodes[w].label]) == 16
    n = fabric(FabricSpec("ndv2", 2))
    one = ndv2(1)
    inside = sorted((lk.src, lk.dst, lk.bandwidth_GBps) for lk in n.links if n.nodes[lk.src].is_gpu and n.nodes[lk.dst].is_gpu and lk.src < 8)
    assert inside == sorted((lk.src, lk.dst, lk.bandwidth_GBps) for lk in one.links)
    m = fabric(FabricSpec("mi250", 2))
    assert len(m.gpus) == 32 and sum(1 for lk in m.links if m.nodes[lk.src].is_gpu and m.nodes[lk.dst].is_gpu) == 2 * sum(1 for _ in mi250(1).links)


def test_every_node_type_names_its_sources():
    for nt in NODE_TYPES.values():
        assert nt.sources and all(len(s) > 20 for s in nt.sources), nt.name
    rows = node_type_table()
    assert {r["node"] for r in rows} == set(NODE_TYPES) and all(r["sources"] for r in rows)


@pytest.mark.parametrize("text,gbps", [("400", 400.0), ("400G", 400.0), ("400Gbps", 400.0), ("200Gb/s", 200.0),
                                       ("50GB/s", 400.0), ("800gbps", 800.0), (100, 100.0)])
def test_nic_speeds(text, gbps):
    assert parse_nic(text) == gbps


@pytest.mark.parametrize("spec,field", [
    (FabricSpec("dgx-h200"), "node"), (FabricSpec("dgx-h100", 0), "nodes"), (FabricSpec("dgx-h100", 2, "torus"), "network"),
    (FabricSpec("dgx-h100", 2, nic_share=3), "nic_share"), (FabricSpec("dgx-h100", 2, oversubscription=0.5), "oversubscription"),
    (FabricSpec("dgx-h100", 1024), "nodes"), (FabricSpec("mi300x", 2, multicast=True), "multicast"),
])
def test_bad_fabrics_name_the_field(spec, field):
    with pytest.raises(InputError) as e:
        fabric(spec)
    assert e.value.field == field


def test_fabric_json_builds_the_same_topology_and_round_trips():
    t = resolve_topology("fabric", {"node": "dgx-h100", "nodes": 4, "network": "rail", "nic": "400Gbps"})
    j = topology_from_dict({"fabric": {"node": "dgx-h100", "nodes": 4, "network": "rail", "nic": "400Gbps"}})
    assert j.links == t.links and j.nodes == t.nodes
    back = topology_from_dict(json.loads(json.dumps(topology_to_dict(t))))
    assert back.links == t.links and back.switching == "cut-through"
    sf = topology_from_dict({"fabric": {"node": "a800", "nodes": 2, "nic_share": 2}, "switching": "store-and-forward"})
    assert sf.switching == "store-and-forward"
    for bad, field in (({"fabric": {"node": "dgx-h100", "nodez": 2}}, "fabric.nodez"),
                       ({"fabric": {"node": "dgx-h100", "nic": "fast"}}, "fabric.nic"),
                       ({"fabric": {"node": "dgx-h100"}, "nodes": []}, "topology.nodes"),
                       ({"fabric": {"node": "dgx-h100"}, "switching": "teleport"}, "switching")):
        with pytest.raises(InputError) as e:
            topology_from_dict(bad)
        assert e.value.field == field


def test_cli_builds_fabrics_and_refuses_bad_ones_in_one_line(tmp_path):
    r = cli("topology", "-t", "fabric", "--node", "dgx-h100", "--nodes", "16", "--network", "rail", "--nic", "400Gbps",
            "-o", tmp_path / "f.json")
    assert r.code == 0, r.err
    d = json.loads((tmp_path / "f.json").read_text())
    assert sum(nd["kind"] == "gpu" for nd in d["nodes"]) == 128 and d["switching"] == "cut-through"
    for args, needle in ((["--node", "dgx-h200"], "--node: unknown node type"), (["--node", "a800", "--nic-share", "3"], "--nic-share"),
                         (["--node", "dgx-h100", "--nic", "fast"], "--nic: 'fast' is not a NIC speed"),
                         (["--node", "dgx-h100", "--network", "torus"], "--network")):
        r = cli("topology", "-t", "fabric", *args)
        assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, r.err
    r = cli("topology", "-t", "dgx2", "--node", "dgx-h100")
    assert r.code == 2 and "--node: is not a parameter of dgx2" in r.err


@pytest.mark.parametrize("make,elements,reps", [
    (lambda: fabric(FabricSpec("dgx-h100", 4)), 32, 1),
    (lambda: fabric(FabricSpec("a800", 4, "clos", nic_share=2)), 8, 4),
    (lambda: fabric(FabricSpec("dgx-a100", 2, rails=2)), 16, 1),
    (lambda: dgx2(4), 32, 2),
    (lambda: mi250(2), 4, 8),
    (lambda: h100(2), 16, 1),
    (lambda: switch(8), 8, 1),
    (dgx1, 2, 4),
])
def test_shift_symmetries_are_automorphisms_free_on_gpus(make, elements, reps):
    t = make()
    s = shift_symmetry(t)
    assert len(s.perms) == elements and len(s.reps) == reps
    links = {(lk.src, lk.dst): (lk.bandwidth_GBps, lk.alpha_s, t.nodes[lk.src].copy, t.nodes[lk.dst].copy) for lk in t.links}
    for p in s.perms:
        assert sorted(p) == list(range(t.num_nodes))
        for (a, b), v in links.items():
            assert links[(p[a], p[b])] == v
    assert sorted(p[r] for p in s.perms for r in s.reps) == list(t.gpus)  # every GPU exactly once: a free action


def test_no_symmetry_claimed_where_there_is_none():
    from flowride.topology.model import Link, Node, Topology

    t = Topology("odd", (Node(0), Node(1), Node(2)), (Link(0, 1, 50.0), Link(1, 2, 25.0), Link(2, 0, 50.0), Link(1, 0, 10.0)))
    assert shift_symmetry(t) is None
