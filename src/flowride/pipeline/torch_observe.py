"""Watch a torch.distributed.pipelining schedule run and report its bubbles, without changing it.

:func:`observe` wraps, on this rank's stage *instances* only, the three compute methods
(``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``) and the
schedule's ``step``. A wrapper reads the clock (entering a compute method: the receive it waited
for is done; leaving one: the stage waits again) and calls the original with the same
arguments: the numerics are torch's own, so losses are bit-identical with and without it.

The wrappers run on every compute action, between torch's kernels, with cold caches: measured
inside a training step, each Python line there costs several times what it costs in a loop.
So they do as little as possible. Whether each gap of the coming iteration will be announced,
and with which predicted length, is decided once when ``step()`` is entered
(:meth:`BubbleReporter.gap_plan`); a wrapper only appends the time and, for an announced gap,
sends its datagram; the waits are booked with the reporter in one go when ``step()`` returns
(:meth:`BubbleReporter.book_columns`). The reporter sees the same waits, keys (``"{gap}#0"``) and
predictions as if each gap had been reported through ``idle()``/``busy()``.

Gap ``i`` of an iteration is the wait before the rank's compute action ``i`` (gap 0 starts when
``step()`` is entered, the last gap ends when it returns); its type comes from the plan that the
schedule's own action list implies (:mod:`flowride.pipeline.torch_plan`). Its length is learned
online by the reporter from earlier iterations.

On CUDA the host clock says nothing about the GPU unless the two meet: kernels and NCCL
receives are queued, and a compute method returns as soon as its kernels are. With
``sync=True`` (the default when the stage is on a GPU) each wrapper synchronizes the device on
entry (so the receive the action waits for has really arrived) and on exit (so its kernels have
really run). The numerics are unchanged; the cost is the launch overlap between consecutive
actions.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from flowride.pipeline import torch_compat as tc
from flowride.pipeline.reporter import BubbleReporter
from flowride.pipeline.torch_plan import RankPlan, plan


class TorchObserver:
    """The wrappers on one rank's schedule; :meth:`detach` puts the originals back,
    :meth:`install` puts the wrappers on again (a paused harvest costs training nothing)."""

    def __init__(self, schedule: Any, reporter: BubbleReporter, steady: bool = True, sync: bool | None = None,
                 owns_iterations: bool = True) -> None:
        tc.check()
        self.schedule = schedule
        self.reporter = reporter
        # each step() is an iteration for the reporter, unless the caller marks iterations itself
        self.owns_iterations = owns_iterations
        self.rank = tc.group_rank(schedule)
        self.stages = tc.local_stages(schedule)
        dev = getattr(self.stages[0], "device", None)
        self.cuda = dev if getattr(dev, "type", None) == "cuda" else None
        self.sync = (self.cuda is not None) if sync is None else (sync and self.cuda is not None)
        full = plan(schedule, iterations=2 if steady else 1)
        self.plan: RankPlan | None = None if full is None else full.get(self.rank)
        # the plan as (kind, stage, mb) tuples, and each gap's type and key, for the per-call work
        self._expected: list[tuple[str, int, int]] | None = (
            None if self.plan is None else [(a.kind, a.stage, a.mb) for a in self.plan.actions])
        self._types: list[str] = list(self.plan.types) if self.plan is not None else ["A"]
        self._keys: list[str] = [f"{g}#0" for g in range(len(self._types))]
        self.observed: list[tuple[str, int, int]] = []  # this iteration's compute actions, in order
        self.first_order: list[tc.Act] | None = None  # the first iteration's, for plan checks
        self.plan_mismatches = 0
        # this iteration: gap g runs _starts[g] -> _ends[g]; action g runs _ends[g] -> _starts[g + 1]
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._coefs: list[tuple[float, float] | None] = []  # each gap's prediction a * offset + b, decided at step()
        self._preds: list[float | None] = []  # each gap's predicted length, as announced (None: not announced)
        self._ann: list[bool] = []  # each gap announced or not, decided at step()
        self._open_ann = False  # the open gap was announced: its end is announced too
        self._in_step = False
        self._saved: list[tuple[Any, str, Any]] = []
        self.install()

    # ------------------------------------------------------------------ wrapping
    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def install(self) -> None:
        """Wrap this rank's stage methods and ``schedule.step`` (no-op when already wrapped)."""
        if self._saved:
            return
        for stage in self.stages:
            for name in tc.STAGE_METHODS:
                self._wrap(stage, name, self._compute_wrapper(getattr(stage, name), name, int(stage.stage_index)))
        self._wrap(self.schedule, "step", self._step_wrapper(self.schedule.step))

    def _wrap(self, obj: Any, name: str, fn: Any) -> None:
        had_own = name in vars(obj)
        self._saved.append((obj, name, vars(obj)[name] if had_own else None))
        setattr(obj, name, fn)

    def detach(self) -> None:
        """Put torch's own methods back: from now on the schedule runs exactly as without us."""
        for obj, name, own in reversed(self._saved):
            if own is None:
                delattr(obj, name)
            else:
                setattr(obj, name, own)
        self._saved.clear()

    # ------------------------------------------------------------------ records
    @property
    def records(self) -> list[dict]:
        """This iteration's compute records (start == compute: the wait before is a gap)."""
        return [{"kind": k, "mb": mb, "chunk": st, "start": t0, "compute": t0, "end": t1}
                for (k, st, mb), t0, t1 in zip(self.observed, self._ends, self._starts[1:], strict=False)]

    def _type(self, gap: int) -> str:
        if gap >= len(self._types):
            return "S" if gap > 0 else "A"
        if self.plan is not None and gap == len(self._types) - 1 and len(self.observed) != len(self.plan.actions):
            return "S"  # the run went past the plan: keep typing honest
        return self._types[gap]

    def _key(self, gap: int) -> str:
        while gap >= len(self._keys):
            self._keys.append(f"{len(self._keys)}#0")
        return self._keys[gap]

    def _announce(self, gap: int, now: float) -> None:
        """Gap ``gap`` starts now: send its bubble event if it was planned to be announced. A gap
        past the plan (or with no plan) is decided here, the slow way."""
        if gap >= len(self._ann):
            coefs, ann = self.reporter.gap_plan([self._key(gap)])
            self._coefs.append(coefs[0])
            self._ann.append(ann[0])
        if self._ann[gap]:
            rep = self.reporter
            a, b = self._coefs[gap]
            pred = a * (now - rep.iter_start) + b  # the pace this iteration runs at, read off where it is
            preds = self._preds
            if gap >= len(preds):
                preds.extend([None] * (gap + 1 - len(preds)))
            preds[gap] = pred
            pub = rep.pub
            if pub.sock is not None:  # with no socket there is nothing to build
                pub.emit("bubble", rep.stage, self._type(gap), now, now + pred, rep.free_memory, rep.iteration)
            self._open_ann = True

    def _end_announced(self, gap: int, now: float) -> None:
        self._open_ann = False
        rep = self.reporter
        pub = rep.pub
        if pub.sock is not None:
            pub.emit("busy", rep.stage, self._type(gap), now, None, rep.free_memory, rep.iteration)

    # ------------------------------------------------------------------ the wrappers
    def _compute_wrapper(self, orig: Any, method: str, stage_index: int) -> Any:
        clock = time.monotonic
        obs = self
        kind_of = "F" if method == "forward_one_chunk" else ("W" if method == "backward_weight_one_chunk" else None)

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not obs._in_step:  # called outside step() (evaluation): not a pipeline action
                return orig(*args, **kwargs)
            if obs.sync:
                torch.cuda.synchronize(obs.cuda)  # the input this action waited for is really here
            t0 = clock()
            ends = obs._ends
            gap = len(ends)  # the gap before this action ends now
            ends.append(t0)
            if obs._open_ann:
                obs._end_announced(gap, t0)
            mb = args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id", -1))
            kind = kind_of
            if kind is None:  # backward_one_chunk: full B, or the input-gradient half I
                kind = "B" if kwargs.get("full_backward", args[2] if len(args) > 2 else True) else "I"
            obs.observed.append((kind, stage_index, mb))  # held against the plan once the step is done (_book)
            try:
                return orig(*args, **kwargs)
            finally:
                if obs.sync:
                    torch.cuda.synchronize(obs.cuda)  # its kernels have really run
                t1 = clock()
                obs._starts.append(t1)  # the action's end: _ends[gap] -> _starts[gap + 1] (records)
                gap += 1
                ann = obs._ann
                if gap >= len(ann) or ann[gap]:
                    obs._announce(gap, t1)

        return wrapper

    def _step_wrapper(self, orig: Any) -> Any:
        clock = time.monotonic
        obs = self

        @functools.wraps(orig)
        def step(*args: Any, **kwargs: Any) -> Any:
            if obs._in_step:
                return orig(*args, **kwargs)
            rep = obs.reporter
            if obs.owns_iterations:
                rep.begin_iteration()
            obs.observed, obs._ends = [], []
            obs._coefs, obs._ann = rep.gap_plan(obs._keys)
            obs._preds = [None] * len(obs._keys)
            obs._open_ann = False
            t = clock()
            obs._starts = [t]
            obs._announce(0, t)
            obs._in_step = True
            try:
                return orig(*args, **kwargs)
            finally:
                obs._in_step = False
                t = clock()
                obs._ends.append(t)
                if obs._open_ann:
                    obs._end_announced(len(obs._ends) - 1, t)
                obs._book()
                if obs.first_order is None:
                    obs.first_order = [tc.Act(k, int(s), int(m)) for k, s, m in obs.observed]

        return step

    def _book(self) -> None:
        """Hand this iteration's gaps to the reporter (lengths learned, waits recorded), and
        count the actions that differ from the plan (one list comparison, off the per-call path)."""
        exp, seen = self._expected, self.observed
        if exp is not None and seen != exp:
            self.plan_mismatches += sum(1 for g, act in enumerate(seen) if g >= len(exp) or exp[g] != act)
        n = len(self._ends)
        if len(self._preds) < n:  # gaps past the plan, not announced: nothing predicted
            self._preds.extend([None] * (n - len(self._preds)))
        if len(self._ann) < n:
            self._ann.extend([False] * (n - len(self._ann)))
        if n == len(self._types) and (self.plan is None or len(self.observed) == len(self.plan.actions)):
            # the usual iteration, as planned: every gap's key and type are the precomputed ones
            self.reporter.book_columns(self._keys, self._types, self._starts, self._ends, self._preds, self._ann)
            return
        self.reporter.book([(self._key(g), self._type(g), self._starts[g], self._ends[g], self._preds[g], self._ann[g])
                            for g in range(n)])

    def gap_types(self) -> list[str]:
        """Types of this rank's gaps (one more than its compute actions)."""
        n = len(self.first_order if self.first_order is not None else (self.plan.actions if self.plan else []))
        return [self._type(i) for i in range(n + 1)]


def observe(schedule: Any, reporter: BubbleReporter, steady: bool = True, sync: bool | None = None,
            owns_iterations: bool = True) -> TorchObserver:
    """Start reporting ``schedule``'s bubbles on this rank through ``reporter`` (``sync``: see the
    module docstring; default on for a GPU stage). ``owns_iterations=False`` when the caller
    marks iterations on the reporter itself (flowride's torch engine does)."""
    return TorchObserver(schedule, reporter, steady, sync, owns_iterations)
