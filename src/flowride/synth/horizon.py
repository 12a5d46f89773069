"""Finding the horizon: bisection on the number of epochs with feasibility probes.

The lower end comes from sound epoch bounds (latency, per-GPU ingress, chassis cuts), the upper
end from a feasible baseline schedule. Each probe asks the MILP for any schedule meeting every
demand by epoch T and stops at its first feasible solution. When the search closes (every T below
the answer proven infeasible) the epoch count is proven minimal for this epoch length.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from flowride.collectives.demand import Collective, Demand
from flowride.errors import InputError
from flowride.synth.highs import SolveOptions, solve
from flowride.synth.milp import Infeasible, build_model, sends_from_solution
from flowride.synth.reach import epoch_distances
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming

Progress = Callable[[dict], None]


def _arrivals_between(timing: EpochTiming, link: int, A: int, T: int) -> int:
    """Most chunks that can arrive over ``link`` with arrival epoch in [A, T]."""
    return int(_arrivals(timing, np.array([link]), np.array([A]), np.array([T]))[0])


def _arrivals(timing: EpochTiming, links: np.ndarray, A: np.ndarray, T: np.ndarray) -> np.ndarray:
    """Most chunks that can arrive over all of ``links`` together with arrival epoch in [A, T],
    for each (A, T) pair: each link starts chunks from epoch ``first`` on (1 behind a switch: it
    forwards only what arrived), at most window_cap per b + 1 epochs, and delivers d later."""
    first = timing.src_is_switch[links].astype(np.int64)[None, :]
    d = timing.hop_delay[links].astype(np.int64)[None, :]
    b = timing.beta_epochs[links].astype(np.int64)[None, :]
    cap = timing.window_cap[links].astype(np.int64)[None, :]
    n = T[:, None] - d - np.maximum(A[:, None] - d, first) + 1
    per = -(-np.maximum(n, 0) // (b + 1)) * cap
    return per.sum(axis=1)


def _last_entry_epoch(links: list[int], releases: np.ndarray, timing: EpochTiming) -> int:
    """Earliest epoch by which all chunks with the given earliest arrivals can have crossed
    ``links``: for every threshold A, the chunks that cannot arrive before A must fit the
    arrival slots in [A, T]. Vectorized over thresholds, binary search on T (arrivals grow with T)."""
    releases = np.asarray(releases, dtype=np.int64)
    if releases.size == 0:
        return 0
    lk = np.asarray(links, dtype=np.int64)
    A, counts = np.unique(releases, return_counts=True)
    later = counts[::-1].cumsum()[::-1]  # chunks released at A or after
    T0 = int(A[-1])
    capsum = int(timing.window_cap[lk].sum())
    span = int(timing.hop_delay[lk].max()) + 1 + int(timing.beta_epochs[lk].max() + 1) * (-(-int(later[0]) // max(capsum, 1)) + 1)
    lo = np.full(A.shape, T0, dtype=np.int64)  # smallest T that may do, per threshold
    hi = np.full(A.shape, T0 + span, dtype=np.int64)  # a T that does (shown in the docstring's count)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        ok = _arrivals(timing, lk, A, mid) >= later
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid + 1)
    return int(hi.max())


class _Needs:
    """The demand as arrays, built once per bound: each commodity's source and its destinations
    (a sparse commodity x node incidence), so a cut's entering chunks are a few numpy ops."""

    def __init__(self, topo: Topology, demand: Demand):
        from scipy import sparse

        self.source = np.array([q.source for q in demand.commodities], dtype=np.int64)
        lens = np.array([len(q.dests) for q in demand.commodities], dtype=np.int64)
        cols = np.fromiter((d for q in demand.commodities for d in q.dests), dtype=np.int64, count=int(lens.sum()))
        rows = np.repeat(np.arange(len(lens)), lens)
        self.M = sparse.csc_matrix((np.ones(len(cols), dtype=np.int64), (rows, cols)), shape=(len(lens), topo.num_nodes))


