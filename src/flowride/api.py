"""One call from a topology and a collective to a verified, measured schedule.

``synthesize`` runs the horizon search over the MILP, then trusts only the simulator: the
schedule it returns has been replayed and checked, and every figure in the report comes from
that replay, the lower bounds and the baseline timed by the same simulator.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from flowride.collectives.demand import Collective, Demand, make_demand
from flowride.errors import InputError
from flowride.schedule.ir import Schedule
from flowride.schedule.metrics import Bounds, algbw_GBps, lower_bounds
from flowride.schedule.prune import prune_redundant
from flowride.schedule.simulate import SimResult, simulate
from flowride.synth.budget import AUTO_MILP_COLUMNS, MEMORY_LIMIT_BYTES, describe, milp_size
from flowride.synth.greedy import baseline_sends
from flowride.synth.horizon import (
    DEFAULT_SPEEDUPS,
    Progress,
    SearchResult,
    Speedups,
    bisect_horizon,
    epoch_lower_bound,
)
from flowride.synth.reach import epoch_distances
from flowride.synth.trees import synthesize_trees
from flowride.topology.model import Topology
from flowride.topology.timing import epoch_timing


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


UNTIMED_MAX_DELIVERIES = 500_000  # more, without a time limit, is refused (the search would have no end in sight)
MAX_BETA_EPOCHS = 10_000  # a chunk over more epochs than this: the epoch is far too short
OVERRUN_SECONDS = 5.0  # what a solve may take beyond --time-limit to finish and verify its best
SECONDS_PER_SEND = 20e-6  # building and verifying the baseline, per send (measured: 8-16 us here)


def check_work(topo: Topology, demand: Demand, timing, time_limit: float | None) -> None:
    """Refuse, before anything is built, work that cannot end within ``time_limit``: an epoch so
    short that one chunk spans more than MAX_BETA_EPOCHS of them (every model and check grows
    with it), or so many sends that even the baseline schedule cannot be built and verified in
    time (a ring or direct schedule is what every method falls back on)."""
    b = int(timing.beta_epochs.max()) if len(timing.beta_epochs) else 0
    if b > MAX_BETA_EPOCHS:
        longest = float(timing.tau) * b / MAX_BETA_EPOCHS
        raise InputError("epoch", f"{timing.tau:.3g} s makes one chunk span {b:,} epochs (at most {MAX_BETA_EPOCHS:,})",
                         f"use --epoch fast or slow, or an epoch of at least {longest:.3g} s")
    hops = 1.0 if demand.collective.multicast else max(1.0, math.sqrt(len(topo.gpus)) / 2)  # direct routes cross hops
    sends = demand.num_deliveries * hops
    est = sends * SECONDS_PER_SEND
    if time_limit is None and demand.num_deliveries > UNTIMED_MAX_DELIVERIES:
        raise InputError("time_limit", f"is needed for {demand.num_deliveries:,} deliveries ({demand.chunks:,} chunk(s) per block; "
                         f"the baseline alone takes about {est:.0f} s here): without a limit the search is unbounded "
                         f"(refused above {UNTIMED_MAX_DELIVERIES:,} deliveries)",
                         f"give --time-limit, e.g. {max(600, math.ceil(est * 4))}, or use fewer --chunks")
    if time_limit is not None and est > time_limit + OVERRUN_SECONDS:
        raise InputError("time_limit", f"{demand.num_deliveries:,} deliveries ({demand.chunks:,} chunks per block): even the "
                         f"baseline schedule takes about {est:.0f} s to build and verify here, over {time_limit:g} s",
                         f"give --time-limit {math.ceil(est * 2)} or more, or fewer --chunks")


def switch_model(topo: Topology) -> str:
    """How the topology's switches are modelled, for reports: the published TE-CCL model, every
    switch copying (NVLS-class multicast), forwarding only (the physical default of most presets),
    mixed, or none."""
    if topo.teccl_compat:
        return "published (teccl_compat)"
    kinds = {topo.nodes[w].copy for w in topo.switches}
    return {frozenset(): "no switches", frozenset({True}): "copy", frozenset({False}): "forward"}.get(frozenset(kinds), "mixed")


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


METHODS = ("auto", "milp", "lp", "astar", "trees")


def check_method(method: str, demand: Demand) -> str:
    """The method name, checked against the collective it must build (reductions are built from
    AllGathers, so they take the AllGather methods)."""
    m = str(method).strip().lower()
    if m not in METHODS:
        raise InputError("method", f"{method!r} is not a method", f"use one of {', '.join(METHODS)}")
    gathers = demand.collective.multicast or demand.collective.reduces
    if m == "lp" and gathers:
        raise InputError("method", f"lp needs a copy-free demand (AlltoAll), not {demand.collective.value}",
                         "use milp, astar or trees, or auto")
    if m in ("astar", "trees") and not gathers:
        raise InputError("method", f"{m} builds AllGather-like collectives, not {demand.collective.value}",
                         "use milp or lp, or auto")
    return m


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
    the MILP search uses (:class:`~flowride.synth.horizon.Speedups`)."""
    t0 = time.perf_counter()
    if time_limit is not None and not time_limit > 0:
        raise InputError("time_limit", f"{time_limit} is not positive", "give seconds above zero or leave it out")
    if mip_gap is not None and not 0 <= mip_gap <= 1:
        raise InputError("mip_gap", f"{mip_gap} is outside 0..1", "give a relative gap, e.g. 0.01, or leave it out")
    if threads is not None and not (isinstance(threads, int) and threads >= 1):
        raise InputError("threads", f"{threads!r} is not a thread count", "give 1 or more, or leave it out")
    if not (isinstance(memory_limit, int | float) and memory_limit > 0):
        raise InputError("memory_limit", f"{memory_limit!r} is not a positive number of bytes", "give bytes above zero")
    demand = make_demand(topo, collective, size_bytes, chunks)
    method = check_method(method, demand)
    if objective not in ("makespan", "weighted"):
        raise InputError("objective", f"{objective!r} is not an objective", "use makespan or weighted")
    if objective == "weighted" and (demand.collective.multicast or demand.collective.reduces or method not in ("auto", "lp")):
        raise InputError("objective", "weighted (the published TE-CCL objective) is built for the LP route of AlltoAll",
                         "use --objective makespan, or -c alltoall with --method lp or auto")
    if demand.collective.reduces:
        return synthesize_reduction(topo, demand, epoch, time_limit, mip_gap, threads, progress, t0, method, memory_limit, speedups)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    check_work(topo, demand, timing, time_limit)
    D = epoch_distances(topo, timing)

    base_name, base = baseline_sends(topo, demand, timing)
    base_sched = Schedule.from_tuples(topo, demand, timing.tau, base, {"method": base_name})
    base_sim = simulate(base_sched)
    if not base_sim.valid:  # the baseline is built by the same rules; this guards the builder
        raise AssertionError(f"baseline {base_name} failed verification: {base_sim.first_violation}")

    def left() -> float | None:
        return None if time_limit is None else max(1e-3, time_limit - (time.perf_counter() - t0))

    bounds = lower_bounds(topo, demand, left())
    eb = epoch_lower_bound(topo, demand, timing, D, left())
    lo = max(eb.values())
    hi = int(base_sim.epochs)
    if progress:
        progress({"stage": "bounds", "lo": lo, "hi": hi, "baseline": base_name, "tau": timing.tau})

    chosen = method
    fallback_sends, fallback_name = None, base_name
    incumbent_probes: list = []
    incumbent_timed_out = False
    ladder: list[Retimed] = []
    if demand.collective.multicast and (method == "trees" or (method in ("auto", "milp") and speedups.incumbent)):
        # the tree construction is cheap: the method itself, or the incumbent that caps the MILP search
        trees = synthesize_trees(topo, demand, timing, left() if method == "trees" else None, progress, min(lo, hi))
        incumbent_probes += trees.probes
        incumbent_timed_out = trees.timed_out and method == "trees"
        if trees.T < hi or method == "trees":
            fallback_sends, fallback_name, hi = trees.sends, "trees", min(hi, trees.T)
    if speedups.warm_start and hi > lo and method != "trees" and objective == "makespan":
        ladder = coarse_to_fine(topo, demand, timing, method, left(), mip_gap, threads, memory_limit, speedups, progress,
                                fine_too_large=_fine_too_large(topo, demand, timing, hi, D))
        same = [r for r in ladder if r.demand == demand]
        if same:
            best = min(same, key=lambda r: r.epochs)
            if best.epochs < hi:
                fallback_sends, fallback_name, hi = best.sends, best.name, best.epochs
    if chosen == "auto" and demand.collective.multicast and hi > lo:
        # then the windows (seconds, and often at the bound where the MILP would take minutes),
        # with half the time; the MILP below only has to close what gap is left
        from flowride.synth.astar import synthesize_astar

        win = synthesize_astar(topo, demand, timing, time_limit=None if time_limit is None else left() / 2, progress=progress, D=D)
        incumbent_probes += win.probes
        if win.T < hi:
            fallback_sends, fallback_name, hi = win.sends, "astar", win.T
    size = milp_size(topo, demand, timing, hi, D) if chosen == "milp" or (chosen == "auto" and demand.collective.multicast) else None
    if chosen == "auto":
        # copy-free demands: the LP route is exact where its integral polish runs (an integral
        # flow is a schedule) and far smaller than the MILP (docs/synthesis.md)
        if not demand.collective.multicast:
            chosen = "lp"
        elif hi > lo and size.columns <= AUTO_MILP_COLUMNS and size.fits(memory_limit):
            chosen = "milp"
        else:  # at the bound, or too large a MILP: the best of the trees and the windows
            chosen = "incumbent"
    if chosen == "milp" and not size.fits(memory_limit):
        other = "trees or astar" if demand.collective.multicast else "lp"
        raise InputError("method", f"the MILP would need {describe(size)}, over the {memory_limit / 2**30:.0f} GiB memory limit",
                         f"use --method {other} (or auto), a coarser --epoch (slow or seconds), or fewer chunks")
    if progress:
        progress({"stage": "method", "method": chosen, "lo": lo, "hi": hi, "columns": size.columns if size else None})

    used = chosen
    if chosen == "milp":
        sym = None
        if speedups.symmetry and demand.collective is Collective.ALLGATHER:
            from flowride.synth.symmetry import source_symmetry

            budget = 1.0 if time_limit is None else min(1.0, left() / 20)  # bounded: part of the budget
            sym = source_symmetry(topo, budget)
            if sym is not None and sym.reduction < 1.5:
                sym = None  # a few sources saved do not pay for a second model per probe
        start = min(lo, hi) if speedups.bounds else min(eb["latency"], hi)
        search = bisect_horizon(topo, demand, timing, start, hi, left(), mip_gap, threads, progress, D, sym, speedups.parallel)
        search.lower = max(search.lower, min(lo, search.T))  # the bounds hold whether the search began at them or not
        search.probes[:0] = incumbent_probes
        if search.sends is None:
            used = fallback_name
            search.sends = fallback_sends
    elif chosen in ("trees", "incumbent"):
        used = fallback_name
        search = SearchResult(fallback_sends, hi, min(lo, hi), incumbent_timed_out or (time_limit is not None and left() <= 1e-3),
                              incumbent_probes, solver_seconds=time.perf_counter() - t0)
    elif chosen == "lp":
        from flowride.synth.lp import synthesize_lp

        demand, search = synthesize_lp(topo, demand, timing, left(), progress, D, memory_limit=memory_limit, objective=objective,
                                       baseline=(base, int(base_sim.epochs)) if base_name == "direct" else None)
        search.lower = max(search.lower, min(lo, search.T))
        used = search.method  # "direct" where the direct AlltoAll was not beaten
    else:  # astar
        from flowride.synth.astar import synthesize_astar

        search = synthesize_astar(topo, demand, timing, time_limit=left(), progress=progress, D=D)
        search.lower = max(search.lower, min(lo, search.T))
        if search.T > hi:  # the windows did worse than the trees: keep the trees
            used, search.sends, search.T = fallback_name, fallback_sends, hi

    if ladder and chosen == "lp":  # the LP route may schedule another demand (pieces): compare epochs
        best = min(ladder, key=lambda r: r.epochs)
        if best.epochs < search.T or search.sends is None:
            demand, used, search.sends, search.T = best.demand, best.name, best.sends, best.epochs
            search.lower = min(search.lower, best.epochs)
    if search.sends is None:
        sched = base_sched
        used = base_name
    else:
        sched = Schedule.from_tuples(topo, demand, timing.tau, search.sends, {"method": used})
        sched = prune_redundant(sched)
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
        {"status": status, "epochs": sim.epochs, "epoch_lower_bound": search.lower, "epoch_preset": str(epoch),
         "method_requested": method,
         # which objective produced the schedule: the horizon search (with the ladder, trees,
         # windows) minimises the makespan; "weighted" is the published single-LP objective
         "objective": getattr(search, "objective", "makespan")}
    )
    return SynthOutcome(
        schedule=sched,
        sim=sim,
        demand=demand,
        bounds=bounds,
        baseline_name=base_name,
        baseline=base_sim,
        search=search,
        epoch_bounds=eb,
        status=status,
        wall_seconds=time.perf_counter() - t0,
    )


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
    from flowride.synth.budget import LP_MAX_COLUMNS, lp_size

    return lp_size(topo, demand, timing, hi, D) > LP_MAX_COLUMNS


