"""Importing a machine: `nvidia-smi topo -m` text and NCCL topology XML to a Topology.

The shipped examples must give the built-ins' graphs (DGX-1: the dgx1() NVLink graph; DGX H100:
the h100() preset), both formats must agree on the whole machine, every malformed input must be one
InputError naming the place, and any well-formed NV# matrix must give one link per NV pair."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clirun import ROOT, assert_clean_error, cli
from flowride.errors import InputError
from flowride.topology import Topology, dgx1, h100, load_topology
from flowride.topology.generations import GENERATIONS, apply_link_table, pcie_lane_GBps
from flowride.topology.nccl_xml import import_nccl_xml
from flowride.topology.nvsmi import import_nvidia_smi
from synth_helpers import refused_here

EX = ROOT / "examples" / "topologies"
DGX1_SMI, DGX1_XML = EX / "dgx1-nvidia-smi.txt", EX / "dgx1-nccl-topo.xml"
H100_SMI, H100_XML = EX / "dgx-h100-nvidia-smi.txt", EX / "dgx-h100-nccl-topo.xml"
US = 1e-6


def labelled(topo: Topology) -> nx.DiGraph:
    g = nx.DiGraph()
    for nd in topo.nodes:
        g.add_node(nd.id, k=(nd.kind, None if nd.is_gpu else nd.copy))
    for lk in topo.links:
        g.add_edge(lk.src, lk.dst, k=(lk.bandwidth_GBps, round(lk.alpha_s * 1e12)))
    return g


def same_graph(a: Topology, b: Topology) -> bool:
    """Isomorphic on (kind, copy) node labels and (bandwidth, alpha) link labels."""
    return nx.is_isomorphic(labelled(a), labelled(b), node_match=lambda x, y: x["k"] == y["k"],
                            edge_match=lambda x, y: x["k"] == y["k"])


def gpu_links(topo: Topology) -> dict[tuple[int, int], float]:
    gpus = set(topo.gpus)
    return {(lk.src, lk.dst): lk.bandwidth_GBps for lk in topo.links if lk.src in gpus and lk.dst in gpus}


def smi(tmp_path: Path, rows: list[str], cols: str = "", tail: str = "") -> Path:
    """A matrix file: header from ``cols`` (default: one GPU column per row), then ``rows``
    (cells only: row i is named GPUi), then ``tail``."""
    names = cols or "\t".join(f"GPU{i}" for i in range(len(rows)))
    p = tmp_path / "topo.txt"
    p.write_text("\t" + names + "\n" + "\n".join(f"GPU{i}\t{r}" for i, r in enumerate(rows)) + "\n" + tail)
    return p


def error(fn, *args, **kw) -> str:
    with pytest.raises(InputError) as e:
        fn(*args, **kw)
    return str(e.value)


# ------------------------------------------------------------------------------------ the shipped examples

def test_dgx1_nvidia_smi_gives_the_dgx1_nvlink_graph():
    done = import_nvidia_smi(DGX1_SMI, nvlink_only=True)
    assert "v100" in done.notes[0] and "guessed" in done.notes[0]
    assert same_graph(done.topology, dgx1())
    # the whole machine keeps exactly that NVLink graph between the GPUs, and adds PCIe and CPUs
    full = import_nvidia_smi(DGX1_SMI).topology
    assert gpu_links(full) == gpu_links(done.topology)
    assert len(full.switches) == 6  # 4 PCIe switches, 2 host bridges (the CPUs), one UPI link pair
    assert sorted({lk.bandwidth_GBps for lk in full.links}) == [16.0, 20.0, 25.0, 50.0]


def test_dgx1_nccl_xml_gives_the_dgx1_nvlink_graph_and_the_same_machine():
    assert same_graph(import_nccl_xml(DGX1_XML, nvlink_only=True).topology, dgx1())
    assert same_graph(import_nccl_xml(DGX1_XML).topology, import_nvidia_smi(DGX1_SMI).topology)


def test_dgx_h100_gives_the_h100_preset_exactly():
    want = h100()
    for done in (import_nvidia_smi(H100_SMI, nvlink_only=True), import_nccl_xml(H100_XML, nvlink_only=True)):
        t = done.topology
        assert [(nd.kind, nd.copy if not nd.is_gpu else None) for nd in t.nodes] == \
            [(nd.kind, nd.copy if not nd.is_gpu else None) for nd in want.nodes]
        key = sorted((lk.src, lk.dst, lk.bandwidth_GBps, lk.alpha_s) for lk in t.links)
        assert key == sorted((lk.src, lk.dst, lk.bandwidth_GBps, lk.alpha_s) for lk in want.links)
        assert "h100" in done.notes[0]
    assert same_graph(import_nvidia_smi(H100_SMI).topology, import_nccl_xml(H100_XML).topology)


def test_generation_override_and_link_table(tmp_path):
    table = tmp_path / "links.json"
    table.write_text(json.dumps({"sys": {"bandwidth_GBps": 30}, "pcie": {"alpha_us": 2}}))
    t = import_nvidia_smi(DGX1_SMI, generation="v100", link_table=table).topology
    sys_links = [lk for lk in t.links if lk.src in t.switches and lk.dst in t.switches and lk.bandwidth_GBps == 30]
    assert len(sys_links) == 2 and sys_links[0].alpha_s == pytest.approx(1.5 * US)
    assert [lk.alpha_s for lk in t.links if lk.bandwidth_GBps == 16] == pytest.approx([2 * US] * 24)
    assert "a100" in error(import_nvidia_smi, H100_SMI, generation="a100")  # NV18 > the 12 links of an A100
    assert "NV18" in error(import_nvidia_smi, H100_SMI, generation="a100")


# ------------------------------------------------------------------------------------ modelling rules

def test_nvswitch_rule_tells_a_switched_fabric_from_a_bonded_mesh(tmp_path):
    four = ["X NV4 NV4 NV4", "NV4 X NV4 NV4", "NV4 NV4 X NV4", "NV4 NV4 NV4 X"]
    t = import_nvidia_smi(smi(tmp_path, four)).topology  # 3 x 4 = 12 links: an A100 board's direct mesh
    assert not t.switches and set(gpu_links(t).values()) == {100.0}
    eight = [" ".join("X" if i == j else "NV12" for j in range(8)) for i in range(8)]
    done = import_nvidia_smi(smi(tmp_path, eight))
    assert "a100" in done.notes[0]
    t = done.topology
    assert len(t.switches) == 1 and not t.nodes[8].copy  # NVSwitch gen 2 forwards
    assert {lk.bandwidth_GBps for lk in t.links} == {300.0}


def test_pcie_tree_from_pix_pxb_and_sys(tmp_path):
    rows = ["X PIX PXB SYS", "PIX X PXB SYS", "PXB PXB X SYS", "SYS SYS SYS X"]
    done = import_nvidia_smi(smi(tmp_path, rows), generation="a100")
    t = done.topology
    labels = [nd.label for nd in t.nodes]
    assert labels == ["GPU0", "GPU1", "GPU2", "GPU3", "pcie-switch0", "pcie-switch1", "cpu0", "cpu1"]
    path = nx.shortest_path(t.graph, 0, 3)
    assert [labels[v] for v in path] == ["GPU0", "pcie-switch0", "pcie-switch1", "cpu0", "cpu1", "GPU3"]
    assert [t.graph.edges[u, v]["bandwidth_GBps"] for u, v in zip(path, path[1:], strict=False)] == [32, 32, 32, 40, 32]
    assert "guessed" not in done.notes[0]


def test_pcie_only_matrix_guesses_a_pcie_card_and_says_so(tmp_path):
    p = smi(tmp_path, ["X PHB", "PHB X"])
    done = import_nvidia_smi(p)  # no NV cell: a PCIe-only box (L40S, RTX 4090, ...), PCIe Gen4
    assert "l40s" in done.notes[0] and "guessed" in done.notes[0] and "--gpu-generation" in done.notes[0]
    assert {lk.bandwidth_GBps for lk in done.topology.links} == {32.0}
    t = import_nvidia_smi(p, generation="h100").topology
    assert len(t.switches) == 1 and {lk.bandwidth_GBps for lk in t.links} == {64.0}


def test_cpu_affinity_splits_sockets_and_a_silent_matrix_models_no_pcie(tmp_path):
    rows = [" ".join("X" if i == j else "NV18" for j in range(4)) + f" {'0-51' if i < 2 else '52-103'} {i // 2}"
            for i in range(4)]
    t = import_nvidia_smi(smi(tmp_path, rows, "GPU0 GPU1 GPU2 GPU3 CPU Affinity NUMA")).topology
    assert [nd.label for nd in t.nodes] == ["GPU0", "GPU1", "GPU2", "GPU3", "nvswitch", "cpu0", "cpu1"]
    done = import_nvidia_smi(smi(tmp_path, [r.rsplit(" ", 2)[0] for r in rows]))
    assert "not modelled" in done.notes[-1] and len(done.topology.switches) == 1


def test_link_table_errors():
    base = GENERATIONS["h100"]
    assert "known keys: nvlink, nvswitch, pcie, node, sys" in str(pytest.raises(InputError, apply_link_table, base, {"nvlnk": {}}).value)
    assert "'nvlnk'" in error(apply_link_table, base, {"nvlnk": {}})
    assert "-5" in error(apply_link_table, base, {"sys": {"bandwidth_GBps": -5}})
    assert "sys.bandwidth_GBps" in error(apply_link_table, base, {"sys": {"bandwidth_GBps": -5}})
    assert "speed" in error(apply_link_table, base, {"pcie": {"speed": 1}})
    assert "not a JSON object" in error(apply_link_table, base, [1])
    assert apply_link_table(base, {"nvlinks_per_gpu": 24, "nvswitch_copy": False}).nvlinks_per_gpu == 24
    assert pcie_lane_GBps("16.0 GT/s PCIe") == 2.0 and pcie_lane_GBps("2.5 GT/s") == 0.25 and pcie_lane_GBps("Unknown") is None


# ------------------------------------------------------------------------------------ malformed matrices

@pytest.mark.parametrize("rows, needles", [
    (["X NV?", "NV? X"], ["unknown token 'NV?'", "row GPU0", "column GPU1", "line 2"]),
    (["X PIX", "FOO X"], ["unknown token 'FOO'", "row GPU1", "column GPU0", "line 3"]),
    (["X NV1 NV1", "NV1 X", "NV1 NV1 X"], ["row GPU1", "ragged", "has 2 cells"]),
    (["X NV1 NV1", "NV1 X 0-19", "NV1 NV1 X"], ["row GPU1", "ragged", "has 2 cells"]),
    (["X NV1 NV1", "NV1 X NV1 NV1", "NV1 NV1 X"], ["row GPU1", "more cells", "ragged"]),
    (["X NV2", "NV1 X"], ["asymmetric NV counts", "says NV2", "says NV1"]),
    (["X X", "X X"], ["X off the diagonal", "column GPU1"]),
    (["NV1 NV1", "NV1 X"], ["NV1 on the diagonal"]),
])
def test_bad_cells_name_the_row_and_column(tmp_path, rows, needles):
    msg = error(import_nvidia_smi, smi(tmp_path, rows))
    for n in needles:
        assert n in msg, (n, msg)


def test_bad_shapes(tmp_path):
    msg = error(import_nvidia_smi, smi(tmp_path, ["X NV1 NV1", "NV1 X NV1"], cols="GPU0\tGPU1\tGPU2"))
    assert "not square" in msg and "GPU2" in msg
    msg = error(import_nvidia_smi, smi(tmp_path, ["X NV1", "NV1 X"], tail="GPU2 NV1 NV1\n"))
    assert "GPU2" in msg and "not square" in msg
    (tmp_path / "none.txt").write_text("\tNIC0\tNIC1\nNIC0 X PIX\nNIC1 PIX X\n")
    assert "no GPUs" in error(import_nvidia_smi, tmp_path / "none.txt")
    one = smi(tmp_path, ["X"])
    assert "1 GPU" in error(import_nvidia_smi, one, generation="v100")
    nic = smi(tmp_path, ["X NV1 NV1", "NV1 X PIX"], cols="GPU0\tGPU1\tmlx5_0")
    assert "joins a NIC" in error(import_nvidia_smi, nic)
    tree = smi(tmp_path, ["X PIX SYS", "PIX X PIX", "SYS PIX X"])
    assert "not a tree" in error(import_nvidia_smi, tree, generation="v100")
    apart = smi(tmp_path, ["X NV1 NV1 NV1", "NV1 X NV1 NV1", "NV1 NV1 X NV1", "NV1 NV1 NV1 X"])
    assert import_nvidia_smi(apart).topology.switches == ()  # silent on PCIe: NVLink joins them all
    split = smi(tmp_path, ["X NV1 SYS SYS", "NV1 X SYS SYS", "SYS SYS X NV1", "SYS SYS NV1 X"])
    assert "NVLink alone" in error(import_nvidia_smi, split, nvlink_only=True)


def test_escape_codes_spaces_comments_and_the_nic_legend_are_read(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("# from a DGX, pasted\n\x1b[4m\tGPU0\tGPU1\tCPU Affinity\x1b[0m\n"
                 "GPU0     X      NV2    0-9\nGPU1    NV2      X     0-9\n\nLegend:\n  X = Self\n\nNIC Legend:\n  NIC0: mlx5_0\n")
    t = import_nvidia_smi(p).topology
    assert gpu_links(t) == {(0, 1): 50.0, (1, 0): 50.0}
    assert [nd.label for nd in t.nodes] == ["GPU0", "GPU1", "cpu0"]  # one affinity: one CPU joins them over PCIe


# ------------------------------------------------------------------------------------ malformed XML

GPU = ('<pci busid="{b}" link_speed="16.0 GT/s PCIe" link_width="16"><gpu dev="{d}" sm="{sm}" rank="{d}">{nv}</gpu></pci>')


def xml(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "topo.xml"
    p.write_text(f'<system version="1">\n<cpu numaid="0" arch="x86_64">\n{body}\n</cpu>\n</system>\n')
    return p


def two_gpus(nv0: str, nv1: str, sm: str = "80") -> str:
    return GPU.format(b="0000:01:00.0", d=0, sm=sm, nv=nv0) + "\n" + GPU.format(b="0000:02:00.0", d=1, sm=sm, nv=nv1)


def test_xml_pairs_pcie_and_guesses_from_sm(tmp_path):
    link = '<nvlink target="{}" count="4" tclass="0x030200"/>'
    done = import_nccl_xml(xml(tmp_path, two_gpus(link.format("0000:02:00.0"), link.format("0000:01:00.0"))))
    assert "a100" in done.notes[0] and "sm 80" in done.notes[0]
    t = done.topology
    assert gpu_links(t) == {(0, 1): 100.0, (1, 0): 100.0}
    assert [nd.label for nd in t.nodes] == ["0000:01:00.0", "0000:02:00.0", "cpu0"]
    assert {lk.bandwidth_GBps for lk in t.links if lk.dst == 2} == {32.0}  # 16 GT/s x 16 lanes


@pytest.mark.parametrize("body, needles", [
    ('<pci busid="0000:01:00.0"><gpu sm="80"></pci>', ["not well-formed", "line 3"]),
    (two_gpus('<nvlink target="0000:99:00.0" count="1" tclass="0x030200"/>', ""), ["0000:99:00.0", "no GPU's busid", "line 3"]),
    (two_gpus('<nvlink target="0000:02:00.0" tclass="0x030200"/>', ""), ["missing the attribute 'count'", "<nvlink>"]),
    (two_gpus("", "").replace(' sm="80"', "", 1), ["missing the attribute 'sm'", "<gpu>"]),
    (two_gpus("", "").replace('busid="0000:02:00.0"', ""), ["missing the attribute 'busid'"]),
    (two_gpus('<nvlink target="0000:02:00.0" count="2" tclass="0x030200"/>',
              '<nvlink target="0000:01:00.0" count="1" tclass="0x030200"/>'), ["asymmetric NVLink counts"]),
    (two_gpus('<nvlink target="0000:02:00.0" count="2" tclass="0x060400"/>', ""), ["unknown tclass '0x060400'"]),
    (two_gpus('<nvlink target="0000:02:00.0" count="-1" tclass="0x030200"/>', ""), ["'-1' is not a whole number >= 1"]),
])
def test_bad_xml_names_the_line(tmp_path, body, needles):
    msg = error(import_nccl_xml, xml(tmp_path, body))
    for n in needles:
        assert n in msg, (n, msg)


def test_bad_xml_documents(tmp_path):
    p = tmp_path / "x.xml"
    p.write_text('<!DOCTYPE system [<!ENTITY a "aaaa">]><system/>')
    assert "DTD" in error(import_nccl_xml, p)
    p.write_text("<topology/>")
    assert "not <system>" in error(import_nccl_xml, p)
    p.write_text('<system><cpu arch="x86_64"></cpu></system>')
    assert "'numaid'" in error(import_nccl_xml, p)
    assert "sm 80, 90" in error(import_nccl_xml, xml(tmp_path, two_gpus("", "").replace('sm="80"', 'sm="90"', 1)))
    assert "sm 75" in error(import_nccl_xml, xml(tmp_path, two_gpus("", "", sm="75")))
    t = import_nccl_xml(xml(tmp_path, two_gpus("", "", sm="75")), generation="a100").topology
    assert [nd.label for nd in t.nodes] == ["0000:01:00.0", "0000:02:00.0", "cpu0"]  # PCIe alone joins them


# ------------------------------------------------------------------------------------ the property

@st.composite
def nv_matrices(draw):
    """A well-formed matrix: NV counts 0..2 over a random PCIe tree (socket, host bridge, switch
    per GPU), the tree's token wherever a pair has no NVLink; tabs or spaces."""
    n = draw(st.integers(2, 8))
    place = [draw(st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1))) for _ in range(n)]
    counts = {(i, j): draw(st.integers(0, 2)) for i in range(n) for j in range(i + 1, n)}

    def cell(i: int, j: int) -> str:
        if i == j:
            return "X"
        c = counts[(min(i, j), max(i, j))]
        if c:
            return f"NV{c}"
        a, b = place[i], place[j]
        return "SYS" if a[0] != b[0] else "NODE" if a[1] != b[1] else "PHB" if a[2] != b[2] else "PIX"

    sep = draw(st.sampled_from(["\t", " ", "   "]))
    rows = [sep.join(cell(i, j) for j in range(n)) for i in range(n)]
    return counts, rows, sep


