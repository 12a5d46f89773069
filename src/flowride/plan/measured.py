"""A measured per-stage profile from a run of ``flowride train`` (or ``profile-bubbles``), for
plans that start from what a machine really did rather than from FLOPs.

Every rank's record (``run_dir/ranks.json``, gathered by rank 0) lists each compute action with
the time its rank began waiting for it (``start``), began computing (``compute``) and finished
(``end``), on rank 0's clock. A stage's forward is the median compute time of its forwards,
summed over its model chunks; likewise its backward (and weight-gradient pass, where the schedule
has one). A stage-to-stage transfer is the median delay between a forward's input being produced
on the previous stage and its consumer starting to compute, over the forwards that were waiting
for it. Warm-up iterations are left out.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from flowride.errors import InputError
from flowride.pipeline.config import RANKS_FILE

PROFILE_KEYS = ("forward_s", "backward_s", "weight_s", "p2p_s", "optimizer_s", "action_overhead_s", "iteration_overhead_s")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def profile_from_ranks(ranks: list[dict], warmup: int = 1) -> dict[str, Any]:
    """``{"forward_s", "backward_s", "weight_s" (or None), "p2p_s", "optimizer_s"}`` from the
    records of a run's ranks (rank order)."""
    fwd, bwd, wgt, opt = [], [], [], []
    host: list[float] = []  # between one action's end and the next one's start on a rank
    tails: dict[int, float] = {}  # per iteration: the least time any rank spent after its last record
    ends: dict[tuple[int, int, int], float] = {}  # (iteration, mb, chunk) -> end of that forward
    for rank in ranks:
        per: dict[tuple[str, int], list[float]] = {}
        steps = []
        for it in rank["iterations"][warmup:]:
            steps.append(sum(r["end"] - r["start"] for r in it["records"] if r["kind"] == "O"))
            recs = it["records"]
            host.extend(b["start"] - a["end"] for a, b in zip(recs, recs[1:], strict=False) if b["start"] >= a["end"])
            if recs:
                tail = it["end"] - max(r["end"] for r in recs)
                tails[it["iteration"]] = min(tails.get(it["iteration"], tail), tail)
            for rec in it["records"]:
                if rec["kind"] not in ("F", "B", "W", "I"):
                    continue
                per.setdefault((rec["kind"], rec["chunk"]), []).append(rec["end"] - rec["compute"])
                if rec["kind"] == "F":
                    ends[(it["iteration"], rec["mb"], rec["chunk"])] = rec["end"]
        chunks = sorted({c for _, c in per})
        fwd.append(sum(_median(per.get(("F", c), [])) for c in chunks))
        bwd.append(sum(_median(per.get(("B", c), []) + per.get(("I", c), [])) for c in chunks))
        wgt.append(sum(_median(per.get(("W", c), [])) for c in chunks))
        opt.append(_median(steps))
    has_w = any(w > 0 for w in wgt)
    delays = []
    for rank in ranks:
        for it in rank["iterations"][warmup:]:
            for rec in it["records"]:
                if rec["kind"] != "F" or rec["chunk"] == 0:
                    continue
                prev = ends.get((it["iteration"], rec["mb"], rec["chunk"] - 1))
                if prev is not None and rec["start"] < prev < rec["compute"]:
                    delays.append(rec["compute"] - prev)
    return {"forward_s": fwd, "backward_s": [b + w for b, w in zip(bwd, wgt, strict=True)] if has_w else bwd,
            "weight_s": wgt if has_w else None, "p2p_s": _median(delays), "optimizer_s": opt,
            "action_overhead_s": _median(host), "iteration_overhead_s": max(0.0, _median(list(tails.values())))}


def profile_from_run(run_dir: str | Path) -> dict[str, Any]:
    """The profile of the run in ``run_dir`` (its ``ranks.json``) and its training config."""
    f = Path(run_dir) / RANKS_FILE
    if not f.is_file():
        raise InputError("--profile", f"{run_dir} holds no {RANKS_FILE}", "give the --run-dir of a finished flowride train run")
    try:
        data = json.loads(f.read_text())
        prof = profile_from_ranks(data["ranks"], warmup=int(data["config"].get("warmup_iters", 1)))
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise InputError("--profile", f"{f} is not a run record of this flowride ({e})", "train again with flowride train") from None
    return {**prof, "config": data["config"]}
