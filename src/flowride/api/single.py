"""One synthesis at a fixed chunk count of a collective that only moves chunks (AllGather,
AlltoAll): build the model (timing, baseline, bounds), find the incumbents that cap the search,
run the chosen method, then verify and measure the winner in the simulator, the only judge."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from flowride.api.clock import Clock
from flowride.api.ladder import WARM_TAG, Retimed, coarse_to_fine, fine_too_large, retimed
from flowride.api.outcome import SynthOutcome
from flowride.collectives.demand import Collective, Demand, make_demand
from flowride.errors import InputError
from flowride.schedule.ir import Schedule
from flowride.schedule.prune import prune_redundant
from flowride.schedule.simulate import SimResult, simulate
from flowride.synth.bounds import Bounds, epoch_lower_bound, lower_bounds
from flowride.synth.budget import AUTO_MILP_COLUMNS, check_work, describe, milp_size
from flowride.synth.greedy import baseline_sends
from flowride.synth.horizon import bisect_horizon
from flowride.synth.options import SynthOptions
from flowride.synth.reach import epoch_distances
from flowride.synth.result import Progress, SearchResult
from flowride.synth.trees import synthesize_trees
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming, epoch_timing

INCUMBENT_SHARE = 0.3  # of the time the tree incumbents may take before the chosen method's search
MEASURE_SECONDS_PER_SEND = 20e-6  # pruning and replaying the winner, per send, on one core


def synthesize_one(topo: Topology, demand: Demand, opts: SynthOptions, clock: Clock, progress: Progress | None = None,
                   warm: tuple[Schedule, ...] = (), keep_baseline: bool = False) -> SynthOutcome:
    """Model, search, verify and measure ``demand`` (already checked against ``opts``). ``warm``:
    schedules of the same collective on ``topo`` at other sizes, retimed and offered as incumbents.
    ``keep_baseline``: the outcome keeps the baseline's schedule too (a reduction reverses it)."""
    inst = _model(topo, demand, opts, clock, progress)
    search_clock = clock
    if clock.limit is not None:  # keep what verifying and measuring the winner will take (the baseline's size, about)
        hops = 2 if topo.switches else 1  # a delivery through a switch is two sends
        # per send: the nominal figure, or what the baseline's replay took on this machine now, twice
        # (the winner is pruned as well as replayed): a slower or busier machine keeps more
        per_send = max(MEASURE_SECONDS_PER_SEND, 2.0 * inst.replay_s_per_send)
        # the winner's sends: at least the baseline's or the deliveries', or the incumbent's at this
        # count (trees on a mesh route a delivery over several GPUs: 4-5 sends each on MI250)
        sends = max(len(inst.base), hops * demand.num_deliveries, *(len(w.sends) for w in warm if w.chunks == demand.chunks))
        reserve = min(0.3 * clock.left(), per_send * sends)
        search_clock = Clock(max(1e-3, clock.left() - reserve))
    found = _search(inst, opts, search_clock, _in_time(progress, inst.timing.tau), warm)
    out = _measure(inst, found, opts, clock)
    if keep_baseline:
        out.baseline_schedule = inst.base_sched
    return out


def level(topo: Topology, demand: Demand, opts: SynthOptions) -> SynthOutcome:
    """One rung of the coarse-to-fine ladder: the same demand at ``opts``' (longer) epochs."""
    return synthesize_one(topo, demand, opts.for_demand(demand), Clock(opts.time_limit))


def _in_time(progress: Progress | None, tau: float) -> Progress | None:
    """Progress events with the finish time in microseconds where they name a schedule's epochs at
    this synthesis' epoch length (so the live line agrees with the report)."""
    if progress is None:
        return None

    def emit(ev: dict) -> None:
        ep = ev.get("best") if ev.get("best") is not None else (ev.get("T") if ev.get("outcome") == "feasible" else None)
        if ep is None and ev.get("stage") in ("decompose", "ladder-done"):
            ep = ev.get("epochs")
        if ep is None and ev.get("stage") == "method":
            ep = ev.get("hi")
        if ep is not None:
            ev = {**ev, "best_us": ep * tau * 1e6}
        progress(ev)

    return emit


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
    replay_s_per_send: float = MEASURE_SECONDS_PER_SEND  # building and replaying the baseline, per send, as timed here

    @property
    def lo(self) -> int:
        return max(self.epoch_bounds.values())


def _model(topo: Topology, demand: Demand, opts: SynthOptions, clock: Clock, progress: Progress | None) -> _Instance:
    timing = epoch_timing(topo, demand.chunk_bytes, opts.epoch)
    check_work(topo, demand, timing, opts.time_limit)
    D = epoch_distances(topo, timing)
    base_name, base = baseline_sends(topo, demand, timing)
    t0 = time.perf_counter()
    base_sched = Schedule.from_tuples(topo, demand, timing.tau, base, {"method": base_name})
    base_sim = simulate(base_sched)
    replay = (time.perf_counter() - t0) / max(1, len(base))
    if not base_sim.valid:  # the baseline is built by the same rules; this guards the builder
        raise AssertionError(f"baseline {base_name} failed verification: {base_sim.first_violation}")
    bounds = lower_bounds(topo, demand, clock.left(), timing)
    eb = epoch_lower_bound(topo, demand, timing, D, clock.left())
    inst = _Instance(topo, demand, timing, D, base_name, base, base_sched, base_sim, bounds, eb, replay)
    if progress:
        progress({"stage": "bounds", "lo": inst.lo, "hi": int(base_sim.epochs), "baseline": base_name, "tau": timing.tau,
                  "best_us": base_sim.finish_time_s * 1e6, "bound_us": bounds.best_s * 1e6})
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


