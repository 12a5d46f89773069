"""``flowride train``, ``profile-bubbles`` and ``schedule-show``: pipeline-parallel training (with
side tasks harvesting its bubbles when asked), parsed into a TrainConfig, run with a progress
bar, and reported as tables.

Started by torchrun (``torchrun --nnodes 2 --nproc-per-node 2 ... -m flowride train -p 4``),
``train`` and ``profile-bubbles`` run as one stage each instead of spawning their own: rank 0
shows the progress, prints the tables and writes the files; the other ranks print nothing and
exit with the run's code (docs/pipeline.md, "Several nodes"). With ``--side-tasks`` there, local
rank 0 of each host starts that host's side-task manager (:mod:`flowride.harvest.cluster`).

``--store`` says where the side tasks are kept: left out, each host's own SQLite file; a
``postgresql://`` URL, one queue that every host's manager leases from."""

from __future__ import annotations

import argparse

from rich.table import Table

from flowride.argtypes import PORT, integer, number, out_file
from flowride.cli.common import (
    PIPELINE_OPTIONS,
    RunFailed,
    as_options,
    console,
    err,
    refuse_unused,
    train_args,
)
from flowride.files import write_json_atomic
from flowride.sizes import MAX_MICROBATCHES, MAX_STAGES


def _train_config(a: argparse.Namespace, iters: int | None = None):
    from flowride.pipeline.config import TrainConfig

    return TrainConfig(
        schedule=a.schedule.lower(), stages=a.stages, microbatches=a.microbatches, chunks=a.chunks,
        model=a.model, iters=iters or a.iters, microbatch_size=a.microbatch_size, seed=a.seed, lr=a.lr,
        data=a.data, run_dir=a.run_dir, bubble_port=getattr(a, "bubble_port", None),
        profile=getattr(a, "bubble_profile", None), timeout_s=a.timeout, device=a.device, threads=a.threads,
        engine=a.engine.lower(), min_bubble_s=a.min_bubble,
        rehearse_stage=getattr(a, "rehearse", None), stand_in=getattr(a, "stand_in", None) or "same",
    )


def _run_training(cfg):
    """The training's result; under torchrun this process is one stage and the result comes back
    on rank 0 only (None on the other ranks, which show no progress)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from flowride.pipeline.launch import TrainingFailed
    from flowride.pipeline.trainer import check_profile, train, train_as_rank
    from flowride.ranks import launched_as_rank

    as_rank = launched_as_rank()
    with as_options(**PIPELINE_OPTIONS):
        cfg.validate()  # bad input fails before any progress bar or process starts
    check_profile(cfg)
    with Progress(
        TextColumn("[bold]train[/bold] {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[secs]} s/iter"), TimeElapsedColumn(),
        console=err, transient=False, disable=as_rank and _rank() != 0,
    ) as prog:
        task = prog.add_task(f"{cfg.schedule} p={cfg.stages} m={cfg.microbatches}", total=cfg.iters, loss="-", secs="-")

        def on_progress(ev: dict) -> None:  # under torchrun rank 0 may hold no last stage: no loss
            loss = "-" if ev["loss"] is None else f"{ev['loss']:.4f}"
            prog.update(task, completed=ev["iteration"] + 1, loss=loss, secs=f"{ev['seconds']:.3f}")

        try:
            if as_rank:
                with as_options(**PIPELINE_OPTIONS):
                    return train_as_rank(cfg, on_progress)
            return train(cfg, on_progress)
        except TrainingFailed as e:
            raise RunFailed(str(e)) from None


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


def _bubble_table(rep: dict) -> Table:
    t = Table(title=f"{rep['schedule']}: {rep['stages']} stages, {rep['microbatches']} micro-batches, {rep['model']} model")
    for c in ("stage", "type", "per iter", "median ms", "min ms", "free memory"):
        t.add_column(c, justify="right")
    real = (rep.get("rehearsal") or {}).get("real_stage")
    for b in rep["bubbles"]:
        if b["type"] == "S" or (real is not None and b["stage"] != real):  # a rehearsal: the real stage's
            continue
        t.add_row(str(b["stage"]), b["type"], f"{b['count_per_iteration']:.0f}", f"{b['median_s'] * 1e3:.2f}",
                  f"{b['min_s'] * 1e3:.2f}", f"{b['free_memory_bytes'] / 2**30:.1f} GiB")
    return t


def _rehearsal_table(r: dict) -> Table:
    """The rehearsal's real stage: its bubbles by type as planned from the measured times, and as measured."""
    t = Table(title=f"rehearsal: stage {r['real_stage']} real, the others stand-ins ({r['stand_in']}); "
                    f"planned bubble share {r['planned_bubble_fraction']:.3f}")
    for c in ("type", "planned ms/iter", "measured ms/iter"):
        t.add_column(c, justify="right")
    for typ in sorted(set(r["planned_by_type_s"]) | set(r["measured_by_type_s"])):
        t.add_row(typ, f"{r['planned_by_type_s'].get(typ, 0.0) * 1e3:.1f}", f"{r['measured_by_type_s'].get(typ, 0.0) * 1e3:.1f}")
    return t


