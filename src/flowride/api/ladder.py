"""Schedules made elsewhere, replayed here: the coarse-to-fine ladder (the same instance solved at
longer epochs first) and warm starts (another size's schedule), each retimed to the requested
epochs (:func:`flowride.synth.greedy.retime`) and verified before it may serve as an incumbent."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from flowride.collectives.demand import Demand
from flowride.errors import InputError
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.synth.budget import AUTO_MILP_COLUMNS, LP_MAX_COLUMNS, lp_size, milp_size
from flowride.synth.greedy import retime
from flowride.synth.options import SynthOptions
from flowride.synth.result import Progress
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming, epoch_timing, resolve_tau

# The coarse-to-fine ladder: epoch lengths (multiples of the requested tau) solved first, with
# their share of the time limit. A schedule found at long epochs, retimed to short ones, is a
# valid schedule there (flowride.synth.greedy.retime) and an incumbent for the fine search.
LADDER_SHARES = (0.3, 0.3)
LADDER_LEVEL_SECONDS = 120.0  # a level's cap when the search has no time limit
WARM_TAG = " (warm start: another size's schedule, retimed)"


def ladder_factors(ratio: float, fine_too_large: bool) -> list[float]:
    """Multiples of tau to solve at first, coarsest first: the slow preset's (``ratio`` =
    slow tau / tau), and, when the fine model is too large to solve directly and the slow epochs
    are far coarser, one between. None when tau is already coarse."""
    if ratio < 1.5:
        return []
    if ratio < 4 or not fine_too_large:
        return [ratio]
    return [ratio, math.sqrt(ratio)]


def fine_too_large(topo: Topology, demand: Demand, timing, hi: int, D) -> bool:
    """Whether the requested epochs make the direct model (MILP for AllGather, time-expanded LP
    for AlltoAll) too large to solve as a whole."""
    if demand.collective.multicast:
        return milp_size(topo, demand, timing, hi, D).columns > AUTO_MILP_COLUMNS
    return lp_size(topo, demand, timing, hi, D) > LP_MAX_COLUMNS


@dataclass
class Retimed:
    """A schedule made at longer epochs (or another size), retimed to the requested ones and verified."""

    epochs: int
    sends: list
    demand: Demand
    name: str  # e.g. "milp at 10x epochs, retimed"


def coarse_to_fine(topo: Topology, demand: Demand, timing: EpochTiming, opts: SynthOptions, time_limit: float | None,
                   progress: Progress | None, too_large: bool, synth: Callable) -> list[Retimed]:
    """Solve at the ladder's longer epochs (fewer of them: far smaller models) with ``synth`` (one
    synthesis at fixed chunks), each schedule retimed to ``timing``. The fine search then starts
    from the best of them, so a fast-preset result is never later than the slow preset's
    (docs/synthesis.md: up to the latency the slow preset rounds to zero)."""
    slow_tau, _ = resolve_tau(topo, demand.chunk_bytes, "slow")
    out: list[Retimed] = []
    t0 = time.perf_counter()
    for f, share in zip(ladder_factors(slow_tau / timing.tau, too_large), LADDER_SHARES, strict=False):
        if time_limit is None:
            budget = LADDER_LEVEL_SECONDS
        else:
            left = time_limit - (time.perf_counter() - t0)
            if left <= 0:  # the levels are a head start for the fine search, never a reason to overrun
                break
            budget = max(1e-3, min(time_limit * share, left))
        if progress:
            progress({"stage": "ladder", "factor": f, "budget": budget})
        try:
            level = replace(opts, epoch=timing.tau * f, time_limit=budget, speedups=replace(opts.speedups, warm_start=False))
            o = synth(topo, demand, level)
        except InputError:  # e.g. a MILP refused for memory at this level: the next level may do
            continue
        r = retimed(topo, o.schedule, o.demand, timing.tau, f"{o.schedule.meta.get('method')} at {f:.3g}x epochs, retimed")
        if r is not None:
            out.append(r)
            if progress:
                progress({"stage": "ladder-done", "factor": f, "epochs": r.epochs, "method": r.name})
    return out


def retimed(topo: Topology, sched: Schedule, demand: Demand, tau: float, name: str) -> Retimed | None:
    """``sched`` (made at other epochs, or for another size of the same collective and chunks)
    replayed for ``demand`` at epochs of ``tau`` (:func:`flowride.synth.greedy.retime`); None
    where it cannot be (a reduction's sends, which retime does not model)."""
    fine = epoch_timing(topo, demand.chunk_bytes, tau)
    try:
        sends = retime(topo, [(x.epoch, x.link, x.source, x.chunk) for x in sched.sends], sched.timing, fine)
    except ValueError:
        return None
    sim = simulate(Schedule.from_tuples(topo, demand, tau, sends))
    return Retimed(int(sim.epochs), sends, demand, name) if sim.valid else None  # the simulator has the last word
