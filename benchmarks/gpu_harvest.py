"""Harvesting on one GPU, measured (issue #33): a rehearsed pipeline's real GPU stage, side tasks
of FreeRide's three kinds on the GPU, arms none / freeride / naive / priority (and the MPS arms
where a daemon can be started), each arm's paired overhead with a bootstrap CI, efficiency, side
throughput against the task alone on the GPU, overrun per bubble type and FreeRide's cost figure.

One real stage (by default the last of a p = 4 1F1B pipeline, m = 4) runs FreeRide's smallest
model (gpt-1.2b: a quarter of its 24 layers of 2048) on the GPU; the other three stages are
stand-ins on the CPU that sleep fixed F/B times (``--stand-in``, default F = 80 ms, B = 160 ms)
and pass real-shaped activations through host memory (flowride.pipeline.rehearsal). The real
stage then idles in bubbles of FreeRide's length (the fill, A, about 3 F; the end, C, about 3 B).

Each arm is one paired run (harvesting on and off in randomized blocks of ``--block`` iterations,
flowride.harvest.stats), so its overhead and interval come from pairs inside the run; the arms
run in a random order per round. ``none`` is the A/A run: no side tasks, its interval the noise
floor. Cost: S = 1 - T_f/T_v + (P/X) p_ref/(p_main T_v) with X the task's throughput alone on
this GPU, p_main one GPU (the real stage; every stage of the pipeline would harvest alike) and
p_ref/p_main = ``--price-ratio`` (1: the side work is priced as the same GPU).

On a machine without CUDA it runs the same arms at toy size on the CPU (what CI can check).

    python benchmarks/gpu_harvest.py --run-dir DIR [--out gpu_harvest.json] [--pairs 3] [--block 2]
        [--arms none,freeride,naive,priority] [--tasks gpu-cnn,gpu-pagerank,gpu-image] [--budget-s 420]

One shell line on a lent GPU: bash benchmarks/gpu_harvest.sh
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from dataclasses import replace
from pathlib import Path

import torch

from flowride.argtypes import out_dir
from flowride.harvest.profile import profile_task
from flowride.harvest.session import compare, job_params
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import train

MPS_ARMS = ("mps-naive", "mps-freeride")  # FreeRide's co-location under MPS, and freeride under MPS


def _row(arm: str, h: dict, base: dict, profiles: dict, wall_s: float) -> dict:
    side = h.get("side_work") or {}
    lo, hi = h["overhead_ci95"] or (None, None)
    return {
        "arm": arm, "overhead_pct": h["overhead_pct"], "ci95": [lo, hi], "pairs": h.get("overhead_pairs"),
        "budget_verdict": h.get("budget_verdict"), "noise_floor_pct": (h.get("overhead_noise_floor") or {}).get("median_pct"),
        "efficiency": h.get("harvest_efficiency"), "efficiency_note": h.get("harvest_efficiency_note"),
        # side throughput while training ran, against the same task alone on the device
        "throughput_vs_alone": {d["name"]: (d["throughput"] / d["dedicated_throughput"] if d["dedicated_throughput"] else None)
                                for d in side.values()},
        "side_steps": sum(d["steps"] for d in side.values()),
        "units": {d["name"]: d["units"] for d in side.values()},
        "overrun_by_type": h.get("overrun_by_type"), "gpu_step_s": h.get("gpu_step_s"),
        "cost": h.get("cost"), "losses_identical": h.get("losses_identical"),
        # on a GPU training alone differs from run to run too (the none arm shows by how much)
        "loss_max_rel_diff": max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(h.get("losses") or [], base["losses"], strict=False)
                                  if x is not None and y is not None), default=None),
        "prediction_error": h.get("bubble_prediction_error"), "failures": len(h.get("failures") or []),
        "guard_actions": len((h.get("guard") or {}).get("actions", [])), "wall_s": wall_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=out_dir, help="a fresh (absent or empty) directory (required for a run)")
    ap.add_argument("--out", default=None, help="the JSON written (default: RUN_DIR/gpu_harvest.json)")
    ap.add_argument("--device", default="auto", help="auto (cuda when there is one), cuda or cpu")
    ap.add_argument("--model", default=None, help="default gpt-1.2b on cuda, small on cpu")
    ap.add_argument("--microbatch-size", type=int, default=None, help="default 4 on cuda, 2 on cpu")
    ap.add_argument("--stand-in", default=None, help="default F=0.08,B=0.16 on cuda, F=0.03,B=0.06 on cpu")
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--real-stage", type=int, default=None, help="default: the last")
    ap.add_argument("--tasks", default="gpu-cnn,gpu-pagerank,gpu-image")
    ap.add_argument("--arms", default="none,freeride,naive,priority", help="MPS arms are added where a daemon starts")
    ap.add_argument("--no-mps", action="store_true", help="never try the MPS arms")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--block", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--price-ratio", type=float, default=1.0, help="p_ref / p_main per GPU")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no arm after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--table", metavar="JSON", help="print the table of a saved run and exit (no run)")
    ap.add_argument("--units-per-step", default="", metavar="TASK=N,...",
                    help="with --table: reprice a profile that has no units_per_step from its warm median step")
    a = ap.parse_args()
    if a.table:
        doc = json.loads(Path(a.table).read_text())
        ups = {k: float(v) for k, v in (x.split("=") for x in a.units_per_step.split(",") if x)}
        doc["notes"] += [f"repriced: {n}" for n in reprice(doc, ups)]
        print_table(doc)
        return
    if not a.run_dir:
        ap.error("argument --run-dir is required for a run")
    run_dir = Path(a.run_dir)
    if run_dir.exists() and any(run_dir.iterdir()):
        ap.error(f"argument --run-dir: {run_dir} is not empty: give a fresh directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    out = Path(a.out or run_dir / "gpu_harvest.json")
    cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    dev = "cuda" if cuda else "cpu"
    t_start = time.time()
    doc: dict = {"device": torch.cuda.get_device_name(0) if cuda else f"CPU ({platform.processor() or platform.machine()})",
                 "torch": torch.__version__, "arms": [], "notes": []}

    def save() -> None:
        out.write_text(json.dumps(doc, indent=1))

    tasks = [t for t in a.tasks.split(",") if t]
    real = a.stages - 1 if a.real_stage is None else a.real_stage
    cfg = TrainConfig(schedule=a.schedule, stages=a.stages, microbatches=a.microbatches, model=a.model or ("gpt-1.2b" if cuda else "small"),
                      microbatch_size=a.microbatch_size or (4 if cuda else 2), device=dev, rehearse_stage=real,
                      stand_in=a.stand_in or ("F=0.08,B=0.16" if cuda else "F=0.03,B=0.06"), warmup_iters=3,
                      iters=3 + 2 * a.block * a.pairs, pin_cores=True, timeout_s=300.0)
    doc["config"] = {k: getattr(cfg, k) for k in ("schedule", "stages", "microbatches", "model", "microbatch_size", "device",
                                                  "rehearse_stage", "stand_in", "iters")} | {"pairs": a.pairs, "block": a.block}
    print(f"# {doc['device']}, torch {torch.__version__}; rehearsal: stage {real} of {a.stages} real ({cfg.model}, "
          f"micro-batch {cfg.microbatch_size}), stand-ins {cfg.stand_in}; {a.schedule} m={a.microbatches}", flush=True)

    # 1. each side task alone on the device: step time (wall, GPU events, CPU) and throughput X
    profiles = {}
    for name in tasks:
        profiles[name] = profile_task(name, job_params(name, dev), steps=5000, seconds=4.0)
        p = profiles[name]
        print(f"alone: {name}: step {p['median_step_s'] * 1e3:.2f} ms wall, "
              f"{'-' if p.get('median_gpu_step_s') is None else format(p['median_gpu_step_s'] * 1e3, '.2f')} ms GPU, "
              f"{'-' if p.get('median_cpu_step_s') is None else format(p['median_cpu_step_s'] * 1e3, '.2f')} ms CPU; "
              f"{p['throughput']:.1f} {p['unit']}/s", flush=True)
    doc["profiles"] = profiles
    (run_dir / "task-profiles.json").write_text(json.dumps(profiles, indent=1))
    save()

    # 2. training alone: the rehearsal's bubbles, planned and measured
    base = train(replace(cfg, run_dir=str(run_dir / "alone"), paired_block=0)).report()
    r = base["rehearsal"]
    doc["alone"] = {"iteration_time_s": base["iteration_time_s"], "bubble_fraction": base["bubble_fraction_measured"],
                    "rehearsal": r, "bubbles": [b for b in base["bubbles"] if b["stage"] == real]}
    print(f"alone: iteration {base['iteration_time_s'] * 1e3:.0f} ms, real stage's bubble share {base['bubble_fraction_measured']:.3f} "
          f"(planned {r['planned_bubble_fraction']:.3f}); bubbles by type, planned / measured ms per iteration: "
          + ", ".join(f"{t} {r['planned_by_type_s'].get(t, 0) * 1e3:.0f}/{r['measured_by_type_s'].get(t, 0) * 1e3:.0f}"
                      for t in sorted(set(r["planned_by_type_s"]) | set(r["measured_by_type_s"]))), flush=True)
    save()

    # 3. MPS, only where this user may start a daemon of their own
    arms = [x for x in a.arms.split(",") if x]
    daemon = None
    if cuda and not a.no_mps:
        from flowride.harvest.mps import try_start

        daemon, why = try_start(run_dir / "mps")
        if daemon is None:
            doc["notes"].append(f"no MPS arms: {why}")
        else:
            arms += list(MPS_ARMS)
    elif not a.no_mps:
        doc["notes"].append("no MPS arms: no GPU")
    for n in doc["notes"]:
        print(f"note: {n}", flush=True)

    # 4. the arms, in a random order per round
    rng = random.Random(a.seed)
    try:
        for rnd in range(a.rounds):
            order = [x for x in arms if x not in MPS_ARMS]
            rng.shuffle(order)
            order += [x for x in arms if x in MPS_ARMS]  # after the four arms every GPU has
            for arm in order:
                if time.time() - t_start > a.budget_s:
                    doc["notes"].append(f"round {rnd}: {arm} not run: past the {a.budget_s:g} s budget")
                    continue
                mode = arm.removeprefix("mps-")
                env = daemon.env() if arm in MPS_ARMS and daemon is not None else {}
                os.environ.update(env)
                t0 = time.time()
                try:
                    c = compare(replace(cfg, run_dir=str(run_dir / f"r{rnd}-{arm}")), mode, [] if mode == "none" else tasks,
                                paired_block=a.block, baseline_report=base, profiles=profiles, p_ref=a.price_ratio,
                                p_main=1.0, side_device=dev)
                finally:
                    for k in env:
                        os.environ.pop(k, None)
                row = _row(arm, c.report, base, profiles, time.time() - t0) | {"round": rnd}
                doc["arms"].append(row)
                save()
                print(json.dumps({k: row[k] for k in ("arm", "overhead_pct", "ci95", "efficiency", "side_steps", "wall_s")}), flush=True)
    finally:
        if daemon is not None:
            daemon.stop()
    doc["wall_s"] = time.time() - t_start
    save()
    print_table(doc)


def reprice(doc: dict, units_per_step: dict[str, float]) -> list[str]:
    """A saved run's figures with each task's throughput alone taken from its warm median step
    (units per step / median step time) instead of units / time over every profiled step: a
    profile from before the profiler left its cold first steps out (one cold step outweighed 40
    warm ones of 0.25 ms on an H200). The side work is the same; only X, the price of a unit,
    changes, so each task's dedicated seconds scale by X_old / X_new. Returns the notes."""
    notes, scale = [], {}
    for name, p in doc["profiles"].items():
        ups = p.get("units_per_step") or units_per_step.get(name)
        if not ups or not p.get("median_step_s"):
            continue
        x_new = ups / p["median_step_s"]
        scale[name] = p["throughput"] / x_new
        notes.append(f"{name}: throughput alone {p['throughput']:.0f} -> {x_new:.0f} {p['unit']}/s "
                     f"({ups:g} per step / median step {p['median_step_s'] * 1e3:.3f} ms)")
        p["throughput"] = x_new
    for r in doc["arms"]:
        ratios = {k: v for k, v in r["throughput_vs_alone"].items() if v is not None}
        cost = r.get("cost") or {}
        old = cost.get("dedicated_seconds", 0.0)
        if not ratios or old <= 0:
            continue
        total = sum(ratios.values())  # a task's dedicated seconds are units / X: in proportion to its ratio
        new = sum(old * v / total * scale.get(k, 1.0) for k, v in ratios.items())
        r["throughput_vs_alone"] = {k: v * scale.get(k, 1.0) for k, v in ratios.items()}
        if r["efficiency"] is not None:
            r["efficiency"] *= new / old
        cost["value_term"] *= new / old
        cost["dedicated_seconds"] = new
        cost["savings"] = cost["overhead_term"] + cost["value_term"]
    return notes


