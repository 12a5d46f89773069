"""Topologies: built-in shapes and numbers, validation, JSON round trips, build_topology."""

import json
import math
from collections import Counter

import pytest

from flowride.errors import InputError
from flowride.topology import (
    BUILTINS,
    Link,
    Node,
    Topology,
    build_topology,
    dgx1,
    dgx2,
    full,
    load_topology,
    mesh,
    mi250,
    ndv2,
    ring,
    save_topology,
    switch,
    topology_from_dict,
    topology_to_dict,
    torus,
)

US = 1e-6


def out_neighbours(topo: Topology) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {v: set() for v in range(topo.num_nodes)}
    for lk in topo.links:
        out[lk.src].add(lk.dst)
    return out


def link(topo: Topology, u: int, v: int) -> Link:
    return topo.links[topo.link_index[(u, v)]]


def no_duplicate_links(topo: Topology) -> bool:
    pairs = [(lk.src, lk.dst) for lk in topo.links]
    return len(pairs) == len(set(pairs))


# ------------------------------------------------------------------------------------ builtins

# (builder, GPUs, switches, directed links)
COUNTS = {
    "dgx1": (dgx1, 8, 0, 32),
    "ndv2-1": (lambda: ndv2(1), 8, 0, 32),
    "ndv2-2": (lambda: ndv2(2), 16, 0, 66),  # 2 x 32 NVLink + 0->9 + 8->1
    "ndv2-3": (lambda: ndv2(3), 24, 1, 102),  # 3 x 32 + 3 in + 3 out of the NIC switch
    "ndv2-4": (lambda: ndv2(4), 32, 1, 136),
    "ndv2-2-compat": (lambda: ndv2(2, teccl_compat=True), 15, 1, 66),
    "ndv2-3-compat": (lambda: ndv2(3, teccl_compat=True), 23, 2, 102),
    "dgx2-1": (lambda: dgx2(1), 16, 1, 32),  # 16 GPUs x 2 directions
    "dgx2-2": (lambda: dgx2(2), 32, 2, 80),  # 2 x 32 + 8 IB links each way
    "dgx2-3": (lambda: dgx2(3), 48, 11, 144),  # 3 x 32 + 8 rails x 3 chassis x 2
    "mi250-1": (lambda: mi250(1), 16, 0, 56),  # sum of the adjacency degrees
    "mi250-2": (lambda: mi250(2), 32, 17, 208),  # 2 x 56 + 16 NICs x 3 pairs x 2
    "ring-2": (lambda: ring(2), 2, 0, 2),
    "ring-5": (lambda: ring(5), 5, 0, 10),
    "mesh-3x4": (lambda: mesh(3, 4), 12, 0, 34),  # (3*3 + 2*4) undirected edges x 2
    "mesh-1x2": (lambda: mesh(1, 2), 2, 0, 2),
    "torus-4x4": (lambda: torus(4, 4), 16, 0, 64),
    "torus-3x3": (lambda: torus(3, 3), 9, 0, 36),
    "torus-2x3": (lambda: torus(2, 3), 6, 0, 18),  # no wrap along the side of 2
    "torus-2x2": (lambda: torus(2, 2), 4, 0, 8),
    "torus-16x16": (lambda: torus(16, 16), 256, 0, 1024),
    "full-4": (lambda: full(4), 4, 0, 12),
    "full-3": (lambda: full(3), 3, 0, 6),
    "switch-5": (lambda: switch(5), 5, 1, 10),
    "switch-3-copy": (lambda: switch(3, copy=True), 3, 1, 6),
}


@pytest.mark.parametrize("key", sorted(COUNTS))
def test_builtin_counts(key):
    builder, gpus, switches, links = COUNTS[key]
    t = builder()
    assert len(t.gpus) == gpus
    assert len(t.switches) == switches
    assert len(t.links) == links
    assert t.num_nodes == gpus + switches
    assert no_duplicate_links(t)
    assert t.summary() == f"{t.name}: {gpus} GPUs, {switches} switches, {links} links"


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_example_builds(name):
    spec = BUILTINS[name]
    t = build_topology(name, **spec.example)
    assert isinstance(t, Topology)
    assert len(t.gpus) >= 2
    # GPUs come first, then switches
    assert list(t.gpus) == list(range(len(t.gpus)))
    assert list(t.switches) == list(range(len(t.gpus), t.num_nodes))


