"""A CSV for NCCL's example tuner plugin: where flowride's calibrated model of NCCL picks an
algorithm and protocol other than NCCL's own cost model, by more than the model's error, per
collective and size range.

At each swept size, on one topology and with one calibration (:class:`~flowride.runtime.defaults.Chosen`,
``--calibration``: by default the one fitted to published nccl-tests curves for the fabric's node
type, :func:`flowride.runtime.defaults.for_topology`), two choices are made:

- **NCCL's default**: the (algorithm, protocol) of least time in NCCL's own cost model
  (:func:`flowride.runtime.nccl_tuning.estimates` with :data:`~flowride.runtime.nccl_tuning.IDENTITY`,
  an estimate of NCCL's ``tuning.cc``): NCCL's own decision rule;
- **flowride's pick**: the (algorithm, protocol) of least time in the same model corrected by the
  calibration (``estimates(..., chosen.calibration)``), among the pairs NCCL's cost model offers
  (:func:`choose`: the plugin passes over a row whose pair NCCL ignores for the call). Ties go to
  NCCL's default.

Both are timed in the calibrated model. The **gain** is ``t(default) / t(pick) - 1``; the
**model error** at a size is the median ``|predicted/measured - 1|`` of the calibration's fit on
the curves behind it near that size (:meth:`~flowride.runtime.defaults.Chosen.error_at`). A size
is **written** only where the gain exceeds that error; where the error is unknown (no measured
curve behind the calibration: a topology with no node type, ``--calibration nccl``) nothing is
written: the calibrated times are NCCL's own there, or there is no basis. (Before, the pick came
from the epoch simulator's model of NCCL's algorithms, :func:`flowride.synth.nccl.model_nccl`,
which measured curves showed up to 2.7x off.)

Neighbouring swept sizes with the same final decision (a row with this pick, or NCCL's default
with this pair) merge into ranges that tile ``[0, SIZE_MAX]`` (:func:`tile`): the first starts at
0, each next one at the first swept size whose decision changed, and the last runs to ``2**64 - 1``
(strtoull's largest size_t, so messages above 4 GiB, which the plugin README's ``4294967295``
would leave out, are covered); a message between two swept sizes gets the decision of the smaller
one. A CSV row (:class:`TunerRow`) is written for a range of written sizes; the others are
``# nccl-default`` comment lines, which the plugin skips and :func:`check_tuner_csv` reads to
prove the tiling. Channels: the count NCCL's cost model assumes (:func:`nccl_channels`), never
``-1``, which the example plugin turns into one channel. nNodes and nRanks are the topology's
hosts and GPUs, numPipeOps and regBuff ``-1`` (any).

The side table (:meth:`TunerPlan.markdown`) names the calibration and the rule and lists every
range and every swept size: both choices, their calibrated times, the gain, the model error,
whether a row was written and why, and both choices' times in NCCL's own model.
:func:`apply_tuner_csv` applies a CSV to a plan's swept sizes the way the plugin does
(:func:`~flowride.sweep.nccl_tuner_rules.match_row`) and times what runs against NCCL's default
in both models (benchmarks/nccl_tuner_check.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.files import check_output_file, write_text_atomic
from flowride.runtime.defaults import Chosen, for_topology
from flowride.runtime.nccl_tuning import (
    IDENTITY,
    NCCL_TUNING_SOURCE,
    Machine,
    assumed_channels,
    estimates,
)
from flowride.sweep.nccl_tuner_edges import follow_nccl, nccl_pick
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
from flowride.synth.nccl import machine
from flowride.topology.model import Topology
from flowride.units import format_size

DEFAULT_COLLECTIVES = ("allgather", "reducescatter", "allreduce")
MODELLED = ("allgather", "reducescatter", "allreduce")  # the plugin's collectives flowride models
TIE = 1e-9  # relative: a pick this close to NCCL's default is no reason for a row
GAPS_WARNING = ("# --gaps: ranges left to NCCL's default have no row, and the stock example plugin runs every call no row "
                "matches on ONE channel (pluginGetCollInfo sets *nChannels = 1): patch it to 0 before building, or export "
                "without --gaps")
HOW = "calibrated model"
RULE = ("a row only where the gain (NCCL's default over flowride's pick, both in the calibrated model, minus 1) exceeds the "
        "model's error at that size: the median |predicted/measured - 1| of the calibration's fit near that size (within 4x) on "
        "the measured curves behind it (the published ones, or yours for a profile); where that error is unknown, no row")


@dataclass(frozen=True)
class Choice:
    """An algorithm and protocol spelled as the plugin parses them, and a channel count (-1: none given)."""

    algorithm: str
    protocol: str
    channels: int = -1

    @property
    def label(self) -> str:
        return f"{self.algorithm}/{self.protocol}" + (f" x{self.channels}" if self.channels > 0 else "")

    @property
    def pair(self) -> tuple[str, str]:
        return self.algorithm, self.protocol


@dataclass
class SizeChoice:
    """One collective at one swept size: flowride's pick and NCCL's default, each timed in the
    calibrated model and in NCCL's own, and the model's error there."""

    size: int
    ours: Choice  # flowride's pick: least calibrated time
    ours_us: float  # calibrated
    nccl: Choice  # NCCL's default: least time in NCCL's own model
    nccl_us: float | None  # calibrated
    nccl_est_us: float  # NCCL's default in NCCL's own model
    ours_est_us: float | None  # flowride's pick in NCCL's own model
    error: float | None = None  # the model's error at this size (None: unknown)
    # every (algorithm, protocol) timed here, spelled as the plugin parses them:
    # (calibrated time, time in NCCL's own model or None, channels)
    times: dict[tuple[str, str], tuple[float, float | None, int]] = field(default_factory=dict, repr=False)
    usable: frozenset[tuple[str, str]] = frozenset()  # the pairs NCCL's cost table offers (the rest it ignores)
    how: str = HOW

    @property
    def differs(self) -> bool:
        return self.ours.pair != self.nccl.pair

    @property
    def speedup(self) -> float | None:
        """NCCL's default over flowride's pick, both calibrated (> 1: the pick is faster)."""
        return self.nccl_us / self.ours_us if self.nccl_us and self.ours_us > 0 else None

    @property
    def gain(self) -> float | None:
        return None if self.speedup is None else self.speedup - 1

    @property
    def written(self) -> bool:
        """A row here: the choices differ and the gain exceeds the model's error at this size."""
        return self.differs and self.error is not None and self.gain is not None and self.gain > self.error

    @property
    def key(self) -> tuple:
        """The final decision: a row with the pick, or NCCL's default with its pair."""
        return ("row", self.ours) if self.written else ("default", self.nccl.pair)

    @property
    def nccl_says(self) -> float | None:
        """flowride's pick over NCCL's default, both in NCCL's own model (> 1: NCCL thinks its own faster)."""
        return self.ours_est_us / self.nccl_est_us if self.ours_est_us and self.nccl_est_us > 0 else None

    def reason(self) -> str:
        if not self.differs:
            return "same algorithm and protocol"
        g = _pct(self.gain)
        if self.written:
            return f"gain {g} > the model's error {_pct(self.error)} at this size: row"
        if self.error is None:
            return f"gain {g}, but the model's error at this size is unknown (no measured curve behind the calibration): no row"
        return f"gain {g} within the model's error {_pct(self.error)} at this size: NCCL's default kept"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


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
    def written(self) -> bool:
        return self.sizes[0].written

    @property
    def differs(self) -> bool:
        """The choices differ at some swept size of the range (written or not)."""
        return any(s.differs for s in self.sizes)

    def labels(self, which: str) -> str:
        """The distinct picks (``ours``) or defaults (``nccl``) of the range's sizes."""
        out: list[str] = []
        for s in self.sizes:
            lab = getattr(s, which).label
            if lab not in out:
                out.append(lab)
        return ", ".join(out)

    def why(self) -> str:
        s = self.sizes
        if self.written:
            return (f"row: gain {_span([x.gain for x in s])} > the model's error {_span([x.error for x in s])} here"
                    + _nccl_note(s))
        if not self.differs:
            return "same algorithm and protocol: NCCL's default kept (no row)"
        diff = [x for x in s if x.differs]
        if all(x.error is None for x in diff):
            return (f"NCCL's default kept: flowride's pick gains {_span([x.gain for x in diff])} where it differs, but the model's "
                    "error is unknown here (no measured curve behind the calibration)")
        return (f"NCCL's default kept: gain {_span([x.gain for x in diff])} within the model's error "
                f"{_span([x.error for x in diff])} at {'this size' if len(diff) == 1 else 'these sizes'}")


