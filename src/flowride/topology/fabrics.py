"""Clusters as people build them: N nodes of one node type joined by a network.

A node type (:data:`NODE_TYPES`) is the server: its GPUs, how they are joined inside the node
(NVSwitch, a full Infinity Fabric mesh, or the hybrid meshes of the TE-CCL presets) and its NICs.
A network joins the NICs of all nodes:

- ``rail`` (rail-optimized): NIC k of every node on leaf switch k ("rail" k); one switch per rail
  stands for a non-blocking rail (the SuperPOD's rail-aligned leaves and their spines). With
  ``rails`` fewer than the NICs of a node, NIC k goes to rail k mod rails (ForestColl's A100
  model has two: even and odd NICs);
- ``clos``: leaf/spine. Each leaf takes every NIC of ``leaf_nodes`` nodes; every leaf is joined to
  every one of ``spines`` spines, with ``oversubscription`` times less bandwidth up than down;
- ``single``: every NIC on one switch.

A NIC serves one GPU (``nic_share`` 1: the GPU's link to its leaf runs at the NIC's speed) or
several (``nic_share`` 2, 4 or 8: a NIC node, modelled as a switch, joined to its GPUs over PCIe
and to the leaf at the NIC's speed). Every switch forwards without copying, except the
third-generation (and later) NVSwitch, whose NVLink SHARP multicasts (NVLS). Every switch cuts
through (:mod:`flowride.topology.timing`).

Each figure of :data:`NODE_TYPES` names its public source in ``sources`` (docs/fabrics.md has the
table). Latencies are assumptions, stated as such and settable: vendors publish none per hop.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from flowride.errors import InputError
from flowride.sizes import MAX_GPUS, MAX_LINKS, MAX_NODES
from flowride.topology.model import Link, Node, Topology

US = 1e-6

# Inside a DGX-1 / NDv2 (hybrid cube-mesh) and an MI250 chassis, as the TE-CCL artifact publishes
# them (GB/s per direction per GPU pair; MI250 in units of 50 GB/s). The built-ins use the same.
DGX1_ADJ: dict[int, dict[int, float]] = {
    0: {1: 50, 2: 25, 3: 25, 4: 50},
    1: {0: 50, 2: 25, 3: 50, 5: 25},
    2: {0: 25, 1: 25, 3: 50, 6: 50},
    3: {0: 25, 1: 50, 2: 50, 7: 25},
    4: {0: 50, 5: 50, 6: 25, 7: 25},
    5: {1: 25, 4: 50, 6: 25, 7: 50},
    6: {2: 50, 4: 25, 5: 25, 7: 50},
    7: {3: 25, 4: 25, 5: 50, 6: 50},
}
MI250_UNIT_GBPS = 50.0
MI250_ADJ: dict[int, dict[int, int]] = {
    0: {1: 4, 4: 2, 8: 1},
    1: {0: 4, 5: 1, 9: 1, 10: 1},
    2: {3: 4, 6: 1, 10: 1, 9: 1},
    3: {2: 4, 7: 2, 11: 1},
    4: {6: 1, 5: 4, 0: 2},
    5: {1: 1, 4: 4, 7: 1, 6: 1},
    6: {4: 1, 7: 4, 2: 1, 5: 1},
    7: {5: 1, 6: 4, 3: 2},
    8: {0: 1, 9: 4, 12: 2},
    9: {1: 1, 2: 1, 8: 4, 13: 1},
    10: {1: 1, 2: 1, 11: 4, 14: 1},
    11: {3: 1, 10: 4, 15: 2},
    12: {8: 2, 13: 4, 14: 1},
    13: {9: 1, 12: 4, 15: 1, 14: 1},
    14: {10: 1, 12: 1, 13: 1, 15: 4},
    15: {11: 2, 13: 1, 14: 4},
}


@dataclass(frozen=True)
class NodeType:
    """One server model. Bandwidths are GB/s per direction (vendors quote both directions added)."""

    name: str
    gpu: str
    gpus: int
    inside: str  # "nvswitch" (one switch per node), "mesh" (one link per GPU pair), "dgx1", "mi250"
    link_GBps: float  # nvswitch: each GPU's NVLink to the switch; mesh: each pair's link
    multicast: bool  # the NVSwitch replicates (NVLink SHARP / NVLS)
    nics: int  # compute NICs per node
    nic_Gbps: float  # each NIC's line rate, Gb/s
    pcie_GBps: float  # GPU <-> NIC PCIe, per direction (used when a NIC serves several GPUs)
    link_alpha_us: float  # per hop inside the node (GPU -> NVSwitch, NVSwitch -> GPU, mesh link)
    sources: tuple[str, ...]
    note: str = ""

    @property
    def nic_share(self) -> int:
        """GPUs per NIC by default."""
        return self.gpus // self.nics


_NVL = "nvidia.com/en-us/data-center/nvlink (NVLink 2/3/4: 25 GB/s per direction per link; NVLink 5: 50)"
_SPOD_H100 = "docs.nvidia.com/dgx-superpod/reference-architecture-scalable-infrastructure-h100 (rails, 1:1 fat tree)"

NODE_TYPES: dict[str, NodeType] = {
    "dgx-a100": NodeType(
        "dgx-a100", "A100 SXM4", 8, "nvswitch", 300.0, False, 8, 200, 31.5, 0.35,
        (_NVL + ": A100 12 links, 600 GB/s both ways",
         "NVIDIA A100 architecture whitepaper: six second-generation NVSwitch (no NVLink SHARP)",
         "DGX A100 user guide DU-09821-001: 8 single-port ConnectX-6 HDR 200 Gb/s, one per GPU; PCIe Gen4 x16 31.5 GB/s")),
    "a800": NodeType(
        "a800", "A800 SXM4", 8, "nvswitch", 200.0, False, 8, 200, 31.5, 0.35,
        ("Reuters via tweakers.net/nieuws/203182: A800 NVLink cut to 400 GB/s both ways (8 links)",
         "aliyun/SimAI astra-sim calbusbw.h: A800_NVLINKS 8, PCIe Gen4",
         "NICs vary by builder (4 or 8 x HDR 200 Gb/s): 8 x 200 Gb/s by default, --nic-share 2 for four"),
        "NIC count is not standard for A800 servers"),
    "dgx-h100": NodeType(
        "dgx-h100", "H100 SXM5", 8, "nvswitch", 450.0, True, 8, 400, 63.0, 0.35,
        ("nvidia.com Hopper architecture page: 900 GB/s both ways per GPU (18 NVLink4 links)",
         "developer.nvidia.com blog, third-generation NVSwitch: multicast and NVLink SHARP (NCCL NVLS)",
         "DGX H100 user guide 1.2.3: 8 single-port ConnectX-7 400 Gb/s, one per GPU; PCIe Gen5", _SPOD_H100)),
    "h800": NodeType(
        "h800", "H800 SXM5", 8, "nvswitch", 200.0, True, 8, 400, 63.0, 0.35,
        ("aliyun/SimAI calbusbw.h: H800_NVLINKS 8 (400 GB/s both ways), NVLS supported",
         "DeepSeek, arXiv 2505.09343: 8 x 400 Gb/s ConnectX-7 per node, one per GPU",
         "docs.nvidia.com AI Enterprise vGPU NVSwitch page: HGX H800 has third-generation NVSwitch with multicast")),
    "hgx-b200": NodeType(
        "hgx-b200", "B200", 8, "nvswitch", 900.0, True, 8, 400, 63.0, 0.35,
        ("docs.nvidia.com DGX SuperPOD GB200 network fabrics: 18 NVLink 5 links, 1.8 TB/s both ways per GPU",
         "docs.nvidia.com DGX B200 user guide: 2 NVLink switch chips (SHARP, multicast); 8 x ConnectX-7 400 Gb/s, one per GPU",
         "HGX B300 takes 8 x ConnectX-8 800 Gb/s (DGX SuperPOD B300 reference architecture): --nic 800Gbps")),
    "mi300x": NodeType(
        "mi300x", "MI300X OAM", 8, "mesh", 64.0, False, 8, 400, 63.0, 0.7,
        ("AMD: 896 GB/s aggregate Infinity Fabric peer bandwidth per GPU = 7 links x 128 GB/s both ways (x16 at 32 Gb/s)",
         "Azure ND MI300X v5 series: 8 x 400 Gb/s NDR InfiniBand, one per GPU; PCIe Gen5 x16"),
        "no switch: one 64 GB/s (per direction) link per GPU pair"),
    "dgx2": NodeType(
        "dgx2", "V100 SXM3", 16, "nvswitch", 125.0, False, 8, 100, 15.75, 0.35,
        ("TE-CCL (SIGCOMM 2024) artifact: 125 GB/s per GPU on the NVSwitch, alpha 0.35 us (the dgx2 built-in)",
         "DGX-2 launch (pcper.com 2018): 8 x 100 Gb/s EDR InfiniBand, one per two GPUs; PCIe Gen3"),
        "NVLink figure as the TE-CCL artifact models it (the datasheet says 150 GB/s per direction)"),
    "ndv2": NodeType(
        "ndv2", "V100 SXM2", 8, "dgx1", 0.0, False, 1, 100, 15.75, 0.7,
        ("TE-CCL artifact: DGX-1 hybrid cube-mesh, 25/50 GB/s per pair, alpha 0.7 us (the dgx1 built-in)",
         "Microsoft Learn NDv2 series: 100 Gb/s EDR InfiniBand back-end (one per VM as TACCL/MSCCL evaluate it)")),
    "mi250": NodeType(
        "mi250", "MI250 GCD", 16, "mi250", 0.0, False, 8, 200, 25.0, 0.7,
        ("TE-CCL artifact: 16 GCDs, xGMI in units of 50 GB/s (the mi250 built-in)",
         "TE-CCL artifact multi-chassis MI250: one NIC per two GCDs at 25 GB/s"),
        "a 16-GCD node as the TE-CCL artifact models it; public MI250X nodes hold 8 GCDs"),
}

NETWORKS = ("rail", "clos", "single")
DEFAULT_NIC_ALPHA_US = 1.0  # GPU -> leaf and leaf -> GPU: NIC, PCIe and cable (assumed; ConnectX quotes < 0.6 us)
DEFAULT_SWITCH_ALPHA_US = 0.15  # leaf <-> spine: one switch port to port (Quantum: 0.13-0.33 us quoted)


@dataclass(frozen=True)
class FabricSpec:
    """What to build; every field has the default a user of that node type would expect."""

    node: str
    nodes: int = 1
    network: str = "rail"
    nic_Gbps: float | None = None  # None: the node type's
    nic_share: int | None = None  # GPUs per NIC; None: the node type's
    rails: int | None = None  # rail: rail switches, NIC k on rail k mod rails (None: one per NIC of a node)
    leaf_nodes: int | None = None  # clos: nodes per leaf (None: 2, at most all)
    spines: int | None = None  # clos: spine switches (None: NICs per node)
    oversubscription: float = 1.0  # clos: leaf down / up bandwidth
    nvlink_GBps: float | None = None  # override the node type's in-node link bandwidth
    multicast: bool | None = None  # override whether the NVSwitch multicasts
    nic_latency_us: float = DEFAULT_NIC_ALPHA_US
    switch_latency_us: float = DEFAULT_SWITCH_ALPHA_US
    link_latency_us: float | None = None  # None: the node type's

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def parse_nic(text: str | float | int) -> float:
    """A NIC line rate in Gb/s from ``400``, ``400G``, ``400Gbps``, ``400Gb/s`` or ``50GB/s``."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        v = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z/]*)\s*", str(text))
        unit = m.group(2) if m else None
        if unit in ("GBps", "GB/s"):  # bytes
            v = float(m.group(1)) * 8
        elif unit is not None and unit.lower() in ("", "g", "gbps", "gb/s", "gbit/s", "gbe"):
            v = float(m.group(1))
        else:
            raise InputError("nic", f"{text!r} is not a NIC speed", "write e.g. 400Gbps, 400G or 50GB/s")
    if not 1 <= v <= 100_000:
        raise InputError("nic", f"{v:g} Gb/s is outside 1..100000 Gb/s", "write e.g. 200Gbps, 400Gbps or 800Gbps")
    return v


