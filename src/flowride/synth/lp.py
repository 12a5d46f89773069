"""The LP form of TE-CCL for copy-free demands (AlltoAll), and its decomposition into sends.

Why an LP: in AlltoAll every chunk has one destination, so copies never help and a schedule is a
set of paths through the time-expanded graph. Chunks of one source are then interchangeable on
the way (only where they end matters), so one *commodity per source GPU* with continuous flows
describes every schedule: the TE-CCL paper's LP form. It has S x L x T columns instead of the
MILP's S x (G-1) x chunks x L x T binaries, and solves in seconds where the MILP does not.

Time-expanded model, horizon T (epochs 0..T, as in :mod:`flowride.synth.milp`); units are the
demand's chunks:

- ``F[s, l, k] >= 0``: how much of source s's data starts on link l in epoch k; it reaches the
  far end at ``timing.arrival(l, k)``. Left out: sends into s itself, sends before s's data can
  be at the link's tail, sends too late to reach a GPU that still needs s's data by T.
- ``X[s, g, t] >= 0``: how much GPU g keeps from epoch t to t + 1 (store-and-forward buffer).
- ``Y[s, g, t] >= 0``: how much of its own share GPU g takes out of the flow at epoch t.

Constraint families, one function each, named after the rule they encode:
:func:`store_and_forward_at_gpus`, :func:`switch_forwards_on_arrival`,
:func:`every_destination_receives_its_demand`, :func:`link_capacity_window`; the objective is
:func:`early_delivery_objective`.

It is a relaxation of the MILP (and of every schedule the simulator accepts) for the same demand
and epoch timing: keep, for each chunk, the sends on one path from its source to its destination
(copies are never needed for one destination); summing those paths per source gives feasible
F, X, Y with the same capacity use or less. So the smallest T whose LP is feasible is a lower
bound on the epochs of any schedule of that demand at that epoch length.

Decomposition (:func:`decompose_flow`, :func:`schedule_paths`): each source's flow is split into
paths ending at a destination; each (source, destination) pair's chunks, cut into ``pieces``
equal pieces where the LP splits them, are dealt to its paths in proportion to the path flows,
and list-scheduled hop by hop (in the LP's epoch order) with :class:`LinkBook`, so every send
respects capacity windows and a GPU only sends what it holds. Whatever cannot be placed on a path
goes along a fewest-epoch route (:meth:`GreedyScheduler.transfer`). The simulator judges the result.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from flowride.collectives.demand import Demand, make_demand
from flowride.errors import InputError
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.synth.budget import LP_MAX_COLUMNS, MEMORY_LIMIT_BYTES, lp_size, static_lp_bytes
from flowride.synth.greedy import GreedyScheduler, LinkBook, direct_alltoall
from flowride.synth.highs import MipModel, SolveOptions, solve
from flowride.synth.horizon import Probe, SearchResult, epoch_lower_bound
from flowride.synth.reach import UNREACHABLE, epoch_distances
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming, epoch_timing

Progress = Callable[[dict], None]
Send = tuple[int, int, int, int]  # (epoch, link, source GPU, chunk)

POLISH_SECONDS = 10.0  # the integral polish without a time limit (with one: the budget)
OBJECTIVES = ("makespan", "weighted")
HOP_COST = 1e-2  # per unit per send: breaks ties toward fewer hops; 100 hops weigh one epoch
FLOW_EPS = 1e-7  # flows below this are solver noise
PIECE_CHOICES = (1, 2, 4, 8)
MAX_ROUNDING_LOSS = 0.05  # share of the flow that may move off its LP path when rounding pieces
MAX_COMMODITIES = 40_000  # no finer pieces than this many (source, piece) commodities in all


# ---------------------------------------------------------------------------- index


def _expand(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive integers in bulk: group i gives ``first[i], ..., first[i]+count[i]-1``.
    Returns (group of each value, value)."""
    count = np.maximum(np.asarray(count, dtype=np.int64), 0)
    n = int(count.sum())
    grp = np.repeat(np.arange(len(count)), count)
    shift = np.repeat(np.asarray(first, dtype=np.int64) - (np.cumsum(count) - count), count)
    return grp, shift + np.arange(n, dtype=np.int64)


def unicast_needs(topo: Topology, demand: Demand) -> tuple[np.ndarray, np.ndarray]:
    """(source node ids, need[S, N]: chunks node v needs from source s). Raises ValueError unless
    every commodity has a single destination and nothing is reduced (copies would not help)."""
    coll = demand.collective
    if coll.multicast or coll.reduces:
        raise ValueError(f"the LP form needs a copy-free demand (AlltoAll), not {coll.value}")
    if any(len(q.dests) != 1 for q in demand.commodities):
        raise ValueError("the LP form needs one destination per commodity")
    sources = np.array(sorted({q.source for q in demand.commodities}), dtype=np.int64)
    pos = {int(s): i for i, s in enumerate(sources)}
    need = np.zeros((len(sources), topo.num_nodes), dtype=np.int64)
    si = np.array([pos[q.source] for q in demand.commodities], dtype=np.int64)
    di = np.array([q.dests[0] for q in demand.commodities], dtype=np.int64)
    np.add.at(need, (si, di), 1)
    return sources, need


