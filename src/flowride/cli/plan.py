"""``flowride plan``: a training job on a whole cluster, priced in seconds (parse, call
:func:`flowride.plan.plan_job` or :func:`flowride.plan.sweep.sweep`, print)."""

from __future__ import annotations

import argparse
import json
import time

from rich.markup import escape
from rich.table import Table

from flowride.argtypes import SECONDS, integer, out_file
from flowride.cli.common import as_options, calibration_args, console, err, refuse_unused
from flowride.errors import InputError
from flowride.files import write_json_atomic


def _progress(status):
    t0 = time.perf_counter()

    def on(ev: dict) -> None:
        if ev["stage"] == "collective":
            msg = f"pricing {ev['collective']} of {ev['size']:,} B on a group of {ev['group']}"
        elif ev["stage"] == "sweep":
            msg = f"point {ev['i']}/{ev['of']}: {ev['point']}"
        elif ev["stage"] == "search":
            msg = (f"search: {ev['phase']}" + (f" {ev['i']}/{ev['of']}" if "i" in ev else "")
                   + (f" {ev['config']}" if "config" in ev else ""))
        elif ev["stage"] == "simulate":
            msg = f"simulating {ev['ranks']} stages x {ev['microbatches']} micro-batches"
        else:
            msg = ev["stage"]
        status.update(escape(f"[plan] {msg}") + f"  [{time.perf_counter() - t0:.1f}s]")
    return on


def _breakdown(rep: dict) -> Table:
    p = rep["parallel"]
    cp = f" cp {p['cp']}" if p.get("cp", 1) > 1 else ""
    t = Table(title=f"{rep['job']}: {rep['gpus']:,} GPUs ({rep['nodes']:,} x {rep['node']}, {rep['network']}), "
                    f"tp {p['tp']}{cp} pp {p['pp']} dp {p['dp']}, {p['schedule']} v={p['virtual']} m={p['microbatches']}")
    t.add_column("")
    t.add_column("value", justify="right")
    sh = rep["shares"]
    t.add_row("iteration", f"{rep['iteration_s']:.3f} s (with NCCL's collectives: {rep['iteration_s_nccl']:.3f} s)")
    t.add_row("throughput", f"{rep['tokens_per_s']:,.0f} tokens/s")
    t.add_row("compute", f"{sh['compute']:.1%}")
    t.add_row("exposed TP communication", f"{sh['tp_comm']:.1%}")
    if sh.get("cp_comm"):
        t.add_row("exposed CP communication", f"{sh['cp_comm']:.1%}")
    t.add_row("exposed DP communication", f"{sh['dp_comm']:.1%}")
    t.add_row("bubbles", f"{sh['bubbles']:.1%} (per stage {min(s['bubble_share'] for s in rep['per_stage']):.1%}.."
                         f"{max(s['bubble_share'] for s in rep['per_stage']):.1%})")
    for typ, d in sorted(rep["bubbles_by_type"].items()):
        t.add_row(f"  bubbles {typ}", f"{d['count']} per iteration, median {d['median_s'] * 1e3:.2f} ms "
                                      f"({d['min_s'] * 1e3:.2f}..{d['max_s'] * 1e3:.2f})")
    for c in rep["collectives"]:
        t.add_row(f"{c['collective']} {c['size_bytes']:,} B on {c['group']['nodes'] * c['group']['per_node']} GPUs",
                  f"NCCL {c['nccl_algorithm']} {c['nccl_us']:.1f} us, flowride {c['ours_us']:.1f} us ({c['how']}; modelled)")
        if c.get("together"):
            g = c["together"]
            t.add_row(f"  with {g['groups'] - 1} more at once", f"contention priced: NCCL {g['nccl_alone_us']:.1f} -> "
                      f"{g['nccl_together_us']:.1f} us, flowride {g['ours_alone_us']:.1f} -> {g['joint_us']:.1f} us joint "
                      f"({g['joint_how']}; contention from the epoch model)")
    t.add_row("synthesis saves", f"{rep['synthesis_saves_s_per_iteration'] * 1e3:.2f} ms per iteration "
                                 f"({rep['synthesis_saves_share']:.2%})")
    h = rep["harvest"]
    if h["units_per_iteration"]:
        eff = "n/a" if h["efficiency"] is None else f"{h['efficiency']:.2f}"
        work = ", ".join(f"{v:,.0f} {k}" for k, v in h["units_per_iteration"].items())
        t.add_row("harvestable per iteration", f"{work}; {h['bubbles_used']} of {h['bubbles']} bubbles of a pipeline used; "
                                                f"efficiency {eff}")
        c = h["cost"]
        t.add_row("savings (FreeRide)", f"{c['savings']:+.4f} = overhead {c['overhead_term']:+.4f} + value {c['value_term']:+.4f}")
    mem = rep.get("memory")
    if mem:
        g = mem["per_gpu_gib"]
        t.add_row("memory per GPU", f"{g['total']:.1f} of {mem['device_gib']:g} GiB at stage {mem['peak_stage']}: params "
                                    f"{g['params']:.1f}, grads {g['grads']:.1f}, optimizer {g['optimizer']:.1f}, activations "
                                    f"{g['activations']:.1f} ({mem['in_flight_microbatches']:.2f} micro-batches in flight)")
    t.add_row("planned in", f"{rep['plan_seconds']:.2f} s")
    t.caption = "assumptions: " + "; ".join(rep["assumptions"])
    return t


