"""One call from a topology and a collective to a verified, measured schedule.

``synthesize`` runs the horizon search over the MILP, then trusts only the simulator: the
schedule it returns has been replayed and checked, and every figure in the report comes from
that replay, the lower bounds and the baseline timed by the same simulator.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from flowride.collectives.demand import Collective, Demand, make_demand
from flowride.errors import InputError
from flowride.schedule.ir import Schedule
from flowride.schedule.metrics import algbw_GBps
from flowride.schedule.prune import prune_redundant
from flowride.schedule.reduce import allreduce_from_allgather, reduce_scatter_from_allgather
from flowride.schedule.simulate import SimResult, simulate
from flowride.synth.bounds import Bounds, epoch_lower_bound, lower_bounds
from flowride.synth.budget import (
    AUTO_MILP_COLUMNS,
    LP_MAX_COLUMNS,
    MEMORY_LIMIT_BYTES,
    check_work,
    describe,
    lp_size,
    milp_size,
)
from flowride.synth.greedy import baseline_sends, retime
from flowride.synth.horizon import bisect_horizon
from flowride.synth.options import DEFAULT_SPEEDUPS, Speedups, SynthOptions
from flowride.synth.reach import epoch_distances
from flowride.synth.result import Progress, SearchResult
from flowride.synth.trees import synthesize_trees
from flowride.topology.group import group_info, relay_nodes
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming, epoch_timing, resolve_tau


@dataclass
class SynthOutcome:
    schedule: Schedule
    sim: SimResult
    demand: Demand
    bounds: Bounds
    baseline_name: str
    baseline: SimResult
    search: SearchResult
    epoch_bounds: dict[str, int]
    status: str  # optimal | feasible | timeout | infeasible
    wall_seconds: float

    @property
    def finish_time_s(self) -> float:
        return float(self.sim.finish_time_s)

    def report(self) -> dict:
        """The report contract read by outside checks (see README)."""
        topo = self.schedule.topology
        lb = self.bounds.best_s
        fin = self.finish_time_s
        gap_epochs = self.search.T - self.search.lower
        return {
            "topology": topo.name,
            "switch_model": switch_model(topo),
            "group": group_info(topo),  # process group (ranks of the base topology, relay on/off) or None
            "collective": self.demand.collective.value,
            "size_bytes": self.demand.size_bytes,
            "chunks": self.demand.chunks,
            "gpus": len(topo.gpus),
            "finish_time_us": fin * 1e6,
            "epochs": self.sim.epochs,
            "epoch_duration_us": self.sim.tau * 1e6,
            "algbw_GBps": algbw_GBps(self.demand.size_bytes, fin),
            "lower_bound_us": lb * 1e6,
            "lower_bound_kind": self.bounds.binding,
            "lower_bounds_us": {k: v * 1e6 for k, v in self.bounds.kinds().items()},
            "ratio_to_lower_bound": fin / lb if lb > 0 else None,
            "baseline": self.baseline_name,
            "baseline_us": self.baseline.finish_time_s * 1e6,
            "speedup_vs_baseline": self.baseline.finish_time_s / fin,
            "solver_time_s": self.search.solver_seconds,
            "wall_time_s": self.wall_seconds,
            "status": self.status,
            "proven_minimal_epochs": self.status == "optimal",
            "epoch_lower_bound": self.search.lower,
            "epoch_gap": gap_epochs,
            "verified": self.sim.valid,
            "method": self.schedule.meta.get("method"),
            "method_requested": self.schedule.meta.get("method_requested"),
            "objective": self.schedule.meta.get("objective", "makespan"),
            "peak_rss_mb": _peak_rss_mb(),
            "probes": [{"T": p.T, "outcome": p.outcome, "seconds": round(p.seconds, 4), "columns": p.columns, "rows": p.rows} for p in self.search.probes],
        }


def switch_model(topo: Topology) -> str:
    """How the topology's switches are modelled, for reports: the published TE-CCL model, every
    switch copying (NVLS-class multicast), forwarding only (the physical default of most presets),
    mixed, or none."""
    if topo.teccl_compat:
        return "published (teccl_compat)"
    relays = set(relay_nodes(topo))  # GPUs outside a process group, forwarding: not switches of the machine
    kinds = {topo.nodes[w].copy for w in topo.switches if w not in relays}
    model = {frozenset(): "no switches", frozenset({True}): "copy", frozenset({False}): "forward"}.get(frozenset(kinds), "mixed")
    return model + ("; relays outside the group" if relays else "")


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthesize(
    topo: Topology,
    collective: Collective | str,
    size_bytes: int,
    epoch: str | float = "fast",
    chunks: int = 1,
    time_limit: float | None = None,
    mip_gap: float | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
    method: str = "auto",
    memory_limit: int = MEMORY_LIMIT_BYTES,
    speedups: Speedups = DEFAULT_SPEEDUPS,
    objective: str = "makespan",
) -> SynthOutcome:
    """The fastest schedule ``method`` can find, verified by the simulator.

    - ``milp``: minimum makespan by bisection over MILP probes (proven when it finishes in time);
      refused up front when its estimated memory exceeds ``memory_limit``;
    - ``lp`` (AlltoAll): the fluid LP, decomposed into per-chunk sends;
    - ``astar`` (AllGather): windows of epochs solved one after another and stitched;
    - ``trees`` (AllGather): polynomial-time packed broadcast trees (ForestColl-style);
    - ``auto``: AlltoAll: the LP. AllGather: the trees, then (if they miss the epoch bound) the
      windows with half the time, then (if a gap is left) the MILP from the best of them when
      its size is modest; the best verified schedule wins.
    Reductions (ReduceScatter, AllReduce) are built from AllGathers run backwards
    (:func:`synthesize_reduction`) with the same method. ``speedups`` says which accelerations
    the MILP search uses (:class:`~flowride.synth.options.Speedups`). The keywords are those of
    :class:`~flowride.synth.options.SynthOptions` (:func:`synthesize_with` takes one)."""
    opts = SynthOptions(method, epoch, time_limit, mip_gap, threads, memory_limit, speedups, objective)
    return synthesize_with(topo, collective, size_bytes, chunks, opts, progress)


def synthesize_with(topo: Topology, collective: Collective | str, size_bytes: int, chunks: int, opts: SynthOptions,
                    progress: Progress | None = None, warm: tuple[Schedule, ...] = ()) -> SynthOutcome:
    """:func:`synthesize` with its options as one :class:`SynthOptions`: build the model (timing,
    baseline, bounds), search (incumbents, then the method), verify and measure. ``warm``: schedules
    of the same collective on ``topo`` at other sizes (:func:`flowride.sweep.synthesize_sweep`),
    retimed to this one and offered as incumbents (AllGather, AlltoAll)."""
    clock = _Clock(opts.time_limit)
    opts.check()
    demand = make_demand(topo, collective, size_bytes, chunks)
    opts = opts.for_demand(demand)
    if not demand.collective.reduces:
        inst = _model(topo, demand, opts, clock, progress)
        found = _search(inst, opts, clock, progress, warm)
        return _measure(inst, found, opts, clock)
    return synthesize_reduction(topo, demand, opts, progress, clock)


class _Clock:
    """The time limit of one synthesis, counted from its start."""

    def __init__(self, time_limit: float | None) -> None:
        self.t0 = time.perf_counter()
        self.limit = time_limit

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float | None:
        """Seconds left (at least a millisecond, so a solver is never handed zero), None without a limit."""
        return None if self.limit is None else max(1e-3, self.limit - self.elapsed())

    def out(self) -> bool:
        return self.limit is not None and self.left() <= 1e-3


@dataclass
class _Instance:
    """The model of one synthesis: the demand at its epoch timing, the baseline schedule that
    every method must beat (and falls back on), and the bounds in seconds and in epochs."""

    topo: Topology
    demand: Demand
    timing: EpochTiming
    D: np.ndarray
    base_name: str
    base: list
    base_sched: Schedule
    base_sim: SimResult
    bounds: Bounds
    epoch_bounds: dict[str, int]

    @property
    def lo(self) -> int:
        return max(self.epoch_bounds.values())


def _model(topo: Topology, demand: Demand, opts: SynthOptions, clock: _Clock, progress: Progress | None) -> _Instance:
    timing = epoch_timing(topo, demand.chunk_bytes, opts.epoch)
    check_work(topo, demand, timing, opts.time_limit)
    D = epoch_distances(topo, timing)
    base_name, base = baseline_sends(topo, demand, timing)
    base_sched = Schedule.from_tuples(topo, demand, timing.tau, base, {"method": base_name})
    base_sim = simulate(base_sched)
    if not base_sim.valid:  # the baseline is built by the same rules; this guards the builder
        raise AssertionError(f"baseline {base_name} failed verification: {base_sim.first_violation}")
    bounds = lower_bounds(topo, demand, clock.left())
    eb = epoch_lower_bound(topo, demand, timing, D, clock.left())
    inst = _Instance(topo, demand, timing, D, base_name, base, base_sched, base_sim, bounds, eb)
    if progress:
        progress({"stage": "bounds", "lo": inst.lo, "hi": int(base_sim.epochs), "baseline": base_name, "tau": timing.tau})
    return inst


@dataclass
class _Best:
    """The best schedule found before the chosen method runs (the cap of its search)."""

    sends: list | None
    name: str
    hi: int  # its epochs (the baseline's while nothing beat it)
    probes: list
    timed_out: bool = False
    ladder: list[Retimed] = field(default_factory=list)

    def offer(self, sends: list, name: str, epochs: int, always: bool = False) -> None:
        if always or epochs < self.hi:
            self.sends, self.name, self.hi = sends, name, min(self.hi, epochs)


@dataclass
class _Found:
    demand: Demand  # the LP route may schedule the chunks cut in pieces
    search: SearchResult
    used: str  # the method (or level) that made the schedule


def _incumbents(inst: _Instance, opts: SynthOptions, clock: _Clock, progress: Progress | None, warm: tuple = ()) -> _Best:
    """The cheap schedules that cap the search: the packed trees (AllGather), ``warm`` (other
    sizes' schedules, retimed), the coarse-to-fine ladder (the slow preset's epochs, retimed), the
    A* windows (``auto`` AllGather)."""
    demand, method, speedups = inst.demand, opts.method, opts.speedups
    best = _Best(None, inst.base_name, int(inst.base_sim.epochs), [])
    lo = inst.lo
    if demand.collective.multicast and (method == "trees" or (method in ("auto", "milp") and speedups.incumbent)):
        # the tree construction is cheap: the method itself, or the incumbent that caps the MILP search
        trees = synthesize_trees(inst.topo, demand, inst.timing, clock.left() if method == "trees" else None, progress, min(lo, best.hi))
        best.probes += trees.probes
        best.timed_out = trees.timed_out and method == "trees"
        best.offer(trees.sends, "trees", trees.T, always=method == "trees")
    for w in warm if method != "trees" and opts.objective == "makespan" else ():  # like a ladder level (the LP route compares it too)
        name = str(w.meta.get("method")).removesuffix(WARM_TAG) + WARM_TAG
        r = retimed(inst.topo, w, make_demand(inst.topo, demand.collective, demand.size_bytes, w.chunks), inst.timing.tau, name)
        if r is not None:
            best.ladder.append(r)
            if r.demand == demand:
                best.offer(r.sends, r.name, r.epochs)
    if speedups.warm_start and best.hi > lo and method != "trees" and opts.objective == "makespan":
        best.ladder += coarse_to_fine(inst.topo, demand, inst.timing, opts, clock.left(), progress,
                                     fine_too_large=_fine_too_large(inst.topo, demand, inst.timing, best.hi, inst.D))
        same = [r for r in best.ladder if r.demand == demand]
        if same:
            r = min(same, key=lambda r: r.epochs)
            best.offer(r.sends, r.name, r.epochs)
    if method == "auto" and demand.collective.multicast and best.hi > lo:
        # then the windows (seconds, and often at the bound where the MILP would take minutes),
        # with half the time; the MILP below only has to close what gap is left
        from flowride.synth.astar import synthesize_astar

        win = synthesize_astar(inst.topo, demand, inst.timing, time_limit=None if opts.time_limit is None else clock.left() / 2,
                               progress=progress, D=inst.D)
        best.probes += win.probes
        best.offer(win.sends, "astar", win.T)
    return best


def _choose(inst: _Instance, best: _Best, opts: SynthOptions, progress: Progress | None) -> str:
    """The method that runs after the incumbents: ``auto`` resolved, the MILP refused when its
    estimated memory exceeds the limit."""
    demand, chosen, lo, hi = inst.demand, opts.method, inst.lo, best.hi
    multicast = demand.collective.multicast
    size = milp_size(inst.topo, demand, inst.timing, hi, inst.D) if chosen == "milp" or (chosen == "auto" and multicast) else None
    if chosen == "auto":
        # copy-free demands: the LP route is exact where its integral polish runs (an integral
        # flow is a schedule) and far smaller than the MILP (docs/synthesis.md)
        if not multicast:
            chosen = "lp"
        elif hi > lo and size.columns <= AUTO_MILP_COLUMNS and size.fits(opts.memory_limit):
            chosen = "milp"
        else:  # at the bound, or too large a MILP: the best of the trees and the windows
            chosen = "incumbent"
    if chosen == "milp" and not size.fits(opts.memory_limit):
        other = "trees or astar" if multicast else "lp"
        raise InputError("method", f"the MILP would need {describe(size)}, over the {opts.memory_limit / 2**30:.0f} GiB memory limit",
                         f"use --method {other} (or auto), a coarser --epoch (slow or seconds), or fewer chunks")
    if progress:
        progress({"stage": "method", "method": chosen, "lo": lo, "hi": hi, "columns": size.columns if size else None})
    return chosen


def _search(inst: _Instance, opts: SynthOptions, clock: _Clock, progress: Progress | None, warm: tuple = ()) -> _Found:
    """The incumbents, then the chosen method's search capped by them; the best schedule wins."""
    best = _incumbents(inst, opts, clock, progress, warm)
    chosen = _choose(inst, best, opts, progress)
    demand, lo, hi, speedups = inst.demand, inst.lo, best.hi, opts.speedups
    used = chosen
    if chosen == "milp":
        sym = None
        if speedups.symmetry and demand.collective is Collective.ALLGATHER:
            from flowride.synth.symmetry import source_symmetry

            budget = 1.0 if opts.time_limit is None else min(1.0, clock.left() / 20)  # bounded: part of the budget
            sym = source_symmetry(inst.topo, budget)
            if sym is not None and sym.reduction < 1.5:
                sym = None  # a few sources saved do not pay for a second model per probe
        start = min(lo, hi) if speedups.bounds else min(inst.epoch_bounds["latency"], hi)
        search = bisect_horizon(inst.topo, demand, inst.timing, start, hi, clock.left(), opts.mip_gap, opts.threads, progress,
                                inst.D, sym, speedups.parallel)
        search.lower = max(search.lower, min(lo, search.T))  # the bounds hold whether the search began at them or not
        search.probes[:0] = best.probes
        if search.sends is None:
            used = best.name
            search.sends = best.sends
    elif chosen in ("trees", "incumbent"):
        used = best.name
        search = SearchResult(best.sends, hi, min(lo, hi), best.timed_out or clock.out(), best.probes,
                              solver_seconds=clock.elapsed())
    elif chosen == "lp":
        from flowride.synth.lp_search import synthesize_lp

        direct = (inst.base, int(inst.base_sim.epochs)) if inst.base_name == "direct" else None
        demand, search = synthesize_lp(inst.topo, demand, inst.timing, clock.left(), progress, inst.D, memory_limit=opts.memory_limit,
                                       objective=opts.objective, baseline=direct)
        search.lower = max(search.lower, min(lo, search.T))
        used = search.method  # "direct" where the direct AlltoAll was not beaten
    else:  # astar
        from flowride.synth.astar import synthesize_astar

        search = synthesize_astar(inst.topo, demand, inst.timing, time_limit=clock.left(), progress=progress, D=inst.D)
        search.lower = max(search.lower, min(lo, search.T))
        if search.T > hi:  # the windows did worse than the trees: keep the trees
            used, search.sends, search.T = best.name, best.sends, hi
    if best.ladder and chosen == "lp":  # the LP route may schedule another demand (pieces): compare epochs
        r = min(best.ladder, key=lambda r: r.epochs)
        if r.epochs < search.T or search.sends is None:
            demand, used, search.sends, search.T = r.demand, r.name, r.sends, r.epochs
            search.lower = min(search.lower, r.epochs)
    return _Found(demand, search, used)


