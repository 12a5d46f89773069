"""MSCCL algorithms per message-size range: synthesize across sizes, pick per size the candidate
the model says is fastest, merge neighbouring sizes with the same pick into ranges (split again
wherever one schedule would lose more than ``max_loss`` at a size), and write one MSCCL XML per
range with ``minBytes``/``maxBytes``, plus ``ranges.json`` and ``ranges.md``; on request one
MSCCL++ execution plan per range too (:func:`write_mscclpp_ranges`, ``min_message_size`` and
``max_message_size`` the same inclusive bounds, as MSCCL++'s ``execution_plan.cc`` checks them).

How MSCCL picks (Azure/msccl-executor-nccl, ``src/misc/msccl/msccl_lifecycle.cc``, the internal
scheduler; Azure/msccl-scheduler does the same): an algorithm of the right collective, rank
count and in/out-of-place flag is chosen when its chunking fits the call and ``minBytes <=
nBytes`` and (``maxBytes == 0`` or ``nBytes <= maxBytes``): both ends inclusive, ``maxBytes="0"``
no upper limit, the first match in directory order wins. ``nBytes`` is ``count * type size *
sizeMultiplier`` with the multiplier ngpus for AllGather, ReduceScatter and AlltoAll and 1 for
AllReduce: flowride's (and nccl-tests') size. The chunking test differs between executor
versions: older ones check ``count % nchunksperloop == 0`` (``count`` the per-rank count NCCL was
called with), newer ones ``(count * sizeMultiplier) % nchunksperloop == 0``. The swept sizes are
rounded so that both hold (:func:`export_unit`): n·C elements for AllReduce, n²·C for the
others, whose per-rank count is size / n. So the ranges written here are
``[0, s2-1], [s2, s3-1], ..., [sk, open)`` where s2..sk are the sizes at which the pick changes:
a message between two swept sizes gets the pick of the smaller one.

The protocol (LL, LL128, Simple) is not modelled by the synthesis: the epoch model knows links,
not NCCL's wire formats. It is chosen per size by NCCL's own cost model (:func:`nccl_protocol`)
unless the caller fixes one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from flowride.api import retimed
from flowride.collectives.demand import Collective, make_demand
from flowride.errors import InputError
from flowride.files import check_output_dir, check_output_tree, write_json_atomic, write_text_atomic
from flowride.program import from_msccl_xml, lower, to_msccl_xml, to_mscclpp
from flowride.program.msccl_limits import PROTOS
from flowride.runtime.nccl_tuning import PROTOCOL_RULE, nccl_protocol
from flowride.schedule.ir import Schedule
from flowride.schedule.metrics import run_bytes
from flowride.sizes import DEFAULT_MAX_LOSS
from flowride.sweep.synth import SweepPoint, synthesize_sweep
from flowride.synth.options import SynthOptions
from flowride.synth.result import Progress
from flowride.topology.group import relay_ranks
from flowride.topology.model import Topology
from flowride.units import format_size


def gpu_bus_GBps(topo: Topology) -> float:
    """The bus bandwidth a ring sees: the smallest total out-link bandwidth of a GPU."""
    out = {g: 0.0 for g in topo.gpus}
    for lk in topo.links:
        if lk.src in out:
            out[lk.src] += lk.bandwidth_GBps
    return min(out.values())


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
    nccl: tuple[str, float] | None = None  # NCCL's best modelled algorithm at this size and its time (us)

    @property
    def nccl_speedup(self) -> float | None:
        """NCCL's best modelled time over the pick's (how much faster ours is)."""
        return self.nccl[1] / self.times_us[self.pick.label] if self.nccl else None

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
    worst_loss: float  # max over the range's sizes of (that schedule at that size / the size's own); <= max_loss
    file: str = ""
    nccl: list[dict] = field(default_factory=list)  # per swept size: NCCL's best modelled algorithm, its time, our speedup
    mscclpp: str = ""  # the MSCCL++ execution plan written for this range, if asked for
    mscclpp_refused: str = ""  # why none was written (over the executor's limits)

    def as_dict(self) -> dict:
        return {"file": self.file, **({"mscclpp": self.mscclpp} if self.mscclpp else {}),
                **({"mscclpp_refused": self.mscclpp_refused} if self.mscclpp_refused else {}), "min_bytes": self.min_bytes, "max_bytes": self.max_bytes, "chunks": self.chunks,
                "epoch": self.pick.epoch, "proto": self.proto, "sizes": self.sizes, "schedule_from_size": self.from_size,
                "worst_loss": self.worst_loss, "method": self.schedule.meta.get("method"), "nccl": self.nccl}


SELECTION = ("MSCCL picks an algorithm when minBytes <= size <= maxBytes (maxBytes 0: no limit) and the chunking fits: "
             "older executors check count % nchunksperloop == 0 (count per rank), newer ones (count * sizeMultiplier) % "
             "nchunksperloop == 0; size = count * type size * ngpus (AllReduce: * 1). The swept sizes satisfy both.")


@dataclass
class RangePlan:
    topology: str
    collective: str
    gpus: int
    candidates: list[Candidate]
    picks: list[SizePick]
    ranges: list[RangeAlgo]
    protocol_rule: str
    max_loss: float = DEFAULT_MAX_LOSS

    def as_dict(self) -> dict:
        return {
            "topology": self.topology, "collective": self.collective, "gpus": self.gpus, "selection": SELECTION,
            "candidates": [c.label for c in self.candidates], "protocol_rule": self.protocol_rule, "max_loss": self.max_loss,
            "ranges": [r.as_dict() for r in self.ranges],
            "sizes": [{"size": p.size, "pick": p.pick.label, "proto": p.proto, "times_us": p.times_us,
                       "nccl": {"best": p.nccl[0], "best_us": p.nccl[1], "speedup_vs_nccl": p.nccl_speedup} if p.nccl else None}
                      for p in self.picks],
        }

    COLUMNS = ("bytes (minBytes..maxBytes)", "file", "chunks", "epochs", "protocol", "swept sizes", "worst loss", "vs NCCL's best")

    def table_rows(self) -> list[tuple[str, ...]]:
        """One row of :attr:`COLUMNS` per range: the one table ``ranges.md`` and the CLI both show."""
        rows = []
        for r in self.ranges:
            hi = "open" if r.max_bytes == 0 else f"{r.max_bytes:,}"
            vs = ", ".join(f"{x['best']} {x['speedup_vs_nccl']:.2f}x" for x in r.nccl) or "-"
            rows.append((f"{r.min_bytes:,}..{hi}", r.file, str(r.chunks), r.pick.epoch, r.proto,
                         ", ".join(format_size(s) for s in r.sizes), f"{r.worst_loss:.3f}", vs))
        return rows

    def markdown(self) -> str:
        lines = [f"# MSCCL algorithms for {self.collective} on {self.topology} ({self.gpus} GPUs)", "",
                 "| " + " | ".join(self.COLUMNS) + " |", "|" + "---|" * len(self.COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in self.table_rows()]
        lines += ["", f"Worst loss: the range's schedule at a swept size over that size's own modelled time (at most "
                      f"{self.max_loss:g}; a range is split where it would be more).",
                  "", "vs NCCL's best: per swept size, NCCL's fastest algorithm modelled on the same topology and epochs "
                      "(flowride.synth.nccl) and how much faster this range's pick is there.",
                  "", "Protocol: not chosen by the synthesis model; " + self.protocol_rule + ".", ""]
        return "\n".join(lines)


def export_unit(collective: Collective | str, n: int, chunks: int) -> int:
    """The chunks-per-block factor handed to :func:`~flowride.schedule.metrics.run_bytes` so that a
    swept size passes both executor rules (see the module): AllReduce n·C elements (count =
    size / 4 divides by nchunksperloop = n·C); AllGather, ReduceScatter and AlltoAll n²·C, because
    their per-rank count is size / (4n) and the older rule wants that to divide by n·C."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    return chunks if coll is Collective.ALLREDUCE else n * chunks