def _search(a: argparse.Namespace, job, pricer) -> int:
    """``--search``: the fastest configurations of the job's model on ``--gpus`` GPUs, printed."""
    from flowride.plan.search import search, seconds_text

    refuse_unused(a, "without --search", "plan the one configuration (drop --search), or search without it",
                  sweep="--sweep", timeline="--timeline", stand_ins="--stand-ins")
    pricer.synth = bool(a.search_synth)  # NCCL's modelled collectives; synthesized ones for the top few only
    with err.status("[bold]plan[/bold] searching") as st:
        res = search(job, a.gpus or job.gpus, pricer, _progress(st))
    if a.json:
        write_json_atomic(a.json, {"job": job.name, **res.as_dict()}, indent=1)
    rows, ref = res.rows, res.reference
    cp = any(r["config"]["cp"] > 1 for r in rows)
    harvest = bool(job.harvest.tasks)
    synth = any("iteration_s_synth" in r for r in rows)
    t = Table(title=f"{job.name}: the fastest of {res.counts['enumerated']:,} configurations on {res.gpus:,} GPUs "
                    f"(global batch {res.global_batch:,} x {job.model.seq_len:,} tokens), NCCL's collectives")
    cols = ["#", "configuration", "iteration", "tokens/s", "bubbles", "memory (GiB)", "TP comm", "DP comm"]
    cols += ["CP comm"] * cp + ["harvest value"] * harvest + ["synthesized"] * synth
    for c in cols:
        t.add_column(c, justify="left" if c == "configuration" else "right")
    shown = rows[:res.top] + ([ref] if ref and "rank" in ref and ref["rank"] > res.top else [])
    last = rows[min(res.top, len(rows)) - 1] if rows else None
    for r in shown:
        cells = [str(r["rank"]), escape(r["label"]) + (" (the job's own)" if r["reference"] else ""),
                 seconds_text(r["iteration_s"]), f"{r['tokens_per_s']:,.0f}", f"{r['bubble_share']:.1%}",
                 f"{r['memory_peak_gib']:.1f} / {r['device_gib']:g}", f"{r['tp_comm_share']:.1%}", f"{r['dp_comm_share']:.1%}"]
        if cp:
            cells.append(f"{r['cp_comm_share']:.1%}")
        if harvest:
            cells.append(f"{r['harvest_value']:+.4f}")
        if synth:
            cells.append(seconds_text(r["iteration_s_synth"]) if "iteration_s_synth" in r else "")
        t.add_row(*cells, end_section=r is last)
    console.print(t)
    for i, text in enumerate(res.explanations):
        console.print(f"#{i + 1} wins: {escape(text)}", soft_wrap=True)
    if ref is None:
        console.print("the job's own configuration: not in the space", soft_wrap=True)
    elif "rank" in ref:
        console.print(f"the job's own configuration scaled to {res.gpus:,} GPUs ({escape(ref['label'])}) ranks "
                      f"{ref['rank']} of {len(rows)} priced", soft_wrap=True)
    else:
        console.print(f"the job's own configuration scaled to {res.gpus:,} GPUs ({escape(ref['label'])}) is refused: "
                      f"{escape(ref['refused'])}", soft_wrap=True)
    n = res.counts
    console.print(f"{n['enumerated']:,} configurations: {n['refused_by_rules']:,} refused by the job's rules, "
                  f"{n['refused_by_memory']:,} by memory, {n['pruned_by_bound']:,} pruned by the bound, {n['priced']:,} priced, "
                  f"in {res.wall_s:.1f} s", soft_wrap=True)
    for key, d in sorted(res.refusals.items(), key=lambda kv: -kv[1]["count"]):
        console.print(f"  {d['count']:,} x {escape(key)}, e.g. {escape(d['examples'][0])}", soft_wrap=True)
    if pricer.path is not None:
        console.print(f"collectives: {pricer.hits} from the cache, {pricer.solved} priced now (cache {pricer.path})", soft_wrap=True)
    return 0