def test_dgx1_adjacency_and_bandwidths():
    t = dgx1()
    assert t.name == "dgx1"
    nbrs = out_neighbours(t)
    assert all(len(nbrs[g]) == 4 for g in t.gpus)
    assert link(t, 0, 1).bandwidth_GBps == 50
    assert link(t, 0, 2).bandwidth_GBps == 25
    assert link(t, 0, 4).bandwidth_GBps == 50
    assert link(t, 6, 7).bandwidth_GBps == 50
    assert (0, 5) not in t.link_index and (0, 7) not in t.link_index
    assert Counter(lk.bandwidth_GBps for lk in t.links) == {50.0: 16, 25.0: 16}
    # symmetric: every link has its reverse with the same bandwidth
    for lk in t.links:
        assert link(t, lk.dst, lk.src).bandwidth_GBps == lk.bandwidth_GBps
    assert all(lk.alpha_s == pytest.approx(0.7 * US) for lk in t.links)


def test_ndv2_single_chassis_is_dgx1():
    assert ndv2(1).links == dgx1().links
    assert ndv2(1).nodes == dgx1().nodes
    assert ndv2(1).name == "dgx1"


def test_ndv2_two_chassis_infiniband_links():
    t = ndv2(2)
    assert t.name == "ndv2"
    for u, v in ((0, 9), (8, 1)):
        lk = link(t, u, v)
        assert lk.bandwidth_GBps == 12.5
        assert lk.alpha_s == pytest.approx(1.3e-6)
    # directed: no way back on the same pair
    assert (9, 0) not in t.link_index and (1, 8) not in t.link_index
    # chassis 1 repeats chassis 0's NVLink pattern
    assert link(t, 8, 9).bandwidth_GBps == 50 and link(t, 8, 10).bandwidth_GBps == 25
    cross = [lk for lk in t.links if (lk.src < 8) != (lk.dst < 8)]
    assert len(cross) == 2
    assert t.groups == {0: tuple(range(8)), 1: tuple(range(8, 16))}


@pytest.mark.parametrize("chassis", [3, 4])
def test_ndv2_many_chassis_nic_switch(chassis):
    t = ndv2(chassis)
    (nic,) = t.switches
    assert nic == 8 * chassis
    # a NIC switch forwards, it does not replicate (the physical default); the published model's
    # switch copies (teccl_compat)
    assert not t.nodes[nic].copy
    assert ndv2(chassis, teccl_compat=True).nodes[nic].copy
    assert sorted(lk.src for lk in t.links if lk.dst == nic) == [8 * c for c in range(chassis)]
    assert sorted(lk.dst for lk in t.links if lk.src == nic) == [8 * c + 1 for c in range(chassis)]
    for lk in t.links:
        if nic in (lk.src, lk.dst):
            assert lk.bandwidth_GBps == 12.5
            assert lk.alpha_s == pytest.approx(1.3e-6)


def test_ndv2_teccl_compat():
    t = ndv2(2, teccl_compat=True)
    assert t.name == "ndv2-teccl-compat"
    assert t.nominal_gpus == 16 and t.buffer_ranks == 16
    assert not t.nodes[0].is_gpu and t.nodes[0].copy
    assert 0 not in t.gpus and t.switches == (0,)
    # the same links as the plain 2-chassis model
    assert t.links == ndv2(2).links
    # one chassis: nothing to emulate
    assert ndv2(1, teccl_compat=True).nominal_gpus is None
    assert len(ndv2(1, teccl_compat=True).gpus) == 8


