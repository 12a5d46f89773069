"""Synthesis at scale against the published TE-CCL runs, on this machine.

Three tables, each printed as it runs and, with ``--write-docs``, written into docs/benchmarks.md
(between markers, with the machine and the command):

- ``--reference``: every row of benchmarks/data/teccl_published_ndv2_2chassis.csv (NDv2, 2
  chassis, the TE-CCL compat variant in which GPU 0 is a bufferless switch): our finish time and
  solver time beside the published ones, their ratios, and the lower bound.
- ``--dgx2``: every row of benchmarks/data/teccl_published_dgx2_2chassis_slow.csv (DGX2, 2
  chassis, slow preset, the published model: copying switches), and our fast preset of each. A ``Fast_Early_Stop``
  row is the same instance as its ``Fast`` row (we never stop early), so one run serves both.
- ``--scale``: AllGather and AlltoAll on dgx2 (2 and 4 chassis), ndv2 (4 and 8 chassis),
  torus(8,8) and torus(16,16), at 1 MB and 1 GB; ``--sizes`` adds every size from 1 KB to 1 GB
  on dgx2 x 2 and ndv2 x 4.
- ``--huge``: AllGather on a 32x32 torus (1,024 GPUs) and AlltoAll on a 16x32 torus (512
  GPUs), at 1 MB and 1 GB, against their bounds (the issue's 10-minute targets).
- ``--ablation``: the MILP search's speed-ups one at a time (flowride.synth.options.Speedups) on
  instances where the packed trees do not already meet the lower bound.
- ``--memory``: peak memory of MILP runs against their largest probe (the memory guard's rate).

Every case runs as its own ``flowride synth`` process, so its wall time and peak memory are its
own. Solver time here is that process's whole synthesis (bounds, baselines, trees, every solve,
pruning, verification), from the report's ``wall_time_s``.

    python benchmarks/teccl_compare.py --reference --scale --sizes --ablation --memory [--time-limit 600] [--write-docs]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Published TE-CCL figures (the TE-CCL artifact, Gurobi on a large server), shipped with the repo:
# NDv2 2-chassis in its three presets, DGX2 2-chassis slow preset (switches modelled as copying).
DATA = Path(__file__).resolve().parent / "data"
REFERENCES = {
    "ndv2": (DATA / "teccl_published_ndv2_2chassis.csv", ["-t", "ndv2", "--chassis", "2", "--teccl-compat"]),
    "dgx2": (DATA / "teccl_published_dgx2_2chassis_slow.csv", ["-t", "dgx2", "--chassis", "2", "--teccl-compat"]),
}
DOCS = ROOT / "docs" / "benchmarks.md"
SCALE = [("dgx2", 2), ("dgx2", 4), ("ndv2", 4), ("ndv2", 8), ("mi250", 4), ("h100", 8), ("torus", (8, 8)), ("torus", (16, 16))]
# the largest instances, one collective each (10 minutes per case by the targets)
HUGE = [("torus", (32, 32), "allgather"), ("torus", (16, 32), "alltoall")]
SIZES = ["1KB", "4KB", "16KB", "64KB", "256KB", "1MB", "4MB", "16MB", "64MB", "256MB", "1GB"]
# (topology args, collective, size, epoch, chunks): where the trees do not meet the bound, the MILP works
ABLATION = [
    (["-t", "mi250"], "allgather", "1MB", "fast", 1),
    (["-t", "mi250"], "allgather", "1MB", "fast", 2),
    (["-t", "mi250"], "allgather", "1GB", "fast", 1),
    (["-t", "mi250"], "allgather", "1MB", "slow", 2),
    (["-t", "torus", "--rows", "4", "--cols", "4"], "allgather", "1GB", "fast", 2),
    (["-t", "dgx1"], "allgather", "1MB", "fast", 2),
]
VARIANTS = {
    "plain": "none",
    "+bounds": "bounds",
    "+incumbent": "incumbent",
    "+warm start": "warm_start",
    "+symmetry": "symmetry",
    "+parallel": "parallel",
    "default": "default",
}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, CPU only (no GPU)"


def run_synth(args: list[str], time_limit: float) -> dict:
    """One ``flowride synth`` in its own process; its report plus the process's wall time."""
    with tempfile.TemporaryDirectory() as d:
        rep_path = Path(d) / "r.json"
        cmd = [sys.executable, "-m", "flowride.cli", "synth", *args, "--time-limit", str(time_limit), "--report", str(rep_path)]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=time_limit * 3 + 300)
        wall = time.perf_counter() - t0
        if p.returncode != 0 or not rep_path.exists():
            return {"error": (p.stderr or p.stdout).strip().splitlines()[-1] if (p.stderr or p.stdout) else f"exit {p.returncode}", "process_s": wall}
        rep = json.loads(rep_path.read_text())
        rep["process_s"] = wall
        return rep


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return out


