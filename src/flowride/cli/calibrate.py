"""``flowride calibrate`` (the model fitted to a cluster's own nccl-tests logs) and ``flowride
predict`` (what nccl-tests would print on a cluster, by the calibrated model of NCCL)."""

from __future__ import annotations

import argparse
import json

from flowride.argtypes import number, out_file
from flowride.cli.common import (
    as_options,
    calibration_args,
    chosen_calibration,
    console,
    err,
    topology_args,
)
from flowride.cli.sweep import SweepTable, _f, _time, sweep_args, sweep_of, sweep_option
from flowride.errors import InputError

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")


def _cluster(a: argparse.Namespace):
    """The topology the options name, its NCCL machine, and (node type, nodes) when it is a fabric."""
    from flowride.cli.topology import load_topology
    from flowride.synth.nccl import machine

    topo = load_topology(a)
    fab = topo.params.get("fabric") or {}
    return topo, machine(topo), fab.get("node"), int(fab.get("nodes", 1))


def cmd_predict(a: argparse.Namespace) -> int:
    from flowride.runtime.predict import predict

    sizes = sweep_of(a) or []
    if not sizes:
        raise InputError("-b/--sizes", "no size given", "give -b 1K -e 1G (-f 2) or --sizes 1M,16M")
    topo, m, node, nodes = _cluster(a)
    chosen = chosen_calibration(a, topo)
    with as_options(algorithm="--algorithm", size=sweep_option(a)):
        rows = predict(a.collective, m, sizes, chosen.calibration, a.algorithm)
    errs = [chosen.error_at(r.bytes) for r in rows]
    out = [{"bytes": r.bytes, "time_us": r.time_us, "algbw_GBps": r.algbw_GBps, "busbw_GBps": r.busbw_GBps,
            "algorithm": r.algorithm, "protocol": r.protocol, "model_error": e, "modelled": True} for r, e in zip(rows, errs, strict=True)]
    if a.synth:
        _add_synth(a, topo, chosen, out)
    if a.json:
        print(json.dumps(out))
        return 0
    cols = [("", "size", "(B)"), ("modelled", "time", "(us)"), ("modelled", "algbw", "(GB/s)"), ("modelled", "busbw", "(GB/s)"),
            ("NCCL", "algorithm", ""), ("NCCL", "protocol", ""), ("model", "error", "")]
    if a.synth:
        cols += [("flowride", "time", "(us)"), ("flowride", "protocol", ""), ("flowride", "speedup", "")]
    t = SweepTable(f"{a.collective} on {topo.name} ({m.ranks} GPUs): modelled (NCCL's cost model, {chosen.name}); "
                   "model error: median |predicted/measured - 1| of the fit near that size"
                   + ("; flowride: its schedule priced by the same model as the runtime would run it" if a.synth else ""),
                   cols, left=frozenset({"algorithm", "protocol"}))
    for r in out:
        cells = [str(r["bytes"]), _time(r["time_us"]), _f(r["algbw_GBps"], ".2f"), _f(r["busbw_GBps"], ".2f"), r["algorithm"],
                 r["protocol"], "-" if r["model_error"] is None else f"{100 * r['model_error']:.0f}%"]
        if a.synth:
            cells += [_time(r["flowride_us"]), r["flowride_protocol"], f"{r['speedup_vs_nccl']:.2f}"]
        t.add_row(*cells)
    t.print()
    if chosen.borrowed:
        console.print(f"note: {node} has no measured curve; the figures of {chosen.borrowed} stand in", soft_wrap=True)
    return 0


def _add_synth(a: argparse.Namespace, topo, chosen, out: list[dict]) -> None:
    """flowride's schedule at each size, priced by the same calibrated model (api/priced.py)."""
    from flowride.api import synthesize

    with err.status("[bold]predict[/bold] --synth") as st, as_options(time_limit="--time-limit"):
        for i, r in enumerate(out):
            st.update(f"[predict --synth] size {i + 1}/{len(out)}: {r['bytes']} B (synthesizing, then pricing)")
            o = synthesize(topo, a.collective, r["bytes"], "fast", chunks="auto", time_limit=a.time_limit, calibration=chosen)
            h = o.headline
            if h is None or h.flowride is None:
                raise InputError("--synth", f"flowride's schedule at {r['bytes']} B was not priced ({h.why_unpriced if h else 'no model'})",
                                 "give smaller sizes or a smaller topology")
            r.update({"flowride_us": h.flowride.time_us, "flowride_protocol": h.flowride.protocol,
                      "flowride_epoch_model_us": o.finish_time_s * 1e6, "speedup_vs_nccl": r["time_us"] / h.flowride.time_us})