def _measure(inst: _Instance, found: _Found, opts: SynthOptions, clock: _Clock) -> SynthOutcome:
    """Replay the winner in the simulator (the only judge), and state what is proven."""
    demand, search, used = found.demand, found.search, found.used
    if search.sends is None:
        sched = inst.base_sched
        used = inst.base_name
    else:
        sched = prune_redundant(Schedule.from_tuples(inst.topo, demand, inst.timing.tau, search.sends, {"method": used}))
    sim = simulate(sched)
    if not sim.valid:
        raise AssertionError(f"synthesized schedule ({used}) failed verification: {sim.first_violation}")
    # the replay may finish earlier than the probed horizon
    search.T = min(search.T, int(sim.epochs))
    if search.proven_minimal:
        status = "optimal"
    elif search.timed_out:
        status = "timeout"
    else:
        status = "feasible"
    sched.meta.update(
        {"status": status, "epochs": sim.epochs, "epoch_lower_bound": search.lower, "epoch_preset": str(opts.epoch),
         "method_requested": opts.method,
         # which objective produced the schedule: the horizon search (with the ladder, trees,
         # windows) minimises the makespan; "weighted" is the published single-LP objective
         "objective": getattr(search, "objective", "makespan")}
    )
    return SynthOutcome(sched, sim, demand, inst.bounds, inst.base_name, inst.base_sim, search, inst.epoch_bounds, status,
                        clock.elapsed())