def reference(time_limit: float, only: str | None, which: str) -> list[str]:
    """Every published row of ``which`` (ndv2 or dgx2) beside ours: finish and solver-time ratios,
    method, gap to the bound. For DGX2 (slow rows only published) each row is followed by our
    fast preset of the same instance: our fast figure beside our slow one and the bound."""
    path, targs = REFERENCES[which]
    rows = list(csv.DictReader(open(path)))
    header = ["collective", "preset", "size", "finish us", "pub finish us", "finish ratio", "solver s", "pub solver s",
              "solver ratio", "bound us", "gap to bound", "epochs", "pub epochs", "method", "status"]
    out, fast_rows, cache = [], [], {}
    for r in rows:
        coll = r["collective"].lower()
        if only and coll != only:
            continue
        epoch = "slow" if r["variant"] == "Slow" else "fast"
        key = (coll, epoch, r["size"])
        if key not in cache:
            cache[key] = run_synth([*targs, "-c", coll, "-s", r["size"], "--epoch", epoch], time_limit)
        rep = cache[key]
        pf, ps = float(r["collective_finish_time_us"]), float(r["solver_time_s"])
        if "error" in rep:
            row = [coll, r["variant"], r["size"], "error", pf, "", "", ps, "", "", "", "", r["epochs_required"], "", rep["error"]]
        else:
            row = [coll, r["variant"], r["size"], rep["finish_time_us"], pf, rep["finish_time_us"] / pf, rep["wall_time_s"], ps,
                   rep["wall_time_s"] / ps, rep["lower_bound_us"], rep["finish_time_us"] / rep["lower_bound_us"] - 1,
                   rep["epochs"], int(r["epochs_required"]), rep["method"],
                   rep["status"] + ("" if rep["verified"] else " UNVERIFIED")]
        out.append(row)
        print("\t".join(fmt(v) for v in row), flush=True)
        if which == "dgx2" and epoch == "slow" and "error" not in rep:
            fast = run_synth([*targs, "-c", coll, "-s", r["size"], "--epoch", "fast"], time_limit)
            if "error" in fast:
                frow = [coll, r["size"], "error", rep["finish_time_us"], pf, "", "", "", "", fast["error"]]
            else:
                frow = [coll, r["size"], fast["finish_time_us"], rep["finish_time_us"], pf,
                        fast["finish_time_us"] / rep["finish_time_us"], fast["lower_bound_us"],
                        fast["finish_time_us"] / fast["lower_bound_us"], fast["wall_time_s"], fast["method"] + ", " + fast["status"]]
            fast_rows.append(frow)
            print("\tfast\t" + "\t".join(fmt(v) for v in frow), flush=True)
    ok = [x for x in out if isinstance(x[5], float)]
    lines = table(header, out)
    if ok:
        ratios = [x[8] for x in ok]
        lines.append("")
        lines.append(f"Rows: {len(out)}; finish ratio (ours / published) max {max(x[5] for x in ok):.4g}, "
                     f"median {statistics.median(x[5] for x in ok):.4g}; solver-time ratio median {statistics.median(ratios):.3g}, "
                     f"max {max(ratios):.3g}; rows finishing later than published: {sum(1 for x in ok if x[5] > 1 + 1e-9)}.")
    if fast_rows:
        lines += ["", "The fast preset of the same instances (published: slow preset only):", ""]
        lines += table(["collective", "size", "our fast us", "our slow us", "pub slow us", "fast / our slow", "bound us",
                        "fast / bound", "fast solver s", "fast method, status"], fast_rows)
        good = [x for x in fast_rows if isinstance(x[5], float)]
        if good:
            lines.append("")
            lines.append(f"Fast later than our slow: {sum(1 for x in good if x[5] > 1 + 1e-9)} of {len(good)} rows.")
    return lines