def _calibrated(a: argparse.Namespace, job):
    """``--calibrate``: the job with its efficiency description fitted (printed as the job file writes it)."""
    from flowride.errors import InputError
    from flowride.plan import job_from_dict
    from flowride.plan.costs import calibrate
    from flowride.plan.efficiency import FIELDS

    if a.profile:
        raise InputError("--calibrate", "and --profile both replace the compute model", "give one of them")
    curve = calibrate(job, a.calibrate)
    data = job.model_dump()
    data["hardware"].update(mfu=None, efficiency={"source": curve.source, **{k: round(getattr(curve, k), 4) for k in FIELDS}})
    console.print("calibrated hardware.efficiency: " + escape(json.dumps(data["hardware"]["efficiency"])), soft_wrap=True)
    return job_from_dict(data, f"{a.job} calibrated to {a.calibrate}")


def cmd_plan(a: argparse.Namespace) -> int:
    from flowride.plan import DEFAULT_CACHE, Pricer, load_job, plan_job
    from flowride.plan.memory import check_memory
    from flowride.plan.sweep import parse_sweep, ranked_by_value, sweep

    job = load_job(a.job)
    if a.profile:  # a profile measured by flowride train / profile-bubbles replaces the FLOP model
        from flowride.plan import job_from_dict
        from flowride.plan.measured import PROFILE_KEYS, profile_from_run

        prof = profile_from_run(a.profile)
        data = job.model_dump()
        data["model"].update({k: prof[k] for k in PROFILE_KEYS})
        job = job_from_dict(data, f"{a.job} with the profile of {a.profile}")
    if a.calibrate:  # the efficiency description fitted to measured ops (or a train run), then the plan with it
        job = _calibrated(a, job)
    if a.no_synth:
        job = job.model_copy(update={"synthesis": job.synthesis.model_copy(update={"enabled": False})})
    if a.contention:
        job = job.model_copy(update={"synthesis": job.synthesis.model_copy(update={"contention": True})})
    if job.synthesis.contention and not job.synthesis.enabled:
        raise InputError("--contention", "prices a joint schedule, and synthesis is off", "leave out --no-synth (or synthesis.enabled false)")
    limit = a.synth_time_limit or job.synthesis.time_limit_s
    with as_options(calibration="--calibration", network_kind="--network-kind"):
        pricer = Pricer(cache=None if a.no_cache else (a.cache or DEFAULT_CACHE), synth=job.synthesis.enabled,
                        time_limit_s=limit, calibration=a.calibration, network_kind=a.network_kind)
    if a.search:
        return _search(a, job, pricer)
    refuse_unused(a, "with --search", "add --search", gpus="--gpus", search_synth="--search-synth")
    if a.sweep:
        axes = parse_sweep(a.sweep)
        with err.status("[bold]plan[/bold] sweeping") as st:
            points = sweep(job, axes, pricer, _progress(st))
        rows = [p.row() for p in points]
        if a.json:
            write_json_atomic(a.json, {"job": job.name, "sweep": axes, "points": rows}, indent=1)
        best_value = ranked_by_value(points)
        rank_v = {id(p): i + 1 for i, p in enumerate(best_value)}
        t = Table(title=f"{job.name}: {len(points)} configurations, best throughput first")
        for c in [*axes, "iteration (s)", "tokens/s", "bubbles", "harvest value", "rank with harvest", "synthesis saves"]:
            t.add_column(c, justify="right")
        for p, r in zip(points, rows, strict=True):
            cells = [str(p.overrides[k]) for k in axes]
            if p.plan is None:
                t.add_row(*cells, "skipped", escape(r["skipped"]), "", "", "", "")
                continue
            t.add_row(*cells, f"{r['iteration_s']:.3f}", f"{r['tokens_per_s']:,.0f}", f"{r['bubble_share']:.1%}",
                      f"{r['harvest_value']:+.4f}", str(rank_v[id(p)]), f"{r['synthesis_saves_share']:.2%}")
        console.print(t)
        return 0
    check_memory(job)  # one line, before any pricing, when the job does not fit its GPUs
    with err.status("[bold]plan[/bold]") as st:
        pl = plan_job(job, pricer, _progress(st))
    rep = pl.report()
    if a.json:
        write_json_atomic(a.json, rep, indent=1)
    if a.stand_ins:  # the plan's per-stage action times, for flowride train --rehearse --stand-in
        write_json_atomic(a.stand_ins, {"job": job.name, **pl.ours.stand_ins()}, indent=1)
    if a.timeline:
        from flowride.plan.draw import write_png

        write_png(pl.ours, pl.tp_action_s, a.timeline, f"{job.name}: one iteration of one pipeline ({rep['iteration_s']:.3f} s)")
    console.print(_breakdown(rep))
    if a.timeline:
        console.print(f"timeline written to {a.timeline}")
    if pricer.path is not None:
        console.print(f"collectives: {pricer.hits} from the cache, {pricer.solved} priced now (cache {pricer.path})", soft_wrap=True)
    return 0


