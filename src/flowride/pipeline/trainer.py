"""Pipeline-parallel training end to end: validate, spawn the stages, analyse their bubbles.

``train`` returns the report contract (see README): schedule, stages, microbatches,
iteration_time_s (median after warm-up), losses, bubble_fraction_measured (mean over stages),
bubble_fraction_theory, bubbles per stage and type, and each rank's clock offset to rank 0.

Two ways to a result, one assembly (:func:`assemble`): :func:`train` spawns the stages on this
machine and reads their ``rank{r}.json``; :func:`train_as_rank` runs in a process torchrun
started (one node or several) and gets every rank's record over torch.distributed on rank 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowride.errors import InputError
from flowride.files import read_json
from flowride.pipeline.bubbles import Gap, analyse, iteration_gaps
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.launch import TrainingFailed, launch
from flowride.pipeline.reporter import PROFILE_SCHEMA
from flowride.pipeline.schedules import theoretical_bubble_fraction
from flowride.ranks import leave_process_group


@dataclass
class TrainResult:
    config: TrainConfig
    ranks: list[dict]
    analysis: dict

    @property
    def gaps(self) -> list[Gap]:
        return self.analysis["gaps"]

    def report(self) -> dict:
        cfg = self.config
        last = (self.ranks[cfg.rehearse_stage] if cfg.rehearse_stage is not None  # the real stage's loss
                else max(self.ranks, key=lambda r: max(r["chunks"])))
        losses = [it["loss"] for it in last["iterations"]]
        a = self.analysis
        return {
            "engine": cfg.engine,
            "schedule": cfg.schedule,
            "stages": cfg.stages,
            "microbatches": cfg.microbatches,
            "chunks": cfg.chunks,
            "model": cfg.model,
            "iters": cfg.iters,
            "device": self.ranks[0]["device"],
            "iteration_time_s": a["iteration_time_s"],
            "iteration_times_s": a["iteration_times_s"],
            "losses": losses,
            "bubble_fraction_measured": a["bubble_fraction_measured"],
            "bubble_fraction_per_stage": a["bubble_fraction_per_stage"],
            "bubble_fraction_theory": self.theory(),
            "bubbles": a["bubbles"],
            "bubble_seconds_total": self.bubble_seconds(),
            # the training's span on this host's monotonic clock (to tell side work done during it)
            "window_monotonic": [min(r["iterations"][0]["start"] for r in self.ranks),
                                 max(r["iterations"][-1]["end"] for r in self.ranks)],
            "events": {f"stage{r['rank']}": r["published"] for r in self.ranks},
            "bubble_prediction_error": self.prediction_error(),
            "bubble_prediction_error_by_type": self.prediction_error_by_type(),
            "iteration_harvest": a["iteration_harvest"],
            "iteration_windows": a["iteration_windows"],
            "iteration_idle_s": a["iteration_idle_s"],
            # every timestamp above is on rank 0's clock: each rank's offset and its bound
            "rehearsal": (None if cfg.rehearse_stage is None else
                          _rehearsal_report(cfg, self.ranks, a["bubbles"], min(cfg.warmup_iters, max(0, cfg.iters - 1)))),
            "clock_offsets": [{"rank": r["rank"], "host": r.get("host"), **{k: r["clock"][k] for k in ("offset_s", "error_s", "rtt_s")}}
                              for r in self.ranks if "clock" in r],
        }

    def theory(self) -> float:
        """The schedule's bubble fraction with unit costs (F = 1, full B = 2)."""
        cfg = self.config
        if cfg.engine == "builtin":
            return theoretical_bubble_fraction(cfg.schedule, cfg.stages, cfg.microbatches, cfg.chunks)
        from flowride.pipeline.torch_compat import dry_schedule
        from flowride.pipeline.torch_plan import UNIT_COST, plan

        plans = plan(dry_schedule(cfg.schedule, cfg.stages, cfg.microbatches, cfg.chunks), iterations=1)
        busy = {r: sum(UNIT_COST[a.kind] for a in rp.actions) for r, rp in plans.items()}
        span = max(busy[r] + sum(rp.implied) for r, rp in plans.items())
        return float(np.mean([1.0 - busy[r] / span for r in plans])) if span > 0 else 0.0

    def _prediction_errors(self) -> list[tuple[str, float]]:
        """(bubble type, |predicted - measured| / measured) of every announced bubble of the run."""
        return [(w["type"], abs(w["predicted_s"] - (w["end"] - w["start"])) / (w["end"] - w["start"]))
                for r in self.ranks for w in r.get("waits", [])
                if w["announced"] and w["predicted_s"] is not None and w["end"] > w["start"]]

    def prediction_error(self) -> float | None:
        """Median |predicted - measured| / measured over every announced bubble of the run."""
        errs = [e for _, e in self._prediction_errors()]
        return float(np.median(errs)) if errs else None

    def prediction_error_by_type(self) -> dict[str, dict]:
        """Per bubble type: how many announced bubbles, the median and 90th-percentile error."""
        by: dict[str, list[float]] = {}
        for typ, e in self._prediction_errors():
            by.setdefault(typ, []).append(e)
        return {t: {"bubbles": len(v), "median": float(np.median(v)), "p90": float(np.percentile(v, 90))}
                for t, v in sorted(by.items())}

    def bubble_seconds(self) -> float:
        """Idle seconds summed over stages and every iteration of the run."""
        total = 0.0
        for rr in self.ranks:
            if self.config.rehearse_stage is not None and rr["rank"] != self.config.rehearse_stage:
                continue  # a stand-in's idle is nobody's to harvest
            for it in rr["iterations"]:
                _, busy, span = iteration_gaps(rr, it)
                total += max(0.0, span - busy)
        return total

    def profile(self) -> dict:
        """A bubble profile: each stage's learned wait lengths (what a later run of the same
        configuration starts its predictions from) and, for people, the per-type summary."""
        cfg = self.config
        return {
            "schema": PROFILE_SCHEMA,
            "engine": cfg.engine, "schedule": cfg.schedule, "stages": cfg.stages, "microbatches": cfg.microbatches,
            "chunks": cfg.chunks, "model": cfg.model, "device": self.ranks[0]["device"],
            "lengths": [{"stage": r["rank"], "lengths": r.get("lengths", {})} for r in sorted(self.ranks, key=lambda r: r["rank"])],
            "bubbles": [b for b in self.analysis["bubbles"] if b["type"] != "S"],
        }


