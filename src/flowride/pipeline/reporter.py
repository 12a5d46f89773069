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


@dataclass
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


class GapPredictor:
    """Predicts each key's next length: the median of its last ``window`` lengths."""

    def __init__(self, window: int = 5) -> None:
        self.window = window
        self.seen: dict[str, deque[float]] = {}

    def predict(self, key: str) -> float | None:
        hist = self.seen.get(key)
        return statistics.median(hist) if hist else None

    def observe(self, key: str, seconds: float) -> None:
        hist = self.seen.get(key)
        if hist is None:  # not setdefault: it would build a deque on every wait (the observer's cost)
            hist = self.seen[key] = deque(maxlen=self.window)
        hist.append(seconds)

    def seed(self, lengths: dict[str, float]) -> None:
        """Start from a saved profile (its lengths count as one observation each)."""
        for k, v in lengths.items():
            self.observe(k, float(v))

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.seen.items() if v}


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
        pred = (until - now) if until is not None else self.predictor.predict(key)
        announce = (
            self.enabled
            and pred is not None
            and pred >= self.min_bubble_s
            and (until is not None or self.iterations_seen > self.warmup_iters)
        )
        if announce:
            self.pub.publish(BubbleEvent("bubble", self.stage, type, now, now + pred, self.free_memory, self.iteration))
        self._open = (key, type, now, pred, announce)

    def busy(self, now: float | None = None) -> None:
        """The stage computes again (no-op when no wait is open)."""
        if self._open is None:
            return
        now = self.clock() if now is None else now
        key, typ, start, pred, announced = self._open
        self._open = None
        if announced:
            self.pub.publish(BubbleEvent("busy", self.stage, typ, now, None, self.free_memory, self.iteration))
        self.predictor.observe(key, now - start)
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
    def gap_plan(self, keys: Sequence[str]) -> tuple[list[float | None], list[bool]]:
        """Each of this iteration's coming waits ``keys``: its predicted length, and whether
        :meth:`idle` would announce it. Decided once when the iteration starts, so that a wrapper
        on the compute path (:mod:`flowride.pipeline.torch_observe`) only looks it up. While
        nothing can be announced (disabled, or still learning), nothing is predicted either."""
        n = len(keys)
        if not (self.enabled and self.iterations_seen > self.warmup_iters):
            return [None] * n, [False] * n
        preds = [self.predictor.predict(k) for k in keys]
        return preds, [p is not None and p >= self.min_bubble_s for p in preds]

    def book(self, waits: Iterable[tuple[str, str, float, float, float | None, bool]]) -> None:
        """Waits measured (and announced) by the caller, as (key, type, start, end, predicted,
        announced), booked after the fact as :meth:`busy` books each one."""
        it, seen, observe, append = self.iteration, self.predictor.seen, self.predictor.observe, self.waits.append
        for key, typ, start, end, pred, announced in waits:
            hist = seen.get(key)
            if hist is None:
                observe(key, end - start)
            else:
                hist.append(end - start)
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
        """Learned median length per key (reusable as ``profile=`` in a later run)."""
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
