"""Never slower with more links: the schedule of the topology's faster links, as a candidate.

A topology that adds links to another can always run the smaller one's schedule, so its schedule
should never be slower. The epoch model breaks that on its own: ``--epoch slow`` cuts time into
epochs of one chunk over the *slowest* link, so adding slow links (a DGX-1's PCIe tree beside its
NVLinks, as ``nvidia-smi topo -m`` imports it) stretches every epoch, and every NVLink hop with it.
The imported DGX-1V gave 7.32 µs for an AllGather of 1 MB where the NVLinks alone gave 6.875 µs.

So, where dropping the slowest classes of links changes the epoch and still leaves every GPU
reaching every other, the same synthesis also runs on those faster subgraphs (each with a share of
the time limit, before the whole topology takes the rest). A subgraph's schedule uses links the
whole topology has, at the same bandwidth and latency, so it is relinked onto the whole topology,
replayed there by the simulator (still the only judge) and kept where it finishes first. The report
says so in its ``method`` and ``subgraph`` fields; the bounds stay the whole topology's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from flowride.api.outcome import SynthOutcome
from flowride.errors import InputError
from flowride.schedule.ir import Schedule, Send
from flowride.schedule.simulate import simulate
from flowride.synth.result import SearchResult
from flowride.topology.model import Topology
from flowride.topology.timing import resolve_tau

# Of the time limit all subgraphs together may take (each stops early when its search is done, and
# leaves the rest to the next). More than half: the whole topology's slow epoch is stretched by
# its slowest links, so it seldom wins where a subgraph exists (docs/benchmarks.md, "More links").
SUBGRAPH_SHARE = 0.6
MAX_SUBGRAPHS = 3  # the fastest connected one first, then the larger ones


def fast_subgraphs(topo: Topology, chunk_bytes: float, epoch: str | float) -> list[Topology]:
    """The topology without its slowest link classes, fastest-only first, where that still lets
    every GPU reach every other and gives a shorter epoch than the whole topology (at most
    :data:`MAX_SUBGRAPHS`). Empty for the published model, whose epochs are fixed by the paper."""
    if topo.teccl_compat:
        return []
    tau = resolve_tau(topo, chunk_bytes, epoch)[0]
    out: list[Topology] = []
    for floor in sorted({lk.bandwidth_GBps for lk in topo.links})[:0:-1]:  # the fastest-only subgraph first
        keep = tuple(lk for lk in topo.links if lk.bandwidth_GBps >= floor)
        try:
            sub = replace(topo, links=keep, name=f"{topo.name} [links of {floor:g} GB/s and up]")
        except InputError:
            continue  # some GPU is cut off: a lower floor may still join them
        if resolve_tau(sub, chunk_bytes, epoch)[0] < tau * (1 - 1e-9):
            out.append(sub)
        if len(out) == MAX_SUBGRAPHS:
            break
    return out


def best_with_subgraphs(topo: Topology, subs: list[Topology], time_limit: float | None,
                        run: Callable[[Topology, float | None, bool], SynthOutcome],
                        elapsed: Callable[[], float]) -> SynthOutcome:
    """``run(topology, time_limit, whole)`` on each of ``subs`` (:func:`fast_subgraphs`; each a share
    of the time) and then on the whole topology (what is left), keeping the schedule that finishes
    first on the whole."""
    found: list[SynthOutcome] = []
    pool_end = None if time_limit is None else elapsed() + time_limit * SUBGRAPH_SHARE
    for i, sub in enumerate(subs):  # each takes an equal part of what the earlier ones left of the pool
        share = None if pool_end is None else max(1e-3, (pool_end - elapsed()) / (len(subs) - i))
        try:
            found.append(run(sub, share, False))
        except InputError:
            continue  # e.g. a share too short for this subgraph's baseline: the whole topology still runs
    rest = None if time_limit is None else max(1e-3, time_limit - elapsed())
    best = run(topo, rest, True)
    for out in found:
        if out.finish_time_s < best.finish_time_s * (1 - 1e-9):
            cand = relinked(out, topo, best)
            if cand is not None and cand.finish_time_s < best.finish_time_s * (1 - 1e-9):
                best = cand
    return best


def relinked(out: SynthOutcome, topo: Topology, whole: SynthOutcome) -> SynthOutcome | None:
    """A subgraph's outcome moved onto ``topo`` (same nodes, a superset of its links), replayed
    there and measured against the whole topology's bounds, baseline and NCCL model (``whole``'s).
    None if the replay rejects it (it should not: the links and their prices are the same)."""
    sub = out.schedule.topology
    index = topo.link_index
    where = [index[(lk.src, lk.dst)] for lk in sub.links]
    sends = [Send(s.epoch, where[s.link], s.source, s.chunk, s.reduce) for s in out.schedule.sends]
    meta = dict(out.schedule.meta)
    meta.update({"method": f"{meta.get('method')} on the faster links' subgraph",
                 "subgraph": f"{len(sub.links)} of {len(topo.links)} links ({sub.name.removeprefix(topo.name).strip(' []')})"})
    sched = Schedule(topo, out.schedule.collective, out.schedule.size_bytes, out.schedule.chunks, out.schedule.tau, sends, meta)
    sim = simulate(sched)
    if not sim.valid:
        return None
    lower = int(math.ceil(whole.bounds.best_s / sim.tau - 1e-9)) if whole.bounds.best_s > 0 else 0
    search = SearchResult([(s.epoch, s.link, s.source, s.chunk) for s in sends], int(sim.epochs), min(lower, int(sim.epochs)),
                          out.search.timed_out or whole.search.timed_out, out.search.probes + whole.search.probes,
                          solver_seconds=out.search.solver_seconds + whole.search.solver_seconds)
    status = "feasible"  # its epochs may be minimal on the subgraph; on the whole topology nothing is proven
    return SynthOutcome(sched, sim, sched.demand, whole.bounds, whole.baseline_name, whole.baseline, search,
                        {"time": lower}, status, whole.wall_seconds, whole.nccl, whole.chunks_requested,
                        whole.chunk_search + [dict(r, phase=f"subgraph {r.get('phase')}") for r in out.chunk_search],
                        parts=out.parts)
