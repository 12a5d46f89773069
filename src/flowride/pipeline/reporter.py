"""Bubble reporting for any training loop: "idle now" and "busy again", with the end predicted.

A training loop (ours, torch.distributed.pipelining through :mod:`flowride.pipeline.torch_observe`,
or a hand-written one, Megatron-LM or DeepSpeed through a few calls) tells a
:class:`BubbleReporter` when it starts waiting and when it computes again::

    rep = BubbleReporter(stage=rank, port=port)
    for it in range(iters):
        rep.begin_iteration(it)
        ...
        with rep.waiting("recv grad"):       # the wait: a bubble starts now
            recv(grad)
        ...                                  # computing again
        rep.end_iteration()

Each wait has a key: the label and how many waits of that label came before it in the iteration
(or, with no label, its ordinal position). Every pipeline iteration repeats the same waits, so a
key's length is learned online from earlier iterations (median of the last few), and a bubble
event carries its predicted end. Nothing is announced until a key has been seen
(``warmup_iters``), nor for waits predicted shorter than ``min_bubble_s``: no side task could fit.

Events go out through :class:`flowride.pipeline.events.BubblePublisher` (one UDP datagram, never
blocking); the reporter itself only reads the clock and keeps a few numbers, so it costs the
training step a few microseconds per wait. ``enabled = False`` keeps measuring but announces
nothing, which is how paired on/off overhead measurements switch harvesting off.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from flowride.pipeline.events import BubbleEvent, BubblePublisher, free_memory_bytes

PROFILE_SCHEMA = "flowride.bubble-profile/2"


@dataclass(slots=True)
class Wait:
    """One measured wait (gap) of a stage."""

    iteration: int
    key: str
    type: str
    start: float
    end: float
    predicted_s: float | None  # what was predicted when it began (None: nothing learned yet)
    announced: bool  # a bubble event went out for it

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def _median(xs: Iterable[float]) -> float:
    """The median of a short window (statistics.median's checks cost more than the sort here)."""
    s = sorted(xs)
    n = len(s)
    h = n // 2
    return s[h] if n % 2 else (s[h - 1] + s[h]) / 2.0


class GapPredictor:
    """Predicts each key's next length, following the pipeline's pace.

    On a busy node the whole pipeline runs faster or slower from one iteration to the next
    (+-20% seen on a shared host), so one learned length per wait loses track. Each wait's
    length (and where in its iteration it started) is therefore kept *normalized* by the pace of
    the iteration it ran in, that iteration's length against the typical one (the median of the
    last ``window``), and a prediction is the normalized median times the current pace. The
    current pace is read off the iteration in progress: a wait that typically starts ``o_k``
    seconds into the iteration and starts ``o`` seconds in now says it runs at ``o / o_k``; early
    in an iteration there is little to read, so the estimate leans on the typical pace (1) by a
    weight of ``lean`` x the typical iteration: ``pace = (o + tau) / (o_k + tau)``. Medians of
    the last ``window`` keep one disturbed iteration from moving anything.

    Not every wait follows the pace: a stage's wait on its neighbour's compute often moves with
    the neighbour's noise, not its own progress (replayed on this machine's own runs, pace
    scaling helped some keys and hurt others). So each key keeps both predictions, the
    pace-scaled one and the plain median of its raw lengths, scores them on every iteration it
    is seen in, and uses the pace-scaled one only while its errors over the last ``window``
    iterations are lower (the plain median until three iterations show it).

    Learning is batched per iteration (:meth:`observe_iteration`): its pace is known only when it
    ends, and on the training step one pass over its waits is all the observer can afford.
    """

    def __init__(self, window: int = 5, lean: float = 0.1, mode: str = "auto") -> None:
        if mode not in ("auto", "pace", "plain"):
            raise ValueError("mode must be auto (the better per key), pace or plain")
        self.window = window
        self.lean = lean
        self.mode = mode
        self.seen: dict[str, deque[float]] = {}  # key -> normalized lengths (seconds at the typical pace)
        self.offsets: dict[str, deque[float]] = {}  # key -> normalized start in the iteration (seconds)
        self.raw: dict[str, deque[float]] = {}  # key -> lengths as measured
        self.score: dict[str, deque[float]] = {}  # key -> relative error of pace-scaled less plain, per iteration
        self.iter_lengths: deque[float] = deque(maxlen=window)
        # key -> (normalized length median, offset median + tau, raw median, pace-scaled wins): read
        # once per key and iteration (the observer's cost is paid on the training step),
        # forgotten when an iteration is learned
        self._med: dict[str, tuple[float, float | None, float, bool]] = {}
        self.tau = 0.0
        self.typical = 0.0  # the typical iteration (median of the last ``window``)

    def _medians(self, key: str) -> tuple[float, float | None, float, bool] | None:
        m = self._med.get(key)
        if m is None:
            hist = self.seen.get(key)
            if not hist:
                return None
            offs = self.offsets.get(key)
            sc = self.score.get(key)
            wins = (self.mode == "pace" or self.mode == "auto" and sc is not None and len(sc) >= 3 and _median(sc) < 0.0)
            m = self._med[key] = (_median(hist), _median(offs) + self.tau if offs else None, _median(self.raw[key]), wins)
        return m

    def pace(self, key: str, offset: float | None) -> float:
        """The current pace (1: the typical one) for a wait of ``key`` starting ``offset``
        seconds into the iteration."""
        if offset is None:
            return 1.0
        m = self._med.get(key) or self._medians(key)
        if m is None or m[1] is None or m[1] <= 0:
            return 1.0
        return (offset + self.tau) / m[1]

    def coefficients(self, key: str) -> tuple[float, float] | None:
        """``(a, b)`` with ``predicted = a * offset + b`` for a wait of ``key`` starting ``offset``
        seconds into the iteration (None: nothing learned). Decided once per iteration so that
        a wrapper on the compute path pays one multiply-add (the torch observer)."""
        m = self._med.get(key) or self._medians(key)
        if m is None:
            return None
        length, den, plain, wins = m
        if not wins:
            return 0.0, plain
        if den is None or den <= 0:
            return 0.0, length
        return length / den, length * self.tau / den

    def predict(self, key: str, offset: float | None = None) -> float | None:
        m = self._med.get(key) or self._medians(key)
        if m is None:
            return None
        return m[0] * self.pace(key, offset) if m[3] else m[2]

    def typical_length(self, key: str) -> float | None:
        """The key's length at the typical pace (whether a wait is long enough to announce)."""
        m = self._med.get(key) or self._medians(key)
        return None if m is None else (m[0] if m[3] else m[2])

    def observe_iteration(self, waits: Sequence[tuple[str, float, float | None]], seconds: float | None,
                          score: bool = True) -> None:
        """Learn one iteration's waits, each ``(key, seconds, offset into the iteration)``; the
        iteration lasted ``seconds`` (None: unknown, its pace taken as typical). ``score``: also
        weigh the two predictions of each wait against what it measured (skipped while nothing
        is announced, to keep the observer's cost down)."""
        pace = seconds / self.typical if seconds and self.typical > 0 else 1.0
        inv = 1.0 / pace if pace > 0 else 1.0
        seen, offsets, raw, window, tau = self.seen, self.offsets, self.raw, self.window, self.tau
        for key, length, off in waits:
            hist = seen.get(key)
            if hist is None:  # not setdefault: it would build a deque on every wait (the observer's cost)
                hist = seen[key] = deque(maxlen=window)
                raw[key] = deque(maxlen=window)
            elif score and length > 0 and off is not None:
                m = self._med.get(key) or self._medians(key)
                if m[1]:
                    sc = self.score.get(key)
                    if sc is None:
                        sc = self.score[key] = deque(maxlen=window)
                    sc.append((abs(m[0] * (off + tau) / m[1] - length) - abs(m[2] - length)) / length)
            raw[key].append(length)
            hist.append(length * inv)
            if off is not None:
                offs = offsets.get(key)
                if offs is None:
                    offs = offsets[key] = deque(maxlen=window)
                offs.append(off * inv)
        if seconds and seconds > 0:
            self.iter_lengths.append(seconds)
            self.typical = _median(self.iter_lengths)
            self.tau = self.lean * self.typical
        self._med.clear()

    def observe(self, key: str, seconds: float, offset: float | None = None) -> None:
        """One wait learned on its own, at the typical pace."""
        self.observe_iteration([(key, seconds, offset)], None)

    def seed(self, lengths: dict[str, float]) -> None:
        """Start from a saved profile (its lengths count as one observation each)."""
        self.observe_iteration([(k, float(v), None) for k, v in lengths.items()], None)

    def medians(self) -> dict[str, float]:
        """Each key's median length as measured (what a saved profile holds)."""
        return {k: statistics.median(v) for k, v in self.raw.items() if v}


class BubbleReporter:
    """One stage's waits: measured, predicted, and announced as bubble events.

    ``stage`` is the pipeline rank that events name. ``publisher`` (or ``port``) is where events
    go; with neither, the reporter only measures. ``device`` ("cpu" or "cuda") says whose free
    memory the events carry; it is read once per iteration, not per wait.
    """

    def __init__(self, stage: int, publisher: BubblePublisher | None = None, port: int | None = None,
                 min_bubble_s: float = 0.002, window: int = 5, warmup_iters: int = 1,
                 profile: dict[str, float] | None = None, device: str = "cpu",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stage = stage
        self.pub = publisher if publisher is not None else BubblePublisher(port)
        self.min_bubble_s = min_bubble_s
        self.warmup_iters = warmup_iters
        self.predictor = GapPredictor(window)
        if profile:
            self.predictor.seed(profile)
        self.device = device
        self.clock = clock
        self.enabled = True
        self.iteration = -1
        self.iterations_seen = 0
        self.iter_start: float | None = None  # when the current iteration began (wait offsets count from it)
        self._pending: list[tuple[str, float, float | None]] = []  # this iteration's waits, learned when it ends
        self.free_memory = 0
        self.waits: list[Wait] = []
        self._counts: dict[str, int] = {}
        self._ordinal = 0
        self._open: tuple[str, str, float, float | None, bool] | None = None

    # ------------------------------------------------------------------ iteration boundaries
    def begin_iteration(self, iteration: int | None = None) -> None:
        """A new iteration: wait keys count from zero again. Closes a wait left open. Stage 0
        also announces the iteration's start (one datagram), whose spacing is the iteration time
        the manager's budget guard (:mod:`flowride.harvest.guard`) keeps under the budget; it goes
        out whether or not harvesting is on, since the guard needs the off iterations too."""
        now = self.clock()
        self.busy(now)
        self.predictor.observe_iteration(self._pending, None if self.iter_start is None else now - self.iter_start, self.enabled)
        self._pending = []
        self.iter_start = now
        self.iteration = self.iteration + 1 if iteration is None else iteration
        self.iterations_seen += 1
        self._counts.clear()
        self._ordinal = 0
        self.free_memory = free_memory_bytes(self.device)
        if self.stage == 0:  # every event carries the stage's free memory, this one too
            self.pub.publish(BubbleEvent("iter", 0, "-", now, None, self.free_memory, self.iteration))

    def end_iteration(self) -> None:
        self.busy()

    # ------------------------------------------------------------------ waits
    def _key(self, label: Hashable | None) -> str:
        if label is None:
            key = f"#{self._ordinal}"
        else:
            n = self._counts.get(str(label), 0)
            self._counts[str(label)] = n + 1
            key = f"{label}#{n}"
        self._ordinal += 1
        return key

    def idle(self, label: Hashable | None = None, type: str = "S", until: float | None = None) -> None:
        """The stage starts waiting now; ``until`` (a time.monotonic() value) if the loop knows
        when the wait will end, else the end is predicted from earlier iterations."""
        now = self.clock()
        if self._open is not None:
            self.busy(now)
        key = self._key(label)
        offset = None if self.iter_start is None else now - self.iter_start
        pred = (until - now) if until is not None else self.predictor.predict(key, offset)
        announce = (
            self.enabled
            and pred is not None
            and pred >= self.min_bubble_s
            and (until is not None or self.iterations_seen > self.warmup_iters)
        )
        if announce:
            self.pub.publish(BubbleEvent("bubble", self.stage, type, now, now + pred, self.free_memory, self.iteration))
        self._open = (key, type, now, pred, announce, offset)

    def busy(self, now: float | None = None) -> None:
        """The stage computes again (no-op when no wait is open)."""
        if self._open is None:
            return
        now = self.clock() if now is None else now
        key, typ, start, pred, announced, offset = self._open
        self._open = None
        if announced:
            self.pub.publish(BubbleEvent("busy", self.stage, typ, now, None, self.free_memory, self.iteration))
        self._pending.append((key, now - start, offset))
        self.waits.append(Wait(self.iteration, key, typ, start, now, pred, announced))

    @contextmanager
    def waiting(self, label: Hashable | None = None, type: str = "S", until: float | None = None) -> Iterator[None]:
        """``with reporter.waiting("recv grad"): recv(...)``: idle before, busy after."""
        self.idle(label, type, until)
        try:
            yield
        finally:
            self.busy()

    # ------------------------------------------------------------------ batched waits (the torch observer's fast path)
    def gap_plan(self, keys: Sequence[str]) -> tuple[list[tuple[float, float] | None], list[bool]]:
        """Each of this iteration's coming waits ``keys``: the coefficients ``(a, b)`` of its
        predicted length ``a * offset + b`` (``offset``: seconds since :attr:`iter_start` when it
        begins; :meth:`GapPredictor.coefficients`), and whether :meth:`idle` would announce it
        (its typical length is long enough). Decided once when the iteration starts, so that a
        wrapper on the compute path (:mod:`flowride.pipeline.torch_observe`) only does one
        multiply-add. While nothing can be announced (disabled, or still learning), nothing is
        predicted either."""
        n = len(keys)
        if not (self.enabled and self.iterations_seen > self.warmup_iters):
            return [None] * n, [False] * n
        coef, typical, lo = self.predictor.coefficients, self.predictor.typical_length, self.min_bubble_s
        coefs = [coef(k) for k in keys]
        return coefs, [c is not None and typical(k) >= lo for k, c in zip(keys, coefs, strict=True)]

    def book(self, waits: Iterable[tuple[str, str, float, float, float | None, bool]]) -> None:
        """Waits measured (and announced) by the caller, as (key, type, start, end, predicted,
        announced), booked after the fact as :meth:`busy` books each one."""
        it, learn, append, t0 = self.iteration, self._pending.append, self.waits.append, self.iter_start
        for key, typ, start, end, pred, announced in waits:
            learn((key, end - start, None if t0 is None else start - t0))
            append(Wait(it, key, typ, start, end, pred, announced))

    # ------------------------------------------------------------------ harvest blocks
    def control(self, kind: str) -> None:
        """Tell the manager to stop ("off") or resume ("on") harvesting (paired on/off runs)."""
        self.pub.publish(BubbleEvent(kind, self.stage, "-", self.clock(), None, self.free_memory, self.iteration))

    # ------------------------------------------------------------------ results
    def prediction_errors(self) -> list[float]:
        """|predicted - measured| / measured of every announced wait."""
        return [abs(w.predicted_s - w.seconds) / w.seconds for w in self.waits
                if w.announced and w.predicted_s is not None and w.seconds > 0]

    def profile(self) -> dict[str, float]:
        """Learned median length per key, as measured (reusable as ``profile=`` in a later run);
        the last iteration's waits are learned first."""
        if self._pending:
            self.predictor.observe_iteration(self._pending, None)
            self._pending = []
        return self.predictor.medians()

    def summary(self) -> dict:
        errs = self.prediction_errors()
        return {
            "stage": self.stage,
            "waits": len(self.waits),
            "announced": sum(w.announced for w in self.waits),
            "prediction_error_median": statistics.median(errs) if errs else None,
            "events": {"sent": self.pub.sent, "dropped": self.pub.dropped, "seconds": self.pub.seconds},
        }

    def records(self) -> list[dict]:
        return [asdict(w) for w in self.waits]

    def close(self) -> None:
        self.busy()
        self.pub.close()
