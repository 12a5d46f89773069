"""The flowride argument parser: every subcommand, option and help text in one place, each
subcommand bound to the function of its group module that runs it."""

from __future__ import annotations

import argparse

from flowride.argtypes import COUNT, PORT, SECONDS, THREADS, integer, number, out_dir, out_file
from flowride.cli.common import Parser
from flowride.cli.demo import cmd_demo
from flowride.cli.harvest import cmd_manager, cmd_profile_task, cmd_tasks
from flowride.cli.run import cmd_run
from flowride.cli.synth import (
    cmd_export,
    cmd_show,
    cmd_synth,
    cmd_topologies,
    cmd_topology,
    cmd_verify,
)
from flowride.cli.train import cmd_profile_bubbles, cmd_schedule_show, cmd_train
from flowride.sizes import MAX_CHUNKS, MAX_GPUS, MAX_MICROBATCHES, MAX_STAGES


def _topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", "-t", required=True, help="built-in name (see `flowride topologies`) or a topology JSON file")
    p.add_argument("--chassis", type=integer(1, 64, "chassis"), help="chassis count (ndv2, dgx2, mi250)")
    p.add_argument("--teccl-compat", action="store_true", default=None,
                   help="the published TE-CCL model (ndv2, dgx2): every switch copies and a switch->GPU hop costs only its alpha; "
                        "ndv2 x2 also models GPU 0 as a bufferless switch. Default: the physical model")
    p.add_argument("--switch-copy", choices=("on", "off"),
                   help="whether every switch can replicate a chunk (on: NVLS-class multicast; off: forwarding only). "
                        "Default: each preset's physical model (only h100's NVSwitch copies)")
    p.add_argument("--n", type=integer(2, MAX_GPUS, "GPUs"), help="GPU count (ring, full, switch)")
    p.add_argument("--rows", type=integer(1, MAX_GPUS, "rows"), help="rows (mesh, torus)")
    p.add_argument("--cols", type=integer(1, MAX_GPUS, "columns"), help="columns (mesh, torus)")
    p.add_argument("--bandwidth", type=number(1e-3, 1e6, what="GB/s"), help="GB/s per link (generic topologies)")
    p.add_argument("--alpha-us", type=number(0, 1e6, what="microseconds"), help="link latency in microseconds (generic topologies)")


