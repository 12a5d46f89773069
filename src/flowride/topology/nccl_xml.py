"""A topology from NCCL's topology XML (what ``NCCL_TOPO_DUMP_FILE`` writes, ``NCCL_TOPO_FILE`` reads).

The file is a tree: ``<system>`` holds one ``<cpu numaid=...>`` per NUMA node; a CPU holds
``<pci busid=... link_speed=... link_width=...>`` elements, nested where PCIe switches are; a GPU
is a ``<pci>`` holding ``<gpu dev=... sm=... rank=...>``, whose ``<nvlink target=BUSID count=N
tclass=...>`` children name its NVLinks. What is built (docs/topology-import.md):

- an NVLink whose ``tclass`` is a GPU class (``0x03....``): a direct link each way, count x the
  generation's NVLink bandwidth (both GPUs must list it with the same count); one whose target is
  the GPU's own bus id (Azure's NC A100 v4 file) is paired by ``placing.pair_self_links``, noted;
- an NVLink whose ``tclass`` is ``0x068000`` (an NVSwitch): a link into one NVSwitch node, as NCCL
  merges every NVSwitch into one; a GPU's counts to all NVSwitches add up;
- PCIe: a ``<pci>`` that leads to two or more GPUs becomes a PCIe switch (one that leads to one
  adds no node), each link priced by its own ``link_speed`` x ``link_width`` (the generation's
  PCIe entry, noted, where they are missing or an emulated bridge's 2.5 GT/s x1); a ``<cpu>``
  becomes a socket node, sockets joined by inter-socket links.

GPUs are ranked by ``rank`` (two GPUs with one rank are an error); the generation is guessed
from ``sm`` and the NVLink counts (``gpu_specs.by_sm``).

NICs (``<nic>``, ``<net>``), ``<c2c>``, ``<pcilink>`` and NVLinks to a CPU (``0x068001``) are read
past: flowride models one machine's GPUs. The parser refuses DTDs and entities (NCCL writes none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from xml.parsers import expat

from flowride.errors import InputError
from flowride.files import read_text
from flowride.sizes import MAX_GPUS
from flowride.topology.generations import (
    TOO_BIG,
    Fabric,
    Imported,
    LinkTable,
    choose_table,
    pcie_lane_GBps,
)
from flowride.topology.gpu_specs import by_sm
from flowride.topology.placing import PcieLog, pair_self_links, place_gpu_links

MAX_XML = 16 * 2**20
MAX_DEPTH = 64
NVSWITCH_CLASS = "0x068000"
CPU_CLASS = "0x068001"
FIX = "give the file NCCL_TOPO_DUMP_FILE wrote"


@dataclass(eq=False)
class _El:
    tag: str
    attrs: dict[str, str]
    line: int
    children: list[_El] = field(default_factory=list)


def parse_xml(text: str, path: str) -> _El:
    """The element tree of ``text`` with line numbers; XML that is not well-formed, too deep, or
    that declares a DTD or entities is an InputError naming the line."""
    parser = expat.ParserCreate()
    stack: list[_El] = []
    roots: list[_El] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        el = _El(tag, dict(attrs), parser.CurrentLineNumber)
        if len(stack) >= MAX_DEPTH:
            raise InputError(f"{path} line {el.line}", f"<{tag}> nests deeper than {MAX_DEPTH} elements", FIX)
        (stack[-1].children if stack else roots).append(el)
        stack.append(el)

    def refuse(*_args: object) -> None:
        raise InputError(f"{path} line {parser.CurrentLineNumber}", "declares a DTD or an entity", "NCCL's topology files have none; remove it")

    parser.StartElementHandler = start
    parser.EndElementHandler = lambda _tag: stack.pop()
    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    try:
        parser.Parse(text, True)
    except expat.ExpatError as e:
        raise InputError(f"{path} line {e.lineno}, column {e.offset}", f"is not well-formed XML ({expat.ErrorString(e.code)})", FIX) from None
    if not roots or roots[0].tag != "system":
        raise InputError(path, f"the root element is <{roots[0].tag if roots else ''}>, not <system>", FIX)
    return roots[0]


def _attr(el: _El, name: str, path: str) -> str:
    value = el.attrs.get(name)
    if value is None or not value.strip():
        raise InputError(f"{path} line {el.line}, <{el.tag}>", f"is missing the attribute {name!r}", FIX)
    return value.strip()


def _int(el: _El, name: str, path: str, lo: int = 0) -> int:
    text = _attr(el, name, path)
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        value = -1
    if value < lo:
        raise InputError(f"{path} line {el.line}, <{el.tag}> {name}", f"{text!r} is not a whole number >= {lo}", FIX)
    return value


@dataclass
class _Gpu:
    busid: str
    sm: int
    rank: int | None
    el: _El
    pci: _El
    parent: _El | None  # the <pci> switch (or None: a CPU) the GPU's <pci> sits under


def _bus_key(busid: str) -> tuple[int, ...]:
    """A bus id as numbers (domain, bus, device, function) for ordering; text that is not hex sorts last."""
    try:
        return tuple(int(x, 16) for x in busid.replace(".", ":").split(":"))
    except ValueError:
        return (1 << 62,)


def _gpus(system: _El, path: str) -> list[_Gpu]:
    """Every GPU under a CPU, in rank order when every GPU states a rank (two GPUs with one rank
    are an error naming the second), else in file order."""
    out: list[_Gpu] = []

    def walk(el: _El, pci: _El | None, parent: _El | None) -> None:
        for ch in el.children:
            if ch.tag == "gpu":
                if pci is None:
                    raise InputError(f"{path} line {ch.line}, <gpu>", "is not inside a <pci> element", FIX)
                rank = _int(ch, "rank", path) if "rank" in ch.attrs else None
                out.append(_Gpu(_attr(pci, "busid", path).lower(), _int(ch, "sm", path), rank, ch, pci, parent))
            elif ch.tag == "pci":
                _attr(ch, "busid", path)
                walk(ch, ch, pci)

    for cpu in system.children:
        if cpu.tag == "cpu":
            _attr(cpu, "numaid", path)
            walk(cpu, None, None)
    if len(out) < 2:
        raise InputError(path, f"{len(out)} <gpu> element(s) inside <cpu> elements", "a collective needs at least two GPUs")
    if len(out) > MAX_GPUS:
        raise InputError(path, f"{len(out):,} GPUs, over the limit of {MAX_GPUS:,}", "give one machine's file")
    seen: dict[str, _Gpu] = {}
    for g in out:
        if g.busid in seen:
            raise InputError(f"{path} line {g.pci.line}", f"busid {g.busid} is given to two GPUs (lines {seen[g.busid].pci.line}, {g.pci.line})", FIX)
        seen[g.busid] = g
    ranked: dict[int, _Gpu] = {}
    for g in out:
        if g.rank is not None and g.rank in ranked:
            raise InputError(f"{path} line {g.el.line}, <gpu rank={g.rank}>", f"rank {g.rank} is given to two GPUs "
                             f"({ranked[g.rank].busid} on line {ranked[g.rank].el.line}, {g.busid} on line {g.el.line})",
                             "give each GPU its own rank, or remove every rank attribute to rank GPUs in file order")
        if g.rank is not None:
            ranked[g.rank] = g
    if len(ranked) == len(out):
        out.sort(key=lambda g: g.rank if g.rank is not None else 0)
    return out


def _nvlinks(gpus: list[_Gpu], path: str) -> tuple[dict[tuple[int, int], tuple[int, _El]], dict[int, tuple[int, str]], list[int], int]:
    """The NVLinks the GPUs list: to other GPUs {(rank, peer): (count, element)}, to themselves
    {rank: (count, where)}, into NVSwitch (count per rank), and how many go to a CPU."""
    rank = {g.busid: r for r, g in enumerate(gpus)}
    direct: dict[tuple[int, int], tuple[int, _El]] = {}
    selfs: dict[int, tuple[int, str]] = {}
    to_switch = [0] * len(gpus)
    to_cpu = 0
    for r, g in enumerate(gpus):
        for nv in (ch for ch in g.el.children if ch.tag == "nvlink"):
            target, count = _attr(nv, "target", path).lower(), _int(nv, "count", path, lo=1)
            tclass = _attr(nv, "tclass", path).lower()
            where = f"{path} line {nv.line}, <nvlink target={target}>"
            if tclass == NVSWITCH_CLASS:
                to_switch[r] += count
            elif tclass == CPU_CLASS:
                to_cpu += 1
            elif tclass.startswith("0x03"):
                if target not in rank:
                    raise InputError(where, f"{target} is no GPU's busid in this file", "name the busid of a <pci> that holds a <gpu>")
                if rank[target] == r:
                    selfs[r] = (selfs.get(r, (0, ""))[0] + count, f"{g.busid} (line {nv.line})")
                    continue
                old = direct.get((r, rank[target]), (0, nv))[0]
                direct[(r, rank[target])] = (old + count, nv)
            else:
                raise InputError(where, f"unknown tclass {tclass!r}",
                                 f"use a GPU class (0x0302.., 0x0300..), {NVSWITCH_CLASS} (NVSwitch) or {CPU_CLASS} (CPU)")
    return direct, selfs, to_switch, to_cpu


def _guess(gpus: list[_Gpu], path: str) -> tuple[str, str]:
    """The generation from the GPUs' sm, refined by the most NVLinks one GPU lists."""
    direct, selfs, to_switch, _ = _nvlinks(gpus, path)
    most = [to_switch[r] + selfs.get(r, (0, ""))[0] + sum(c for (a, _), (c, _) in direct.items() if a == r) for r in range(len(gpus))]
    return by_sm(sorted({g.sm for g in gpus}), max(most), path)