# The coarse-to-fine ladder: epoch lengths (multiples of the requested tau) solved first, with
# their share of the time limit. A schedule found at long epochs, retimed to short ones, is a
# valid schedule there (flowride.synth.greedy.retime) and an incumbent for the fine search.
LADDER_SHARES = (0.3, 0.3)


LADDER_LEVEL_SECONDS = 120.0  # a level's cap when the search has no time limit


def ladder_factors(ratio: float, fine_too_large: bool) -> list[float]:
    """Multiples of tau to solve at first, coarsest first: the slow preset's (``ratio`` =
    slow tau / tau), and, when the fine model is too large to solve directly and the slow epochs
    are far coarser, one between. None when tau is already coarse."""
    if ratio < 1.5:
        return []
    if ratio < 4 or not fine_too_large:
        return [ratio]
    return [ratio, math.sqrt(ratio)]


def _fine_too_large(topo: Topology, demand: Demand, timing, hi: int, D) -> bool:
    """Whether the requested epochs make the direct model (MILP for AllGather, time-expanded LP
    for AlltoAll) too large to solve as a whole."""
    if demand.collective.multicast:
        return milp_size(topo, demand, timing, hi, D).columns > AUTO_MILP_COLUMNS
    return lp_size(topo, demand, timing, hi, D) > LP_MAX_COLUMNS


