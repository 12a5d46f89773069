"""A topology from the matrix ``nvidia-smi topo -m`` prints.

The matrix names, for every pair of devices (GPUs and NICs), the closest way between them:
``NV#`` (a bonded set of # NVLinks), ``PIX`` (one PCIe bridge), ``PXB`` (several PCIe bridges, no
host bridge), ``PHB`` (through a PCIe host bridge), ``NODE`` (between host bridges of one NUMA
node), ``SYS`` (between NUMA nodes, over QPI/UPI/xGMI; older drivers print ``SOC``). It does not
say how fast any of them is, so links are priced by GPU generation (``generations.py``).

How the graph is built (docs/topology-import.md has the why):

- NV# between two GPUs: a direct link each way of # x the generation's NVLink bandwidth; unless
  every GPU pair is NV# with one # and # x (GPUs - 1) exceeds the NVLinks one GPU has, which only a
  switched fabric can print: then one NVSwitch node, each GPU joined to it by # links.
- PCIe: the PCIe cells of GPUs *and* NICs are read as one tree (an NV# cell hides the PCIe
  relation of its pair, so a NIC both GPUs are ``PIX`` to tells that they share a switch). A PCIe
  switch joins each ``PIX`` (then each ``PXB``) group, a host bridge each ``PHB`` group, a CPU
  socket each ``NODE`` group; sockets are the fewest the ``SYS`` cells allow (the same NUMA
  affinity, else CPU affinity, is one NUMA node), joined by inter-socket links. NICs inform the
  tree and are then left out.
- the ``NUMA Affinity`` column outranks ``SYS`` between two GPUs it puts on one node (a VM's
  matrix may read SYS everywhere): read as NODE, and noted; a closer cell between GPUs it puts
  on two nodes contradicts it and is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from flowride.errors import InputError
from flowride.files import read_text
from flowride.topology.generations import (
    TOO_BIG,
    Fabric,
    Imported,
    LinkTable,
    choose_table,
)
from flowride.topology.gpu_specs import by_links, named_in, pcie_only
from flowride.topology.placing import place_gpu_links

LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # closest to farthest
LEVEL_KIND = {"PIX": "pcie", "PXB": "pcie", "PHB": "pcie", "NODE": "node"}
LEVEL_LABEL = {"PIX": "pcie-switch", "PXB": "pcie-switch", "PHB": "host-bridge", "NODE": "cpu"}
KNOWN_TOKENS = "X, NV<count> (e.g. NV2), PIX, PXB, PHB, NODE, SYS (or SOC)"
MAX_TEXT = 4 * 2**20
MAX_DEVICES = 256
_GPU = re.compile(r"^GPU(\d+)$")
_NV = re.compile(r"^NV(\d+)$")
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\[[0-9;]*m")  # bold/underline codes, with or without the ESC
_AFFINITY = re.compile(r"^(\d[\d,\-]*|N/A)$")
_STOP = {"CPU", "NUMA", "GPU", "Affinity"}  # the trailing column names: CPU Affinity, NUMA Affinity, GPU NUMA ID
_TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


@dataclass(frozen=True)
class Matrix:
    """The parsed matrix: device names in header order, the cells (row, column) -> token (NV#,
    a level, or X), the line each row came from, each GPU row's CPU affinity and NUMA affinity
    when printed (not N/A)."""

    path: str
    devices: tuple[str, ...]
    cells: dict[tuple[int, int], str]
    row_line: dict[int, int]
    affinity: dict[int, str]
    numa: dict[int, str] = field(default_factory=dict)

    @property
    def gpus(self) -> list[int]:
        return [i for i, d in enumerate(self.devices) if _GPU.match(d)]

    def where(self, r: int, c: int | None = None) -> str:
        if c is not None and r not in self.row_line and c in self.row_line:
            r, c = c, r  # a NIC without a row of its own: name the GPU row that holds the cell
        at = f"{self.path} line {self.row_line.get(r, '?')}, row {self.devices[r]}"
        return at if c is None else f"{at}, column {self.devices[c]}"


def _token(text: str) -> str | None:
    """The cell ``text`` normalised (SOC -> SYS), or None when it is no cell token."""
    t = text.upper()
    if t == "SOC":
        return "SYS"
    if t == "X" or t in LEVELS:
        return t
    m = _NV.match(t)
    return f"NV{int(m.group(1))}" if m and int(m.group(1)) > 0 else None


def _nv(token: str) -> int:
    return int(token[2:]) if token.startswith("NV") else 0


def _header(lines: list[str], path: str) -> tuple[int, list[str], list[str]]:
    """(index of the header line, device columns, the trailing columns: CPU Affinity, NUMA
    Affinity, GPU NUMA ID, in the order printed)."""
    for i, line in enumerate(lines):
        toks = line.split()
        if toks and _GPU.match(toks[0]) and (len(toks) == 1 or _token(toks[1]) is None):
            devices: list[str] = []
            for t in toks:
                if t in _STOP:
                    break
                devices.append(t)
            rest, trailing = " ".join(toks[len(devices):]), []
            while rest:
                col = next((c for c in _TRAILING if rest.startswith(c)), None)
                if col is None:
                    break
                trailing.append(col)
                rest = rest[len(col):].lstrip()
            return i, devices, trailing
    raise InputError(path, "no header row naming GPU0, GPU1, ... was found: the matrix has no GPUs",
                     "give the text `nvidia-smi topo -m` prints, header row included")


def parse_matrix(text: str, path: str) -> Matrix:
    """The matrix of ``text``; every malformed row or cell is an InputError naming the line, row
    and column (an unknown token, a ragged row, a GPU block that is not square)."""
    lines = [_ESCAPES.sub("", ln).rstrip("\r\n") for ln in text.splitlines()]
    lines = ["" if ln.lstrip().startswith("#") else ln for ln in lines]
    h, devices, trailing = _header(lines, path)
    where_h = f"{path} line {h + 1}"
    if len(devices) > MAX_DEVICES:
        raise InputError(where_h, f"{len(devices)} devices, over the limit of {MAX_DEVICES}", "give one machine's matrix")
    dup = sorted({d for d in devices if devices.count(d) > 1})
    if dup:
        raise InputError(where_h, f"column {dup[0]} appears twice", "give each device once")
    index = {d: i for i, d in enumerate(devices)}
    gpu_cols = [d for d in devices if _GPU.match(d)]
    n = len(devices)
    cells: dict[tuple[int, int], str] = {}
    row_line: dict[int, int] = {}
    affinity: dict[int, str] = {}
    numa: dict[int, str] = {}
    for ln_no, line in enumerate(lines[h + 1:], start=h + 2):
        toks = line.split()
        if not toks:
            continue
        if line.strip().startswith(("Legend", "NIC Legend")):
            break
        name, rest = toks[0], toks[1:]
        at = f"{path} line {ln_no}, row {name}"
        if name not in index:
            if _GPU.match(name):
                raise InputError(at, f"{name} is not a column of the header ({', '.join(gpu_cols)}): the GPU block is not square",
                                 "give every GPU one row and one column")
            raise InputError(at, f"{name!r} is not a device of the header ({', '.join(devices)})",
                             "a row starts with a device name; the legend starts with 'Legend:'")
        r = index[name]
        if r in row_line:
            raise InputError(at, f"row {name} appears twice (first on line {row_line[r]})", "give each device one row")
        row_line[r] = ln_no
        for c in range(n):
            if c >= len(rest) or _AFFINITY.match(rest[c]) and _token(rest[c]) is None:
                raise InputError(at, f"has {c} cells, but the header names {n} devices: a ragged row",
                                 "every row needs one cell per column of the header")
            tok = _token(rest[c])
            if tok is None:
                raise InputError(f"{at}, column {devices[c]}", f"unknown token {rest[c]!r}", f"use one of {KNOWN_TOKENS}")
            cells[(r, c)] = tok
        if len(rest) > n and _token(rest[n]) is not None:
            raise InputError(at, f"has more cells than the {n} devices the header names: a ragged row",
                             "every row needs one cell per column of the header")
        for col, value in zip(trailing, rest[n:], strict=False):
            if _GPU.match(name) and value != "N/A":
                if col == "CPU Affinity":
                    affinity[r] = value
                elif col == "NUMA Affinity" and value.isdigit():
                    numa[r] = value
    missing = [d for d in gpu_cols if index[d] not in row_line]
    if missing:
        raise InputError(path, f"the GPU block is not square: {len(gpu_cols)} GPU columns but no row for {', '.join(missing)}",
                         "give every GPU one row and one column")
    m = Matrix(path, tuple(devices), cells, row_line, affinity, numa)
    _check_cells(m)
    return m


def _check_cells(m: Matrix) -> None:
    """X exactly on the diagonal, NV# only between GPUs, and the same token both ways."""
    gpus = set(m.gpus)
    for (r, c), tok in m.cells.items():
        if (tok == "X") != (r == c):
            problem = "is X off the diagonal" if tok == "X" else f"is {tok} on the diagonal"
            raise InputError(m.where(r, c), problem, "X marks a device's own cell, and only that")
        if tok.startswith("NV") and not (r in gpus and c in gpus):
            raise InputError(m.where(r, c), f"{tok} joins a NIC: NVLink joins GPUs", "give the PCIe token (PIX, PXB, ...)")
        back = m.cells.get((c, r))
        if back is not None and back != tok:
            what = "asymmetric NV counts" if tok.startswith("NV") or back.startswith("NV") else "asymmetric cells"
            raise InputError(m.where(r, c), f"{what}: says {tok} but row {m.devices[c]}, column {m.devices[r]} says {back}",
                             "the matrix is symmetric; fix one of the two cells")


