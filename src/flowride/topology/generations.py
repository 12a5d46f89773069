"""What each kind of link costs per GPU generation, and the builder the importers price links with.

`nvidia-smi topo -m`, NCCL's topology XML and `rocm-smi --showtopo` say *which* links a machine
has (NVLink counts, PCIe bridges, host bridges, CPU sockets) but not their bandwidth or latency, so
the importers (``nvsmi.py``, ``nccl_xml.py``, ``rocm_smi.py``) price every link from one table per
GPU generation, built here from ``gpu_specs.SPECS`` (each figure cited there). The numbers are
nominal (datasheet rates, decimal GB/s per direction), not measured; alphas come from the built-in
presets where those have one (``NVLINK_ALPHA``, the DGX-2 and H100 NVSwitch hops, MI250's xGMI) and
are stated assumptions otherwise. ``--link-table FILE`` overrides any entry. docs/topology-import.md
gives the table with its sources.

Link kinds (the table's keys; a generation has only those it has):

- ``nvlink``: one NVLink between two GPUs, per link (an NV2 cell is 2 x this);
- ``nvswitch``: one NVLink from a GPU into the NVSwitch fabric, per link, alpha per hop;
- ``xgmi``: one AMD Infinity Fabric (xGMI) link between two GPUs, per link;
- ``pcie``: a x16 PCIe link of the generation (GPU or switch to a PCIe switch or host bridge);
- ``node``: into a CPU socket (NUMA node) from its host bridges, GPUs or PCIe switches;
- ``sys``: between CPU sockets (QPI / UPI / xGMI).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import networkx as nx

from flowride.errors import InputError
from flowride.files import read_json
from flowride.sizes import MAX_ALPHA_US, MAX_BANDWIDTH_GBPS
from flowride.topology.builtins import (
    DGX2_NVSWITCH_ALPHA,
    H100_NVLINK_ALPHA,
    MI250_XGMI_ALPHA,
    NVLINK_ALPHA,
)
from flowride.topology.gpu_specs import SPECS, GpuSpec, spec
from flowride.topology.model import Link, Node, Topology

US = 1e-6
PCIE_ALPHA = 1.0 * US  # assumed: one PCIe hop (no built-in has one)
SYS_ALPHA = 1.5 * US  # assumed: a crossing between CPU sockets
LINK_KINDS = ("nvlink", "nvswitch", "xgmi", "pcie", "node", "sys")
NVLINK_KINDS = frozenset({"nvlink", "nvswitch", "xgmi"})  # the GPU fabric: what --nvlink-only keeps


@dataclass(frozen=True)
class LinkCost:
    bandwidth_GBps: float  # per direction; per link for nvlink, nvswitch and xgmi
    alpha_s: float

    @property
    def alpha_us(self) -> float:
        return self.alpha_s * 1e6


@dataclass(frozen=True)
class LinkTable:
    """One generation's prices: a :class:`LinkCost` per link kind it has, the GPU-to-GPU links one
    GPU has (which tells a bonded direct link from a port into NVSwitch), whether its NVSwitch
    replicates, and ``fabric``, the kind of its GPU-to-GPU links (``nvlink``, ``xgmi``, or ""
    for a PCIe-only card)."""

    generation: str
    costs: dict[str, LinkCost]
    nvlinks_per_gpu: int  # GPU-to-GPU links (NVLink or xGMI) per GPU
    nvswitch_copy: bool
    fabric: str = "nvlink"
    vendor: str = "nvidia"

    def cost(self, kind: str) -> LinkCost:
        if kind not in self.costs:
            raise InputError("gpu_generation", f"a {self.generation} GPU has no {kind} links",
                             "give the generation of the GPUs in the file (--gpu-generation NAME)")
        return self.costs[kind]

    @property
    def scalar_keys(self) -> tuple[str, ...]:
        """The ``--link-table`` keys besides link kinds that this table takes."""
        return {"nvlink": ("nvlinks_per_gpu", "nvswitch_copy"), "xgmi": ("xgmi_links_per_gpu",)}.get(self.fabric, ())


def _table(s: GpuSpec) -> LinkTable:
    """The link table of one spec: its fabric's links, PCIe and the CPU fabric at its PCIe
    generation's x16 rate, and the inter-socket link of its era (20 GB/s for Gen3 hosts, else 40)."""
    costs: dict[str, LinkCost] = {}
    if s.fabric == "nvlink":
        costs["nvlink"] = LinkCost(s.link_GBps, NVLINK_ALPHA)
        costs["nvswitch"] = LinkCost(s.link_GBps, DGX2_NVSWITCH_ALPHA if s.name == "v100" else H100_NVLINK_ALPHA)
    elif s.fabric == "xgmi":
        costs["xgmi"] = LinkCost(s.link_GBps, MI250_XGMI_ALPHA)
    costs["pcie"] = LinkCost(s.pcie_GBps, PCIE_ALPHA)
    costs["node"] = LinkCost(s.pcie_GBps, PCIE_ALPHA)
    costs["sys"] = LinkCost(20.0 if s.pcie_gen <= 3 else 40.0, SYS_ALPHA)
    return LinkTable(s.name, costs, s.links, s.switch_copy, s.fabric, s.vendor)


