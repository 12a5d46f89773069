"""Fitting a :class:`Calibration` to measured collectives, and judging a calibration on them.

A measurement is (cluster, collective, size, time, the algorithm NCCL was forced to, if any);
the fit chooses the named fields of the calibration that bring NCCL's model closest to the
measurements in relative terms: least squares on log(predicted / measured), so a 20% miss at
1 KiB counts as much as one at 1 GiB. The model is a minimum over algorithms and protocols, so
the loss has kinks: the fit starts from a few points and keeps the best."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.runtime.measured import Curve
from flowride.runtime.nccl_tuning import IDENTITY, ONE_PER_THREAD, Calibration, Launch, Machine
from flowride.runtime.predict import choose, machine_for

# each field's range: wide enough for any machine seen, narrow enough to stay physical
BOUNDS: dict[str, tuple[float, float]] = {
    "floor_us": (0.0, 300.0), "floor_net_us": (0.0, 400.0), "lat_intra": (0.1, 8.0), "lat_net": (0.1, 60.0),
    # at most the datasheet: NCCL counts 20-20.6 GB/s of a 25 GB/s NVLink (x 1.2 reaches 24-24.7), a NIC at line rate
    "bw_intra": (0.2, 1.2), "bw_net": (0.2, 1.0), "nvls_eff": (0.2, 1.0), "ramp_MiB": (0.0, 64.0), "launch_us": (0.0, 20.0),
    "lat_nvls": (0.1, 8.0), "ramp_net_MiB": (0.0, 256.0), "tree_net": (0.5, 2.0)}
# what happens inside a node (fitted on one-node runs), most telling first
INTRA_FIELDS = ("floor_us", "bw_intra", "ramp_MiB", "lat_intra", "launch_us", "nvls_eff", "lat_nvls")
NVLS_FIELDS = ("nvls_eff", "lat_nvls")
# what crossing nodes adds (fitted on runs across nodes, the node's fields held)
NET_FIELDS = ("floor_net_us", "bw_net", "ramp_net_MiB", "lat_net", "tree_net")
MIB = 1 << 20


@dataclass(frozen=True)
class Observed:
    """One measured time: ``label`` says where it came from (a curve id, a log line)."""

    label: str
    machine: Machine
    collective: Collective
    bytes: int
    time_us: float
    algorithm: str | None = None  # NCCL_ALGO forced on the run
    launch: Launch = ONE_PER_THREAD
    known: str | None = None  # the algorithm NCCL took there, where a source says (the fit makes it NCCL's choice)


@dataclass(frozen=True)
class Judged:
    label: str
    bytes: int
    measured_us: float
    predicted_us: float
    algorithm: str
    protocol: str

    @property
    def ratio(self) -> float:
        return self.predicted_us / self.measured_us


def observed(curves: list[Curve]) -> list[Observed]:
    """The usable points of published curves (:meth:`Curve.usable`) as observations on their machines."""
    out = []
    for c in curves:
        m = machine_for(c.node_type, c.nodes, c.nics, c.nic_Gbps)
        launch = Launch(c.gpus_per_thread, c.cuda_graph)
        out += [Observed(c.id, m, Collective.parse(c.collective), p.bytes, p.time_us, c.forced_algorithm, launch, p.nccl_algorithm)
                for p in c.usable()]
    return out


def judge(cal: Calibration, points: list[Observed]) -> list[Judged]:
    """Each measurement beside what ``cal`` predicts for it."""
    out = []
    for p in points:
        e = choose(p.collective, p.machine, p.bytes, cal, p.algorithm, p.launch)
        out.append(Judged(p.label, p.bytes, p.time_us, e.time_us, e.algorithm, e.protocol))
    return out


def summary(judged: list[Judged], split: int = MIB) -> dict:
    """Median |ratio - 1| at and above ``split`` bytes and below it, and the worst ratio either way."""
    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    big = [abs(j.ratio - 1) for j in judged if j.bytes >= split]
    small = [abs(j.ratio - 1) for j in judged if j.bytes < split]
    worst = max(judged, key=lambda j: abs(math.log(j.ratio)), default=None)
    return {"points": len(judged), "median_err_ge_1MiB": med(big), "median_err_lt_1MiB": med(small),
            "worst_ratio": None if worst is None else worst.ratio,
            "worst_at": None if worst is None else f"{worst.label} {worst.bytes} B"}


def fit(points: list[Observed], names: tuple[str, ...], start: Calibration = IDENTITY) -> Calibration:
    """The calibration whose fields ``names`` (the rest as in ``start``) bring the model closest to
    ``points`` (least squares on log ratios, from several starting points)."""
    if not points:
        raise InputError("measurements", "nothing to fit", "give at least one measured time")
    bad = [n for n in names if n not in BOUNDS]
    if bad:
        raise InputError("fields", f"cannot fit {bad}", f"fields are {', '.join(BOUNDS)}")
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    meas = np.array([math.log(p.time_us) for p in points])

    def make(x: np.ndarray) -> Calibration:
        return replace(start, **{n: float(v) for n, v in zip(names, x, strict=True)})

    def resid(x: np.ndarray) -> np.ndarray:
        cal = make(x)
        pred, wrong = [], []
        for p in points:
            best = choose(p.collective, p.machine, p.bytes, cal, p.algorithm, p.launch).time_us
            if p.known is None or p.algorithm is not None:
                pred.append(best)
                continue
            t = choose(p.collective, p.machine, p.bytes, cal, p.known, p.launch).time_us
            pred.append(t)  # judged as the algorithm NCCL took, and that algorithm made NCCL's choice:
            wrong.append(math.log(t / best))  # > 0 while another one is modelled faster
        return np.concatenate([np.log(np.array(pred)) - meas, np.array(wrong)])

    x0 = np.array([_value(start, n) for n in names])
    best, best_cost = x0, float(np.sum(resid(x0) ** 2))
    for t in (0.0, 0.25, 0.5):
        guess = np.clip(x0 * (1 - t) + t * (lo + hi) / 2, lo, hi)
        r = least_squares(resid, guess, bounds=(lo, hi), diff_step=1e-3, max_nfev=400)
        if r.cost * 2 < best_cost:
            best, best_cost = r.x, float(r.cost * 2)
    return make(best)


def _value(cal: Calibration, name: str) -> float:
    v = getattr(cal, name)
    if v is None:  # nvls_eff: NCCL's own figure until fitted
        return 0.85
    lo, hi = BOUNDS[name]
    return min(max(float(v), lo), hi)