def _add_nvlink(gpus: list[_Gpu], fab: Fabric, table: LinkTable, path: str, notes: list[str]) -> None:
    direct, selfs, to_switch, to_cpu = _nvlinks(gpus, path)
    pairs: dict[tuple[int, int], int] = {}
    for (a, b), (count, nv) in sorted(direct.items()):
        back = direct.get((b, a), (0, None))[0]
        if back != count:
            raise InputError(f"{path} line {nv.line}, <nvlink target={gpus[b].busid}>", f"asymmetric NVLink counts: {gpus[a].busid} lists "
                             f"{count} link(s) to {gpus[b].busid}, which lists {back} back", "both GPUs list the same count")
        if a < b:
            pairs[(a, b)] = count
    siblings: dict[int, list[int]] = {}
    for r, g in enumerate(gpus):
        if g.parent is not None:
            siblings.setdefault(id(g.parent), []).append(r)
    order = sorted(range(len(gpus)), key=lambda r: _bus_key(gpus[r].busid))
    paired, self_notes = pair_self_links(selfs, list(siblings.values()), order, lambda r: gpus[r].busid, table)
    for ab, c in paired.items():
        pairs[ab] = pairs.get(ab, 0) + c
    notes.extend(self_notes)
    place_gpu_links(fab, table, pairs, to_switch, lambda r: f"{path} line {gpus[r].el.line}, <gpu> {gpus[r].busid}", notes)
    if to_cpu:
        notes.append(f"{to_cpu} NVLink(s) to a CPU (tclass {CPU_CLASS}) left out")


