"""Where the importers place GPU-to-GPU and PCIe links, and the notes on what a file left unclear.

Every importer (``nvsmi.py``, ``nccl_xml.py``, ``rocm_smi.py``) reads which links a file names
and hands them here, so one set of rules decides what is built and nothing is dropped unsaid:

- :func:`pair_self_links`: NVLinks whose target is the GPU's own bus id (Azure's NC A100 v4 topology
  file writes every GPU's NVLink that way) are paired where the file allows one reading, and noted;
  what cannot be paired is noted with the fix. NCCL itself turns such a target into a link from the
  GPU to itself (``ncclTopoAddNvLinks`` connects the GPU to the node of the target bus id), which
  joins nothing, so NCCL uses none of those NVLinks: the note says so;
- :func:`place_gpu_links`: the per-GPU link budget of the generation, the direct links, and the one
  switch node every NVSwitch port joins (NCCL merges all NVSwitches into one too);
- :class:`PcieLog`: a PCIe link priced from the table where the file gives no speed, or gives
  the 2.5 GT/s x1 of a virtual machine's emulated bridge (0.25 GB/s, which no GPU runs at).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from flowride.errors import InputError
from flowride.topology.generations import Fabric, LinkTable

VIRTUAL_BELOW_GBPS = 1.0  # a stated PCIe link under this (gen1 x1/x2, gen2 x1) is an emulated bridge's value
FABRIC_NAME = {"nvlink": "NVLink", "xgmi": "xGMI link", "": "NVLink"}


def _short(items: list[str], n: int = 4) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def pair_self_links(selfs: dict[int, tuple[int, str]], siblings: list[list[int]], order: list[int],
                    label: Callable[[int], str], table: LinkTable) -> tuple[dict[tuple[int, int], int], list[str]]:
    """Pairs for the GPUs whose NVLinks name themselves: ``selfs`` maps a rank to (count, where the
    element is). GPUs with equal counts pair up: two that are the only such GPUs under one PCIe
    switch (``siblings``: ranks grouped by parent switch); then, of those left, the only two, or
    consecutive ones in bus-id ``order`` (as a bridged pair sits in adjacent slots). An odd one out
    is left unlinked and named. Returns ({(a, b): count}, notes)."""
    pairs: dict[tuple[int, int], int] = {}
    notes: list[str] = []
    if not selfs:
        return pairs, notes
    by_count: dict[int, list[int]] = {}
    for r in order:
        if r in selfs:
            by_count.setdefault(selfs[r][0], []).append(r)
    how: dict[str, list[str]] = {}
    for count, ranks in by_count.items():
        left = list(ranks)
        for group in siblings:
            mine = [r for r in group if r in left]
            if len(mine) == 2:
                pairs[(min(mine), max(mine))] = count
                how.setdefault("alone under one PCIe switch", []).append(f"{label(mine[0])}+{label(mine[1])}")
                left = [r for r in left if r not in mine]
        if len(left) % 2:
            notes.append(f"{FABRIC_NAME[table.fabric]}s left out: {_short([selfs[r][1] for r in left])} name their own GPU as the "
                         f"target with count {count}, and {len(left)} such GPUs cannot be paired one way (write the partner "
                         "GPU's busid as the target)")
            continue
        rule = "the only two" if len(left) == 2 else "consecutive bus ids"
        for a, b in zip(left[::2], left[1::2], strict=True):
            pairs[(min(a, b), max(a, b))] = count
            how.setdefault(rule, []).append(f"{label(a)}+{label(b)}")
    if pairs:
        per = table.cost(table.fabric).bandwidth_GBps if table.fabric else 0.0
        counts = sorted(set(pairs.values()))
        bw = ", ".join(f"{c} x {per:g} = {c * per:g} GB/s each way" for c in counts)
        whole = " (all the links of a GPU: one partner each)" if counts == [table.nvlinks_per_gpu] else ""
        by = "; ".join(f"by {rule}: {_short(ps, 8)}" for rule, ps in how.items())
        notes.append(f"{FABRIC_NAME[table.fabric]}: {len(selfs)} GPU(s) name their own bus id as the NVLink target (as Azure's "
                     f"NC A100 v4 topology file does; NCCL then links each GPU to itself and uses none of these NVLinks): "
                     f"paired as bridged pairs {by}; {bw}{whole}. If the bridges join other GPUs, write each partner's "
                     "busid as the target")
    return pairs, notes


def place_gpu_links(fab: Fabric, table: LinkTable, direct: dict[tuple[int, int], int], to_switch: list[int],
                    where: Callable[[int], str], notes: list[str], switch_note: str | None = None) -> None:
    """The GPU fabric: ``direct`` {(a, b): links} as one link each way of links x the per-link
    price, and every GPU with ports in ``to_switch`` joined to one switch node. A GPU with more
    links than its generation has is an InputError at ``where(rank)``. ``switch_note`` replaces
    the default note on the switch."""
    L, kind = table.nvlinks_per_gpu, table.fabric
    name = FABRIC_NAME[kind]
    total = list(to_switch)
    for (a, b), c in direct.items():
        total[a] += c
        total[b] += c
    for r, t in enumerate(total):
        if t > L:
            raise InputError(where(r), f"has {t} {name}s, more than the {L} of a {table.generation} GPU",
                             "give the right --gpu-generation, or nvlinks_per_gpu in a --link-table")
    for (a, b), c in sorted(direct.items()):
        fab.both(a, b, kind, count=c)
    on_switch = [r for r, c in enumerate(to_switch) if c]
    if len(on_switch) >= 2:
        sw = fab.switch("nvswitch", copy=table.nvswitch_copy)
        for r in on_switch:
            fab.both(r, sw, "nvswitch", count=to_switch[r])
        per = sorted({to_switch[r] for r in on_switch})
        bw = "/".join(f"{c * table.cost('nvswitch').bandwidth_GBps:g}" for c in per)
        notes.append(switch_note or f"NVSwitch: {len(on_switch)} GPUs with NVLinks into NVSwitch ({'/'.join(map(str, per))} links "
                     f"each, {bw} GB/s per GPU each way) joined by one NVSwitch node (copy={'on' if table.nvswitch_copy else 'off'})")
    elif on_switch:
        notes.append(f"NVSwitch: only {where(on_switch[0])} has NVLinks into an NVSwitch, which joins it to no other GPU; left out")


@dataclass
class PcieLog:
    """The PCIe links priced from the table instead of the file, for one note each."""

    table: LinkTable
    missing: list[str] = field(default_factory=list)
    virtual: list[str] = field(default_factory=list)

    def price(self, stated_GBps: float | None, label: str) -> float | None:
        """The bandwidth to build a link with: the file's ``stated_GBps``, or None (the table's
        ``pcie``) where the file states none or an emulated bridge's value."""
        if stated_GBps is None:
            self.missing.append(label)
            return None
        if stated_GBps < VIRTUAL_BELOW_GBPS:
            self.virtual.append(f"{label} ({stated_GBps:g} GB/s)")
            return None
        return stated_GBps

    def notes(self) -> list[str]:
        pcie = self.table.cost("pcie").bandwidth_GBps
        out = []
        if self.missing:
            out.append(f"PCIe: {len(self.missing)} link(s) state no speed or width ({_short(self.missing)}): priced as the "
                       f"{self.table.generation} table's x16 PCIe, {pcie:g} GB/s each way")
        if self.virtual:
            out.append(f"PCIe: {len(self.virtual)} link(s) state under {VIRTUAL_BELOW_GBPS:g} GB/s ({_short(self.virtual)}), "
                       "likely a virtual machine's emulated bridge (2.5 GT/s x1 is what emulated root ports report), "
                       f"not the slot: priced as the {self.table.generation} table's x16 PCIe, {pcie:g} GB/s each way "
                       '(a --link-table {"pcie": {"bandwidth_GBps": ...}} sets that price)')
        return out
