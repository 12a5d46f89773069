"""Every private name of torch.distributed.pipelining that flowride relies on, in one place.

torch's pipelining has no public per-action hook (users have asked for one), so watching a
schedule run means reading a few private names. They live here, and only here, each checked
against the installed torch: when a future torch renames one, :func:`check` raises
:class:`TorchPipeliningChanged` naming the missing attribute and the torch version, instead of
a training job failing somewhere deep inside a wrapper.

What we read, and why:

- ``schedules._Action`` (``stage_index``, ``computation_type``, ``microbatch_index`` and, since
  torch 2.8, ``sub_actions``) and ``schedules._ComputationType``: the action IR of
  ``schedule.pipeline_order`` (per-rank lists), from which the bubble plan is derived;
- ``schedule._stage`` (single-stage schedules) / ``schedule._stages`` (multi-stage ones),
  ``_n_microbatches`` and ``_num_stages``, and ``stage_index_to_group_rank`` (which rank holds
  which stage; V-shaped schedules do not place stage j on rank j mod p);
- the stage methods ``forward_one_chunk``, ``backward_one_chunk`` (its ``full_backward`` flag
  tells a full backward B from an input-gradient-only I) and ``backward_weight_one_chunk`` (W):
  wrapping them on the stage *instance* sees every compute action after the receive it waited
  for, without changing torch's source or its numerics;
- ``schedule.step`` (public): the iteration's start and end;
- ``distributed_c10d._get_default_store()``: the key-value store the process group was set up
  with, through which ``attach``'s set-up agrees across ranks with a timeout (a collective would
  hang without a word when one rank never calls ``attach``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STAGE_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")

# torch's schedule classes by the names flowride's CLI uses, with the class name in torch.
SCHEDULE_CLASSES: dict[str, str] = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved1f1b": "ScheduleInterleaved1F1B",
    "loopedbfs": "ScheduleLoopedBFS",
    "interleavedzb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
# Schedules that hold two stages per rank in a V (stage r and 2p-1-r on rank r).
V_SHAPED = frozenset({"zbv", "dualpipev"})


class TorchPipeliningChanged(RuntimeError):
    """The installed torch lacks a name flowride reads; says which one and which torch."""

    def __init__(self, what: str) -> None:
        import torch

        self.what = what
        super().__init__(
            f"torch {torch.__version__}: torch.distributed.pipelining has no {what}; flowride's "
            "bubble observer was written against torch 2.4-2.13 (see flowride/pipeline/torch_compat.py)"
        )


def _schedules_module() -> Any:
    try:
        from torch.distributed.pipelining import schedules
    except ImportError as e:  # torch built without distributed
        raise TorchPipeliningChanged(f"importable schedules module ({e})") from None
    return schedules


def check() -> None:
    """Raise :class:`TorchPipeliningChanged` unless every name this module reads exists."""
    sch = _schedules_module()
    for name in ("_Action", "_ComputationType", "PipelineScheduleSingle", "PipelineScheduleMulti"):
        if not hasattr(sch, name):
            raise TorchPipeliningChanged(f"schedules.{name}")
    for field in ("stage_index", "computation_type", "microbatch_index"):
        if field not in sch._Action._fields:
            raise TorchPipeliningChanged(f"_Action.{field}")
    from torch.distributed.pipelining import stage as stage_mod

    base = getattr(stage_mod, "_PipelineStageBase", None)
    if base is None:
        raise TorchPipeliningChanged("stage._PipelineStageBase")
    for m in STAGE_METHODS:
        if not callable(getattr(base, m, None)):
            raise TorchPipeliningChanged(f"_PipelineStageBase.{m}")


def check_schedule(obj: Any) -> None:
    """Raise an InputError naming what was given unless ``obj`` is a schedule *instance*.

    The usual mistakes (the stage, the model, the schedule class, a list of stages) would
    otherwise surface later as a missing private attribute, blamed on the torch version."""
    from flowride.errors import InputError

    sch = _schedules_module()
    bases = (sch.PipelineScheduleSingle, sch.PipelineScheduleMulti)
    if isinstance(obj, bases):
        return
    want = ("a torch.distributed.pipelining schedule instance (a PipelineScheduleSingle or "
            "PipelineScheduleMulti subclass, e.g. Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B)")
    build = "build it from your stage(s), e.g. schedule = Schedule1F1B(stage, n_microbatches, loss_fn=loss_fn), and pass schedule"
    if isinstance(obj, type) and issubclass(obj, bases):
        raise InputError("schedule", f"expected {want}; got the class {obj.__name__} itself, not an instance", build)
    from torch.distributed.pipelining import stage as stage_mod

    what = type(obj).__name__
    if isinstance(obj, getattr(stage_mod, "_PipelineStageBase", ())):
        what = f"a pipeline stage ({what}, stage {getattr(obj, 'stage_index', '?')})"
    elif isinstance(obj, list | tuple):
        what = f"a {what} of {len(obj)} item(s) ({', '.join(sorted({type(x).__name__ for x in obj})) or 'empty'})"
    else:
        import torch.nn as nn

        kind = "a torch.nn.Module" if isinstance(obj, nn.Module) else "an object"
        what = f"{kind} of type {type(obj).__module__}.{what}"
    raise InputError("schedule", f"expected {want}; got {what}", build)


def default_store() -> Any | None:
    """The default process group's key-value store (None if torch has no such accessor any more:
    callers fall back to collectives without a timeout)."""
    from torch.distributed import distributed_c10d

    get = getattr(distributed_c10d, "_get_default_store", None)
    if get is None:
        return None
    try:
        return get()
    except (RuntimeError, ValueError):
        return None


def schedule_class(name: str) -> type:
    """torch's class for one of :data:`SCHEDULE_CLASSES`; an older torch may lack some."""
    from flowride.errors import InputError

    key = name.lower()
    if key not in SCHEDULE_CLASSES:
        raise InputError("--schedule", f"unknown torch schedule {name!r}", f"use one of {', '.join(SCHEDULE_CLASSES)}")
    cls = getattr(_schedules_module(), SCHEDULE_CLASSES[key], None)
    if cls is None:
        import torch

        raise InputError("--schedule", f"torch {torch.__version__} has no {SCHEDULE_CLASSES[key]}", "upgrade torch or pick another schedule")
    return cls