def cmd_train(a: argparse.Namespace) -> int:
    from flowride.pipeline.timeline import write_png, write_trace
    from flowride.ranks import launched_as_rank

    cfg = _train_config(a)
    from flowride.harvest.task import parse_task_list

    with as_options(side_tasks="--side-tasks", task="--side-tasks"):
        tasks = parse_task_list(a.side_tasks)
    mode = a.harvest.lower()
    side_steps: list[dict] = []
    if tasks and mode != "none":
        res, rep, side_steps = _train_harvesting(a, cfg, tasks, mode)
        if res is None:  # a rank other than 0 under torchrun: rank 0 reports
            return 0
    else:
        refuse_unused(a, "with --side-tasks", "leave it out, or name side tasks to harvest", store="--store",
                      resume_leftovers="--resume-leftovers")
        res = _run_training(cfg)
        if res is None:  # a rank other than 0 under torchrun: rank 0 reports
            return 0
        rep = res.report()
        rep["harvest_mode"] = "none"
    if a.report:
        write_json_atomic(a.report, rep, indent=1)
    if a.timeline:
        g = rep.get("guard")
        guard = (f"\nbudget guard: rung {g['level']} of 5 after {len(g['actions'])} action(s), factor {g['setting']['factor']:g}, "
                 f"shortest bubble {g['setting']['min_bubble_s'] * 1e3:g} ms" + ("" if g["setting"]["harvest"] else ", harvesting paused")
                 if g else "")
        write_png(res.ranks, res.gaps, a.timeline, f"{cfg.schedule}, p={cfg.stages}, m={cfg.microbatches} (last iteration){guard}",
                  side_steps=side_steps)
    if a.trace:
        write_trace(res.ranks, res.gaps, a.trace, side_steps=side_steps)
    console.print(_bubble_table(rep))
    if rep.get("rehearsal"):
        console.print(_rehearsal_table(rep["rehearsal"]))
    if rep.get("harvest_mode", "none") != "none":
        console.print(_harvest_table(rep))
        if "tasks_by_origin" in rep:  # which tasks ran and where each came from (harvest/rerun.py)
            from flowride.harvest.rerun import summary_line

            console.print(summary_line(rep["tasks"], rep.get("tasks_left", [])), soft_wrap=True, highlight=False)
        for note in rep.get("store_notes", []):
            console.print(f"note: {note}", soft_wrap=True, highlight=False)
    console.print(
        f"iteration {rep['iteration_time_s'] * 1e3:.1f} ms (median after warm-up); loss {rep['losses'][0]:.4f} -> "
        f"{rep['losses'][-1]:.4f}; bubble fraction measured {rep['bubble_fraction_measured']:.3f}, "
        f"theory {rep['bubble_fraction_theory']:.3f}",
        soft_wrap=True,
    )
    if rep.get("bubble_prediction_error") is not None:
        by = rep.get("bubble_prediction_error_by_type") or {}
        console.print(f"bubble prediction error: median {rep['bubble_prediction_error']:.1%}"
                      + ("; by type " + ", ".join(f"{t} {d['median']:.1%} (p90 {d['p90']:.1%}, {d['bubbles']})" for t, d in by.items())
                         if by else ""), soft_wrap=True, highlight=False)
    if launched_as_rank():
        from flowride.clocks import describe

        console.print(describe(rep["clock_offsets"]), soft_wrap=True)
    return 0