def _incumbents(inst: _Instance, opts: SynthOptions, clock: Clock, progress: Progress | None, warm: tuple = ()) -> _Best:
    """The cheap schedules that cap the search: the packed trees (AllGather), ``warm`` (other
    sizes' schedules, retimed), the coarse-to-fine ladder (the slow preset's epochs, retimed), the
    A* windows (``auto`` AllGather)."""
    demand, method, speedups = inst.demand, opts.method, opts.speedups
    best = _Best(None, inst.base_name, int(inst.base_sim.epochs), [])
    lo = inst.lo
    if demand.collective.multicast and (method == "trees" or (method in ("auto", "milp") and speedups.incumbent)):
        # the tree construction is cheap: the method itself, or the incumbent that caps the MILP search
        budget = clock.left() if method == "trees" else clock.share(INCUMBENT_SHARE)
        trees = synthesize_trees(inst.topo, demand, inst.timing, budget, progress, min(lo, best.hi))
        best.probes += trees.probes
        best.timed_out = trees.timed_out and method == "trees"
        if trees.sends is not None:
            best.offer(trees.sends, "trees", trees.T, always=method == "trees")
    for w in warm if method != "trees" and opts.objective == "makespan" else ():  # like a ladder level (the LP route compares it too)
        if (w.size_bytes, w.chunks, w.tau) == (demand.size_bytes, demand.chunks, inst.timing.tau):  # this very instance
            sim = simulate(w)
            if sim.valid:
                best.offer([(x.epoch, x.link, x.source, x.chunk) for x in w.sends], str(w.meta.get("method")), int(sim.epochs))
            continue
        name = str(w.meta.get("method")).removesuffix(WARM_TAG) + WARM_TAG
        r = retimed(inst.topo, w, make_demand(inst.topo, demand.collective, demand.size_bytes, w.chunks), inst.timing.tau, name)
        if r is not None:
            best.ladder.append(r)
            if r.demand == demand:
                best.offer(r.sends, r.name, r.epochs)
    if speedups.warm_start and best.hi > lo and method != "trees" and opts.objective == "makespan":
        best.ladder += coarse_to_fine(inst.topo, demand, inst.timing, opts, clock.left(), progress,
                                      fine_too_large(inst.topo, demand, inst.timing, best.hi, inst.D), level)
        same = [r for r in best.ladder if r.demand == demand]
        if same:
            r = min(same, key=lambda r: r.epochs)
            best.offer(r.sends, r.name, r.epochs)
    if method == "auto" and demand.collective.multicast and best.hi > lo:
        # then the windows (seconds, and often at the bound where the MILP would take minutes),
        # with half the time; the MILP below only has to close what gap is left
        from flowride.synth.astar import synthesize_astar

        win = synthesize_astar(inst.topo, demand, inst.timing, time_limit=None if opts.time_limit is None else clock.left() / 2,
                               progress=progress, D=inst.D, must_finish=False)
        best.probes += win.probes
        if win.sends is not None:
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


def _search(inst: _Instance, opts: SynthOptions, clock: Clock, progress: Progress | None, warm: tuple = ()) -> _Found:
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
        try:
            demand, search = synthesize_lp(inst.topo, demand, inst.timing, clock.left(), progress, inst.D,
                                           memory_limit=opts.memory_limit, objective=opts.objective, baseline=direct)
            search.lower = max(search.lower, min(lo, search.T))
            used = search.method  # "direct" where the direct AlltoAll was not beaten
        except InputError as e:
            if opts.method != "auto" or e.field != "method":
                raise  # the LP asked for by name: its refusal is the answer
            # auto: an LP over the memory limit leaves the incumbent (the direct AlltoAll), said in progress
            if progress:
                progress({"stage": "method", "method": "incumbent", "lo": lo, "hi": hi, "columns": None, "note": str(e)})
            used = best.name
            search = SearchResult(best.sends, hi, min(lo, hi), best.timed_out or clock.out(), best.probes,
                                  solver_seconds=clock.elapsed())
    else:  # astar
        from flowride.synth.astar import synthesize_astar

        search = synthesize_astar(inst.topo, demand, inst.timing, time_limit=clock.left(), progress=progress, D=inst.D,
                                  must_finish=False)  # the incumbent stands in where the windows cannot finish in time
        search.lower = max(search.lower, min(lo, search.T)) if search.sends is not None else min(lo, hi)
        if search.sends is None or search.T > hi:  # the windows did worse than the trees (or not in time): keep the trees
            used, search.sends, search.T = best.name, best.sends, hi
    if best.ladder and chosen == "lp":  # the LP route may schedule another demand (pieces): compare epochs
        r = min(best.ladder, key=lambda r: r.epochs)
        if r.epochs < search.T or search.sends is None:
            demand, used, search.sends, search.T = r.demand, r.name, r.sends, r.epochs
            search.lower = min(search.lower, r.epochs)
    return _Found(demand, search, used)


def _measure(inst: _Instance, found: _Found, opts: SynthOptions, clock: Clock) -> SynthOutcome:
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