def _nccl_note(s: list[SizeChoice]) -> str:
    ns = [x.nccl_says for x in s if x.nccl_says]
    return f"; NCCL's own model: its default {_span(ns, pct=False)}x faster" if ns else ""


def _span(xs: list[float | None], pct: bool = True) -> str:
    vals = [x for x in xs if x is not None]
    if not vals:
        return "unknown"
    lo, hi = min(vals), max(vals)
    f = _pct if pct else (lambda v: f"{v:.2f}")
    return f(lo) if f(lo) == f(hi) else f"{f(lo)}-{f(hi)}"


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


def size_choice(topo: Topology, collective: Collective | str, size: int, calibration: Chosen | str | None = None,
                network: str = "ib", m: Machine | None = None) -> SizeChoice:
    """flowride's pick and NCCL's default for ``collective`` of ``size`` bytes (NCCL's nBytes: the
    output for AllGather, the input for ReduceScatter, the buffer for AllReduce) on ``topo``, by
    ``calibration`` (:func:`flowride.runtime.defaults.for_topology`); ``m``: the topology's machine, if already read."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    chosen = for_topology(topo, calibration, network)
    m = m or machine(topo)
    est = {(e.algorithm, e.protocol): e.time_us for e in estimates(coll, m, size, IDENTITY)}
    if not {k for k in est if k[0] != "p2p"}:
        raise InputError("topology", f"{topo.name!r} gives NCCL's cost model no bandwidth to work with (no scale-up or NIC "
                         "links from a GPU)", "give a topology whose GPUs have links, e.g. -t dgx1")
    cal = {(e.algorithm, e.protocol): e.time_us for e in estimates(coll, m, size, chosen.calibration)}
    return choose(size, cal, est, nccl_channels(m.nodes, m.nics), chosen.error_at(size))


def choose(size: int, cal: dict[tuple[str, str], float], est: dict[tuple[str, str], float], channels: int,
           error: float | None = None) -> SizeChoice:
    """Both choices at one size from the two models' times, (algorithm, protocol as NCCL spells
    it) -> us: ``cal`` the calibrated model, ``est`` NCCL's own. NCCL's default: the least of
    ``est``. flowride's pick: the least of ``cal`` among the pairs NCCL can run (those in ``est``:
    the plugin passes over a row NCCL's cost table ignores), NCCL's default on a tie (within
    :data:`TIE`). ``channels``: what a row gives (:func:`nccl_channels`); ``error``: the model's
    error at ``size`` (the gate of :attr:`SizeChoice.written`)."""
    if not est:
        raise InputError("topology", "NCCL's cost model offers no algorithm here", "give a topology whose GPUs have links, e.g. -t dgx1")
    default = min(est, key=lambda k: est[k])
    known = {k: v for k, v in cal.items() if k in est}
    if not known:
        raise InputError("topology", "the calibrated model times none of the algorithms NCCL's cost model offers here",
                         "give a topology whose GPUs have links, e.g. -t dgx1")
    best = min(known, key=lambda k: known[k])
    if default in known and known[default] <= known[best] * (1 + TIE):
        best = default
    times = {(a, p.lower()): (t, est.get((a, p)), channels) for (a, p), t in cal.items()}
    return SizeChoice(size, Choice(best[0], best[1].lower(), channels), known[best], Choice(default[0], default[1].lower()),
                      known.get(default), est[default], est.get(best), error, times, frozenset((a, p.lower()) for a, p in est))


def nccl_channels(nodes: int, nics: int) -> int:
    """The channel count NCCL's cost model assumes (:func:`flowride.runtime.nccl_tuning.estimates`:
    one per NIC across nodes, 12 within one), the count every row gives. Not -1: the example
    plugin starts every call at 1 channel and keeps that for a row of -1 (see :mod:`.nccl_tuner_rules`)."""
    return assumed_channels(nodes, nics)


@dataclass
class TunerPlan:
    topology: str
    gpus: int
    nodes: int
    collectives: list[str]
    sizes: list[int]
    ranges: list[TunerRange] = field(default_factory=list)
    # a row for every range (the default), NCCL's default pair written out where no override is (at
    # NCCL's assumed channels): the stock example plugin runs a call that no row matches on one
    # channel; False (``--gaps``) leaves those ranges as comments
    every_range: bool = True
    default_channels: int = 1  # NCCL's assumed channels (:func:`nccl_channels`)
    calibration: str = "NCCL's own model"  # the calibration's name (:attr:`Chosen.name`)
    fitted_on: tuple[str, ...] = ()  # the curves behind it
    borrowed: str | None = None  # the node type whose figures stand in, when not the topology's

    def add(self, collective: str, picks: Sequence[SizeChoice]) -> None:
        """One collective's choices, one per swept size in ascending order, merged by the final
        decision into ranges (:func:`tile`)."""
        for lo, hi, a, b in tile([p.size for p in picks], [p.key for p in picks]):
            self.ranges.append(TunerRange(collective, lo, hi, list(picks[a:b + 1])))

    def _row(self, r: TunerRange) -> TunerRow:
        c = r.ours if r.written else Choice(r.nccl.algorithm, r.nccl.protocol, self.default_channels)
        return TunerRow(r.collective, r.min_bytes, r.max_bytes, c.algorithm, c.protocol, c.channels, self.nodes, self.gpus)

    @property
    def rows(self) -> list[TunerRow]:
        """Every row the file carries: the overrides, and (by default) NCCL's own pick elsewhere."""
        return [self._row(r) for r in self.ranges if r.written or self.every_range]

    @property
    def overrides(self) -> list[TunerRow]:
        """The rows where flowride's pick replaces NCCL's (the gain beats the model's error)."""
        return [self._row(r) for r in self.ranges if r.written]

    def disagreements(self, collective: str) -> int:
        """Swept sizes of ``collective`` where the two choices differ (written or not)."""
        return sum(s.differs for r in self.ranges if r.collective == collective for s in r.sizes)

    def written_sizes(self, collective: str) -> int:
        """Swept sizes of ``collective`` a row covers (the choices differ by more than the model's error)."""
        return sum(s.written for r in self.ranges if r.collective == collective for s in r.sizes)

    def csv(self, side_table: str = "") -> str:
        """The file for ``NCCL_TUNER_CONFIG_FILE``: comments, then per collective its rows and its
        ``# nccl-default`` lines in size order."""
        lines = [f"# flowride export --nccl-tuner: {self.topology}, {self.gpus} ranks on {self.nodes} node(s)",
                 "# for NCCL's example tuner plugin (NCCL_TUNER_PLUGIN, NCCL_TUNER_CONFIG_FILE); docs/nccl_tuner.md",
                 "# " + ",".join(COLUMNS),
                 "# an override: where the calibrated model of NCCL picks otherwise than NCCL's own cost model, by more "
                 "than the model's error at that size",
                 _one_line(f"# calibration: {self.calibration}")]
        if not self.every_range:
            lines.append(f"# ranges left to NCCL's default: the '{DEFAULT_TAG.strip()}...' comments (the plugin skips them)")
        if side_table:
            lines.append(_one_line(f"# why each range: {side_table}"))
        if self.every_range:
            lines.append("# every size range has a row (NCCL's own pick written out where flowride has no override), so no "
                         "call falls to the stock plugin's one-channel default")
        else:
            lines.append(GAPS_WARNING)
        for r in self.ranges:
            if r.written or self.every_range:
                lines.append(self._row(r).line())
            else:
                lines.append(Kept(r.collective, r.min_bytes, r.max_bytes, self.nodes, self.gpus, r.nccl.algorithm,
                                  r.nccl.protocol).line())
        return "\n".join(lines) + "\n"

    COLUMNS = ("collective", "bytes (min..max)", "swept sizes", "flowride's pick", "NCCL's default", "pick (us)", "default (us)",
               "gain", "model error", "row", "why")

    def table_rows(self) -> list[tuple[str, ...]]:
        """One row of :attr:`COLUMNS` per range: what the side table and the CLI both show. Times
        are the calibrated model's at the range's first and last swept size."""
        out = []
        for r in self.ranges:
            a, b = r.sizes[0], r.sizes[-1]
            hi = "max" if r.max_bytes == SIZE_MAX else f"{r.max_bytes:,}"
            pick = _us(a.ours_us) if a is b else f"{_us(a.ours_us)}..{_us(b.ours_us)}"
            dflt = _us(a.nccl_us) if a is b else f"{_us(a.nccl_us)}..{_us(b.nccl_us)}"
            out.append((r.collective, f"{r.min_bytes:,}..{hi}", _sizes(r), r.labels("ours"), r.labels("nccl"), pick, dflt,
                        _span([s.gain for s in r.sizes]), _span([s.error for s in r.sizes]), "yes" if r.written else "no",
                        r.why()))
        return out

    def markdown(self, csv_name: str = "") -> str:
        fitted = ", ".join(self.fitted_on) if self.fitted_on else "none (no measured curve: the model's error is unknown)"
        lines = [f"# NCCL tuner overrides for {self.topology} ({self.gpus} ranks, {self.nodes} node(s))", "",
                 f"CSV: `{csv_name or 'the file'}`, read by NCCL's example tuner plugin ({PLUGIN_SOURCE}); `max` is "
                 "18446744073709551615.", "",
                 f"Calibration: **{self.calibration}**; fitted on: {fitted}."
                 + (f" This node type has no measured curve: the figures of {self.borrowed} stand in." if self.borrowed else ""), "",
                 f"Rule: {RULE}. NCCL's default: the least time in NCCL's own cost model ({NCCL_TUNING_SOURCE}, as flowride "
                 "reads it off the topology), NCCL's own decision. flowride's pick: the least time in that model corrected by "
                 "the calibration, among the pairs NCCL offers for the call. Both timed in the calibrated model; gain: "
                 "t(default) / t(pick) - 1. Channels: the count NCCL's cost model assumes (never -1: the example plugin makes "
                 "that one channel). A size between two swept sizes gets the decision of the smaller.", "",
                 "| " + " | ".join(self.COLUMNS) + " |", "|" + "---|" * len(self.COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in self.table_rows()]
        lines += ["", "## Per swept size", "",
                  "| collective | size | flowride's pick | NCCL's default | pick (us) | default (us) | gain | model error | row | "
                  "why | NCCL's own model: pick (us) | NCCL's own model: default (us) |", "|" + "---|" * 12]
        for r in self.ranges:
            for s in r.sizes:
                lines.append(f"| {r.collective} | {s.size:,} | {s.ours.label} | {s.nccl.label} | {s.ours_us:.2f} | "
                             f"{_us(s.nccl_us)} | {_pct(s.gain)} | {_pct(s.error)} | {'yes' if s.written else 'no'} | "
                             f"{s.reason()} | {_us(s.ours_est_us)} | {s.nccl_est_us:.2f} |")
        return "\n".join(lines + [""])


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


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
               progress: Callable[[dict], None] | None = None, every_range: bool = True,
               calibration: Chosen | str | None = None, network: str = "ib") -> TunerPlan:
    """Both choices at every size of every collective by ``calibration`` (:func:`flowride.runtime.defaults.for_topology`),
    merged into ranges (:func:`tile`); ``every_range``: a row for the ranges left to NCCL's default
    too (:attr:`TunerPlan.every_range`)."""
    colls = tuner_collectives(collectives)
    ss = sorted(set(int(s) for s in sizes))
    if not ss or ss[0] < 1:
        raise InputError("sizes", "none given, or one below 1 byte", "give e.g. 1KB:1GB:x2")
    chosen = for_topology(topo, calibration, network)
    m = machine(topo)
    plan = TunerPlan(topo.name, m.ranks, m.nodes, colls, ss, every_range=every_range,
                     default_channels=nccl_channels(m.nodes, m.nics), calibration=chosen.name, fitted_on=tuple(chosen.fitted_on),
                     borrowed=chosen.borrowed)
    for ci, coll in enumerate(colls):
        picks = []
        for i, s in enumerate(ss):
            if progress:
                progress({"stage": "size", "i": i + 1, "of": len(ss), "size": s, "candidate": coll, "candidate_i": ci + 1,
                          "candidates": len(colls)})
            picks.append(size_choice(topo, coll, s, chosen, m=m))
        plan.add(coll, picks)
        follow_nccl([r for r in plan.ranges if r.collective == coll], lambda size, c=coll: nccl_pick(c, m, size))
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
                      progress: Callable[[dict], None] | None = None, every_range: bool = True,
                      calibration: Chosen | str | None = None, network: str = "ib") -> TunerPlan:
    """The one call behind ``flowride export --nccl-tuner FILE``: the collectives, the calibration
    and both output paths checked before any modelling, then :func:`plan_tuner` and :func:`write_tuner`."""
    tuner_collectives(collectives)
    chosen = for_topology(topo, calibration, network)
    check_output_file(path, "nccl_tuner")
    check_output_file(side_table_path(path), "nccl_tuner")
    plan = plan_tuner(topo, collectives, sizes, progress, every_range, chosen)
    write_tuner(plan, path)
    return plan


@dataclass(frozen=True)
class Applied:
    """One collective at one swept size with a tuner CSV applied the way the example plugin applies
    it (:func:`flowride.sweep.nccl_tuner_rules.match_row`): the row that matched (None: NCCL's
    default stands), the choice that runs, and both times of it and of NCCL's default in both
    models (the calibrated one and NCCL's own). ``us`` is None where the plan has no time for the
    choice as the row gives it (an algorithm NCCL does not offer there, or another channel count
    than the one timed)."""

    collective: str
    size: int
    row: TunerRow | None
    choice: Choice
    us: float | None  # the applied choice, calibrated
    default_us: float | None  # NCCL's default, calibrated
    est_us: float | None  # the applied choice, NCCL's own model
    default_est_us: float  # NCCL's default, NCCL's own model

    @property
    def ratio(self) -> float | None:
        """Applied over default in the calibrated model (<= 1: the CSV costs nothing here)."""
        return self.us / self.default_us if self.us is not None and self.default_us else None

    @property
    def est_ratio(self) -> float | None:
        """Applied over default in NCCL's own model (>= 1 by definition: the default is its least)."""
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
