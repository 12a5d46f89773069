"""What a search returns, whichever method ran it: the probes it made and the best schedule.

The horizon bisection (:mod:`flowride.synth.horizon`), the LP route (:mod:`flowride.synth.lp_search`),
the packed trees (:mod:`flowride.synth.trees`) and the A* rounds (:mod:`flowride.synth.astar`) all
answer with a :class:`SearchResult` made of :class:`Probe` records, and report progress as plain
dict events through a :data:`Progress` callback (the CLI draws them with rich).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Progress = Callable[[dict], None]  # a search's progress events, e.g. {"stage": "probe", "T": 12, ...}
Send = tuple[int, int, int, int]  # (epoch, link, source GPU, chunk): a send as the searches pass it around


@dataclass
class Probe:
    T: int
    outcome: str  # feasible | infeasible | timeout
    seconds: float
    columns: int
    rows: int


@dataclass
class SearchResult:
    sends: list[tuple[int, int, int, int]] | None  # None: nothing better than the upper-bound schedule
    T: int  # horizon of the best schedule found (its real finish may be earlier)
    lower: int  # every horizon below this is proven (or bounded) infeasible
    timed_out: bool
    probes: list[Probe] = field(default_factory=list)
    gave_up: bool = False  # the solver stopped on a probe for another reason than time
    solver_seconds: float = 0.0

    @property
    def proven_minimal(self) -> bool:
        return not self.timed_out and not self.gave_up and self.lower >= self.T
