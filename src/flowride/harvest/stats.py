"""Overhead you can trust: paired on/off statistics with bootstrap confidence intervals.

On a shared machine the iteration time of two separate runs differs by more than the effect we
measure (the earlier table moved by -15% to +28%). A paired run instead alternates harvesting on
and off in blocks of iterations inside one training run (:func:`flowride.pipeline.config.onoff_blocks`),
each pair of adjacent blocks in a random order; both arms then share the machine's drift, and
each pair gives one overhead figure, ``mean(on) / mean(off) - 1``. We report the median of those
figures with a percentile-bootstrap 95% interval (resampling pairs), and, for comparison, the
pooled unpaired figure ``median(on) / median(off) - 1`` with its own bootstrap interval
(resampling iterations), which ignores the pairing.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np


def pairs(times: Sequence[float], harvest: Sequence[bool | None], block: int) -> list[tuple[list[float], list[float]]]:
    """(on times, off times) of each pair of adjacent blocks, in the order the run made them.

    ``times`` and ``harvest`` are per measured iteration (warm-up left out), as the train report
    gives them; a chunk of ``2 * block`` iterations is a pair when it holds ``block`` of each arm.
    """
    if block < 1:
        raise ValueError("block must be at least 1")
    if len(times) != len(harvest):
        raise ValueError("times and harvest flags differ in length")
    out = []
    for k in range(0, len(times) - 2 * block + 1, 2 * block):
        flags = list(harvest[k : k + 2 * block])
        on = [t for t, f in zip(times[k : k + 2 * block], flags, strict=True) if f is True]
        off = [t for t, f in zip(times[k : k + 2 * block], flags, strict=True) if f is False]
        if len(on) == block and len(off) == block:
            out.append((on, off))
    return out


def aa_pairs(times: Sequence[float], harvest: Sequence[bool | None], block: int) -> list[tuple[list[float], list[float]]]:
    """(first block, second block) of each A/A pair: a chunk of ``2 * block`` iterations that ran
    training alone in both blocks (:func:`flowride.pipeline.config.onoff_blocks` plans them)."""
    out = []
    for k in range(0, len(times) - 2 * block + 1, 2 * block):
        if all(f is False for f in harvest[k : k + 2 * block]):
            out.append((list(times[k : k + block]), list(times[k + block : k + 2 * block])))
    return out


def noise_floor(times: Sequence[float], harvest: Sequence[bool | None], block: int,
                resamples: int = 10_000, seed: int = 0) -> dict | None:
    """What the paired measurement reads when nothing differs: the A/A pairs' "overhead" in
    percent (median, bootstrap 95% interval, spread), or None when the run has none."""
    ps = aa_pairs(times, harvest, block)
    if not ps:
        return None
    per = np.array([np.mean(a) / np.mean(b) - 1.0 for a, b in ps]) * 100.0
    out: dict = {"pairs": len(ps), "median_pct": float(np.median(per)), "per_pair_pct": [float(x) for x in per],
                 "sd_pct": float(np.std(per, ddof=1)) if len(per) > 1 else None, "ci95_pct": None}
    if len(per) > 1:
        rng = np.random.default_rng(seed)
        out["ci95_pct"] = list(_percentile_ci(np.median(per[rng.integers(0, len(per), size=(resamples, len(per)))], axis=1)))
    return out


def _percentile_ci(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    lo, hi = np.percentile(samples, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def paired_overhead(times: Sequence[float], harvest: Sequence[bool | None], block: int,
                    resamples: int = 10_000, seed: int = 0) -> dict:
    """Overhead of harvesting in percent from one paired run.

    Returns ``median_pct`` (median over pairs), ``ci95_pct`` (bootstrap over pairs),
    ``mean_pct``, ``pairs``, ``per_pair_pct``, and the pooled ``unpaired_pct`` with
    ``unpaired_ci95_pct`` (bootstrap over iterations). Raises ValueError with fewer than 2 pairs.
    """
    ps = pairs(times, harvest, block)
    if len(ps) < 2:
        raise ValueError(f"a paired overhead needs at least 2 pairs of blocks, got {len(ps)}")
    rng = np.random.default_rng(seed)
    per = np.array([np.mean(on) / np.mean(off) - 1.0 for on, off in ps]) * 100.0
    boot = np.median(per[rng.integers(0, len(per), size=(resamples, len(per)))], axis=1)
    on_all = np.array([t for on, _ in ps for t in on])
    off_all = np.array([t for _, off in ps for t in off])
    b_on = np.median(on_all[rng.integers(0, len(on_all), size=(resamples, len(on_all)))], axis=1)
    b_off = np.median(off_all[rng.integers(0, len(off_all), size=(resamples, len(off_all)))], axis=1)
    return {
        "pairs": len(ps),
        "block": block,
        "median_pct": float(np.median(per)),
        "ci95_pct": list(_percentile_ci(boot)),
        "mean_pct": float(np.mean(per)),
        "per_pair_pct": [float(x) for x in per],
        "unpaired_pct": float((np.median(on_all) / np.median(off_all) - 1.0) * 100.0),
        "unpaired_ci95_pct": list(_percentile_ci((b_on / b_off - 1.0) * 100.0)),
        "sd_pct": float(np.std(per, ddof=1)),
        "noise_floor": noise_floor(times, harvest, block, resamples, seed),
    }


def overrun_by_type(steps: list[dict]) -> dict[str, dict]:
    """Per bubble type, of the side steps run in it: how many, how many ended after the bubble's
    predicted end, and by how much (median, 90th percentile, largest, in seconds). On a GPU a
    step ends when its kernels have (the host synchronises), so this is how late the device was
    freed for the next compute action."""
    by: dict[str, list[dict]] = {}
    for st in steps:
        by.setdefault(str(st.get("type") or "?"), []).append(st)
    out = {}
    for typ, sts in sorted(by.items()):
        late = [float(st["overrun_s"]) for st in sts if (st.get("overrun_s") or 0) > 0]
        out[typ] = {"steps": len(sts), "overruns": len(late),
                    "median_s": statistics.median(late) if late else 0.0,
                    "p90_s": float(np.percentile(late, 90)) if late else 0.0, "max_s": max(late, default=0.0)}
        gpu = [float(st["gpu_overrun_s"]) for st in sts if st.get("gpu_overrun_s") is not None]
        if gpu:  # the host can learn late that its kernels are done (a starved core): the device's own view
            gl = [v for v in gpu if v > 0]
            out[typ].update({"gpu_overruns": len(gl), "gpu_median_s": statistics.median(gl) if gl else 0.0,
                             "gpu_max_s": max(gl, default=0.0)})
    return out


def gpu_step_medians(steps: list[dict]) -> dict[str, float]:
    """Median device time of a step (CUDA events) per side task, where its steps ran on a GPU."""
    by: dict[str, list[float]] = {}
    for st in steps:
        if st.get("gpu_s") is not None:
            by.setdefault(str(st["name"]), []).append(float(st["gpu_s"]))
    return {k: statistics.median(v) for k, v in sorted(by.items())}
