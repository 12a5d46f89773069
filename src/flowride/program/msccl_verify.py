"""``flowride verify algo.xml``: an MSCCL algorithm judged by the executor's rules first, then
placed on flowride's schedule model where that model can hold it, to time it.

Why two stages: the executor's rules (:func:`~flowride.program.msccl_rules.check_executor`, a
symbolic run of its kernel in every mode it picks the algorithm for) decide whether the
algorithm is right. The schedule model (:func:`~flowride.program.to_schedule.program_to_schedule`
and the simulator) gives epochs and a finish time, but holds one value per chunk per GPU and has
no local add, so some correct algorithms (receives into scratch reduced later, as in the
executor's own one-pass all-pairs AllReduce) cannot be placed on it; those are still valid,
just not timed, and the verdict says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flowride.program.msccl_read import from_msccl_xml, read_msccl_text
from flowride.program.msccl_rules import ExecutorReport, check_executor
from flowride.program.msccl_xml import parse_algo
from flowride.program.to_schedule import place_and_time
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import SimResult


@dataclass
class MscclVerdict:
    """A valid algorithm: what the executor's rules checked, and its schedule and replay when the
    schedule model could place it (else ``unplaced`` says why)."""

    name: str
    collective: str
    ngpus: int
    report: ExecutorReport
    schedule: Schedule | None = None
    sim: SimResult | None = None
    unplaced: str = ""


def verify_msccl(path: str | Path, *, sms: int | str | None = None) -> MscclVerdict:
    """Verify the MSCCL algorithm XML at ``path`` (``sms``: the target GPU's SM count or name).
    Raises :class:`~flowride.errors.InvalidSchedule` when the executor would run it wrong (a
    deadlock, a race, a wrong result, a dependency that never releases, too many thread blocks)
    and :class:`~flowride.errors.InputError` when it cannot be read."""
    text, name = read_msccl_text(path)
    algo = parse_algo(text, name)
    report = check_executor(algo, sms=sms)
    verdict = MscclVerdict(algo.name, algo.coll.value, algo.n, report)
    verdict.schedule, verdict.sim, verdict.unplaced = place_and_time(lambda: from_msccl_xml(text, name))
    return verdict
