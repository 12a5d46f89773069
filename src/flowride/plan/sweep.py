"""Configurations of one job ranked: ``pp=4,8,16 microbatches=8,16,32 schedule=1f1b,zbv``.

Every combination of the swept keys is planned (one shared collective cache, so a group priced
for one point is not priced again); a combination the job's rules refuse (pp that does not
divide the layers, a schedule without enough micro-batches) or whose peak memory does not fit
the GPU is listed as skipped with its reason. Points are ranked by throughput (tokens per
second) and by throughput plus the harvested work's value, counted as FreeRide's savings (the
value term: harvested dedicated-device seconds over the job's cost) added to 1.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from flowride.errors import InputError
from flowride.plan.comm import Pricer
from flowride.plan.job import Job, sweep_keys, with_overrides
from flowride.plan.memory import check_memory
from flowride.plan.price import Plan, plan_job
from flowride.synth.result import Progress

MAX_POINTS = 4096


def parse_sweep(items: list[str]) -> dict[str, list[Any]]:
    """``["pp=4,8", "schedule=1f1b,zbv"]`` (parallel and hardware keys, and ``recompute``) -> ``{"pp": [4, 8], "schedule": ["1f1b", "zbv"]}``;
    numbers become ints or floats, ``true``/``false`` booleans."""
    out: dict[str, list[Any]] = {}
    known = sweep_keys()
    for item in items:
        key, sep, vals = item.partition("=")
        key = key.strip()
        if not sep or not key or not vals.strip():
            raise InputError("--sweep", f"{item!r} is not KEY=V1,V2,...", "write e.g. pp=4,8,16 microbatches=8,16")
        if key not in known:
            raise InputError("--sweep", f"{key!r} is not a parallel or hardware key", f"sweep one of {', '.join(known)}")
        if key in out:
            raise InputError("--sweep", f"{key} is given twice", "give each key once with all its values")
        out[key] = [_value(v.strip()) for v in vals.split(",") if v.strip()]
    n = 1
    for v in out.values():
        n *= len(v)
    if n > MAX_POINTS:
        raise InputError("--sweep", f"{n:,} combinations, over the limit of {MAX_POINTS:,}", "sweep fewer values")
    return out


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


@dataclass
class Point:
    overrides: dict[str, Any]
    plan: Plan | None
    skipped: str | None = None

    def row(self) -> dict:
        if self.plan is None:
            return {"overrides": self.overrides, "skipped": self.skipped}
        r = self.plan.report()
        value = r["harvest"]["cost"]["value_term"]
        return {"overrides": self.overrides, "iteration_s": r["iteration_s"], "tokens_per_s": r["tokens_per_s"],
                "bubble_share": r["shares"]["bubbles"], "harvest_value": value,
                "tokens_per_s_with_harvest": r["tokens_per_s"] * (1.0 + value), "synthesis_saves_share": r["synthesis_saves_share"]}


def sweep(job: Job, axes: dict[str, list[Any]], pricer: Pricer, progress: Progress | None = None) -> list[Point]:
    """Every combination of ``axes`` applied to ``job``, planned; best throughput first."""
    keys = list(axes)
    points = []
    combos = list(itertools.product(*(axes[k] for k in keys)))
    for i, combo in enumerate(combos):
        over = dict(zip(keys, combo, strict=True))
        if progress:
            progress({"stage": "sweep", "i": i + 1, "of": len(combos), "point": over})
        try:
            j = with_overrides(job, over)
            check_memory(j)
        except InputError as e:
            points.append(Point(over, None, f"{e.field}: {e.problem}"))
            continue
        points.append(Point(over, plan_job(j, pricer, progress)))
    return sorted(points, key=lambda p: (p.plan is None, -(p.plan.report()["tokens_per_s"] if p.plan else 0.0)))


def ranked_by_value(points: list[Point]) -> list[Point]:
    """The same points, best throughput-plus-harvested-value first."""
    done = [p for p in points if p.plan is not None]
    return sorted(done, key=lambda p: -p.row()["tokens_per_s_with_harvest"])