def topo_args(name: str, arg) -> list[str]:
    if name == "torus":
        return ["-t", "torus", "--rows", str(arg[0]), "--cols", str(arg[1])]
    return ["-t", name, "--chassis", str(arg)]


def label(name: str, arg) -> str:
    return f"torus({arg[0]},{arg[1]})" if name == "torus" else f"{name} x{arg}"


def scale(time_limit: float, cases: list[tuple], sizes: list[str], epoch: str,
          collectives: tuple[str, ...] = ("allgather", "alltoall")) -> list[str]:
    header = ["topology", "GPUs", "collective", "size", "method", "finish us", "bound us", "bound kind", "finish / bound",
              "baseline us", "solver s", "peak MB", "status"]
    out = []
    for name, arg in cases:
        for coll in collectives:
            for size in sizes:
                rep = run_synth([*topo_args(name, arg), "-c", coll, "-s", size, "--epoch", epoch], time_limit)
                if "error" in rep:
                    row = [label(name, arg), "", coll, size, "error", "", "", "", "", "", rep["process_s"], "", rep["error"]]
                else:
                    row = [label(name, arg), rep["gpus"], coll, size, rep["method"], rep["finish_time_us"], rep["lower_bound_us"],
                           rep["lower_bound_kind"], rep["ratio_to_lower_bound"], rep["baseline_us"], rep["wall_time_s"],
                           rep["peak_rss_mb"], rep["status"] + ("" if rep["verified"] else " UNVERIFIED")]
                out.append(row)
                print("\t".join(fmt(v) for v in row), flush=True)
    return table(header, out)


def ablation(time_limit: float) -> list[str]:
    header = ["instance", *VARIANTS.keys()]
    rows = []
    for targs, coll, size, epoch, chunks in ABLATION:
        name = f"{' '.join(a for a in targs[1:2])}{'' if len(targs) == 2 else ' 4x4'} {coll} {size} {epoch} c{chunks}"
        row = [name]
        for _variant, flag in VARIANTS.items():
            rep = run_synth([*targs, "-c", coll, "-s", size, "--epoch", epoch, "--chunks", str(chunks), "--method", "milp",
                             "--speedups", flag], time_limit)
            if "error" in rep:
                row.append(f"error: {rep['error']}")
            else:
                mark = "" if rep["status"] == "optimal" else f" ({rep['status']})"
                row.append(f"{rep['epochs']} ep, {rep['wall_time_s']:.2f} s, {len(rep['probes'])} probes{mark}")
            print(name, _variant, row[-1], flush=True)
        rows.append(row)
    return table(header, rows)


MEMORY = [
    (["-t", "mi250"], "1MB", "fast", 2),
    (["-t", "torus", "--rows", "4", "--cols", "4"], "1GB", "fast", 2),
    (["-t", "ndv2", "--chassis", "2"], "1MB", "fast", 4),
    (["-t", "dgx1"], "1GB", "fast", 8),
]


def memory(time_limit: float) -> list[str]:
    """Peak memory of MILP runs against their largest probe: the measured bytes per column
    behind the memory guard (flowride.synth.budget.BYTES_PER_COLUMN). The guard itself is lifted
    (--memory-limit 64) so that what it would refuse can still be measured."""
    from flowride.synth.budget import BASE_BYTES, BYTES_PER_COLUMN

    header = ["instance", "largest probe columns", "peak MB", "KB per column above base", "guard estimate MB"]
    rows = []
    for targs, size, epoch, chunks in MEMORY:
        rep = run_synth([*targs, "-c", "allgather", "-s", size, "--epoch", epoch, "--chunks", str(chunks), "--method", "milp",
                         "--speedups", "bounds", "--memory-limit", "64"], time_limit)
        name = f"{' '.join(targs[1:])} allgather {size} {epoch} c{chunks}"
        if "error" in rep:
            rows.append([name, "", "", "", rep["error"]])
            continue
        cols = max((p["columns"] for p in rep["probes"]), default=0)
        per = (rep["peak_rss_mb"] * 2**20 - BASE_BYTES) / max(cols, 1) / 1024
        rows.append([name, cols, rep["peak_rss_mb"], f"{per:.3g}" if per > 0 else "below base", (BASE_BYTES + BYTES_PER_COLUMN * cols) / 2**20])
        print("\t".join(fmt(v) for v in rows[-1]), flush=True)
    return table(header, rows)