def _check_max_loss(max_loss: float) -> float:
    try:
        v = float(max_loss)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v >= 1.0):
        raise InputError("max_loss", f"{max_loss!r} is not a ratio of at least 1",
                         f"give e.g. {DEFAULT_MAX_LOSS} (a range's schedule at most 2% slower than a size's own)")
    return v


def plan_ranges(topo: Topology, collective: Collective | str, sizes: list[int], chunk_options: tuple[int, ...] = (1, 2, 4),
                epochs: tuple[str, ...] = ("fast",), opts: SynthOptions | None = None, proto: str = "auto",
                progress: Progress | None = None, warm_start: bool = True, max_loss: float = DEFAULT_MAX_LOSS) -> RangePlan:
    """Sweep every candidate (chunks x epoch preset) over ``sizes`` (rounded to whole float32
    elements, a multiple of n*lcm(chunks) for AllReduce and n²*lcm(chunks) otherwise:
    :func:`export_unit`), pick the fastest per size (ties: fewer chunks, the earlier preset), merge
    neighbours with the same pick and protocol into ranges, and split those where one schedule
    would serve some size more than ``max_loss`` slower than its own (:func:`split_by_loss`)."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    if proto != "auto" and proto not in PROTOS:
        raise InputError("proto", f"{proto!r} is not an MSCCL protocol", f"choose auto or one of {', '.join(PROTOS)}")
    if not chunk_options or any(not isinstance(c, int) or c < 1 for c in chunk_options):
        raise InputError("chunks", f"{chunk_options!r} are not positive whole numbers", "give e.g. 1,2,4")
    if not epochs:
        raise InputError("epochs", "names no epoch preset", "give fast, slow or fast,slow")
    for e in epochs:
        if e not in ("fast", "slow"):
            raise InputError("epochs", f"{e!r} is not a preset", "give fast, slow or fast,slow")
    max_loss = _check_max_loss(max_loss)
    if not sizes:
        raise InputError("sizes", "none given", "give at least one size")
    opts = opts or SynthOptions()
    n = topo.buffer_ranks
    unit = export_unit(coll, n, math.lcm(*chunk_options))
    cands = [Candidate(c, e) for c in sorted(set(chunk_options)) for e in dict.fromkeys(epochs)]
    same = sorted({run_bytes(s, n, unit) for s in sizes})  # every candidate the same sizes, each passing both executor rules
    sweeps: dict[Candidate, list[SweepPoint]] = {}
    for k, cand in enumerate(cands):
        def tagged(ev: dict, k: int = k, cand: Candidate = cand) -> None:
            if progress:
                progress({**ev, "candidate": cand.label, "candidate_i": k + 1, "candidates": len(cands)})
        sweeps[cand] = synthesize_sweep(topo, coll, same, cand.chunks, replace(opts, epoch=cand.epoch), tagged, warm_start,
                                        nccl=k == 0)  # NCCL's algorithms depend on the size only: modelled once
    bus = gpu_bus_GBps(topo)
    picks = []
    for i, size in enumerate(p.size_bytes for p in sweeps[cands[0]]):
        times = {c.label: sweeps[c][i].outcome.finish_time_s for c in cands}
        best = next(c for c in cands if times[c.label] <= min(times.values()) * (1 + 1e-9))  # ties: the earlier candidate
        p = proto if proto != "auto" else nccl_protocol(coll, len(topo.gpus), size, bus)
        model = sweeps[cands[0]][i].outcome.nccl
        picks.append(SizePick(size, {k: v * 1e6 for k, v in times.items()}, best, sweeps[best][i], p,
                              (model.best.name, model.best.time_us) if model else None))
    groups: list[list[SizePick]] = []
    for p in picks:
        if groups and groups[-1][-1].key == p.key:
            groups[-1].append(p)
        else:
            groups.append([p])
    pieces = [piece for members in groups for piece in _split_group(topo, coll, members, max_loss)]
    ranges = []
    for g, (members, j, worst) in enumerate(pieces):
        lo = 0 if g == 0 else members[0].size
        hi = 0 if g == len(pieces) - 1 else pieces[g + 1][0][0].size - 1
        first = members[0]
        nccl = [{"size": m.size, "best": m.nccl[0], "best_us": m.nccl[1], "speedup_vs_nccl": m.nccl_speedup} for m in members if m.nccl]
        ranges.append(RangeAlgo(lo, hi, first.pick, first.point.outcome.schedule.chunks, first.proto, [m.size for m in members],
                                members[j].point.outcome.schedule, members[j].size, worst, nccl=nccl))
    rule = f"fixed by the caller: {proto}" if proto != "auto" else PROTOCOL_RULE + f"; bus bandwidth {bus:g} GB/s per GPU"
    return RangePlan(topo.name, coll.value, len(topo.gpus), cands, picks, ranges, rule, max_loss)


def split_by_loss(count: int, loss: Callable[[int, int], float], max_loss: float) -> list[tuple[int, int, int, float]]:
    """Members 0..count-1 (sizes, ascending) cut into consecutive runs ``(first, last, j, worst)``,
    each served by member j's schedule, where ``loss(j, i)`` (member j's schedule at member i's
    size over i's own time; ``loss(i, i)`` is taken as 1) is at most ``max_loss`` for every i of
    the run and ``worst`` is the largest of them. Greedy from the left: a run grows while some
    member of it (the new one included) still serves all of it; of those the one with the least
    worst loss (ties: the smaller size) is written. ``loss`` is called lazily, O(run length²)."""
    out: list[tuple[int, int, int, float]] = []
    start = 0
    while start < count:
        serving = {start: 1.0}  # member -> its worst loss over start..end
        end = start
        while end + 1 < count:
            k = end + 1
            grown = {j: max(w, x) for j, w in serving.items() if (x := loss(j, k)) <= max_loss * (1 + 1e-12)}
            worst = 1.0
            for i in range(start, k):
                worst = max(worst, loss(k, i))
                if worst > max_loss * (1 + 1e-12):
                    break
            else:
                grown[k] = worst
            if not grown:
                break
            serving, end = grown, k
        j = min(serving, key=lambda m: (serving[m], m))
        out.append((start, end, j, serving[j]))
        start = end + 1
    return out


def _signature(sched: Schedule) -> tuple:
    """A schedule's plan without its timing: its sends in epoch order, epochs replaced by their
    rank. Two schedules with one signature lower to the same program (the same steps in the same
    order on every GPU), so one XML is each size's own."""
    order = {e: k for k, e in enumerate(sorted({s.epoch for s in sched.sends}))}
    return tuple(sorted((order[s.epoch], s.link, s.source, s.chunk, s.reduce) for s in sched.sends))


