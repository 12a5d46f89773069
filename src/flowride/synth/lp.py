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

The route through this model (search on T, decomposition, polish, finer pieces) is in
:mod:`flowride.synth.lp_search`; a solution becomes paths here (:func:`decompose_flow`) and
paths become sends in :mod:`flowride.synth.flow`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from flowride.collectives.demand import Demand
from flowride.synth.flow import FLOW_EPS, FlowPath, unicast_needs
from flowride.synth.highs import MipModel, SolveOptions, solve
from flowride.synth.reach import UNREACHABLE, epoch_distances
from flowride.synth.result import Probe
from flowride.synth.rows import Infeasible, Rows, expand_runs
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming

HOP_COST = 1e-2  # per unit per send: breaks ties toward fewer hops; 100 hops weigh one epoch


# ---------------------------------------------------------------------------- index


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
    grp, f_k = expand_runs(earliest[ps, pl], latest[ps, pl] - earliest[ps, pl] + 1)
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
    grp, x_t = expand_runs(start[gs_s, gs_g], T - start[gs_s, gs_g])
    x_s, x_g = gs_s[grp], gs_g[grp]
    ds_s, ds_g = np.nonzero(has & (need > 0))
    grp, y_t = expand_runs(start[ds_s, ds_g], T - start[ds_s, ds_g] + 1)
    y_s, y_g = ds_s[grp], ds_g[grp]
    return LpIndex(T, sources, need, f_s, f_l, f_k, x_s, x_g, x_t, y_s, y_g, y_t,
                   row_start, off.reshape(S, N), gpu_rows, int(cnt.sum()))


# ---------------------------------------------------------------------------- constraint families


def store_and_forward_at_gpus(idx: LpIndex, topo: Topology, timing: EpochTiming, rows: Rows, rhs: np.ndarray) -> None:
    """What a GPU holds at epoch t (arrived now, or kept from t - 1, or, at the source in epoch
    0, all of its data) it sends on, keeps, or (its own share) takes out:

        sum_{l into g, arrives t} F[s,l,k] + X[s,g,t-1] + supply - sum_{l out of g} F[s,l,t] - X[s,g,t] - Y[s,g,t] = 0
    """
    l_src, l_dst = topo.link_ends
    is_gpu = np.array([nd.is_gpu for nd in topo.nodes], dtype=bool)
    src, dst = l_src[idx.f_l], l_dst[idx.f_l]
    arr = idx.f_k + timing.hop_delay[idx.f_l]
    out = np.flatnonzero(is_gpu[src])
    rows.entries(idx.cons_row(idx.f_s[out], src[out], idx.f_k[out]), out, -1.0)
    inn = np.flatnonzero(is_gpu[dst])
    rows.entries(idx.cons_row(idx.f_s[inn], dst[inn], arr[inn]), inn, 1.0)
    xc = idx.x0 + np.arange(len(idx.x_s))
    rows.entries(idx.cons_row(idx.x_s, idx.x_g, idx.x_t), xc, -1.0)
    rows.entries(idx.cons_row(idx.x_s, idx.x_g, idx.x_t + 1), xc, 1.0)
    yc = idx.y0 + np.arange(len(idx.y_s))
    rows.entries(idx.cons_row(idx.y_s, idx.y_g, idx.y_t), yc, -1.0)
    S = len(idx.sources)
    supply_rows = idx.cons_row(np.arange(S), idx.sources, np.zeros(S, dtype=np.int64))
    rhs[supply_rows] = -idx.need.sum(axis=1)
    rows.families["store_and_forward_at_gpus"] = (0, idx.gpu_rows)


def switch_forwards_on_arrival(idx: LpIndex, topo: Topology, timing: EpochTiming, rows: Rows) -> None:
    """Switches hold nothing: what arrives at a switch for epoch t leaves it in epoch t.

        sum_{l into w, arrives t} F[s,l,k] - sum_{l out of w} F[s,l,t] = 0
    """
    l_src, l_dst = topo.link_ends
    out = np.flatnonzero(timing.src_is_switch[idx.f_l])
    rows.entries(idx.cons_row(idx.f_s[out], l_src[idx.f_l[out]], idx.f_k[out]), out, -1.0)
    inn = np.flatnonzero(timing.dst_is_switch[idx.f_l])
    arr = idx.f_k[inn] + timing.hop_delay[idx.f_l[inn]]
    rows.entries(idx.cons_row(idx.f_s[inn], l_dst[idx.f_l[inn]], arr), inn, 1.0)
    rows.families["switch_forwards_on_arrival"] = (idx.gpu_rows, idx.cons_rows)


def every_destination_receives_its_demand(idx: LpIndex, row0: int, rows: Rows) -> tuple[np.ndarray, np.ndarray]:
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
    rows.entries(row0 + r, idx.y0 + np.arange(len(idx.y_s)), 1.0)
    rows.families["every_destination_receives_its_demand"] = (row0, row0 + len(ps))
    b = idx.need[ps, pg].astype(np.float64)
    return b, b


def link_capacity_window(idx: LpIndex, timing: EpochTiming, row0: int, rows: Rows) -> np.ndarray:
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
    rows.entries(row0 + remap[r_comp[m]], c[m], 1.0)
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
    rows = Rows()
    rhs = np.zeros(idx.cons_rows)
    store_and_forward_at_gpus(idx, topo, timing, rows, rhs)
    switch_forwards_on_arrival(idx, topo, timing, rows)
    rows.bounds(rhs, rhs)
    rows.bounds(*every_destination_receives_its_demand(idx, rows.n, rows))
    cap = link_capacity_window(idx, timing, rows.n, rows)
    rows.bounds(np.full(len(cap), -np.inf), cap)
    n = idx.num_cols
    model = MipModel(
        cost=weighted_delivery_objective(idx) if objective == "weighted" else early_delivery_objective(idx),
        lb=np.zeros(n),
        ub=np.full(n, np.inf),
        integer=np.zeros(n, dtype=bool),
        A=rows.matrix(n),
        row_lo=rows.row_lo,
        row_hi=rows.row_hi,
        row_names=rows.families,
    )
    return model, idx


# ---------------------------------------------------------------------------- decomposition


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


# ---------------------------------------------------------------------------- integral probe


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
