"""Topology dumps as real machines and their tools write them (issue #26, "topology dumps").

Each case goes through the CLI (``flowride topology --from-...``; its ``main`` in this process,
or a subprocess where the command's own one-line exit is the point) with an input written in the
tool's public format, and asserts the link bandwidths it builds, the notes it prints (every guess
and every resolution is said) or the one-line error it gives:

1. an NCCL XML of a machine like Azure's NC A100 v4, whose NVLinks each name the GPU's own bus id;
2. the generation table: Blackwell, Hopper and Ampere variants, Ada and Ampere workstation cards,
   guesses that say they are guesses (NV18 is H100 or B300 alike), PCIe-only boxes;
3. ``rocm-smi --showtopo`` of MI300X and MI250X boxes;
4. a matrix of SYS everywhere whose NUMA Affinity column puts 4 GPUs on each of 2 nodes;
5. a VM's emulated PCIe bridges at 2.5 GT/s x1;
6. two GPUs with one rank in an NCCL XML.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from clirun import ROOT, Ran, assert_clean_error, cli
from flowride.cli import main
from flowride.errors import InputError
from flowride.topology import load_topology
from flowride.topology.generations import GENERATIONS, apply_link_table
from flowride.topology.gpu_specs import SPECS, by_links, by_sm, named_in
from flowride.topology.nccl_xml import import_nccl_xml
from flowride.topology.nvsmi import import_nvidia_smi
from flowride.topology.rocm_smi import import_rocm_smi

EX = ROOT / "examples" / "topologies"
NCV4 = EX / "ncv4-style-nccl-topo.xml"
MI300X, MI250X = EX / "mi300x-rocm-smi.txt", EX / "mi250x-rocm-smi.txt"


def in_process(*args) -> Ran:
    """The CLI's ``main`` in this process (the same parsing, import and printing as the command,
    without a Python start per case), its stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in args])
    return Ran(code, out.getvalue(), err.getvalue(), 0.0, 0.0)


def run(tmp_path: Path, flag: str, src: Path, *extra: str) -> tuple[dict, list[str]]:
    """Import through the CLI (in this process); (the topology JSON it wrote, its note lines)."""
    out = tmp_path / "t.json"
    r = in_process("topology", flag, src, "-o", out, *extra)
    assert r.code == 0, r.err
    notes = [ln[len("note: "):] for ln in r.out.splitlines() if ln.startswith("note: ")]
    return json.loads(out.read_text()), notes


def gpu_bw(topo: dict) -> dict[tuple[int, int], float]:
    """GPU-to-GPU link bandwidths, (src, dst) -> GB/s."""
    gpus = {n["id"] for n in topo["nodes"] if n["kind"] == "gpu"}
    return {(lk["src"], lk["dst"]): lk["bandwidth_GBps"] for lk in topo["links"] if lk["src"] in gpus and lk["dst"] in gpus}


def labels(topo: dict) -> list[str]:
    return [n.get("label", "") for n in topo["nodes"]]


def error(fn, *args, **kw) -> str:
    with pytest.raises(InputError) as e:
        fn(*args, **kw)
    return str(e.value)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


PCI = '<pci busid="{b}" class="0x030200" vendor="0x10de" device="0x20b5" link_speed="{s}" link_width="{w}">'


def xml_gpu(busid: str, rank: int, sm: int = 80, nv: str = "", speed: str = "16.0 GT/s PCIe", width: int = 16) -> str:
    return (PCI.format(b=busid, s=speed, w=width) + f'\n  <gpu dev="{rank}" sm="{sm}" rank="{rank}" gdr="1">{nv}</gpu>\n</pci>')


def xml_doc(*cpus: str) -> str:
    body = "".join(f'<cpu numaid="{i}" arch="x86_64" vendor="AuthenticAMD">\n{c}\n</cpu>\n' for i, c in enumerate(cpus))
    return f'<system version="1">\n{body}</system>\n'


def nvl(target: str, count: int, tclass: str = "0x030200") -> str:
    return f'<nvlink target="{target}" count="{count}" tclass="{tclass}"/>'