# ------------------------------------------------------------------------------------ NVLink

def _uniform_nv(m: Matrix) -> int | None:
    """The one NV count every GPU pair shares, or None."""
    g = m.gpus
    counts = {_nv(m.cells[(i, j)]) for i in g for j in g if i != j}
    return counts.pop() if len(counts) == 1 and 0 not in counts else None


def guess_generation(m: Matrix, text: str = "") -> tuple[str, str]:
    """A GPU name in ``text`` (``nvidia-smi -L`` lines or a comment pasted with the matrix) when
    there is one; else from the NV counts (gpu_specs.by_links: the first generation whose NVLinks
    hold every GPU's NV cells as direct links, failing that the NV# every pair shares as NVSwitch
    ports); a matrix without NV cells is a PCIe-only box. The reason always says it is a guess."""
    named = named_in(text, "nvidia")
    if named is not None:
        return named
    g = m.gpus
    sums = [sum(_nv(m.cells[(i, j)]) for j in g if j != i) for i in g]
    if not any(sums):
        return pcie_only()
    return by_links(max(sums), _uniform_nv(m))


def _add_nvlink(m: Matrix, fab: Fabric, table: LinkTable, notes: list[str]) -> None:
    """NV# cells as direct links, or, under the NVSwitch rule, as ports into one switch node."""
    g = m.gpus
    L = table.nvlinks_per_gpu
    k = _uniform_nv(m)
    if k is not None and k * (len(g) - 1) > L:
        if k > L:
            raise InputError(m.where(g[0], g[1]), f"every GPU pair is NV{k}, more than the {L} NVLinks of a {table.generation} GPU",
                             "give the right --gpu-generation, or nvlinks_per_gpu in a --link-table")
        bw = k * table.cost("nvswitch").bandwidth_GBps
        why = (f"NVSwitch: every GPU pair is NV{k} and {k} x {len(g) - 1} peers > {L} NVLinks per GPU, so one "
               f"NVSwitch node, {bw:g} GB/s per GPU each way (copy={'on' if table.nvswitch_copy else 'off'})")
        place_gpu_links(fab, table, {}, [k] * len(g), lambda r: m.where(g[r]), notes, switch_note=why)
        return
    direct = {(a, b): _nv(m.cells[(i, g[b])]) for a, i in enumerate(g) for b in range(a + 1, len(g)) if _nv(m.cells[(i, g[b])])}
    place_gpu_links(fab, table, direct, [0] * len(g), lambda r: m.where(g[r]), notes)