def cmd_calibrate(a: argparse.Namespace) -> int:
    from flowride.runtime.calibrate import calibrate
    from flowride.runtime.nccl_tests import read_nccl_tests
    from flowride.runtime.profile import write_profile

    _topo, m, node, nodes = _cluster(a)
    if node is None:
        raise InputError("--topology", "calibrate needs a cluster of a node type", "give -t fabric --node NODE --nodes N")
    runs = []
    for path in a.nccl_tests:
        runs += read_nccl_tests(path, a.collective)
    with err.status("[bold]calibrate[/bold] fitting"), as_options(network_kind="--network-kind"):
        prof, notes = calibrate(runs, node, nodes, m.nics, m.nic_GBps * 8 if nodes > 1 else None, a.network_kind)
    t = SweepTable(f"{nodes} x {node}: the calibrated model against {len(prof.fitted_on)} log(s) (out-of-place time; "
                   f"fitted: {', '.join(prof.fields_fitted)})",
                   [("", "collective", ""), ("", "size", "(B)"), ("measured", "time", "(us)"), ("modelled", "time", "(us)"),
                    ("", "ratio", ""), ("NCCL", "algorithm", ""), ("NCCL", "protocol", "")],
                   left=frozenset({"collective", "algorithm", "protocol"}))
    for r in prof.fit:
        t.add_row(r["collective"], str(r["bytes"]), _time(r["measured_us"]), _time(r["predicted_us"]), f"{r['ratio']:.3f}",
                  r["algorithm"], r["protocol"])
    t.print()
    s = prof.summary
    console.print(f"median |predicted/measured - 1|: {pct(s['median_err_ge_1MiB'])} at >= 1 MiB, {pct(s['median_err_lt_1MiB'])} "
                  f"below; worst ratio {s['worst_ratio']:.3f} ({s['worst_at']})", soft_wrap=True)
    for n in notes:
        console.print(f"note: {n}", soft_wrap=True, markup=False)
    write_profile(prof, a.out)
    console.print(f"profile written to {a.out}")
    return 0


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def add_calibrate(sub) -> None:
    """``flowride calibrate`` and ``flowride predict``."""
    c = sub.add_parser("calibrate", help="fit the cost model to your cluster's nccl-tests logs and write a profile")
    c.add_argument("--nccl-tests", nargs="+", required=True, metavar="LOG",
                   help="nccl-tests (or rccl-tests) output files, as printed: several collectives and runs each")
    c.add_argument("--collective", "-c", choices=COLLECTIVES, help="the collective of logs that do not name it "
                   "(no command line in the text)")
    topology_args(c)
    c.add_argument("--network-kind", choices=("ib", "efa"), default="ib",
                   help="the network's kind, for the fields the logs do not settle: ib (InfiniBand/RoCE, default) or efa (AWS EFA)")
    c.add_argument("--out", "-o", type=out_file, required=True, help="write the profile (JSON) here; --calibration reads it")
    c.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("predict", help="what nccl-tests would print on a cluster: NCCL's time, algorithm and protocol, modelled")
    topology_args(p)
    p.add_argument("--collective", "-c", required=True, choices=COLLECTIVES)
    sweep_args(p, "predict")
    calibration_args(p)
    p.add_argument("--algorithm", choices=("ring", "tree", "nvls", "nvls_tree", "pat"),
                   help="force NCCL's algorithm, as NCCL_ALGO does (default: NCCL's choice by its model)")
    p.add_argument("--synth", action="store_true", help="also synthesize flowride's schedule at each size and price it by the "
                   "same calibrated model as the runtime would run it, with its speedup over the NCCL prediction")
    p.add_argument("--time-limit", type=number(0.1, 86400, what="seconds"), default=20.0,
                   help="--synth: seconds of synthesis per size (default 20)")
    p.set_defaults(func=cmd_predict)