# ------------------------------------------------------------------------------------ 1. NC A100 v4-style

def test_ncv4_self_targets_become_bridged_pairs_and_are_said(tmp_path):
    topo, notes = run(tmp_path, "--from-nccl-xml", NCV4)
    bw = gpu_bw(topo)
    assert bw == {(0, 1): 300.0, (1, 0): 300.0, (2, 3): 300.0, (3, 2): 300.0}  # 12 x 25 GB/s each way per bridged pair
    said = " ".join(notes)
    assert "a100" in notes[0] and "guessed from sm 80" in notes[0]
    assert "own bus id" in said and "consecutive bus ids" in said and "0001:00:00.0+0002:00:00.0" in said
    assert "NCCL then links each GPU to itself" in said  # what NCCL itself does with such a target
    assert "4 link(s) state no speed" in said  # link_speed="" link_width="0": priced from the table, and said
    assert [lb for lb in labels(topo) if lb.startswith("cpu")] == ["cpu0", "cpu1", "cpu2", "cpu3"]


def test_self_targets_pair_by_pcie_switch_first_and_an_odd_one_is_named(tmp_path):
    a, b, c = "0000:41:00.0", "0000:42:00.0", "0000:81:00.0"
    switch = '<pci busid="0000:40:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">\n{}\n{}\n</pci>'
    body = switch.format(xml_gpu(a, 0, nv=nvl(a, 4)), xml_gpu(b, 1, nv=nvl(b, 4))) + "\n" + xml_gpu(c, 2, nv=nvl(c, 4))
    done = import_nccl_xml(write(tmp_path, "t.xml", xml_doc(body)))
    t = done.topology
    assert {(lk.src, lk.dst): lk.bandwidth_GBps for lk in t.links if lk.src < 3 and lk.dst < 3} == {(0, 1): 100.0, (1, 0): 100.0}
    said = " ".join(done.notes)
    assert "alone under one PCIe switch" in said and f"{c} (line" in said and "left out" in said
    # two GPUs only, under different CPUs: "the only two"
    body2 = xml_doc(xml_gpu(a, 0, nv=nvl(a, 12)), xml_gpu(c, 1, nv=nvl(c, 12)))
    done = import_nccl_xml(write(tmp_path, "u.xml", body2))
    assert "the only two" in " ".join(done.notes) and {lk.bandwidth_GBps for lk in done.topology.links if lk.dst == 1 and lk.src == 0} == {300.0}


# ------------------------------------------------------------------------------------ 2. the generation table

def test_every_generation_cites_a_source_and_prices_its_links():
    names = {s.name for s in SPECS}
    assert {"b200", "b300", "gb200", "h200", "h20", "h800", "a800", "l40s", "l4", "rtx4090", "rtx6000ada", "a6000",
            "rtx3090", "mi300x", "mi250"} <= names
    for s in SPECS:
        assert s.source and (s.links == 0) == (s.link_GBps == 0), s.name
    per_gpu = {n: GENERATIONS[n].nvlinks_per_gpu * GENERATIONS[n].cost(GENERATIONS[n].fabric).bandwidth_GBps
               for n in ("b200", "b300", "gb200", "h100", "h200", "h20", "h800", "a800", "a6000", "rtx3090", "mi300x")}
    assert per_gpu == {"b200": 900.0, "b300": 900.0, "gb200": 900.0, "h100": 450.0, "h200": 450.0, "h20": 450.0,
                       "h800": 200.0, "a800": 200.0, "a6000": 56.25, "rtx3090": 56.25, "mi300x": 448.0}
    assert {n: GENERATIONS[n].cost("pcie").bandwidth_GBps for n in ("l40s", "l4", "rtx4090", "rtx6000ada", "b200", "b300")} == \
        {"l40s": 32.0, "l4": 32.0, "rtx4090": 32.0, "rtx6000ada": 32.0, "b200": 64.0, "b300": 128.0}
    assert GENERATIONS["b200"].nvswitch_copy and not GENERATIONS["a800"].nvswitch_copy
    # a PCIe-only card has no NVLink entry to override; AMD's link key is xgmi
    assert "known keys: pcie, node, sys" in error(apply_link_table, GENERATIONS["l40s"], {"nvlink": {}})
    assert apply_link_table(GENERATIONS["mi300x"], {"xgmi": {"bandwidth_GBps": 50}}).cost("xgmi").bandwidth_GBps == 50


