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