def add_plan(sub) -> None:
    """``flowride plan``."""
    pl = sub.add_parser("plan", help="price a training job on a whole cluster: bubbles, collectives, harvesting, synthesis")
    pl.add_argument("job", help="the job file (JSON or YAML): model, parallel, hardware, harvest (see docs/plan.md)")
    pl.add_argument("--profile", metavar="RUN_DIR", help="per-stage times measured by a flowride train (or profile-bubbles) run "
                    "in RUN_DIR instead of the FLOP model")
    pl.add_argument("--calibrate", metavar="RUN_DIR|FILE", help="fit the compute efficiency description (hardware.efficiency) to "
                    "a JSON of measured ops or a flowride train run of the job's model, print it, and plan with it")
    calibration_args(pl)
    pl.add_argument("--sweep", nargs="+", metavar="KEY=V1,V2", help="rank configurations, e.g. pp=4,8,16 microbatches=8,16 schedule=1f1b,zbv recompute=none,full")
    pl.add_argument("--search", action="store_true", default=None, help="find the fastest (tp, pp, dp, cp, virtual, "
                    "microbatches, schedule, recompute) of the job's model that fits, the global batch kept (docs/plan.md)")
    pl.add_argument("--gpus", type=integer(1, None, "GPUs"), help="GPUs to search over (default: the job's tp*cp*pp*dp)")
    pl.add_argument("--search-synth", action="store_true", default=None,
                    help="re-price the search's top 3 with synthesized collectives (default: NCCL's modelled ones only)")
    pl.add_argument("--json", type=out_file, help="write the report (or the sweep's rows) as JSON here")
    pl.add_argument("--timeline", type=out_file, help="write a PNG of one iteration here")
    pl.add_argument("--stand-ins", type=out_file, help="write each stage's action times here, for a one-machine rehearsal "
                    "(flowride train --rehearse STAGE --stand-in FILE)")
    pl.add_argument("--cache", help="the collective cache file (default ~/.cache/flowride/plan-collectives.json)")
    pl.add_argument("--no-cache", action="store_true", help="price every collective afresh and keep nothing")
    pl.add_argument("--no-synth", action="store_true", help="NCCL's modelled algorithms only (no synthesis)")
    pl.add_argument("--contention", action="store_true", default=None,
                    help="price the DP groups that synchronise at once together on their nodes' shared fabric (joint schedule "
                         "vs NCCL's run together; the job file's synthesis.contention)")
    pl.add_argument("--synth-time-limit", type=SECONDS, help="seconds per distinct collective synthesized (default: the job's, 30)")
    pl.set_defaults(func=cmd_plan)