def available_schedules() -> list[str]:
    sch = _schedules_module()
    return [k for k, v in SCHEDULE_CLASSES.items() if hasattr(sch, v)]


def is_multi(schedule: Any) -> bool:
    """True for schedules that hold several stages per rank (PipelineScheduleMulti)."""
    return isinstance(schedule, _schedules_module().PipelineScheduleMulti)


def local_stages(schedule: Any) -> list[Any]:
    """The stage objects this rank runs."""
    if is_multi(schedule):
        stages = getattr(schedule, "_stages", None)
        if stages is None:
            raise TorchPipeliningChanged("PipelineScheduleMulti._stages")
        return list(stages)
    stage = getattr(schedule, "_stage", None)
    if stage is None:
        raise TorchPipeliningChanged("PipelineScheduleSingle._stage")
    return [stage]


def n_microbatches(schedule: Any) -> int:
    n = getattr(schedule, "_n_microbatches", None)
    if n is None:
        raise TorchPipeliningChanged("_PipelineSchedule._n_microbatches")
    return int(n)


def group_rank(schedule: Any) -> int:
    """This process's rank in the pipeline group."""
    return int(local_stages(schedule)[0].group_rank)


def group_size(schedule: Any) -> int:
    return int(local_stages(schedule)[0].group_size)


def stage_to_rank(schedule: Any) -> dict[int, int]:
    """Which pipeline rank holds each stage index."""
    if is_multi(schedule):
        mapping = getattr(schedule, "stage_index_to_group_rank", None)
        if mapping is None:
            raise TorchPipeliningChanged("PipelineScheduleMulti.stage_index_to_group_rank")
        return {int(k): int(v) for k, v in mapping.items()}
    n = int(local_stages(schedule)[0].num_stages)
    return {s: s for s in range(n)}


@dataclass(frozen=True)
class Act:
    """One compute action of a torch schedule, in flowride's terms.

    ``kind``: ``F`` forward, ``B`` full backward, ``I`` input-gradient backward, ``W`` weight
    gradient (torch's letters). ``stage`` is the global stage index, ``mb`` the micro-batch.
    """

    kind: str
    stage: int
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"


