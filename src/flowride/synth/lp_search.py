"""AlltoAll through the LP: the search on the horizon, the decomposition into whole chunks, the
integral polish, finer pieces, and the static LP for instances too large to expand.

The model itself (columns, the constraint families, objectives) is :mod:`flowride.synth.lp`;
this module decides which models to solve, in what order, within the time limit, and keeps the
verified schedule that finishes first (:func:`synthesize_lp` lists the steps).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from flowride.collectives.demand import Demand, make_demand
from flowride.errors import InputError
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.synth.bounds import epoch_lower_bound
from flowride.synth.budget import LP_MAX_COLUMNS, MEMORY_LIMIT_BYTES, lp_size, static_lp_bytes
from flowride.synth.flow import (
    FlowPath,
    choose_pieces,
    rounding_loss,
    schedule_paths,
    unicast_needs,
)
from flowride.synth.greedy import direct_alltoall
from flowride.synth.highs import SolveOptions, solve
from flowride.synth.lp import LpIndex, build_lp, decompose_flow, integral_flow
from flowride.synth.lp_static import (
    STATIC_BOUND_COLUMNS,
    concurrent_flow,
    static_paths,
    symmetric_flow,
    symmetric_paths,
)
from flowride.synth.matched import MATCHED_SPREADS, matched_alltoall
from flowride.synth.options import OBJECTIVES
from flowride.synth.reach import epoch_distances
from flowride.synth.result import Probe, Progress, SearchResult, Send
from flowride.synth.rows import Infeasible
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming, epoch_timing

INTEGRAL_LP_FACTOR = 2.0  # an integral solve is tried with at least this many times the LP's time
POLISH_SECONDS = 10.0  # the integral polish without a time limit (with one: the budget)


@dataclass
class LpHorizon:
    """The smallest LP-feasible horizon found and the LP's flows there."""

    T: int | None  # None: no feasible LP solved (time ran out)
    lower: int  # every horizon below is LP-infeasible, hence infeasible for any schedule
    idx: LpIndex | None
    x: np.ndarray | None
    probes: list[Probe]
    timed_out: bool
    solver_seconds: float


def min_lp_horizon(
    topo: Topology,
    demand: Demand,
    timing: EpochTiming,
    lo: int | None = None,
    hi: int | None = None,
    guess: int | None = None,
    time_limit: float | None = None,
    progress: Progress | None = None,
    D: np.ndarray | None = None,
    pieces: int = 1,
) -> LpHorizon:
    """Smallest T in [lo, hi] whose LP is feasible. ``lo`` defaults to the farthest delivery's
    latency (no flow arrives sooner), ``hi`` to the direct AlltoAll's epochs (a schedule, so its
    LP is feasible). Probes ``guess`` first (bounds are often tight), then one below it, gallops
    up from an infeasible guess, and bisects once both ends are known."""
    t0 = time.perf_counter()
    if D is None:
        D = epoch_distances(topo, timing)
    sources, need = unicast_needs(topo, demand)
    ps, pg = np.nonzero(need)
    lat = int(D[sources[ps], pg].max()) if len(ps) else 0
    lo = lat if lo is None else max(lo, lat)
    if hi is None:
        base = simulate(Schedule.from_tuples(topo, demand, timing.tau, direct_alltoall(topo, demand, timing)))
        hi = int(base.epochs)
    hi = max(hi, lo)
    T = min(max(lo if guess is None else guess, lo), hi)
    out = LpHorizon(None, lo, None, None, [], False, 0.0)
    step = 1
    below_tried = False
    while True:
        remaining = None if time_limit is None else time_limit - (time.perf_counter() - t0)
        if remaining is not None and remaining <= 0:
            out.timed_out = True
            break
        if progress:
            progress({"stage": "lp", "T": T, "lo": lo, "hi": hi, "pieces": pieces, "elapsed": time.perf_counter() - t0})
        ps0 = time.perf_counter()
        try:
            model, idx = build_lp(topo, demand, timing, T, D)
        except Infeasible:
            out.probes.append(Probe(T, "infeasible", time.perf_counter() - ps0, 0, 0))
            feasible = False
        else:
            res = solve(model, SolveOptions(time_limit=remaining))
            out.solver_seconds += res.seconds
            # costs and columns are >= 0, so the LP is bounded: "infeasible or unbounded" is infeasible
            if res.status == "optimal" and res.x is not None:
                feasible = True
                out.T, out.idx, out.x = T, idx, res.x
            elif res.status == "infeasible" or "infeasible" in res.raw_status.lower():
                feasible = False
            else:
                outcome = "timeout" if res.status.startswith("timeout") or res.status == "feasible-timeout" else f"solver {res.raw_status}"
                out.probes.append(Probe(T, outcome, time.perf_counter() - ps0, model.num_cols, model.num_rows))
                out.timed_out = True
                break
            out.probes.append(Probe(T, "feasible" if feasible else "infeasible", time.perf_counter() - ps0, model.num_cols, model.num_rows))
        if feasible:
            hi = T
        else:
            lo = T + 1
            if lo > hi:  # ``hi`` was no feasible horizon after all: search on above it
                hi = 2 * lo
        if progress:
            progress({"stage": "lp-probed", "T": T, "outcome": out.probes[-1].outcome, "lo": lo, "hi": hi, "pieces": pieces, "elapsed": time.perf_counter() - t0})
        if lo >= hi:
            if out.T == hi:
                break
            T = hi  # known feasible, solution still wanted
        elif out.T is None:
            T = min(hi, lo + step - 1)  # gallop up from the infeasible end
            step *= 2
        elif not below_tried:
            T = hi - 1
            below_tried = True
        else:
            T = (lo + hi) // 2
    out.lower = lo
    return out


