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
from bisect import insort
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from itertools import repeat

from flowride.pipeline.events import BubblePublisher, free_memory_bytes

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
    return _mid(sorted(xs))


def _mid(s: Sequence[float]) -> float:
    """The median of a sorted list."""
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

    Learning is batched per iteration (:meth:`observe_iteration`; :meth:`observe_columns`, shorter,
    for the same keys every time): its pace is known only when it ends, and on the training step
    one pass over its waits is all the observer can afford. While scoring, the pass also works
    out each key's next medians, off windows kept sorted as they slide (no sort per median).
    """

    def __init__(self, window: int = 5, lean: float = 0.1, mode: str = "auto") -> None:
        if mode not in ("auto", "pace", "plain"):
            raise ValueError("mode must be auto (the better per key), pace or plain")
        self._gen = 0  # iterations learned (and mode changes)
        self.window = window
        self.lean = lean
        self.mode = mode
        self.seen: dict[str, deque[float]] = {}  # key -> normalized lengths (seconds at the typical pace)
        self.offsets: dict[str, deque[float]] = {}  # key -> normalized start in the iteration (seconds)
        self.raw: dict[str, deque[float]] = {}  # key -> lengths as measured
        self.score: dict[str, deque[float]] = {}  # key -> relative error of pace-scaled less plain, per iteration
        # key -> [the same four deques (offsets, score: None until used); the first three sorted (changed in
        # place); how many scores are < 0; its medians (normalized length, offset + tau, raw, pace-scaled
        # wins, coefficients (a, b), typical length) and the _gen they are of; stale: sorted lists lag]
        self._st: dict[str, list] = {}
        self._med: dict[str, tuple] = {}  # the medians asked for since the last learning (as they were then)
        self._asked: tuple[int, list[str]] | None = None  # and the keys plan() answered in bulk
        self.iter_lengths: deque[float] = deque(maxlen=window)
        self._bulk: list | None = None  # observe_columns' keys, their states (all known), all windows full
        self._planned: tuple[int, list[str], list, list[float]] | None = None  # what plan() returns for those keys
        self.tau = 0.0
        self.typical = 0.0  # the typical iteration (median of the last ``window``)

    mode = property(lambda self: self._mode, doc="auto, pace or plain")

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode, self._gen = mode, self._gen + 1  # every key's medians are worked out again

    @staticmethod
    def _sorted(st: list) -> list:
        """``st`` with its sorted lists caught up with its deques."""
        if st[10]:
            for i in range(3):
                if st[i] is not None:
                    st[4 + i][:] = sorted(st[i])
            st[10] = False
        return st

    def _work_out(self, st: list, tau: float) -> tuple:
        """A key's medians from its windows ``st``, with ``tau``."""
        hist, raw, offs = self._sorted(st)[4:7]
        length, plain = _mid(hist), _mid(raw)
        den = _mid(offs) + tau if offs else None
        sc, w = st[3], self.window  # auto: the median of the scores < 0 (full, odd window: most of them)
        auto = sc is not None and len(sc) >= 3 and (st[7] > w // 2 if len(sc) == w and w % 2 else _median(sc) < 0.0)
        wins = auto if self.mode == "auto" else self.mode == "pace"
        if not wins:
            return length, den, plain, False, (0.0, plain), plain
        if den is None or den <= 0:
            return length, den, plain, True, (0.0, length), length
        return length, den, plain, True, (length / den, length * tau / den), length

    def _medians(self, key: str) -> tuple | None:
        m = self._med.get(key)
        if m is None:
            st = self._st.get(key)
            if st is None:
                return None
            m = self._med[key] = st[8] if st[9] == self._gen else self._work_out(st, self.tau)
        return m

    def pace(self, key: str, offset: float | None) -> float:
        """The current pace (1: the typical one) for a wait of ``key`` starting ``offset``
        seconds into the iteration."""
        if offset is None:
            return 1.0
        m = self._medians(key)
        if m is None or m[1] is None or m[1] <= 0:
            return 1.0
        return (offset + self.tau) / m[1]

    def coefficients(self, key: str) -> tuple[float, float] | None:
        """``(a, b)`` with ``predicted = a * offset + b`` for a wait of ``key`` starting ``offset``
        seconds into the iteration (None: nothing learned). Decided once per iteration so that
        a wrapper on the compute path pays one multiply-add (the torch observer)."""
        m = self._medians(key)
        return None if m is None else m[4]

    def plan(self, keys: Sequence[str], min_length: float) -> tuple[list[tuple[float, float] | None], list[bool]]:
        """:meth:`coefficients` of each of ``keys``, and whether its :meth:`typical_length` is at
        least ``min_length`` (for :meth:`BubbleReporter.gap_plan`)."""
        p = self._planned
        if p is not None and p[0] == self._gen and keys == p[1]:  # the keys just learned in bulk
            self._asked = (p[0], p[1])
            return list(p[2]), [t >= min_length for t in p[3]]
        ms = [self._medians(k) for k in keys]
        return [None if m is None else m[4] for m in ms], [m is not None and m[5] >= min_length for m in ms]

    def predict(self, key: str, offset: float | None = None) -> float | None:
        m = self._medians(key)
        if m is None:
            return None
        return m[0] * self.pace(key, offset) if m[3] else m[2]

    def typical_length(self, key: str) -> float | None:
        """The key's length at the typical pace (whether a wait is long enough to announce)."""
        m = self._medians(key)
        return None if m is None else m[5]

    def _new_iteration(self, seconds: float | None) -> tuple[int, float, float]:
        """``(_gen before, 1 / pace, tau before)`` of an iteration that lasted ``seconds``, learned."""
        pace = seconds / self.typical if seconds and self.typical > 0 else 1.0
        inv = 1.0 / pace if pace > 0 else 1.0
        tau = self.tau  # the predictions scored now were made with it
        if seconds and seconds > 0:
            self.iter_lengths.append(seconds)
            self.typical = _median(self.iter_lengths)
            self.tau = self.lean * self.typical
        self._gen += 1
        return self._gen - 1, inv, tau

    def observe_iteration(self, waits: Iterable[tuple[str, float, float | None]], seconds: float | None,
                          score: bool = True) -> None:
        """Learn one iteration's waits, each ``(key, seconds, offset into the iteration)``; the
        iteration lasted ``seconds`` (None: unknown, its pace taken as typical). ``score``: also
        weigh the two predictions of each wait against what it measured, and work out each
        key's next prediction now (skipped while nothing is announced, to keep the observer's
        cost down: then they are worked out when asked)."""
        prev, inv, tau = self._new_iteration(seconds)
        states, window, work_out = self._st, self.window, self._work_out
        old, asked = self._med, self._asked  # the medians asked for since the last learning
        asked = asked[1] if asked is not None and asked[0] == prev else ()
        fresh: dict[str, list] = {}
        for key, length, off in waits:
            st = states.get(key)
            if st is None:  # not setdefault: it would build a deque on every wait (the observer's cost)
                st = states[key] = [deque(maxlen=window), deque(maxlen=window), None, None, [], [], None, 0, None, -1, False]
                self.seen[key], self.raw[key] = st[0], st[1]
            elif score and length > 0 and off is not None:
                m = old.get(key)
                if m is None:  # those worked out when the key was last learned, unless it came before in this one
                    m = old[key] = st[8] if st[9] == prev and (key not in fresh or key in asked) else work_out(st, tau)
                if m[1]:
                    sq = st[3]
                    if sq is None:
                        sq = st[3] = self.score[key] = deque(maxlen=window)
                    x = (abs(m[0] * (off + tau) / m[1] - length) - abs(m[2] - length)) / length
                    if len(sq) == window:
                        st[7] -= sq[0] < 0.0
                    sq.append(x)
                    st[7] += x < 0.0
            if off is not None and st[2] is None:
                st[2], st[6] = self.offsets.setdefault(key, deque(maxlen=window)), []
            if not score:  # nothing read until scoring resumes: the sorted lists catch up then
                st[1].append(length)
                st[0].append(length * inv)
                if off is not None:
                    st[2].append(off * inv)
                st[10] = True
                continue
            self._sorted(st)
            _slide(st[1], st[5], length, window)
            _slide(st[0], st[4], length * inv, window)
            if off is not None:
                _slide(st[2], st[6], off * inv, window)
            fresh[key] = st
        self._med = {}
        for st in fresh.values():  # worked out once the iteration is learned (a key may come twice)
            st[8], st[9] = work_out(st, self.tau), prev + 1

    def observe_columns(self, keys: Sequence[str], starts: Sequence[float], ends: Sequence[float], t0: float | None,
                        seconds: float | None, score: bool = True) -> None:
        """:meth:`observe_iteration` of the waits ``zip(keys, ends - starts, starts - t0)`` (as many
        as ``starts``). The same keys as last time, each known with full windows (the torch
        observer's gaps, every iteration), take a shorter pass: no lookup and no check per key."""
        n = len(starts)
        b = self._bulk
        if b is None or b[0] != (keys if len(keys) == n else keys[:n]):
            b = self._bulk = [list(keys[:n]), None, False]
        if t0 is not None and n and b[1] is None:  # each known, with offsets, none twice
            sts = list(map(self._st.get, b[0]))
            if None not in sts and len(set(b[0])) == len(sts) and all(st[2] is not None for st in sts):
                b[1] = sts
        w = self.window
        if score and b[1] is not None and not b[2]:  # every window full, of odd length >= 3: medians in the middle
            b[2] = w >= 3 and w % 2 == 1 and all(st[3] and len(st[0]) == len(st[2]) == len(st[3]) == w for st in b[1])
        sts = b[1]
        if sts is None or t0 is None or score and not b[2]:
            offs = repeat(None) if t0 is None else [s - t0 for s in starts]
            lengths = [e - s for s, e in zip(starts, ends, strict=False)]
            return self.observe_iteration(zip(keys, lengths, offs, strict=False), seconds, score)
        prev, inv, tau = self._new_iteration(seconds)
        self._med = {}
        if not score:
            for st, s, e in zip(sts, starts, ends, strict=False):
                length = e - s
                st[1].append(length)
                st[0].append(length * inv)
                st[2].append((s - t0) * inv)
                st[10] = True
            return
        new_tau, h, gen = self.tau, w // 2, prev + 1
        auto, paced = self.mode == "auto", self.mode == "pace"
        coefs: list[tuple[float, float]] = []
        typical: list[float] = []
        # per wait, as few Python operations as will do (the training step's): full windows, one value leaves
        # as one comes (the same float object, found by identity in the sorted copy, whose middle is the median)
        for st, s, e in zip(sts, starts, ends, strict=False):
            hq, rq, oq, sq, hs, rs, fs, neg, m, mgen, stale = st
            if stale:
                self._sorted(st)
            length = e - s
            off = s - t0
            if length > 0:
                if mgen != prev:
                    m = self._work_out(st, tau)
                d = m[1]
                if d:
                    x = (abs(m[0] * (off + tau) / d - length) - abs(m[2] - length)) / length
                    st[7] = neg = neg - (sq[0] < 0.0) + (x < 0.0)
                    sq.append(x)
            rs.remove(rq[0])
            rq.append(length)
            insort(rs, length)
            x = length * inv
            hs.remove(hq[0])
            hq.append(x)
            insort(hs, x)
            x = off * inv
            fs.remove(oq[0])
            oq.append(x)
            insort(fs, x)
            length, plain, d = hs[h], rs[h], fs[h] + new_tau
            if not (paced or auto and neg > h):
                m = (length, d, plain, False, (0.0, plain), plain)
            elif d <= 0:
                m = (length, d, plain, True, (0.0, length), length)
            else:
                m = (length, d, plain, True, (length / d, length * new_tau / d), length)
            st[8] = m
            st[9] = gen
            coefs.append(m[4])
            typical.append(m[5])
        self._planned = (gen, b[0], coefs, typical)

    def observe(self, key: str, seconds: float, offset: float | None = None) -> None:
        """One wait learned on its own, at the typical pace."""
        self.observe_iteration([(key, seconds, offset)], None)

    def seed(self, lengths: dict[str, float]) -> None:
        """Start from a saved profile (its lengths count as one observation each)."""
        self.observe_iteration([(k, float(v), None) for k, v in lengths.items()], None)

    def medians(self) -> dict[str, float]:
        """Each key's median length as measured (what a saved profile holds)."""
        return {k: statistics.median(v) for k, v in self.raw.items() if v}


def _slide(q: deque, s: list, x: float, window: int) -> None:
    """Append ``x`` to the window ``q`` and its sorted copy ``s`` (whatever leaves ``q`` leaves ``s``)."""
    if len(q) == window:
        s.remove(q[0])
    q.append(x)
    insort(s, x)


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
        # or, booked in one go (book_columns, while _pending is empty): (keys, starts, ends, iter_start)
        self._cols: tuple[Sequence[str], Sequence[float], Sequence[float], float | None] | None = None
        self.free_memory = 0
        self._waits: list[Wait] = []
        self._batches: list[tuple] = []  # waits booked in columns, made Wait records when read (waits)
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
        if self._open is not None:
            self.busy(now)
        self._learn(None if self.iter_start is None else now - self.iter_start, self.enabled)
        self.iter_start = now
        self.iteration = self.iteration + 1 if iteration is None else iteration
        self.iterations_seen += 1
        self._counts.clear()
        self._ordinal = 0
        self.free_memory = free_memory_bytes(self.device)
        if self.stage == 0 and self.pub.sock is not None:  # every event carries the stage's free memory, this one too
            self.pub.emit("iter", 0, "-", now, None, self.free_memory, self.iteration)

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
            self.pub.emit("bubble", self.stage, type, now, now + pred, self.free_memory, self.iteration)
        self._open = (key, type, now, pred, announce, offset)

    def busy(self, now: float | None = None) -> None:
        """The stage computes again (no-op when no wait is open)."""
        if self._open is None:
            return
        now = self.clock() if now is None else now
        key, typ, start, pred, announced, offset = self._open
        self._open = None
        if announced:
            self.pub.emit("busy", self.stage, typ, now, None, self.free_memory, self.iteration)
        if self._cols is not None:
            self._unbatch()
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
        if not (self.enabled and self.iterations_seen > self.warmup_iters):
            n = len(keys)
            return [None] * n, [False] * n
        return self.predictor.plan(keys, self.min_bubble_s)

    def book(self, waits: Iterable[tuple[str, str, float, float, float | None, bool]]) -> None:
        """Waits measured (and announced) by the caller, as (key, type, start, end, predicted,
        announced), booked after the fact as :meth:`busy` books each one."""
        if self._cols is not None:
            self._unbatch()
        it, learn, append, t0 = self.iteration, self._pending.append, self.waits.append, self.iter_start
        for key, typ, start, end, pred, announced in waits:
            learn((key, end - start, None if t0 is None else start - t0))
            append(Wait(it, key, typ, start, end, pred, announced))

    def book_columns(self, keys: Sequence[str], types: Sequence[str], starts: Sequence[float], ends: Sequence[float],
                     preds: Sequence[float | None], announced: Sequence[bool]) -> None:
        """:meth:`book` of ``zip(keys, types, starts, ends, preds, announced)``, without a tuple or a
        record per wait on the training step: the columns are kept (unchanged by the caller after),
        learned from when the iteration ends and made :class:`Wait` records when :attr:`waits` is read."""
        if self._cols is not None or self._pending:
            self.book(zip(keys, types, starts, ends, preds, announced, strict=False))
            return
        self._cols = (keys, starts, ends, self.iter_start)
        self._batches.append((self.iteration, keys, types, starts, ends, preds, announced))

    def _learn(self, seconds: float | None, score: bool) -> None:
        cols = self._cols  # this iteration's waits, learned (it lasted seconds)
        if cols is None:
            pending, self._pending = self._pending, []
            self.predictor.observe_iteration(pending, seconds, score)
        else:
            self._cols = None
            self.predictor.observe_columns(*cols, seconds, score)

    def _unbatch(self) -> None:
        """The waits booked in columns made (key, seconds, offset) in ``_pending``: a wait comes after them."""
        keys, starts, ends, t0 = self._cols
        self._cols = None
        self._pending = [(k, e - s, None if t0 is None else s - t0) for k, s, e in zip(keys, starts, ends, strict=False)]

    @property
    def waits(self) -> list[Wait]:
        if self._batches:  # every wait measured so far, in order
            for it, keys, types, starts, ends, preds, announced in self._batches:
                self._waits.extend(map(Wait, repeat(it), keys, types, starts, ends, preds, announced))
            self._batches.clear()
        return self._waits

    # ------------------------------------------------------------------ harvest blocks
    def control(self, kind: str) -> None:
        """Tell the manager to stop ("off") or resume ("on") harvesting (paired on/off runs)."""
        self.pub.emit(kind, self.stage, "-", self.clock(), None, self.free_memory, self.iteration)

    # ------------------------------------------------------------------ results
    def prediction_errors(self) -> list[float]:
        """|predicted - measured| / measured of every announced wait."""
        return [abs(w.predicted_s - w.seconds) / w.seconds for w in self.waits
                if w.announced and w.predicted_s is not None and w.seconds > 0]

    def profile(self) -> dict[str, float]:
        """Learned median length per key, as measured (reusable as ``profile=`` in a later run);
        the last iteration's waits are learned first."""
        if self._pending or self._cols is not None:
            self._learn(None, True)
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