def print_table(doc: dict) -> None:
    print()
    print(f"{doc['device']}, torch {doc['torch']}; {doc['config']}; {doc['wall_s']:.0f} s in all")
    print("| arm | overhead % (median of pairs) | 95% CI | A/A floor % | efficiency | side throughput ÷ alone | side steps | "
          "overrun by type (late steps / steps, median ms) | GPU step ms | overhead term | value term | savings | losses identical |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in doc["arms"]:
        lo, hi = r["ci95"]
        ci = "-" if lo is None else f"[{lo:+.2f}, {hi:+.2f}]"
        tp = ", ".join(f"{k} {v:.2f}" for k, v in r["throughput_vs_alone"].items() if v is not None) or "-"
        ov = ", ".join(f"{t} {d['overruns']}/{d['steps']} {d['median_s'] * 1e3:.1f}"
                       + (f" (GPU {d['gpu_overruns']}, {d['gpu_median_s'] * 1e3:.1f})" if "gpu_overruns" in d else "")
                       for t, d in (r["overrun_by_type"] or {}).items()) or "-"
        gs = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in (r["gpu_step_s"] or {}).items()) or "-"
        cost = r["cost"] or {}
        eff = "-" if r["efficiency"] is None else f"{r['efficiency']:.2f}"
        ld = "" if r.get("loss_max_rel_diff") is None else f" ({r['loss_max_rel_diff']:.1e})"
        floor = "-" if r["noise_floor_pct"] is None else f"{r['noise_floor_pct']:+.2f}"
        print(f"| {r['arm']} | {r['overhead_pct']:+.2f} | {ci} | {floor} | {eff} | {tp} | {r['side_steps']} | {ov} | {gs} | "
              f"{cost.get('overhead_term', 0):+.4f} | {cost.get('value_term', 0):+.4f} | {cost.get('savings', 0):+.4f} | {r['losses_identical']}{ld} |")
    for n in doc["notes"]:
        print(f"note: {n}")


if __name__ == "__main__":
    main()