@dataclass
class Retimed:
    """A schedule made at longer epochs, retimed to the requested ones and verified."""

    epochs: int
    sends: list
    demand: Demand
    name: str  # e.g. "milp at 10x epochs, retimed"


def coarse_to_fine(topo: Topology, demand: Demand, timing, method: str, time_limit: float | None, mip_gap, threads,
                   memory_limit: int, speedups: Speedups, progress: Progress | None = None,
                   fine_too_large: bool = False) -> list[Retimed]:
    """Solve at the ladder's longer epochs (fewer of them: far smaller models), each schedule
    retimed to ``timing``. The fine search then starts from the best of them, so a fast-preset
    result is never later than the slow preset's (docs/synthesis.md: up to the latency the slow
    preset rounds to zero)."""
    from dataclasses import replace

    from flowride.synth.greedy import retime
    from flowride.topology.timing import resolve_tau

    slow_tau, _ = resolve_tau(topo, demand.chunk_bytes, "slow")
    out: list[Retimed] = []
    t0 = time.perf_counter()
    for f, share in zip(ladder_factors(slow_tau / timing.tau, fine_too_large), LADDER_SHARES, strict=False):
        if time_limit is None:
            budget = LADDER_LEVEL_SECONDS
        else:
            budget = max(1e-3, min(time_limit * share, time_limit - (time.perf_counter() - t0)))
        if progress:
            progress({"stage": "ladder", "factor": f, "tau": timing.tau * f, "budget": budget})
        try:
            o = synthesize(topo, demand.collective, demand.size_bytes, timing.tau * f, demand.chunks, budget, mip_gap, threads,
                           None, method, memory_limit, replace(speedups, warm_start=False))
        except InputError:  # e.g. a MILP refused for memory at this level: the next level may do
            continue
        d = o.demand
        fine = epoch_timing(topo, d.chunk_bytes, timing.tau)
        try:
            sends = retime(topo, [(x.epoch, x.link, x.source, x.chunk) for x in o.schedule.sends], o.schedule.timing, fine)
        except ValueError:
            continue
        sim = simulate(Schedule.from_tuples(topo, d, timing.tau, sends))
        if sim.valid:  # retime keeps every rule; the simulator has the last word
            name = f"{o.schedule.meta.get('method')} at {f:.3g}x epochs, retimed"
            out.append(Retimed(int(sim.epochs), sends, d, name))
            if progress:
                progress({"stage": "ladder-done", "factor": f, "epochs": int(sim.epochs), "method": name})
    return out


