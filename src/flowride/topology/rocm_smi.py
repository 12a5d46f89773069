"""A topology from what ``rocm-smi --showtopo`` prints on an AMD Instinct box (MI300X, MI250).

The text has four sections, each a GPU-by-GPU matrix but the last (rocm_smi.py's
``showHwTopology``): ``Weight between two GPUs``, ``Hops between two GPUs``, ``Link Type between
two GPUs`` (``XGMI`` or ``PCIE``) and ``Numa Nodes`` (``GPU[i] : (Topology) Numa Node: n``). What
each says (AMD's rocm-systems#5763 and the amd-smi documentation of hops and weights):

- link type XGMI: the two GPUs share an xGMI (Infinity Fabric) hive; hops is then always 1, even
  when the route runs through other GPUs, so the *weight* tells direct from routed: the kernel
  driver adds 15 per xGMI hop, so the smallest xGMI weight (15) is a direct link and 30 or 45 a
  route through one or two other GPUs (no link of its own);
- link type PCIE: hops 2 is through one CPU socket, 3 across sockets.

Built: one ``xgmi`` link each way per direct pair, of as many links as the generation puts there
(one; MI250's two GCDs of one package, GPUs 2k and 2k+1, have four); each GPU joined over ``pcie``
to its NUMA node, NUMA nodes on the fewest CPU sockets the PCIE hops allow, sockets joined by
``sys``. The generation comes from a product name in the file, else from the xGMI graph (every
pair direct: an MI300X box; not: MI250's GCD mesh), and the note says so.
"""

from __future__ import annotations

import re
from pathlib import Path

import networkx as nx

from flowride.errors import InputError
from flowride.files import read_text
from flowride.topology.generations import TOO_BIG, Fabric, Imported, LinkTable, choose_table
from flowride.topology.gpu_specs import SPEC, named_in, pcie_only
from flowride.topology.placing import place_gpu_links

MAX_TEXT = 4 * 2**20
MAX_GPUS_SMI = 256
FIX = "give the text `rocm-smi --showtopo` prints, unedited"
_TITLE = re.compile(r"^\s*=+\s*(.*?)\s*=+\s*$")
_NUMA = re.compile(r"^GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa (Node|Affinity):\s*(-?\d+)\s*$")
_GPU = re.compile(r"^GPU(\d+)$")
SECTIONS = {"Weight between two GPUs": "weight", "Hops between two GPUs": "hops", "Link Type between two GPUs": "type"}
XGMI_HOP_WEIGHT = 15  # amdkfd: KFD_CRAT_XGMI_WEIGHT per xGMI hop


def _matrix(lines: list[tuple[int, str]], what: str, path: str) -> tuple[list[str], dict[tuple[int, int], tuple[str, int]]]:
    """(GPU names of the header, {(row, col): (cell, line)}) of one section; a malformed one is an
    InputError naming the line."""
    rows = [(no, ln.split()) for no, ln in lines if ln.split()]
    if not rows or not all(_GPU.match(t) for t in rows[0][1]):
        at = f"{path} line {rows[0][0]}" if rows else path
        raise InputError(at, f"the {what} section has no header row of GPU0, GPU1, ...", FIX)
    names = rows[0][1]
    if names != [f"GPU{i}" for i in range(len(names))]:
        raise InputError(f"{path} line {rows[0][0]}", f"the {what} header names {' '.join(names)}, not GPU0..GPU{len(names) - 1} in order", FIX)
    cells: dict[tuple[int, int], tuple[str, int]] = {}
    seen: set[int] = set()
    for no, toks in rows[1:]:
        m = _GPU.match(toks[0])
        if not m or int(m.group(1)) >= len(names):
            raise InputError(f"{path} line {no}", f"{toks[0]!r} is not a GPU of the {what} header ({' '.join(names)})", FIX)
        r = int(m.group(1))
        if r in seen or len(toks) != len(names) + 1:
            problem = f"row GPU{r} appears twice" if r in seen else f"row GPU{r} has {len(toks) - 1} cells for {len(names)} GPUs"
            raise InputError(f"{path} line {no}", f"in the {what} section, {problem}", FIX)
        seen.add(r)
        for c, cell in enumerate(toks[1:]):
            cells[(r, c)] = (cell, no)
    missing = [f"GPU{r}" for r in range(len(names)) if r not in seen]
    if missing:
        raise InputError(path, f"the {what} section has no row for {', '.join(missing)}", FIX)
    return names, cells