def _train_args(p: argparse.ArgumentParser, iters: int) -> None:
    p.add_argument("--stages", "-p", type=integer(1, MAX_STAGES, "stages"), default=2, help="pipeline stages (one process each)")
    p.add_argument("--microbatches", "-m", type=integer(1, MAX_MICROBATCHES, "micro-batches"), default=8)
    p.add_argument("--schedule", default="1f1b", help="builtin engine: gpipe, 1f1b, interleaved, zbh1; torch engine: "
                   "gpipe, 1f1b, interleaved1f1b, loopedbfs, interleavedzb, zbv, dualpipev")
    p.add_argument("--engine", default="auto", help="torch (torch.distributed.pipelining), builtin (flowride's instruction "
                   "lists) or auto (default: torch for the schedules torch has, builtin for interleaved and zbh1)")
    p.add_argument("--chunks", "-v", type=integer(1, 16, "chunks"), default=None, help="model chunks per stage (interleaved; default 2 there, else 1)")
    p.add_argument("--model", default="tiny", help="tiny, small or medium")
    p.add_argument("--iters", type=integer(1, 10**7, "iterations"), default=iters)
    p.add_argument("--microbatch-size", type=integer(1, 65536, "samples"), default=4)
    p.add_argument("--seed", type=integer(0, 2**63 - 1, "a seed"), default=0)
    p.add_argument("--lr", type=number(0, 100, lo_open=True, what="a learning rate"), default=1e-3)
    p.add_argument("--data", help="a text file to train on (bytes as tokens); default: generated tokens")
    p.add_argument("--run-dir", type=out_dir, default="runs/train", help="where ranks write their logs and records")
    p.add_argument("--timeout", type=SECONDS, default=120.0, help="seconds a rank may wait on a peer before the run fails")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=THREADS, default=1, help="torch threads per rank")
    p.add_argument("--min-bubble", type=number(0, 60, what="seconds"), default=0.002, help="seconds: waits predicted shorter are not announced")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="flowride", description="Collective schedule synthesis and pipeline-bubble harvesting.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    s = sub.add_parser("synth", help="synthesize a verified collective schedule")
    _topology_args(s)
    s.add_argument("--collective", "-c", default="allgather", help="allgather, alltoall, reducescatter or allreduce")
    s.add_argument("--size", "-s", required=True, help="buffer per GPU (AllGather output, ReduceScatter input), e.g. 16MB, 1GiB")
    s.add_argument("--epoch", default="fast", help="epoch length: fast, slow or seconds")
    s.add_argument("--chunks", type=integer(1, MAX_CHUNKS, "chunks"), default=1, help="chunks per source block")
    s.add_argument("--time-limit", type=SECONDS, help="seconds for the whole search; the best schedule so far is returned")
    s.add_argument("--mip-gap", type=number(0, 1, what="a ratio"), help="relative MIP gap at which a probe may stop")
    s.add_argument("--threads", type=THREADS, help="solver threads")
    s.add_argument("--method", default="auto", help="milp, lp (AlltoAll), astar or trees (AllGather-like), or auto (by instance size)")
    s.add_argument("--memory-limit", type=number(0, 1e4, lo_open=True, what="GiB"), default=8.0, help="GiB the MILP may use; a larger one is refused up front")
    s.add_argument("--speedups", default="default",
                   help="MILP search speed-ups: default, none, all, or a comma list of incumbent, bounds, warm_start, symmetry, parallel")
    s.add_argument("--objective", choices=("makespan", "weighted"), default="makespan",
                   help="AlltoAll LP route: makespan (search the horizon, then integral polish; default) or weighted "
                        "(the published TE-CCL objective: one LP rewarding delivery at epoch t by 1/(t+1))")
    s.add_argument("--out", "-o", type=out_file, help="write the schedule JSON here")
    s.add_argument("--report", type=out_file, help="write the report JSON here")
    s.set_defaults(func=cmd_synth)

    v = sub.add_parser("verify", help="replay a schedule (JSON) or an MSCCL algorithm (XML) and check it")
    v.add_argument("schedule")
    v.set_defaults(func=cmd_verify)

    ex = sub.add_parser("export", help="write a schedule as an MSCCL algorithm XML")
    ex.add_argument("schedule")
    ex.add_argument("--msccl", type=out_file, help="the XML file to write")
    ex.add_argument("--unfused", action="store_true", help="only s, r, rrc and nop steps (what ASTRA-sim's converter reads)")
    ex.add_argument("--proto", default="Simple", choices=["Simple", "LL128", "LL"], help="MSCCL protocol attribute")
    ex.set_defaults(func=cmd_export)

    sh = sub.add_parser("show", help="draw a schedule: link-utilisation PNG and/or Chrome trace")
    sh.add_argument("schedule", help="schedule JSON or MSCCL XML")
    sh.add_argument("--png", type=out_file, help="write a PNG of link utilisation over epochs")
    sh.add_argument("--trace", type=out_file, help="write a Chrome-trace JSON (one track per link and per GPU)")
    sh.set_defaults(func=cmd_show)

    rn = sub.add_parser("run", help="execute a schedule over torch.distributed and check it against torch's collective")
    rn.add_argument("schedule", help="schedule JSON or MSCCL XML")
    rn.add_argument("--size", "-s", help="buffer per rank (default: the schedule's size)")
    rn.add_argument("--repeats", type=COUNT, default=5, help="timed repeats (median reported)")
    rn.add_argument("--warmup", type=integer(0, 10**6, "repeats"), default=1, help="untimed repeats first")
    rn.add_argument("--timeout", type=SECONDS, default=120.0, help="seconds before a silent or hung rank fails the run")
    rn.add_argument("--barrier-per-epoch", action="store_true", help="synchronise all ranks after every epoch (default: point-to-point dependencies only)")
    rn.add_argument("--mode", default="auto", choices=["auto", "dataflow", "ordered", "grouped"], help="how messages are issued (auto: dataflow on gloo, grouped on nccl)")
    rn.add_argument("--report", type=out_file, help="write the report JSON here")
    rn.set_defaults(func=cmd_run)

    t = sub.add_parser("topologies", help="list the built-in topologies")
    t.set_defaults(func=cmd_topologies)

    tp = sub.add_parser("topology", help="build a topology and optionally save it as JSON")
    _topology_args(tp)
    tp.add_argument("--out", "-o", type=out_file, help="write the topology JSON here")
    tp.set_defaults(func=cmd_topology)

    tr = sub.add_parser("train", help="pipeline-parallel training that reports its bubbles")
    _train_args(tr, 20)
    tr.add_argument("--report", type=out_file, help="write the report JSON here")
    tr.add_argument("--timeline", type=out_file, help="write a timeline PNG here")
    tr.add_argument("--trace", type=out_file, help="write a Chrome trace JSON here")
    tr.add_argument("--bubble-port", type=PORT, help="UDP port on 127.0.0.1 to publish bubble events to")
    tr.add_argument("--bubble-profile", help="bubble profile JSON (from profile-bubbles) for predicted bubble ends")
    tr.add_argument("--side-tasks", help="comma-separated side tasks to run in the bubbles (e.g. pagerank,cnn,image)")
    tr.add_argument("--harvest", default="freeride", help="none, freeride, naive or priority (with --side-tasks)")
    tr.add_argument("--baseline-report", help="a none-mode train report to measure overhead against (else one is run first)")
    tr.add_argument("--price-main", type=number(0, 1e9, lo_open=True, what="a price"), default=None, help="training job price per hour (default: stages x 1)")
    tr.add_argument("--price-ref", type=number(0, 1e9, lo_open=True, what="a price"), default=1.0, help="reference device price per hour (default 1)")
    tr.add_argument("--paired-block", type=integer(0, 10**6, "iterations"), default=2,
                    help="harvesting alternates on/off in randomized blocks of this many iterations (0: separate runs only)")
    tr.add_argument("--budget", type=number(0, 100, what="percent"), default=2.0, help="the training owner's overhead budget in percent (default 2)")
    tr.set_defaults(func=cmd_train)

    mg = sub.add_parser("manager", help="inspect, restart or stop a run's side-task manager (works while training runs)")
    mg.add_argument("action", choices=("status", "restart", "stop"))
    mg.add_argument("--run-dir", default="runs/train", help="the training run's directory")
    mg.set_defaults(func=cmd_manager)

    pt = sub.add_parser("profile-task", help="run a side task alone: step time, throughput, peak memory")
    pt.add_argument("task")
    pt.add_argument("--params", help="task parameters as a JSON object")
    pt.add_argument("--steps", type=COUNT, default=30, help="steps to time (at most)")
    pt.add_argument("--seconds", type=SECONDS, default=5.0, help="seconds to run (at most)")
    pt.add_argument("--out", "-o", type=out_file, help="write the profile JSON here")
    pt.set_defaults(func=cmd_profile_task)

    tk = sub.add_parser("tasks", help="side tasks in a run's durable store (works while training runs)")
    tsub = tk.add_subparsers(dest="action", required=True, parser_class=Parser)
    ts = tsub.add_parser("submit")
    ts.add_argument("task")
    ts.add_argument("--params")
    ts.add_argument("--priority", type=integer(-1000, 1000, "a priority"), default=0, help="higher runs first")
    ts.add_argument("--memory-mb", type=integer(1, 10**7, "MB"), help="memory cap of the task")
    tsub.add_parser("list")
    for name in ("show", "cancel"):
        tx = tsub.add_parser(name)
        tx.add_argument("id", type=integer(1, 2**62, "a task id"))
    for sp in tsub.choices.values():
        sp.add_argument("--run-dir", type=out_dir, default="runs/train", help="the training run's directory")
    tk.set_defaults(func=cmd_tasks)

    pb = sub.add_parser("profile-bubbles", help="run a few iterations and write a bubble profile")
    _train_args(pb, 6)
    pb.add_argument("--out", "-o", type=out_file, default="bubble-profile.json")
    pb.set_defaults(func=cmd_profile_bubbles)

    ss = sub.add_parser("schedule-show", help="print a pipeline schedule's instructions as a grid")
    ss.add_argument("schedule", help="gpipe, 1f1b, interleaved or zbh1")
    ss.add_argument("--stages", "-p", type=integer(1, MAX_STAGES, "stages"), default=4)
    ss.add_argument("--microbatches", "-m", type=integer(1, MAX_MICROBATCHES, "micro-batches"), default=8)
    ss.add_argument("--chunks", "-v", type=integer(1, 16, "chunks"), default=None)
    ss.set_defaults(func=cmd_schedule_show)

    d = sub.add_parser("demo", help="a short showcase: synthesis on built-in topologies, then harvesting bubbles")
    d.add_argument("--out-dir", type=out_dir, default="runs/demo", help="where the harvest demo writes its runs and timeline")
    d.add_argument("--no-harvest", action="store_true", help="only the synthesis part")
    d.set_defaults(func=cmd_demo)
    return p