def write_docs(section: str, lines: list[str], command: str) -> None:
    """Replace the section between its markers in docs/benchmarks.md (appended if missing)."""
    begin, end = f"<!-- teccl_compare:{section} -->", f"<!-- /teccl_compare:{section} -->"
    body = [begin, f"Command: `{command}` ({time.strftime('%Y-%m-%d')}).", f"Machine: {machine()}.", "", *lines, end]
    text = DOCS.read_text()
    if begin in text and end in text:
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + "\n".join(body) + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(body) + "\n"
    DOCS.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", action="store_true", help="every published NDv2 2-chassis row")
    ap.add_argument("--dgx2", action="store_true", help="every published DGX2 2-chassis slow row, and our fast preset of each")
    ap.add_argument("--only", choices=["allgather", "alltoall"], help="reference rows of one collective")
    ap.add_argument("--scale", action="store_true", help="the large topologies at 1 MB and 1 GB")
    ap.add_argument("--sizes", action="store_true", help="dgx2 x2 and ndv2 x4, every size 1 KB to 1 GB")
    ap.add_argument("--huge", action="store_true", help="32x32 torus AllGather and 16x32 torus AlltoAll at 1 MB and 1 GB")
    ap.add_argument("--ablation", action="store_true", help="the MILP speed-ups one at a time")
    ap.add_argument("--memory", action="store_true", help="peak memory of MILP runs per column (the memory guard)")
    ap.add_argument("--topologies", default="",
                    help='semicolon-separated labels of --scale rows to run, e.g. "dgx2 x4;torus(16,16)" (default: all)')
    ap.add_argument("--epoch", default="fast", help="epoch preset of the scale tables")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds per case")
    ap.add_argument("--write-docs", action="store_true", help="write the tables into docs/benchmarks.md")
    a = ap.parse_args()
    command = "python benchmarks/teccl_compare.py " + " ".join(sys.argv[1:])
    print(f"machine: {machine()}", flush=True)
    done = []
    if a.reference:
        done.append(("reference", reference(a.time_limit, a.only, "ndv2")))
    if a.dgx2:
        done.append(("dgx2", reference(a.time_limit, a.only, "dgx2")))
    if a.scale:
        wanted = {t.strip() for t in a.topologies.split(";") if t.strip()}
        unknown = wanted - {label(n, arg) for n, arg in SCALE}
        if unknown:
            ap.error(f"--topologies: unknown {sorted(unknown)}; known: {[label(n, arg) for n, arg in SCALE]}")
        cases = [(n, arg) for n, arg in SCALE if not wanted or label(n, arg) in wanted]
        done.append(("scale", scale(a.time_limit, cases, ["1MB", "1GB"], a.epoch)))
    if a.sizes:
        done.append(("sizes", scale(a.time_limit, [("dgx2", 2), ("ndv2", 4)], SIZES, a.epoch)))
    if a.huge:
        lines = []
        for name, arg, coll in HUGE:
            part = scale(a.time_limit, [(name, arg)], ["1MB", "1GB"], a.epoch, (coll,))
            lines += part if not lines else part[2:]
        done.append(("huge", lines))
    if a.ablation:
        done.append(("ablation", ablation(a.time_limit)))
    if a.memory:
        done.append(("memory", memory(a.time_limit)))
    for section, lines in done:
        print(f"\n## {section}\n" + "\n".join(lines))
        if a.write_docs:
            write_docs(section, lines, command)


if __name__ == "__main__":
    main()
