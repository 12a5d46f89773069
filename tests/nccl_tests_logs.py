"""nccl-tests / rccl-tests output built from numbers, for the parser's tests.

Each function formats figures the way the harness's printf calls do (NVIDIA/nccl-tests
src/util.cu and src/common.cu; ROCm/rccl-tests src/common.cu), so the tests meet the real shapes
without carrying anyone's log. Bandwidths are computed as the harness computes them (each test's
GetBw) from a size and a time; the times below are published measurements
(shared/reference/nccl_measured: aws_p5_1node_allreduce, aws_p4de_2node_allreduce,
amd_mi300x_1node_allreduce_rccl), taken as figures.

Styles: ``nccl`` is nccl-tests 2.19 (version and program lines, widths kept by dropping
decimals, ``%6g`` #wrong); ``nccl213`` is nccl-tests 2.13 to 2.17 (``%6.2f`` bandwidths, ``%5g``
#wrong, ``[0x1b]`` bus ids); ``rccl`` is rccl-tests (no Group, ``0000:0c:00.0`` bus ids, a
``rccl-tests: Version`` line, optional in-place-only tables).
"""

# ruff: noqa: UP031 - the harness's own printf formats, written as printf formats so they read alike

from __future__ import annotations

from dataclasses import dataclass

# (size bytes, out-of-place us, in-place us)
H100_8 = [(8, 12.9, 12.87), (64, 14.48, 14.37), (512, 16.19, 15.52), (4096, 16.76, 16.06), (32768, 18.78, 18.09),
          (262144, 20.27, 20.13), (2097152, 43.45, 43.39), (16777216, 124.0, 123.4), (134217728, 592.8, 592.1),
          (1073741824, 4253.0, 4255.4), (8589934592, 31289.0, 31294.0)]
A100_2x8 = [(8, 164.3, 163.3), (64, 161.0, 160.6), (512, 162.3, 161.5), (4096, 169.4, 170.0), (32768, 224.6, 223.7),
            (262144, 238.2, 235.5), (2097152, 432.6, 397.4), (16777216, 1191.8, 1190.4), (134217728, 3912.9, 3932.8),
            (1073741824, 26217.0, 26194.0)]
MI300X_8 = [(8, 19.28, 17.24), (64, 18.59, 20.95), (512, 23.21, 23.42), (4096, 13.72, 13.33), (32768, 13.94, 13.59),
            (262144, 17.46, 16.88), (2097152, 36.68, 35.8), (16777216, 149.9, 156.3), (134217728, 800.3, 808.3),
            (1073741824, 5990.7, 5996.4), (8589934592, 47617.0, 47584.0)]

BINARY = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
          "alltoall": "alltoall", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv",
          "gather": "gather", "scatter": "scatter", "hypercube": "hypercube", "alltoallv": "alltoallv"}
WORD = {"int8": 1, "uint8": 1, "half": 2, "bfloat16": 2, "int32": 4, "float": 4, "int64": 8, "double": 8}
PER_RANK = {"allgather", "reducescatter", "alltoall", "gather", "scatter", "hypercube", "alltoallv"}
NO_INPLACE_CHECK = {"alltoall", "alltoallv", "sendrecv"}


def factor(c: str, n: int) -> float:
    """busbw / algbw per nccl-tests' GetBw (written out here so the tests do not use the parser's)."""
    return {"allreduce": 2 * (n - 1) / n}.get(c, (n - 1) / n if c in PER_RANK - {"hypercube"} else 1.0)


@dataclass
class Row:
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    time: float
    algbw: float
    busbw: float
    wrong: int | None
    ip_time: float | None = None
    ip_algbw: float | None = None
    ip_busbw: float | None = None
    ip_wrong: int | None = None