def test_dgx2():
    one = dgx2(1)
    (sw,) = one.switches
    assert sw == 16 and not one.nodes[sw].copy
    assert all(lk.bandwidth_GBps == 125 for lk in one.links)
    assert all(lk.alpha_s == pytest.approx(0.35e-6) for lk in one.links)
    assert all(out_neighbours(one)[g] == {sw} for g in one.gpus)
    two = dgx2(2)
    ib = [lk for lk in two.links if lk.bandwidth_GBps == 12.5]
    assert len(ib) == 16
    assert all(lk.alpha_s == pytest.approx(2.6e-6) for lk in ib)
    # odd local GPU l -> local GPU l-1 of the other chassis
    odd = range(1, 16, 2)
    assert {(lk.src, lk.dst) for lk in ib} == {(g, 16 + g - 1) for g in odd} | {(16 + g, g - 1) for g in odd}
    three = dgx2(3)
    rails = [s for s in three.switches if three.nodes[s].label.startswith("rail")]
    assert len(rails) == 8
    for r, sw in enumerate(rails):
        assert sorted(lk.src for lk in three.links if lk.dst == sw) == [16 * c + 2 * r + 1 for c in range(3)]
        assert sorted(lk.dst for lk in three.links if lk.src == sw) == [16 * c + 2 * r for c in range(3)]


def test_mi250():
    t = mi250(1)
    assert link(t, 0, 1).bandwidth_GBps == 200
    assert link(t, 0, 4).bandwidth_GBps == 100
    assert link(t, 0, 8).bandwidth_GBps == 50
    assert link(t, 15, 14).bandwidth_GBps == 200
    for lk in t.links:  # the published adjacency is symmetric
        assert link(t, lk.dst, lk.src).bandwidth_GBps == lk.bandwidth_GBps
    t2 = mi250(2)
    top = [s for s in t2.switches if t2.nodes[s].label == "global"]
    assert len(top) == 1
    nics = [s for s in t2.switches if s != top[0]]
    assert len(nics) == 16
    for nic in nics:
        nb = out_neighbours(t2)[nic]
        assert top[0] in nb and len(nb) == 3
        assert all(link(t2, nic, v).bandwidth_GBps == 25 for v in nb)


def test_ring():
    t = ring(5)
    assert out_neighbours(t) == {i: {(i + 1) % 5, (i - 1) % 5} for i in range(5)}
    uni = ring(4, bidirectional=False)
    assert {(lk.src, lk.dst) for lk in uni.links} == {(0, 1), (1, 2), (2, 3), (3, 0)}
    assert all(lk.bandwidth_GBps == 50 and lk.alpha_s == pytest.approx(0.7e-6) for lk in t.links)
    custom = ring(3, bandwidth=12.5, alpha_us=2.0)
    assert all(lk.bandwidth_GBps == 12.5 and lk.alpha_s == pytest.approx(2e-6) for lk in custom.links)


def test_mesh_neighbour_counts():
    t = mesh(3, 4)
    nbrs = out_neighbours(t)
    corners = {0, 3, 8, 11}
    interior = {5, 6}
    for g in t.gpus:
        expected = 2 if g in corners else 4 if g in interior else 3
        assert len(nbrs[g]) == expected, g
    assert nbrs[0] == {1, 4}
    assert nbrs[5] == {1, 4, 6, 9}


@pytest.mark.parametrize("rows,cols", [(4, 4), (3, 5), (16, 16)])
def test_torus_every_gpu_has_four_neighbours(rows, cols):
    t = torus(rows, cols)
    assert len(t.links) == 4 * rows * cols
    assert no_duplicate_links(t)
    nbrs = out_neighbours(t)
    for r in range(rows):
        for c in range(cols):
            me = r * cols + c
            assert nbrs[me] == {
                r * cols + (c + 1) % cols,
                r * cols + (c - 1) % cols,
                ((r + 1) % rows) * cols + c,
                ((r - 1) % rows) * cols + c,
            }


def test_torus_side_of_two_has_no_duplicate_wrap():
    assert {(lk.src, lk.dst) for lk in torus(2, 2).links} == {(lk.src, lk.dst) for lk in mesh(2, 2).links}


def test_full_and_switch():
    f = full(4)
    assert out_neighbours(f) == {i: set(range(4)) - {i} for i in range(4)}
    s = switch(4)
    assert s.switches == (4,)
    assert not s.nodes[4].copy
    assert switch(4, copy=True).nodes[4].copy
    assert out_neighbours(s)[4] == {0, 1, 2, 3}
    assert all(out_neighbours(s)[g] == {4} for g in range(4))


