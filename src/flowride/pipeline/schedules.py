"""Pipeline-parallel schedules as plain instruction lists, a cost replay, and bubble typing.

FreeRide harvests the idle time ("bubbles") of pipeline-parallel training for side tasks. To do
that without hard-coding hook positions for one (stages, micro-batches) pair, we need:

- the per-rank instruction order of the common schedules (:func:`build_schedule`): GPipe,
  1F1B (PipeDream-flush, Megatron's non-interleaved schedule), Megatron's interleaved 1F1B and
  Zero Bubble ZB-H1;
- a checker that the order is complete, ordered and cannot deadlock (:func:`check_schedule`);
- a discrete-event replay with per-pass costs that says where and how long each rank idles
  (:func:`replay`), and the textbook bubble fractions it must reproduce
  (:func:`theoretical_bubble_fraction`);
- a typing of every gap in a rank's list as A/B/S/D/C (:func:`gap_types`), derived from the order
  of instructions alone, so the bubble a side task is offered is known before it starts;
- a text grid for humans (:func:`render_grid`).

Conventions. The model is cut into ``p * v`` consecutive pieces ("chunks", virtual stages);
chunk ``j`` runs on rank ``j % p``, so rank ``r`` holds chunks ``r, r + p, r + 2p, ...`` as in
Megatron interleaving (``v == 1`` is the ordinary one-piece-per-rank pipeline). Everything here is
pure Python: no torch, no I/O, nothing printed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from flowride.errors import InputError
from flowride.sizes import MAX_GRID_CELLS

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zbh1")
"""Schedule names :func:`build_schedule` accepts."""

# Schedules whose warm-up/steady/cool-down structure assumes at least p micro-batches in flight.
_NEED_M_GE_P = frozenset({"1f1b", "interleaved", "zbh1"})
# Relative tolerance for "is this gap empty": replayed times are sums of float costs.
_EPS = 1e-9

A = TypeVar("A", bound=Hashable)


@dataclass(frozen=True)
class Instr:
    """One pass of one micro-batch through one chunk on the rank that holds the chunk.

    ``kind`` is ``"F"`` (forward), ``"B"`` (backward) or ``"W"`` (weight gradient). In a schedule
    without W passes a B is the full backward (input and weight gradients); in one with W passes
    (ZB-H1) a B is the input-gradient half only, which is what the previous stage waits for, and
    W is the weight-gradient half, which nobody waits for and so can be moved into bubbles.
    ``mb`` is the micro-batch (``0..m-1``), ``chunk`` the virtual stage (``0..p*v-1``).
    """

    kind: str
    mb: int
    chunk: int

    @property
    def label(self) -> str:
        """Short name like ``F3`` (kind and micro-batch), as drawn in pipeline diagrams."""
        return f"{self.kind}{self.mb}"


@dataclass(frozen=True)
class Replay:
    """Timed execution of a schedule.

    ``timeline[r]`` lists ``(start, end, instr)`` for rank ``r`` in execution order;
    ``idle_fraction[r]`` is the share of ``[0, makespan]`` rank ``r`` spends idle, and
    ``bubble_fraction`` their mean: the part of an iteration the pipeline wastes, which is what
    FreeRide can hand to side tasks.
    """

    timeline: list[list[tuple[float, float, Instr]]]
    makespan: float
    idle_fraction: list[float]
    bubble_fraction: float

    def busy(self, rank: int) -> float:
        """Seconds (cost units) rank ``rank`` spends computing."""
        return sum(end - start for start, end, _ in self.timeline[rank])


@dataclass(frozen=True)
class Bubble:
    """An idle interval of one rank in a replay, with its position type (see :func:`gap_types`).

    ``index`` is the gap index: the bubble lies just before instruction ``index`` of the rank's
    list (``index == len(list)`` for the one after the last instruction).
    """

    rank: int
    index: int
    kind: str
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


# ----------------------------------------------------------------------------------------------
# Building schedules


def _check_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(field, f"{value!r} is not a whole number", "give an integer")
    return value


def validate(name: str, p: int, m: int, v: int = 1) -> None:
    """Raise :class:`InputError` unless ``name`` can be built for ``p`` stages, ``m`` micro-batches
    and ``v`` chunks per stage.

    1F1B, interleaved and ZB-H1 need ``m >= p``: their warm-up fills the pipeline with ``p``
    micro-batches before the steady one-forward-one-backward phase, and with fewer the steady
    phase does not exist (Megatron refuses the same). Megatron's interleaved schedule also walks
    micro-batches in groups of ``p``, hence ``m % p == 0``.
    """
    if name not in SCHEDULES:
        raise InputError(
            "schedule", f"unknown schedule {name!r}", f"use one of {', '.join(SCHEDULES)}"
        )
    p = _check_int("stages", p)
    m = _check_int("microbatches", m)
    v = _check_int("chunks", v)
    if p < 1:
        raise InputError("stages", f"{p} pipeline stages", "use at least 1 stage")
    if m < 1:
        raise InputError("microbatches", f"{m} micro-batches", "use at least 1 micro-batch")
    if name == "interleaved":
        if v < 2:
            raise InputError(
                "chunks",
                f"interleaved needs at least 2 chunks per stage, got {v}",
                "pass v >= 2, or use 1f1b for one chunk per stage",
            )
    elif v != 1:
        raise InputError(
            "chunks",
            f"{name} runs one chunk per stage, got v={v}",
            "pass v=1, or use the interleaved schedule for several chunks per stage",
        )
    if name in _NEED_M_GE_P and m < p:
        raise InputError(
            "microbatches",
            f"{name} needs at least as many micro-batches as stages (m >= p), got m={m} < p={p}",
            f"use m >= {p}, or the gpipe schedule",
        )
    if name == "interleaved" and m % p != 0:
        raise InputError(
            "microbatches",
            f"interleaved needs the micro-batch count to be a multiple of the stages, got m={m}, p={p}",
            f"use a multiple of {p}, e.g. {p * (m // p + 1)}",
        )


def build_schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Instr]]:
    """Per-rank instruction lists of schedule ``name`` for ``p`` stages and ``m`` micro-batches.

    - ``gpipe``: every rank runs all forwards, then all backwards, both in micro-batch order
      ``0..m-1``. (Backward in the same order as forward keeps the list simple; the replayed
      makespan and bubble fraction are the same as in reverse order.) Holds ``m`` activations.
    - ``1f1b``: rank ``r`` runs ``min(p-r-1, m)`` warm-up forwards, then alternates one forward and
      one backward, then drains the remaining backwards (PipeDream-flush, Megatron
      non-interleaved). Same bubble as GPipe, but at most ``p - r`` activations live.
    - ``interleaved``: Megatron's interleaved 1F1B with ``v`` chunks per rank. Forwards go through
      the rank's chunks in groups of ``p`` micro-batches; backwards through the chunks in reverse.
      Rank ``r`` warms up with ``(p-r-1)*2 + (v-1)*p`` forwards (capped at ``m*v``).
    - ``zbh1``: Zero Bubble ZB-H1 (Qi et al., ICLR 2024). F and B (input gradient) follow 1F1B
      exactly; the W (weight gradient) of a micro-batch is deferred: rank ``r`` runs ``W(k)``
      right after ``B(k + r)``, and its last ``r`` W's after its last B. Nobody waits for a W, so
      later stages, by pushing W's back, return gradients to earlier stages sooner (shortening
      their drain) and fill what would be their own tail bubble with W's. With unit costs this
      reaches the paper's ZB-H1 bubble ``(p-1)(T_F+T_B-T_W)``. Since 1F1B keeps at most ``p - r``
      micro-batches in flight on rank ``r``, ``r`` deferred W's keep every rank at ``p`` at most:
      the same peak activation memory as 1F1B's first stage.
    """
    validate(name, p, m, v)
    if name == "gpipe":
        return [
            [Instr("F", k, r) for k in range(m)] + [Instr("B", k, r) for k in range(m)]
            for r in range(p)
        ]
    if name == "1f1b":
        return [_one_f_one_b(r, p, m) for r in range(p)]
    if name == "zbh1":
        return [_zbh1(r, p, m) for r in range(p)]
    return [_interleaved(r, p, m, v) for r in range(p)]


def _one_f_one_b(r: int, p: int, m: int) -> list[Instr]:
    warmup = min(p - r - 1, m)
    out = [Instr("F", k, r) for k in range(warmup)]
    for i in range(m - warmup):
        out += [Instr("F", warmup + i, r), Instr("B", i, r)]
    out += [Instr("B", k, r) for k in range(m - warmup, m)]
    return out


def _zbh1(r: int, p: int, m: int) -> list[Instr]:
    out: list[Instr] = []
    for ins in _one_f_one_b(r, p, m):
        out.append(ins)
        if ins.kind == "B" and ins.mb >= r:
            out.append(Instr("W", ins.mb - r, r))
    out += [Instr("W", k, r) for k in range(max(m - r, 0), m)]
    return out


def _interleaved(r: int, p: int, m: int, v: int) -> list[Instr]:
    total = m * v
    warmup = min((p - r - 1) * 2 + (v - 1) * p, total)

    def at(k: int, forward: bool) -> Instr:
        # k-th forward (or backward) of this rank, in Megatron's order: groups of p micro-batches,
        # each group swept through the rank's chunks in turn (reverse chunk order for backward).
        group, within = divmod(k, p * v)
        local, offset = divmod(within, p)
        if not forward:
            local = v - 1 - local
        return Instr("F" if forward else "B", group * p + offset, r + local * p)

    out = [at(k, True) for k in range(warmup)]
    for i in range(total - warmup):
        out += [at(warmup + i, True), at(i, False)]
    out += [at(k, False) for k in range(total - warmup, total)]
    return out


# ----------------------------------------------------------------------------------------------
# Execution: dependencies, checking, replay


def _deps(ins: Instr, n_chunks: int) -> list[Instr]:
    """What ``ins`` waits for: activations from the previous chunk, gradients from the next one."""
    if ins.kind == "F":
        return [Instr("F", ins.mb, ins.chunk - 1)] if ins.chunk > 0 else []
    if ins.kind == "B":
        deps = [Instr("F", ins.mb, ins.chunk)]
        if ins.chunk < n_chunks - 1:
            deps.append(Instr("B", ins.mb, ins.chunk + 1))
        return deps
    return [Instr("B", ins.mb, ins.chunk)]


class _Deadlock(Exception):
    def __init__(self, stuck: list[tuple[int, Hashable, list[Hashable]]]) -> None:
        self.stuck = stuck
        super().__init__(
            "; ".join(f"rank {r} waits at {i} for {', '.join(map(str, w))}" for r, i, w in stuck)
        )


def simulate_lists(
    lists: Sequence[Sequence[A]],
    deps: Callable[[A], Iterable[A]],
    cost: Callable[[A], float],
    rank_of: Callable[[A], int],
    comm: float = 0.0,
) -> list[list[tuple[float, float, A]]]:
    """Run every rank's action list strictly in order, each action as early as its rank and its
    dependencies allow (``comm`` added when a dependency ran on another rank, by ``rank_of``).

    This is the one dependency simulator for every schedule IR: ours (:class:`Instr`) and
    torch.distributed.pipelining's action lists (see :mod:`flowride.pipeline.torch_plan`).
    Start times depend only on dependency end times, never on the order ranks are visited, so
    sweeping ranks until no one can move gives the unique as-soon-as-possible timing; a sweep in
    which no rank moves while work remains is a deadlock (raises ``_Deadlock``).
    """
    p = len(lists)
    end: dict[A, float] = {}
    pos = [0] * p
    free = [0.0] * p
    timeline: list[list[tuple[float, float, A]]] = [[] for _ in range(p)]
    remaining = sum(len(lst) for lst in lists)
    while remaining:
        moved = False
        for r in range(p):
            lst = lists[r]
            while pos[r] < len(lst):
                act = lst[pos[r]]
                start = free[r]
                for d in deps(act):
                    t = end.get(d)
                    if t is None:
                        break
                    start = max(start, t + (comm if rank_of(d) != r else 0.0))
                else:
                    finish = start + cost(act)
                    end[act] = finish
                    free[r] = finish
                    timeline[r].append((start, finish, act))
                    pos[r] += 1
                    remaining -= 1
                    moved = True
                    continue
                break
        if not moved:
            stuck = [
                (r, lists[r][pos[r]], [d for d in deps(lists[r][pos[r]]) if d not in end])
                for r in range(p)
                if pos[r] < len(lists[r])
            ]
            raise _Deadlock(stuck)
    return timeline


def _execute(
    instrs: list[list[Instr]], p: int, v: int, cost: dict[str, float], comm: float
) -> list[list[tuple[float, float, Instr]]]:
    """:func:`simulate_lists` for our instruction lists: chunk ``j`` runs on rank ``j % p``."""
    n_chunks = p * v
    return simulate_lists(
        instrs, lambda ins: _deps(ins, n_chunks), lambda ins: cost[ins.kind], lambda ins: ins.chunk % p, comm
    )


def check_schedule(instrs: list[list[Instr]], p: int, m: int, v: int, has_w: bool) -> None:
    """Raise ``AssertionError`` unless ``instrs`` is a correct schedule.

    Correct means: one list per rank; rank ``r`` holds, for each of its chunks (``j % p == r``) and
    each micro-batch, exactly one F, one B and (iff ``has_w``) one W and nothing else; on each
    rank F(mb, j) precedes B(mb, j) precedes W(mb, j); and executing every list strictly in order
    with the pipeline's data dependencies (F needs the previous chunk's F, B needs its own F and
    the next chunk's B, W needs its own B) finishes, i.e. cannot deadlock. Explicit raises, not
    ``assert``, so the check survives ``python -O``.
    """
    if len(instrs) != p:
        raise AssertionError(f"expected one instruction list per stage ({p}), got {len(instrs)}")
    kinds = ("F", "B", "W") if has_w else ("F", "B")
    for r, lst in enumerate(instrs):
        want = Counter(
            Instr(k, mb, j) for k in kinds for mb in range(m) for j in range(r, p * v, p)
        )
        got = Counter(lst)
        missing = want - got
        extra = got - want
        if missing:
            raise AssertionError(f"rank {r} is missing {sorted(missing, key=str)[:5]}")
        if extra:
            raise AssertionError(
                f"rank {r} has duplicate or foreign instructions {sorted(extra, key=str)[:5]}"
            )
        where = {ins: i for i, ins in enumerate(lst)}
        for ins in lst:
            if ins.kind == "F":
                continue
            before = Instr("F" if ins.kind == "B" else "B", ins.mb, ins.chunk)
            if where[before] > where[ins]:
                raise AssertionError(f"rank {r} runs {ins} before {before}")
    try:
        _execute(instrs, p, v, dict.fromkeys(kinds, 1.0), 0.0)
    except _Deadlock as exc:
        raise AssertionError(f"schedule deadlocks: {exc}") from None


def replay(
    instrs: list[list[Instr]],
    p: int,
    v: int = 1,
    cost_f: float = 1.0,
    cost_b: float = 1.0,
    cost_w: float = 1.0,
    comm: float = 0.0,
) -> Replay:
    """Time ``instrs`` with per-pass costs and return where every rank is busy and idle.

    Costs are per chunk: a chunk is ``1/v`` of a stage, so to compare an interleaved schedule
    with a one-chunk one at equal model size pass costs divided by ``v``. ``cost_b`` is the
    input-gradient part of the backward and ``cost_w`` the weight-gradient part: in a schedule
    with W passes B costs ``cost_b`` and W ``cost_w``; without, B is the full backward and costs
    ``cost_b + cost_w``. Keeping one pair of parameters makes the same model comparable across
    schedules. ``comm`` is added to a dependency that crosses ranks (activation or gradient send).
    Raises ``InputError`` on a negative cost and ``AssertionError`` if the schedule deadlocks.
    """
    for field, value in (
        ("cost_f", cost_f),
        ("cost_b", cost_b),
        ("cost_w", cost_w),
        ("comm", comm),
    ):
        if not value >= 0:
            raise InputError(field, f"{value!r} is not a non-negative time", "give a cost >= 0")
    if len(instrs) != p:
        raise AssertionError(f"expected one instruction list per stage ({p}), got {len(instrs)}")
    has_w = any(ins.kind == "W" for lst in instrs for ins in lst)
    cost = {"F": cost_f, "B": cost_b if has_w else cost_b + cost_w, "W": cost_w}
    try:
        timeline = _execute(instrs, p, v, cost, comm)
    except _Deadlock as exc:
        raise AssertionError(f"schedule deadlocks: {exc}") from None
    makespan = max((t[-1][1] for t in timeline if t), default=0.0)
    idle = [
        (makespan - sum(e - s for s, e, _ in t)) / makespan if makespan > 0 else 0.0
        for t in timeline
    ]
    return Replay(timeline, makespan, idle, sum(idle) / p)


def theoretical_bubble_fraction(name: str, p: int, m: int, v: int = 1) -> float:
    """Share of an iteration each stage idles, by schedule.

    GPipe and 1F1B: ``(p-1)/(m+p-1)``: the fill and drain each cost ``p-1`` stage-passes of the
    ``m+p-1`` an iteration takes. Interleaved: ``(p-1)/(v*m+p-1)``: the fill and drain are made
    of chunks ``1/v`` as long. ZB-H1's bubble depends on the cost ratio of its passes, so this
    replays it with unit costs (F = B = W = 1, i.e. a full backward costs twice a forward); the
    result is ``(p-1)/(3m+p-1)``, a third of 1F1B's idle time at the same costs.
    """
    validate(name, p, m, v)
    if name in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if name == "interleaved":
        return (p - 1) / (v * m + p - 1)
    return replay(build_schedule(name, p, m, v), p, v).bubble_fraction


# ----------------------------------------------------------------------------------------------
# Bubble typing


BACKWARD_KINDS = frozenset({"B", "I"})
"""Kinds that carry a gradient back to the previous stage: our ``B``, and torch's full ``B`` and
input-gradient ``I``. The first of them on a rank ends its warm-up (the ``B`` bubble)."""


def gap_types(rank_instrs: Sequence[Instr]) -> list[str]:
    """Type of each of the ``len(rank_instrs) + 1`` gaps of one rank's list.

    Gap ``i`` lies just before instruction ``i``; the last one after the last instruction.

    - ``"A"`` before the first instruction: later stages wait for the first activations to
      travel down the pipeline (the fill).
    - ``"B"`` just before the rank's first backward (our B; torch's B or I): between the warm-up
      forwards and the first gradient, which has to come back up from the last stage.
    - ``"D"`` between two instructions after the rank's last F: the drain, where the rank only
      waits for gradients of the last micro-batches (or fills the wait with W passes).
    - ``"C"`` after the last instruction, until the iteration ends on the slowest rank.
    - ``"S"`` any other gap (steady state; empty in balanced 1F1B, not with uneven costs).

    Types come from the order alone, not from times, so they hold for any (p, m), any costs and
    any iteration: FreeRide can decide which side task suits a bubble before the bubble starts,
    and the replay (:func:`bubbles`) or a profile supplies its length. Precedence: A, C, B, D, S.
    """
    n = len(rank_instrs)
    first_b = next((i for i, ins in enumerate(rank_instrs) if ins.kind in BACKWARD_KINDS), None)
    last_f = max((i for i, ins in enumerate(rank_instrs) if ins.kind == "F"), default=-1)
    types = []
    for i in range(n + 1):
        if i == 0:
            types.append("A")
        elif i == n:
            types.append("C")
        elif i == first_b:
            types.append("B")
        elif i > last_f:
            types.append("D")
        else:
            types.append("S")
    return types


def bubbles(rep: Replay, min_length: float = 0.0) -> list[Bubble]:
    """Every idle interval longer than ``min_length`` in a replay, typed by :func:`gap_types`.

    Gaps shorter than a relative ``1e-9`` of the makespan count as empty (float sums of costs).
    """
    out = []
    tol = max(min_length, _EPS * rep.makespan)
    for r, timeline in enumerate(rep.timeline):
        types = gap_types([ins for _, _, ins in timeline])
        edges = [0.0] + [e for _, e, _ in timeline]
        starts = [s for s, _, _ in timeline] + [rep.makespan]
        for i, (a, b) in enumerate(zip(edges, starts, strict=True)):
            if b - a > tol:
                out.append(Bubble(r, i, types[i], a, b))
    return out


# ----------------------------------------------------------------------------------------------
# Drawing


def check_grid_size(p: int, m: int, v: int = 1) -> None:
    """Refuse a grid too large to print as text (before the schedule is built): about
    p x m x v x 3 cells (forward, backward and weight per micro-batch and chunk)."""
    cells = p * m * v * 3
    if cells > MAX_GRID_CELLS:
        raise InputError("microbatches", f"{p} stages x {m} micro-batches x {v} chunk(s) make about "
                         f"{cells:,} cells, over the {MAX_GRID_CELLS:,} a text grid can show", "use fewer stages or micro-batches")


def render_grid(instrs: list[list[Instr]], p: int, m: int, v: int = 1) -> str:
    """Text diagram of ``instrs``: one row per stage, one column per unit time slot.

    Timed by the unit-cost replay (F = 1, B = 1 and W = 1 per chunk when the schedule has W
    passes, a full B = 2 when it has not), so a full backward spans two columns. Cells read
    ``F3``/``B3``/``W3`` (pass and micro-batch); with several chunks per stage a suffix gives the
    rank's local chunk (``F3.1`` is micro-batch 3 on the rank's second chunk, virtual stage
    ``r + p``); ``.`` is idle. The first row numbers the time slots. Raises ``AssertionError``
    (via :func:`check_schedule`) if ``instrs`` is not a complete schedule for ``m`` micro-batches.
    """
    has_w = any(ins.kind == "W" for lst in instrs for ins in lst)
    check_schedule(instrs, p, m, v, has_w)
    rep = replay(instrs, p, v)
    slots = int(round(rep.makespan))

    def cell(ins: Instr) -> str:
        return f"{ins.label}.{ins.chunk // p}" if v > 1 else ins.label

    rows = [["."] * slots for _ in range(p)]
    for r, timeline in enumerate(rep.timeline):
        for start, end, ins in timeline:
            for t in range(int(round(start)), int(round(end))):
                rows[r][t] = cell(ins)
    width = max([len(str(max(slots - 1, 0)))] + [len(c) for row in rows for c in row])
    head_w = len(f"S{p - 1}")
    lines = [" " * head_w + " " + " ".join(str(t).rjust(width) for t in range(slots))]
    for r, row in enumerate(rows):
        lines.append(f"S{r}".ljust(head_w) + " " + " ".join(c.rjust(width) for c in row))
    return "\n".join(lines)
