"""Round-by-round (A*) synthesis for AllGather: a window of epochs at a time, stitched.

TE-CCL's A* form (SIGCOMM 2024; docs/synthesis.md): instead of one MILP over the whole horizon,
solve a short window of epochs [t0, t0 + W), carry what every GPU holds and every chunk still in
flight into the next window, and reward chunks that end the window close (in epochs) to the GPUs
that still need them. The windows are stitched into one schedule that the simulator verifies.

The state between windows is exact, not estimated:

- ``hold[q, g]``: the epoch from which GPU g holds commodity q. A chunk sent before t0 that
  arrives in or after the window is already in it (a hold epoch above t0): it counts as an
  arrival at that epoch, may be relayed from then on, and is never sent to g again.
- ``used[l, k]``: chunks started on link l in epoch k by the windows already committed. A link
  with beta b > 0 stays busy: every capacity window of b + 1 epochs that straddles t0 counts
  them, and so do windows of later epochs that hold switch forwards already committed.
- arrivals at switches: a window that sends a chunk into a switch also decides its forwards
  (switch out-sends are allowed up to the latest epoch a chunk sent in the window can reach the
  switch), so no window inherits a switch arrival it must still forward.

The window model (one MIP, built in bulk) has a binary ``F[q, l, k]`` per candidate send and no
buffer variables: since a GPU receives each chunk at most once (``receive_once``), a GPU may relay
q in epoch k when one of its in-sends of q arrives by k (``relay_only_what_arrives``); a switch
forwards in the epoch a chunk arrives (``switch_forwards_on_arrival``); link capacity counts the
sends already committed (``link_capacity_with_history``). Candidates are only sends that could
matter: commodities not yet fully delivered, tails that can hold the chunk in time (epoch
distances from the current holders), heads that neither hold it nor have it in flight, links
with room left; per (link, epoch) only the best few by value are kept.

Objective: each send into a GPU that needs the chunk earns DELIVERY, divided by 1 + the epochs
it lands after the chunk could reach that GPU from its holders (a slow copy across a cut into a
chassis that already has the chunk is nearly worthless), plus a little for landing early in the
window; a send planned for a later epoch of the window loses DEFER per epoch. Chunks that end the
window close to the GPUs that still need them are rewarded twice:

- coverage (``chunks_end_close``): per (chunk q, GPU d lacking q and with no holder of q within
  one cheapest hop) a credit Z in [0, 1] worth COVER, earned only if some chosen send lands q
  within that hop of d. Capped at 1, so a second copy toward the same GPUs earns nothing: the
  model spreads distinct chunks (rarest first, in effect) instead of duplicating one.
- route potential: how many epochs of route (hold epochs aside) the new copy saves the GPUs
  still lacking q, summed, scaled so the largest in the window is POTENTIAL (one delivery always
  outweighs it): chunks with far to go move first.
Each send costs SEND_COST, so nothing useless goes on a link.

Receding horizon: only the window's first ``commit`` epochs (default 1) are kept; the next window
starts there. Spare room left in the kept epochs goes to rarest-first greedy sends.

Several configurations are tried in turn (:func:`default_tries`: window 1 or 2 epochs, with and
without the route potential), each dropped as soon as it can no longer beat the best, all stopped
once one meets the epoch lower bound. No single configuration was best on every topology
measured; the portfolio keeps the best verified schedule.

Every send of a window passes an exact check (held before sent, forwarded on arrival, capacity)
before it is committed, so the stitch is valid by construction; the simulator then verifies it.
When the time limit runs out (or the windows stall), a greedy completion finishes the schedule:
rarest-first list scheduling epoch by epoch over every direct link and every fewest-epoch
GPU -> switch* -> GPU route, so a complete verified schedule always comes back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from flowride.collectives.demand import Collective, Demand
from flowride.schedule.ir import Schedule
from flowride.schedule.prune import drop_switch_cycles
from flowride.schedule.simulate import simulate
from flowride.synth.astar_state import (
    Context,
    OutOfTime,
    State,
    greedy_complete,
    greedy_epochs,
    in_flight_after,
    virtual_links,
)
from flowride.synth.astar_window import (
    POTENTIAL,
    build_window_model,
    commit_window,
    window_candidates,
)
from flowride.synth.bounds import epoch_lower_bound
from flowride.synth.highs import SolveOptions, solve
from flowride.synth.reach import UNREACHABLE, epoch_distances
from flowride.synth.result import Probe, Progress, SearchResult
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming

WINDOW_SECONDS = 10.0  # cap on one window's solve


# ------------------------------------------------------------------------------------ driver


def default_window(timing: EpochTiming, topo: Topology) -> int:
    """Epochs per window. One epoch when every link takes a chunk per epoch (b = 0): each window
    is then an exact assignment of chunks to links, which measured best and fastest (a relay of
    what arrives next epoch is the next window's choice). Two when some link is slower than a
    chunk per epoch, so a window can relay what a fast link brings while the slow one is busy."""
    return 2 if int(timing.beta_epochs.max()) > 0 else 1


@dataclass(frozen=True)
class Try:
    """One way to run the windows: epochs per window, epochs committed, potential weight."""

    window: int
    commit: int
    potential: float


def default_tries(timing: EpochTiming, topo: Topology, window: int | None, commit: int | None) -> list[Try]:
    """The configurations tried in turn (each finished run is kept if it beats the best so far).
    Measured (see tests/test_astar.py and the report): no single choice of window and potential is
    best everywhere; e.g. dgx2 x 2 at 1 GB reaches its lower bound only without the potential,
    ndv2 x 8 only with one-epoch windows, ndv2 x 4 only with two-epoch windows."""
    w0 = int(window) if window is not None else default_window(timing, topo)
    ws = [w0] if window is not None else [w0, 3 - w0]
    out = []
    for w in ws:
        c = int(commit) if commit is not None else 1
        for pot in (POTENTIAL, 0.0):
            out.append(Try(w, min(c, w) if commit is None else c, pot))
    return out


def synthesize_astar(
    topo: Topology,
    demand: Demand,
    timing: EpochTiming,
    window: int | None = None,
    time_limit: float | None = None,
    progress: Progress | None = None,
    D: np.ndarray | None = None,
    commit: int | None = None,
    window_seconds: float | None = None,
    threads: int | None = None,
    mip_gap: float = 0.01,
    fill: bool = True,
    tries: int | None = None,
    must_finish: bool = True,
) -> SearchResult:
    """Stitched window-by-window AllGather schedule (see the module notes).

    ``window``: epochs per window (W; default 1, or 2 where some link is slower than a chunk per
    epoch); ``commit``: epochs of each window kept before the next is solved (default 1: a
    receding horizon, the window's later epochs only inform its first); ``fill``: after each
    window, spare room in its committed epochs goes to rarest-first greedy sends; ``tries``: how
    many configurations of :func:`default_tries` to run at most (each stops early once it cannot
    beat the best so far; all stop once one reaches the epoch lower bound); ``time_limit``:
    seconds for everything: a first try still running is finished by a greedy completion, later
    tries are dropped (``timed_out`` says the limit cut anything short); ``must_finish=False``
    (the caller holds another schedule): nothing runs past the limit, not even that completion,
    and ``sends`` is None when no try finished; ``window_seconds``: cap on one window's solve.

    Returns a :class:`SearchResult`: ``sends`` (epoch, link, source GPU, chunk) of the best
    stitched schedule, ``T`` its epochs (replayed and verified by the simulator), ``lower`` the
    epoch lower bound, one probe per window solve (``T`` of a probe: the window's end epoch;
    outcome ``greedy`` marks a greedy completion).
    """
    if demand.collective is not Collective.ALLGATHER:
        raise ValueError(f"the round-by-round form handles AllGather (multicast copies), not {demand.collective.value}")
    t_start = time.perf_counter()
    if window is not None and int(window) < 1:
        raise ValueError(f"window {window} must be at least 1 epoch")
    if commit is not None and not 1 <= int(commit) <= (int(window) if window is not None else 1):
        raise ValueError(f"commit {commit} must be in 1..window")
    if D is None:
        D = epoch_distances(topo, timing)
    deadline = None if time_limit is None else t_start + float(time_limit)
    lower = max(epoch_lower_bound(topo, demand, timing, D).values())
    configs = default_tries(timing, topo, window, commit)
    if tries is not None:
        configs = configs[: max(1, int(tries))]
    res = SearchResult(None, 0, lower, False)
    run = _Run(topo, demand, timing, D, res, lower, deadline, window_seconds, threads, mip_gap, fill, progress, t_start)
    best: tuple[int, list] | None = None
    for i, cfg in enumerate(configs):
        if i > 0 and deadline is not None and time.perf_counter() >= deadline:
            res.timed_out = True  # tries left untried
            break
        st, timed_out, done = _run_windows(run, cfg, i, bail=None if best is None else best[0],
                                           complete=best is None and must_finish)
        res.timed_out = res.timed_out or timed_out
        if not done:
            continue  # could not beat the best, or ran out of time after the first try
        sends = sorted((k, li, int(st.src[q]), demand.commodities[q].chunk) for k, li, q in st.sends)
        sched = drop_switch_cycles(Schedule.from_tuples(topo, demand, timing.tau, sends, {"method": "astar"}))
        sends = [(x.epoch, x.link, x.source, x.chunk) for x in sched.sends]
        sim = simulate(sched)
        if not sim.valid:
            raise AssertionError(f"stitched schedule failed verification: {sim.first_violation}")
        if best is None or int(sim.epochs) < best[0]:
            best = (int(sim.epochs), sends)
        if best[0] <= lower:
            break
    if best is None:  # only without must_finish: out of time before any try finished
        res.timed_out = True
        return res
    res.T, res.sends = best
    return res


@dataclass
class _Run:
    """What every try of one :func:`synthesize_astar` call shares: the instance, the result the
    tries add their probes to, the clock and the solver settings."""

    topo: Topology
    demand: Demand
    timing: EpochTiming
    D: np.ndarray
    res: SearchResult
    lower: int
    deadline: float | None
    window_seconds: float | None
    threads: int | None
    mip_gap: float
    fill: bool
    progress: Progress | None
    t_start: float
    windows: int = 0  # windows solved so far, over all tries


def _run_windows(run: _Run, cfg: Try, try_i: int, bail: int | None, complete: bool) -> tuple[State, bool, bool]:
    """One stitched run. Returns (state, timed_out, done): ``done`` is False when the run was
    dropped (it could no longer finish before epoch ``bail``, or the deadline passed and it is not
    the run to ``complete``)."""
    topo, demand, timing, res, deadline = run.topo, run.demand, run.timing, run.res, run.deadline
    W, C = cfg.window, cfg.commit
    st = State(topo, demand, timing)
    ctx = Context(topo, demand, timing, run.D, st)
    if (ctx.D[np.ix_(ctx.gpus, ctx.gpus)] >= UNREACHABLE).any():
        raise ValueError("some GPU cannot reach another")
    vlinks = virtual_links(topo, st)
    needed = int(st.need.sum())
    t0 = 0
    stalled = 0
    timed_out = False
    while st.missing().any():
        if bail is not None and t0 + 1 >= bail:
            return st, False, False  # a chunk still missing now lands at t0 + 1 or later
        remaining = None if deadline is None else deadline - time.perf_counter()
        if remaining is not None and remaining <= 0:
            if not complete:
                return st, True, False
            timed_out = True
            break
        active = np.flatnonzero(st.missing().any(axis=1))
        ps = time.perf_counter()
        win = window_candidates(st, ctx, t0, W, active, cfg.potential)
        outcome = "empty"
        cols = rows = 0
        committed = 0
        if win is not None:
            model = build_window_model(st, win, st.hold[active])
            cols, rows = model.num_cols, model.num_rows
            budget = WINDOW_SECONDS if run.window_seconds is None else float(run.window_seconds)
            if remaining is not None:
                left_windows = max(2.0, (1.5 * run.lower - t0) / C)
                budget = min(budget, max(0.05, remaining / left_windows))
            out = solve(model, SolveOptions(time_limit=budget, mip_gap=run.mip_gap, threads=run.threads))
            res.solver_seconds += out.seconds
            outcome = "feasible" if out.x is not None else out.status
            if out.x is not None:
                committed = commit_window(st, active, win, np.flatnonzero(out.x[: len(win.q)] > 0.5), t0 + C)
        if run.fill:
            committed += greedy_epochs(st, vlinks, t0, t0 + C)
        res.probes.append(Probe(t0 + W, outcome, time.perf_counter() - ps, cols, rows))
        stalled = stalled + 1 if committed == 0 else 0
        if run.progress:
            run.progress({"stage": "window", "window": run.windows, "try": try_i, "window_epochs": W,
                          "start_epoch": t0, "delivered": st.delivered(), "needed": needed, "sends": committed,
                          "outcome": outcome, "elapsed": time.perf_counter() - run.t_start})
        run.windows += 1
        t0 += C
        if stalled >= 3 and not in_flight_after(st, t0):
            break  # nothing more the windows can do: the greedy completion takes over
    if st.missing().any():
        try:
            greedy_complete(st, vlinks, 0, None if complete else deadline)
        except OutOfTime:
            return st, True, False
        res.probes.append(Probe(t0, "greedy", 0.0, 0, 0))
    return st, timed_out, True


