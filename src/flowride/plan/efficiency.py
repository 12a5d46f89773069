"""How fast a GPU runs an operation of a given size: the efficiency description the planner prices
compute with (``hardware.efficiency``), its built-in values per GPU type, and ``--calibrate``.

A layer is priced op by op (:func:`flowride.plan.costs.layer_ops`): each linear layer's GEMM
(QKV, output projection, MLP up or gate+up, MLP down; the logits on the last chunk) at
``peak * gemm(x)``, the attention core's batched GEMMs (scores and weighted sum, ``4bs^2h``) at
``peak * attention(x)``, ``x`` the operation's GFLOPs on one GPU, and the memory-bound work
between them (layer norms, bias-dropout-add, the MLP's activation, the softmax and dropout of the
scores when FlashAttention is off) as bytes over ``hbm_share x`` the HBM bandwidth. Both curves
saturate: ``e(x) = e_max * x / (x + x_half)``, rising with the operation's size, ``e_max/2`` at
``x_half`` GFLOPs and bounded by ``e_max`` (the shape of Calculon's efficiency tables, Isaev et
al., SC'23, which step on the same axis: an operation's GFLOPs).

A job gets the GPU type's description below unless it says otherwise: ``hardware.efficiency``
gives parameters over it (or all of them for a GPU type with none), ``hardware.mfu`` asks for one
flat share of peak for every operation. A GPU type without a description is priced flat at 0.4
unless the job gives one. Every report states the description it used.

``--calibrate`` (:func:`flowride.plan.costs.calibrate`) fits ``gemm_max`` and ``gemm_half_gflop``
(and the attention pair, and ``hbm_share``, where measured) by least squares on log time to
measured operations: a JSON of
``{"ops": [{"kind": "gemm" | "attention", "flops": F | "m","n","k" | "batch","m","n","k",
"seconds": t}, {"kind": "memory", "bytes": B, "seconds": t}]}``, or a ``flowride train`` run
whose per-stage times are matched by one factor on both ``e_max`` (a run measures whole stages,
not the curve's shape).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import Field

from flowride.errors import InputError
from flowride.schema import Strict

DEFAULT_MFU = 0.4  # the flat share of peak of a job that gives neither mfu nor efficiency (the earlier default)


class Efficiency(Strict):
    """``hardware.efficiency``: the curves' parameters; those left out come from the GPU type's built-in."""

    source: str | None = Field(default=None, max_length=400)
    gemm_max: float | None = Field(default=None, gt=0, le=1)  # e_max of the linear layers' GEMMs
    gemm_half_gflop: float | None = Field(default=None, ge=0, le=1e6)  # GFLOPs of a GEMM at half of gemm_max
    attention_max: float | None = Field(default=None, gt=0, le=1)  # e_max of the attention core (scores + weighted sum)
    attention_half_gflop: float | None = Field(default=None, ge=0, le=1e6)
    hbm_share: float | None = Field(default=None, gt=0, le=1)  # share of HBM bandwidth memory-bound kernels reach


@dataclass(frozen=True)
class Curve:
    """A resolved efficiency description (every parameter set)."""

    source: str
    gemm_max: float
    gemm_half_gflop: float
    attention_max: float
    attention_half_gflop: float
    hbm_share: float

    def gemm(self, flops: float) -> float:
        """Share of peak a GEMM of ``flops`` FLOPs (on one GPU) sustains."""
        return saturating(flops / 1e9, self.gemm_max, self.gemm_half_gflop)

    def attention(self, flops: float) -> float:
        """Share of peak the attention core's batched GEMMs of ``flops`` FLOPs sustain."""
        return saturating(flops / 1e9, self.attention_max, self.attention_half_gflop)

    def describe(self) -> str:
        return (f"efficiency per operation ({self.source}): GEMMs {self.gemm_max:.3g} x/(x + {self.gemm_half_gflop:.3g}), "
                f"attention core {self.attention_max:.3g} x/(x + {self.attention_half_gflop:.3g}), x the op's GFLOPs on one "
                f"GPU; memory-bound kernels at {self.hbm_share:.3g} of HBM bandwidth")

    def as_dict(self) -> dict[str, Any]:
        return {"model": "curve", **asdict(self)}


def saturating(x: float, e_max: float, x_half: float) -> float:
    """``e_max * x / (x + x_half)``: 0 at 0, ``e_max/2`` at ``x_half``, rising to ``e_max``."""
    if x <= 0:
        return 0.0
    return e_max * x / (x + x_half)