@dataclass
class Retimed:
    """A schedule made at longer epochs, retimed to the requested ones and verified."""

    epochs: int
    sends: list
    demand: Demand
    name: str  # e.g. "milp at 10x epochs, retimed"


def coarse_to_fine(topo: Topology, demand: Demand, timing: EpochTiming, opts: SynthOptions, time_limit: float | None,
                   progress: Progress | None = None, fine_too_large: bool = False) -> list[Retimed]:
    """Solve at the ladder's longer epochs (fewer of them: far smaller models), each schedule
    retimed to ``timing``. The fine search then starts from the best of them, so a fast-preset
    result is never later than the slow preset's (docs/synthesis.md: up to the latency the slow
    preset rounds to zero)."""
    slow_tau, _ = resolve_tau(topo, demand.chunk_bytes, "slow")
    out: list[Retimed] = []
    t0 = time.perf_counter()
    for f, share in zip(ladder_factors(slow_tau / timing.tau, fine_too_large), LADDER_SHARES, strict=False):
        if time_limit is None:
            budget = LADDER_LEVEL_SECONDS
        else:
            left = time_limit - (time.perf_counter() - t0)
            if left <= 0:  # the levels are a head start for the fine search, never a reason to overrun
                break
            budget = max(1e-3, min(time_limit * share, left))
        if progress:
            progress({"stage": "ladder", "factor": f, "tau": timing.tau * f, "budget": budget})
        try:
            level = replace(opts, epoch=timing.tau * f, time_limit=budget, speedups=replace(opts.speedups, warm_start=False))
            o = synthesize_with(topo, demand.collective, demand.size_bytes, demand.chunks, level)
        except InputError:  # e.g. a MILP refused for memory at this level: the next level may do
            continue
        r = retimed(topo, o.schedule, o.demand, timing.tau, f"{o.schedule.meta.get('method')} at {f:.3g}x epochs, retimed")
        if r is not None:
            out.append(r)
            if progress:
                progress({"stage": "ladder-done", "factor": f, "epochs": r.epochs, "method": r.name})
    return out


