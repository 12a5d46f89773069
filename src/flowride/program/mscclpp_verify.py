"""``flowride verify plan.json`` for an MSCCL++ execution plan: the executor's rules, a symbolic
run proving the outputs equal the collective's definition, and, where flowride's schedule model
can hold the plan, its timing.

As for MSCCL XML (:mod:`flowride.program.msccl_verify`), the rules and the run decide whether the
plan is right; the plan read into a Program (:mod:`flowride.program.mscclpp_read`) and turned into
a schedule on a full mesh of its GPUs (:func:`~flowride.program.to_schedule.program_to_schedule`)
gives epochs and a finish time. A plan the schedule model cannot hold (a local add of two chunks
no transfer delivered, several partial sums of one chunk at once) is still valid, just not timed,
and the verdict says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from flowride.program.mscclpp_read import checked_run, load_plan, plan_to_program
from flowride.program.mscclpp_rules import check_limits
from flowride.program.to_schedule import place_and_time
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import SimResult


@dataclass
class MscclppVerdict:
    """A valid plan: what was checked, and its schedule and replay when the schedule model could
    place it (else ``unplaced`` says why)."""

    name: str
    collective: str
    ngpus: int
    protocol: str
    inplace: bool
    thread_blocks: int  # most thread blocks on one GPU
    ops: int  # ops the symbolic run executed
    chunks_moved: int  # chunks written into, or read from, another GPU's memory
    schedule: Schedule | None = None
    sim: SimResult | None = None
    unplaced: str = ""
    limits: list[str] = field(default_factory=list)  # what the plan exceeds of the executor's fixed tables (check_limits)

    def summary(self) -> str:
        return (f"MSCCL++ rules hold and the symbolic run computes the {self.collective} ({self.protocol}, "
                f"{'in place' if self.inplace else 'out of place'}, {self.ops} ops, {self.chunks_moved} chunk moves between GPUs, "
                f"up to {self.thread_blocks} thread block(s) per GPU)")


def verify_mscclpp(path: str | Path) -> MscclppVerdict:
    """Verify the MSCCL++ execution plan at ``path``. Raises
    :class:`~flowride.errors.InvalidSchedule` when it breaks a rule or computes the wrong thing
    (a race, a deadlock, an unmatched signal, a wrong result) and :class:`~flowride.errors.InputError`
    when it cannot be read."""
    plan = load_plan(path)
    res = checked_run(plan)
    verdict = MscclppVerdict(plan.name, plan.collective, plan.ngpus, plan.protocol, plan.inplace,
                             max(len(g.threadblocks) for g in plan.gpus), res.ops, res.chunks_moved, limits=check_limits(plan))
    verdict.schedule, verdict.sim, verdict.unplaced = place_and_time(lambda: plan_to_program(plan, res))
    return verdict