@settings(max_examples=40, deadline=None)
@given(nv_matrices())
def test_every_nv_cell_becomes_one_link_each_way(tmp_path_factory, case):
    counts, rows, sep = case
    p = tmp_path_factory.mktemp("m") / "m.txt"
    n = len(rows)
    p.write_text(sep + sep.join(f"GPU{i}" for i in range(n)) + "\n" + "\n".join(f"GPU{i}{sep}{r}" for i, r in enumerate(rows)) + "\n")
    t = import_nvidia_smi(p, generation="h100").topology
    want = {}
    for (i, j), c in counts.items():
        if c:
            want[(i, j)] = want[(j, i)] = 25.0 * c
    assert gpu_links(t) == want
    assert t.gpus == tuple(range(n)) and all(not nd.copy for nd in t.nodes if not nd.is_gpu)


# ------------------------------------------------------------------------------------ the CLI

def test_cli_imports_then_synthesizes(tmp_path):
    out = tmp_path / "t.json"
    r = cli("topology", "--from-nvidia-smi", DGX1_SMI, "-o", out)
    assert r.code == 0, r.err
    assert "guessed" in r.out and "written to" in r.out
    assert load_topology(out).name == "nvidia-smi:dgx1-nvidia-smi.txt"
    r = cli("synth", "-t", out, "-c", "allgather", "-s", "1MB", "--chunks", "1", "--time-limit", "20")
    assert r.code == 0, r.err[-2000:]
    assert "verified: True" in r.out