def nv_matrix(k: int, n: int = 8, head: str = "") -> str:
    cols = "\t".join(f"GPU{i}" for i in range(n))
    rows = "\n".join(f"GPU{i}\t" + "\t".join(" X " if i == j else f"NV{k}" for j in range(n)) for i in range(n))
    return f"{head}\t{cols}\n{rows}\n"


def test_nv18_guess_says_it_cannot_tell_h100_from_b300_and_how_to_choose(tmp_path):
    p = write(tmp_path, "nv18.txt", nv_matrix(18))
    topo, notes = run(tmp_path, "--from-nvidia-smi", p)
    assert "h100" in notes[0] and "guessed" in notes[0] and "--gpu-generation NAME" in notes[0]
    assert re.search(r"b200/b300/gb200 \(50 GB/s per link\)", notes[0]), notes[0]
    assert set(gpu_bw(topo).values()) == set() and {lk["bandwidth_GBps"] for lk in topo["links"]} == {450.0}
    topo, notes = run(tmp_path, "--from-nvidia-smi", p, "--gpu-generation", "b300")
    assert "(given: NVIDIA B300" in notes[0] and {lk["bandwidth_GBps"] for lk in topo["links"]} == {900.0}
    # an H800 box prints NV8 on every pair: exactly its 8 links into NVSwitch
    assert by_links(56, 8)[0] in ("a800", "h800")


def test_nv_counts_guess_the_generation_that_uses_every_link(tmp_path):
    pair = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV4\t0-23\t0\nGPU1\tNV4\t X \t0-23\t0\n"
    done = import_nvidia_smi(write(tmp_path, "pair.txt", pair))  # an RTX A6000 / 3090 pair on its NVLink bridge
    assert "a6000" in done.notes[0] and "all used" in done.notes[0] and "v100/a100/h100" in done.notes[0]
    assert {lk.bandwidth_GBps for lk in done.topology.links if (lk.src, lk.dst) == (0, 1)} == {56.25}
    assert "a100" in import_nvidia_smi(write(tmp_path, "a100.txt", pair.replace("NV4", "NV12"))).notes[0]  # 3 bridges
    h100 = import_nvidia_smi(EX / "dgx-h100-nvidia-smi.txt")  # NUMA column agrees with the cells: nothing to say
    assert not [n for n in h100.notes if n.startswith("NUMA")]


def test_a_gpu_name_in_the_file_drives_the_guess(tmp_path):
    names = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd)\n" for i in range(8))
    topo, notes = run(tmp_path, "--from-nvidia-smi", write(tmp_path, "h200.txt", names + nv_matrix(18)))
    assert "h200" in notes[0] and "name on line 1" in notes[0]
    two = names.replace("H200 (UUID: GPU-00000007", "B200 (UUID: GPU-00000007")
    r = in_process("topology", "--from-nvidia-smi", write(tmp_path, "mixed.txt", two + nv_matrix(18)))
    assert_clean_error(r, 2, "--gpu-generation", "several generations", "h200 on line 1", "b200 on line 8")
    assert named_in("GPU[0]\t\t: Card series:\t\tAMD Instinct MI300X OAM", "amd")[0] == "mi300x"