@dataclass
class LpSearch(SearchResult):
    """A SearchResult with what the LP route adds: its horizon and how chunks were cut."""

    lp_T: int | None = None  # smallest LP-feasible horizon (from the epoch bounds up) of the returned demand
    pieces: int = 1  # pieces per input chunk in the returned demand
    rounding_loss: float = 0.0
    fallback_chunks: int = 0  # (pieces of) chunks sent along fewest-epoch routes, not LP paths
    method: str = "lp"  # lp | matched (the matched rounds won) | direct (no LP solved in time, or its decomposition was rejected)
    static: bool = False  # the instance was too large to expand in time: the static LP's paths
    objective: str = "makespan"  # weighted: the published single-LP objective made the schedule


def _realize(topo, demand, timing, paths: list[FlowPath], pieces_per_unit: int) -> tuple[list[Send], int, int] | None:
    """List-schedule ``paths`` for ``demand`` both ways (at LP epochs where they fit, or always
    as early as possible), replay each, and keep the verified one finishing first (None if the
    replay rejects both: the scheduler keeps the simulator's rules, so this guards it)."""
    best = None
    for at_lp in (True, False):
        sends, fb = schedule_paths(topo, demand, timing, paths, pieces_per_unit, at_lp)
        sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, sends))
        if sim.valid and (best is None or sim.epochs < best[1]):
            best = (sends, int(sim.epochs), fb)
    return best


@dataclass
class Candidate:
    """One verified schedule the LP route produced."""

    T: int
    sends: list[Send]
    loss: float  # rounding loss of the flow it came from
    fallback: int
    method: str


@dataclass
class _Level:
    """What is known for one granularity (chunks cut in ``pieces``): its demand and timing, the
    best lower bound on its epochs, its LP horizon, and its best schedule so far."""

    pieces: int
    demand: Demand
    timing: EpochTiming
    D: np.ndarray
    lower: int
    lp_T: int | None = None
    lp_seconds: float = 0.0  # the last feasible LP solve: an integral solve starts with one
    best: Candidate | None = None

    def offer(self, c: Candidate | None) -> None:
        if c is not None and (self.best is None or c.T < self.best.T):
            self.best = c

    @property
    def open(self) -> bool:
        return self.best is None or self.best.T > self.lower