def check_profile(cfg: TrainConfig) -> None:
    """A profile made for another (schedule, stages, microbatches) would predict wrong bubbles."""
    if not cfg.profile:
        return
    p = Path(cfg.profile)
    prof = read_json(p, "--bubble-profile", "make one with flowride profile-bubbles")
    if not isinstance(prof, dict) or prof.get("schema") != PROFILE_SCHEMA:
        raise InputError("--bubble-profile", f"{p} is not a bubble profile of this flowride ({PROFILE_SCHEMA})",
                         "make one with flowride profile-bubbles")
    for key in ("engine", "schedule", "stages", "microbatches", "chunks"):
        if prof.get(key) != getattr(cfg, key):
            raise InputError("--bubble-profile", f"profiled with {key}={prof.get(key)}, run has {getattr(cfg, key)}", "profile this configuration")


def assemble(cfg: TrainConfig, ranks: list[dict]) -> TrainResult:
    """The result of a run from its ranks' records, however they arrived (rank files read by the
    launcher, or gathered over torch.distributed): every timestamp already on rank 0's clock."""
    ranks = sorted(ranks, key=lambda r: r["rank"])
    real = None if cfg.rehearse_stage is None else {cfg.rehearse_stage}
    return TrainResult(cfg, ranks, analyse(ranks, min(cfg.warmup_iters, max(0, cfg.iters - 1)), real))


def train(cfg: TrainConfig, on_progress: Callable[[dict], None] | None = None, **launch_kw) -> TrainResult:
    """Spawn the stages on this machine (:func:`flowride.pipeline.launch.launch`) and assemble."""
    cfg.validate()
    check_profile(cfg)
    return assemble(cfg, launch(cfg, on_progress, **launch_kw))


def train_as_rank(cfg: TrainConfig, on_iteration: Callable[[dict], None] | None = None) -> TrainResult | None:
    """This process as stage RANK of a run torchrun (or another launcher) started: RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment, WORLD_SIZE must equal
    ``cfg.stages``. Returns the result on rank 0 and None on the others. ``cfg.run_dir`` is
    this node's own (its ranks write their records and logs there; nothing reads another
    node's). A failing rank raises :class:`TrainingFailed` naming itself (its peers fail too,
    their sends and receives broken)."""
    from flowride.pipeline.worker import run_rank

    cfg.validate()
    check_profile(cfg)
    rank = int(os.environ.get("RANK", "0"))
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    try:
        records = run_rank(cfg, on_iteration)
    except InputError:
        leave_process_group()
        raise
    except Exception as e:
        leave_process_group()
        raise TrainingFailed(rank, f"rank {rank} of {os.environ.get('WORLD_SIZE', '?')}: {type(e).__name__}: {e}") from None
    return None if records is None else assemble(cfg, records)


def _rehearsal_report(cfg: TrainConfig, ranks: list[dict], bubbles: list[dict], warmup: int) -> dict:
    """:func:`flowride.pipeline.rehearsal.rehearsal_report`, imported here: it brings torch, which
    the launcher needs for nothing else (a refused command or a plain run starts without it)."""
    from flowride.pipeline.rehearsal import rehearsal_report

    return rehearsal_report(cfg, ranks, bubbles, warmup)