def test_pcie_only_boxes_import_with_a_guessed_card_and_numa_sockets(tmp_path):
    # 4 x L40S or RTX 4090 (no NVLink): NODE within a socket, SYS across, NUMA Affinity 0/1
    text = ("\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNODE\tSYS\tSYS\t0-31,64-95\t0\t\tN/A\n"
            "GPU1\tNODE\t X \tSYS\tSYS\t0-31,64-95\t0\t\tN/A\n"
            "GPU2\tSYS\tSYS\t X \tNODE\t32-63,96-127\t1\t\tN/A\n"
            "GPU3\tSYS\tSYS\tNODE\t X \t32-63,96-127\t1\t\tN/A\n\nLegend:\n\n  X    = Self\n")
    topo, notes = run(tmp_path, "--from-nvidia-smi", write(tmp_path, "l40s.txt", text))
    assert "l40s" in notes[0] and "guessed" in notes[0] and "PCIe-only" in notes[0]
    assert labels(topo)[4:] == ["cpu0", "cpu1"]
    assert sorted({lk["bandwidth_GBps"] for lk in topo["links"]}) == [32.0, 40.0]  # PCIe Gen4 x16, one UPI pair
    topo, notes = run(tmp_path, "--from-nvidia-smi", write(tmp_path, "4090.txt", "# 4 x NVIDIA GeForce RTX 4090\n" + text))
    assert "rtx4090" in notes[0]


def test_xml_sm_drives_the_guess_for_new_generations(tmp_path):
    a, b = "0000:18:00.0", "0000:2a:00.0"
    sw = "".join(nvl(f"0000:0{k}:00.0", n, "0x068000") for k, n in ((5, 5), (6, 5), (7, 4), (8, 4)))
    for sm, gen, per_gpu in ((100, "b200", 900.0), (103, "b300", 900.0), (90, "h100", 450.0)):
        done = import_nccl_xml(write(tmp_path, f"sm{sm}.xml", xml_doc(xml_gpu(a, 0, sm, sw), xml_gpu(b, 1, sm, sw))))
        assert gen in done.notes[0] and f"sm {sm}" in done.notes[0]
        assert {lk.bandwidth_GBps for lk in done.topology.links if lk.src == 0 and lk.dst == 2} == {per_gpu}
    h800 = "".join(nvl(f"0000:0{k}:00.0", 2, "0x068000") for k in (5, 6, 7, 8))  # 8 NVLinks: an H800
    assert "h800" in import_nccl_xml(write(tmp_path, "h800.xml", xml_doc(xml_gpu(a, 0, 90, h800), xml_gpu(b, 1, 90, h800)))).notes[0]
    bridge = (xml_gpu(a, 0, 86, nvl(b, 4)), xml_gpu(b, 1, 86, nvl(a, 4)))  # RTX A6000 / 3090 pair on an NV4 bridge
    done = import_nccl_xml(write(tmp_path, "a6000.xml", xml_doc(*bridge)))
    assert "a6000" in done.notes[0] and "rtx3090 price the same" in done.notes[0]
    assert {lk.bandwidth_GBps for lk in done.topology.links if lk.src == 0 and lk.dst == 1} == {56.25}
    assert "l40s" in import_nccl_xml(write(tmp_path, "ada.xml", xml_doc(xml_gpu(a, 0, 89), xml_gpu(b, 1, 89)))).notes[0]
    assert "sm 75" in error(by_sm, [75], 0, "x.xml") and "sm 100 = b200/gb200" in error(by_sm, [75], 0, "x.xml")


# ------------------------------------------------------------------------------------ 3. rocm-smi

def test_rocm_smi_mi300x_is_a_full_xgmi_mesh(tmp_path):
    topo, notes = run(tmp_path, "--from-rocm-smi", MI300X)
    bw = gpu_bw(topo)
    assert len(bw) == 56 and set(bw.values()) == {64.0}  # 28 pairs, one 64 GB/s link each way
    assert "mi300x" in notes[0] and "guessed" in notes[0] and "28 direct" in notes[1]
    assert topo["name"] == "rocm-smi:mi300x-rocm-smi.txt" and "numa0" in labels(topo) and "numa1" in labels(topo)


def test_rocm_smi_mi250x_links_only_direct_pairs_and_packages_get_four(tmp_path):
    topo, notes = run(tmp_path, "--from-rocm-smi", MI250X)
    bw = gpu_bw(topo)
    assert bw[(0, 1)] == bw[(6, 7)] == 200.0  # the two GCDs of one MI250X: 4 links of 50 GB/s
    assert bw[(0, 2)] == bw[(0, 6)] == 50.0  # weight 15 across packages: one link (rocm-smi does not say 1 or 2)
    assert (0, 3) not in bw and (1, 7) not in bw  # weight 30 and 45 route through other GCDs
    assert len(bw) == 24 and "mi250" in notes[0] and "rocm-smi does not say which" in notes[1]
    # the same through the library, every GCD reachable over xGMI alone
    assert len(import_rocm_smi(MI250X, nvlink_only=True).topology.links) == 24