# ------------------------------------------------------------------------------------ PCIe

class _Groups:
    """Union-find over devices that knows which pairs the matrix calls far apart, so a merge that
    would put two of them into one group is seen before it is made."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))
        self.members: dict[int, list[int]] = {v: [v] for v in range(n)}

    def find(self, v: int) -> int:
        while self.parent[v] != v:
            self.parent[v] = self.parent[self.parent[v]]
            v = self.parent[v]
        return v

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb
            self.members[rb] += self.members.pop(ra)

    def clash(self, a: int, b: int, far: set[tuple[int, int]]) -> bool:
        """Whether merging the groups of ``a`` and ``b`` would join a pair in ``far``."""
        ra, rb = self.find(a), self.find(b)
        return ra != rb and any((min(x, y), max(x, y)) in far for x in self.members[ra] for y in self.members[rb])


def _numa(m: Matrix, known: dict[tuple[int, int], int], notes: list[str]) -> None:
    """The cells against the NUMA Affinity column: SYS between two GPUs of one NUMA node (a VM's
    matrix can read SYS everywhere) is read as NODE, and noted; a cell closer than SYS between GPUs
    of different NUMA nodes contradicts it (NODE and closer are within one NUMA node) and is an error."""
    moved: list[str] = []
    for (i, j), lv in sorted(known.items()):
        if i not in m.numa or j not in m.numa:
            continue
        if m.numa[i] == m.numa[j] and LEVELS[lv] == "SYS":
            known[(i, j)] = LEVELS.index("NODE")
            moved.append(f"{m.devices[i]}-{m.devices[j]}")
        elif m.numa[i] != m.numa[j] and LEVELS[lv] != "SYS":
            raise InputError(m.where(i, j), f"says {LEVELS[lv]}, within one NUMA node, but the NUMA Affinity column puts "
                             f"{m.devices[i]} on node {m.numa[i]} and {m.devices[j]} on node {m.numa[j]}",
                             "the two contradict: fix the cell or the NUMA Affinity column")
    if moved:  # a NIC close to a GPU of a NUMA node is on that node: its SYS cells to the node's GPUs go too
        sys_level, node_level = LEVELS.index("SYS"), LEVELS.index("NODE")
        for nic in (d for d in range(len(m.devices)) if d not in m.numa):
            near = {m.numa[g] for g in m.numa if known.get((min(nic, g), max(nic, g)), sys_level) < sys_level}
            for g in m.numa:
                p = (min(nic, g), max(nic, g))
                if m.numa[g] in near and known.get(p) == sys_level:
                    known[p] = node_level
        nodes: dict[str, list[str]] = {}
        for r, v in sorted(m.numa.items()):
            nodes.setdefault(v, []).append(m.devices[r])
        where = "; ".join(f"node {v}: {', '.join(ds)}" for v, ds in nodes.items())
        notes.append(f"NUMA: the matrix says SYS between {len(moved)} GPU pair(s) its NUMA Affinity column puts on one NUMA "
                     f"node ({', '.join(moved[:4])}{' ...' if len(moved) > 4 else ''}); the column wins: one CPU node per "
                     f"NUMA node ({where})")


def _partitions(m: Matrix, notes: list[str]) -> list[list[frozenset[int]]] | None:
    """The GPU groups at PIX, PXB, PHB and NODE (each a partition of the GPUs), or None when the
    matrix says nothing about PCIe (every GPU pair NV#, no NIC column, no CPU or NUMA affinity)."""
    gpus = sorted(m.gpus)
    known = {(min(r, c), max(r, c)): LEVELS.index(t) for (r, c), t in m.cells.items() if t in LEVELS}
    if not any(r in m.gpus or c in m.gpus for r, c in known) and len(m.affinity) < 2 and len(m.numa) < 2:
        return None
    _numa(m, known, notes)
    node_of = m.numa if len(m.numa) >= 2 else m.affinity  # what puts GPUs on one NUMA node
    groups = _Groups(len(m.devices))
    out: list[list[frozenset[int]]] = []
    for level in range(len(LEVELS) - 1):
        for (i, j), lv in known.items():
            if lv == level:
                groups.union(i, j)
        for (i, j), lv in known.items():
            if lv > level and groups.find(i) == groups.find(j):
                raise InputError(m.where(i, j), f"says {LEVELS[lv]}, yet cells of {LEVELS[level]} or closer join "
                                 f"{m.devices[i]} and {m.devices[j]} through other devices: the PCIe cells are not a tree",
                                 "check the PCIe cells of these two devices")
        if LEVELS[level] == "NODE":
            # NUMA (else CPU) affinity: the same one is one NUMA node, different ones are different
            # nodes; then the fewest sockets the SYS cells allow (greedy, in GPU order)
            far = {p for p, lv in known.items() if lv > level}
            unknown = [(i, j) for i in gpus for j in gpus if i < j and (i, j) not in known]
            far |= {(i, j) for i, j in unknown if i in node_of and j in node_of and node_of[i] != node_of[j]}
            for i, j in unknown:
                if node_of.get(i, "") == node_of.get(j, "-") and not groups.clash(i, j, far):
                    groups.union(i, j)
            for v in gpus:
                for u in gpus:
                    if u < v and not groups.clash(u, v, far):
                        groups.union(v, u)
        parts = [frozenset(x for x in ms if x in m.gpus) for ms in groups.members.values()]
        out.append(sorted((p for p in parts if p), key=min))
    return out


def _add_pcie(m: Matrix, fab: Fabric, notes: list[str]) -> None:
    parts = _partitions(m, notes)
    if parts is None:
        notes.append("PCIe: not modelled; the matrix says nothing of it (every GPU pair is NV#, no NIC column, no CPU affinity)")
        return
    rank = {dev: r for r, dev in enumerate(m.gpus)}
    top = {dev: rank[dev] for dev in m.gpus}  # the highest node built so far above each GPU
    level_of: dict[int, str] = {}
    made = dict.fromkeys(LEVEL_LABEL.values(), 0)
    sockets: list[int] = []
    for name, groups in zip(LEVELS[:-1], parts, strict=True):
        for s in groups:
            reps = sorted({top[d] for d in s})
            if name == "NODE" and len(reps) == 1 and (len(groups) == 1 or level_of.get(reps[0]) == "PHB"):
                sockets.append(reps[0])  # the host bridge is the CPU, or there is one socket
                continue
            if name != "NODE" and len(reps) < 2:
                continue
            label = LEVEL_LABEL[name]
            node = fab.switch(f"{label}{made[label]}")
            made[label] += 1
            level_of[node] = name
            for r in reps:
                fab.both(r, node, LEVEL_KIND[name])
            for d in s:
                top[d] = node
            if name == "NODE":
                sockets.append(node)
    fab.join_sockets(sockets if len(sockets) > 1 else [])
    notes.append(f"PCIe: {made['pcie-switch']} PCIe switch(es), {made['host-bridge']} host bridge(s), "
                 f"{len(parts[-1])} CPU socket(s); NICs shape the tree and are left out")


def import_nvidia_smi(path: str | Path, generation: str | None = None, link_table: str | Path | None = None,
                      nvlink_only: bool = False) -> Imported:
    """The topology the ``nvidia-smi topo -m`` text at ``path`` describes (docs/topology-import.md).

    ``generation`` (a name of gpu_specs.SPECS) picks the link prices, guessed from a GPU name in
    the file or the NV counts when None; ``link_table`` is a JSON file overriding entries;
    ``nvlink_only`` keeps only NVLink."""
    text = read_text(path, "from_nvidia_smi", "give the text `nvidia-smi topo -m` prints", MAX_TEXT, TOO_BIG)
    m = parse_matrix(text, str(path))
    table, gen_note = choose_table(generation, None if generation else guess_generation(m, text), link_table)
    notes = [gen_note]
    fab = Fabric(table)
    for dev in m.gpus:
        fab.gpu(m.devices[dev])
    _add_nvlink(m, fab, table, notes)
    if nvlink_only:
        notes.append("--nvlink-only: PCIe and CPU links left out")
    else:
        _add_pcie(m, fab, notes)
    name = f"nvidia-smi:{Path(path).name}"[:200]
    topo = fab.build(name, f"imported from `nvidia-smi topo -m` ({Path(path).name}): " + "; ".join(notes), str(path), nvlink_only)
    return Imported(topo, tuple(notes))
