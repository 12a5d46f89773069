"""ReduceScatter and AllReduce: built from AllGather syntheses run backwards in time
(:mod:`flowride.schedule.reduce`), the AllGathers found by :func:`flowride.api.single.synthesize_one`."""

from __future__ import annotations

import math
from dataclasses import replace

from flowride.api.clock import Clock
from flowride.api.outcome import SynthOutcome
from flowride.api.single import synthesize_one
from flowride.collectives.demand import Collective, Demand, make_demand
from flowride.schedule.ir import Schedule
from flowride.schedule.reduce import allreduce_from_allgather, reduce_scatter_from_allgather
from flowride.schedule.simulate import simulate
from flowride.synth.bounds import lower_bounds
from flowride.synth.greedy import baseline_sends
from flowride.synth.options import SynthOptions
from flowride.synth.result import Progress, SearchResult
from flowride.topology.model import Topology
from flowride.topology.timing import epoch_timing


def _allgather(topo: Topology, demand: Demand, opts: SynthOptions, progress: Progress | None) -> SynthOutcome:
    ag = make_demand(topo, Collective.ALLGATHER, demand.size_bytes, demand.chunks)
    return synthesize_one(topo, ag, opts.for_demand(ag), Clock(opts.time_limit), progress, keep_baseline=True)


def _baseline(ag: SynthOutcome, topo: Topology, timing) -> Schedule:
    """The AllGather's baseline schedule at ``timing``: the one its synthesis built and measured
    where it is at these epochs and chunks (the ring costs seconds at many chunks), else built."""
    base = ag.baseline_schedule
    if base is not None and base.topology is topo and base.tau == timing.tau and base.chunks == ag.demand.chunks:
        return base
    return Schedule.from_tuples(topo, ag.demand, timing.tau, baseline_sends(topo, ag.demand, timing)[1], {"method": ag.baseline_name})


def synthesize_reduction(topo: Topology, demand: Demand, opts: SynthOptions, progress: Progress | None, clock: Clock) -> SynthOutcome:
    """ReduceScatter: the AllGather synthesized on the reversed topology, run backwards in time.
    AllReduce: that ReduceScatter, then the AllGather on the topology itself (the same schedule when
    the links are symmetric). The baseline is the ring AllGather treated the same way.

    Proven minimal only for a ReduceScatter without switches: there time reversal is exact (every
    capacity window and delay mirrors), so the minimal AllGather on the reversed links gives the
    minimal ReduceScatter."""
    is_ar = demand.collective is Collective.ALLREDUCE
    same = topo.symmetric()
    time_limit = opts.time_limit
    budget = time_limit if not is_ar or same or time_limit is None else time_limit / 2
    rev_topo = topo if same else topo.reversed()
    rev = _allgather(rev_topo, demand, replace(opts, time_limit=budget), progress)
    fwd = rev
    if is_ar and not same:
        fwd = _allgather(topo, demand, replace(opts, time_limit=clock.left()), progress)

    def build(r: Schedule, f: Schedule) -> Schedule:
        if is_ar:
            return allreduce_from_allgather(r, f, topo)
        return reduce_scatter_from_allgather(r, topo)

    sched = build(rev.schedule, fwd.schedule)
    sim = simulate(sched)
    if not sim.valid:
        raise AssertionError(f"reduction schedule failed verification: {sim.first_violation}")
    timing = rev.schedule.timing
    rev_base = _baseline(rev, rev_topo, timing)
    fwd_base = rev_base
    if is_ar and not same:
        fwd_base = _baseline(fwd, topo, fwd.schedule.timing)
    base_sim = simulate(build(rev_base, fwd_base))
    bounds = lower_bounds(topo, demand, timing=epoch_timing(topo, demand.chunk_bytes, sim.tau))
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
        parts=(rev.schedule, fwd.schedule) if is_ar else (rev.schedule,),
    )
