"""Finding the horizon: bisection on the number of epochs with feasibility probes.

The lower end comes from sound epoch bounds (latency, per-GPU ingress, chassis cuts), the upper
end from a feasible baseline schedule. Each probe asks the MILP for any schedule meeting every
demand by epoch T and stops at its first feasible solution. When the search closes (every T below
the answer proven infeasible) the epoch count is proven minimal for this epoch length.
"""

from __future__ import annotations

import time

import numpy as np

from flowride.collectives.demand import Demand
from flowride.synth.highs import SolveOptions, solve
from flowride.synth.milp import build_model, restrict_to_sources, sends_from_solution
from flowride.synth.reach import epoch_distances
from flowride.synth.result import Probe, Progress, SearchResult
from flowride.synth.rows import Infeasible
from flowride.synth.symmetry import expand_sends
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming

SYMMETRIC_PROBE_SECONDS = 10.0  # the symmetric model is a heuristic: never let it eat the search


def _probe(topo, demand, timing, T, D, remaining, mip_gap, threads, sym) -> tuple[str, list | None, list[Probe], float]:
    """One horizon: (feasible | infeasible | timeout | solver ..., sends, probes, solver seconds).
    With ``sym`` the symmetric model goes first; its infeasibility proves nothing."""
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