def _static(topo, demand, timing, one: _Level, base, base_T: int, time_limit, report) -> LpSearch:
    """The static LP's paths list-scheduled at ``timing``; the direct AlltoAll if that is not
    sooner or the LP is not solved in time."""
    t0 = time.perf_counter()
    one.offer(Candidate(base_T, base, 0.0, 0, "direct"))

    def left() -> float | None:
        return None if time_limit is None else max(1e-3, time_limit - (time.perf_counter() - t0))

    def offer(paths: list[FlowPath], how: str) -> None:
        sends, fb = schedule_paths(topo, demand, timing, paths, 1, at_lp_epochs=False)
        sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, sends))
        if sim.valid:  # the scheduler keeps the simulator's rules; this guards it
            one.offer(Candidate(int(sim.epochs), sends, 0.0, fb, "lp"))
            report("decompose", static=how, epochs=int(sim.epochs), lower=one.lower)

    probes: list[Probe] = []
    solver_s, solved = 0.0, False
    columns = len(topo.links) * len(topo.gpus)
    if columns > STATIC_BOUND_COLUMNS:
        # large: first the LP over the orbit representatives' flows only (a 16x32 torus: 2,048
        # columns for one orbit, seconds, against minutes of interior point for the full LP)
        ps = time.perf_counter()
        report("static-lp", columns=len(topo.links), symmetric=True)
        sf = symmetric_flow(topo, left())  # cached: the flow bound may have solved it already
        if sf is not None:
            probes.append(Probe(0, "static symmetric " + sf.status, time.perf_counter() - ps, len(sf.f_s) + 1, 0))
            solver_s += sf.seconds
            if sf.status == "optimal":
                offer(symmetric_paths(topo, demand, sf), "symmetric")
                solved = True
    if not solved:
        ps = time.perf_counter()
        report("static-lp", columns=columns)
        cf = concurrent_flow(topo, left())
        probes.append(Probe(0, "static " + cf.status, time.perf_counter() - ps, len(cf.f_s) + 1, 0))
        solver_s += cf.seconds
        if cf.status == "optimal":
            offer(static_paths(topo, demand, cf), "full")
            solved = True
    b = one.best
    return LpSearch(b.sends, b.T, one.lower, not solved, probes, solver_seconds=solver_s,
                    fallback_chunks=b.fallback, method=b.method, static=True, objective="static flow")


def _weighted(topo, demand, timing, D, one: _Level, base, base_T: int, time_limit, report) -> LpSearch:
    """The published objective: one LP at a feasible horizon (the direct AlltoAll's epochs),
    rewarding early delivery by 1/(t+1), decomposed and list-scheduled; the direct AlltoAll if
    that is not sooner."""
    ps = time.perf_counter()
    report("weighted-lp", T=base_T)
    model, idx = build_lp(topo, demand, timing, base_T, D, objective="weighted")
    res = solve(model, SolveOptions(time_limit=time_limit))
    probe = Probe(base_T, "weighted " + res.status, time.perf_counter() - ps, model.num_cols, model.num_rows)
    if res.status == "optimal" and res.x is not None:
        got = _realize(topo, demand, timing, decompose_flow(topo, timing, idx, res.x), 1)
        if got is not None:
            one.offer(Candidate(got[1], got[0], 0.0, got[2], "lp"))
    one.offer(Candidate(base_T, base, 0.0, 0, "direct"))  # only if strictly sooner
    b = one.best
    return LpSearch(b.sends, b.T, one.lower, res.status != "optimal", [probe], solver_seconds=res.seconds,
                    fallback_chunks=b.fallback, method=b.method, objective="weighted" if b.method == "lp" else "makespan")