def _train_harvesting(a: argparse.Namespace, cfg, tasks: list[str], mode: str):
    """A `none` baseline (or a given baseline report), then the same training with side tasks,
    harvesting switched on and off in randomized blocks (the paired overhead)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from flowride.harvest.cluster import check_cluster_run, harvest_as_rank
    from flowride.harvest.session import check_comparison, compare, read_baseline_report
    from flowride.harvest.stores import check_store
    from flowride.harvest.supervise import ManagerUnavailable
    from flowride.pipeline.launch import TrainingFailed
    from flowride.ranks import launched_as_rank

    as_rank = launched_as_rank()
    with as_options(**PIPELINE_OPTIONS):
        check_comparison(cfg, mode, tasks, a.paired_block, a.budget, a.price_ref, a.price_main)
    store = check_store(a.store)
    base_rep = None
    if a.baseline_report:
        base_rep = read_baseline_report(a.baseline_report, "--baseline-report")
    if as_rank:  # one stage of a torchrun job: one manager per host (harvest/cluster.py)
        check_cluster_run(a.paired_block, base_rep)
    with Progress(TextColumn("[bold]train+harvest[/bold] {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=err,
                  disable=as_rank and _rank() != 0) as prog:
        task = prog.add_task("profiling side tasks", total=cfg.iters, loss="-")

        def on_stage(msg: str) -> None:
            prog.update(task, description=msg, completed=0)

        def on_progress(ev: dict) -> None:  # under torchrun rank 0 may hold no last stage: no loss
            prog.update(task, completed=ev["iteration"] + 1, loss="-" if ev["loss"] is None else f"{ev['loss']:.4f}")

        try:
            if as_rank:
                with as_options(**PIPELINE_OPTIONS):
                    c = harvest_as_rank(cfg, mode, tasks, paired_block=a.paired_block, baseline_report=base_rep,
                                        p_ref=a.price_ref, p_main=a.price_main, budget_pct=a.budget, guard=a.guard == "on",
                                        bubble_profile=a.bubble_profile, store=store, on_stage=on_stage,
                                        on_progress=on_progress, resume_leftovers=a.resume_leftovers)
            else:
                from flowride.ranks import pick_device

                side = "cuda" if pick_device(cfg.device, field="--device") == "cuda" else "cpu"  # side tasks on the training's device
                c = compare(cfg, mode, tasks, paired_block=a.paired_block, baseline_report=base_rep, p_ref=a.price_ref,
                            p_main=a.price_main, side_device=side, budget_pct=a.budget, bubble_profile=a.bubble_profile,
                            on_stage=on_stage, on_progress=on_progress, guard=a.guard == "on", store=store,
                            resume_leftovers=a.resume_leftovers)
        except (TrainingFailed, ManagerUnavailable) as e:
            raise RunFailed(str(e)) from None
    if c is None:
        return None, None, []
    c.report.setdefault("store_notes", c.record.get("store_notes", []))
    return c.result, c.report, c.record.get("steps", [])


def _efficiency(rep: dict) -> str:
    e, why = rep["harvest_efficiency"], rep.get("harvest_efficiency_note")
    return ("n/a" if e is None else f"{e:.2f}") + (f" ({why})" if why else "")


def _harvest_table(rep: dict) -> Table:
    ci = rep.get("overhead_ci95")
    ci_text = f" (95% CI {ci[0]:+.2f}..{ci[1]:+.2f}, {rep['overhead_pairs']} pairs)" if ci else ""
    budget = {"within": "within", "over": "OVER", "unresolved": "cannot resolve"}[rep["budget_verdict"]]
    t = Table(title=f"harvest ({rep['harvest_mode']}): overhead {rep['overhead_pct']:+.2f}%{ci_text}, {budget} the "
                    f"{rep['overhead_budget_pct']:g}% budget; efficiency {_efficiency(rep)}, savings {rep['cost']['savings']:+.4f}")
    for c in ("task", "steps", "units", "units/s", "dedicated units/s", "overruns"):
        t.add_column(c, justify="right")
    for tid, d in rep["side_work"].items():
        t.add_row(f"{tid}:{d['name']}", str(d["steps"]), f"{d['units']:.0f} {d['unit']}", f"{d['throughput']:.1f}",
                  f"{d['dedicated_throughput']:.1f}", str(d["overruns"]))
    g = rep.get("guard")
    if g:
        last = g["actions"][-1] if g["actions"] else None
        settled = "n/a" if g["settled_overhead_pct"] is None else f"{g['settled_overhead_pct']:+.2f}%"
        t.caption = (f"budget guard: rung {g['level']} (factor {g['setting']['factor']:g}, shortest bubble "
                     f"{g['setting']['min_bubble_s'] * 1e3:g} ms), {len(g['actions'])} action(s)"
                     + (f", last: {last['action']} at iteration {last['iteration']}" if last else "")
                     + f"; settled at {settled} over {g['pairs_at_level']} pair(s): {g['verdict_text']}")
        nf = g.get("noise_floor")
        if nf and nf.get("ci95_pct"):
            t.caption += f"; A/A noise floor {nf['mean_pct']:+.2f}% [{nf['ci95_pct'][0]:+.2f}, {nf['ci95_pct'][1]:+.2f}] over {nf['pairs']} pairs"
    if rep.get("budget_verdict") == "unresolved":
        t.caption = (t.caption + "\n" if t.caption else "") + rep["budget_note"]
    for f in rep["failures"]:
        t.add_row(f"{f['task']}:{f['name']}", "FAILED", (f["reason"] or "")[:60], "", "", "")
    if rep.get("manager_restarts"):
        t.add_row("manager", f"restarted {rep['manager_restarts']}x", rep.get("harvest_stopped") or "", "", "", "")
    return t


def cmd_profile_bubbles(a: argparse.Namespace) -> int:
    cfg = _train_config(a)
    res = _run_training(cfg)
    if res is None:  # a rank other than 0 under torchrun: rank 0 writes the profile
        return 0
    prof = res.profile()
    write_json_atomic(a.out, prof, indent=1)
    console.print(_bubble_table(res.report()))
    console.print(f"bubble profile written to {a.out}")
    return 0


def cmd_schedule_show(a: argparse.Namespace) -> int:
    from flowride.pipeline.schedules import (
        build_schedule,
        check_grid_size,
        render_grid,
        theoretical_bubble_fraction,
    )

    name = a.schedule.lower()
    with as_options(**PIPELINE_OPTIONS):
        check_grid_size(a.stages, a.microbatches, a.chunks)
        instrs = build_schedule(name, a.stages, a.microbatches, a.chunks)
    console.print(render_grid(instrs, a.stages, a.microbatches, a.chunks), highlight=False, soft_wrap=True)
    console.print(f"theoretical bubble fraction: {theoretical_bubble_fraction(name, a.stages, a.microbatches, a.chunks):.4f}")
    return 0


def add_train(sub) -> None:
    """``flowride train``."""
    tr = sub.add_parser("train", help="pipeline-parallel training that reports its bubbles")
    train_args(tr, 20)
    tr.add_argument("--rehearse", type=integer(0, MAX_STAGES, "a stage"), default=None, metavar="STAGE",
                    help="a one-machine rehearsal: run only this stage for real (0 = first), the others as timed "
                         "stand-ins on the CPU; side tasks fill the real stage's bubbles (docs/harvest.md)")
    tr.add_argument("--stand-in", default=None, help="with --rehearse, the stand-ins' action times: same (default: the real "
                    "stage's own, measured in the warm-up), F=SECONDS,B=SECONDS[,W=SECONDS], or a JSON file "
                    "(a stages list, flowride plan --stand-ins, or an earlier run's ranks.json)")
    tr.add_argument("--report", type=out_file, help="write the report JSON here")
    tr.add_argument("--timeline", type=out_file, help="write a timeline PNG here")
    tr.add_argument("--trace", type=out_file, help="write a Chrome trace JSON here")
    tr.add_argument("--bubble-port", type=PORT, help="UDP port on 127.0.0.1 to publish bubble events to")
    tr.add_argument("--bubble-profile", help="bubble profile JSON (from profile-bubbles) for predicted bubble ends")
    tr.add_argument("--side-tasks", help="comma-separated side tasks to run in the bubbles (e.g. pagerank,cnn,image)")
    tr.add_argument("--harvest", default="freeride", help="none, freeride, naive or priority (with --side-tasks)")
    tr.add_argument("--store", help="where the side tasks are kept (with --side-tasks): left out, each host's own SQLite file "
                    "(RUN_DIR/<host>/tasks.sqlite); postgresql://USER@HOST[:PORT]/DB, one queue that every host's manager "
                    "leases from (under torchrun: the tasks are submitted once)")
    tr.add_argument("--resume-leftovers", action="store_true",
                    help="also run the unfinished side tasks earlier runs left in --run-dir (by default a run resumes only "
                    "the tasks it names, matched by name and parameters, and leaves the others as they are)")
    tr.add_argument("--baseline-report", help="a none-mode train report to measure overhead against (else one is run first)")
    tr.add_argument("--price-main", type=number(0, 1e9, lo_open=True, what="a price"), default=None, help="training job price per hour (default: stages x 1)")
    tr.add_argument("--price-ref", type=number(0, 1e9, lo_open=True, what="a price"), default=1.0, help="reference device price per hour (default 1)")
    tr.add_argument("--paired-block", type=integer(0, 10**6, "iterations"), default=2,
                    help="harvesting alternates on/off in randomized blocks of this many iterations (0: separate runs only)")
    tr.add_argument("--budget", type=number(0, 100, what="percent"), default=2.0, help="the training owner's overhead budget in percent (default 2)")
    tr.add_argument("--guard", choices=("on", "off"), default="on", help="on (default): the manager measures the overhead all run "
                    "long and backs off to hold it within --budget; off: the budget is only judged after the run")
    tr.set_defaults(func=cmd_train)


def add_profile_bubbles(sub) -> None:
    """``flowride profile-bubbles``."""
    pb = sub.add_parser("profile-bubbles", help="run a few iterations and write a bubble profile")
    train_args(pb, 6)
    pb.add_argument("--out", "-o", type=out_file, default="bubble-profile.json")
    pb.set_defaults(func=cmd_profile_bubbles)


def add_schedule_show(sub) -> None:
    """``flowride schedule-show``."""
    ss = sub.add_parser("schedule-show", help="print a pipeline schedule's instructions as a grid")
    ss.add_argument("schedule", help="gpipe, 1f1b, interleaved or zbh1")
    ss.add_argument("--stages", "-p", type=integer(1, MAX_STAGES, "stages"), default=4)
    ss.add_argument("--microbatches", "-m", type=integer(1, MAX_MICROBATCHES, "micro-batches"), default=8)
    ss.add_argument("--chunks", "-v", type=integer(1, 16, "chunks"), default=None)
    ss.set_defaults(func=cmd_schedule_show)