@pytest.mark.parametrize(
    "name,params,field",
    [
        ("nope", {}, "topology"),
        ("ring", {"bidirectional": False}, "bidirectional"),
        ("dgx1", {"chassis": 2}, "chassis"),
        ("mesh", {"rows": 2, "cols": 2, "depth": 3}, "depth"),
        ("ndv2", {"chassis": 0}, "chassis"),
        ("dgx2", {"chassis": "2"}, "chassis"),
        ("ring", {"n": 1}, "n"),
        ("torus", {"rows": 0, "cols": 4}, "rows"),
        ("mesh", {"rows": 1, "cols": 1}, "rows x cols"),
    ],
)
def test_build_topology_errors(name, params, field):
    with pytest.raises(InputError) as ei:
        build_topology(name, **params)
    assert ei.value.field == field


def test_build_topology_passes_parameters_and_ignores_none():
    t = build_topology("ring", n=3, bandwidth=None, alpha_us=None)
    assert t.links == ring(3).links
    t = build_topology("torus", rows=3, cols=3, bandwidth=25.0)
    assert all(lk.bandwidth_GBps == 25.0 for lk in t.links)
    assert build_topology("ndv2", chassis=2, teccl_compat=True).nominal_gpus == 16


# ---------------------------------------------------------------------------------- validation


def gpus(n: int) -> tuple[Node, ...]:
    return tuple(Node(i) for i in range(n))


RING3 = (Link(0, 1, 50.0), Link(1, 2, 50.0), Link(2, 0, 50.0))


def test_a_valid_hand_built_topology():
    t = Topology("t", gpus(3), RING3)
    assert t.gpus == (0, 1, 2)
    assert t.buffer_ranks == 3
    assert t.in_links(0) == [2] and t.out_links(0) == [0]


@pytest.mark.parametrize(
    "nodes,links,field,problem",
    [
        (gpus(3), RING3 + (Link(0, 5, 50.0),), "links[3] (0->5).dst", "unknown node"),
        (gpus(3), (Link(-1, 0, 50.0),) + RING3, "links[0] (-1->0).src", "unknown node"),
        (gpus(3), (Link(0, 1, 0.0),) + RING3[1:], "links[0] (0->1).bandwidth_GBps", "outside"),
        (gpus(3), (Link(0, 1, -5.0),) + RING3[1:], "links[0] (0->1).bandwidth_GBps", "outside"),
        (gpus(3), (Link(0, 1, float("nan")),) + RING3[1:], "links[0] (0->1).bandwidth_GBps", "outside"),
        (gpus(3), (Link(0, 1, 1e-300),) + RING3[1:], "links[0] (0->1).bandwidth_GBps", "outside 0.001..1e+06 GB/s"),
        (gpus(3), (Link(0, 1, 1e300),) + RING3[1:], "links[0] (0->1).bandwidth_GBps", "outside 0.001..1e+06 GB/s"),
        (gpus(3), RING3[:2] + (Link(2, 0, 50.0, -1e-6),), "links[2] (2->0).alpha_us", "outside"),
        (gpus(3), RING3[:2] + (Link(2, 0, 50.0, 5.0),), "links[2] (2->0).alpha_us", "outside 0..1e+06 microseconds"),
        (gpus(3), RING3 + (Link(1, 1, 50.0),), "links[3] (1->1)", "self-loop"),
        (gpus(3), RING3 + (Link(0, 1, 25.0),), "links[3] (0->1)", "duplicates"),
        (gpus(3), RING3[:2], "links", "GPU 0 cannot be reached from GPU 1"),
        (gpus(3), (Link(0, 1, 50.0), Link(1, 0, 50.0)), "links", "GPU 2 cannot be reached"),
        ((Node(0), Node(1, "switch")), (Link(0, 1, 50.0), Link(1, 0, 50.0)), "nodes", "1 GPU(s)"),
        (gpus(1), (), "nodes", "1 GPU(s)"),
        ((), (), "nodes", "no nodes"),
        ((Node(1), Node(0)), (Link(0, 1, 1.0), Link(1, 0, 1.0)), "nodes[0].id", "expected 0"),
        ((Node(0), Node(1, "router")), (Link(0, 1, 1.0), Link(1, 0, 1.0)), "nodes[1].kind", "unknown kind"),
    ],
)
def test_validation_errors_name_the_field(nodes, links, field, problem):
    with pytest.raises(InputError) as ei:
        Topology("bad", nodes, links)
    assert ei.value.field == field
    assert problem in ei.value.problem
    assert str(ei.value).startswith(field)