def _split_group(topo: Topology, coll: Collective, members: list[SizePick], max_loss: float) -> list[tuple[list[SizePick], int, float]]:
    """One group of neighbouring sizes with the same pick, cut where one schedule cannot serve
    them all within ``max_loss``: each piece, the index in it of the schedule written, and the
    worst loss. AllGather and AlltoAll schedules are retimed to each size (:func:`retimed`, the
    replay the warm start uses) and compared with that size's own. A reduction cannot be retimed
    (its partial sums are not modelled by the replay), so its sizes share an XML only where their
    schedules are the same plan (:func:`_signature`): there the loss is 1 by construction."""
    own = [m.point.outcome for m in members]
    cache: dict[tuple[int, int], float] = {}

    def loss(j: int, i: int) -> float:
        if i == j:
            return 1.0
        if (j, i) not in cache:
            cand = own[j].schedule
            if coll.reduces:
                cache[(j, i)] = 1.0 if _signature(cand) == _signature(own[i].schedule) else math.inf
            else:
                r = retimed(topo, cand, make_demand(topo, coll, members[i].size, cand.chunks), own[i].schedule.tau, "")
                cache[(j, i)] = math.inf if r is None else r.epochs * own[i].schedule.tau / own[i].finish_time_s
        return cache[(j, i)]

    return [(members[a:b + 1], j - a, worst) for a, b, j, worst in split_by_loss(len(members), loss, max_loss)]