# Every generation of gpu_specs.SPECS (each with its source there), in its order: v100, a100, h100, ...
GENERATIONS: dict[str, LinkTable] = {s.name: _table(s) for s in SPECS}


def generation_table(name: str) -> LinkTable:
    """The table of ``name`` (v100, a100, h100, ...); an unknown name lists the known ones."""
    return GENERATIONS[spec(name).name]


def _number(value: object, where: str, lo: float, hi: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(where, f"{value!r} is not a number", f"give {what} in {lo:g}..{hi:g}")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise InputError(where, f"{value!r} is outside {lo:g}..{hi:g} {what}", f"give {what} in that range")
    return float(value)


def apply_link_table(table: LinkTable, data: object, where: str = "link_table") -> LinkTable:
    """``table`` with the entries of ``data`` (the parsed ``--link-table`` JSON) replacing its
    own; keys left out keep the generation's values. Unknown keys and out-of-range numbers are
    errors naming the key (``where`` prefixes it) and listing the known ones."""
    if not isinstance(data, dict):
        raise InputError(where, "is not a JSON object", '{"sys": {"bandwidth_GBps": 30}} overrides one entry')
    known = (*table.costs, *table.scalar_keys)
    costs = dict(table.costs)
    links, copy = table.nvlinks_per_gpu, table.nvswitch_copy
    for key, value in data.items():
        at = f"{where}: {key}"
        if key not in known:
            raise InputError(at, f"unknown key {key!r}", f"known keys: {', '.join(known)} (those of {table.generation})")
        if key in ("nvlinks_per_gpu", "xgmi_links_per_gpu"):
            links = int(_number(value, at, 1, 1024, "links"))
            if links != value:
                raise InputError(at, f"{value!r} is not a whole number", "give the NVLinks one GPU has, e.g. 18")
            continue
        if key == "nvswitch_copy":
            if not isinstance(value, bool):
                raise InputError(at, f"{value!r} is not true or false", "true: the NVSwitch replicates (NVLS)")
            copy = value
            continue
        if not isinstance(value, dict):
            raise InputError(at, "is not an object", f'write "{key}": {{"bandwidth_GBps": 25, "alpha_us": 0.7}}')
        bad = sorted(set(value) - {"bandwidth_GBps", "alpha_us"})
        if bad:
            raise InputError(f"{at}.{bad[0]}", f"unknown key {bad[0]!r}", "known keys: bandwidth_GBps, alpha_us")
        old = costs[key]
        bw = _number(value["bandwidth_GBps"], f"{at}.bandwidth_GBps", 1e-3, MAX_BANDWIDTH_GBPS, "GB/s") \
            if "bandwidth_GBps" in value else old.bandwidth_GBps
        alpha = _number(value["alpha_us"], f"{at}.alpha_us", 0.0, MAX_ALPHA_US, "microseconds") * US \
            if "alpha_us" in value else old.alpha_s
        costs[key] = LinkCost(bw, alpha)
    return replace(table, costs=costs, nvlinks_per_gpu=links, nvswitch_copy=copy)


def load_link_table(table: LinkTable, path: str | Path | None) -> LinkTable:
    """``table`` with the overrides of the JSON file at ``path`` (none when ``path`` is None)."""
    if path is None:
        return table
    data = read_json(path, "link_table", 'give a JSON file such as {"pcie": {"bandwidth_GBps": 24}}')
    return apply_link_table(table, data, str(path))


@dataclass
class Fabric:
    """Nodes and both-way links priced by kind, built into one validated :class:`Topology`.

    GPUs are added first (so their ids are the ranks 0..n-1), switches after. Each link remembers
    its kind so ``nvlink_only`` can drop everything but NVLink and NVSwitch."""

    table: LinkTable
    nodes: list[Node] = field(default_factory=list)
    links: list[tuple[Link, str]] = field(default_factory=list)

    def gpu(self, label: str) -> int:
        if any(not nd.is_gpu for nd in self.nodes):
            raise AssertionError("add every GPU before the first switch")
        self.nodes.append(Node(len(self.nodes), "gpu", group=0, label=label[:200]))
        return len(self.nodes) - 1

    def switch(self, label: str, copy: bool = False) -> int:
        self.nodes.append(Node(len(self.nodes), "switch", copy=copy, group=0, label=label[:200]))
        return len(self.nodes) - 1

    def both(self, a: int, b: int, kind: str, count: float = 1.0, bandwidth: float | None = None,
             alpha_scale: float = 1.0) -> None:
        """A link each way between ``a`` and ``b``: ``count`` x the kind's bandwidth unless
        ``bandwidth`` is given (a PCIe link whose own speed the file states)."""
        cost = self.table.cost(kind)
        bw = float(bandwidth) if bandwidth is not None else count * cost.bandwidth_GBps
        alpha = cost.alpha_s * alpha_scale
        self.links.append((Link(a, b, bw, alpha), kind))
        self.links.append((Link(b, a, bw, alpha), kind))

    def join_sockets(self, sockets: list[int]) -> None:
        """Two sockets: one ``sys`` link each way. Three or more: one inter-socket switch, each
        hop half the ``sys`` alpha so a socket-to-socket crossing costs one alpha."""
        if len(sockets) == 2:
            self.both(sockets[0], sockets[1], "sys")
        elif len(sockets) > 2:
            hub = self.switch("inter-socket")
            for s in sockets:
                self.both(s, hub, "sys", alpha_scale=0.5)

    def build(self, name: str, description: str, where: str, nvlink_only: bool = False) -> Topology:
        """The topology; with ``nvlink_only`` only NVLink and NVSwitch links and the switches they
        touch. A GPU the links leave apart is an error naming it (and ``nvlink_only`` when set)."""
        nodes, links = list(self.nodes), [lk for lk, _ in self.links]
        gpus = [nd.id for nd in nodes if nd.is_gpu]
        if len(gpus) < 2:
            raise InputError(where, f"describes {len(gpus)} GPU(s)", "a collective needs at least two GPUs")
        if nvlink_only:
            links = [lk for lk, kind in self.links if kind in NVLINK_KINDS]
        g = nx.Graph()
        g.add_nodes_from(gpus)
        g.add_edges_from((lk.src, lk.dst) for lk in links)
        apart = [v for v in gpus if not nx.has_path(g, gpus[0], v)]
        if apart:
            a, b = nodes[apart[0]].label, nodes[gpus[0]].label
            if nvlink_only:
                raise InputError("nvlink_only", f"NVLink alone does not join {a} to {b}", "leave --nvlink-only out: PCIe and the CPUs then join them")
            raise InputError(where, f"nothing in the file joins {a} to {b}", "the file must show a way (NVLink or PCIe) between every two GPUs")
        if nvlink_only:
            kept = sorted(set(gpus) | {v for lk in links for v in (lk.src, lk.dst)})
            new = {old: i for i, old in enumerate(kept)}
            nodes = [replace(nodes[old], id=new[old]) for old in kept]
            links = [Link(new[lk.src], new[lk.dst], lk.bandwidth_GBps, lk.alpha_s) for lk in links]
        return Topology(name[:200], tuple(nodes), tuple(links), description=description[:10_000],
                        params={"generation": self.table.generation, "nvlink_only": nvlink_only})


def pcie_lane_GBps(link_speed: str) -> float | None:
    """Nominal GB/s per lane per direction of a PCIe link speed such as ``"16.0 GT/s PCIe"``
    (gen1 0.25, gen2 0.5, gen3 1, gen4 2, gen5 4, gen6 8); None when the text names no speed."""
    head = link_speed.strip().split(" ")[0] if link_speed.strip() else ""
    try:
        gts = float(head)
    except ValueError:
        return None
    if not math.isfinite(gts) or gts <= 0:
        return None
    # gen1/2 use 8b/10b coding (0.8 useful bits per transfer); gen3+ 128b/130b, rounded to 1
    return gts * 0.8 / 8 if gts < 8 else gts / 8


TOO_BIG = "give the file the tool wrote, unedited"  # an import file over its size limit


@dataclass(frozen=True)
class Imported:
    """An imported topology and what the importer decided on the way (the generation it guessed,
    how it modelled NVSwitch and PCIe): the CLI prints ``notes``; the topology's description keeps them."""

    topology: Topology
    notes: tuple[str, ...]



def choose_table(generation: str | None, guessed: tuple[str, str] | None, link_table: str | Path | None,
                 vendor: str = "nvidia") -> tuple[LinkTable, str]:
    """The priced table and the note saying where it came from: ``generation`` when given (of
    ``vendor``, whose tool wrote the file), else the importer's ``guessed`` (name, reason); then
    ``link_table``'s overrides."""
    if generation is not None:
        table = generation_table(generation)
        if table.vendor != vendor:
            mine = ", ".join(s.name for s in SPECS if s.vendor == vendor)
            raise InputError("gpu_generation", f"{table.generation} is not an {vendor.upper()} GPU; the file describes "
                             f"{vendor.upper()} GPUs", f"use one of {mine}")
        note = f"GPU generation {table.generation} (given: {spec(table.generation).title})"
    elif guessed is not None:
        table, note = generation_table(guessed[0]), guessed[1]
    else:
        raise AssertionError("a generation or a guess")
    table = load_link_table(table, link_table)
    if link_table is not None:
        note += f"; link table overridden by {link_table}"
    note += "; link prices are nominal datasheet values, not measured (docs/topology-import.md)"
    return table, note