def test_unreachable_through_a_switch_only_one_way():
    nodes = gpus(2) + (Node(2, "switch"),)
    links = (Link(0, 2, 50.0), Link(2, 1, 50.0))
    with pytest.raises(InputError) as ei:
        Topology("oneway", nodes, links)
    assert ei.value.field == "links"
    assert "GPU 0 cannot be reached from GPU 1" in ei.value.problem
    # the way back makes it valid: a switch may relay
    Topology("twoway", nodes, links + (Link(1, 2, 50.0), Link(2, 0, 50.0)))


def test_nominal_gpus_below_gpu_count():
    with pytest.raises(InputError) as ei:
        Topology("t", gpus(3), RING3, nominal_gpus=2)
    assert ei.value.field == "nominal_gpus"
    assert Topology("t", gpus(3), RING3, nominal_gpus=4).buffer_ranks == 4


@pytest.mark.parametrize(
    "key,value,field",
    [
        ("bandwidth_GBps", math.inf, "links[0] (0->1).bandwidth_GBps"),
        ("alpha_us", math.inf, "links[0] (0->1).alpha_us"),
        ("alpha_us", math.nan, "links[0] (0->1).alpha_us"),
    ],
)
def test_non_finite_bandwidth_or_alpha_is_rejected(key, value, field):
    # JSON readers accept Infinity and NaN; the epoch model needs finite numbers
    d = topology_to_dict(ring(3))
    d["links"][0][key] = value
    with pytest.raises(InputError) as ei:
        topology_from_dict(json.loads(json.dumps(d)))
    assert ei.value.field == field


# --------------------------------------------------------------------------------------- JSON

ROUND_TRIP = {
    "dgx1": dgx1,
    "ndv2-2": lambda: ndv2(2),
    "ndv2-3": lambda: ndv2(3),
    "ndv2-2-compat": lambda: ndv2(2, teccl_compat=True),
    "dgx2-2": lambda: dgx2(2),
    "dgx2-3": lambda: dgx2(3),
    "mi250-2": lambda: mi250(2),
    "switch-copy": lambda: switch(4, copy=True),
    "switch": lambda: switch(4),
    "torus": lambda: torus(3, 4),
    "ring-alpha": lambda: ring(4, bandwidth=12.5, alpha_us=1.234567),
}


@pytest.mark.parametrize("key", sorted(ROUND_TRIP))
def test_dict_round_trip(key):
    t = ROUND_TRIP[key]()
    d = topology_to_dict(t)
    assert d["schema"] == "flowride.topology/1"
    back = topology_from_dict(json.loads(json.dumps(d)))
    assert back == t
    assert back.nodes == t.nodes and back.links == t.links
    assert back.nominal_gpus == t.nominal_gpus
    assert back.groups == t.groups


@pytest.mark.parametrize("key", ["dgx1", "ndv2-2-compat", "dgx2-3", "mi250-2", "switch"])
def test_save_load_round_trip(tmp_path, key):
    t = ROUND_TRIP[key]()
    p = tmp_path / f"{key}.json"
    save_topology(t, p)
    assert json.loads(p.read_text())["name"] == t.name
    assert load_topology(p) == t


def test_minimal_json_uses_defaults():
    d = {
        "nodes": [{"id": 0}, {"id": 1}, {"id": 2, "kind": "switch", "copy": False}],
        "links": [
            {"src": 0, "dst": 2, "bandwidth_GBps": 50},
            {"src": 2, "dst": 1, "bandwidth_GBps": 50},
            {"src": 1, "dst": 0, "bandwidth_GBps": 25, "alpha_us": 1.5},
        ],
    }
    t = topology_from_dict(d)
    assert t.name == "custom"
    assert t.gpus == (0, 1) and t.switches == (2,)
    assert not t.nodes[2].copy
    assert t.links[0].alpha_s == 0.0
    assert t.links[2].alpha_s == pytest.approx(1.5e-6)
    # nodes may be listed in any order
    d["nodes"].reverse()
    assert topology_from_dict(d).nodes == t.nodes