XML_DIR = "xml"  # MSCCL_ALGO_DIR: the executor parses every file there as XML, so nothing else goes in
RANGE_FILES = ("ranges.json", "ranges.md")


def stale_files(out_dir: str | Path, clean: bool = False) -> list[Path]:
    """Refuse an output directory whose ``xml/`` already holds files: MSCCL loads every file there,
    so the old ranges would overlap the new ones and the first in directory order would win.
    With ``clean`` the ``*.xml`` files there (and the ranges files) are the ones to remove
    (returned, not removed: :func:`write_ranges` removes them just before writing); anything
    else in ``xml/`` is still refused, since it is not ours to delete."""
    d = check_output_dir(out_dir, "out_dir")
    xd = d / XML_DIR
    found = sorted(xd.iterdir()) if xd.is_dir() else []
    if not found:
        return []

    def names(ps: list[Path]) -> str:
        return ", ".join(p.name for p in ps[:5]) + (f" and {len(ps) - 5} more" if len(ps) > 5 else "")

    if not clean:
        raise InputError("out_dir", f"{xd} already holds {names(found)}; MSCCL loads every file there, so old ranges would "
                         "overlap the new ones", "give --clean to remove the *.xml files there first, or another --out-dir")
    other = [p for p in found if not (p.suffix == ".xml" and p.is_file())]
    if other:
        raise InputError("out_dir", f"{xd} holds {names(other)}, which --clean leaves alone (it removes only *.xml) and MSCCL "
                         "would try to load", "remove them yourself, or give another --out-dir")
    return found + [d / f for f in RANGE_FILES if (d / f).is_file()]