def rows_for(c: str, n: int, points, dtype: str = "float", op: str = "sum", root: int = 0, check: bool = True,
             wrong: int = 0) -> list[Row]:
    """The rows a binary prints for ``points`` (size asked, out-of-place us, in-place us), sizes
    rounded as the harness rounds them (per-rank counts to 16-byte multiples)."""
    ws = WORD[dtype]
    out = []
    for asked, t, ti in points:
        count = asked // ws
        if c in PER_RANK:
            param = (count // n) & ~(16 // ws - 1)
            size = param * n * ws
        else:
            param, size = count, count * ws
        base = param * ws * (n - 1 if c == "hypercube" else n if c in PER_RANK else 1)
        redop = op if c in ("allreduce", "reducescatter", "reduce", "sendrecv") else "" if c in ("hypercube", "alltoallv") else "none"
        r = -1 if c not in ("broadcast", "reduce", "gather", "scatter") else root
        f = factor(c, n)
        a, ai = base / 1e3 / t, base / 1e3 / ti
        out.append(Row(size, param, dtype, redop, r, t, a, a * f, wrong if check else None, ti, ai, ai * f,
                       (wrong if check and c not in NO_INPLACE_CHECK else None)))
    return out


def float_str(value: float, width: int) -> str:
    """nccl-tests 2.19's getFloatStr: two decimals, fewer to stay ``width`` wide, then %e."""
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        s = fmt % (width, value)
        if len(s) <= width:
            return s
    return ("%*.1e" if width >= 7 else "%*.0e") % (width, value)


def old_time_str(t: float) -> str:
    """nccl-tests before 2.19 and rccl-tests: %7.0f from 10 ms, %7.1f from 100 us, else %7.2f."""
    return "%7.0f" % t if t >= 10000 else "%7.1f" % t if t >= 100 else "%7.2f" % t


def group(t: float, a: float, b: float, w: int | None, style: str, per_iter: bool = False) -> str:
    if style == "nccl":
        s = "  %7s  %6s  %6s" % (float_str(t, 7), float_str(a, 6), float_str(b, 6))
        s += "  %6g" % w if w is not None else "    N/A"
        if per_iter:
            s += "  %7s  %7s  %7s  %7s" % (float_str(t * 0.95, 7), float_str(t * 1.2, 7), float_str(t * 1.1, 7), "3.21")
        return s
    s = "  %7s  %6.2f  %6.2f" % (old_time_str(t), a, b)
    return s + ("  %5g" % w if w is not None else "  %5s" % "N/A")


def format_row(r: Row, style: str = "nccl", in_place_only: bool = False, per_iter: bool = False,
               timestamp: str | None = None) -> str:
    s = "%12li  %12li  %8s  %6s  %6s" % (r.size, r.count, r.dtype, r.redop, "%6i" % r.root)
    if not in_place_only:
        s += group(r.time, r.algbw, r.busbw, r.wrong, style, per_iter)
    if r.ip_time is not None:
        s += group(r.ip_time, r.ip_algbw, r.ip_busbw, r.ip_wrong, style, per_iter)
    if timestamp:
        s += "%21s" % timestamp
    return s


def device_lines(n: int, hosts: int, style: str, gpu: str, procs_per_host: int | None = None) -> list[str]:
    per_host = n // hosts
    out = []
    for rank in range(n):
        host, dev = f"node{rank // per_host:02d}", rank % per_host
        pid = 40000 + rank
        if style == "nccl":
            out.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s" % (rank, 0, pid, host, dev, 0, 0x18 + dev, 0, gpu))
        elif style == "nccl213":
            out.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s" % (rank, 0, pid, host, dev, 0x18 + dev, gpu))
        else:
            out.append("#   Rank %2d Pid %6d on %10s device %2d [0000:%02x:00.0] %s" % (rank, pid, host, dev, 0x0c + dev, gpu))
    return out


def table_header(style: str, in_place_only: bool = False, per_iter: bool = False, timestamps: bool = False,
                 cputime: bool = False) -> list[str]:
    t = "cputime" if cputime else "time"
    if in_place_only:
        return ["#",
                "# %10s  %12s  %8s  %6s  %6s           in-place          " % ("", "", "", "", ""),
                "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s" % ("size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong"),
                "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s" % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")]
    cols = [t, "algbw", "busbw", "#wrong"] + (["i_min", "i_max", "i_p99", "i_cv%"] if per_iter else [])
    units = ["(us)", "(GB/s)", "(GB/s)", ""] + (["(us)", "(us)", "(us)", "(%)"] if per_iter else [])
    label = "out-of-place (+ per-iteration)      in-place (+ per-iteration)" if per_iter else \
        "out-of-place                       in-place          "
    ts = ["%19s" % "timestamp"] if timestamps else []
    tsu = ["%19s" % "%Y-%m-%d %H:%M:%S"] if timestamps else []
    return ["#", "# %10s  %12s  %8s  %6s  %6s           %s" % ("", "", "", "", "", label),
            "# %10s  %12s  %8s  %6s  %6s  " % ("size", "count", "type", "redop", "root") + "  ".join("%7s" % c for c in cols * 2 + ts),
            "# %10s  %12s  %8s  %6s  %6s  " % ("(B)", "(elements)", "", "", "") + "  ".join("%7s" % c for c in units * 2 + tsu)]


def make_log(c: str, n: int, points, *, style: str = "nccl", hosts: int = 1, check: bool = True,
             dtype: str = "float", op: str = "sum", gpu: str = "NVIDIA H100 80GB HBM3", command: str | None = "auto",
             devices: bool = True, header: bool = True, footer: bool = True, in_place_only: bool = False,
             per_iter: bool = False, timestamps: bool = False, program_line: bool = True, rows: list[Row] | None = None,
             wrong: int = 0, cputime: bool = False) -> str:
    """A whole run's output as a user would save it (the command line first, when given)."""
    rows = rows if rows is not None else rows_for(c, n, points, dtype, op, check=check, wrong=wrong)
    binary = BINARY[c] + "_perf"
    out = []
    if command == "auto":
        out.append(f"$ mpirun -np {n} -N {n // hosts} ./build/{binary} -b 8 -e 8G -f 2 -g 1 -c {int(check)}")
    elif command:
        out.append(command)
    if header:
        if style == "nccl":
            out.append("# nccl-tests version 2.19.6 nccl-headers=22907 nccl-library=22907")
            if program_line:
                out.append(f"# Collective test starting: {binary}")
        unalign = " unalign: 0" if style == "nccl" else ""
        out.append(f"# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 "
                   f"agg iters: 1 validation: {int(check)} graph: 0{unalign}")
        out.append("#")
        if style == "rccl":
            out.append("rccl-tests: Version develop:a7809b3")
        if devices:
            out.append("# Using devices")
            out += device_lines(n, hosts, style, gpu)
    out += table_header(style, in_place_only, per_iter, timestamps, cputime)
    for r in rows:
        out.append(format_row(r, style, in_place_only, per_iter, "2026-07-10 12:00:01" if timestamps else None))
    if footer:
        if style == "rccl" and check:
            out.append("# Errors with asterisks indicate errors that have exceeded the maximum threshold.")
        out.append("# %-20s : %d %s" % ("Out of bounds values", 0, "OK"))
        avg = sum(r.busbw for r in rows) / len(rows) if rows else 0.0
        out.append("# %-20s : %g %s" % ("Avg bus bandwidth", avg, ""))
        out.append("#")
        if style == "nccl":
            out.append(f"# Collective test concluded: {binary}")
            out.append("#")
            out.append("")
    return "\n".join(out) + "\n"
