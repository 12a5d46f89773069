"""One call from a topology and a collective to a verified, measured schedule.

``synthesize`` finds the fastest schedule it can and trusts only the simulator: the schedule it
returns has been replayed and checked, and every figure in the report comes from that replay, the
lower bounds, the classic baseline and NCCL's own algorithms, all timed by the same simulator.

The floor holds one module per step: :mod:`.single` (one chunk count of an AllGather or
AlltoAll: model, incumbents, method, verify, measure), :mod:`.reduction` (ReduceScatter and
AllReduce from AllGathers run backwards), :mod:`.auto` (``--chunks auto``: the chunk count
searched within the time limit, NCCL's algorithms as candidates), :mod:`.ladder` (schedules made
at other epochs or sizes, retimed), :mod:`.subgraphs` (the faster links' subgraphs as candidates),
:mod:`.outcome` (the result and its report), :mod:`.clock`.
"""

from __future__ import annotations

from dataclasses import replace

from flowride.api import ladder
from flowride.api.auto import synthesize_auto
from flowride.api.clock import Clock
from flowride.api.ladder import WARM_TAG, Retimed, ladder_factors, retimed
from flowride.api.outcome import SynthOutcome, switch_model
from flowride.api.priced import headline
from flowride.api.reduction import synthesize_reduction
from flowride.api.single import level, synthesize_one
from flowride.api.subgraphs import best_with_subgraphs, fast_subgraphs
from flowride.collectives.demand import Collective, make_demand
from flowride.errors import InputError
from flowride.runtime.defaults import Chosen, for_topology
from flowride.schedule.ir import Schedule
from flowride.synth.budget import MEMORY_LIMIT_BYTES, check_work
from flowride.synth.nccl import model_nccl
from flowride.synth.options import DEFAULT_SPEEDUPS, Speedups, SynthOptions
from flowride.synth.result import Progress
from flowride.topology.model import Topology
from flowride.topology.timing import epoch_timing

__all__ = ["WARM_TAG", "Retimed", "SynthOutcome", "coarse_to_fine", "ladder_factors", "retimed", "switch_model",
           "synthesize", "synthesize_with"]

NCCL_SHARE = 0.15  # of the time limit NCCL's modelled algorithms may take (beyond it: NCCL's own estimate)
AUTO_DEFAULT_SECONDS = 60.0  # --chunks auto without --time-limit: how long it searches


def synthesize(
    topo: Topology,
    collective: Collective | str,
    size_bytes: int,
    epoch: str | float = "fast",
    chunks: int | str = 1,
    time_limit: float | None = None,
    mip_gap: float | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
    method: str = "auto",
    memory_limit: int = MEMORY_LIMIT_BYTES,
    speedups: Speedups = DEFAULT_SPEEDUPS,
    objective: str = "makespan",
    nccl: bool = True,
    calibration: str | Chosen | None = None,
) -> SynthOutcome:
    """The fastest schedule ``method`` can find, verified by the simulator.

    - ``milp``: minimum makespan by bisection over MILP probes (proven when it finishes in time);
      refused up front when its estimated memory exceeds ``memory_limit``;
    - ``lp`` (AlltoAll): the fluid LP, decomposed into per-chunk sends;
    - ``astar`` (AllGather): windows of epochs solved one after another and stitched;
    - ``trees`` (AllGather): polynomial time: trees packed to the throughput optimum
      (ForestColl's), and load-balanced tree shapes for latency;
    - ``auto``: AlltoAll: the LP. AllGather: the trees, then (if they miss the epoch bound) the
      windows with half the time, then (if a gap is left) the MILP from the best of them when
      its size is modest; the best verified schedule wins.

    ``chunks``: a count, or ``"auto"`` (the CLI's default; :mod:`flowride.api.auto`): counts are
    searched and the time limit used. Reductions (ReduceScatter, AllReduce) are built from
    AllGathers run backwards with the same method. ``nccl``: model NCCL's own algorithms on the
    same topology for the report (``nccl``) and, with ``chunks="auto"``, as candidates, and
    headline the report with NCCL's prediction by the calibrated model (``calibration``: a
    :class:`~flowride.runtime.defaults.Chosen`, or what ``--calibration`` takes; default: the
    built-in one of the topology's node type) beside this schedule priced as the runtime runs it
    (:mod:`flowride.api.priced`). The other keywords are those of
    :class:`~flowride.synth.options.SynthOptions`."""
    opts = SynthOptions(method, epoch, time_limit, mip_gap, threads, memory_limit, speedups, objective)
    return synthesize_with(topo, collective, size_bytes, chunks, opts, progress, nccl=nccl, calibration=calibration)