class _LpRun:
    """The clock and the record of one :func:`synthesize_lp` call: every probe and solver second,
    whether time cut anything short, and the polish's own deadline (moved on by the time the LP
    searches take, so they do not eat the polish's share)."""

    def __init__(self, topo: Topology, time_limit: float | None, progress: Progress | None, polish_seconds: float | None):
        self.topo, self.time_limit, self.progress = topo, time_limit, progress
        self.t0 = time.perf_counter()
        if polish_seconds is None:  # the budget: all that is left of the time limit (less a margin)
            polish_seconds = POLISH_SECONDS if time_limit is None else max(POLISH_SECONDS, 0.9 * time_limit)
        self.polish_end = self.t0 + polish_seconds
        self.probes: list[Probe] = []
        self.solver_s = 0.0
        self.timed_out = False

    def left(self) -> float | None:
        return None if self.time_limit is None else max(0.0, self.time_limit - (time.perf_counter() - self.t0))

    def report(self, stage: str, **kw) -> None:
        if self.progress:
            self.progress({"stage": stage, **kw, "elapsed": time.perf_counter() - self.t0})

    def _lp_progress(self, ev: dict) -> None:  # elapsed since this call, not since the LP search began
        self.report(ev.pop("stage"), **{k: v for k, v in ev.items() if k != "elapsed"})

    def lp_search(self, lvl: _Level, hi: int | None, guess: int | None, budget: float | None = None) -> LpHorizon:
        ts = time.perf_counter()
        hz = min_lp_horizon(self.topo, lvl.demand, lvl.timing, lo=lvl.lower, hi=hi, guess=guess, time_limit=budget or self.left(),
                            progress=self._lp_progress if self.progress else None, D=lvl.D, pieces=lvl.pieces)
        self.polish_end += time.perf_counter() - ts
        self.probes.extend(hz.probes)
        self.solver_s += hz.solver_seconds
        self.timed_out = self.timed_out or hz.timed_out
        lvl.lower = max(lvl.lower, hz.lower)
        lvl.lp_T = hz.T
        lvl.lp_seconds = max([p.seconds for p in hz.probes if p.outcome == "feasible"], default=0.0)
        return hz

    def realize(self, lvl: _Level, paths: list[FlowPath], per_unit: int, lp_T: int | None, loss: float) -> None:
        got = _realize(self.topo, lvl.demand, lvl.timing, paths, per_unit)
        if got is not None:
            lvl.offer(Candidate(got[1], got[0], loss, got[2], "lp"))
            self.report("decompose", pieces=lvl.pieces, lp_T=lp_T, epochs=got[1], loss=loss)

    def polish(self, lvl: _Level, share: float = 1.0) -> None:
        """Integral flows, anytime: first at the lower bound (one solve: often the answer, or a
        proof that raises the bound), then downward from one epoch under the best schedule, each
        feasible point a better schedule, until an infeasible horizon proves the best optimal,
        or the polish time (``share`` of what is left of it) runs out."""
        end = time.perf_counter() + share * max(0.0, self.polish_end - time.perf_counter())
        tried_bottom = False
        while lvl.open:
            T = lvl.lower if not tried_bottom else lvl.best.T - 1
            tried_bottom = True
            budget = end - time.perf_counter()
            if self.time_limit is not None:
                budget = min(budget, self.left())
            # the MIP presolves (probing: as long as the LP itself on h800 x 2's AlltoAll), then
            # solves its root LP before any point can be found, and HiGHS checks its time limit
            # coarsely in both: with less than twice the LP's time it found nothing and overran
            # (3.6 s given, 4.8 s taken)
            if budget <= INTEGRAL_LP_FACTOR * lvl.lp_seconds:
                return
            self.report("integral", T=T, pieces=lvl.pieces, best=lvl.best.T, lower=lvl.lower)
            outcome, idx, x, probe, secs = integral_flow(self.topo, lvl.demand, lvl.timing, T, lvl.D, budget)
            self.probes.append(probe)
            self.solver_s += secs
            if outcome == "feasible":
                self.realize(lvl, decompose_flow(self.topo, lvl.timing, idx, x), 1, T, 0.0)
                continue
            if outcome != "infeasible":
                self.timed_out = self.timed_out or self.time_limit is not None and self.left() <= 0
                return
            lvl.lower = max(lvl.lower, T + 1)  # no integral flow, so no schedule, in T epochs