def cut_bound(topo: Topology, demand: Demand, timing: EpochTiming, D: np.ndarray, inside: set[int],
              needs: _Needs | None = None) -> int:
    """Epochs needed to bring every chunk that must enter ``inside`` across its boundary, plus the
    epochs the last one then needs to reach every GPU inside that wants it (from the entry point
    nearest to each)."""
    into = [i for i, lk in enumerate(topo.links) if lk.dst in inside and lk.src not in inside]
    if not into:
        return 0
    nd = needs or _Needs(topo, demand)
    tails = np.array([topo.links[i].src for i in into])
    heads = sorted({topo.links[i].dst for i in into})
    ins = np.array(sorted(inside), dtype=np.int64)
    MI = nd.M[:, ins]  # commodity x inside node
    per_q = np.asarray(MI.sum(axis=1)).ravel()
    outside = ~np.isin(nd.source, ins)
    q = np.flatnonzero(outside & (per_q > 0))
    if q.size == 0:
        return 0
    rho = (D[:, tails] + timing.hop_delay[into][None, :]).min(axis=1)[nd.source[q]].astype(np.int64)
    # after its first entry a chunk still has to reach every destination inside, from the
    # nearest entry point (copies may cross several boundary links)
    E = D[np.ix_(heads, ins)].min(axis=0).astype(np.int64)  # per inside node
    sub = MI[q].tocsr()
    rows = np.repeat(np.arange(len(q)), np.diff(sub.indptr))
    dist = E[sub.indices]
    if demand.collective is Collective.ALLGATHER:
        releases = rho  # one copy must enter; more may, through other links
        need = np.full(len(q), np.iinfo(np.int64).min)
        np.maximum.at(need, rows, dist)
    else:
        releases = np.repeat(rho, per_q[q])
        need = np.full(len(q), np.iinfo(np.int64).max)
        np.minimum.at(need, rows, dist)
    return _last_entry_epoch(into, releases, timing) + int(need.min())


def epoch_lower_bound(topo: Topology, demand: Demand, timing: EpochTiming, D: np.ndarray | None = None,
                      time_limit: float | None = None) -> dict[str, int]:
    """Sound lower bounds on the epochs any schedule needs, by kind: the latency of the farthest
    delivery, each GPU's ingress, each chassis cut (with the spread inside after the cut), and
    the fluid floor over every cut (forest or flow). ``time_limit`` caps the static LP of the flow
    bound (see :func:`flowride.synth.lp_static.concurrent_flow`)."""
    if D is None:
        D = epoch_distances(topo, timing)
    needs = _Needs(topo, demand)
    coo = needs.M.tocoo()
    lat = int(D[needs.source[coo.row], coo.col].max())
    ingress = max(cut_bound(topo, demand, timing, D, {int(g)}, needs) for g in np.flatnonzero(needs.M.getnnz(axis=0)))
    cut = max((cut_bound(topo, demand, timing, D, set(inside), needs) for inside in topo.cut_sets()), default=0)
    out = {"latency": lat, "ingress": ingress, "cut": cut}
    if not topo.teccl_compat and not demand.collective.reduces:
        # ForestColl's cut over every node set (AllGather), the maximum concurrent flow (AlltoAll).
        # A send must arrive by T, so a link starts chunks in at most T - a + 1 epochs, at most
        # window_cap per b + 1 of them: it carries at most (T + 1) * cap chunks, and (T + 1) * tau
        # is at least the fluid floor. (The TE-CCL compat model lets switch -> GPU hops skip beta,
        # which breaks that count: no such bound there.)
        block = demand.chunk_bytes * demand.chunks
        if demand.collective.multicast:
            from flowride.synth.trees import forest_bound

            kind, fluid = "forest", forest_bound(topo, time_limit=time_limit).seconds(block)
        else:
            from flowride.synth.lp_static import flow_bound_s

            kind, fluid = "flow", flow_bound_s(topo, block, time_limit)
        out[kind] = max(0, int(math.ceil(fluid / timing.tau - 1e-6)) - 1)
    return out


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


SYMMETRIC_PROBE_SECONDS = 10.0  # the symmetric model is a heuristic: never let it eat the search


def _probe(topo, demand, timing, T, D, remaining, mip_gap, threads, sym) -> tuple[str, list | None, list[Probe], float]:
    """One horizon: (feasible | infeasible | timeout | solver ..., sends, probes, solver seconds).
    With ``sym`` the symmetric model goes first; its infeasibility proves nothing."""
    from flowride.synth.milp import restrict_to_sources
    from flowride.synth.symmetry import expand_sends

    probes: list[Probe] = []
    secs = 0.0
    t0 = time.perf_counter()
    if sym is not None:
        ps = time.perf_counter()
        try:
            model, idx = build_model(topo, demand, timing, T, D, symmetry=sym)
        except Infeasible:
            return "infeasible", None, [Probe(T, "infeasible", time.perf_counter() - ps, 0, 0)], 0.0
        budget = SYMMETRIC_PROBE_SECONDS if remaining is None else min(SYMMETRIC_PROBE_SECONDS, remaining / 2)
        out = solve(model, SolveOptions(time_limit=budget, mip_gap=mip_gap, threads=threads, first_feasible=True))
        secs += out.seconds
        if out.x is not None:
            sends = expand_sends(sym, sends_from_solution(idx, restrict_to_sources(demand, sym.reps), out.x))
            probes.append(Probe(T, "feasible", time.perf_counter() - ps, model.num_cols, model.num_rows))
            return "feasible", sends, probes, secs
        probes.append(Probe(T, f"symmetric {out.status}", time.perf_counter() - ps, model.num_cols, model.num_rows))
    if remaining is not None:
        remaining -= time.perf_counter() - t0
        if remaining <= 0:
            return "timeout", None, probes, secs
    ps = time.perf_counter()
    try:
        model, idx = build_model(topo, demand, timing, T, D)
    except Infeasible:
        probes.append(Probe(T, "infeasible", time.perf_counter() - ps, 0, 0))
        return "infeasible", None, probes, secs
    out = solve(model, SolveOptions(time_limit=remaining, mip_gap=mip_gap, threads=threads, first_feasible=True))
    secs += out.seconds
    if out.x is not None:
        outcome, sends = "feasible", sends_from_solution(idx, demand, out.x)
    elif out.status == "infeasible":
        outcome, sends = "infeasible", None
    else:
        outcome = "timeout" if out.status.startswith("timeout") else f"solver {out.raw_status}"
        sends = None
    probes.append(Probe(T, outcome, time.perf_counter() - ps, model.num_cols, model.num_rows))
    return outcome, sends, probes, secs


