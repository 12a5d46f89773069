"""``--chunks auto`` (the default): the chunk count is searched, and the time limit is used.

How finely each GPU's block is cut decides how well transfers pipeline (more chunks: less time
waiting for a whole chunk at every hop) against what each chunk costs (more sends, more latency
per byte, bigger models). No count is best everywhere, so the search tries them:

1. **Construction sweep.** One chunk with the requested method (what ``--chunks 1`` runs, with
   :data:`FIRST_SHARE` of the sweep's time: where it is best the search below goes on with it),
   then the fast constructions (the packed trees and tree shapes for AllGather-like collectives;
   the LP route for AlltoAll) at 2, 4, 8, ... chunks, each with a share of the time, keeping the
   best verified schedule. After two doublings in a row that each gained :data:`JUMP_GAIN` it
   quadruples (a count far from the best costs time the larger one needs). It stops when the
   schedule reaches its bound, when three counts in a row gain nothing, when the next count would
   pass the send budget or cut chunks below :data:`MIN_CHUNK_BYTES`, or when time is out: half of
   it, or all of it while one chunk is still best or one of the last two doublings gained at least
   :data:`STRONG_GAIN` (one count that misses, among trees that reach the same rate in different
   shapes, does not end it; such a count gets :data:`KEEP_SHARE` of what is left).
2. **Search.** Counts past the best that were cut short run again first (:func:`_retry_cut_short`).
   Then the requested method's full search (the ladder, the A* windows, the MILP where it is small
   enough) at the best count with the rest of the time, starting from the best schedule, where
   that is at least what the best count took (the search rebuilds its model and constructions
   first); then the other counts cut short.
3. **NCCL's own algorithms**, modelled as schedules (:mod:`flowride.synth.nccl`), are candidates
   too: the result is never slower than NCCL's best modelled algorithm.

The report says what was tried (``chunk_search``) and what was chosen (``chunks``). ``--chunks N``
forces N; the published TE-CCL model (``--teccl-compat``) keeps the published single chunk.
"""

from __future__ import annotations

import math
from dataclasses import replace

from flowride.api.clock import Clock
from flowride.api.outcome import SynthOutcome
from flowride.api.reduction import synthesize_reduction
from flowride.api.single import synthesize_one
from flowride.collectives.demand import Collective, make_demand
from flowride.errors import InputError
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.sizes import MAX_CHUNKS
from flowride.synth.nccl import NcclModel
from flowride.synth.options import SynthOptions
from flowride.synth.result import Progress, SearchResult
from flowride.topology.model import Topology

MIN_CHUNK_BYTES = 4096  # finer chunks only add per-chunk latency in any real runtime
SEND_BUDGET = 3_000_000  # sends of one candidate (the simulator replays about 300k a second)
SWEEP_SHARE = 0.5  # of the time the construction sweep may take before the search
STEP_SHARE = 0.35  # of the sweep's remaining time one chunk count may take
FIRST_SHARE = 0.15  # of the sweep's time the first count (one chunk, the classic search) may take
KEEP_SHARE = 0.8  # of all the time left a count may take while doubling the chunks still gains much
KEEP_GROWTH = 2.0  # such a count is tried if it gets this many times what the last one took (measured: 1.2-1.9)
AT_BOUND = 1.0005  # a finish within this ratio of the bound cannot be bettered in practice
GAIN = 0.002  # a count must improve the best by this much to count as a gain
STRONG_GAIN = 0.005  # while a doubling gains this much, the sweep goes on into the search's time
GROWTH = 2.5  # how much longer the next (doubled) chunk count is taken to need
JUMP_GAIN = 0.015  # after two doublings in a row that each gained this much, the sweep quadruples
STALLS = 3  # counts in a row without a gain before the sweep stops
SEARCH_FACTOR, SEARCH_FLOOR = 2.0, 5.0  # without a time limit: the search's share after the sweep
RETRY_FACTOR, RETRY_CAP = 2.0, 6.0  # a count cut short is run again with 2-6 times the time it had (never less)


def chunk_counts(topo: Topology, size_bytes: int) -> list[int]:
    """1, 2, 4, ... while chunks keep :data:`MIN_CHUNK_BYTES` and stay within MAX_CHUNKS."""
    block = size_bytes / topo.buffer_ranks
    out, c = [], 1
    while c <= MAX_CHUNKS and (c == 1 or block / c >= MIN_CHUNK_BYTES):
        out.append(c)
        c *= 2
    return out


