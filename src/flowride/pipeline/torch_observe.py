"""Watch a torch.distributed.pipelining schedule run and report its bubbles, without changing it.

:func:`observe` wraps, on this rank's stage *instances* only, the three compute methods
(``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``) and the
schedule's ``step``. A wrapper reads the clock, tells the :class:`BubbleReporter` that the stage
computes again (entering a compute method: the receive it waited for is done) or waits again
(leaving one), and calls the original with the same arguments: the numerics are torch's own,
so losses are bit-identical with and without it.

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
    """The wrappers on one rank's schedule; :meth:`detach` puts the originals back."""

    def __init__(self, schedule: Any, reporter: BubbleReporter, steady: bool = True, sync: bool | None = None,
                 owns_iterations: bool = True) -> None:
        tc.check()
        self.schedule = schedule
        self.reporter = reporter
        # each step() is an iteration for the reporter, unless the caller marks iterations itself
        self.owns_iterations = owns_iterations
        self.rank = tc.group_rank(schedule)
        dev = getattr(tc.local_stages(schedule)[0], "device", None)
        self.cuda = dev if getattr(dev, "type", None) == "cuda" else None
        self.sync = (self.cuda is not None) if sync is None else (sync and self.cuda is not None)
        full = plan(schedule, iterations=2 if steady else 1)
        self.plan: RankPlan | None = None if full is None else full.get(self.rank)
        self.observed: list[tc.Act] = []  # this iteration's compute actions, in order
        self.first_order: list[tc.Act] | None = None  # the first iteration's, for plan checks
        self.plan_mismatches = 0
        self.records: list[dict] = []  # this iteration's compute records (start == compute: the wait is a gap)
        self._saved: list[tuple[Any, str, Any]] = []
        for stage in tc.local_stages(schedule):
            for name in tc.STAGE_METHODS:
                self._wrap(stage, name, self._compute_wrapper(getattr(stage, name), name, int(stage.stage_index)))
        self._wrap(schedule, "step", self._step_wrapper(schedule.step))

    # ------------------------------------------------------------------ wrapping
    def _wrap(self, obj: Any, name: str, fn: Any) -> None:
        had_own = name in vars(obj)
        self._saved.append((obj, name, vars(obj)[name] if had_own else None))
        setattr(obj, name, fn)

    def detach(self) -> None:
        for obj, name, own in reversed(self._saved):
            if own is None:
                delattr(obj, name)
            else:
                setattr(obj, name, own)
        self._saved.clear()

    def _type(self, gap: int) -> str:
        if self.plan is None or gap >= len(self.plan.types):
            return "S" if gap > 0 else "A"
        if gap == len(self.plan.types) - 1 and len(self.observed) != len(self.plan.actions):
            return "S"  # the run went past the plan: keep typing honest
        return self.plan.types[gap]

    def _compute_wrapper(self, orig: Any, method: str, stage_index: int) -> Any:
        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.sync:
                torch.cuda.synchronize(self.cuda)  # the input this action waited for is really here
            t0 = time.monotonic()
            self.reporter.busy(t0)
            act = tc.action_of_call(method, args, kwargs, stage_index)
            pos = len(self.observed)
            if self.plan is not None and (pos >= len(self.plan.actions) or self.plan.actions[pos] != act):
                self.plan_mismatches += 1
            self.observed.append(act)
            try:
                return orig(*args, **kwargs)
            finally:
                if self.sync:
                    torch.cuda.synchronize(self.cuda)  # its kernels have really run
                t1 = time.monotonic()
                self.records.append({"kind": act.kind, "mb": act.mb, "chunk": act.stage, "start": t0, "compute": t0, "end": t1})
                self.reporter.idle(pos + 1, self._type(pos + 1))

        return wrapper

    def _step_wrapper(self, orig: Any) -> Any:
        @functools.wraps(orig)
        def step(*args: Any, **kwargs: Any) -> Any:
            self.observed = []
            self.records = []
            if self.owns_iterations:
                self.reporter.begin_iteration()
            self.reporter.idle(0, "A")
            try:
                return orig(*args, **kwargs)
            finally:
                self.reporter.busy()
                if self.first_order is None:
                    self.first_order = list(self.observed)

        return step

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
