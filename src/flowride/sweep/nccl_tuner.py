"""A CSV for NCCL's example tuner plugin: where flowride's model of NCCL's algorithms picks an
algorithm and protocol other than NCCL's own cost model, per collective and size range.

At each swept size two choices are made on one topology:

- **NCCL's default**: the (algorithm, protocol) of least estimated time in NCCL's own cost model
  (:func:`flowride.runtime.nccl_tuning.estimates`, an estimate of NCCL's ``tuning.cc``);
- **flowride's pick**: the (algorithm, protocol) of least time in flowride's model of NCCL's
  algorithms (:func:`flowride.synth.nccl.model_nccl`: ring, PAT, NVLS as schedules replayed by
  the simulator; tree and NVLS-tree, which the epoch IR cannot express, by NCCL's estimate). The
  simulator moves data the way the Simple protocol does, with each hop's latency, and knows
  neither wire formats nor the kernel's launch and set-up. So a simulated algorithm's time under
  protocol p is NCCL's base latency for (algorithm, p) plus its simulated time scaled by NCCL's
  own ratio of the rest, ``(estimate(a, p) - base(a, p)) / (estimate(a, Simple) - base(a,
  Simple))``: the simulation stands for NCCL's Simple time less its base latency, the protocol's
  effect on latency and bandwidth is NCCL's. Ties go to NCCL's default. (A report's ``nccl``
  entry compares the raw simulated times, one protocol, no base latency: the side table shows
  which algorithm it names, ``report_best``.)

Neighbouring swept sizes with the same pair of choices merge into ranges that tile ``[0,
SIZE_MAX]`` (:func:`tile`): the first starts at 0, each next one at the first swept size whose
choice changed, and the last runs to ``2**64 - 1`` (strtoull's largest size_t, so messages above
4 GiB, which the plugin README's ``4294967295`` would leave out, are covered); a message between
two swept sizes gets the choice of the smaller one. A CSV row (:class:`TunerRow`) is written only
for a range where the two choices differ; the others are written as ``# nccl-default`` comment
lines, which the plugin skips and :func:`check_tuner_csv` reads to prove the tiling. Channels
follow the model: a ring's channel count (one ring per channel, as flowride builds it); for an
algorithm whose channels flowride does not model, the count NCCL's cost model assumes
(:func:`nccl_channels`), never ``-1``, which the example plugin turns into one channel. nNodes
and nRanks are the topology's hosts and GPUs, numPipeOps and regBuff ``-1`` (any).

The side table (:meth:`TunerPlan.markdown`) lists every range, both choices, the modelled times
of both in flowride's model and in NCCL's, and why the row was or was not written.

Only (algorithm, protocol) pairs NCCL's cost model offers are picked (:func:`choose`): the plugin
passes over a row whose pair NCCL ignores for the call. :func:`apply_tuner_csv` applies a CSV to
a plan's swept sizes the way the plugin does (:func:`~flowride.sweep.nccl_tuner_rules.match_row`)
and times what runs against NCCL's default in both models (benchmarks/nccl_tuner_check.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.files import check_output_file, write_text_atomic
from flowride.runtime.nccl_tuning import (
    BASE_LAT_US,
    NCCL_TUNING_SOURCE,
    PROTOS,
    assumed_channels,
    estimates,
)
from flowride.sweep.nccl_tuner_rules import (
    COLLECTIVES,
    COLUMNS,
    DEFAULT_TAG,
    PLUGIN_SOURCE,
    SIZE_MAX,
    Kept,
    TunerRow,
    check_tuner_csv,
    match_row,
    parse_tuner_csv,
    plugin_channels,
)
from flowride.synth.nccl import machine, model_nccl
from flowride.topology.model import Topology
from flowride.units import format_size

DEFAULT_COLLECTIVES = ("allgather", "reducescatter", "allreduce")
MODELLED = ("allgather", "reducescatter", "allreduce")  # the plugin's collectives flowride models
TIE = 1e-9  # relative: a pick this close to NCCL's default is no reason for a row


@dataclass(frozen=True)
class Choice:
    """An algorithm and protocol spelled as the plugin parses them, and a channel count (-1: none modelled)."""

    algorithm: str
    protocol: str
    channels: int = -1

    @property
    def label(self) -> str:
        return f"{self.algorithm}/{self.protocol}" + (f" x{self.channels}" if self.channels > 0 else "")


@dataclass
class SizeChoice:
    """One collective at one swept size: flowride's pick and NCCL's default, each timed both ways."""

    size: int
    ours: Choice
    ours_us: float  # flowride's model
    ours_how: str  # simulated | recurrence | tuning model
    nccl: Choice
    nccl_us: float | None  # NCCL's default in flowride's model
    nccl_est_us: float  # NCCL's default in NCCL's model
    ours_est_us: float | None  # flowride's pick in NCCL's model
    report_best: str = ""  # the algorithm a report's ``nccl`` entry names at this size (raw simulated times, no protocol)
    # every (algorithm, protocol) flowride's model times here, spelled as the plugin parses them:
    # (time in flowride's model, time in NCCL's model or None, channels)
    times: dict[tuple[str, str], tuple[float, float | None, int]] = field(default_factory=dict, repr=False)
    usable: frozenset[tuple[str, str]] = frozenset()  # the pairs NCCL's cost table offers (the rest it ignores)

    @property
    def differs(self) -> bool:
        return (self.ours.algorithm, self.ours.protocol) != (self.nccl.algorithm, self.nccl.protocol)

    @property
    def key(self) -> tuple:
        return self.ours, self.nccl

    @property
    def speedup(self) -> float | None:
        """NCCL's default over flowride's pick, both in flowride's model (> 1: the pick is faster)."""
        return self.nccl_us / self.ours_us if self.nccl_us and self.ours_us > 0 else None

    @property
    def nccl_says(self) -> float | None:
        """flowride's pick over NCCL's default, both in NCCL's model (> 1: NCCL thinks its own faster)."""
        return self.ours_est_us / self.nccl_est_us if self.ours_est_us and self.nccl_est_us > 0 else None