def synthesize_lp(
    topo: Topology,
    demand: Demand,
    timing: EpochTiming,
    time_limit: float | None = None,
    progress: Progress | None = None,
    D: np.ndarray | None = None,
    max_pieces: int = 8,
    polish_seconds: float | None = None,
    objective: str = "makespan",
    baseline: tuple[list[Send], int] | None = None,
    max_columns: int = LP_MAX_COLUMNS,
    memory_limit: int = MEMORY_LIMIT_BYTES,
    matched: bool = True,
) -> tuple[Demand, LpSearch]:
    """AlltoAll (any copy-free demand) through the LP form and its decomposition.

    0. ``matched``: first the matched rounds (:mod:`flowride.synth.matched`), two routings, each
       a list scheduling; one that meets the epoch lower bound ends the search (method
       "matched"), else it stands as an incumbent the LP's schedules must beat.

    1. The smallest horizon T, from the epoch lower bounds up, whose LP is feasible
       (:func:`min_lp_horizon`; no schedule exists below those bounds, so smaller LP horizons
       would not help), and the LP's flow there, decomposed into paths (:func:`decompose_flow`).
    2. Whole chunks dealt to the paths and list-scheduled (:func:`schedule_paths`).
    3. If that is above the lower bound: the same model with integer flows from the bound up
       (:func:`integral_flow`, at most ``polish_seconds`` in all, and only if one LP solve fits
       in what is left of them). An integral flow is a schedule in exactly its horizon; an
       integral infeasibility raises the bound.
    4. If the best whole-chunk schedule is still later than the LP horizon, and dealing whole
       chunks moves more than MAX_ROUNDING_LOSS of the flow off its path: chunks cut in k pieces
       (k = 2, 4, ..., ``max_pieces``), i.e. the demand
       ``make_demand(topo, collective, size, chunks * k)``, with the same total bytes and the
       same epoch length tau, its timing recomputed (a smaller piece may cross a slow link in
       fewer epochs). Its schedules: the whole-chunk paths carrying k pieces per unit of flow; the
       pieces' own LP decomposed; the integer polish again.
    5. Every schedule is replayed by the simulator (``baseline``: the direct AlltoAll's sends and
       epochs when the caller has them); the one finishing in fewest epochs (the same
       tau, so the earliest finish) wins, the fewest pieces on ties. The direct AlltoAll is one
       of them.

    ``objective="weighted"`` replaces steps 1-4 with the published TE-CCL form: one LP at the
    direct AlltoAll's horizon rewarding each unit delivered at epoch t by 1/(t+1)
    (:func:`flowride.synth.lp.weighted_delivery_objective`), decomposed and list-scheduled (step 5 still applies).

    Instances whose time-expanded LP would have more than ``max_columns`` columns, or whose LP
    search finds no horizon in half of ``time_limit``, take the static LP instead
    (:mod:`flowride.synth.lp_static`: the concurrent flow, its paths list-scheduled; ``static``
    in the result); it is refused (:class:`InputError`) when its estimated memory exceeds
    ``memory_limit``.

    Returns (the demand scheduled, an :class:`LpSearch`): ``sends`` for that demand, ``T`` its
    simulated epochs, ``lower`` the best lower bound on epochs known for that demand at that tau:
    the LP horizon is one, since the LP is a relaxation of every schedule (:mod:`flowride.synth.lp`), and
    so are the bounds of :func:`epoch_lower_bound` and an infeasible integral probe. ``probes``
    lists every solve. If no LP is solved within ``time_limit`` the direct AlltoAll is returned
    (``method`` "direct"). Raises ValueError for a demand that is not copy-free (AllGather,
    reductions).
    """
    run = _LpRun(topo, time_limit, progress, polish_seconds)
    left, report = run.left, run.report
    unicast_needs(topo, demand)  # raises ValueError unless copy-free
    if D is None:
        D = epoch_distances(topo, timing)
    one = _Level(1, demand, timing, D, max(epoch_lower_bound(topo, demand, timing, D, left()).values()))
    if baseline is None:  # the caller may have it already: on 512 GPUs it takes half a minute
        base = direct_alltoall(topo, demand, timing)
        base_T = int(simulate(Schedule.from_tuples(topo, demand, timing.tau, base)).epochs)
    else:
        base, base_T = baseline
    if objective not in OBJECTIVES:
        raise InputError("objective", f"{objective!r} is not an objective", f"use one of {', '.join(OBJECTIVES)}")
    if objective == "weighted" and lp_size(topo, demand, timing, base_T, D) <= max_columns:
        return demand, _weighted(topo, demand, timing, D, one, base, base_T, left(), report)
    too_large = lp_size(topo, demand, timing, int(one.lower * 1.1) + 1, D) > max_columns
    if too_large and static_lp_bytes(topo) > memory_limit:  # refused before any work
        need = static_lp_bytes(topo)
        raise InputError("method", f"the static LP would need about {need / 2**30:.1f} GiB, over the "
                         f"{memory_limit / 2**30:.0f} GiB memory limit", "raise --memory-limit, or split the topology")
    took = 0.0
    for spread in MATCHED_SPREADS if matched else ():  # the matched rounds: list scheduling that may meet the bound outright
        if time_limit is not None and (left() <= 0 or took * 4 > left()):
            break  # (seconds on a 16 x 16 torus): the LP's time comes first
        ts = time.perf_counter()
        sends = matched_alltoall(topo, demand, timing, spread)
        took = time.perf_counter() - ts
        sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, sends))
        if sim.valid:  # the LinkBook keeps the simulator's rules; this guards it
            one.offer(Candidate(int(sim.epochs), sends, 0.0, 0, "matched"))
            report("matched", spread=spread, epochs=int(sim.epochs), lower=one.lower)
    if not one.open:  # at the epoch bound: no LP can finish sooner
        b = one.best
        return demand, LpSearch(b.sends, b.T, one.lower, False, [], method=b.method)
    if too_large:  # too large to expand in time: the static LP (bandwidth decides such instances)
        return demand, _static(topo, demand, timing, one, base, base_T, left(), report)
    # half the time for the time-expanded LP: if it cannot even find a horizon, the static LP can
    hz = run.lp_search(one, base_T, None, None if time_limit is None else left() / 2)
    if hz.T is None:
        if static_lp_bytes(topo) <= memory_limit and (time_limit is None or left() > 0):
            st = _static(topo, demand, timing, one, base, base_T, left(), report)
            st.probes[:0] = run.probes
            st.solver_seconds += run.solver_s
            st.timed_out = True  # the time-expanded LP ran out of time
            return demand, st
        one.offer(Candidate(base_T, base, 0.0, 0, "direct"))
        b = one.best
        return demand, LpSearch(b.sends, b.T, one.lower, run.timed_out, run.probes, solver_seconds=run.solver_s, method=b.method)

    sources, need_arr = unicast_needs(topo, demand)
    need = {(int(sources[a]), int(b)): int(need_arr[a, b]) for a, b in zip(*np.nonzero(need_arr), strict=True)}
    paths = decompose_flow(topo, timing, hz.idx, hz.x)
    run.realize(one, paths, 1, hz.T, rounding_loss(paths, need, 1))
    # the direct AlltoAll is a schedule of this demand too: list scheduling the LP's paths may
    # lose to it by an epoch where the LP's own horizon is the direct one (one switch, say)
    one.offer(Candidate(base_T, base, 0.0, 0, "direct"))
    run.polish(one, share=0.5)  # the other half for finer pieces, if they are tried
    levels = [one]

    k, loss = choose_pieces(paths, need, demand, max_pieces)
    # finer pieces only where the fluid LP finishes sooner than the best whole-chunk schedule
    if k > 1 and one.best.T > hz.T and (time_limit is None or left() > 0):
        dk = make_demand(topo, demand.collective, demand.size_bytes, demand.chunks * k)
        tk = epoch_timing(topo, dk.chunk_bytes, timing.tau)
        Dk = epoch_distances(topo, tk)
        lvl = _Level(k, dk, tk, Dk, max(epoch_lower_bound(topo, dk, tk, Dk).values()))
        run.realize(lvl, paths, k, None, loss)  # the whole-chunk paths, k pieces per unit of flow
        # the pieces' own LP, unless the whole-chunk paths cut in pieces already meet its bound
        hzk = run.lp_search(lvl, None if lvl.best is None else lvl.best.T, hz.T) if lvl.open else None
        if hzk is not None and hzk.T is not None:
            pk = decompose_flow(topo, tk, hzk.idx, hzk.x)
            run.realize(lvl, pk, 1, hzk.T, rounding_loss(pk, {pair: n * k for pair, n in need.items()}, 1))
        if lvl.best is not None:
            run.polish(lvl)
            levels.append(lvl)

    win = min(levels, key=lambda lv: (lv.best.T, lv.pieces))
    b = win.best
    res = LpSearch(b.sends, b.T, win.lower, run.timed_out, run.probes, solver_seconds=run.solver_s, lp_T=win.lp_T,
                   pieces=win.pieces, rounding_loss=b.loss, fallback_chunks=b.fallback, method=b.method)
    return win.demand, res