def synthesize_auto(topo: Topology, collective: Collective, size_bytes: int, opts: SynthOptions, clock: Clock,
                    progress: Progress | None = None, warm: tuple[Schedule, ...] = (), nccl: NcclModel | None = None,
                    default_budget: bool = False) -> SynthOutcome:
    """The best verified schedule over chunk counts, methods and NCCL's modelled algorithms (see the
    module); ``warm`` are other sizes' schedules (a sweep), offered at their own chunk counts.
    ``default_budget``: the caller gave no time limit (``clock`` holds the default), so the search
    after the sweep takes what the sweep took again, twice (at least SEARCH_FLOOR seconds), not
    all that is left."""
    coll = collective
    gathers = coll.multicast or coll.reduces
    fast = "trees" if gathers and opts.method == "auto" else opts.method  # a method asked for by name runs at every count

    def one(chunks: int, method: str, budget: float | None, incumbent: tuple = (), base: SynthOptions = opts) -> SynthOutcome:
        d = make_demand(topo, coll, size_bytes, chunks)
        o = replace(base, method=method, time_limit=budget).for_demand(d)
        if coll.reduces:
            return synthesize_reduction(topo, d, o, progress, Clock(budget))
        return synthesize_one(topo, d, o, Clock(budget), progress, incumbent)

    tried: list[dict] = []
    swept: list[SynthOutcome] = []
    best: SynthOutcome | None = None
    fast_best: float | None = None
    stall, gained, gained_before = 0, 0.0, 0.0
    counts = chunk_counts(topo, size_bytes)
    sweep_end = None if clock.limit is None else clock.elapsed() + clock.left() * SWEEP_SHARE
    last_seconds = 0.0
    steps, next_c = 1, counts[0]  # doublings from the last count tried to the next one, and that count
    for i, c in enumerate(counts):
        if c < next_c:
            continue  # jumped over
        if best is not None and clock.out():
            break
        # while one chunk is best no search follows the sweep (one chunk had it), and while doubling
        # the chunks still gains much the next count is worth more than the search: the sweep may
        # then take all the time
        keep_going = best is not None and (best.demand.chunks == 1 or max(gained, gained_before) >= STRONG_GAIN)
        end = clock.elapsed() + clock.left() if keep_going and sweep_end is not None else sweep_end
        gaining = keep_going and best.demand.chunks > 1  # (not: one chunk still best)
        share = FIRST_SHARE if i == 0 else KEEP_SHARE if gaining else STEP_SHARE
        budget = None if end is None else max(1e-3, (end - clock.elapsed()) * share)
        if i >= 2 and end is not None and (last_seconds * KEEP_GROWTH ** steps > budget if gaining
                                           else last_seconds * GROWTH ** steps > end - clock.elapsed()):
            break  # the next count would not finish in its time: doubling chunks costs about this much more
        if progress:
            progress({"stage": "chunks", "chunks": c, "i": i + 1, "of": len(counts),
                      "best_us": best.finish_time_s * 1e6 if best else None})
        same = tuple(w for w in warm if w.chunks == c)
        try:
            out = one(c, opts.method if i == 0 else fast, budget, same)  # one chunk: the classic search, as --chunks 1 runs it
        except InputError as e:
            # the first count must give a schedule: where its share is too short for the baseline
            # alone (checked against the whole limit before), it takes all the time left
            if i > 0 or e.field != "time_limit" or budget is None or clock.left() <= budget:
                raise
            out = one(c, opts.method, clock.left(), same)
        last_seconds = out.wall_seconds
        tried.append(_row(out, "sweep"))
        swept.append(out)
        if best is None or out.finish_time_s < best.finish_time_s:
            best = out
        # gains are judged within the fast constructions (the first count ran another method)
        if i > 0 and (fast_best is None or out.finish_time_s < fast_best * (1 - GAIN)):
            gained_before, gained = gained, 1.0 if fast_best is None else 1 - out.finish_time_s / fast_best
            fast_best, stall = out.finish_time_s, 0
        elif i > 0:
            stall, gained_before, gained = stall + 1, gained, 0.0
        if _at_bound(best) or stall >= STALLS or len(out.schedule.sends) * 2 > SEND_BUDGET:
            break
        # two strong gains in a row: the chunk count is far from its best, and the count between
        # costs time the larger one needs (when that one is expected to fit what is left)
        steps = 2 if (i >= 3 and i + 2 < len(counts) and min(gained, gained_before) >= JUMP_GAIN and gained_before < 1.0
                      and (clock.limit is None or last_seconds * KEEP_GROWTH ** 2 <= KEEP_SHARE * clock.left())) else 1
        next_c = c * 2 ** steps
    assert best is not None
    # one chunk had the whole search already, unless its share of the time cut it short
    searched_one = best.demand.chunks == 1 and not best.search.timed_out
    # a count past the best that was cut short while the sweep still gained is the likelier gain:
    # it has the time before the search
    first = best.demand.chunks
    best = _retry_cut_short(best, [o for o in swept if o.demand.chunks > first], one, fast, clock, tried, progress, default_budget)
    # the search first rebuilds the best count's model and constructions, about what that count
    # took: with less time left it could only overrun (what is left goes to a count cut short)
    room = clock.limit is None or clock.left() >= best.wall_seconds
    if fast != opts.method and not searched_one and not _at_bound(best) and room and not clock.out():
        # the requested method's whole search at the best count, from the best schedule
        c = best.demand.chunks
        if progress:
            progress({"stage": "chunks", "chunks": c, "i": len(tried) + 1, "of": len(tried) + 1, "search": opts.method,
                      "best_us": best.finish_time_s * 1e6})
        search = replace(opts, speedups=replace(opts.speedups, incumbent=False))  # the sweep's best is the incumbent
        budget = clock.left() if not default_budget else min(clock.left(), max(SEARCH_FLOOR, SEARCH_FACTOR * clock.elapsed()))
        out = one(c, search.method, budget, () if coll.reduces else (best.schedule,), search)
        tried.append(_row(out, "search"))
        if out.finish_time_s < best.finish_time_s:
            best = out
    best = _retry_cut_short(best, [o for o in swept if o.demand.chunks <= first], one, fast, clock, tried, progress, default_budget)
    if nccl is not None:
        best = _nccl_if_faster(best, nccl)
        best.nccl = nccl
    best.chunks_requested = "auto"
    best.chunk_search = tried
    best.wall_seconds = clock.elapsed()
    return best