_COMPUTE = {"F": "F", "B": "B", "I": "I", "W": "W"}


def compute_actions(schedule: Any) -> dict[int, list[Act]] | None:
    """Per-rank compute actions of ``schedule.pipeline_order``, in execution order.

    Idle (None) slots and non-compute actions (sends, receives, REDUCE_GRAD, UNSHARD...) are
    dropped; an OVERLAP_F_B action is replaced by its sub-actions (run one after the other).
    Single-stage schedules (GPipe, 1F1B) run a hand-written loop that walks micro-batches in
    order, and their ``pipeline_order`` is only a description of it (torch 2.13's 1F1B numbers
    the last rank's forwards from 1): their micro-batch numbers are taken in order of appearance,
    which is what the loop runs. None if the schedule publishes no order.
    """
    order = getattr(schedule, "pipeline_order", None)
    if not order:
        return None
    single = not is_multi(schedule)
    out: dict[int, list[Act]] = {}
    for rank, actions in order.items():
        flat: list[Act] = []
        for a in actions:
            if a is None:
                continue
            for leaf in getattr(a, "sub_actions", None) or (a,):
                kind = _COMPUTE.get(leaf.computation_type.value)
                if kind is None:
                    continue
                flat.append(Act(kind, int(leaf.stage_index), int(leaf.microbatch_index)))
        if single:
            seen: dict[tuple[int, str], int] = {}
            renumbered = []
            for a in flat:
                k = (a.stage, a.kind)
                renumbered.append(Act(a.kind, a.stage, seen.get(k, 0)))
                seen[k] = seen.get(k, 0) + 1
            flat = renumbered
        out[int(rank)] = flat
    return out


def action_of_call(method: str, args: tuple, kwargs: dict, stage_index: int) -> Act:
    """The compute action a call of one of :data:`STAGE_METHODS` performs."""
    mb = int(args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id", -1)))
    if method == "forward_one_chunk":
        return Act("F", stage_index, mb)
    if method == "backward_one_chunk":
        full = kwargs.get("full_backward", args[2] if len(args) > 2 else True)
        return Act("B" if full else "I", stage_index, mb)
    return Act("W", stage_index, mb)


def local_stage_indices(name: str, p: int, v: int, rank: int) -> list[int]:
    """The stage indices rank ``rank`` holds: ``rank + k*p`` (looped/interleaved), or the V
    shape ``rank, 2p-1-rank`` (ZBV, DualPipeV)."""
    if name.lower() in V_SHAPED:
        return [rank, 2 * p - 1 - rank]
    return [rank + k * p for k in range(v)]


def dry_schedule(name: str, p: int, m: int, v: int, rank: int = 0) -> Any:
    """Build torch's schedule object for ``p`` ranks, ``m`` micro-batches and ``v`` stages per
    rank without a process group, from stand-in stages that carry only the fields a schedule's
    constructor reads. Used to check a configuration (torch's own ValueError becomes an
    InputError) and to read its action lists before any process starts.
    """
    from types import SimpleNamespace

    from flowride.errors import InputError

    cls = schedule_class(name)
    multi = issubclass(cls, _schedules_module().PipelineScheduleMulti)
    if multi and name.lower() in V_SHAPED and v != 2:
        raise InputError("--chunks", f"{name} holds exactly 2 stages per rank (a V), got {v}", "pass --chunks 2")
    if multi and v < 2:
        raise InputError("--chunks", f"{name} runs several stages per rank, got {v}", "pass --chunks 2 or more")
    if not multi and v != 1:
        raise InputError("--chunks", f"{name} runs one stage per rank, got {v}", "pass --chunks 1, or a multi-stage schedule")
    n = p * v

    def stand_in(idx: int) -> Any:
        return SimpleNamespace(stage_index=idx, num_stages=n, group_size=p, group_rank=rank,
                               is_first=idx == 0, is_last=idx == n - 1, submod=None)

    try:
        if multi:
            return cls([stand_in(j) for j in local_stage_indices(name, p, v, rank)], m)
        return cls(stand_in(rank), m)
    except (ValueError, AssertionError, RuntimeError) as e:
        raise InputError("--microbatches", f"torch's {cls.__name__} refuses p={p}, m={m}, v={v}: {e}",
                         "change the micro-batches, stages or chunks") from None