@dataclass
class TunerRange:
    collective: str
    min_bytes: int
    max_bytes: int  # inclusive
    sizes: list[SizeChoice]

    @property
    def ours(self) -> Choice:
        return self.sizes[0].ours

    @property
    def nccl(self) -> Choice:
        return self.sizes[0].nccl

    @property
    def differs(self) -> bool:
        return self.sizes[0].differs

    def why(self) -> str:
        s = self.sizes
        if not self.differs:
            return "same algorithm and protocol: NCCL's default kept (no row)"
        sp = [x.speedup for x in s if x.speedup]
        ns = [x.nccl_says for x in s if x.nccl_says]
        how = s[0].ours_how
        part = f"flowride's model ({how} {self.ours.algorithm}): {_span(sp)}x faster than NCCL's default" if sp else \
            "flowride's model has no time for NCCL's default"
        return part + (f"; NCCL's model: its default {_span(ns)}x faster" if ns else "")


def _span(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}"


def tile(sizes: Sequence[int], keys: Sequence, top: int = SIZE_MAX) -> list[tuple[int, int, int, int]]:
    """Ascending distinct ``sizes`` with a choice key each, merged where neighbours share a key:
    ``(min_bytes, max_bytes, first, last)`` per range (``first``/``last`` indices into sizes),
    tiling ``[0, top]`` with no gap or overlap: the first range starts at 0, each other at its
    first size, and each ends one byte before the next (the last at ``top``)."""
    if len(sizes) != len(keys) or not sizes:
        raise InputError("sizes", f"{len(sizes)} sizes for {len(keys)} choices", "give one choice per size, at least one")
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)) or sizes[0] < 0 or sizes[-1] > top:
        raise InputError("sizes", "are not ascending, distinct and within 0..max", "sort them and drop repeats")
    starts = [i for i in range(len(sizes)) if i == 0 or keys[i] != keys[i - 1]]
    out = []
    for g, i in enumerate(starts):
        last = starts[g + 1] - 1 if g + 1 < len(starts) else len(sizes) - 1
        lo = 0 if g == 0 else sizes[i]
        hi = sizes[starts[g + 1]] - 1 if g + 1 < len(starts) else top
        out.append((lo, hi, i, last))
    return out


