"""From recorded instruction times to bubbles: per-stage idle time, typed gaps, profiles.

Gap i of a stage is the idle time before its instruction i computes (waiting on a receive, or
nothing to do); the gap after the last instruction, less the optimizer step, runs until every
stage has finished the iteration. Each gap's type comes from the instruction list
(:func:`flowride.pipeline.schedules.gap_types`), so it holds for any (schedule, p, m).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np


@dataclass
class Gap:
    stage: int
    iteration: int
    type: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def iteration_gaps(rank_rec: dict, it_rec: dict) -> tuple[list[Gap], float, float]:
    """(gaps, busy seconds, iteration seconds) of one stage in one iteration."""
    types = rank_rec["gap_types"]
    recs = [r for r in it_rec["records"] if r["kind"] != "O"]
    opt = [r for r in it_rec["records"] if r["kind"] == "O"]
    stage, it = rank_rec["rank"], it_rec["iteration"]
    gaps = []
    prev = it_rec["start"]
    busy = 0.0
    for i, r in enumerate(recs):
        gaps.append(Gap(stage, it, types[i], prev, r["compute"]))
        busy += r["end"] - r["compute"]
        prev = r["end"]
    busy += sum(r["end"] - r["start"] for r in opt)
    # the final gap: after the optimizer step until every stage has finished the iteration
    gaps.append(Gap(stage, it, types[len(recs)], opt[-1]["end"] if opt else prev, it_rec["end"]))
    return gaps, busy, it_rec["end"] - it_rec["start"]


def analyse(ranks: list[dict], warmup: int, harvested: set[int] | None = None) -> dict:
    """Bubble statistics of a run (iterations before ``warmup`` left out when others remain).

    ``harvested``: the stages whose idle counts as bubbles side work could use (a rehearsal's
    real stage; None: every stage); the idle sums and the measured fraction cover only those."""
    per_stage = []
    stats: dict[tuple[int, str], list[float]] = {}
    free: dict[int, list[int]] = {}
    iter_times: list[float] = []
    iter_harvest: list[bool | None] = []
    iter_windows: list[tuple[float, float]] = []
    iter_idle: dict[int, float] = {}  # measured iteration -> idle seconds summed over stages
    all_gaps: list[Gap] = []
    for rr in sorted(ranks, key=lambda r: r["rank"]):
        its = rr["iterations"]
        measured = its[warmup:] if len(its) > warmup else its
        fracs = []
        for k, it in enumerate(measured):
            gaps, busy, total = iteration_gaps(rr, it)
            if harvested is None or rr["rank"] in harvested:
                iter_idle[k] = iter_idle.get(k, 0.0) + max(0.0, total - busy)
            all_gaps.extend(gaps)
            fracs.append(max(0.0, 1.0 - busy / total) if total > 0 else 0.0)
            for g in gaps:
                stats.setdefault((rr["rank"], g.type), []).append(g.seconds)
            free.setdefault(rr["rank"], []).append(it["free_memory"])
            if rr["rank"] == 0:
                iter_times.append(total)
                iter_harvest.append(it.get("harvest"))
                iter_windows.append((it["start"], it["end"]))
        per_stage.append(float(np.mean(fracs)) if fracs else 0.0)
    counted = [f for r, f in enumerate(per_stage) if harvested is None or r in harvested]
    n_iters = max(1, len(iter_times))
    bubbles = []
    for (stage, typ), vals in sorted(stats.items()):
        bubbles.append({
            "stage": stage,
            "type": typ,
            "count": len(vals),
            "count_per_iteration": len(vals) / n_iters,
            "total_s": float(np.sum(vals)) / n_iters,
            "min_s": float(np.min(vals)),
            "p10_s": float(np.percentile(vals, 10)),
            "median_s": float(np.median(vals)),
            "free_memory_bytes": int(statistics.median(free[stage])),
        })
    return {
        "bubble_fraction_per_stage": per_stage,
        "bubble_fraction_measured": float(np.mean(counted)) if counted else 0.0,
        "iteration_time_s": float(np.median(iter_times)) if iter_times else 0.0,
        "iteration_times_s": iter_times,
        "iteration_harvest": iter_harvest,  # per measured iteration: harvesting on/off (paired runs), else None
        "iteration_windows": iter_windows,  # per measured iteration: [start, end] on the host's monotonic clock
        "iteration_idle_s": [iter_idle[k] for k in sorted(iter_idle)],  # per measured iteration: idle summed over stages
        "bubbles": bubbles,
        "gaps": all_gaps,
    }