FIRST_PROBE_SHARE = 0.3  # the probe at the lower bound (often feasible at once) gets this share
PROBE_SHARE = 0.5  # any later probe gets at most this share of what is left


def bisect_horizon(
    topo: Topology,
    demand: Demand,
    timing: EpochTiming,
    lo: int,
    hi: int,
    time_limit: float | None = None,
    mip_gap: float | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
    D: np.ndarray | None = None,
    sym=None,
    parallel: bool = False,
) -> SearchResult:
    """Smallest T in [lo, hi] whose probe is feasible; ``hi`` is known feasible (a baseline or an
    incumbent). ``sym``: a :class:`~flowride.synth.symmetry.SourceSymmetry` whose model each probe
    tries first; ``parallel``: two probes at a time (the lower end and the middle first, then the
    thirds of what is left), one solver thread each.

    Anytime: under a time limit no probe may take the whole budget. The first probe, at the lower
    bound (often tight: then it closes the search at once), gets FIRST_PROBE_SHARE of it; later
    ones at most PROBE_SHARE of what is left. A probe that runs out of time proves nothing, but
    says the horizons at and below it are hard: the search goes on between it and the best
    schedule found (closer to a feasible horizon, where solutions are easier to find), so the
    budget keeps improving the schedule instead of stopping at the first hard probe."""
    if D is None:
        D = epoch_distances(topo, timing)
    t0 = time.perf_counter()
    res = SearchResult(None, hi, lo, False)
    first = True
    hard: int | None = None  # highest horizon whose probe ran out of time (it and those below: hard)
    while lo < hi:
        floor = lo if hard is None else max(lo, hard + 1)
        if floor >= hi:  # everything left to try is at or below a horizon that was too hard
            res.timed_out = True
            break
        # The bounds are often tight: try the lower end first, then bisect (or trisect).
        if parallel and hi - floor >= 2:
            pts = [floor, (floor + hi) // 2] if first else sorted({floor + (hi - floor) // 3, floor + 2 * (hi - floor) // 3})
        else:
            pts = [floor if first else (floor + hi) // 2]
        remaining = None if time_limit is None else time_limit - (time.perf_counter() - t0)
        if remaining is not None and remaining <= 0:
            res.timed_out = True
            break
        cap = None if remaining is None else remaining * (FIRST_PROBE_SHARE if first else PROBE_SHARE)
        if cap is not None and hard is None and not first and lo >= hi - 1:
            cap = remaining  # the last horizon left: it may have all there is
        first = False
        if progress:
            for T in pts:
                progress({"stage": "probe", "T": T, "lo": lo, "hi": hi, "elapsed": time.perf_counter() - t0})
        if len(pts) == 1:
            results = [_probe(topo, demand, timing, pts[0], D, cap, mip_gap, threads, sym)]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(len(pts)) as pool:
                results = list(pool.map(lambda T, rem=cap: _probe(topo, demand, timing, T, D, rem, mip_gap, 1, sym), pts))
        gave_up = False
        for T, (outcome, sends, probes, secs) in zip(pts, results, strict=True):
            res.probes.extend(probes)
            res.solver_seconds += secs
            if outcome == "feasible" and T < hi:
                res.sends, hi = sends, T
            elif outcome == "infeasible":
                lo = max(lo, T + 1)
            elif outcome == "timeout":
                hard = T if hard is None else max(hard, T)  # at and below it: too hard for this budget
            elif outcome != "feasible":
                gave_up = True  # the solver stopped for another reason: keep the best schedule, unproven
            if progress:
                progress({"stage": "probed", "T": T, "outcome": outcome, "lo": lo, "hi": hi, "elapsed": time.perf_counter() - t0})
        if gave_up and lo < hi:
            res.gave_up = True
            break
    if hard is not None and lo < hi:
        res.timed_out = True
    res.T = hi
    res.lower = min(lo, hi)
    return res
