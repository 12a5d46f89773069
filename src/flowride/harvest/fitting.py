"""The bubble-fitting rule: which side task may start in a bubble, and how long it needs.

This is the scheduling policy of :mod:`flowride.harvest.manager`, kept apart from the process
plumbing (:mod:`flowride.harvest.hosts`) so the rule reads in one place and is tested without a
process. FreeRide's rule: a step starts only while the bubble still has more than the task's
median step time, rounded up to the next millisecond, times ``factor`` (1.2). The step time is
the task's profile until it has taken a few steps of its own.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from flowride.pipeline.events import BubbleEvent

UNPROFILED_STEP_S = 0.02  # step time assumed for a task with no profile until its own steps are seen
OWN_STEPS = 3  # a task's own step times replace its profile once it has taken this many


def fit_time(median_step_s: float, factor: float = 1.2) -> float:
    """The time a bubble must still have for one more step: median step rounded up to the next
    millisecond, times ``factor`` (FreeRide's rule)."""
    return math.ceil(median_step_s * 1000.0 - 1e-9) / 1000.0 * factor


def step_fits(remaining_s: float, median_step_s: float, factor: float = 1.2) -> bool:
    return remaining_s > fit_time(median_step_s, factor)


def need_s(step_times: Sequence[float], profiled_step_s: float | None, factor: float) -> float:
    """Time a bubble must still have for one more step: the profiled median step, or the
    median of the task's own last steps once it has taken a few."""
    if len(step_times) >= OWN_STEPS:
        return fit_time(statistics.median(step_times), factor)
    return fit_time(profiled_step_s or UNPROFILED_STEP_S, factor)


class Fittable(Protocol):
    """What the rule reads of a live task (:class:`flowride.harvest.hosts.Live` has it); the rule
    needs no process to be tested."""

    ready: bool
    finished: bool
    running: bool
    saving: bool
    probing: bool
    home: int | None
    peak_bytes: int
    busy_s: float
    rec: Any  # its TaskRecord: priority and id order the candidates

    def need_s(self, factor: float) -> float: ...


def candidates(tasks: Iterable[Fittable], stage: int, ev: BubbleEvent, now: float, factor: float) -> list[Fittable]:
    """The tasks that may start in ``stage``'s bubble ``ev`` at ``now``, best first.

    A task qualifies when it is idle and ready, may run on this stage (it floats, or this is its
    home), its next step fits the bubble's predicted remaining time and its peak memory fits the
    stage's free memory. Best: highest priority first; among equals, the one that has had the
    least time (fair share), then the oldest.
    """
    out = []
    for live in tasks:
        if not live.ready or live.finished or live.running or live.saving or live.probing:
            continue
        if live.home is not None and live.home != stage:
            continue
        if ev.predicted_end is None or ev.predicted_end - now <= live.need_s(factor):
            continue
        if live.peak_bytes and live.peak_bytes > ev.free_memory:
            continue
        out.append(live)
    return sorted(out, key=lambda t: (-t.rec.priority, t.busy_s, t.rec.id))


class BubbleMargins:
    """How the bubbles of each type really ended against their predicted ends, and the margin
    the fit rule takes from that spread.

    The reporter predicts a bubble's end; on a noisy node some bubbles still end early. Per
    bubble type the manager keeps the ratio ``measured / predicted`` length of its last ``window``
    bubbles, and their ``quantile`` (the 10th percentile: 9 bubbles in 10 lasted at least that
    share of their prediction; never above 1, never below ``floor``) divides the fit factor: a
    step starts only while the bubble has ``factor / share`` x its step left. The margin grows
    with the step, not with the bubble: a short step near a long bubble's end risks an overrun
    of one short step (cheap), a step as long as the bubble is kept out of a bubble that may end
    early. (Shrinking the predicted end itself by the share cost a third of the harvest in long
    bubbles for no gain: 0.66 efficiency against ~0.9 on this machine.) On a quiet node the
    ratios sit at ~1 and the rule is FreeRide's.
    """

    def __init__(self, window: int = 50, quantile: float = 0.1, min_seen: int = 5, floor: float = 0.5) -> None:
        self.window, self.quantile, self.min_seen, self.floor = window, quantile, min_seen, floor
        self.ratios: dict[str, list[float]] = {}
        self._shrink: dict[str, float] = {}

    def observe(self, typ: str, start: float, predicted_end: float | None, end: float) -> None:
        if predicted_end is None or predicted_end <= start or end < start:
            return
        rs = self.ratios.setdefault(typ, [])
        rs.append((end - start) / (predicted_end - start))
        del rs[:-self.window]
        self._shrink.pop(typ, None)

    def shrink(self, typ: str) -> float:
        """The share of a predicted length of type ``typ`` a step is fitted against."""
        s = self._shrink.get(typ)
        if s is None:
            rs = self.ratios.get(typ, [])
            if len(rs) < self.min_seen:
                s = 1.0
            else:
                q = sorted(rs)[int(self.quantile * (len(rs) - 1))]
                s = min(1.0, max(self.floor, q))
            self._shrink[typ] = s
        return s

    def report(self) -> dict[str, dict]:
        """Per type: bubbles seen, the median and 10th-percentile ratio, the median error, and
        the share a step is fitted against."""
        out = {}
        for typ, rs in sorted(self.ratios.items()):
            srt = sorted(rs)
            out[typ] = {"bubbles": len(rs), "ratio_median": statistics.median(srt), "ratio_p10": srt[int(0.1 * (len(srt) - 1))],
                        "error_median": statistics.median(abs(r - 1.0) for r in srt), "fit_share": self.shrink(typ)}
        return out


def why_none(tasks: Iterable[Fittable], stage: int, ev: BubbleEvent, now: float, factor: float) -> str:
    """Why no task may start in ``stage``'s bubble ``ev`` (when :func:`candidates` is empty): the
    reason a user can act on, the most telling first."""
    tasks = [t for t in tasks if t.home is None or t.home == stage]
    if not tasks:
        return "no side task may run on this stage"
    if all(t.finished for t in tasks):
        return "every side task had finished"
    live = [t for t in tasks if not t.finished]
    if all(t.running or t.saving for t in live):
        return "every side task was busy elsewhere (running on another stage or checkpointing)"
    if all(not t.ready or t.probing for t in live if not (t.running or t.saving)):
        return "no side task was ready yet (starting, or measuring its step time)"
    idle = [t for t in live if t.ready and not (t.running or t.saving or t.probing)]
    left = (ev.predicted_end or now) - now
    if all(left <= t.need_s(factor) for t in idle):
        need = min(t.need_s(factor) for t in idle)
        return (f"no side task's step fits: the shortest needs {need * 1e3:.1f} ms (its median step x {factor:g}), "
                f"the bubble had {max(0.0, left) * 1e3:.1f} ms left")
    return "no side task fits the stage's free memory"


class Decisions:
    """The manager's fit decisions, the last ``keep`` of them, in its record: for each bubble it
    looked at (announced, or what was left of it once a task yielded or saved), when, what was
    left of it, the fit factor, what a step needed (the task started, else the shortest of those
    that may run there), which task started, or why none did.

    What the rule decided is kept apart from whether a step then managed to run in a few ms of
    wall time: a user reads why a bubble went unused, and a test asserts the decision, which no
    busy machine changes, not a count of steps in a window a busy machine shrinks."""

    def __init__(self, keep: int = 1000) -> None:
        self.log: deque[dict] = deque(maxlen=keep)

    def add(self, ev: BubbleEvent, now: float, factor: float, tasks: Iterable[Fittable],
            started: Fittable | None, why: str | None) -> None:
        here = [t for t in tasks if t.ready and not t.finished and (t.home is None or t.home == ev.stage)]
        weighed = [started] if started is not None else here
        need = min((t.need_s(factor) for t in weighed), default=None)
        left = None if ev.predicted_end is None else ev.predicted_end - now
        self.log.append({"stage": ev.stage, "type": ev.type, "iteration": ev.iteration, "start": ev.start,
                         "end": ev.predicted_end, "at": now, "left_s": left, "factor": factor, "need_s": need,
                         "task": started.rec.id if started is not None else None, "why": why})

    def switched(self, kind: str, at: float) -> None:
        """Training switched harvesting ``kind`` (on/off) and the manager acted on it at ``at``
        (off: every running task had been told to pause; no step starts after that)."""
        self.log.append({"event": kind, "at": at})