def synthesize_with(topo: Topology, collective: Collective | str, size_bytes: int, chunks: int | str, opts: SynthOptions,
                    progress: Progress | None = None, warm: tuple[Schedule, ...] = (), nccl: bool = True,
                    subgraphs: bool = True, calibration: str | Chosen | None = None) -> SynthOutcome:
    """:func:`synthesize` with its options as one :class:`SynthOptions`. ``warm``: schedules of the
    same collective on ``topo`` at other sizes (:func:`flowride.sweep.synthesize_sweep`), retimed to
    this one and offered as incumbents (AllGather, AlltoAll). ``subgraphs``: where dropping the
    slowest links shortens the epoch, synthesize on the faster subgraphs too and keep the best
    (:mod:`flowride.api.subgraphs`: more links never give a slower schedule). ``calibration``: as
    for :func:`synthesize`."""
    priced = nccl and not topo.teccl_compat
    chosen = for_topology(topo, calibration) if priced else None  # a bad profile is refused before any work
    out = _search(topo, collective, size_bytes, chunks, opts, progress, warm, nccl, subgraphs)
    if chosen is not None:
        out.headline = headline(out.schedule, out.parts, out.demand.collective, out.demand.size_bytes, chosen)
    return out


def _search(topo: Topology, collective: Collective | str, size_bytes: int, chunks: int | str, opts: SynthOptions,
            progress: Progress | None, warm: tuple[Schedule, ...], nccl: bool, subgraphs: bool) -> SynthOutcome:
    """The schedule :func:`synthesize_with` returns, before its headline figures."""
    opts.check()
    given = opts
    auto = chunks == "auto"
    default_budget = auto and opts.time_limit is None and not topo.teccl_compat
    if default_budget:
        opts = replace(opts, time_limit=AUTO_DEFAULT_SECONDS)  # the search must end: a default budget, stated in the help
    clock = Clock(opts.time_limit)
    if not auto and not (isinstance(chunks, int) and not isinstance(chunks, bool)):
        raise InputError("chunks", f"{chunks!r} is neither a count nor auto", "give a whole number of chunks, or auto")
    demand = make_demand(topo, collective, size_bytes, 1 if auto else chunks)
    opts = opts.for_demand(demand)
    coll = demand.collective
    model = None
    first = make_demand(topo, coll, demand.size_bytes, demand.chunks)
    check_work(topo, first, epoch_timing(topo, first.chunk_bytes, opts.epoch), opts.time_limit)  # refuse before any work
    subs = fast_subgraphs(topo, first.chunk_bytes, opts.epoch) if subgraphs else []
    if subs:
        return _with_subgraphs(topo, subs, collective, size_bytes, chunks, given, progress, warm, nccl)
    if nccl and not topo.teccl_compat:
        model = model_nccl(topo, coll, demand.size_bytes, clock.share(NCCL_SHARE))
        if progress:
            progress({"stage": "nccl", "algorithm": model.best.name, "nccl_us": model.best.time_us})
    if auto and not topo.teccl_compat:  # the published model keeps the published single chunk
        out = synthesize_auto(topo, coll, demand.size_bytes, opts, clock, progress, warm, model, default_budget)
        if progress:  # the live line ends on the report's figure
            progress({"stage": "done", "best_us": out.finish_time_s * 1e6, "chunks": out.demand.chunks})
        return out
    if coll.reduces:
        out = synthesize_reduction(topo, demand, opts, progress, clock)
    else:
        out = synthesize_one(topo, demand, opts, clock, progress, warm)
    out.nccl = model
    out.chunks_requested = 1 if auto else chunks
    out.wall_seconds = clock.elapsed()
    return out


def _with_subgraphs(topo: Topology, subs: list[Topology], collective: Collective | str, size_bytes: int, chunks: int | str,
                    opts: SynthOptions, progress: Progress | None, warm: tuple[Schedule, ...], nccl: bool) -> SynthOutcome:
    """The synthesis on the faster subgraphs (a share of the time each) and on the whole topology
    (the rest; with ``--chunks auto`` and no limit, its own default budget), the best kept."""
    clock = Clock(opts.time_limit)
    limit = opts.time_limit if opts.time_limit is not None or chunks != "auto" else AUTO_DEFAULT_SECONDS

    def run(t: Topology, seconds: float | None, whole: bool) -> SynthOutcome:
        if whole:
            o = opts if opts.time_limit is None else replace(opts, time_limit=seconds)
            return _search(t, collective, size_bytes, chunks, o, progress, warm, nccl, False)
        if progress:
            progress({"stage": "subgraph", "links": len(t.links), "of": len(topo.links)})

        def quiet(ev: dict) -> None:  # the subgraph's own "done" would end the live line early
            if progress and ev.get("stage") != "done":
                progress(ev)

        return _search(t, collective, size_bytes, chunks, replace(opts, time_limit=seconds), quiet, (), False, False)

    out = best_with_subgraphs(topo, subs, limit, run, clock.elapsed)
    out.wall_seconds = clock.elapsed()
    return out


def coarse_to_fine(topo: Topology, demand, timing, opts: SynthOptions, time_limit: float | None, progress: Progress | None = None,
                   fine_too_large: bool = False) -> list[Retimed]:
    """The coarse-to-fine ladder (:func:`flowride.api.ladder.coarse_to_fine`) with each rung one
    synthesis at fixed chunks."""
    return ladder.coarse_to_fine(topo, demand, timing, opts, time_limit, progress, fine_too_large, level)