def size_choice(topo: Topology, collective: Collective | str, size: int) -> SizeChoice:
    """flowride's pick and NCCL's default for ``collective`` of ``size`` bytes (NCCL's nBytes: the
    output for AllGather, the input for ReduceScatter, the buffer for AllReduce) on ``topo``."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    model = model_nccl(topo, coll, size)
    m = machine(topo)
    est = {(e.algorithm, e.protocol): e.time_us for e in estimates(coll, m, size)}
    other_ch = nccl_channels(m.nodes, m.nics)
    ours: dict[tuple[str, str], tuple[float, str, int]] = {}  # (algorithm, protocol) -> flowride time, how, channels
    for name, md in model.algorithms.items():
        mine = {k: t for k, t in est.items() if k[0] == name}
        if md.how == "tuning model":
            ours.update({k: (t, md.how, other_ch) for k, t in mine.items()})
            continue
        ch = md.channels if name == "ring" and md.channels > 0 else other_ch
        if (name, "Simple") not in mine:
            ours[(name, "Simple")] = (md.time_us, md.how, ch)
            continue
        simple = mine[(name, "Simple")] - _base(name, "Simple")
        for (a, p), t in mine.items():  # the simulated movement stands for NCCL's Simple time less its base latency
            factor = (t - _base(a, p)) / simple if simple > 0 else 1.0
            ours[(a, p)] = (_base(a, p) + md.time_us * factor, md.how, ch)
    if not est or not {k for k in ours if k[0] != "p2p"}:
        raise InputError("topology", f"{topo.name!r} gives NCCL's cost model no bandwidth to work with (no scale-up or NIC "
                         "links from a GPU)", "give a topology whose GPUs have links, e.g. -t dgx1")
    return choose(size, ours, est, model.best.name)


def choose(size: int, ours: dict[tuple[str, str], tuple[float, str, int]], est: dict[tuple[str, str], float],
           report_best: str = "") -> SizeChoice:
    """Both choices at one size from the two models' times: ``ours`` (algorithm, protocol as
    NCCL spells it) -> (time in flowride's model, how, channels), ``est`` the same -> time in
    NCCL's model. NCCL's default: the least of ``est``. flowride's pick: the least of ``ours``
    among the pairs NCCL can run (those in ``est``: the plugin passes over a row NCCL's cost table
    ignores), NCCL's default on a tie (within :data:`TIE`)."""
    known = {k: v for k, v in ours.items() if k in est}
    default = min(est, key=lambda k: est[k])
    if not known:
        raise InputError("topology", "flowride's model times none of the algorithms NCCL's cost model offers here",
                         "give a topology whose GPUs have links, e.g. -t dgx1")
    best = min(known, key=lambda k: known[k][0])
    if default in known and known[default][0] <= known[best][0] * (1 + TIE):
        best = default
    t, how, ch = known[best]
    times = {(a, p.lower()): (v[0], est.get((a, p)), v[2]) for (a, p), v in ours.items()}
    return SizeChoice(size, Choice(best[0], best[1].lower(), ch), t, how, Choice(default[0], default[1].lower()),
                      known[default][0] if default in known else None, est[default], est.get(best), report_best, times,
                      frozenset((a, p.lower()) for a, p in est))


def nccl_channels(nodes: int, nics: int) -> int:
    """The channel count NCCL's cost model assumes (:func:`flowride.runtime.nccl_tuning.estimates`:
    one per NIC across nodes, 12 within one), written for algorithms whose channels flowride does
    not model. Not -1: the example plugin starts every call at 1 channel and keeps that for a row
    of -1 (see :mod:`.nccl_tuner_rules`)."""
    return assumed_channels(nodes, nics)


def _base(algorithm: str, protocol: str) -> float:
    """NCCL's base latency of an algorithm and protocol (us): the launch and set-up the simulator leaves out."""
    return BASE_LAT_US.get(algorithm, (0.0, 0.0, 0.0))[PROTOS.index(protocol)]


@dataclass
class TunerPlan:
    topology: str
    gpus: int
    nodes: int
    collectives: list[str]
    sizes: list[int]
    ranges: list[TunerRange] = field(default_factory=list)
    # a row for every range, NCCL's default pair written out where the two agree (with the channels
    # flowride's model gives it): the example plugin runs a call that no row matches on one channel
    every_range: bool = False
    default_channels: int = 1  # NCCL's assumed channels (:func:`nccl_channels`), for a default pair flowride does not time

    def add(self, collective: str, picks: Sequence[SizeChoice]) -> None:
        """One collective's choices, one per swept size in ascending order, merged into ranges (:func:`tile`)."""
        for lo, hi, a, b in tile([p.size for p in picks], [p.key for p in picks]):
            self.ranges.append(TunerRange(collective, lo, hi, list(picks[a:b + 1])))

    def _row(self, r: TunerRange) -> TunerRow:
        if r.differs:
            return TunerRow(r.collective, r.min_bytes, r.max_bytes, r.ours.algorithm, r.ours.protocol, r.ours.channels,
                            self.nodes, self.gpus)
        got = r.sizes[0].times.get((r.nccl.algorithm, r.nccl.protocol))
        ch = got[2] if got is not None and got[2] > 0 else self.default_channels
        return TunerRow(r.collective, r.min_bytes, r.max_bytes, r.nccl.algorithm, r.nccl.protocol, ch, self.nodes, self.gpus)

    @property
    def rows(self) -> list[TunerRow]:
        return [self._row(r) for r in self.ranges if r.differs or self.every_range]

    def disagreements(self, collective: str) -> int:
        """Swept sizes of ``collective`` where the two choices differ."""
        return sum(s.differs for r in self.ranges if r.collective == collective for s in r.sizes)

    def csv(self, side_table: str = "") -> str:
        """The file for ``NCCL_TUNER_CONFIG_FILE``: comments, then per collective its rows and its
        ``# nccl-default`` lines in size order."""
        lines = [f"# flowride export --nccl-tuner: {self.topology}, {self.gpus} ranks on {self.nodes} node(s)",
                 "# for NCCL's example tuner plugin (NCCL_TUNER_PLUGIN, NCCL_TUNER_CONFIG_FILE); docs/nccl_tuner.md",
                 "# " + ",".join(COLUMNS),
                 "# a row: where flowride's model of NCCL's algorithms picks otherwise than NCCL's own cost model",
                 f"# ranges left to NCCL's default: the '{DEFAULT_TAG.strip()}...' comments (the plugin skips them)"]
        if side_table:
            lines.append(f"# why each range: {side_table}"[:200])
        if self.every_range:
            lines.append("# --every-range: NCCL's default written out too, so no call falls to the plugin's one-channel default")
        for r in self.ranges:
            if r.differs or self.every_range:
                lines.append(self._row(r).line())
            else:
                lines.append(Kept(r.collective, r.min_bytes, r.max_bytes, self.nodes, self.gpus, r.nccl.algorithm,
                                  r.nccl.protocol).line())
        return "\n".join(lines) + "\n"

    COLUMNS = ("collective", "bytes (min..max)", "swept sizes", "flowride's pick", "NCCL's default", "pick (us)", "default (us)",
               "row", "why")

    def table_rows(self) -> list[tuple[str, ...]]:
        """One row of :attr:`COLUMNS` per range: what the side table and the CLI both show. Times
        are flowride's model at the range's first and last swept size."""
        out = []
        for r in self.ranges:
            a, b = r.sizes[0], r.sizes[-1]
            hi = "max" if r.max_bytes == SIZE_MAX else f"{r.max_bytes:,}"
            pick = _us(a.ours_us) if a is b else f"{_us(a.ours_us)}..{_us(b.ours_us)}"
            dflt = _us(a.nccl_us) if a is b else f"{_us(a.nccl_us)}..{_us(b.nccl_us)}"
            out.append((r.collective, f"{r.min_bytes:,}..{hi}", _sizes(r), r.ours.label, r.nccl.label, pick, dflt,
                        "yes" if r.differs else "no", r.why()))
        return out

    def markdown(self, csv_name: str = "") -> str:
        lines = [f"# NCCL tuner overrides for {self.topology} ({self.gpus} ranks, {self.nodes} node(s))", "",
                 f"CSV: `{csv_name or 'the file'}`, read by NCCL's example tuner plugin ({PLUGIN_SOURCE}). One row per range "
                 "where flowride's pick differs from NCCL's default; `max` is 18446744073709551615.", "",
                 "| " + " | ".join(self.COLUMNS) + " |", "|" + "---|" * len(self.COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in self.table_rows()]
        lines += ["", "## Per swept size", "",
                  "| collective | size | flowride's pick | how | pick (us) | NCCL's default | default (us) | speedup | "
                  "NCCL's model: pick (us) | NCCL's model: default (us) | report's nccl |", "|" + "---|" * 11]
        for r in self.ranges:
            for s in r.sizes:
                lines.append(f"| {r.collective} | {s.size:,} | {s.ours.label} | {s.ours_how} | {s.ours_us:.2f} | {s.nccl.label} | "
                             f"{_us(s.nccl_us)} | {_us(s.speedup)} | {_us(s.ours_est_us)} | {s.nccl_est_us:.2f} | {s.report_best} |")
        lines += ["", "NCCL's default: the least time in NCCL's own cost model as flowride reads it off the topology "
                      f"({NCCL_TUNING_SOURCE}). flowride's pick: the least time in flowride's model of NCCL's algorithms "
                      "(ring, PAT, NVLS simulated as schedules; tree and NVLS-tree by NCCL's estimate). A simulated algorithm's "
                      "time under a protocol: NCCL's base latency for it plus the simulated time scaled by NCCL's own ratio of "
                      "that protocol's time to Simple's (base latencies left out of both). Speedup: NCCL's default over "
                      "the pick, both in flowride's model. report's nccl: the algorithm a synth report's nccl entry names (raw "
                      "simulated times). A size between two swept sizes gets the choice of the smaller. Channels: a ring's "
                      "count in flowride's model; other algorithms the count NCCL's cost model assumes (never -1: the example "
                      "plugin makes that one channel).", ""]
        return "\n".join(lines)


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _sizes(r: TunerRange) -> str:
    s = r.sizes
    return format_size(s[0].size) if len(s) == 1 else f"{format_size(s[0].size)}..{format_size(s[-1].size)} ({len(s)})"


def tuner_collectives(collectives: Sequence[str] | str | None) -> list[str]:
    """The collectives to export, each one the plugin parses and flowride models."""
    if collectives is None:
        return list(DEFAULT_COLLECTIVES)
    items = collectives.split(",") if isinstance(collectives, str) else list(collectives)
    out = []
    for text in items:
        name = str(text).strip().lower().replace("_", "").replace("-", "")
        if not name:
            continue
        if name == "alltoall":
            raise InputError("collective", "alltoall has no row in NCCL's example tuner (NCCL runs it as grouped sends, "
                             "no algorithm to pick)", f"choose from {', '.join(MODELLED)}")
        if name not in MODELLED:
            extra = " (the plugin parses it, flowride does not model it)" if name in COLLECTIVES else ""
            raise InputError("collective", f"unknown collective {text!r}{extra}", f"choose from {', '.join(MODELLED)}")
        if name not in out:
            out.append(name)
    if not out:
        raise InputError("collective", "names no collective", f"give one or more of {', '.join(MODELLED)}, comma-separated")
    return out


def plan_tuner(topo: Topology, collectives: Sequence[str] | str | None, sizes: Sequence[int],
               progress: Callable[[dict], None] | None = None, every_range: bool = False) -> TunerPlan:
    """Both choices at every size of every collective, merged into ranges (:func:`tile`);
    ``every_range``: a row for the ranges where they agree too (:attr:`TunerPlan.every_range`)."""
    colls = tuner_collectives(collectives)
    ss = sorted(set(int(s) for s in sizes))
    if not ss or ss[0] < 1:
        raise InputError("sizes", "none given, or one below 1 byte", "give e.g. 1KB:1GB:x2")
    m = machine(topo)
    plan = TunerPlan(topo.name, m.ranks, m.nodes, colls, ss, every_range=every_range,
                     default_channels=nccl_channels(m.nodes, m.nics))
    for ci, coll in enumerate(colls):
        picks = []
        for i, s in enumerate(ss):
            if progress:
                progress({"stage": "size", "i": i + 1, "of": len(ss), "size": s, "candidate": coll, "candidate_i": ci + 1,
                          "candidates": len(colls)})
            picks.append(size_choice(topo, coll, s))
        plan.add(coll, picks)
    return plan


def side_table_path(path: str | Path) -> Path:
    """Where the side table of ``path`` goes: beside it, ``.md`` added (``tuner.csv`` -> ``tuner.csv.md``)."""
    p = Path(path)
    return p.with_name(p.name + ".md")


def write_tuner(plan: TunerPlan, path: str | Path) -> tuple[Path, Path]:
    """The CSV at ``path`` and the side table beside it (:func:`side_table_path`), both atomic;
    the CSV is checked by the plugin's rules (:func:`check_tuner_csv`, tiling required) first."""
    md = side_table_path(path)
    text = plan.csv(md.name)
    bad = check_tuner_csv(text, tiled=True)
    if bad:  # built by the same rules; this guards the writer
        raise AssertionError("the tuner CSV breaks the plugin's rules: " + "; ".join(map(str, bad[:5])))
    write_text_atomic(path, text)
    write_text_atomic(md, plan.markdown(Path(path).name))
    return Path(path), md


def export_nccl_tuner(topo: Topology, collectives: Sequence[str] | str | None, sizes: Sequence[int], path: str | Path,
                      progress: Callable[[dict], None] | None = None, every_range: bool = False) -> TunerPlan:
    """The one call behind ``flowride export --nccl-tuner FILE``: the collectives and both output
    paths checked before any modelling, then :func:`plan_tuner` and :func:`write_tuner`."""
    tuner_collectives(collectives)
    check_output_file(path, "nccl_tuner")
    check_output_file(side_table_path(path), "nccl_tuner")
    plan = plan_tuner(topo, collectives, sizes, progress, every_range)
    write_tuner(plan, path)
    return plan


@dataclass(frozen=True)
class Applied:
    """One collective at one swept size with a tuner CSV applied the way the example plugin applies
    it (:func:`flowride.sweep.nccl_tuner_rules.match_row`): the row that matched (None: NCCL's
    default stands), the choice that runs, and both times of it and of NCCL's default in both
    models. ``us`` is None where flowride's model has no time for the choice as the row gives it
    (an algorithm it does not time, or another channel count than the one it timed)."""

    collective: str
    size: int
    row: TunerRow | None
    choice: Choice
    us: float | None  # the applied choice, flowride's model
    default_us: float | None  # NCCL's default, flowride's model
    est_us: float | None  # the applied choice, NCCL's model
    default_est_us: float  # NCCL's default, NCCL's model

    @property
    def ratio(self) -> float | None:
        """Applied over default in flowride's model (<= 1: the CSV costs nothing here)."""
        return self.us / self.default_us if self.us is not None and self.default_us else None

    @property
    def est_ratio(self) -> float | None:
        """Applied over default in NCCL's model (>= 1 by definition: the default is its least)."""
        return self.est_us / self.default_est_us if self.est_us is not None and self.default_est_us > 0 else None


def apply_tuner_csv(plan: TunerPlan, text: str) -> list[Applied]:
    """The CSV ``text`` applied to every swept size and collective of ``plan`` as the example plugin
    applies it (:func:`applied_at`): what a modelled NCCL run with the file would do."""
    rows = [r for _, r in parse_tuner_csv(text)[0]]
    return [applied_at(rows, rg.collective, s, plan.nodes, plan.gpus) for rg in plan.ranges for s in rg.sizes]


def applied_at(rows: Sequence[TunerRow], collective: str, s: SizeChoice, nnodes: int, nranks: int) -> Applied:
    """The row the plugin applies to ``collective`` of ``s.size`` bytes (first usable match;
    numPipeOps 1, regBuff 0), timed from ``s``'s tables; ``s`` may be any size, swept or not."""
    row = match_row(rows, collective, s.size, nnodes, nranks, usable=s.usable or None)
    if row is None:
        return Applied(collective, s.size, None, s.nccl, s.nccl_us, s.nccl_us, s.nccl_est_us, s.nccl_est_us)
    got = s.times.get((row.algorithm, row.protocol))
    us = got[0] if got is not None and got[2] == plugin_channels(row) else None
    return Applied(collective, s.size, row, Choice(row.algorithm, row.protocol, plugin_channels(row)), us, s.nccl_us,
                   got[1] if got else None, s.nccl_est_us)
