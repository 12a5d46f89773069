"""Pipeline-parallel training end to end: validate, spawn the stages, analyse their bubbles.

``train`` returns the report contract (see README): schedule, stages, microbatches,
iteration_time_s (median after warm-up), losses, bubble_fraction_measured (mean over stages),
bubble_fraction_theory and bubbles per stage and type.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flowride.errors import InputError
from flowride.pipeline.bubbles import PROFILE_SCHEMA, Gap, analyse, iteration_gaps
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.launch import launch
from flowride.pipeline.schedules import theoretical_bubble_fraction


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
        last = max(self.ranks, key=lambda r: max(r["chunks"]))
        losses = [it["loss"] for it in last["iterations"]]
        a = self.analysis
        return {
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
            "bubble_fraction_theory": theoretical_bubble_fraction(cfg.schedule, cfg.stages, cfg.microbatches, cfg.chunks),
            "bubbles": a["bubbles"],
            "bubble_seconds_total": self.bubble_seconds(),
            # the training's span on this host's monotonic clock (to tell side work done during it)
            "window_monotonic": [min(r["iterations"][0]["start"] for r in self.ranks),
                                 max(r["iterations"][-1]["end"] for r in self.ranks)],
            "events": {f"stage{r['rank']}": r["published"] for r in self.ranks},
        }

    def bubble_seconds(self) -> float:
        """Idle seconds summed over stages and every iteration of the run."""
        total = 0.0
        for rr in self.ranks:
            for it in rr["iterations"]:
                _, busy, span = iteration_gaps(rr, it)
                total += max(0.0, span - busy)
        return total

    def profile(self) -> dict:
        cfg = self.config
        return {
            "schema": PROFILE_SCHEMA,
            "schedule": cfg.schedule, "stages": cfg.stages, "microbatches": cfg.microbatches,
            "chunks": cfg.chunks, "model": cfg.model, "device": self.ranks[0]["device"],
            "bubbles": [b for b in self.analysis["bubbles"] if b["type"] != "S"],
        }


def check_profile(cfg: TrainConfig) -> None:
    """A profile made for another (schedule, stages, microbatches) would predict wrong bubbles."""
    if not cfg.profile:
        return
    p = Path(cfg.profile)
    try:
        prof = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError("--bubble-profile", f"cannot read {p}: {e}", "make one with flowride profile-bubbles") from None
    if prof.get("schema") != PROFILE_SCHEMA:
        raise InputError("--bubble-profile", f"{p} is not a bubble profile", "make one with flowride profile-bubbles")
    for key in ("schedule", "stages", "microbatches", "chunks"):
        if prof.get(key) != getattr(cfg, key):
            raise InputError("--bubble-profile", f"profiled with {key}={prof.get(key)}, run has {getattr(cfg, key)}", "profile this configuration")


def train(cfg: TrainConfig, on_progress: Callable[[dict], None] | None = None, **launch_kw) -> TrainResult:
    cfg.validate()
    check_profile(cfg)
    ranks = launch(cfg, on_progress, **launch_kw)
    return TrainResult(cfg, ranks, analyse(ranks, min(cfg.warmup_iters, max(0, cfg.iters - 1))))
