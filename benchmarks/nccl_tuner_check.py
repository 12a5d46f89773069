"""Issue #36's target for ``flowride export --nccl-tuner``, rebased on the calibrated model of
NCCL (issue #49): on rail fabrics of DGX H100 (2, 4, 8 nodes) and DGX A100 (2, 4 nodes),
1 KB..1 GB, AllGather, ReduceScatter, AllReduce:

1. the CSV the export writes parses under the example plugin's rules (``check_tuner_csv`` on the
   written file, as written and with tiling required: no finding);
2. a modelled NCCL run with the CSV applied the way the plugin applies it (first usable matching
   row, else NCCL's default: ``apply_tuner_csv``) is never slower than NCCL's default choice at
   any swept size, in the calibrated model the export chooses by (``--calibration``, default the
   built-in fit for the node type), and every row is faster there by more than the model's error
   at its size (the export's gate). For information the same comparison in NCCL's own cost model,
   where NCCL's default is fastest by definition.

Also: where the two choices differ but the gain is within the model's error (kept as NCCL's
default), the largest such gain; and "as shipped": the example plugin hands NCCL one channel for
every call no row matches. That last table prices it in NCCL's own cost model, with one channel
taken as one NIC's bandwidth (a proxy: ``Machine(nics=1)``), against NCCL's default on its own
channel count.

    .venv/bin/python benchmarks/nccl_tuner_check.py
    .venv/bin/python benchmarks/nccl_tuner_check.py --fabrics dgx-h100:2 --sizes 1K:1M:x4
    .venv/bin/python benchmarks/nccl_tuner_check.py --calibration efa --between dgx-h100:2

Every time is modelled (NCCL's cost model, calibrated to published nccl-tests curves or NCCL's
own); wall time is this machine's. Exit status 1 when a target fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

from flowride.runtime.defaults import for_topology
from flowride.runtime.nccl_tuning import estimates
from flowride.sweep.nccl_tuner import (
    applied_at,
    apply_tuner_csv,
    plan_tuner,
    size_choice,
    write_tuner,
)
from flowride.sweep.nccl_tuner_rules import check_tuner_csv, parse_tuner_csv
from flowride.synth.nccl import machine
from flowride.topology import build_topology
from flowride.units import format_size, sweep_sizes

FABRICS = "dgx-h100:2,dgx-h100:4,dgx-h100:8,dgx-a100:2,dgx-a100:4"
COLLECTIVES = ("allgather", "reducescatter", "allreduce")


def one_channel_us(topo, coll: str, size: int, algorithm: str, protocol: str) -> float | None:
    """NCCL's cost model for (algorithm, protocol) with one NIC's bandwidth: the proxy for one channel."""
    m = dataclasses.replace(machine(topo), nics=1)
    for e in estimates(coll, m, size):
        if e.algorithm == algorithm and e.protocol.lower() == protocol:
            return e.time_us
    return None


def between(topo, plan, text: str, chosen) -> dict:
    """The CSV applied at 1.5x each swept size but the last (a size it covers with the smaller
    swept size's decision), timed there: worst applied/default per collective, calibrated."""
    rows = [r for _, r in parse_tuner_csv(text)[0]]
    out = {}
    for coll in COLLECTIVES:
        pts = [applied_at(rows, coll, size_choice(topo, coll, s * 3 // 2, chosen), plan.nodes, plan.gpus) for s in plan.sizes[:-1]]
        known = [(a.ratio, a) for a in pts if a.ratio is not None]
        out[coll] = dict(points=len(pts), untimed=len(pts) - len(known), worst=max(known, key=lambda x: x[0]) if known else None,
                         slower=sum(r > 1 for r, _ in known))
    return out


def run(node: str, nodes: int, sizes: list[int], out_dir: Path, spec: str | None, network: str, mid: bool = False) -> dict:
    t0 = time.perf_counter()
    topo = build_topology("fabric", node=node, nodes=nodes, network="rail")
    chosen = for_topology(topo, spec, network)
    plan = plan_tuner(topo, list(COLLECTIVES), sizes, calibration=chosen)
    path = out_dir / f"{node}x{nodes}.csv"
    write_tuner(plan, path)
    text = path.read_text()
    findings = check_tuner_csv(text) + check_tuner_csv(text, tiled=True)
    applied = apply_tuner_csv(plan, text)
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    mids = between(topo, plan, text, chosen) if mid else None
    mid_wall = time.perf_counter() - t1
    per = {}
    for coll in COLLECTIVES:
        pts = [a for a in applied if a.collective == coll]
        sc = {s.size: s for r in plan.ranges if r.collective == coll for s in r.sizes}
        ratios = [(a.ratio, a) for a in pts]
        missing = [a for r, a in ratios if r is None]
        known = [(r, a) for r, a in ratios if r is not None]
        # an override (a row with flowride's pick) must beat the model's error; NCCL's own pick written out need not
        gated = [a for a in pts if a.row is not None and sc[a.size].written and not (
            sc[a.size].error is not None and a.ratio is not None and 1 / a.ratio - 1 > sc[a.size].error)]
        unmatched = [a for a in pts if a.row is None or a.row.channels <= 1]  # a call left to the plugin's one channel
        held = [s for s in sc.values() if s.differs and not s.written]
        est = [(a.est_ratio, a) for a in pts if a.est_ratio is not None]
        shipped = []
        for a in pts:
            if a.row is None:
                one = one_channel_us(topo, coll, a.size, a.choice.algorithm, a.choice.protocol)
                if one is not None:
                    shipped.append((one / a.default_est_us, a))
        per[coll] = dict(points=len(pts), matched=sum(a.row is not None for a in pts), missing=missing, one_channel=len(unmatched),
                         worst=max(known, key=lambda x: x[0]) if known else None,
                         best=min(known, key=lambda x: x[0]) if known else None, gated=gated,
                         est_worst=max(est, key=lambda x: x[0]) if est else None,
                         shipped=max(shipped, key=lambda x: x[0]) if shipped else None, unmatched=len(shipped),
                         differs=plan.disagreements(coll), written=plan.written_sizes(coll), held=len(held),
                         held_max=max(held, key=lambda s: s.gain or 0.0) if held else None)
    return dict(name=f"{node} x{nodes}", ranks=plan.gpus, sizes=sizes, rows=len(plan.rows), findings=findings, per=per, wall=wall,
                csv=path, mids=mids, mid_wall=mid_wall, calibration=plan.calibration)


def _size(a) -> str:
    return format_size(a.size)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _per_collective(results: list[dict], title: str, columns: str, cells) -> None:
    """One markdown table: a row per fabric and collective, ``cells(per)`` its last columns."""
    print(f"\n{title}:\n")
    print(f"| fabric | collective | {columns} |")
    print("|---|---|" + "---|" * (columns.count("|") + 1))
    for r in results:
        for c in COLLECTIVES:
            print(f"| {r['name']} | {c} | {cells(r['per'][c])} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fabrics", default=FABRICS, help=f"NODE:COUNT,... on rail networks (default {FABRICS})")
    ap.add_argument("--sizes", default="1K:1G:x2", help="the sweep (default 1K:1G:x2, 21 sizes)")
    ap.add_argument("--coarse", action="append", default=[], metavar="NODE:COUNT=SIZES",
                    help="another sweep for one fabric, e.g. dgx-h100:8=1K:1G:x4")
    ap.add_argument("--calibration", help="as flowride export --calibration: default (the built-in fit), nccl, ib, efa, or a "
                    "profile file")
    ap.add_argument("--network-kind", default="ib", choices=("ib", "efa"), help="for the built-in calibration (default ib)")
    ap.add_argument("--between", default="", metavar="NODE:COUNT,...",
                    help="also apply the CSV at 1.5x each swept size on these fabrics (not a target: sizes it was not swept at)")
    ap.add_argument("--out-dir", help="keep the CSVs and side tables here (default: a temporary folder)")
    a = ap.parse_args(argv)
    default_sizes = sweep_sizes(sizes=a.sizes)
    coarse = {k: sweep_sizes(sizes=v) for k, v in (c.split("=", 1) for c in a.coarse)}
    tmp = None if a.out_dir else tempfile.TemporaryDirectory()
    out_dir = Path(a.out_dir or tmp.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    t_all = time.perf_counter()
    for spec in a.fabrics.split(","):
        node, count = spec.split(":")
        r = run(node, int(count), coarse.get(spec, default_sizes), out_dir, a.calibration, a.network_kind,
                spec in a.between.split(","))
        results.append(r)
        print(f"<!-- {r['name']}: {r['wall']:.1f} s -->", file=sys.stderr, flush=True)
    total = time.perf_counter() - t_all
    ok = True
    cmd = "python benchmarks/nccl_tuner_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"`{cmd.strip()}` ({time.strftime('%Y-%m-%d', time.gmtime())}, 2-core CPU, no GPU; {total:.1f} s wall in all)\n")
    print("| fabric | ranks | calibration | swept sizes | rows written | checker findings | sizes where picks differ "
          "(AG / RS / AR) | of them written: gain > model error (AG / RS / AR) | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        d = " / ".join(f"{r['per'][c]['differs']}" for c in COLLECTIVES)
        w = " / ".join(f"{r['per'][c]['written']}" for c in COLLECTIVES)
        s = r["sizes"]
        print(f"| {r['name']} | {r['ranks']} | {r['calibration']} | {format_size(s[0])}..{format_size(s[-1])} ({len(s)}) | "
              f"{r['rows']} | {len(r['findings'])} | {d} of {len(s)} | {w} | {r['wall']:.1f} |")
        ok &= not r["findings"]
    print("\nApplied like the example plugin, calibrated model (applied / NCCL's default; must be <= 1 at every size, every "
          "override's gain above the model's error at its size, and no call on one channel):\n")
    print("| fabric | collective | sizes with a row | calls on one channel | worst applied/default (size) | best speedup (size) | "
          "NCCL's own model: worst applied/default (size) | overrides not above the error | pass |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for c in COLLECTIVES:
            p = r["per"][c]
            w, b, e = p["worst"], p["best"], p["est_worst"]
            good = not p["missing"] and not p["gated"] and not p["one_channel"] and w is not None and w[0] <= 1.0
            ok &= good
            miss = f" ({len(p['missing'])} untimed)" if p["missing"] else ""
            print(f"| {r['name']} | {c} | {p['matched']} of {p['points']} | {p['one_channel']} | "
                  f"{'-' if w is None else f'{w[0]:.3f} ({_size(w[1])})'}{miss} | "
                  f"{'-' if b is None else f'{1 / b[0]:.2f}x ({_size(b[1])})'} | "
                  f"{'-' if e is None else f'{e[0]:.2f} ({_size(e[1])})'} | {len(p['gated'])} | {'yes' if good else 'NO'} |")
    def held(p: dict) -> str:
        h = p["held_max"]
        what = "-" if h is None else (f"{_pct(h.gain)} ({_size(h)}): {h.ours.label} vs {h.nccl.label}, error "
                                      f"{_pct(h.error) if h.error is not None else 'unknown'}")
        return f"{p['held']} | {what}"

    def shipped(p: dict) -> str:
        sh = p["shipped"]
        return f"{p['unmatched']} | {'-' if sh is None else f'{sh[0]:.2f} ({_size(sh[1])})'}"

    _per_collective(results, "Kept as NCCL's default though the choices differ (gain within the model's error, or the error unknown)",
                    "sizes kept | largest gain kept (size): pick vs default, model error", held)
    _per_collective(results, "As shipped (the plugin's one-channel default for calls no row matches), NCCL's own model, one "
                    "channel = one NIC (proxy)", "sizes with no row | worst one-channel default / NCCL's default (size)", shipped)
    if any(r["mids"] for r in results):
        print("\nBetween swept sizes (1.5x each swept size but the last; not part of the target), calibrated model:\n")
        print("| fabric | collective | sizes | worst applied/default (size) | sizes slower than NCCL's default | wall (s) |")
        print("|---|---|---|---|---|---|")
        for r in results:
            for c in COLLECTIVES if r["mids"] else ():
                m = r["mids"][c]
                w = m["worst"]
                un = f" ({m['untimed']} untimed)" if m["untimed"] else ""
                print(f"| {r['name']} | {c} | {m['points']} | {'-' if w is None else f'{w[0]:.3f} ({_size(w[1])})'} | "
                      f"{m['slower']}{un} | {r['mid_wall']:.1f} |")
    for r in results:
        for f in r["findings"][:10]:
            print(f"finding, {r['name']}: {f}", file=sys.stderr)
        for c in COLLECTIVES:
            for a in r["per"][c]["missing"][:5]:
                print(f"untimed, {r['name']} {c} {_size(a)}: {a.choice.label}", file=sys.stderr)
            for a in r["per"][c]["gated"][:5]:
                print(f"row not above the model's error, {r['name']} {c} {_size(a)}: {a.choice.label}", file=sys.stderr)
    if tmp:
        tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
