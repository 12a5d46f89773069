"""The planner against this machine: for CPU pipelines that ``flowride train`` runs, the plan's
iteration time and bubble fraction, from the run's own measured per-stage profile
(:func:`flowride.plan.measured.profile_from_ranks`), next to the measured ones.

Then the planner against the closed forms and published settings (uniform stages, no
communication): GPipe/1F1B (p-1)/(m+p-1), interleaved (p-1)/(vm+p-1), ZB-H1 (p-1)/(3m+p-1), and
FreeRide's p = 4, m = 4/6/8. CPU only.

    python benchmarks/plan_validation.py [--model small] [--stages 4] [--microbatches 8] [--iters 12]

With ``--published``: the published training runs of ``examples/plans/published/`` (Korthikanti et
al. 2022 Table 5, Llama 3 Table 4) planned with ``flowride plan`` (their collectives from the
shipped cache) next to the published figures, each row's error and the mean absolute error; with
``--refit`` also the A100 description re-derived from Table 5 (least squares on log time over the
curve's two parameters), its leave-one-model-out errors, and the 22B layer of Korthikanti Table 4.

    python benchmarks/plan_validation.py --published [--refit]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import train
from flowride.plan import Pricer, job_from_dict, plan_job
from flowride.plan.measured import PROFILE_KEYS, profile_from_ranks

RUNS = [("builtin", "gpipe", 1), ("builtin", "1f1b", 1), ("builtin", "interleaved", 2), ("torch", "gpipe", 1),
        ("torch", "1f1b", 1), ("torch", "interleaved1f1b", 2)]


def job_for(prof: dict, schedule: str, p: int, m: int, v: int) -> dict:
    return {"model": {"layers": p * v, "hidden": 64, "seq_len": 16, **{k: prof[k] for k in PROFILE_KEYS}},
            "parallel": {"pp": p, "virtual": v, "microbatches": m, "schedule": schedule},
            "hardware": {"node": "dgx-h100"}, "synthesis": {"enabled": False}}


def uniform(schedule: str, p: int, m: int, v: int = 1) -> float:
    d = {"model": {"layers": p * v, "hidden": 64, "seq_len": 16, "forward_s": [1.0] * p, "backward_s": [2.0] * p, "p2p_s": 0.0},
         "parallel": {"pp": p, "virtual": v, "microbatches": m, "schedule": schedule},
         "hardware": {"node": "dgx-h100"}, "synthesis": {"enabled": False}}
    return plan_job(job_from_dict(d), Pricer(cache=None, synth=False)).report()["shares"]["bubbles"]


PUBLISHED = Path(__file__).resolve().parents[1] / "examples" / "plans" / "published"
# Korthikanti et al. 2022 Table 4: one 22B layer (tp 8, b 4, s 2048) on A100, forward and backward ms
TABLE4 = [("none", False, 7.7, 11.9), ("none", True, 7.2, 11.8), ("full", False, 7.7, 19.5), ("selective", False, 7.7, 13.2),
          ("selective", True, 7.2, 13.1)]


def published_plans(rows: list[dict], efficiency: dict | None = None, cache: Path | None = None) -> list[float]:
    """Each row's planned figure (iteration seconds, or model TFLOP/s per GPU) through flowride plan's library."""
    from flowride.plan.costs import model_flops_per_token

    pricer = Pricer(cache=cache, synth=False)
    out = []
    for r in rows:
        d = json.loads((PUBLISHED / r["job"]).read_text())
        if efficiency is not None:
            d["hardware"]["efficiency"] = efficiency
        job = job_from_dict(d, r["job"])
        rep = plan_job(job, pricer).report()
        out.append(rep["iteration_s"] if r["metric"] == "iteration_s" else
                   rep["tokens_per_s"] * model_flops_per_token(job) / job.gpus / 1e12)
    return out


def published(refit: bool) -> None:
    idx = json.loads((PUBLISHED / "published.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "c.json"
        shutil.copy(PUBLISHED / "collectives-cache.json", cache)
        t0 = time.perf_counter()
        got = published_plans(idx["rows"], cache=cache)
        took = time.perf_counter() - t0
        print(f"# flowride plan of published runs ({time.strftime('%Y-%m-%d')}, {took:.0f} s for {len(got)} plans)\n")
        print("| row | GPUs | config | published | flowride plan | error |")
        print("|---|---|---|---|---|---|")
        errs = []
        for r, g in zip(idx["rows"], got, strict=True):
            job = job_from_dict(json.loads((PUBLISHED / r["job"]).read_text()))
            p = job.parallel
            cfg = (f"tp {p.tp}{f' cp {p.cp}' if p.cp > 1 else ''} pp {p.pp} dp {p.dp} v {p.virtual} m {p.microbatches} "
                   f"b {job.model.microbatch_size}, {job.model.recompute}{', SP' if p.sequence_parallel else ''}")
            unit = " s" if r["metric"] == "iteration_s" else " TFLOP/s"
            e = (g / r["published"] - 1) * 100
            if r["metric"] == "iteration_s":
                errs.append(abs(e))
            print(f"| {r['row']} ({r['source']}) | {job.gpus:,} | {cfg} | {r['published']:g}{unit} | {g:.{2 if unit == ' s' else 0}f}{unit} | "
                  f"{e:+.1f}% |")
        print(f"\nKorthikanti Table 5: mean absolute error {sum(errs) / len(errs):.2f}%, largest {max(errs):.2f}%")
        lo = {r["job"]: g for r, g in zip(idx["rows"], got, strict=True)}
        t8, t16, tcp = (lo["llama3-405b-8k-gpus8192.json"], lo["llama3-405b-8k-gpus16384.json"],
                        lo["llama3-405b-128k-gpus16384-cp16.json"])
        print(f"Llama 3 405B per-GPU throughput ratios: 16K/8K GPUs {t16 / t8:.3f} (published {400 / 430:.3f}, "
              f"{(t16 / t8 - 400 / 430) * 100:+.1f} points); CP 16 at 128K / 8K GPUs {tcp / t8:.3f} (published {380 / 430:.3f}, "
              f"{(tcp / t8 - 380 / 430) * 100:+.1f} points)")
        attention_kernels([r for r in idx["rows"] if r["job"].startswith("llama3")], cache)
        if refit:
            refit_a100([r for r in idx["rows"] if r["metric"] == "iteration_s"], cache)


ATTENTION = Path(__file__).resolve().parent / "data" / "attention_h100_fa3.json"


def attention_kernels(rows: list[dict], cache: Path) -> None:
    """The Llama 3 ratios with the attention core priced by each kernel the FlashAttention-3 paper
    benchmarks on H100 (its Figures 5-6; the built-in description is FlashAttention-3's): which
    kernel Llama 3 ran is not published, and the CP row's ratio depends on it."""
    from flowride.plan.efficiency import BUILTIN, Measured, fit_ops

    data = json.loads(ATTENTION.read_text())
    print("\nattention kernel (H100, the FlashAttention-3 paper's Figs. 5-6) | attention_max, half-point | 16K/8K | CP 128K/8K "
          "(published 0.930, 0.884)")
    for name, rates in data["series_tflops"].items():
        ops = [Measured("attention", 4 * 16384 * s * 2048, (1 / f + 2.5 / b) * 4 * 16384 * s * 2048 / 1e12 / 3)
               for s, f, b in zip(data["seq_len"], rates["forward"], rates["backward"], strict=True)]
        c = fit_ops(ops, BUILTIN["dgx-h100"], 989.0, 3.35, name)
        got = dict(zip([r["job"] for r in rows], published_plans(rows, {"attention_max": c.attention_max,
                                                                        "attention_half_gflop": c.attention_half_gflop}, cache),
                       strict=True))
        t8 = got["llama3-405b-8k-gpus8192.json"]
        print(f"{name} | {c.attention_max:.3f}, {c.attention_half_gflop:.1f} GFLOP | {got['llama3-405b-8k-gpus16384.json'] / t8:.3f} | "
              f"{got['llama3-405b-128k-gpus16384-cp16.json'] / t8:.3f}")


def refit_a100(rows: list[dict], cache: Path) -> None:
    """The A100 description from Table 5: for each half-point x_half, every row's iteration is
    ``a / e_max + b`` (compute scales as 1 / e_max, the rest does not; exact but for the TP
    overlap's max); two plans a row give a and b, then log least squares over (e_max, x_half)."""
    import math

    from scipy.optimize import minimize

    pubs = [r["published"] for r in rows]

    def eff(e: float, h: float) -> dict:
        return {"gemm_max": e, "attention_max": e, "gemm_half_gflop": h, "attention_half_gflop": h}

    lines = {}
    for h in (20.0, 60.0):  # a and b are linear in x_half: two half-points give all
        t1, t2 = published_plans(rows, eff(0.6, h), cache), published_plans(rows, eff(0.9, h), cache)
        lines[h] = [((x - y) / (1 / 0.6 - 1 / 0.9), x - (x - y) / (1 / 0.6 - 1 / 0.9) / 0.6) for x, y in zip(t1, t2, strict=True)]

    def pred(h: float, e: float, i: int) -> float:
        (a1, b1), (a2, b2) = lines[20.0][i], lines[60.0][i]
        w = (h - 20.0) / 40.0
        return (a1 + (a2 - a1) * w) / e + b1 + (b2 - b1) * w

    def fit(idx: list[int]) -> tuple[float, float]:
        r = minimize(lambda p: sum(math.log(pred(p[0], p[1], i) / pubs[i]) ** 2 for i in idx), [40.0, 0.75], method="Nelder-Mead")
        return float(r.x[0]), float(r.x[1])

    h, e = fit(list(range(len(rows))))
    errs = [(pred(h, e, i) / pubs[i] - 1) * 100 for i in range(len(rows))]
    print(f"\nrefit on all {len(rows)} rows: gemm_max = attention_max {e:.3f}, half-points {h:.1f} GFLOP; errors "
          + ", ".join(f"{x:+.1f}%" for x in errs) + f"; mean absolute {sum(map(abs, errs)) / len(errs):.2f}%")
    cv = []
    for k in range(0, len(rows), 2):  # each model (its two rows) predicted from the other three
        hh, ee = fit([i for i in range(len(rows)) if i not in (k, k + 1)])
        cv += [(rows[i]["row"], hh, ee, (pred(hh, ee, i) / pubs[i] - 1) * 100) for i in (k, k + 1)]
    print("leave-one-model-out: " + "; ".join(f"{n} {x:+.1f}% (fit {ee:.3f}, {hh:.0f} GFLOP)" for n, hh, ee, x in cv)
          + f"; mean absolute {sum(abs(c[3]) for c in cv) / len(cv):.2f}%")
    table4(cache)


def table4(cache: Path) -> None:
    """The built-in A100 description on one 22B layer against Korthikanti Table 4 (forward, backward)."""
    from flowride.plan.costs import layer_seconds, tp_allreduce_bytes
    from flowride.plan.price import groups

    base = json.loads((PUBLISHED / "korthikanti-22b-full.json").read_text())
    pricer = Pricer(cache=cache, synth=False)
    print("\nKorthikanti Table 4, one 22B layer (ms): | recompute | SP | forward pub / plan | backward pub / plan |")
    for rc, sp, f_ms, b_ms in TABLE4:
        base["model"]["recompute"], base["parallel"]["sequence_parallel"] = rc, sp
        job = job_from_dict(base)
        ar = pricer.price("allreduce", tp_allreduce_bytes(job), groups(job)[0]).nccl_us * 1e-6
        f, i, w, rec = layer_seconds(job, job.efficiency)
        w_hidden = max(0.0, (ar if sp else 2 * ar) - w)  # the backward's TP collectives, as price.py exposes them
        fwd, bwd = f + 2 * ar, i + w + rec + w_hidden + (ar if sp else 0.0) + (2 * ar if rc == "full" else 0.0)
        print(f"| {rc} | {sp} | {f_ms} / {fwd * 1e3:.2f} ({(fwd * 1e3 / f_ms - 1) * 100:+.1f}%) | {b_ms} / {bwd * 1e3:.2f} "
              f"({(bwd * 1e3 / b_ms - 1) * 100:+.1f}%) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--stages", type=int, default=2, help="one stage per core is what the machine can time faithfully")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--published", action="store_true", help="plan the published runs of examples/plans/published/ instead")
    ap.add_argument("--refit", action="store_true", help="with --published: re-derive the A100 description from Table 5")
    a = ap.parse_args()
    if a.published:
        published(a.refit)
        return
    p, m = a.stages, a.microbatches
    print(f"# CPU, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; model {a.model}, p={p}, m={m}, {a.iters} iterations "
          "(2 warm-up)\n")
    print("| engine | schedule | iteration measured (ms) | planned (ms) | error | bubble fraction measured | planned | error |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for engine, sched, v in RUNS:
            cfg = TrainConfig(schedule=sched, stages=p, microbatches=m, model=a.model, iters=a.iters, engine=engine, chunks=v,
                              warmup_iters=2, run_dir=str(Path(tmp) / f"{engine}-{sched}"))
            res = train(cfg)
            rep = res.report()
            prof = profile_from_ranks(res.ranks, warmup=2)
            plan_name = "interleaved" if sched == "interleaved" else sched
            pl = plan_job(job_from_dict(job_for(prof, plan_name, p, m, v)), Pricer(cache=None, synth=False)).report()
            t_m, t_p = rep["iteration_time_s"], pl["iteration_s"]
            b_m, b_p = rep["bubble_fraction_measured"], pl["shares"]["bubbles"]
            print(f"| {engine} | {sched} | {t_m * 1e3:.1f} | {t_p * 1e3:.1f} | {(t_p / t_m - 1) * 100:+.1f}% | {b_m:.3f} | {b_p:.3f} | "
                  f"{(b_p / b_m - 1) * 100:+.1f}% |", flush=True)
    print("\n| schedule | p | m | v | closed form | planned (uniform stages) |")
    print("|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    for sched, pp, mm, v, closed in [("gpipe", 4, 4, 1, 3 / 7), ("1f1b", 4, 4, 1, 3 / 7), ("1f1b", 4, 6, 1, 3 / 9), ("1f1b", 4, 8, 1, 3 / 11),
                                     ("1f1b", 8, 24, 1, 7 / 31), ("interleaved", 8, 24, 2, 7 / 55), ("zbh1", 8, 24, 1, 7 / 79),
                                     ("interleaved1f1b", 8, 24, 2, 7 / 55), ("zbv", 8, 24, 2, None), ("dualpipev", 8, 24, 2, None)]:
        got = uniform(sched, pp, mm, v)
        print(f"| {sched} | {pp} | {mm} | {v} | {'-' if closed is None else f'{closed:.4f}'} | {got:.4f} |")
    print(f"\n(closed-form table in {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