def showtopo(n: int, weight: int, hops: int, kind: str, numa: list[int]) -> str:
    """``rocm-smi --showtopo`` text in rocm_smi.py's layout, one value for every GPU pair."""
    def section(title: str, value: object) -> str:
        head = "       " + "".join(f"{f'GPU{i}':<12} " for i in range(n))
        rows = "".join(f"{f'GPU{i}':<6} " + "".join(f"{'0' if i == j else value!s:<12} " for j in range(n)) + "\n" for i in range(n))
        return f"{f' {title} ':=^90}\n{head}\n{rows}\n"
    numa_lines = "".join(f"GPU[{i}]\t\t: (Topology) Numa Node: {v}\nGPU[{i}]\t\t: (Topology) Numa Affinity: {v}\n" for i, v in enumerate(numa))
    return (f"{' ROCm System Management Interface ':=^90}\n" + section("Weight between two GPUs", weight)
            + section("Hops between two GPUs", hops) + section("Link Type between two GPUs", kind)
            + f"{' Numa Nodes ':=^90}\n{numa_lines}{' End of ROCm SMI Log ':=^90}\n")


def test_rocm_smi_pcie_only_box_and_bad_input(tmp_path):
    # ROCm/rocm_smi_lib issue #108: four GPUs on PCIe only, 3 hops (across sockets) between every two
    done = import_rocm_smi(write(tmp_path, "pcie.txt", showtopo(4, 52, 3, "PCIE", [0, 1, 3, 2])))
    assert "mi250" in done.notes[0] and "no xGMI" in done.notes[0]
    t = done.topology
    assert not [lk for lk in t.links if lk.src < 4 and lk.dst < 4]
    assert [nd.label for nd in t.nodes][4:] == ["numa0", "numa1", "numa2", "numa3", "inter-socket"]
    assert "4 CPU socket(s)" in done.notes[-1]
    # 2 hops: one socket, its NUMA nodes joined under it
    done = import_rocm_smi(write(tmp_path, "one.txt", showtopo(2, 40, 2, "PCIE", [0, 1])))
    assert [nd.label for nd in done.topology.nodes][2:] == ["socket0", "numa0", "numa1"]
    bad = MI300X.read_text().replace("XGMI", "XXXX", 1)
    assert_clean_error(in_process("topology", "--from-rocm-smi", write(tmp_path, "bad.txt", bad)), 2, "XXXX", "row GPU0", "column GPU1")
    none = write(tmp_path, "none.txt", "GPU[0]\t\t: (Topology) Numa Node: 0\n")
    assert_clean_error(in_process("topology", "--from-rocm-smi", none), 2, "Link Type between two GPUs")
    assert_clean_error(in_process("topology", "--from-rocm-smi", MI300X, "--gpu-generation", "h100"), 2, "--gpu-generation", "mi300x, mi250")
    assert_clean_error(cli("topology", "--from-rocm-smi", MI300X, "--from-nvidia-smi", MI300X), 2, "exactly one", "--from-rocm-smi")
    # given as topology JSON, the file names its importer
    assert_clean_error(cli("topology", "-t", MI250X), 2, "rocm-smi --showtopo", "--from-rocm-smi")


# ------------------------------------------------------------------------------------ 4. SYS everywhere, NUMA says 4 + 4

def vm_matrix(numa: list[int], cells=lambda i, j: "SYS") -> str:
    n = len(numa)
    head = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    rows = "".join(f"GPU{i}\t" + "\t".join(" X " if i == j else cells(i, j) for j in range(n))
                   + f"\t{'0-47' if numa[i] == 0 else '48-95'}\t{numa[i]}\t\tN/A\n" for i in range(n))
    return head + rows