@dataclass
class LpIndex:
    """Column and row layout of one LP probe at horizon T. ``s`` arrays index ``sources``."""

    T: int
    sources: np.ndarray
    need: np.ndarray  # [S, N]
    f_s: np.ndarray
    f_l: np.ndarray
    f_k: np.ndarray
    x_s: np.ndarray
    x_g: np.ndarray
    x_t: np.ndarray
    y_s: np.ndarray
    y_g: np.ndarray
    y_t: np.ndarray
    row_start: np.ndarray  # [S, N] first epoch with a conservation row (T + 1: none)
    row_off: np.ndarray  # [S, N] row of (s, v, row_start)
    gpu_rows: int  # conservation rows at GPUs come first, then those at switches
    cons_rows: int

    @property
    def nf(self) -> int:
        return len(self.f_s)

    @property
    def x0(self) -> int:
        return self.nf

    @property
    def y0(self) -> int:
        return self.nf + len(self.x_s)

    @property
    def num_cols(self) -> int:
        return self.y0 + len(self.y_s)

    def cons_row(self, s: np.ndarray, v: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Conservation row of node v for source s at epoch t, -1 where there is none."""
        start = self.row_start[s, v]
        ok = (t >= start) & (t <= self.T)
        return np.where(ok, self.row_off[s, v] + t - start, -1)


def build_lp_index(topo: Topology, demand: Demand, timing: EpochTiming, T: int, D: np.ndarray | None = None) -> LpIndex:
    """Enumerate the columns and conservation rows of the probe at horizon T, in bulk."""
    if D is None:
        D = epoch_distances(topo, timing)
    sources, need = unicast_needs(topo, demand)
    S, N = len(sources), topo.num_nodes
    l_src, l_dst = topo.link_ends
    is_gpu = np.array([nd.is_gpu for nd in topo.nodes], dtype=bool)
    delay = timing.hop_delay.astype(np.int64)

    start = np.minimum(D[sources].astype(np.int64), UNREACHABLE)  # [S, N] earliest hold/forward
    start[np.arange(S), sources] = 0
    # R[s, v]: fewest epochs from v to a GPU that needs s's data (one reduction per source)
    R = np.full((S, N), UNREACHABLE, dtype=np.int64)
    for si in range(S):
        dests = np.flatnonzero(need[si])
        if len(dests):
            R[si] = D[:, dests].min(axis=1)

    earliest = start[:, l_src]  # [S, L]
    latest = T - delay[None, :] - R[:, l_dst]
    ok = (l_dst[None, :] != sources[:, None]) & (earliest <= latest)
    ps, pl = np.nonzero(ok)
    grp, f_k = _expand(earliest[ps, pl], latest[ps, pl] - earliest[ps, pl] + 1)
    f_s, f_l = ps[grp], pl[grp]

    # conservation rows: (s, v, t) for t in [start, T]; GPU pairs first so each family is a range
    has = start <= T
    cnt = np.where(has, T - start + 1, 0)
    key = np.lexsort((np.arange(S * N), np.broadcast_to(~is_gpu[None, :], (S, N)).ravel()))
    cnt_sorted = cnt.ravel()[key]
    off = np.empty(S * N, dtype=np.int64)
    off[key] = np.cumsum(cnt_sorted) - cnt_sorted
    row_start = np.where(has, start, T + 1)
    gpu_rows = int(cnt[:, is_gpu].sum())

    # holdover X at GPUs from start to T - 1; delivery Y where the GPU needs s's data
    gs_s, gs_g = np.nonzero(has & is_gpu[None, :])
    grp, x_t = _expand(start[gs_s, gs_g], T - start[gs_s, gs_g])
    x_s, x_g = gs_s[grp], gs_g[grp]
    ds_s, ds_g = np.nonzero(has & (need > 0))
    grp, y_t = _expand(start[ds_s, ds_g], T - start[ds_s, ds_g] + 1)
    y_s, y_g = ds_s[grp], ds_g[grp]
    return LpIndex(T, sources, need, f_s, f_l, f_k, x_s, x_g, x_t, y_s, y_g, y_t,
                   row_start, off.reshape(S, N), gpu_rows, int(cnt.sum()))


class Infeasible(Exception):
    """The probe is infeasible before any solving (some demand cannot arrive by T)."""


# ---------------------------------------------------------------------------- constraint families


@dataclass
class _Rows:
    """COO triplets and row bounds, family by family (rows numbered by the caller)."""

    r: list = field(default_factory=list)
    c: list = field(default_factory=list)
    v: list = field(default_factory=list)
    families: dict = field(default_factory=dict)

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray | float) -> None:
        keep = rows >= 0
        if not keep.all():  # cannot happen: every column's rows exist by construction of the index
            raise AssertionError("a flow column without its conservation row")
        self.r.append(rows)
        self.c.append(cols)
        self.v.append(np.broadcast_to(np.asarray(vals, dtype=np.float64), rows.shape))


def store_and_forward_at_gpus(idx: LpIndex, topo: Topology, timing: EpochTiming, rows: _Rows, rhs: np.ndarray) -> None:
    """What a GPU holds at epoch t (arrived now, or kept from t - 1, or, at the source in epoch
    0, all of its data) it sends on, keeps, or (its own share) takes out:

        sum_{l into g, arrives t} F[s,l,k] + X[s,g,t-1] + supply - sum_{l out of g} F[s,l,t] - X[s,g,t] - Y[s,g,t] = 0
    """
    l_src, l_dst = topo.link_ends
    is_gpu = np.array([nd.is_gpu for nd in topo.nodes], dtype=bool)
    src, dst = l_src[idx.f_l], l_dst[idx.f_l]
    arr = idx.f_k + timing.hop_delay[idx.f_l]
    out = np.flatnonzero(is_gpu[src])
    rows.add(idx.cons_row(idx.f_s[out], src[out], idx.f_k[out]), out, -1.0)
    inn = np.flatnonzero(is_gpu[dst])
    rows.add(idx.cons_row(idx.f_s[inn], dst[inn], arr[inn]), inn, 1.0)
    xc = idx.x0 + np.arange(len(idx.x_s))
    rows.add(idx.cons_row(idx.x_s, idx.x_g, idx.x_t), xc, -1.0)
    rows.add(idx.cons_row(idx.x_s, idx.x_g, idx.x_t + 1), xc, 1.0)
    yc = idx.y0 + np.arange(len(idx.y_s))
    rows.add(idx.cons_row(idx.y_s, idx.y_g, idx.y_t), yc, -1.0)
    S = len(idx.sources)
    supply_rows = idx.cons_row(np.arange(S), idx.sources, np.zeros(S, dtype=np.int64))
    rhs[supply_rows] = -idx.need.sum(axis=1)
    rows.families["store_and_forward_at_gpus"] = (0, idx.gpu_rows)


def switch_forwards_on_arrival(idx: LpIndex, topo: Topology, timing: EpochTiming, rows: _Rows) -> None:
    """Switches hold nothing: what arrives at a switch for epoch t leaves it in epoch t.

        sum_{l into w, arrives t} F[s,l,k] - sum_{l out of w} F[s,l,t] = 0
    """
    l_src, l_dst = topo.link_ends
    out = np.flatnonzero(timing.src_is_switch[idx.f_l])
    rows.add(idx.cons_row(idx.f_s[out], l_src[idx.f_l[out]], idx.f_k[out]), out, -1.0)
    inn = np.flatnonzero(timing.dst_is_switch[idx.f_l])
    arr = idx.f_k[inn] + timing.hop_delay[idx.f_l[inn]]
    rows.add(idx.cons_row(idx.f_s[inn], l_dst[idx.f_l[inn]], arr), inn, 1.0)
    rows.families["switch_forwards_on_arrival"] = (idx.gpu_rows, idx.cons_rows)


def every_destination_receives_its_demand(idx: LpIndex, row0: int, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
    """Each GPU takes out, by epoch T, exactly the chunks it needs from each source:

        sum_t Y[s,g,t] = need[s,g]

    Returns the bounds of these rows. Raises :class:`Infeasible` when a pair has no Y at all."""
    ps, pg = np.nonzero(idx.need > 0)
    N = idx.need.shape[1]
    pair_of = -np.ones(idx.need.size, dtype=np.int64)
    pair_of[ps * N + pg] = np.arange(len(ps))
    r = pair_of[idx.y_s * N + idx.y_g]
    reached = np.zeros(len(ps), dtype=bool)
    reached[r] = True
    if not reached.all():
        i = int(np.flatnonzero(~reached)[0])
        raise Infeasible(f"GPU {int(pg[i])} cannot get GPU {int(idx.sources[ps[i]])}'s data within {idx.T} epochs")
    rows.add(row0 + r, idx.y0 + np.arange(len(idx.y_s)), 1.0)
    rows.families["every_destination_receives_its_demand"] = (row0, row0 + len(ps))
    b = idx.need[ps, pg].astype(np.float64)
    return b, b


def link_capacity_window(idx: LpIndex, timing: EpochTiming, row0: int, rows: _Rows) -> np.ndarray:
    """Link capacity with beta, as in the MILP: in any b+1 consecutive epochs at most
    window_cap chunks (summed over sources) start on a link.

        sum_s sum_{k' in [k-b, k]} F[s,l,k'] <= window_cap_l     for every link l and epoch k

    Returns the upper bounds of the rows kept (windows that cannot bind are left out)."""
    T1 = idx.T + 1
    b = timing.beta_epochs
    r_list, c_list = [], []
    for shift in range(int(b.max()) + 1 if len(b) else 0):
        sel = np.flatnonzero(b[idx.f_l] >= shift)
        kend = idx.f_k[sel] + shift
        ok = kend <= idx.T
        r_list.append(idx.f_l[sel[ok]] * T1 + kend[ok])
        c_list.append(sel[ok])
    r = np.concatenate(r_list) if r_list else np.zeros(0, dtype=np.int64)
    c = np.concatenate(c_list) if c_list else np.zeros(0, dtype=np.int64)
    used, r_comp = np.unique(r, return_inverse=True)
    cap = timing.window_cap[used // T1].astype(np.float64)
    # a window can bind only if its columns may carry more than its capacity: the supply of the
    # sources with a column there bounds them
    supply = idx.need.sum(axis=1).astype(np.float64)
    pair = np.unique(r_comp * len(supply) + idx.f_s[c])
    most = np.bincount(pair // len(supply), weights=supply[pair % len(supply)], minlength=len(used))
    binding = np.flatnonzero(most > cap)
    remap = -np.ones(len(used), dtype=np.int64)
    remap[binding] = np.arange(len(binding))
    m = remap[r_comp] >= 0
    rows.add(row0 + remap[r_comp[m]], c[m], 1.0)
    rows.families["link_capacity_window"] = (row0, row0 + len(binding))
    return cap[binding]


def early_delivery_objective(idx: LpIndex) -> np.ndarray:
    """Deliver early (as the MILP's reward for holding needed chunks early): each unit costs the
    epoch it is taken out at, plus a small cost per send so no flow wanders without need."""
    cost = np.zeros(idx.num_cols)
    cost[: idx.nf] = HOP_COST
    cost[idx.y0 :] = idx.y_t
    return cost


def weighted_delivery_objective(idx: LpIndex) -> np.ndarray:
    """The published TE-CCL objective: reward 1/(t+1) for each unit delivered at epoch t (a
    cost of minus that), at one fixed horizon, with no search on the horizon. A send costs a
    thousandth of the smallest step between two weights, so ties still prefer fewer hops."""
    cost = np.zeros(idx.num_cols)
    cost[: idx.nf] = 1e-3 / ((idx.T + 1) * (idx.T + 2))
    cost[idx.y0 :] = -1.0 / (idx.y_t + 1.0)
    return cost


def build_lp(topo: Topology, demand: Demand, timing: EpochTiming, T: int, D: np.ndarray | None = None,
             objective: str = "makespan") -> tuple[MipModel, LpIndex]:
    """The whole LP at horizon T as one bulk model (no integer columns). ``objective``:
    "makespan" (the horizon search's: deliver early, :func:`early_delivery_objective`) or
    "weighted" (the published one, :func:`weighted_delivery_objective`)."""
    idx = build_lp_index(topo, demand, timing, T, D)
    rows = _Rows()
    rhs = np.zeros(idx.cons_rows)
    store_and_forward_at_gpus(idx, topo, timing, rows, rhs)
    switch_forwards_on_arrival(idx, topo, timing, rows)
    d_lo, d_hi = every_destination_receives_its_demand(idx, idx.cons_rows, rows)
    cap = link_capacity_window(idx, timing, idx.cons_rows + len(d_lo), rows)
    nrows = idx.cons_rows + len(d_lo) + len(cap)
    n = idx.num_cols
    A = sp.csc_matrix((np.concatenate(rows.v), (np.concatenate(rows.r), np.concatenate(rows.c))), shape=(nrows, n))
    model = MipModel(
        cost=weighted_delivery_objective(idx) if objective == "weighted" else early_delivery_objective(idx),
        lb=np.zeros(n),
        ub=np.full(n, np.inf),
        integer=np.zeros(n, dtype=bool),
        A=A,
        row_lo=np.concatenate([rhs, d_lo, np.full(len(cap), -np.inf)]),
        row_hi=np.concatenate([rhs, d_hi, cap]),
        row_names=rows.families,
    )
    return model, idx


# ---------------------------------------------------------------------------- horizon search


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


# ---------------------------------------------------------------------------- decomposition


@dataclass
class FlowPath:
    """One path of the decomposed flow: ``amount`` units of ``source``'s data for ``dest``, sent
    as (link, epoch) hops in order."""

    source: int
    dest: int
    amount: float
    hops: list[tuple[int, int]]


def decompose_flow(topo: Topology, timing: EpochTiming, idx: LpIndex, x: np.ndarray) -> list[FlowPath]:
    """Standard flow decomposition in the time-expanded graph of each source: walk from the
    source at epoch 0 along the fattest arc with flow left (sends, holdovers) until a delivery,
    take the path's bottleneck off every arc, repeat. Each round empties one arc, and time never
    runs backwards along an arc, so it ends. Flows below FLOW_EPS are solver noise and dropped."""
    T2 = idx.T + 2
    l_src, l_dst = topo.link_ends
    ny = len(idx.y_s)
    # every arc with flow: (source, from node-epoch, to node-epoch or -1 for a delivery)
    a_s = np.concatenate([idx.f_s, idx.x_s, idx.y_s])
    a_from = np.concatenate([l_src[idx.f_l] * T2 + idx.f_k, idx.x_g * T2 + idx.x_t, idx.y_g * T2 + idx.y_t])
    a_to = np.concatenate([l_dst[idx.f_l] * T2 + idx.f_k + timing.hop_delay[idx.f_l], idx.x_g * T2 + idx.x_t + 1, -np.ones(ny, dtype=np.int64)])
    live = np.flatnonzero(x[: idx.num_cols] > FLOW_EPS)
    rem = dict(zip(live.tolist(), x[live].tolist(), strict=True))
    out: dict[tuple[int, int], list[int]] = defaultdict(list)
    for a, s, f in zip(live.tolist(), a_s[live].tolist(), a_from[live].tolist(), strict=True):
        out[(s, f)].append(a)
    paths: list[FlowPath] = []
    for si, s in enumerate(idx.sources.tolist()):
        origin = s * T2
        while True:
            node, arcs = origin, []
            while True:
                cand = [a for a in out.get((si, node), ()) if rem[a] > FLOW_EPS]
                if not cand:
                    break
                a = max(cand, key=rem.__getitem__)
                arcs.append(a)
                if a >= idx.y0:
                    break
                node = int(a_to[a])
            if not arcs:
                break
            amt = min(rem[a] for a in arcs)
            for a in arcs:
                rem[a] -= amt
            if arcs[-1] >= idx.y0:  # a stuck walk (noise) only gives its flow up
                hops = [(int(idx.f_l[a]), int(idx.f_k[a])) for a in arcs if a < idx.nf]
                paths.append(FlowPath(s, int(idx.y_g[arcs[-1] - idx.y0]), amt, hops))
    return paths


def _pair_paths(paths: list[FlowPath]) -> dict[tuple[int, int], list[FlowPath]]:
    by: dict[tuple[int, int], list[FlowPath]] = defaultdict(list)
    for p in paths:
        by[(p.source, p.dest)].append(p)
    return by


def round_to_pieces(amounts: np.ndarray, total: int) -> np.ndarray:
    """Whole pieces per path, ``total`` in all, each close to its amount (largest remainder)."""
    amounts = np.maximum(np.asarray(amounts, dtype=np.float64), 0.0)
    if len(amounts) == 0:
        return np.zeros(0, dtype=np.int64)
    if amounts.sum() > 0:
        amounts = amounts * (total / amounts.sum())
    base = np.floor(amounts + 1e-9).astype(np.int64)
    base = np.minimum(base, total)
    left = total - int(base.sum())
    frac = amounts - base
    order = np.argsort(-frac, kind="stable") if left >= 0 else np.argsort(frac, kind="stable")
    i = 0
    while left != 0:
        j = order[i % len(order)]
        if left > 0:
            base[j] += 1
            left -= 1
        elif base[j] > 0:
            base[j] -= 1
            left += 1
        i += 1
    return base


def rounding_loss(paths: list[FlowPath], need: dict[tuple[int, int], int], pieces: int) -> float:
    """Share of all flow that leaves its LP path when each pair's chunks are cut into ``pieces``
    pieces and dealt to its paths whole."""
    moved, total = 0.0, 0.0
    for pair, ps in _pair_paths(paths).items():
        n = need[pair] * pieces
        a = np.array([p.amount for p in ps]) * pieces
        r = round_to_pieces(a, n)
        moved += float(np.maximum(a * (n / a.sum()) - r, 0).sum()) if a.sum() > 0 else n
        total += n
    return moved / total if total else 0.0


def choose_pieces(paths: list[FlowPath], need: dict[tuple[int, int], int], demand: Demand, max_pieces: int) -> tuple[int, float]:
    """Smallest piece count in 1, 2, 4, ... whose rounding loss is at most MAX_ROUNDING_LOSS
    (else the one losing least), within ``max_pieces``, whole bytes, and MAX_COMMODITIES."""
    best = (1, rounding_loss(paths, need, 1))
    if best[1] <= MAX_ROUNDING_LOSS:
        return best
    for k in PIECE_CHOICES[1:]:
        if k > max_pieces or demand.chunk_bytes / k < 1 or len(demand.commodities) * k > MAX_COMMODITIES:
            break
        loss = rounding_loss(paths, need, k)
        if loss <= MAX_ROUNDING_LOSS:
            return k, loss
        if loss < best[1] - 1e-12:
            best = (k, loss)
    return best


def _segments(topo: Topology, hops: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Cut a path into GPU -> switch* -> GPU segments (a switch forwards in the epoch a chunk
    arrives, so a segment is placed as one piece) and drop loops back to a GPU already passed."""
    segs: list[list[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    for li, k in hops:
        cur.append((li, k))
        if topo.nodes[topo.links[li].dst].is_gpu:
            segs.append(cur)
            cur = []
    kept: list[list[tuple[int, int]]] = []
    seen: dict[int, int] = {}  # GPU -> index of the kept segment leaving it
    for seg in segs:
        u = topo.links[seg[0][0]].src
        if u in seen:
            kept = kept[: seen[u]]
            seen = {g: i for g, i in seen.items() if i < len(kept)}
        seen[u] = len(kept)
        kept.append(seg)
    return kept


def _place(book: LinkBook, timing: EpochTiming, links: list[int], ready: int, prefer: int | None = None) -> tuple[list[int], int]:
    """Start a segment at ``prefer`` (its LP epoch) if it is not before ``ready`` and every hop
    fits there, else at the earliest start >= ready where every hop fits; take the capacity.
    Returns the send epochs and the epoch the far GPU holds the piece."""
    starts = [prefer] if prefer is not None and prefer >= ready else []
    k = ready
    while True:
        start = starts.pop() if starts else k
        epochs: list[int] = []
        e = start
        for li in links:
            if not book.fits(li, e):
                break
            book.take(li, e)  # taken at once: a segment may cross a link twice
            epochs.append(e)
            e = timing.arrival(li, e)
        else:
            return epochs, e
        for li, ek in zip(links, epochs, strict=False):
            book.release(li, ek)
        if start == k:
            k += max(1, book.next_open(li, e) - e)  # hop offsets are fixed: shift to li's next open epoch


def schedule_paths(
    topo: Topology, demand: Demand, timing: EpochTiming, paths: list[FlowPath], pieces_per_unit: int = 1,
    at_lp_epochs: bool = True,
) -> tuple[list[Send], int]:
    """Concrete sends for ``demand``: each (source, destination) pair's chunks are dealt whole to
    its paths (``pieces_per_unit`` of the demand's chunks per unit of path flow), then every piece
    is list-scheduled hop segment by hop segment, in the LP's epoch order: at its LP epoch when
    ``at_lp_epochs`` and its links have room there (an integral flow is then reproduced exactly),
    else at the earliest epoch at or after the piece is held where they have room. Chunks left
    without a path go along a fewest-epoch route afterwards. Returns (sends, chunks sent by that
    fallback)."""
    chunks_of: dict[tuple[int, int], list[int]] = defaultdict(list)
    for q in demand.commodities:
        chunks_of[(q.source, q.dests[0])].append(q.chunk)
    gs = GreedyScheduler(topo, timing)
    book = gs.book
    heap: list[tuple[int, int, int, int, int]] = []
    segs_of: list[list[list[tuple[int, int]]]] = []
    owner: list[tuple[int, int]] = []
    leftovers: list[tuple[int, int, int]] = []
    by_pair = _pair_paths(paths)
    for pair, chunks in chunks_of.items():
        ps = by_pair.get(pair, [])
        counts = round_to_pieces(np.array([p.amount for p in ps]) * pieces_per_unit, len(chunks)) if ps else []
        it = iter(chunks)
        for p, n in zip(ps, counts, strict=True):
            segs = _segments(topo, p.hops)
            for _ in range(int(n)):
                c = next(it)
                i = len(segs_of)
                segs_of.append(segs)
                owner.append((pair[0], c))
                heapq.heappush(heap, (segs[0][0][1], segs[0][0][1], i, 0, 0))
        leftovers.extend((pair[0], c, pair[1]) for c in it)
    sends: list[Send] = []
    while heap:
        _, _, i, j, ready = heapq.heappop(heap)
        seg = segs_of[i]
        s, c = owner[i]
        links = [li for li, _ in seg[j]]
        epochs, held = _place(book, timing, links, ready, seg[j][0][1] if at_lp_epochs else None)
        sends.extend((e, li, s, c) for li, e in zip(links, epochs, strict=True))
        if j + 1 < len(seg):
            lp_k = seg[j + 1][0][1]
            heapq.heappush(heap, (max(lp_k, held), lp_k, i, j + 1, held))
    for s, c, d in leftovers:
        gs.transfer(s, c, s, d)
    sends.extend(gs.sends)
    sends.sort()
    return sends, len(leftovers)


# ---------------------------------------------------------------------------- synthesis


@dataclass
class LpSearch(SearchResult):
    """A SearchResult with what the LP route adds: its horizon and how chunks were cut."""

    lp_T: int | None = None  # smallest LP-feasible horizon (from the epoch bounds up) of the returned demand
    pieces: int = 1  # pieces per input chunk in the returned demand
    rounding_loss: float = 0.0
    fallback_chunks: int = 0  # (pieces of) chunks sent along fewest-epoch routes, not LP paths
    method: str = "lp"  # lp | direct (no LP solved in time, or its decomposition was rejected)
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


def integral_flow(
    topo: Topology, demand: Demand, timing: EpochTiming, T: int, D: np.ndarray | None = None, time_limit: float | None = None
) -> tuple[str, LpIndex | None, np.ndarray | None, Probe, float]:
    """The same model with integer flows at horizon T, solved to its first feasible point.

    For a copy-free demand it is exact: an integral flow splits into whole-chunk paths, which
    placed at their epochs are a schedule, and every schedule gives one (module docstring). So
    "infeasible" proves that no schedule of this demand takes T epochs, and a feasible point
    is a schedule in T epochs. Returns (feasible | infeasible | timeout, index, x, probe, solver
    seconds)."""
    ps = time.perf_counter()
    try:
        model, idx = build_lp(topo, demand, timing, T, D)
    except Infeasible:
        return "infeasible", None, None, Probe(T, "integral infeasible", time.perf_counter() - ps, 0, 0), 0.0
    model.integer[:] = True
    res = solve(model, SolveOptions(time_limit=time_limit, first_feasible=True))
    if res.x is not None:
        outcome = "feasible"
    elif res.status == "infeasible" or "infeasible" in res.raw_status.lower():
        outcome = "infeasible"
    else:
        outcome = "timeout"
    probe = Probe(T, f"integral {outcome}", time.perf_counter() - ps, model.num_cols, model.num_rows)
    return outcome, idx, res.x, probe, res.seconds


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
    from flowride.synth.lp_static import STATIC_BOUND_COLUMNS, concurrent_flow, static_paths

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
        from flowride.synth.lp_static import symmetric_flow, symmetric_paths

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
) -> tuple[Demand, LpSearch]:
    """AlltoAll (any copy-free demand) through the LP form and its decomposition.

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
    (:func:`weighted_delivery_objective`), decomposed and list-scheduled (step 5 still applies).

    Instances whose time-expanded LP would have more than ``max_columns`` columns, or whose LP
    search finds no horizon in half of ``time_limit``, take the static LP instead
    (:mod:`flowride.synth.lp_static`: the concurrent flow, its paths list-scheduled; ``static``
    in the result); it is refused (:class:`InputError`) when its estimated memory exceeds
    ``memory_limit``.

    Returns (the demand scheduled, an :class:`LpSearch`): ``sends`` for that demand, ``T`` its
    simulated epochs, ``lower`` the best lower bound on epochs known for that demand at that tau:
    the LP horizon is one, since the LP is a relaxation of every schedule (module docstring), and
    so are the bounds of :func:`epoch_lower_bound` and an infeasible integral probe. ``probes``
    lists every solve. If no LP is solved within ``time_limit`` the direct AlltoAll is returned
    (``method`` "direct"). Raises ValueError for a demand that is not copy-free (AllGather,
    reductions).
    """
    t0 = time.perf_counter()
    unicast_needs(topo, demand)  # raises ValueError unless copy-free
    if D is None:
        D = epoch_distances(topo, timing)
    if polish_seconds is None:  # the budget: all that is left of the time limit (less a margin)
        polish_seconds = POLISH_SECONDS if time_limit is None else max(POLISH_SECONDS, 0.9 * time_limit)
    polish_end = t0 + polish_seconds  # moved on by the time the LPs take, below

    def left() -> float | None:
        return None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - t0))

    def report(stage: str, **kw) -> None:
        if progress:
            progress({"stage": stage, **kw, "elapsed": time.perf_counter() - t0})

    def lp_progress(ev: dict) -> None:  # elapsed since this call, not since the LP search began
        report(ev.pop("stage"), **{k: v for k, v in ev.items() if k != "elapsed"})

    probes: list[Probe] = []
    solver_s = 0.0
    timed_out = False

    def lp_search(lvl: _Level, hi: int | None, guess: int | None, budget: float | None = None) -> LpHorizon:
        nonlocal solver_s, timed_out, polish_end
        ts = time.perf_counter()
        hz = min_lp_horizon(topo, lvl.demand, lvl.timing, lo=lvl.lower, hi=hi, guess=guess, time_limit=budget or left(),
                            progress=lp_progress if progress else None, D=lvl.D, pieces=lvl.pieces)
        polish_end += time.perf_counter() - ts
        probes.extend(hz.probes)
        solver_s += hz.solver_seconds
        timed_out = timed_out or hz.timed_out
        lvl.lower = max(lvl.lower, hz.lower)
        lvl.lp_T = hz.T
        lvl.lp_seconds = max([p.seconds for p in hz.probes if p.outcome == "feasible"], default=0.0)
        return hz

    def realize(lvl: _Level, paths: list[FlowPath], per_unit: int, lp_T: int | None, loss: float) -> None:
        got = _realize(topo, lvl.demand, lvl.timing, paths, per_unit)
        if got is not None:
            lvl.offer(Candidate(got[1], got[0], loss, got[2], "lp"))
            report("decompose", pieces=lvl.pieces, lp_T=lp_T, epochs=got[1], loss=loss)

    def polish(lvl: _Level, share: float = 1.0) -> None:
        """Integral flows, anytime: first at the lower bound (one solve: often the answer, or a
        proof that raises the bound), then downward from one epoch under the best schedule, each
        feasible point a better schedule, until an infeasible horizon proves the best optimal,
        or the polish time (``share`` of what is left of it) runs out."""
        nonlocal solver_s, timed_out
        end = time.perf_counter() + share * max(0.0, polish_end - time.perf_counter())
        tried_bottom = False
        while lvl.open:
            T = lvl.lower if not tried_bottom else lvl.best.T - 1
            tried_bottom = True
            budget = end - time.perf_counter()
            if time_limit is not None:
                budget = min(budget, left())
            if budget <= lvl.lp_seconds:  # its root LP alone would not fit (HiGHS overruns then)
                return
            report("integral", T=T, pieces=lvl.pieces, best=lvl.best.T, lower=lvl.lower)
            outcome, idx, x, probe, secs = integral_flow(topo, lvl.demand, lvl.timing, T, lvl.D, budget)
            probes.append(probe)
            solver_s += secs
            if outcome == "feasible":
                realize(lvl, decompose_flow(topo, lvl.timing, idx, x), 1, T, 0.0)
                continue
            if outcome != "infeasible":
                timed_out = timed_out or time_limit is not None and left() <= 0
                return
            lvl.lower = max(lvl.lower, T + 1)  # no integral flow, so no schedule, in T epochs

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
    if lp_size(topo, demand, timing, int(one.lower * 1.1) + 1, D) > max_columns:
        # too large to expand in time: the static LP (bandwidth decides such instances)
        need = static_lp_bytes(topo)
        if need > memory_limit:
            raise InputError("method", f"the static LP would need about {need / 2**30:.1f} GiB, over the "
                             f"{memory_limit / 2**30:.0f} GiB memory limit", "raise --memory-limit, or split the topology")
        return demand, _static(topo, demand, timing, one, base, base_T, left(), report)
    # half the time for the time-expanded LP: if it cannot even find a horizon, the static LP can
    hz = lp_search(one, base_T, None, None if time_limit is None else left() / 2)
    if hz.T is None:
        if static_lp_bytes(topo) <= memory_limit and (time_limit is None or left() > 0):
            st = _static(topo, demand, timing, one, base, base_T, left(), report)
            st.probes[:0] = probes
            st.solver_seconds += solver_s
            st.timed_out = True  # the time-expanded LP ran out of time
            return demand, st
        return demand, LpSearch(base, base_T, one.lower, timed_out, probes, solver_seconds=solver_s, method="direct")

    sources, need_arr = unicast_needs(topo, demand)
    need = {(int(sources[a]), int(b)): int(need_arr[a, b]) for a, b in zip(*np.nonzero(need_arr), strict=True)}
    paths = decompose_flow(topo, timing, hz.idx, hz.x)
    realize(one, paths, 1, hz.T, rounding_loss(paths, need, 1))
    # the direct AlltoAll is a schedule of this demand too: list scheduling the LP's paths may
    # lose to it by an epoch where the LP's own horizon is the direct one (one switch, say)
    one.offer(Candidate(base_T, base, 0.0, 0, "direct"))
    polish(one, share=0.5)  # the other half for finer pieces, if they are tried
    levels = [one]

    k, loss = choose_pieces(paths, need, demand, max_pieces)
    # finer pieces only where the fluid LP finishes sooner than the best whole-chunk schedule
    if k > 1 and one.best.T > hz.T and (time_limit is None or left() > 0):
        dk = make_demand(topo, demand.collective, demand.size_bytes, demand.chunks * k)
        tk = epoch_timing(topo, dk.chunk_bytes, timing.tau)
        Dk = epoch_distances(topo, tk)
        lvl = _Level(k, dk, tk, Dk, max(epoch_lower_bound(topo, dk, tk, Dk).values()))
        realize(lvl, paths, k, None, loss)  # the whole-chunk paths, k pieces per unit of flow
        hzk = lp_search(lvl, None if lvl.best is None else lvl.best.T, hz.T)
        if hzk.T is not None:
            pk = decompose_flow(topo, tk, hzk.idx, hzk.x)
            realize(lvl, pk, 1, hzk.T, rounding_loss(pk, {pair: n * k for pair, n in need.items()}, 1))
        if lvl.best is not None:
            polish(lvl)
            levels.append(lvl)

    win = min(levels, key=lambda lv: (lv.best.T, lv.pieces))
    b = win.best
    res = LpSearch(b.sends, b.T, win.lower, timed_out, probes, solver_seconds=solver_s, lp_T=win.lp_T,
                   pieces=win.pieces, rounding_loss=b.loss, fallback_chunks=b.fallback, method=b.method)
    return win.demand, res


__all__ = [
    "FlowPath", "LpHorizon", "LpIndex", "LpSearch", "build_lp", "build_lp_index", "choose_pieces",
    "decompose_flow", "integral_flow", "min_lp_horizon", "round_to_pieces", "schedule_paths", "synthesize_lp",
]