WARM_TAG = " (warm start: another size's schedule, retimed)"


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


def symmetric(topo: Topology) -> bool:
    """Every link has a way back with the same bandwidth and latency."""
    idx = topo.link_index
    for lk in topo.links:
        back = idx.get((lk.dst, lk.src))
        if back is None or (topo.links[back].bandwidth_GBps, topo.links[back].alpha_s) != (lk.bandwidth_GBps, lk.alpha_s):
            return False
    return True


def synthesize_reduction(topo: Topology, demand: Demand, opts: SynthOptions, progress: Progress | None, clock: _Clock) -> SynthOutcome:
    """ReduceScatter: the AllGather synthesized on the reversed topology, run backwards in time.
    AllReduce: that ReduceScatter, then the AllGather on the topology itself (the same schedule when
    the links are symmetric). The baseline is the ring AllGather treated the same way.

    Proven minimal only for a ReduceScatter without switches: there time reversal is exact (every
    capacity window and delay mirrors), so the minimal AllGather on the reversed links gives the
    minimal ReduceScatter."""
    is_ar = demand.collective is Collective.ALLREDUCE
    same = symmetric(topo)
    time_limit = opts.time_limit
    budget = time_limit if not is_ar or same or time_limit is None else time_limit / 2
    rev_topo = topo if same else topo.reversed()
    rev = synthesize_with(rev_topo, Collective.ALLGATHER, demand.size_bytes, demand.chunks, replace(opts, time_limit=budget), progress)
    fwd = rev
    if is_ar and not same:
        fwd = synthesize_with(topo, Collective.ALLGATHER, demand.size_bytes, demand.chunks, replace(opts, time_limit=clock.left()), progress)

    def build(r: Schedule, f: Schedule) -> Schedule:
        if is_ar:
            return allreduce_from_allgather(r, f, topo)
        return reduce_scatter_from_allgather(r, topo)

    sched = build(rev.schedule, fwd.schedule)
    sim = simulate(sched)
    if not sim.valid:
        raise AssertionError(f"reduction schedule failed verification: {sim.first_violation}")
    timing = rev.schedule.timing
    rev_base = Schedule.from_tuples(rev_topo, rev.demand, timing.tau, baseline_sends(rev_topo, rev.demand, timing)[1], {"method": rev.baseline_name})
    fwd_base = rev_base
    if is_ar and not same:
        fwd_base = Schedule.from_tuples(topo, fwd.demand, timing.tau, baseline_sends(topo, fwd.demand, fwd.schedule.timing)[1], {"method": fwd.baseline_name})
    base_sim = simulate(build(rev_base, fwd_base))
    bounds = lower_bounds(topo, demand)
    exact = not is_ar and not topo.switches and rev.status == "optimal" and sim.epochs == rev.sim.epochs
    lower = max(int(math.ceil(bounds.best_s / sim.tau - 1e-9)), rev.search.lower if exact else 0)
    search = SearchResult(None, int(sim.epochs), min(lower, int(sim.epochs)), rev.search.timed_out or fwd.search.timed_out,
                          rev.search.probes + (fwd.search.probes if fwd is not rev else []),
                          solver_seconds=rev.search.solver_seconds + (fwd.search.solver_seconds if fwd is not rev else 0.0))
    if exact:
        status = "optimal"
    elif search.timed_out:
        status = "timeout"
    else:
        status = "feasible"
    sched.meta.update({"status": status, "epochs": sim.epochs, "epoch_preset": str(opts.epoch), "allgather_status": rev.status,
                       "method": rev.schedule.meta.get("method"), "method_requested": opts.method})
    return SynthOutcome(
        schedule=sched,
        sim=sim,
        demand=demand,
        bounds=bounds,
        baseline_name=f"ring {'ReduceScatter+AllGather' if is_ar else 'ReduceScatter'}",
        baseline=base_sim,
        search=search,
        epoch_bounds={"time": lower},
        status=status,
        wall_seconds=clock.elapsed(),
    )
