"""Synthesis at many sizes, each size warm-started from the previous one.

A schedule is a plan of routes, copies and order; at another size only its timing changes (the
epoch length follows the chunk size, and a link's latency costs more or fewer epochs). So the
schedule found for one size, retimed to the next (:func:`flowride.api.retimed`, the same replay
the coarse-to-fine ladder uses), is a valid schedule there and an incumbent for its search
(``synthesize_with(..., warm=...)``): when it already meets the epoch lower bound, the ladder,
the A* windows and the MILP are skipped. Sizes run smallest first. Reductions (ReduceScatter,
AllReduce) are built from AllGathers inside :mod:`flowride.api` and run cold.

The rows carry nccl-tests' columns (:mod:`flowride.schedule.metrics`) with modelled times, so a
synthesized sweep reads like a measured one (:mod:`flowride.comm.sweep`), and the report's
headline per size: NCCL's calibrated prediction, its model error, the schedule priced as the
runtime runs it and the speedup of the one over the other (:mod:`flowride.api.priced`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from flowride.api import WARM_TAG, SynthOutcome, synthesize_with
from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.schedule.metrics import (
    ELEMENT_BYTES,
    ELEMENT_TYPE,
    busbw_GBps,
    nccl_count,
    redop,
    run_bytes,
)
from flowride.synth.options import SynthOptions
from flowride.synth.result import Progress
from flowride.topology.model import Topology


@dataclass
class SweepPoint:
    """One size of a synthesized sweep."""

    size_bytes: int  # what was synthesized (the requested size rounded: :func:`sweep_sizes_for`)
    requested: list[int]  # the requested sizes that round to it
    outcome: SynthOutcome
    warm: bool  # a schedule of the previous size was offered as an incumbent
    seconds: float  # wall time of this size's synthesis

    @property
    def warm_won(self) -> bool:
        """The retimed schedule of the previous size was not beaten at this size."""
        return str(self.outcome.schedule.meta.get("method", "")).endswith(WARM_TAG)

    def row(self) -> dict:
        """nccl-tests' columns (modelled time) and the synthesis' own: bound, ratio, epochs, method."""
        rep = self.outcome.report()
        coll, n, size = rep["collective"], rep["gpus"], self.size_bytes
        pred = rep["nccl_predicted"]
        return {
            "size": size, "count": nccl_count(coll, n, size), "type": ELEMENT_TYPE, "redop": redop(coll),
            "time_us": rep["finish_time_us"], "algbw_GBps": rep["algbw_GBps"],
            "busbw_GBps": busbw_GBps(coll, n, size, rep["finish_time_us"] * 1e-6),
            "lower_bound_us": rep["lower_bound_us"], "ratio_to_lower_bound": rep["ratio_to_lower_bound"],
            "epochs": rep["epochs"], "epoch_lower_bound": rep["epoch_lower_bound"], "chunks": rep["chunks"],
            "method": rep["method"], "status": rep["status"], "warm_start": self.warm, "warm_start_won": self.warm_won,
            # the headline: NCCL's calibrated prediction and this schedule priced as the runtime runs it
            "runtime_us": rep["runtime_us"], "runtime_protocol": rep["runtime_protocol"],
            "nccl_us": pred["time_us"] if pred else None,
            "nccl_best": f"{pred['algorithm']}/{pred['protocol']}" if pred else None,
            "model_error": pred["model_error"] if pred else None,
            "speedup_vs_nccl": rep["speedup_vs_nccl"],
            # detail: NCCL's algorithms in the epoch model
            "nccl_epoch_model_us": rep["nccl"]["best_us"] if rep["nccl"] else None,
            "nccl_epoch_model_best": rep["nccl"]["best"] if rep["nccl"] else None,
            "seconds": self.seconds, "requested": self.requested,
        }


def sweep_sizes_for(topo: Topology, sizes: list[int], chunks: int | str) -> dict[int, list[int]]:
    """Each requested size rounded as a run rounds it (:func:`~flowride.schedule.metrics.run_bytes`
    over the topology's ranks and ``chunks``), smallest first, with the requested sizes it covers;
    so a synthesized row and a measured row of the same size agree."""
    if not sizes:
        raise InputError("sizes", "none given", "give at least one size")
    out: dict[int, list[int]] = {}
    per = chunks if isinstance(chunks, int) else 1  # "auto": whole elements per rank; the count is chosen per size
    for s in sorted(sizes):
        out.setdefault(run_bytes(s, topo.buffer_ranks, per, ELEMENT_BYTES), []).append(s)
    return out


def sweep_file_name(collective: Collective | str, size_bytes: int) -> str:
    """The file name of one size's schedule in a sweep's output directory."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    return f"{coll.value}_{size_bytes}B.json"


def sweep_files(topo: Topology, collective: Collective | str, sizes: list[int], chunks: int | str) -> list[str]:
    """Every schedule file a sweep will write (one per rounded size), known before it runs so the
    output directory can be tried first (:func:`~flowride.files.check_output_tree`)."""
    return [sweep_file_name(collective, s) for s in sweep_sizes_for(topo, sizes, chunks)]


def synthesize_sweep(topo: Topology, collective: Collective | str, sizes: list[int], chunks: int | str = 1,
                     opts: SynthOptions | None = None, progress: Progress | None = None,
                     warm_start: bool = True, nccl: bool = True, calibration=None) -> list[SweepPoint]:
    """Synthesize ``collective`` on ``topo`` at every size (rounded: :func:`sweep_sizes_for`),
    smallest first, each size's search given the previous size's schedule, retimed, as an
    incumbent (``warm_start``). ``opts.time_limit`` holds per size. ``progress`` receives
    ``{"stage": "size", "i", "of", "size", "chunks", "warm"}`` before each size, then that
    synthesis' own events. ``nccl``: model NCCL's algorithms at each size and predict NCCL's time
    by the calibrated model (``calibration``, as :func:`flowride.api.synthesize` takes it; the
    rows' NCCL columns)."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    opts = opts or SynthOptions()
    plan = sweep_sizes_for(topo, sizes, chunks)
    points: list[SweepPoint] = []
    prev: SynthOutcome | None = None
    for i, (size, asked) in enumerate(plan.items()):
        warm = (prev.schedule,) if warm_start and prev is not None and not coll.reduces else ()
        if progress:
            progress({"stage": "size", "i": i + 1, "of": len(plan), "size": size, "chunks": chunks, "warm": bool(warm)})
        t0 = time.perf_counter()
        out = synthesize_with(topo, coll, size, chunks, opts, progress, warm=warm, nccl=nccl, calibration=calibration)
        points.append(SweepPoint(size, asked, out, bool(warm), time.perf_counter() - t0))
        prev = out
    return points
