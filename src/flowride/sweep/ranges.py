"""MSCCL algorithms per message-size range: synthesize across sizes, pick per size the candidate
the model says is fastest, merge neighbouring sizes with the same pick into ranges, and write one
MSCCL XML per range with ``minBytes``/``maxBytes``, plus ``ranges.json`` and ``ranges.md``.

How MSCCL picks (Azure/msccl-executor-nccl, ``src/misc/msccl/msccl_lifecycle.cc``, the internal
scheduler; Azure/msccl-scheduler does the same): an algorithm of the right collective, rank
count and in/out-of-place flag is chosen when ``count % nchunksperloop == 0`` and
``minBytes <= nBytes`` and (``maxBytes == 0`` or ``nBytes <= maxBytes``): both ends inclusive,
``maxBytes="0"`` no upper limit, the first match in directory order wins. ``nBytes`` is ``count *
type size * sizeMultiplier`` with the multiplier ngpus for AllGather, ReduceScatter and AlltoAll
and 1 for AllReduce: flowride's (and nccl-tests') size. So the ranges written here are
``[0, s2-1], [s2, s3-1], ..., [sk, open)`` where s2..sk are the sizes at which the pick changes:
a message between two swept sizes gets the pick of the smaller one.

The protocol (LL, LL128, Simple) is not modelled by the synthesis: the epoch model knows links,
not NCCL's wire formats. It is chosen per size by NCCL's own cost model (:func:`nccl_protocol`)
unless the caller fixes one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from flowride.api import retimed
from flowride.collectives.demand import Collective, make_demand
from flowride.errors import InputError
from flowride.files import check_output_dir, write_json_atomic, write_text_atomic
from flowride.program import from_msccl_xml, lower, to_msccl_xml
from flowride.program.msccl_limits import PROTOS
from flowride.schedule.ir import Schedule
from flowride.schedule.metrics import run_bytes
from flowride.sweep.synth import SweepPoint, synthesize_sweep
from flowride.synth.options import SynthOptions
from flowride.synth.result import Progress
from flowride.topology.model import Topology
from flowride.units import format_size

# NCCL's ring cost model (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel and
# ncclTopoGetAlgoTime), single node over NVLink: time = latency + bytes / (1000 * algbw) in us.
# Latency: baseLat[Ring] + steps * hwLat[NVLink][Ring]; bus bandwidth per protocol: LL a third
# (a quarter for AllReduce) of the link's, LL128 0.92 of it, Simple all of it.
_BASE_LAT_US = {"LL": 3.6, "LL128": 10.0, "Simple": 8.4}
_HW_LAT_US = {"LL": 0.47, "LL128": 1.9, "Simple": 3.4}
PROTOCOL_RULE = ("NCCL's ring cost model (NVIDIA/nccl src/graph/tuning.cc, single node, NVLink constants): per size the "
                 "protocol of least latency + size / bandwidth, where LL has a third of the bus bandwidth (a quarter for "
                 "AllReduce) and the lowest latency, LL128 0.92 of it, Simple all of it and the highest latency")


def gpu_bus_GBps(topo: Topology) -> float:
    """The bus bandwidth a ring sees: the smallest total out-link bandwidth of a GPU."""
    out = {g: 0.0 for g in topo.gpus}
    for lk in topo.links:
        if lk.src in out:
            out[lk.src] += lk.bandwidth_GBps
    return min(out.values())


def nccl_protocol(collective: Collective | str, n: int, size_bytes: int, bus_GBps: float) -> str:
    """The protocol NCCL's ring model (see the module) predicts fastest for ``size_bytes``: LL for
    small messages, LL128 between, Simple for large ones; the crossovers move with ``n`` and the
    bus bandwidth. AlltoAll, which that model leaves out, is costed like AllGather."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    steps = 2 * (n - 1) if coll is Collective.ALLREDUCE else n - 1
    share = {"LL": 0.25 if coll is Collective.ALLREDUCE else 1 / 3, "LL128": 0.92, "Simple": 1.0}

    def time_us(p: str) -> float:
        algbw = bus_GBps * share[p] * n / steps
        return _BASE_LAT_US[p] + steps * _HW_LAT_US[p] + size_bytes / (1000 * algbw)

    return min(("LL", "LL128", "Simple"), key=time_us)


@dataclass(frozen=True)
class Candidate:
    chunks: int
    epoch: str

    @property
    def label(self) -> str:
        return f"{self.chunks} chunk{'s' if self.chunks > 1 else ''}, {self.epoch} epochs"


@dataclass
class SizePick:
    """One swept size: every candidate's modelled time and the pick."""

    size: int
    times_us: dict[str, float]  # candidate label -> modelled finish time
    pick: Candidate
    point: SweepPoint  # the pick's synthesis
    proto: str

    @property
    def key(self) -> tuple:
        """What must stay equal for neighbouring sizes to share one XML."""
        return self.pick, self.point.outcome.schedule.chunks, self.proto


