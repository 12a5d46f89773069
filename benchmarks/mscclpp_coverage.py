"""Issue #36's MSCCL++ targets, measured: what exports to an MSCCL++ execution plan, and which of
mscclpp's own example plans flowride reads, verifies and times.

(a) Every schedule ``flowride synth`` produces on the built-in and fabric topologies, for each
    collective and size, is lowered (``flowride.program.lower``) and written as an MSCCL++ plan
    in both protocols (``to_mscclpp``, which spreads it over thread blocks within the executor's
    tables, holds every plan to the executor's rules and the symbolic run and raises on a
    failure; "over limits" where no spread fits); the Simple plan is also written to a file and read
    back by ``verify_mscclpp`` for its timing (on a full mesh of the plan's GPUs, as for MSCCL
    XML, so it differs from the schedule's own finish on its topology).
(b) mscclpp's example plans (``test/execution-files`` and ``test/executor-tests/execution-plans``
    of a checkout, or any folder of plan JSON) are each verified and timed, or refused with the
    one-line reason ``flowride verify`` prints.

    .venv/bin/python benchmarks/mscclpp_coverage.py --examples /tmp/mscclpp_ex
    .venv/bin/python benchmarks/mscclpp_coverage.py --only ring,dgx1 --collectives allgather --sizes 1MB
    .venv/bin/python benchmarks/mscclpp_coverage.py --no-synth --examples /path/to/mscclpp/test/execution-files

Prints markdown tables; exits 1 when any case fails (a plan the checker or the run rejects, a
refusal that does not name what it refuses).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

from flowride.api import synthesize
from flowride.errors import InputError, InvalidSchedule
from flowride.program import lower, read_mscclpp, to_mscclpp, verify_mscclpp
from flowride.program.mscclpp_read import load_plan
from flowride.program.mscclpp_rules import check_limits
from flowride.topology.builtins import build_topology
from flowride.topology.fabrics import FabricSpec, fabric
from flowride.units import format_size, parse_size

TOPOLOGIES = {
    "ring": lambda: build_topology("ring", n=8),
    "dgx1": lambda: build_topology("dgx1"),
    "dgx2": lambda: build_topology("dgx2"),
    "h100": lambda: build_topology("h100"),
    "dgx-h100x2": lambda: fabric(FabricSpec("dgx-h100", 2)),
    "mi250x2": lambda: build_topology("mi250", chassis=2),
}
COLLECTIVES = ("allgather", "reducescatter", "allreduce", "alltoall")
# what a refusal of mscclpp's example plans must name: the feature flowride does not model
FEATURES = ("switch (NVLS) channels", "thread block groups", "pipeline ops", "semaphores", "reuse_resources", "reduce_op")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def synth_case(name: str, topo, coll: str, size: str, limit: float, tmp: Path, max_timed: int) -> dict:
    row = {"topology": name, "gpus": len(topo.gpus), "collective": coll, "size": size, "synth_s": None, "ops": None,
           "simple": "", "ll": "", "timed_us": None, "finish_us": None, "plan_epochs": None, "epochs": None, "notes": "",
           "failed": False, "limits": "-", "tbs": None, "export_s": None}
    t0 = time.perf_counter()
    try:
        out = synthesize(topo, coll, parse_size(size, "size"), "fast", "auto", limit)
    except InputError as e:  # flowride synth itself refuses: a skip, its reason named
        row["synth_s"] = time.perf_counter() - t0
        row["notes"] = f"skipped: synth refuses ({_one_line(e)})"
        return row
    row["synth_s"] = time.perf_counter() - t0
    row["finish_us"] = out.finish_time_s * 1e6
    row["epochs"] = out.sim.epochs
    rep = out.report()
    row["notes"] = f"{rep['chunks']} chunk(s), {rep['method']}"
    try:
        prog = lower(out.schedule)
    except InvalidSchedule as e:  # the schedule synth returned fails the simulator when lowered: a bug, not a skip
        row["notes"] += f"; FAIL: lower rejects synth's schedule ({_one_line(e)})"
        row["failed"] = True
        return row
    except InputError as e:  # e.g. relays outside a process group: synth's own export refuses it too
        row["notes"] += f"; skipped: not lowerable ({_one_line(e)})"
        return row
    simple = None
    for proto, key in (("Simple", "simple"), ("LL", "ll")):
        t1 = time.perf_counter()
        try:
            plan = to_mscclpp(prog, topo, proto=proto)  # spread over thread blocks within the executor's limits
            row[key] = "ok"
            if proto == "Simple":
                simple = plan
                row["ops"] = sum(len(tb["ops"]) for g in plan["gpus"] for tb in g["threadblocks"])
                row["tbs"] = max(len(g["threadblocks"]) for g in plan["gpus"])
                row["export_s"] = time.perf_counter() - t1
        except InputError as e:  # no spread fits the executor's tables: the target's miss, named
            row[key] = "over limits"
            row["notes"] += f"; {proto}: {_one_line(e)[:200]}"
        except ValueError as e:
            row[key] = "FAIL"
            row["failed"] = True
            row["notes"] += f"; {proto}: {_one_line(e)[:300]}"
    if simple is not None:
        try:
            path = tmp / f"{name}-{coll}-{size}.json"
            path.write_text(json.dumps(simple))
            sends = sum(st.op == "s" for g in prog.gpus for st in g.steps)
            row["limits"] = "; ".join(check_limits(load_plan(path))) or "ok"
            if sends > max_timed:  # the plan is still read back (rules, symbolic run, Program), only not placed
                read_mscclpp(path)
                row["notes"] += f"; read back, not timed: {sends} transfers, over --max-timed {max_timed}"
            else:
                v = verify_mscclpp(path)
                if v.sim is not None:
                    row["timed_us"] = v.sim.finish_time_s * 1e6
                    row["plan_epochs"] = v.sim.epochs
                else:
                    row["notes"] += f"; not timed: {v.unplaced}"
        except (InputError, InvalidSchedule) as e:
            row["failed"] = True
            row["notes"] += f"; verify: {_one_line(e)[:300]}"
    return row


def example_case(path: Path) -> dict:
    obj = json.loads(path.read_text())
    row = {"file": path.name, "collective": obj.get("collective", "?"), "ranks": len(obj.get("gpus", [])),
           "protocol": obj.get("protocol", "?"), "outcome": "", "failed": False}
    try:
        v = verify_mscclpp(path)
    except InvalidSchedule as e:
        row["outcome"], row["failed"] = f"INVALID: {_one_line(e)}", True
        return row
    except InputError as e:
        row["outcome"] = f"refused: {_one_line(e)}"
        row["failed"] = not any(f in e.problem for f in FEATURES)  # the reason itself, not the advice after it
        return row
    if v.limits:
        row["outcome"], row["failed"] = f"over the executor's limits: {'; '.join(v.limits)}", True
    elif v.sim is None:
        row["outcome"] = f"verified, not timed: {v.unplaced}"
    else:
        row["outcome"] = f"verified, timed {v.sim.finish_time_s * 1e6:.3f} us"
    return row


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def synth_table(rows: list[dict]) -> str:
    head = ("| topology | GPUs | collective | size | synth s | export s (Simple) | plan ops (Simple) | thread blocks/GPU | Simple ok "
            "| LL ok | executor limits (Simple) | plan timed (us; epochs) | schedule finish (us; epochs) | notes |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        lines.append(f"| {r['topology']} | {r['gpus']} | {r['collective']} | {r['size']} | {r['synth_s']:.1f} | "
                     f"{_us(r['export_s'])} | {r['ops'] if r['ops'] is not None else '-'} | {r['tbs'] or '-'} | {r['simple'] or '-'} | {r['ll'] or '-'} | {r.get('limits', '-')} | "
                     f"{_us(r['timed_us'])}; {r['plan_epochs'] or '-'} | {_us(r['finish_us'])}; {r['epochs'] or '-'} | {r['notes'].replace('|', '/')} |")
    return "\n".join(lines)


def example_table(rows: list[dict]) -> str:
    lines = ["| file | collective | ranks | protocol | outcome |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['file']} | {r['collective']} | {r['ranks']} | {r['protocol']} | {r['outcome'].replace('|', '/')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--time-limit", type=float, default=10.0, help="seconds per synthesis (default 10)")
    p.add_argument("--sizes", default="1KB,1MB,1GB", help="comma list of sizes (default 1KB,1MB,1GB)")
    p.add_argument("--only", help="comma list of topologies: " + ", ".join(TOPOLOGIES))
    p.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma list of collectives")
    p.add_argument("--examples", type=Path, help="a folder of MSCCL++ plan JSON (mscclpp's example plans) for part (b)")
    p.add_argument("--max-timed", type=int, default=10000,
                   help="time (verify_mscclpp) plans of at most this many transfers; larger ones are read back, not placed "
                        "(placing a program on a full mesh grows faster than linearly; default 10000)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--no-synth", action="store_true", help="part (b) only")
    a = p.parse_args(argv)
    names = a.only.split(",") if a.only else list(TOPOLOGIES)
    for n in names:
        if n not in TOPOLOGIES:
            p.error(f"--only: unknown topology {n!r}; choose from {', '.join(TOPOLOGIES)}")
    sizes = [format_size(parse_size(s.strip(), "--sizes")) for s in a.sizes.split(",")]
    colls = [c.strip() for c in a.collectives.split(",")]
    t0 = time.perf_counter()
    failed = 0
    rows: list[dict] = []
    erows: list[dict] = []
    if not a.no_synth:
        with tempfile.TemporaryDirectory() as tmp:
            for n in names:
                topo = TOPOLOGIES[n]()
                for coll in colls:
                    for size in sizes:
                        try:
                            r = synth_case(n, topo, coll, size, a.time_limit, Path(tmp), a.max_timed)
                        except Exception as e:  # a crash is a failure to report, not the end of the run
                            traceback.print_exc(file=sys.stderr)
                            r = {"topology": n, "gpus": len(topo.gpus), "collective": coll, "size": size, "synth_s": 0.0,
                                 "ops": None, "simple": "", "ll": "", "timed_us": None, "finish_us": None,
                                 "plan_epochs": None, "epochs": None, "limits": "-", "tbs": None, "export_s": None, "notes": f"CRASH {type(e).__name__}: {_one_line(e)[:300]}", "failed": True}
                        rows.append(r)
                        print(f"  {n} {coll} {size}: {r['simple'] or '-'}/{r['ll'] or '-'} {r['synth_s']:.1f}s {r['notes'][:120]}",
                              file=sys.stderr, flush=True)
        failed += sum(r["failed"] for r in rows)
        print(f"## (a) synthesized schedules as MSCCL++ plans (time limit {a.time_limit:g} s per synthesis)\n")
        print(synth_table(rows))
        print(f"\n{sum(r['simple'] == 'ok' and r['ll'] == 'ok' for r in rows)} of {len(rows)} cases export in both protocols; "
              f"{sum('skipped' in r['notes'] for r in rows)} skipped; {sum(r['failed'] for r in rows)} failed; "
              f"{sum('over limits' in (r['simple'], r['ll']) for r in rows)} refused as over the MSCCL++ executor's limits "
              f"(no spread over thread blocks fits); {sum(r.get('limits', '-') not in ('ok', '-') for r in rows)} written over them\n")
    if a.examples:
        files = sorted(a.examples.glob("*.json"))
        erows = [example_case(f) for f in files]
        failed += sum(r["failed"] for r in erows)
        print("## (b) mscclpp's example plans\n")
        print(example_table(erows))
        print(f"\n{sum(r['outcome'].startswith('verified') for r in erows)} verified, "
              f"{sum(r['outcome'].startswith('refused') for r in erows)} refused, {sum(r['failed'] for r in erows)} failed\n")
    if a.json:
        a.json.write_text(json.dumps({"synth": rows, "examples": erows}, indent=1))
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