def parse_showtopo(text: str, path: str) -> tuple[int, dict[str, dict[tuple[int, int], tuple[str, int]]], dict[int, int]]:
    """(GPU count, {section: cells}, {GPU: NUMA node}) of ``rocm-smi --showtopo`` text. The link
    type section is required; every matrix must name the same GPUs; NUMA lines are optional."""
    blocks: dict[str, list[tuple[int, str]]] = {}
    current: str | None = None
    numa: dict[int, int] = {}
    affinity: dict[int, int] = {}
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        t = _TITLE.match(line)
        if t:
            current = SECTIONS.get(t.group(1)) or ("numa" if t.group(1) == "Numa Nodes" else None)
            if current in blocks:
                raise InputError(f"{path} line {no}", f"a second {t.group(1)!r} section", "give one rocm-smi run's output")
            if current:
                blocks[current] = []
            continue
        if current == "numa":
            m = _NUMA.match(line.strip())
            if m:
                (numa if m.group(2) == "Node" else affinity)[int(m.group(1))] = int(m.group(3))
        elif current is not None:
            blocks[current].append((no, line))
    if "type" not in blocks:
        raise InputError(path, "has no 'Link Type between two GPUs' section: it is not `rocm-smi --showtopo` output", FIX)
    mats: dict[str, dict[tuple[int, int], tuple[str, int]]] = {}
    n = None
    for key, lines in blocks.items():
        if key == "numa":
            continue
        names, cells = _matrix(lines, next(k for k, v in SECTIONS.items() if v == key), path)
        if n is not None and len(names) != n:
            raise InputError(path, f"the sections name {n} and {len(names)} GPUs", FIX)
        n = len(names)
        mats[key] = cells
    assert n is not None
    if n > MAX_GPUS_SMI:
        raise InputError(path, f"{n} GPUs, over the limit of {MAX_GPUS_SMI}", "give one machine's output")
    for r, v in affinity.items():
        if numa.get(r, -1) < 0:
            numa[r] = v
    bad = sorted(r for r in numa if r >= n)
    if bad:
        raise InputError(path, f"the Numa Nodes section names GPU[{bad[0]}], but the matrices have {n} GPUs", FIX)
    return n, mats, {r: v for r, v in numa.items() if v >= 0}


def _links(n: int, mats: dict[str, dict[tuple[int, int], tuple[str, int]]], path: str) -> tuple[dict[tuple[int, int], str], list[tuple[int, int]], int | None]:
    """({(a, b): XGMI or PCIE} for a < b, the direct xGMI pairs, the one-hop xGMI weight)."""
    kinds: dict[tuple[int, int], str] = {}
    for (r, c), (cell, no) in mats["type"].items():
        at = f"{path} line {no}, row GPU{r}, column GPU{c}"
        if r == c:
            continue
        if cell not in ("XGMI", "PCIE"):
            raise InputError(at, f"link type {cell!r} is neither XGMI nor PCIE (rocm-smi prints XXXX where it cannot read it)",
                             "rerun rocm-smi --showtopo where it can read the link types")
        back = mats["type"][(c, r)][0]
        if back != cell:
            raise InputError(at, f"says {cell} but row GPU{c}, column GPU{r} says {back}", "the matrix is symmetric; fix one of the two cells")
        kinds[(min(r, c), max(r, c))] = cell
    xgmi = [p for p, k in kinds.items() if k == "XGMI"]
    if not xgmi:
        return kinds, [], None
    if "weight" not in mats:
        raise InputError(path, "has XGMI links but no 'Weight between two GPUs' section, which tells direct xGMI links from "
                         "routes through other GPUs", "give the whole `rocm-smi --showtopo` output")
    weight: dict[tuple[int, int], int] = {}
    for a, b in xgmi:
        cell, no = mats["weight"][(a, b)]
        if not cell.isdigit() or int(cell) <= 0:
            raise InputError(f"{path} line {no}, row GPU{a}, column GPU{b}", f"weight {cell!r} is not a positive whole number", FIX)
        weight[(a, b)] = int(cell)
    hop = min(weight.values())
    return kinds, sorted(p for p in xgmi if weight[p] == hop), hop


def _guess(n: int, direct: list[tuple[int, int]], text: str) -> tuple[str, str]:
    """A product name in the text; else a fully connected xGMI graph of more than two GPUs is an
    MI300X box, any other xGMI graph MI250 GCDs; no xGMI link at all is a PCIe-only box."""
    named = named_in(text, "amd")
    if named is not None:
        return named
    if not direct:
        return pcie_only("amd")
    if len(direct) == n * (n - 1) // 2 and n > 2:
        return "mi300x", (f"GPU generation mi300x (guessed: all {n} GPUs joined pairwise by direct xGMI links, as on an "
                          "MI300X platform; MI250 GCDs are not fully connected; give --gpu-generation NAME to choose)")
    why = "two GPUs on one xGMI link: one MI250's two GCDs" if n == 2 else "xGMI joins some GPU pairs only through other GPUs, as in MI250's GCD mesh"
    return "mi250", f"GPU generation mi250 (guessed: {why}; give --gpu-generation NAME to choose)"