def write_ranges(plan: RangePlan, out_dir: str | Path, unfused: bool = False, clean: bool = False) -> list[Path]:
    """One MSCCL XML per range under ``out_dir/xml/`` (checked by
    :func:`~flowride.program.to_msccl_xml`, read back with :func:`~flowride.program.from_msccl_xml`),
    and ``ranges.json`` and ``ranges.md`` in ``out_dir``. The XMLs have a folder of their own
    because MSCCL's scheduler reads every file of ``MSCCL_ALGO_DIR`` as an algorithm and fails on
    any other; a folder already holding files is refused, or with ``clean`` its ``*.xml`` files
    removed first (:func:`stale_files`)."""
    d = check_output_dir(out_dir, "out_dir")
    texts = []
    for r in plan.ranges:  # every XML built and checked before anything is removed or written
        r.file = f"{XML_DIR}/{plan.collective}_{plan.gpus}gpus_{r.min_bytes}-{r.max_bytes or 'open'}.xml"
        name = f"flowride {plan.collective} {plan.topology} {format_size(r.min_bytes) if r.min_bytes else '0B'}" \
               f"-{format_size(r.max_bytes + 1) if r.max_bytes else 'open'}"
        text = to_msccl_xml(lower(r.schedule), name=name, proto=r.proto, unfused=unfused, min_bytes=r.min_bytes, max_bytes=r.max_bytes)
        from_msccl_xml(text, r.file)  # to_msccl_xml has checked it; reading it back is the contract of this file
        texts.append((d / r.file, text))
    for old in stale_files(d, clean):
        old.unlink()
    (d / XML_DIR).mkdir(parents=True, exist_ok=True)
    for path, text in texts:
        write_text_atomic(path, text)
    write_json_atomic(d / "ranges.json", plan.as_dict(), indent=1)
    write_text_atomic(d / "ranges.md", plan.markdown())
    return [p for p, _ in texts] + [d / f for f in RANGE_FILES]


def mscclpp_proto(proto: str) -> str:
    """MSCCL++ has the Simple and LL protocols: a range NCCL's model gives LL keeps it; LL128 and
    Simple ranges are written Simple (LL128's 128-byte lines have no MSCCL++ counterpart)."""
    return "LL" if proto == "LL" else "Simple"