def _retry_cut_short(best: SynthOutcome, swept: list[SynthOutcome], one, fast: str, clock: Clock, tried: list[dict],
                     progress: Progress | None, default_budget: bool) -> SynthOutcome:
    """Counts of the sweep whose construction ran out of its share, run again with more time: what
    is left, at most :data:`RETRY_CAP` times what it had (best finish first; one that would get
    under :data:`RETRY_FACTOR` times what it had is skipped). The sweep's shares are fractions of
    the limit, so without this a longer limit could end on a count cut short that a shorter one had
    finished (an AlltoAll's LP route at 16 chunks on the DGX-1 NVLinks: 21.25 us in its 1 s share,
    14.38 us in 3.6 s), and where no search follows (AlltoAll) the time after the sweep went unused."""
    end = clock.limit if not default_budget or clock.limit is None else min(clock.limit, max(SEARCH_FLOOR, SEARCH_FACTOR * clock.elapsed()))
    for o in sorted((o for o in swept if o.search.timed_out), key=lambda o: o.finish_time_s):
        if end is None or _at_bound(best):
            break
        left = end - clock.elapsed()
        if left < RETRY_FACTOR * o.wall_seconds:
            continue
        c = o.demand.chunks
        if progress:
            progress({"stage": "chunks", "chunks": c, "i": len(tried) + 1, "of": len(tried) + 1, "best_us": best.finish_time_s * 1e6})
        budget = min(left, RETRY_CAP * o.wall_seconds)
        out = one(c, o.schedule.meta.get("method_requested") or fast, budget, () if o.demand.collective.reduces else (o.schedule,))
        tried.append(_row(out, "retry"))
        if out.finish_time_s < best.finish_time_s:
            best = out
    return best


def _row(o: SynthOutcome, phase: str) -> dict:
    return {"chunks": o.demand.chunks, "phase": phase, "method": o.schedule.meta.get("method"),
            "finish_us": o.finish_time_s * 1e6, "epochs": o.sim.epochs, "seconds": round(o.wall_seconds, 3),
            "ratio_to_lower_bound": o.finish_time_s / o.bounds.best_s if o.bounds.best_s > 0 else None}


def _at_bound(o: SynthOutcome) -> bool:
    """At the bound in seconds (an epoch count proven minimal for one chunk count is not: more
    chunks may still do better)."""
    return o.bounds.best_s > 0 and o.finish_time_s <= o.bounds.best_s * AT_BOUND


def _nccl_if_faster(best: SynthOutcome, nccl: NcclModel) -> SynthOutcome:
    """NCCL's fastest simulated algorithm, as the outcome, where it beats ``best`` (then the
    schedule is NCCL's, and the report's method says so)."""
    sims = [m for m in nccl.algorithms.values() if m.schedule is not None]
    if not sims:
        return best
    m = min(sims, key=lambda m: m.time_us)
    if m.time_us >= best.finish_time_s * 1e6:
        return best
    sched = m.schedule
    sim = simulate(sched)
    if not sim.valid:  # the modelled algorithms were verified when built; this guards them
        return best
    sched.meta.update({"method": f"nccl {m.name} (modelled)", "status": "feasible", "epochs": sim.epochs,
                       "method_requested": best.schedule.meta.get("method_requested")})
    lower = int(math.ceil(best.bounds.best_s / sim.tau - 1e-9)) if best.bounds.best_s > 0 else 0
    search = SearchResult(sched.sends, int(sim.epochs), min(lower, int(sim.epochs)), best.search.timed_out, best.search.probes,
                          solver_seconds=best.search.solver_seconds)
    return SynthOutcome(sched, sim, sched.demand, best.bounds, best.baseline_name, best.baseline, search, {"time": lower},
                        "feasible", best.wall_seconds, best.nccl)