@dataclass
class RangeAlgo:
    """One MSCCL algorithm and the sizes it is written for (MSCCL: min_bytes <= size <= max_bytes)."""

    min_bytes: int
    max_bytes: int  # inclusive; 0 = no upper limit
    pick: Candidate
    chunks: int  # chunks per block in the XML (the LP route may cut a chunk in pieces)
    proto: str
    sizes: list[int]  # the swept sizes in this range
    schedule: Schedule
    from_size: int  # the swept size whose schedule is written
    worst_loss: float | None  # max over the range's sizes of (that schedule retimed there / the size's own)
    file: str = ""

    def as_dict(self) -> dict:
        return {"file": self.file, "min_bytes": self.min_bytes, "max_bytes": self.max_bytes, "chunks": self.chunks,
                "epoch": self.pick.epoch, "proto": self.proto, "sizes": self.sizes, "schedule_from_size": self.from_size,
                "worst_loss": self.worst_loss, "method": self.schedule.meta.get("method")}


@dataclass
class RangePlan:
    topology: str
    collective: str
    gpus: int
    candidates: list[Candidate]
    picks: list[SizePick]
    ranges: list[RangeAlgo]
    protocol_rule: str
    others: list[str] = field(default_factory=list)  # XML files in the output directory not written now

    def as_dict(self) -> dict:
        return {
            "topology": self.topology, "collective": self.collective, "gpus": self.gpus,
            "selection": "MSCCL picks an algorithm when minBytes <= size <= maxBytes (maxBytes 0: no limit) and the "
                         "count divides by nchunksperloop; size = count * type size * ngpus (AllReduce: * 1)",
            "candidates": [c.label for c in self.candidates], "protocol_rule": self.protocol_rule,
            "ranges": [r.as_dict() for r in self.ranges],
            "sizes": [{"size": p.size, "pick": p.pick.label, "proto": p.proto, "times_us": p.times_us} for p in self.picks],
        }

    def markdown(self) -> str:
        lines = [f"# MSCCL algorithms for {self.collective} on {self.topology} ({self.gpus} GPUs)", "",
                 "| bytes (minBytes..maxBytes) | file | chunks | epochs | protocol | swept sizes | worst loss |",
                 "|---|---|---|---|---|---|---|"]
        for r in self.ranges:
            hi = "open" if r.max_bytes == 0 else f"{r.max_bytes:,}"
            loss = "-" if r.worst_loss is None else f"{r.worst_loss:.3f}"
            lines.append(f"| {r.min_bytes:,}..{hi} | {r.file} | {r.chunks} | {r.pick.epoch} | {r.proto} | "
                         f"{', '.join(format_size(s) for s in r.sizes)} | {loss} |")
        lines += ["", "Protocol: not chosen by the synthesis model; " + self.protocol_rule + ".", ""]
        return "\n".join(lines)