# Built-in descriptions per node type's GPU (hardware.efficiency "builtin"):
# A100 SXM 80GB: fitted to Korthikanti et al. 2022 (arXiv 2205.05198) Table 5, the eight Megatron-LM iterations on
# DGX A100 (22B, 175B, 530B, 1T; full recompute, and sequence parallel + selective recompute), by least squares on
# log time through this planner (benchmarks/plan_validation.py --published --refit; the curve's form is Calculon's
# axis, an operation's GFLOPs: Isaev et al., SC'23, calculon-ai/calculon systems/a100_80g.json); memory-bound
# kernels at 0.9 of HBM, Calculon's "mem1" efficiency above 100 MB. The half-point (31 GFLOP; 43 before the collectives were priced by the calibrated model) is an effective one:
# isolated cuBLAS GEMMs saturate far sooner (Calculon's table: 0.9 at 16 GFLOP), and it matches wave quantization
# at these shapes (one wave of 256 x 128 tiles on 108 SMs at K = 12,288 is ~87 GFLOP); GEMMs under ~10 GFLOP per
# GPU come out too slow (give hardware.efficiency, or --calibrate).
_A100 = Curve("fitted to Korthikanti et al. 2022 Table 5 (8 Megatron-LM iterations on A100 80GB); curve on GEMM GFLOPs "
              "as Calculon's a100_80g.json, HBM share its mem1 0.9", 0.769, 31.1, 0.769, 31.1, 0.9)
# H100 SXM 80GB (and an H200 given as dgx-h100 with hbm_tbps 4.8): issue #34's measurement, on one H200 a GPT layer
# at h = 4096-12288, seq 2048-4096, bf16, forward + backward at 0.61-0.67 of 989 TFLOP/s (one run each, CUDA events,
# after warm-up). With Calculon's shape (h100_80g_nvl8.json repeats the A100 table: x_half ~0.6 GFLOP) and the layer
# taken with FlashAttention (without it this model spreads those layers over 0.50-0.72, wider than the band),
# e_max 0.66 puts the six layers at 0.63-0.65.
# The attention core: FlashAttention-3's published H100 SXM5 benchmark (Shah et al. 2024, arXiv 2407.08608, Figures 5
# and 6; BF16, head dim 128, no mask, seq 1k-16k), forward and backward combined as this planner prices them (the
# backward at twice the forward's FLOPs, so the backward's recomputation of the scores sits inside the efficiency):
# benchmarks/data/fa3_h100_attention.json, fitted by --calibrate's least squares (0.40 of peak at seq 1k, 0.51 at 16k).
_H100 = Curve("GEMMs: issue #34's H200 GPT-layer measurement (0.61-0.67 of 989 TFLOP/s at h 4096-12288, seq 2048-4096), "
              "Calculon's curve shape (h100_80g_nvl8.json); attention core: FlashAttention-3's H100 benchmark "
              "(Shah et al. 2024, Figs. 5-6, forward + backward)", 0.687, 0.577, 0.523, 42.4, 0.9)
BUILTIN: dict[str, Curve] = {"dgx-a100": _A100, "a800": _A100, "dgx-h100": _H100, "h800": _H100}
FIELDS = ("gemm_max", "gemm_half_gflop", "attention_max", "attention_half_gflop", "hbm_share")


def resolve(node: str, given: Efficiency | str | None, mfu: float | None) -> Curve | None:
    """The description a job's hardware asks for: None (one flat share of peak) when it gives
    ``hardware.mfu``, or gives neither and its GPU type has no built-in description; the GPU type's
    built-in when it gives neither (the best model flowride has), or "builtin"; parameters go over
    it (or stand alone, all of them, for a GPU type with none). A ValueError names what is missing."""
    if mfu is not None:
        return None
    base = BUILTIN.get(node)
    if given is None:  # the best model flowride has: the GPU type's description where it has one, else flat
        return base
    if isinstance(given, str):
        given = Efficiency()
    fields = {k: getattr(given, k) for k in FIELDS if getattr(given, k) is not None}
    if base is None:
        missing = [k for k in FIELDS if k not in fields]
        if missing:
            raise ValueError(f"{node} has no built-in efficiency description (built-in: {', '.join(BUILTIN)}), and "
                             f"{', '.join(missing)} are not given")
        return Curve(given.source or "job file", **fields)
    source = given.source or (f"{base.source}, with {', '.join(sorted(fields))} from the job file" if fields else base.source)
    return replace(base, source=source, **fields)


def flat_description(mfu: float, peak_tflops: float, default: bool) -> str:
    why = "the default; hardware.efficiency prices op by op" if default else "hardware.mfu"
    return f"one flat share of peak for every operation: {peak_tflops:g} TFLOP/s x {mfu:g} ({why}) = {peak_tflops * mfu:.0f} TFLOP/s"


# --- --calibrate ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One measured operation: ``kind`` gemm / attention (``size`` its FLOPs) or memory (bytes)."""

    kind: str
    size: float
    seconds: float


def _op_from(d: Any, where: str) -> Measured:
    if not isinstance(d, dict):
        raise InputError(where, "is not an object", 'give {"kind": "gemm", "m": .., "n": .., "k": .., "seconds": ..}')
    kind = d.get("kind", "gemm")
    try:
        t = float(d["seconds"])
        if kind == "memory":
            size = float(d["bytes"])
        elif "flops" in d:
            size = float(d["flops"])
        else:
            size = 2.0 * float(d.get("batch", 1)) * float(d["m"]) * float(d["n"]) * float(d["k"])
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(where, f"lacks a number ({e})", "give seconds, and flops or m, n, k (or bytes for a memory op)") from None
    if kind not in ("gemm", "attention", "memory") or not (t > 0 and size > 0 and math.isfinite(t * size)):
        raise InputError(where, f"kind {kind!r}, size {size:g}, seconds {t:g}", "give kind gemm/attention/memory and positive sizes")
    return Measured(kind, size, t)