def _check(spec: FabricSpec) -> tuple[NodeType, int, float]:
    nt = NODE_TYPES.get(spec.node)
    if nt is None:
        raise InputError("node", f"unknown node type {spec.node!r}", f"choose one of {', '.join(NODE_TYPES)}")
    if not isinstance(spec.nodes, int) or isinstance(spec.nodes, bool) or spec.nodes < 1:
        raise InputError("nodes", f"{spec.nodes!r} is not a node count", "give 1 or more")
    if spec.network not in NETWORKS:
        raise InputError("network", f"unknown network {spec.network!r}", f"choose one of {', '.join(NETWORKS)}")
    share = nt.nic_share if spec.nic_share is None else spec.nic_share
    if not isinstance(share, int) or isinstance(share, bool) or share < 1 or nt.gpus % share:
        ok = ", ".join(str(d) for d in range(1, nt.gpus + 1) if nt.gpus % d == 0)
        raise InputError("nic_share", f"{share!r} GPUs per NIC does not divide {nt.gpus} GPUs", f"give one of {ok}")
    nic = nt.nic_Gbps if spec.nic_Gbps is None else parse_nic(spec.nic_Gbps)
    if not 1.0 <= spec.oversubscription <= 64:
        raise InputError("oversubscription", f"{spec.oversubscription:g} is outside 1..64", "give e.g. 1 (non-blocking), 2 or 3")
    for name in ("rails", "leaf_nodes", "spines"):
        v = getattr(spec, name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise InputError(name, f"{v!r} is not a positive count", f"give {name} >= 1 or leave it out")
    for name in ("nic_latency_us", "switch_latency_us", "link_latency_us"):
        v = getattr(spec, name)
        if v is not None and not 0 <= v <= 1e4:
            raise InputError(name, f"{v!r} is outside 0..10000 us", "give a latency in microseconds")
    if spec.nvlink_GBps is not None and not 1e-3 <= spec.nvlink_GBps <= 1e6:
        raise InputError("nvlink_GBps", f"{spec.nvlink_GBps!r} is outside 0.001..1e6 GB/s", "give GB/s per direction")
    if spec.multicast and nt.inside != "nvswitch":
        raise InputError("multicast", f"{nt.name} has no NVSwitch to multicast", "leave it out")
    gpus = nt.gpus * spec.nodes
    nics = gpus // share
    if gpus > MAX_GPUS or gpus * (nt.gpus + 6) > MAX_LINKS or gpus + nics + spec.nodes + 64 > MAX_NODES:
        raise InputError("nodes", f"{spec.nodes:,} x {nt.name} gives {gpus:,} GPUs, over the topology limits",
                         f"give at most {MAX_GPUS // nt.gpus:,} nodes")
    return nt, share, nic


def fabric(spec: FabricSpec) -> Topology:
    """Build the cluster ``spec`` describes (node ids: GPUs node-major, then the switches)."""
    nt, share, nic_Gbps = _check(spec)
    nic_GBps = nic_Gbps / 8
    n, per = spec.nodes, nt.gpus
    link_alpha = (nt.link_alpha_us if spec.link_latency_us is None else spec.link_latency_us) * US
    nodes: list[Node] = []
    links: list[Link] = []

    def node(kind: str, copy: bool = False, group: int | None = None, label: str = "") -> int:
        nodes.append(Node(len(nodes), kind, copy=copy, group=group, label=label))  # type: ignore[arg-type]
        return len(nodes) - 1

    def both(a: int, b: int, gbps: float, alpha: float) -> None:
        links.append(Link(a, b, float(gbps), float(alpha)))
        links.append(Link(b, a, float(gbps), float(alpha)))

    for c in range(n):
        for g in range(per):
            node("gpu", group=c, label=f"n{c}.g{g}")
    multicast = nt.multicast if spec.multicast is None else spec.multicast
    bw = nt.link_GBps if spec.nvlink_GBps is None else spec.nvlink_GBps
    for c in range(n):
        base = c * per
        if nt.inside == "nvswitch":
            sw = node("switch", copy=multicast, group=c, label=f"n{c}.nvswitch")
            for g in range(per):
                both(base + g, sw, bw, link_alpha)
        elif nt.inside == "mesh":
            for i in range(per):
                for j in range(i + 1, per):
                    both(base + i, base + j, bw, link_alpha)
        else:
            adj = DGX1_ADJ if nt.inside == "dgx1" else MI250_ADJ
            unit = 1.0 if nt.inside == "dgx1" else MI250_UNIT_GBPS
            scale = 1.0 if spec.nvlink_GBps is None else spec.nvlink_GBps / max(v * unit for p in adj.values() for v in p.values())
            for i, peers in adj.items():
                for j, v in peers.items():
                    links.append(Link(base + i, base + j, float(v * unit * scale), link_alpha))
    # NIC ports: per node, one attachment per NIC (the GPU itself, or a NIC switch on PCIe)
    ports: list[list[int]] = []
    nic_alpha = spec.nic_latency_us * US
    for c in range(n):
        row = []
        for k in range(per // share):
            if share == 1:
                row.append(c * per + k)
            else:
                w = node("switch", copy=False, group=c, label=f"n{c}.nic{k}")
                for g in range(k * share, (k + 1) * share):
                    both(c * per + g, w, nt.pcie_GBps, 0.0)
                row.append(w)
        ports.append(row)
    if n > 1:
        _network(spec, ports, nic_GBps, nic_alpha, spec.switch_latency_us * US, node, both)
    kind = f"{n} x {nt.name}" + (f" on a {spec.network} network" if n > 1 else "")
    desc = (f"{kind}: {per} {nt.gpu} per node, {'NVSwitch' if nt.inside == 'nvswitch' else nt.inside} inside"
            f"{' with NVLS multicast' if multicast and nt.inside == 'nvswitch' else ''}, {per // share} x {nic_Gbps:g} Gb/s NICs per node"
            f" ({share} GPU{'s' if share > 1 else ''} per NIC)")
    name = f"{nt.name}-{n}n" + (f"-{spec.network}" if n > 1 else "")
    return Topology(name, tuple(nodes), tuple(links), description=desc, params={"fabric": spec.as_dict()})


def _network(spec: FabricSpec, ports: list[list[int]], nic_GBps: float, nic_alpha: float, sw_alpha: float, node, both) -> None:
    """Join every node's NIC ports: rails, a leaf/spine Clos, or one switch."""
    n, k = len(ports), len(ports[0])
    if spec.network == "rail":
        rails = [node("switch", label=f"rail{r}") for r in range(min(k, spec.rails or k))]
        for c in range(n):
            for r, p in enumerate(ports[c]):
                both(p, rails[r % len(rails)], nic_GBps, nic_alpha)
    elif spec.network == "single":
        sw = node("switch", label="switch")
        for c in range(n):
            for p in ports[c]:
                both(p, sw, nic_GBps, nic_alpha)
    else:
        per_leaf = min(n, spec.leaf_nodes or 2)
        spines = spec.spines or k
        leaves = []
        for first in range(0, n, per_leaf):
            leaf = node("switch", label=f"leaf{len(leaves)}")
            members = range(first, min(n, first + per_leaf))
            for c in members:
                for p in ports[c]:
                    both(p, leaf, nic_GBps, nic_alpha)
            leaves.append((leaf, len(members) * k * nic_GBps))
        if len(leaves) > 1:
            tops = [node("switch", label=f"spine{s}") for s in range(spines)]
            for leaf, down in leaves:
                for top in tops:
                    both(leaf, top, down / spec.oversubscription / spines, sw_alpha)


FABRIC_PARAMS = ("node", "nodes", "network", "nic", "nic_share", "rails", "leaf_nodes", "spines", "oversubscription",
                 "nic_latency_us", "switch_latency_us", "link_latency_us")


def build_fabric(node: str = "dgx-h100", nodes: int = 2, network: str = "rail", nic: str | float | None = None,
                 nic_share: int | None = None, rails: int | None = None, leaf_nodes: int | None = None, spines: int | None = None,
                 oversubscription: float = 1.0, nic_latency_us: float = DEFAULT_NIC_ALPHA_US,
                 switch_latency_us: float = DEFAULT_SWITCH_ALPHA_US, link_latency_us: float | None = None) -> Topology:
    """The built-in ``fabric`` (``flowride synth -t fabric --node dgx-h100 --nodes 16 --network rail
    --nic 400Gbps``): :func:`fabric` with the CLI's names."""
    return fabric(FabricSpec(node, nodes, network, None if nic is None else parse_nic(nic), nic_share, rails, leaf_nodes, spines,
                             float(oversubscription), None, None, float(nic_latency_us), float(switch_latency_us),
                             None if link_latency_us is None else float(link_latency_us)))


def fabric_from_dict(data: Any, where: str = "fabric") -> Topology:
    """The JSON form (``{"fabric": {...}}`` in a topology file): the fields of :class:`FabricSpec`,
    ``nic`` as text (``"400Gbps"``) or ``nic_Gbps`` as a number."""
    if not isinstance(data, dict):
        raise InputError(where, "is not an object", 'write e.g. {"node": "dgx-h100", "nodes": 4, "network": "rail"}')
    known = set(FabricSpec.__dataclass_fields__) | {"nic"}
    extra = sorted(set(data) - known)
    if extra:
        raise InputError(f"{where}.{extra[0]}", "is not a fabric field", f"known fields: {', '.join(sorted(known))}")
    if "node" not in data:
        raise InputError(f"{where}.node", "is missing", f"choose one of {', '.join(NODE_TYPES)}")
    kw = dict(data)
    if "nic" in kw:
        if "nic_Gbps" in kw:
            raise InputError(f"{where}.nic", "is given together with nic_Gbps", "give one of them")
        try:
            kw["nic_Gbps"] = parse_nic(kw.pop("nic"))
        except InputError as e:
            raise InputError(f"{where}.nic", e.problem, e.fix) from None
    for key in ("oversubscription", "nic_latency_us", "switch_latency_us", "link_latency_us", "nvlink_GBps", "nic_Gbps"):
        v = kw.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise InputError(f"{where}.{key}", f"{v!r} is not a number", "give a number")
        if v is not None:
            kw[key] = float(v)
    try:
        return fabric(FabricSpec(**kw))
    except InputError as e:
        raise InputError(f"{where}.{e.field}", e.problem, e.fix) from None


def node_type_table() -> list[dict[str, Any]]:
    """One row per node type with its figures and sources (``flowride topologies`` prints it)."""
    rows = []
    for nt in NODE_TYPES.values():
        per_gpu = nt.link_GBps if nt.inside == "nvswitch" else (nt.link_GBps * (nt.gpus - 1) if nt.inside == "mesh" else None)
        rows.append({"node": nt.name, "gpu": nt.gpu, "gpus": nt.gpus, "inside": nt.inside, "multicast": nt.multicast,
                     "scale_up_GBps_per_dir": per_gpu, "nics": nt.nics, "nic_Gbps": nt.nic_Gbps, "sources": list(nt.sources),
                     "note": nt.note})
    return rows