def _ring_dict() -> dict:
    return topology_to_dict(ring(3))


def _set(path, value):
    def edit(d):
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
        return d

    return edit


def _delete(path):
    def edit(d):
        obj = d
        for k in path[:-1]:
            obj = obj[k]
        del obj[path[-1]]
        return d

    return edit


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda d: [d], "topology"),
        (lambda d: "ring", "topology"),
        (_set(("schema",), "flowride.topology/2"), "schema"),
        (_delete(("nodes",)), "topology.nodes"),
        (_delete(("links",)), "topology.links"),
        (_set(("nodes",), {"0": "gpu"}), "topology.nodes"),
        (_set(("nodes", 0), 7), "nodes[0]"),
        (_set(("nodes", 1, "id"), "1"), "nodes[1].id"),
        (_set(("nodes", 1, "id"), True), "nodes[1].id"),
        (_delete(("nodes", 1, "id")), "nodes[1].id"),
        (_set(("nodes", 0, "kind"), 3), "nodes[0].kind"),
        (_set(("nodes", 0, "kind"), "nic"), "nodes[0].kind"),
        (_set(("nodes", 0, "group"), "a"), "nodes[0].group"),
        (_set(("nodes", 2, "id"), 7), "nodes[2].id"),
        (_set(("links", 0), [0, 1, 50]), "links[0]"),
        (_delete(("links", 0, "bandwidth_GBps")), "links[0].bandwidth_GBps"),
        (_set(("links", 0, "bandwidth_GBps"), "50"), "links[0].bandwidth_GBps"),
        (_set(("links", 0, "bandwidth_GBps"), 0), "links[0] (0->1).bandwidth_GBps"),
        (_set(("links", 0, "alpha_us"), -1), "links[0] (0->1).alpha_us"),
        (_set(("links", 0, "dst"), 9), "links[0] (0->9).dst"),
        (_delete(("links", 0, "src")), "links[0].src"),
        (_set(("links", 0, "src"), 1.0), "links[0].src"),
        (_set(("name",), 5), "topology.name"),
        (_set(("nominal_gpus",), "16"), "topology.nominal_gpus"),
        (_set(("nominal_gpus",), 2), "nominal_gpus"),
    ],
)
def test_malformed_dict_raises_input_error(edit, field):
    with pytest.raises(InputError) as ei:
        topology_from_dict(edit(_ring_dict()))
    assert ei.value.field == field


@pytest.mark.parametrize(
    "text",
    ["", "{", "not json", '{"nodes": [}', "[1, 2, 3]", "null", '{"nodes": [], "links": []}'],
)
def test_malformed_file_raises_input_error(tmp_path, text):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(InputError) as ei:
        load_topology(p)
    assert ei.value.field in ("topology", "nodes")


def test_invalid_json_names_the_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{\n "nodes": [\n  {"id": 0},\n ]\n}\n')
    with pytest.raises(InputError) as ei:
        load_topology(p)
    assert ei.value.field == "topology"
    assert "not valid JSON" in ei.value.problem and "line 4" in ei.value.problem


def test_missing_file_raises_input_error(tmp_path):
    with pytest.raises(InputError) as ei:
        load_topology(tmp_path / "nope.json")
    assert ei.value.field == "topology"
    assert "cannot read" in ei.value.problem


def test_saved_file_with_unreachable_gpu_is_rejected(tmp_path):
    d = _ring_dict()
    d["links"] = [lk for lk in d["links"] if lk["dst"] != 2]
    p = tmp_path / "cut.json"
    p.write_text(json.dumps(d))
    with pytest.raises(InputError) as ei:
        load_topology(p)
    assert ei.value.field == "links"
    assert "GPU 2 cannot be reached" in ei.value.problem