def plan_ranges(topo: Topology, collective: Collective | str, sizes: list[int], chunk_options: tuple[int, ...] = (1, 2, 4),
                epochs: tuple[str, ...] = ("fast",), opts: SynthOptions | None = None, proto: str = "auto",
                progress: Progress | None = None, warm_start: bool = True) -> RangePlan:
    """Sweep every candidate (chunks x epoch preset) over ``sizes`` (rounded to whole float32
    elements, a multiple of n*lcm(chunks)), pick the fastest per size (ties: fewer chunks, the
    earlier preset), merge neighbours with the same pick and protocol into ranges, and choose the
    schedule each range's XML is written from (:func:`_range_schedule`)."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    if proto != "auto" and proto not in PROTOS:
        raise InputError("proto", f"{proto!r} is not an MSCCL protocol", f"choose auto or one of {', '.join(PROTOS)}")
    if not chunk_options or any(not isinstance(c, int) or c < 1 for c in chunk_options):
        raise InputError("chunks", f"{chunk_options!r} are not positive whole numbers", "give e.g. 1,2,4")
    for e in epochs:
        if e not in ("fast", "slow"):
            raise InputError("epochs", f"{e!r} is not a preset", "give fast, slow or fast,slow")
    opts = opts or SynthOptions()
    n = topo.buffer_ranks
    step = math.lcm(*chunk_options)
    cands = [Candidate(c, e) for c in sorted(set(chunk_options)) for e in dict.fromkeys(epochs)]
    sweeps: dict[Candidate, list[SweepPoint]] = {}
    for k, cand in enumerate(cands):
        def tagged(ev: dict, k: int = k, cand: Candidate = cand) -> None:
            if progress:
                progress({**ev, "candidate": cand.label, "candidate_i": k + 1, "candidates": len(cands)})
        same = sorted({run_bytes(s, n, step) for s in sizes})  # n*lcm(chunks) elements: every candidate the same sizes
        sweeps[cand] = synthesize_sweep(topo, coll, same, cand.chunks, replace(opts, epoch=cand.epoch), tagged, warm_start)
    bus = gpu_bus_GBps(topo)
    picks = []
    for i, size in enumerate(p.size_bytes for p in sweeps[cands[0]]):
        times = {c.label: sweeps[c][i].outcome.finish_time_s for c in cands}
        best = next(c for c in cands if times[c.label] <= min(times.values()) * (1 + 1e-9))  # ties: the earlier candidate
        p = proto if proto != "auto" else nccl_protocol(coll, len(topo.gpus), size, bus)
        picks.append(SizePick(size, {k: v * 1e6 for k, v in times.items()}, best, sweeps[best][i], p))
    groups: list[list[SizePick]] = []
    for p in picks:
        if groups and groups[-1][-1].key == p.key:
            groups[-1].append(p)
        else:
            groups.append([p])
    ranges = []
    for g, members in enumerate(groups):
        lo = 0 if g == 0 else members[0].size
        hi = 0 if g == len(groups) - 1 else groups[g + 1][0].size - 1
        sched, src, loss = _range_schedule(topo, coll, members)
        first = members[0]
        ranges.append(RangeAlgo(lo, hi, first.pick, first.point.outcome.schedule.chunks, first.proto, [m.size for m in members],
                                sched, src, loss))
    rule = f"fixed by the caller: {proto}" if proto != "auto" else PROTOCOL_RULE + f"; bus bandwidth {bus:g} GB/s per GPU"
    return RangePlan(topo.name, coll.value, len(topo.gpus), cands, picks, ranges, rule)


MAX_SCORED = 5  # schedules of a range compared against each other (first, last, spread between)


def _range_schedule(topo: Topology, coll: Collective, members: list[SizePick]) -> tuple[Schedule, int, float | None]:
    """The schedule one XML carries for all of a range's sizes: of the range's own schedules, the
    one that, retimed to each size of the range, loses least against that size's own schedule
    (worst ratio of modelled times). Reductions cannot be retimed: the middle size's schedule."""
    own = [m.point.outcome for m in members]
    if len(members) == 1 or coll.reduces:
        mid = len(members) // 2
        return own[mid].schedule, members[mid].size, 1.0 if len(members) == 1 else None
    idx = sorted({round(k * (len(members) - 1) / (MAX_SCORED - 1)) for k in range(MAX_SCORED)})
    best: tuple[float, int] | None = None
    for j in idx:
        cand = own[j].schedule
        worst = 1.0
        for i, o in enumerate(own):
            if i == j:
                continue
            r = retimed(topo, cand, make_demand(topo, coll, members[i].size, cand.chunks), o.schedule.tau, "")
            worst = math.inf if r is None else max(worst, r.epochs * o.schedule.tau / o.finish_time_s)
        if best is None or worst < best[0] - 1e-12:
            best = (worst, j)
    worst, j = best
    return own[j].schedule, members[j].size, None if math.isinf(worst) else worst


XML_DIR = "xml"  # MSCCL_ALGO_DIR: the executor parses every file there as XML, so nothing else goes in


def write_ranges(plan: RangePlan, out_dir: str | Path, unfused: bool = False) -> list[Path]:
    """One MSCCL XML per range under ``out_dir/xml/`` (checked by
    :func:`~flowride.program.to_msccl_xml`, read back with :func:`~flowride.program.from_msccl_xml`),
    and ``ranges.json`` and ``ranges.md`` in ``out_dir``. The XMLs have a folder of their own
    because MSCCL's scheduler reads every file of ``MSCCL_ALGO_DIR`` as an algorithm and fails on
    any other; files already there are left alone and listed in ``plan.others``."""
    d = check_output_dir(out_dir, "out_dir")
    (d / XML_DIR).mkdir(parents=True, exist_ok=True)
    written = []
    for r in plan.ranges:
        r.file = f"{XML_DIR}/{plan.collective}_{plan.gpus}gpus_{r.min_bytes}-{r.max_bytes or 'open'}.xml"
        name = f"flowride {plan.collective} {plan.topology} {format_size(r.min_bytes) if r.min_bytes else '0B'}" \
               f"-{format_size(r.max_bytes + 1) if r.max_bytes else 'open'}"
        text = to_msccl_xml(lower(r.schedule), name=name, proto=r.proto, unfused=unfused, min_bytes=r.min_bytes, max_bytes=r.max_bytes)
        from_msccl_xml(text, r.file)  # to_msccl_xml has checked it; reading it back is the contract of this file
        write_text_atomic(d / r.file, text)
        written.append(d / r.file)
    write_json_atomic(d / "ranges.json", plan.as_dict(), indent=1)
    write_text_atomic(d / "ranges.md", plan.markdown())
    plan.others = sorted(p.name for p in (d / XML_DIR).iterdir() if p not in written)
    return [*written, d / "ranges.json", d / "ranges.md"]


def export_ranges(topo: Topology, collective: Collective | str, sizes: list[int], out_dir: str | Path,
                  chunk_options: tuple[int, ...] = (1, 2, 4), epochs: tuple[str, ...] = ("fast",), opts: SynthOptions | None = None,
                  proto: str = "auto", unfused: bool = False, progress: Progress | None = None) -> RangePlan:
    """:func:`plan_ranges`, then :func:`write_ranges`: the one call behind ``flowride export --sizes``."""
    check_output_dir(out_dir, "out_dir")
    plan = plan_ranges(topo, collective, sizes, chunk_options, epochs, opts, proto, progress)
    write_ranges(plan, out_dir, unfused)
    return plan