def symmetric(topo: Topology) -> bool:
    """Every link has a way back with the same bandwidth and latency."""
    idx = topo.link_index
    for lk in topo.links:
        back = idx.get((lk.dst, lk.src))
        if back is None or (topo.links[back].bandwidth_GBps, topo.links[back].alpha_s) != (lk.bandwidth_GBps, lk.alpha_s):
            return False
    return True


def synthesize_reduction(topo, demand, epoch, time_limit, mip_gap, threads, progress, t0, method="auto",
                         memory_limit=MEMORY_LIMIT_BYTES, speedups: Speedups = DEFAULT_SPEEDUPS) -> SynthOutcome:
    """ReduceScatter: the AllGather synthesized on the reversed topology, run backwards in time.
    AllReduce: that ReduceScatter, then the AllGather on the topology itself (the same schedule when
    the links are symmetric). The baseline is the ring AllGather treated the same way.

    Proven minimal only for a ReduceScatter without switches: there time reversal is exact (every
    capacity window and delay mirrors), so the minimal AllGather on the reversed links gives the
    minimal ReduceScatter."""
    from flowride.schedule.reduce import allreduce_from_allgather, reduce_scatter_from_allgather

    is_ar = demand.collective is Collective.ALLREDUCE
    same = symmetric(topo)
    budget = time_limit if not is_ar or same or time_limit is None else time_limit / 2
    rev_topo = topo if same else topo.reversed()
    rev = synthesize(rev_topo, Collective.ALLGATHER, demand.size_bytes, epoch, demand.chunks, budget, mip_gap, threads, progress,
                     method, memory_limit, speedups)
    fwd = rev
    if is_ar and not same:
        left = None if time_limit is None else max(1e-3, time_limit - (time.perf_counter() - t0))
        fwd = synthesize(topo, Collective.ALLGATHER, demand.size_bytes, epoch, demand.chunks, left, mip_gap, threads, progress,
                         method, memory_limit, speedups)

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
        fwd_base = Schedule.from_tuples(topo, fwd.demand, timing.tau, baseline_sends(topo, fwd.demand, timing)[1], {"method": fwd.baseline_name})
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
    sched.meta.update({"status": status, "epochs": sim.epochs, "epoch_preset": str(epoch), "allgather_status": rev.status,
                       "method": rev.schedule.meta.get("method"), "method_requested": method})
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
        wall_seconds=time.perf_counter() - t0,
    )