def write_mscclpp_ranges(plan: RangePlan, out_dir: str | Path) -> list[Path]:
    """One MSCCL++ execution plan per range in ``out_dir`` (each built and checked by
    :func:`~flowride.program.to_mscclpp` before any is written), the range's bounds its
    ``min_message_size``/``max_message_size``; a range whose plan would exceed the executor's
    limits gets none, the reason in ``mscclpp_refused`` (MSCCL++ falls back to NCCL for sizes
    no plan covers). Each range records its file (or why none), for the ``ranges.json`` that
    :func:`write_ranges` writes after it."""
    d = check_output_dir(out_dir, "mscclpp")
    plans = []
    for r in plan.ranges:
        name = f"{plan.collective}_{plan.gpus}gpus_{r.min_bytes}-{r.max_bytes or 'open'}.json"
        try:
            obj = to_mscclpp(lower(r.schedule), r.schedule.topology, proto=mscclpp_proto(r.proto),
                             name=f"flowride {plan.collective} {plan.topology} {r.min_bytes}-{r.max_bytes or 'open'}",
                             min_bytes=r.min_bytes, max_bytes=r.max_bytes or None)
        except InputError as e:
            r.mscclpp, r.mscclpp_refused = "", e.problem
            continue
        plans.append((d / name, obj))
        r.mscclpp, r.mscclpp_refused = str(d / name), ""
    d.mkdir(parents=True, exist_ok=True)
    for path, obj in plans:
        write_json_atomic(path, obj, indent=1)
    return [p for p, _ in plans]


def check_no_relays(topo: Topology) -> None:
    """A range export needs a topology without relay nodes: the schedules of its ranges are not
    known before the sweep, and one relaying through a GPU outside the group cannot be lowered
    (:func:`~flowride.program.lower`), so any relay is refused before synthesizing."""
    relays = relay_ranks(topo)
    if relays:
        raise InputError("relay", f"relays through GPU(s) {', '.join(map(str, relays))} outside the group: export needs --relay off "
                         "(a range's schedules are not known before the sweep)", "synthesize with --relay off to export or run")


def check_export(topo: Topology, collective: Collective | str, out_dir: str | Path, clean: bool = False) -> None:
    """What would fail only at writing, refused before any synthesis: an unknown collective, a
    topology with relay nodes (:func:`check_no_relays`), an ``xml/`` that is a file or a
    ``ranges.json``/``ranges.md`` that is a folder (:func:`~flowride.files.check_output_tree`), an
    ``xml/`` folder that already holds files (:func:`stale_files`, unless ``clean``)."""
    if not isinstance(collective, Collective):
        Collective.parse(collective)
    check_no_relays(topo)
    check_output_tree(out_dir, list(RANGE_FILES), "out_dir", dirs=(XML_DIR,))
    stale_files(out_dir, clean)


def export_ranges(topo: Topology, collective: Collective | str, sizes: list[int], out_dir: str | Path,
                  chunk_options: tuple[int, ...] = (1, 2, 4), epochs: tuple[str, ...] = ("fast",), opts: SynthOptions | None = None,
                  proto: str = "auto", unfused: bool = False, progress: Progress | None = None, max_loss: float = DEFAULT_MAX_LOSS,
                  clean: bool = False, mscclpp_dir: str | Path | None = None) -> RangePlan:
    """:func:`check_export`, :func:`plan_ranges`, then :func:`write_ranges` (and, with
    ``mscclpp_dir``, :func:`write_mscclpp_ranges`): the one call behind ``flowride export --sizes``."""
    check_export(topo, collective, out_dir, clean)
    if mscclpp_dir is not None:
        check_output_dir(mscclpp_dir, "mscclpp")
    plan = plan_ranges(topo, collective, sizes, chunk_options, epochs, opts, proto, progress, max_loss=max_loss)
    if mscclpp_dir is not None:  # first: ranges.json, written once by write_ranges, names the plans
        write_mscclpp_ranges(plan, mscclpp_dir)
    write_ranges(plan, out_dir, unfused, clean)
    return plan
