"""Synthesis options: one frozen :class:`SynthOptions` passed down whole, and the speed-ups of the
minimum-makespan search, which a caller can switch one by one."""

from __future__ import annotations

from dataclasses import dataclass, replace

from flowride.collectives.demand import Demand
from flowride.errors import InputError
from flowride.synth.budget import MEMORY_LIMIT_BYTES


@dataclass(frozen=True)
class Speedups:
    """What the minimum-makespan MILP search uses beyond plain bisection. Each is measured on
    its own in ``benchmarks/teccl_compare.py --ablation`` (docs/benchmarks.md); the defaults keep
    what helped there.

    - ``incumbent``: the packed trees (AllGather) cap the search before any probe (else the
      ring or direct baseline does);
    - ``bounds``: the search starts at the tight epoch bounds (ingress, chassis cuts, forest or
      flow); off: at the latency bound;
    - ``warm_start``: coarse to fine: the schedules found at the slow preset's epochs and one
      length between (:func:`flowride.api.coarse_to_fine`), retimed to the requested epochs
      (:func:`flowride.synth.greedy.retime`), cap every method's search; so the fast preset never
      ends later than the slow one (up to latency the slow preset rounds to zero);
    - ``symmetry``: each probe first tries the model of the orbit representatives only
      (:mod:`flowride.synth.symmetry`); only infeasibility needs the full model;
    - ``parallel``: two probes at once, one solver thread each (highspy releases the GIL).
    """

    incumbent: bool = True
    bounds: bool = True
    warm_start: bool = True
    symmetry: bool = True
    parallel: bool = False


DEFAULT_SPEEDUPS = Speedups()
SPEEDUP_NAMES = ("incumbent", "bounds", "warm_start", "symmetry", "parallel")


def parse_speedups(text: str) -> Speedups:
    """``default``, ``none``, ``all``, or a comma list of the speed-ups to use (only those)."""
    key = str(text).strip().lower().replace("-", "_")
    if key == "default":
        return DEFAULT_SPEEDUPS
    if key in ("none", "all"):
        return Speedups(**{n: key == "all" for n in SPEEDUP_NAMES})
    names = [n.strip() for n in key.split(",") if n.strip()]
    bad = [n for n in names if n not in SPEEDUP_NAMES]
    if bad or not names:
        raise InputError("speedups", f"{text!r} names no speed-up" if not names else f"unknown speed-up {bad[0]!r}",
                         f"use default, none, all, or a comma list of {', '.join(SPEEDUP_NAMES)}")
    return Speedups(**{n: n in names for n in SPEEDUP_NAMES})


METHODS = ("auto", "milp", "lp", "astar", "trees")
OBJECTIVES = ("makespan", "weighted")


@dataclass(frozen=True)
class SynthOptions:
    """How to synthesize, given once and passed down whole (the CLI's options, the API's keywords).

    ``method``: auto, milp, lp (AlltoAll), astar or trees (AllGather-like); ``epoch``: the epoch
    length (a preset name or seconds); ``time_limit``: seconds for everything (None: no limit);
    ``mip_gap``/``threads``: solver settings; ``memory_limit``: bytes a model may take before it is
    refused; ``speedups``: the MILP search's accelerations; ``objective``: makespan (the horizon
    search) or weighted (the published single-LP objective, AlltoAll only)."""

    method: str = "auto"
    epoch: str | float = "fast"
    time_limit: float | None = None
    mip_gap: float | None = None
    threads: int | None = None
    memory_limit: int = MEMORY_LIMIT_BYTES
    speedups: Speedups = DEFAULT_SPEEDUPS
    objective: str = "makespan"

    def check(self) -> None:
        """Refuse values outside their domain (each error names the field and the fix)."""
        if self.time_limit is not None and not self.time_limit > 0:
            raise InputError("time_limit", f"{self.time_limit} is not positive", "give seconds above zero or leave it out")
        if self.mip_gap is not None and not 0 <= self.mip_gap <= 1:
            raise InputError("mip_gap", f"{self.mip_gap} is outside 0..1", "give a relative gap, e.g. 0.01, or leave it out")
        if self.threads is not None and not (isinstance(self.threads, int) and self.threads >= 1):
            raise InputError("threads", f"{self.threads!r} is not a thread count", "give 1 or more, or leave it out")
        if not (isinstance(self.memory_limit, int | float) and self.memory_limit > 0):
            raise InputError("memory_limit", f"{self.memory_limit!r} is not a positive number of bytes", "give bytes above zero")

    def for_demand(self, demand: Demand) -> SynthOptions:
        """These options with the method name normalised, checked against the collective it must
        build (reductions are built from AllGathers, so they take the AllGather methods), and the
        objective checked against the route it needs."""
        m = str(self.method).strip().lower()
        if m not in METHODS:
            raise InputError("method", f"{self.method!r} is not a method", f"use one of {', '.join(METHODS)}")
        gathers = demand.collective.multicast or demand.collective.reduces
        if m == "lp" and gathers:
            raise InputError("method", f"lp needs a copy-free demand (AlltoAll), not {demand.collective.value}",
                             "use milp, astar or trees, or auto")
        if m in ("astar", "trees") and not gathers:
            raise InputError("method", f"{m} builds AllGather-like collectives, not {demand.collective.value}",
                             "use milp or lp, or auto")
        if self.objective not in OBJECTIVES:
            raise InputError("objective", f"{self.objective!r} is not an objective", "use makespan or weighted")
        if self.objective == "weighted" and (gathers or m not in ("auto", "lp")):
            raise InputError("objective", "weighted (the published TE-CCL objective) is built for the LP route of AlltoAll",
                             "use --objective makespan, or -c alltoall with --method lp or auto")
        return replace(self, method=m)