def test_sys_everywhere_is_placed_by_the_numa_column_and_noted(tmp_path):
    p = write(tmp_path, "vm.txt", vm_matrix([0, 0, 0, 0, 1, 1, 1, 1]))
    topo, notes = run(tmp_path, "--from-nvidia-smi", p, "--gpu-generation", "h100")
    assert labels(topo)[8:] == ["cpu0", "cpu1"]  # two sockets of four, not eight sockets behind a switch
    numa = [n for n in notes if n.startswith("NUMA:")]
    assert len(numa) == 1 and "12 GPU pair(s)" in numa[0] and "node 0: GPU0, GPU1, GPU2, GPU3" in numa[0]
    # a NIC on a GPU's switch stays with that GPU's NUMA node
    nic = vm_matrix([0, 0, 1, 1]).replace("\tGPU NUMA ID\n", "\tGPU NUMA ID\n", 1)
    head, *rows = nic.splitlines()
    cells = [r.split("\t") for r in rows]
    for i, r in enumerate(cells):
        r.insert(5, "PIX" if i == 0 else "SYS")
    text = head.replace("\tCPU Affinity", "\tNIC0\tCPU Affinity") + "\n" + "\n".join("\t".join(r) for r in cells)
    text += "\nNIC0\tPIX\tSYS\tSYS\tSYS\t X \n"
    t = import_nvidia_smi(write(tmp_path, "nic.txt", text), generation="a100").topology
    assert [nd.label for nd in t.nodes][4:] == ["cpu0", "cpu1"]
    # a cell within one NUMA node between GPUs the column puts on two: refused, one line
    clash = vm_matrix([0, 0, 1, 1], lambda i, j: "NODE")
    r = in_process("topology", "--from-nvidia-smi", write(tmp_path, "clash.txt", clash), "--gpu-generation", "h100")
    assert_clean_error(r, 2, "row GPU0, column GPU2", "says NODE", "NUMA Affinity", "node 1")


# ------------------------------------------------------------------------------------ 5. emulated PCIe bridges

def test_virtual_bridges_at_2_5_gts_x1_are_priced_as_x16_and_noted(tmp_path):
    a, b = "0000:00:04.0", "0000:00:05.0"
    slow = dict(speed="2.5 GT/s PCIe", width=1)
    p = write(tmp_path, "vm.xml", xml_doc(xml_gpu(a, 0, 80, nvl(b, 12), **slow) + "\n" + xml_gpu(b, 1, 80, nvl(a, 12), **slow)))
    topo, notes = run(tmp_path, "--from-nccl-xml", p)
    assert {lk["bandwidth_GBps"] for lk in topo["links"] if lk["src"] < 2 and lk["dst"] == 2} == {32.0}  # not 0.25
    said = " ".join(notes)
    assert "0000:00:04.0 (0.25 GB/s)" in said and "emulated bridge" in said and "x16 PCIe, 32 GB/s" in said


# ------------------------------------------------------------------------------------ 6. one rank, two GPUs

def test_two_gpus_with_one_rank_are_refused_naming_the_second(tmp_path):
    a, b = "0000:01:00.0", "0000:02:00.0"
    text = xml_doc(xml_gpu(a, 0) + "\n" + xml_gpu(b, 0))
    r = cli("topology", "--from-nccl-xml", write(tmp_path, "rank.xml", text))
    line = assert_clean_error(r, 2, "rank 0 is given to two GPUs", "line 7", "own rank")
    assert a in line and b in line


def test_imported_files_synthesize(tmp_path):
    out = tmp_path / "ncv4.json"
    assert in_process("topology", "--from-nccl-xml", NCV4, "-o", out).code == 0
    assert len(load_topology(out).gpus) == 4
    r = cli("synth", "-t", out, "-c", "allgather", "-s", "1MB", "--chunks", "1", "--time-limit", "20")
    assert r.code == 0, r.err[-2000:]
    assert "verified: True" in r.out


def test_cli_help_names_every_generation():
    import argparse

    from flowride.cli.topology import add_topologies

    sub = argparse.ArgumentParser().add_subparsers()
    add_topologies(sub)
    help_text = sub.choices["topology"].format_help()
    assert "--from-rocm-smi" in help_text
    assert all(s.name in help_text for s in SPECS)