def read_measured(path: str | Path) -> list[Measured]:
    """The operations of a calibration JSON (see the module)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError("--calibrate", f"cannot read {path} ({e})", "give a flowride train run dir or a JSON of measured ops") from None
    ops = data.get("ops") if isinstance(data, dict) else data
    if not isinstance(ops, list) or not ops:
        raise InputError("--calibrate", f"{path} holds no list of ops", 'give {"ops": [{"kind": "gemm", "flops": .., "seconds": ..}]}')
    return [_op_from(d, f"--calibrate {path}: ops[{i}]") for i, d in enumerate(ops)]


def _fit_pair(xs: Sequence[float], ts: Sequence[float], peak_flops: float, e0: float, h0: float) -> tuple[float, float]:
    """``(e_max, x_half)`` minimising the squared log error of ``t = F / (peak * e(F))`` over the ops,
    that is ``t = (x + x_half) * 1e9 / (peak * e_max)`` with ``x = F`` in GFLOPs."""
    import numpy as np
    from scipy.optimize import least_squares

    x, t = np.asarray(xs, float) / 1e9, np.asarray(ts, float)

    def resid(p):
        e, h = math.exp(p[0]), math.exp(p[1])
        return np.log((x + h) * 1e9 / (peak_flops * e)) - np.log(t)

    if len(x) < 2 or float(x.max()) <= 1.5 * float(x.min()):  # one size: only e_max at the prior half-point
        e = float(np.exp(np.mean(np.log((x + h0) * 1e9 / (peak_flops * t)))))
        return min(e, 1.0), h0
    sol = least_squares(resid, [math.log(e0), math.log(max(h0, 1e-6))], method="lm")
    return float(math.exp(sol.x[0])), float(math.exp(sol.x[1]))


def fit_ops(ops: Sequence[Measured], base: Curve, peak_tflops: float, hbm_tbps: float, source: str) -> Curve:
    """The curve whose parameters best explain ``ops`` (log-time least squares): an unmeasured
    attention core takes the GEMMs' fit; unmeasured GEMMs or bandwidth keep ``base``'s."""
    peak = peak_tflops * 1e12
    fit: dict[str, float] = {}
    for kind in ("gemm", "attention"):
        sel = [o for o in ops if o.kind == kind]
        if sel:
            e, h = _fit_pair([o.size for o in sel], [o.seconds for o in sel], peak, getattr(base, f"{kind}_max"),
                             getattr(base, f"{kind}_half_gflop"))
            fit[f"{kind}_max"], fit[f"{kind}_half_gflop"] = e, h
    if "attention_max" not in fit and "gemm_max" in fit:
        fit["attention_max"], fit["attention_half_gflop"] = fit["gemm_max"], fit["gemm_half_gflop"]
    mem = [o for o in ops if o.kind == "memory"]
    if mem:  # log-mean of achieved bandwidth over HBM's
        fit["hbm_share"] = math.exp(sum(math.log(o.size / o.seconds / (hbm_tbps * 1e12)) for o in mem) / len(mem))
    if not fit:
        raise InputError("--calibrate", "no gemm, attention or memory op measured", "give measured ops")
    return replace(base, source=source, **fit)


def fit_scale(model_seconds: Callable[[Curve], float], measured_s: float, base: Curve, source: str) -> Curve:
    """``base`` with both ``e_max`` scaled by the one factor that makes ``model_seconds`` equal
    ``measured_s`` (bisection on the log; ``hbm_share`` and the half-points kept)."""
    def at(k: float) -> Curve:
        return replace(base, source=source, gemm_max=min(1.0, base.gemm_max * k), attention_max=min(1.0, base.attention_max * k))

    lo, hi = 1e-4, 1.0 / max(base.gemm_max, base.attention_max)
    if model_seconds(at(hi)) > measured_s:
        return at(hi)  # faster than the curve allows at e_max = 1: the cap
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if model_seconds(at(mid)) > measured_s else (lo, mid)
    return at(math.sqrt(lo * hi))


# where no description is given or built in: Calculon's shape, a middling e_max (only a starting point for a fit)
START = Curve("Calculon's curve shape as a starting point", 0.7, 0.577, 0.7, 0.577, 0.9)


def to_efficiency(c: Curve) -> Efficiency:
    """A resolved description as the job file writes it (``hardware.efficiency``)."""
    return Efficiency(source=c.source, **{k: getattr(c, k) for k in FIELDS})


__all__ = ["BUILTIN", "DEFAULT_MFU", "FIELDS", "Curve", "Efficiency", "START", "Measured", "fit_ops", "fit_scale", "flat_description",
           "read_measured", "resolve", "saturating", "to_efficiency"]