def _add_xgmi(n: int, direct: list[tuple[int, int]], hop: int | None, fab: Fabric, table: LinkTable, path: str, notes: list[str]) -> None:
    if not direct:
        return
    pkg = SPEC[table.generation].package_links if table.generation in SPEC else 0
    counts = {(a, b): pkg if pkg and a // 2 == b // 2 else 1 for a, b in direct}
    place_gpu_links(fab, table, counts, [0] * n, lambda r: f"{path}: GPU{r}", notes)
    per = table.cost("xgmi").bandwidth_GBps
    routed = "" if hop != XGMI_HOP_WEIGHT else f" (weight {XGMI_HOP_WEIGHT}, one xGMI hop; heavier XGMI pairs route through other GPUs and get no link)"
    inside = sum(1 for c in counts.values() if c == pkg and pkg)
    pk = (f"; {inside} pair(s) are the two GCDs of one package (GPUs 2k, 2k+1): {pkg} links, {pkg * per:g} GB/s each way; the "
          f"rest priced as one link, though some are two (rocm-smi does not say which)") if inside else ""
    notes.append(f"xGMI: {len(direct)} direct GPU pair(s) by weight{routed}, {per:g} GB/s per link each way{pk}")


def _add_pcie(n: int, kinds: dict[tuple[int, int], str], mats: dict[str, dict[tuple[int, int], tuple[str, int]]],
              numa: dict[int, int], fab: Fabric, path: str, notes: list[str]) -> None:
    """GPUs on their NUMA nodes, NUMA nodes on the fewest sockets the PCIE hops allow."""
    node = {r: numa.get(r, -1) for r in range(n)}
    nodes = sorted(set(node.values()))
    same, apart = nx.Graph(), set()
    same.add_nodes_from(nodes)
    for (a, b), k in kinds.items():
        if k != "PCIE" or "hops" not in mats:
            continue
        cell, no = mats["hops"][(a, b)]
        if cell in ("1", "2"):
            same.add_edge(node[a], node[b])
        elif cell == "3":
            apart.add((a, b, no))
    sockets = [sorted(c) for c in nx.connected_components(same)]
    sock_of = {v: i for i, c in enumerate(sockets) for v in c}
    for a, b, no in apart:
        if sock_of[node[a]] == sock_of[node[b]]:
            raise InputError(f"{path} line {no}, row GPU{a}, column GPU{b}", "says 3 hops (across CPU sockets), yet other PCIE "
                             "pairs of 2 hops put both GPUs' NUMA nodes on one socket", "check the hops of these GPUs")
    # fewest sockets: merge socket groups no 3-hop pair keeps apart
    groups = [set(c) for c in sockets]
    merged: list[set[int]] = []
    for g in groups:
        for m in merged:
            if not any({node[a], node[b]} <= (m | g) and (node[a] in m) != (node[b] in m) for a, b, _ in apart):
                m |= g
                break
        else:
            merged.append(g)
    cpu: dict[int, int] = {}
    socks: list[int] = []
    for s in merged:
        members = sorted(s)
        hub = None if len(members) == 1 else fab.switch(f"socket{len(socks)}")
        for v in members:
            cpu[v] = fab.switch(f"numa{v}" if v >= 0 else "cpu")
            if hub is not None:
                fab.both(cpu[v], hub, "node")
        socks.append(hub if hub is not None else cpu[members[0]])
    for r in range(n):
        fab.both(r, cpu[node[r]], "pcie")
    fab.join_sockets(socks)
    told = "from the Numa Nodes section" if numa else "no Numa Nodes section: one CPU node"
    notes.append(f"PCIe: {len(nodes)} NUMA node(s) ({told}) on {len(merged)} CPU socket(s), the fewest the PCIE hops allow "
                 "(rocm-smi does not say which NUMA nodes share a socket)")


def import_rocm_smi(path: str | Path, generation: str | None = None, link_table: str | Path | None = None,
                    nvlink_only: bool = False) -> Imported:
    """The topology the ``rocm-smi --showtopo`` text at ``path`` describes (docs/topology-import.md).

    ``generation`` (mi300x, mi250) picks the link prices, guessed from a product name in the text
    or the xGMI graph when None; ``link_table`` is a JSON file overriding entries;
    ``nvlink_only`` keeps only the xGMI links."""
    text = read_text(path, "from_rocm_smi", FIX, MAX_TEXT, TOO_BIG)
    n, mats, numa = parse_showtopo(text, str(path))
    kinds, direct, hop = _links(n, mats, str(path))
    table, gen_note = choose_table(generation, None if generation else _guess(n, direct, text), link_table, vendor="amd")
    notes = [gen_note]
    fab = Fabric(table)
    for r in range(n):
        fab.gpu(f"GPU{r}")
    if direct and not table.fabric:
        raise InputError("gpu_generation", f"{table.generation} has no xGMI links, but the file shows {len(direct)}", "give mi300x or mi250")
    _add_xgmi(n, direct, hop, fab, table, str(path), notes)
    if nvlink_only:
        notes.append("--nvlink-only: PCIe and CPU links left out (xGMI kept)")
    else:
        _add_pcie(n, kinds, mats, numa, fab, str(path), notes)
    name = f"rocm-smi:{Path(path).name}"[:200]
    topo = fab.build(name, f"imported from `rocm-smi --showtopo` ({Path(path).name}): " + "; ".join(notes), str(path), nvlink_only)
    return Imported(topo, tuple(notes))
