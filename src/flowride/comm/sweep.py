"""One program run at many sizes, reported the way nccl-tests reports ``all_gather_perf -b 8 -e 1G
-f 2``: per size, out of place, flowride's schedule and torch.distributed's own collective on the
same data, each with nccl-tests' columns (size, count, type, redop, time, algbw, busbw, #wrong).

Every size runs in one launch (:func:`flowride.comm.launch.run_schedules`), so the ranks start
once. Sizes are first rounded as a run rounds them (:func:`flowride.schedule.metrics.run_bytes`:
whole float32 elements, a multiple of n*C of them); sizes that round to the same bytes run once.
Times are the median over repeats of the slowest rank (nccl-tests: the mean over iterations).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from flowride.comm.launch import as_program, run_schedules
from flowride.comm.result import RunResult
from flowride.errors import InputError
from flowride.program import Program
from flowride.schedule.ir import Schedule
from flowride.schedule.metrics import (
    ELEMENT_BYTES,
    ELEMENT_TYPE,
    algbw_GBps,
    busbw_GBps,
    nccl_count,
    redop,
    run_bytes,
)


@dataclass
class SizeRow:
    """One size of a run sweep: nccl-tests' columns for ours and for torch.distributed."""

    size: int  # bytes per rank that ran (nccl-tests' size column, in flowride's convention: the same)
    count: int  # nccl-tests' count column
    type: str
    redop: str
    time_us: float | None
    algbw_GBps: float | None
    busbw_GBps: float | None
    wrong: int  # output elements off the definition, over all ranks (nccl-tests' #wrong)
    torch_time_us: float | None
    torch_algbw_GBps: float | None
    torch_busbw_GBps: float | None
    torch_wrong: int
    errors: list[str] = field(default_factory=list)  # the first wrong chunks, named
    requested: list[int] = field(default_factory=list)  # the sweep's sizes that rounded to this one
    device: str = ""  # cpu or cuda (times measured on CPU are CPU numbers)
    backend: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def row_of(res: RunResult, requested: list[int]) -> SizeRow:
    """nccl-tests' columns of one :class:`RunResult`."""
    coll, n, size = res.collective, res.ranks, res.actual_bytes

    def cols(sec: float | None) -> tuple[float | None, float | None, float | None]:
        if not sec:
            return None, None, None
        return sec * 1e6, algbw_GBps(size, sec), busbw_GBps(coll, n, size, sec)

    t, a, b = cols(res.ours_median_s)
    tt, ta, tb = cols(res.torch_median_s)
    return SizeRow(size, nccl_count(coll, n, size), ELEMENT_TYPE, redop(coll), t, a, b, res.wrong_elements, tt, ta, tb,
                   res.torch_wrong_elements, list(res.errors[:5]), list(requested), res.device, res.backend)


def sweep_plan(program: Program, sizes: list[int]) -> dict[int, list[int]]:
    """The bytes each requested size runs at (rounded as a run rounds them), in order, with the
    requested sizes each covers."""
    if not sizes:
        raise InputError("sizes", "none given", "give at least one size")
    plan: dict[int, list[int]] = {}
    for s in sorted(sizes):
        if not isinstance(s, int) or s < 1:
            raise InputError("sizes", f"{s!r} is not a positive size", "give sizes in bytes")
        plan.setdefault(run_bytes(s, program.ngpus, program.chunks, ELEMENT_BYTES), []).append(s)
    return plan


def run_sweep(schedule_or_program: Schedule | Program, sizes: list[int], repeats: int = 5, warmup: int = 1,
              timeout_s: float = 600.0, progress: Callable[[dict], None] | None = None, **run_kw) -> list[SizeRow]:
    """Run the program at every size in one launch and return nccl-tests' rows, smallest first.
    ``run_kw`` goes to :func:`~flowride.comm.launch.run_schedules` (mode, backend, device, ...).
    Wrong outputs show in the rows (``wrong``, ``errors``); a crash or hang raises
    :class:`~flowride.comm.launch.CommFailed`."""
    prog = as_program(schedule_or_program)
    plan = sweep_plan(prog, sizes)
    results = run_schedules([prog] * len(plan), size_bytes=list(plan), repeats=repeats, warmup=warmup, timeout_s=timeout_s,
                            progress=progress, **run_kw)
    return [row_of(res, req) for res, req in zip(results, plan.values(), strict=True)]
