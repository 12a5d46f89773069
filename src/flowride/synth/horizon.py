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
    first = 1 if timing.src_is_switch[link] else 0  # a switch forwards only what arrived
    d = int(timing.hop_delay[link])
    n = T - d - max(A - d, first) + 1
    if n <= 0:
        return 0
    b = int(timing.beta_epochs[link])
    return math.ceil(n / (b + 1)) * int(timing.window_cap[link])


def _last_entry_epoch(links: list[int], releases: list[int], timing: EpochTiming) -> int:
    """Earliest epoch by which all chunks with the given earliest arrivals can have crossed
    ``links``: for every threshold A, the chunks that cannot arrive before A must fit the
    arrival slots in [A, T]."""
    if not releases:
        return 0
    rel = sorted(releases, reverse=True)
    thresholds = sorted(set(rel))
    later = {A: sum(1 for r in rel if r >= A) for A in thresholds}
    T = rel[0]
    while any(sum(_arrivals_between(timing, li, A, T) for li in links) < later[A] for A in thresholds if A <= T):
        T += 1
    return T


def cut_bound(topo: Topology, demand: Demand, timing: EpochTiming, D: np.ndarray, inside: set[int]) -> int:
    """Epochs needed to bring every chunk that must enter ``inside`` across its boundary, plus the
    epochs the last one then needs to reach every GPU inside that wants it (from the entry point
    nearest to each)."""
    into = [i for i, lk in enumerate(topo.links) if lk.dst in inside and lk.src not in inside]
    if not into:
        return 0
    tails = np.array([topo.links[i].src for i in into])
    heads = sorted({topo.links[i].dst for i in into})
    delays = timing.hop_delay[into]
    releases: list[int] = []
    spread = None
    for q in demand.commodities:
        if q.source in inside:
            continue
        ds = [d for d in q.dests if d in inside]
        if not ds:
            continue
        rho = int((D[q.source, tails] + delays).min())
        # after its first entry a chunk still has to reach every destination inside, from the
        # nearest entry point (copies may cross several boundary links)
        to_dest = D[np.ix_(heads, ds)].min(axis=0)
        if demand.collective is Collective.ALLGATHER:
            releases.append(rho)  # one copy must enter; more may, through other links
            need = int(to_dest.max())
        else:
            releases.extend([rho] * len(ds))
            need = int(to_dest.min())
        spread = need if spread is None else min(spread, need)
    if not releases:
        return 0
    return _last_entry_epoch(into, releases, timing) + int(spread or 0)


def epoch_lower_bound(topo: Topology, demand: Demand, timing: EpochTiming, D: np.ndarray | None = None,
                      time_limit: float | None = None) -> dict[str, int]:
    """Sound lower bounds on the epochs any schedule needs, by kind: the latency of the farthest
    delivery, each GPU's ingress, each chassis cut (with the spread inside after the cut), and
    the fluid floor over every cut (forest or flow). ``time_limit`` caps the static LP of the flow
    bound (see :func:`flowride.synth.lp_static.concurrent_flow`)."""
    if D is None:
        D = epoch_distances(topo, timing)
    lat = max(int(D[q.source, d]) for q in demand.commodities for d in q.dests)
    ingress = max(cut_bound(topo, demand, timing, D, {g}) for g in demand.needs())
    cut = max((cut_bound(topo, demand, timing, D, set(inside)) for inside in topo.cut_sets()), default=0)
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

            kind, fluid = "forest", forest_bound(topo).seconds(block)
        else:
            from flowride.synth.lp_static import concurrent_flow

            kind, fluid = "flow", concurrent_flow(topo, time_limit).finish_s(block)
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
    - ``warm_start``: coarse to fine: the slow preset's schedule, retimed to the requested
      epochs (:func:`flowride.synth.greedy.retime`), caps the search and starts any probe it fits;
    - ``symmetry``: each probe first tries the model of the orbit representatives only
      (:mod:`flowride.synth.symmetry`); only infeasibility needs the full model;
    - ``parallel``: two probes at once, one solver thread each (highspy releases the GIL).
    """

    incumbent: bool = True
    bounds: bool = True
    warm_start: bool = False
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
    """Smallest T in [lo, hi] whose probe is feasible; ``hi`` is known feasible (a baseline).
    ``sym``: a :class:`~flowride.synth.symmetry.SourceSymmetry` whose model each probe tries
    first; ``parallel``: two probes at a time (the lower end and the middle first, then the
    thirds of what is left), one solver thread each."""
    if D is None:
        D = epoch_distances(topo, timing)
    t0 = time.perf_counter()
    res = SearchResult(None, hi, lo, False)
    first = True
    while lo < hi:
        # The bounds are often tight: try the lower end first, then bisect (or trisect).
        if parallel and hi - lo >= 2:
            pts = [lo, (lo + hi) // 2] if first else sorted({lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3})
        else:
            pts = [lo if first else (lo + hi) // 2]
        first = False
        remaining = None if time_limit is None else time_limit - (time.perf_counter() - t0)
        if remaining is not None and remaining <= 0:
            res.timed_out = True
            break
        if progress:
            for T in pts:
                progress({"stage": "probe", "T": T, "lo": lo, "hi": hi, "elapsed": time.perf_counter() - t0})
        if len(pts) == 1:
            results = [_probe(topo, demand, timing, pts[0], D, remaining, mip_gap, threads, sym)]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(len(pts)) as pool:
                results = list(pool.map(lambda T, rem=remaining: _probe(topo, demand, timing, T, D, rem, mip_gap, 1, sym), pts))
        stop = None
        for T, (outcome, sends, probes, secs) in zip(pts, results, strict=True):
            res.probes.extend(probes)
            res.solver_seconds += secs
            if outcome == "feasible" and T < hi:
                res.sends, hi = sends, T
            elif outcome == "infeasible":
                lo = max(lo, T + 1)
            elif outcome not in ("feasible", "infeasible"):
                stop = outcome  # out of time, or the solver gave up: keep the best schedule, unproven
            if progress:
                progress({"stage": "probed", "T": T, "outcome": outcome, "lo": lo, "hi": hi, "elapsed": time.perf_counter() - t0})
        if stop is not None and lo < hi:
            res.timed_out = stop == "timeout"
            res.gave_up = not res.timed_out
            break
    res.T = hi
    res.lower = min(lo, hi)
    return res
