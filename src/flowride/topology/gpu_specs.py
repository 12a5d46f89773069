"""The GPU generations the importers price links for, each with its public source, and the rules
that guess one from what a file shows (a name, an ``sm``, NVLink counts).

``nvidia-smi topo -m``, NCCL's topology XML and ``rocm-smi --showtopo`` say which links exist,
not how fast they are, and seldom which GPU is in the box. Each :class:`GpuSpec` below gives what
pricing needs (GPU-to-GPU links per GPU and their per-direction speed, the PCIe generation, whether
the NVSwitch multicasts) and cites the datasheet it came from; ``generations.py`` turns them into
link tables. Figures are nominal (decimal GB/s per direction); ``note`` says where one is uncertain.
docs/topology-import.md has the same table.

Guessing is never silent: every rule returns the reason and the generations that the same file
would fit at other prices, so the note can say what ``--gpu-generation NAME`` would change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from flowride.errors import InputError

PCIE_X16_GBPS = {3: 16.0, 4: 32.0, 5: 64.0, 6: 128.0}  # per direction, 128b/130b rounded (PCI-SIG rates)


@dataclass(frozen=True)
class GpuSpec:
    """One generation: ``links`` GPU-to-GPU links per GPU (NVLink, or xGMI on AMD; 0 for PCIe-only
    cards), each ``link_GBps`` per direction; a x16 PCIe link of ``pcie_gen``."""

    name: str
    title: str
    vendor: str  # "nvidia" or "amd"
    sm: int | None  # compute capability x 10 (NCCL XML's sm); None on AMD
    links: int
    link_GBps: float
    pcie_gen: int
    switch_copy: bool  # its NVSwitch multicasts (NVLink SHARP / NVLS)
    names: str  # a regex matching the marketing name as tools print it
    source: str
    note: str = ""
    package_links: int = 0  # links between the two dies of one package (MI250's GCDs 2k and 2k+1: 4), else 0

    @property
    def pcie_GBps(self) -> float:
        return PCIE_X16_GBPS[self.pcie_gen]

    @property
    def fabric(self) -> str:
        """The link kind of its GPU-to-GPU links: ``nvlink``, ``xgmi``, or ``""`` (PCIe only)."""
        return "" if not self.links else "xgmi" if self.vendor == "amd" else "nvlink"

    def prices(self) -> tuple[float, float]:
        return (self.link_GBps if self.links else 0.0, self.pcie_GBps)


_NV = 25.0  # NVLink 2, 3 and 4: 25 GB/s per link per direction
_NV5 = 50.0  # NVLink 5
_GA102 = 14.0625  # GA102's NVLink bridge: four x4 links, 14.0625 GB/s each per direction
SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("v100", "NVIDIA V100 SXM2", "nvidia", 70, 6, _NV, 3, False, r"\bV100",
            "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf (6 NVLink 2 links, 300 GB/s both ways)"),
    GpuSpec("a100", "NVIDIA A100 (SXM4, or PCIe with 3 NVLink bridges)", "nvidia", 80, 12, _NV, 4, False, r"\bA100\b",
            "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf "
            "(12 NVLink 3 links, 600 GB/s both ways); A100 80GB PCIe product brief PB-10577-001 (a bridged pair: 600 GB/s)"),
    GpuSpec("h100", "NVIDIA H100 SXM5", "nvidia", 90, 18, _NV, 5, True, r"\bH100\b",
            "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper (18 NVLink 4 links, 900 GB/s both ways; PCIe Gen5)"),
    GpuSpec("h200", "NVIDIA H200 SXM", "nvidia", 90, 18, _NV, 5, True, r"\bH200\b",
            "https://www.nvidia.com/en-us/data-center/h200/ (NVLink 900 GB/s, PCIe Gen5 128 GB/s, both ways)"),
    GpuSpec("h20", "NVIDIA H20", "nvidia", 90, 18, _NV, 5, True, r"\bH20\b",
            "NVIDIA H20 product brief as reported by vendors (NVLink 900 GB/s, PCIe Gen5 128 GB/s, both ways)",
            "no English NVIDIA page states it; link count assumed 18 like H100"),
    GpuSpec("h800", "NVIDIA H800 SXM5", "nvidia", 90, 8, _NV, 5, True, r"\bH800\b",
            "NVIDIA H800 datasheet: NVLink 400 GB/s both ways; aliyun/SimAI calbusbw.h: H800_NVLINKS 8",
            "NVIDIA states only the 400 GB/s total; 8 links of 25 GB/s assumed"),
    GpuSpec("a800", "NVIDIA A800 SXM4", "nvidia", 80, 8, _NV, 4, False, r"\bA800\b",
            "NVIDIA A800 datasheet: NVLink 400 GB/s both ways (Reuters, Nov 2022); aliyun/SimAI calbusbw.h: A800_NVLINKS 8",
            "NVIDIA states only the 400 GB/s total; 8 links of 25 GB/s assumed"),
    GpuSpec("b200", "NVIDIA B200 (HGX/DGX B200)", "nvidia", 100, 18, _NV5, 5, True, r"(?<![A-Z])B200\b",
            "https://www.nvidia.com/en-us/data-center/dgx-b200/ (NVLink 5: 1.8 TB/s both ways per GPU = 18 x 100 GB/s); PCIe Gen5"),
    GpuSpec("b300", "NVIDIA B300 / Blackwell Ultra (HGX B300, GB300)", "nvidia", 103, 18, _NV5, 6, True, r"\bG?B300\b",
            "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B300: NVLink 5, 1.8 TB/s both ways per GPU); "
            "glennklockwood.com/garden/processors/B300 (PCIe Gen6)",
            "PCIe Gen6 from secondary sources; GB300's GPU-CPU NVLink-C2C is not modelled"),
    GpuSpec("gb200", "NVIDIA GB200 (B200 in a Grace Blackwell superchip)", "nvidia", 100, 18, _NV5, 5, True, r"\bGB200\b",
            "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (NVLink 5: 1.8 TB/s both ways per GPU)",
            "the GPU reaches Grace over NVLink-C2C (not modelled); PCIe priced Gen5"),
    GpuSpec("a6000", "NVIDIA RTX A6000 (NVLink bridge pair)", "nvidia", 86, 4, _GA102, 4, False, r"\bA6000\b",
            "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/"
            "proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web.pdf (NVLink 112.5 GB/s both ways, PCIe Gen4 x16); "
            "GA102 whitepaper (four x4 links of 14.0625 GB/s per direction)"),
    GpuSpec("rtx3090", "NVIDIA GeForce RTX 3090 (NVLink bridge pair)", "nvidia", 86, 4, _GA102, 4, False, r"\b3090(?! ?Ti)\b",
            "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf "
            "(third-generation NVLink: four x4 links, 14.0625 GB/s each per direction, 112.5 GB/s total); PCIe Gen4"),
    GpuSpec("l40s", "NVIDIA L40S / L40", "nvidia", 89, 0, 0.0, 4, False, r"\bL40S?\b",
            "https://www.nvidia.com/en-us/data-center/l40s/ (PCIe Gen4 x16, 64 GB/s both ways; no NVLink)"),
    GpuSpec("l4", "NVIDIA L4", "nvidia", 89, 0, 0.0, 4, False, r"\bL4\b",
            "https://www.nvidia.com/en-us/data-center/l4/ (PCIe Gen4 x16, 64 GB/s both ways; no NVLink)"),
    GpuSpec("rtx4090", "NVIDIA GeForce RTX 4090", "nvidia", 89, 0, 0.0, 4, False, r"\b4090\b",
            "https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/ (PCIe Gen4; no NVLink)"),
    GpuSpec("rtx6000ada", "NVIDIA RTX 6000 Ada Generation", "nvidia", 89, 0, 0.0, 4, False, r"RTX 6000 Ada",
            "https://www.nvidia.com/en-us/design-visualization/rtx-6000/ (PCIe Gen4 x16; no NVLink)"),
    GpuSpec("mi300x", "AMD Instinct MI300X", "amd", None, 7, 64.0, 5, False, r"MI300X",
            "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (7 Infinity Fabric links, "
            "128 GB/s both ways each, 896 GB/s aggregate; 8 GPUs fully connected; PCIe Gen5 x16)"),
    GpuSpec("mi250", "AMD Instinct MI250 / MI250X (per GCD)", "amd", None, 8, 50.0, 4, False, r"MI250X?",
            "https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi250.html (xGMI 25 GT/s x16 = 50 GB/s per "
            "link per direction; each GCD drives 2 x 4 links; the two GCDs of one MI250 are joined by 4); PCIe Gen4",
            "links between GCDs of different packages are 1 or 2 (OLCF Frontier guide: 50-100 GB/s); rocm-smi does not say which",
            package_links=4),
)
SPEC: dict[str, GpuSpec] = {s.name: s for s in SPECS}
# compute capability (the XML's sm) -> the generations that have it, the first being the guess
SM_GENERATION: dict[int, tuple[str, ...]] = {}
for _s in SPECS:
    if _s.sm is not None:
        SM_GENERATION.setdefault(_s.sm, ())
        SM_GENERATION[_s.sm] += (_s.name,)


def spec(name: str) -> GpuSpec:
    """The spec of ``name``; an unknown one lists the known names."""
    s = SPEC.get(str(name).lower())
    if s is None:
        raise InputError("gpu_generation", f"unknown generation {name!r}", f"use one of {', '.join(SPEC)}")
    return s


def others(chosen: str, fits: list[str], links_only: bool = False) -> str:
    """Text naming the generations in ``fits`` that would price links differently from ``chosen``
    (how the same file reads on them; ``links_only``: by the per-link price alone), or "" when
    every one prices it the same."""
    def key(n: str) -> tuple[float, float]:
        link, pcie = SPEC[n].prices()
        return (link, 0.0) if links_only else (link, pcie)

    by_price: dict[tuple[float, float], list[str]] = {}
    for n in fits:
        if n != chosen and key(n) != key(chosen):
            by_price.setdefault(key(n), []).append(n)
    if not by_price:
        return ""
    parts = [f"{'/'.join(ns)} ({link:g} GB/s per link{f', PCIe {pcie:g}' if pcie else ''})" if link else f"{'/'.join(ns)} (PCIe {pcie:g})"
             for (link, pcie), ns in by_price.items()]
    return "; would price differently as " + ", ".join(parts)


_BRAND = re.compile(r"NVIDIA|GeForce|Tesla|Quadro|\bRTX\b|\bAMD\b|Instinct|Radeon", re.IGNORECASE)


def named_in(text: str, vendor: str) -> tuple[str, str] | None:
    """The generation a GPU name in ``text`` names (``nvidia-smi -L`` lines, ``rocm-smi
    --showproductname`` or a comment pasted with the matrix; only lines with a brand word such as
    NVIDIA, RTX or AMD count), with the line as the reason; None when no name of ``vendor``
    appears. Names of two generations are an error naming both lines."""
    found: dict[str, tuple[int, str]] = {}
    for no, line in enumerate(text.splitlines(), start=1):
        if not _BRAND.search(line):  # a host name such as "l4-node-01" names no GPU
            continue
        for s in SPECS:
            if s.vendor == vendor and s.name not in found and re.search(s.names, line, re.IGNORECASE):
                found[s.name] = (no, line.strip()[:80])
    if not found:
        return None
    if len(found) > 1:
        what = ", ".join(f"{n} on line {no}" for n, (no, _) in found.items())
        raise InputError("gpu_generation", f"cannot be guessed: the file names GPUs of several generations ({what})",
                         f"give --gpu-generation {'|'.join(found)}")
    name, (no, line) = next(iter(found.items()))
    return name, f"GPU generation {name} (guessed from the name on line {no}: {line!r}; give --gpu-generation NAME to choose)"


def by_links(total: int, uniform: int | None, vendor: str = "nvidia") -> tuple[str, str]:
    """The guess from NVLink counts alone: the first generation whose links per GPU equal (else
    hold) ``total``, the most one GPU's NV cells add up to, as direct links (a bridged pair or a full
    mesh uses every link); failing that, the first whose links equal (else hold) ``uniform``, the
    NV# every GPU pair shares (ports into a switch). The reason says it is a guess, why, and which
    generations would price the same file differently."""
    fabric = [s.name for s in SPECS if s.vendor == vendor and s.links]
    fits = [n for n in fabric if SPEC[n].links >= total]
    if fits:
        exact = [n for n in fits if SPEC[n].links == total]  # a bridge pair or a full mesh uses every link
        g = (exact or fits)[0]
        why = f"at most {total} NVLinks per GPU as direct links; {g} has {SPEC[g].links}" + (", all used" if exact else "")
    else:
        exact = [n for n in fabric if uniform is not None and SPEC[n].links == uniform]
        fits = exact or [n for n in fabric if uniform is not None and SPEC[n].links >= uniform]
        if not fits:
            raise InputError("gpu_generation", f"cannot be guessed: a GPU has {total} NVLinks, more than any table holds",
                             "give --gpu-generation and a --link-table with nvlinks_per_gpu")
        g = fits[0]
        why = f"every GPU pair is NV{uniform}, {uniform} NVLinks per GPU into NVSwitch; {g} has {SPEC[g].links}"
    return g, f"GPU generation {g} (guessed: {why}{others(g, fits, links_only=True)}; give --gpu-generation NAME to choose)"


def pcie_only(vendor: str = "nvidia") -> tuple[str, str]:
    """The guess for a box whose file shows no GPU-to-GPU link: a PCIe Gen4 card, said as such."""
    if vendor == "amd":
        return "mi250", ("GPU generation mi250 (guessed: no xGMI link between any two GPUs, so only PCIe prices matter: "
                         "Gen4 x16, 32 GB/s; mi300x would be Gen5, 64 GB/s; give --gpu-generation NAME to choose)")
    same = [s.name for s in SPECS if s.vendor == "nvidia" and not s.links]
    return "l40s", (f"GPU generation l40s (guessed: no NV# cell, a PCIe-only box, priced PCIe Gen4 x16, 32 GB/s, as "
                    f"{', '.join(same)} are; a Gen5 card would be 64 GB/s: give --gpu-generation NAME to choose)")


def by_sm(sms: list[int], most_links: int, path: str) -> tuple[str, str]:
    """The guess from the XML's ``sm`` values (one generation per file), refined by the most
    NVLinks one GPU lists (``most_links``: 8 on sm 80 or 90 is an A800 or H800)."""
    if len(sms) > 1:
        raise InputError("gpu_generation", f"cannot be guessed: {path} mixes GPUs of sm {', '.join(map(str, sms))}",
                         "give --gpu-generation NAME")
    sm = sms[0]
    if sm not in SM_GENERATION:
        known = ", ".join(f"sm {k} = {'/'.join(v)}" for k, v in SM_GENERATION.items())
        raise InputError("gpu_generation", f"cannot be guessed from sm {sm}: there is a table only for {known}",
                         "give --gpu-generation NAME")
    fits = [n for n in SM_GENERATION[sm] if SPEC[n].links >= most_links] or list(SM_GENERATION[sm])
    exact = [n for n in fits if most_links and SPEC[n].links == most_links]
    g = exact[0] if exact else fits[0]
    why = f"sm {sm}" + (f" and {most_links} NVLinks per GPU" if exact and g != fits[0] else "")
    same = [n for n in fits if n != g and SPEC[n].prices() == SPEC[g].prices()]
    also = f"; {'/'.join(same)} price the same" if same else ""
    return g, f"GPU generation {g} (guessed from {why}{also}{others(g, fits)}; give --gpu-generation NAME to choose)"