def _link_GBps(el: _El) -> float | None:
    """The PCIe link's nominal GB/s from its link_speed x link_width, None when either is missing or 0."""
    lane = pcie_lane_GBps(el.attrs.get("link_speed", ""))
    try:
        width = int(el.attrs.get("link_width", "0"))
    except ValueError:
        width = 0
    return lane * width if lane and width > 0 else None


def _narrower(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _add_pcie(system: _El, gpus: list[_Gpu], fab: Fabric, notes: list[str]) -> None:
    rank = {id(g.pci): r for r, g in enumerate(gpus)}
    made = [0]
    log = PcieLog(fab.table)

    def own(pci: _El) -> float | None:
        return log.price(_link_GBps(pci), pci.attrs.get("busid", "?"))

    def subtree(pci: _El) -> tuple[int, float | None] | None:
        """(the node a parent links to, that link's GB/s) for the part of the tree under ``pci``."""
        if id(pci) in rank:
            return rank[id(pci)], own(pci)
        kept = [x for x in (subtree(ch) for ch in pci.children if ch.tag == "pci") if x is not None]
        if not kept:
            return None
        if len(kept) == 1:
            return kept[0][0], _narrower(kept[0][1], own(pci))
        sw = fab.switch(f"pcie-switch{made[0]}")
        made[0] += 1
        for node, bw in kept:
            fab.both(node, sw, "pcie", bandwidth=bw)
        return sw, own(pci)

    cpus = [(cpu, [x for x in (subtree(ch) for ch in cpu.children if ch.tag == "pci") if x is not None])
            for cpu in system.children if cpu.tag == "cpu"]
    cpus = [(cpu, kept) for cpu, kept in cpus if kept]
    sockets: list[int] = []
    for cpu, kept in cpus:
        if len(cpus) == 1 and len(kept) == 1:
            break
        sock = fab.switch(f"cpu{cpu.attrs.get('numaid', len(sockets))}")
        for node, bw in kept:
            fab.both(node, sock, "pcie", bandwidth=bw)
        sockets.append(sock)
    fab.join_sockets(sockets)
    notes.append(f"PCIe: {made[0]} PCIe switch(es), {len(cpus)} CPU socket(s) with GPUs; NICs left out")
    notes.extend(log.notes())


def import_nccl_xml(path: str | Path, generation: str | None = None, link_table: str | Path | None = None,
                    nvlink_only: bool = False) -> Imported:
    """The topology NCCL's topology XML at ``path`` describes (docs/topology-import.md).

    ``generation`` (a name of gpu_specs.SPECS) picks the link prices, guessed from the GPUs' ``sm``
    when None; ``link_table`` is a JSON file overriding entries; ``nvlink_only`` keeps only NVLink."""
    text = read_text(path, "from_nccl_xml", FIX, MAX_XML, TOO_BIG)
    system = parse_xml(text, str(path))
    gpus = _gpus(system, str(path))
    table, gen_note = choose_table(generation, None if generation else _guess(gpus, str(path)), link_table)
    notes = [gen_note]
    fab = Fabric(table)
    for g in gpus:
        fab.gpu(g.busid)
    _add_nvlink(gpus, fab, table, str(path), notes)
    if nvlink_only:
        notes.append("--nvlink-only: PCIe and CPU links left out")
    else:
        _add_pcie(system, gpus, fab, notes)
    name = f"nccl-xml:{Path(path).name}"[:200]
    topo = fab.build(name, f"imported from NCCL topology XML ({Path(path).name}): " + "; ".join(notes), str(path), nvlink_only)
    return Imported(topo, tuple(notes))