def test_cli_errors_are_one_line(tmp_path, capsys):
    """The first end to end in a subprocess, the others through ``main`` in this process."""
    bad = smi(tmp_path, ["X NV?", "NV? X"])
    assert_clean_error(cli("topology", "--from-nvidia-smi", bad), 2, "unknown token 'NV?'", "row GPU0", "column GPU1", within=20)
    refused_here(capsys, ["topology"], "--topology", "exactly one")
    refused_here(capsys, ["topology", "-t", "dgx1", "--from-nccl-xml", DGX1_XML], "--from-nccl-xml", "exactly one")
    refused_here(capsys, ["topology", "-t", "dgx1", "--gpu-generation", "v100"], "--gpu-generation")
    refused_here(capsys, ["topology", "--from-nccl-xml", DGX1_XML, "--chassis", "2"], "--chassis")
    table = tmp_path / "t.json"
    table.write_text('{"syss": {}}')
    refused_here(capsys, ["topology", "--from-nccl-xml", DGX1_XML, "--link-table", table], "'syss'", "known keys")
    refused_here(capsys, ["topology", "--from-nccl-xml", DGX1_XML, "--gpu-generation", "p100"], "--gpu-generation", "v100, a100, h100")
    # --switch-copy would make PCIe switches and CPU sockets replicate: refused, pointing at the link table
    refused_here(capsys, ["topology", "--from-nccl-xml", DGX1_XML, "--switch-copy", "on"], "--switch-copy", "nvswitch_copy")
