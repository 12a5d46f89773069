"""Reading nccl-tests and rccl-tests output: the measurements users already have.

Every cluster team runs nccl-tests (or ROCm's rccl-tests, the same harness on HIP), so their
standard output is the one record of what a cluster's collectives really cost. ``flowride
calibrate`` fits the runtime model to it; this module only turns the text into numbers, exactly
as printed, and says which collective on how many ranks produced them.

The format, as the harness prints it (NVIDIA/nccl-tests src/common.cu and src/util.cu, 2.0 to
2.19; ROCm/rccl-tests src/common.cu):

* an optional preamble (``# nccl-tests version ...``, ``# Collective test starting: X_perf``),
  then ``# nThread 1 nGpus 8 minBytes 8 maxBytes ... step: 2(factor) warmup iters: 5 ...``;
* ``# Using devices`` and one ``#  Rank  3 Group  0 Pid 123 on host device  3 [bus] NAME`` line
  per rank (rccl-tests and nccl-tests before 2.13: no ``Group``);
* three header lines: group labels (``out-of-place`` / ``in-place``), column names, units;
* one row per size: ``size count type redop root`` then, per group, ``time algbw busbw #wrong``
  (time in us, bandwidths in GB/s; ``N/A`` in #wrong under ``-c 0``, and always in AlltoAll's and
  SendRecv's in-place group). Newer nccl-tests may add per-iteration columns (``-I``) and a
  timestamp (``-S``); 2024 builds had a ``copybw`` column; rccl-tests ``-O 0`` prints the in-place
  group alone; before 2.13 the check column was ``error`` (a max difference, not a count) and
  the prefix columns varied by collective. The column-name line is read, so all of these parse;
* a footer: ``# Out of bounds values : 0 OK``, ``# Avg bus bandwidth : 12.3``.

The ``size`` column is ``max(send, receive)`` bytes per rank: the buffer for AllReduce, Broadcast,
Reduce and SendRecv (count = size / word size); the gathered output for AllGather and Gather, the
reduced input for ReduceScatter, the whole send buffer for AlltoAll and Scatter (count = size /
(word size x ranks)). ``algbw`` is size / time except for HyperCube (x (n-1)/n, as AllGather and
ReduceScatter had it before nccl-tests 2.9); ``busbw`` is algbw x :func:`busbw_factor`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from flowride.errors import InputError
from flowride.schedule import metrics

__all__ = ["COLLECTIVES", "Device", "Measurement", "TestRun", "busbw_factor", "canonical_collective", "parse_nccl_tests",
           "read_nccl_tests"]

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "alltoallv", "broadcast", "reduce",
               "sendrecv", "gather", "scatter", "hypercube")
MAX_LOG_BYTES = 256 * 2**20  # a log with NCCL_DEBUG=INFO on a large job runs to tens of MiB
_PER_RANK_COUNT = {"allgather", "reducescatter", "alltoall", "alltoallv", "gather", "scatter", "hypercube"}
_ROOTED = {"broadcast", "reduce", "gather", "scatter"}
_OP_NAMED = {"allreduce", "reducescatter", "reduce", "sendrecv"}  # print the -o op in redop
_NONE_OP = {"allgather", "alltoall", "alltoallv", "broadcast", "gather", "scatter"}  # print "none"
_BLANK_OP = {"hypercube", "alltoallv"}  # print an empty redop (rccl-tests' alltoallv too)
_FACTOR_OF_N = {"allreduce", "allgather", "reducescatter", "alltoall", "alltoallv", "gather", "scatter"}
_NO_INPLACE_CHECK = {"alltoall", "alltoallv", "sendrecv"}  # in-place #wrong is always N/A
_WORD = {"int8": 1, "uint8": 1, "char": 1, "f8e4m3": 1, "f8e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
         "half": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "int": 4, "float": 4,
         "int64": 8, "uint64": 8, "double": 8}
_BINARY = re.compile(r"(?<![\w])(all_reduce|all_gather|reduce_scatter|alltoallv|alltoall|broadcast|reduce|sendrecv|"
                     r"gather|scatter|hypercube)_perf")
_BINARY_OF = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter"}
_RANK = re.compile(r"#\s+Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*)$")
_SETTING = re.compile(r"([A-Za-z_][A-Za-z_ ]*?):?\s+(-?\d+)(?:\((factor|bytes)\))?")
_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s*\d+:\s|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s)")
_INT = re.compile(r"-?\d+$")
_LIB = re.compile(r"\b(RCCL|NCCL) version (\S+)")
_AMD = re.compile(r"\b(AMD|Instinct|Radeon|gfx\d)", re.I)
_ROW_FIX = "correct the line, or cut the log before it"
_LOG_FIX = "give the saved standard output of an nccl-tests or rccl-tests binary"
_PREFIX_COLS = ("size", "count", "type", "redop", "root")


@dataclass(frozen=True)
class Measurement:
    """One table row. Figures are as printed (rounded by the harness), never recomputed, so a fit
    sees what the user sees. ``time_us`` and friends are the out-of-place group, or the in-place
    group where the table has no other (rccl-tests ``-O 0``: then ``TestRun.out_of_place`` is
    False and the ``in_place_*`` fields repeat them)."""

    collective: str
    size_bytes: int  # the size column: max(send, receive) bytes per rank (see the module docstring)
    count: int  # elements per rank as the call is made (size / word size, or / ranks too)
    dtype: str
    redop: str  # "none" where the collective takes no op; "" where the column is blank or absent
    root: int  # -1 where the collective has no root or the column is absent
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: int | None  # None where the column shows N/A (-c 0), or is the pre-2.13 'error' column
    in_place_time_us: float | None
    in_place_algbw_GBps: float | None
    in_place_busbw_GBps: float | None
    in_place_wrong: int | None
    line: int  # 1-based line in its source


@dataclass(frozen=True)
class Device:
    """A ``#  Rank`` line: which GPU on which host held a rank (hosts are what tell NIC hops)."""

    rank: int
    host: str
    device: int
    name: str


@dataclass(frozen=True)
class TestRun:
    """One run of one binary: its header, devices and table. ``ranks`` and ``hosts`` count the
    communicator of rank 0 (``NCCL_TESTS_SPLIT_MASK`` splits the job into groups); ``hosts`` is 0
    and ``devices`` empty where the log shows no device lines (ranks then come from the table)."""

    __test__ = False  # a name pytest would otherwise try to collect where tests import it

    source: str
    runtime: str  # "nccl" or "rccl"
    collective: str
    ranks: int
    hosts: int
    devices: tuple[Device, ...]
    settings: dict  # header values by name (nThread, nGpus, minBytes, ..., version, program, ...)
    rows: tuple[Measurement, ...]
    avg_busbw_GBps: float | None
    truncated: bool  # no footer: the log ended (or the run died) mid-table
    out_of_place: bool = True  # False: the table has only in-place columns (rccl-tests -O 0)
    line: int = 0  # where the run starts in its source


def canonical_collective(name: str, field_name: str = "collective") -> str:
    """``all_reduce``, ``AllReduce``, ``all-reduce``, ``all_reduce_perf_mpi`` all name one thing."""
    key = re.sub(r"_perf.*$", "", name.strip().lower()).replace("_", "").replace("-", "")
    if key not in COLLECTIVES:
        raise InputError(field_name, f"{name!r} is not an nccl-tests collective", "one of: " + ", ".join(COLLECTIVES))
    return key


def busbw_factor(collective: str, ranks: int) -> float:
    """busbw / algbw as nccl-tests computes it (doc/PERFORMANCE.md and each test's GetBw): what
    each rank's link must carry relative to the buffer, so busbw compares with link speed."""
    c = canonical_collective(collective)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise InputError("ranks", f"{ranks!r} is not a rank count", "give a whole number >= 1")
    if c in ("allreduce", "allgather", "reducescatter", "alltoall"):  # the collectives flowride schedules: one rule
        return metrics.busbw_factor(c, ranks)
    if c in _FACTOR_OF_N:
        return (ranks - 1) / ranks
    return 1.0  # broadcast, reduce, sendrecv, hypercube


def read_nccl_tests(path: str | Path, collective: str | None = None) -> list[TestRun]:
    """The runs in a log file. Undecodable bytes become U+FFFD rather than an error: a log is
    often the merged output of many processes, and one odd byte in an INFO line says nothing
    about the table."""
    name, p = str(path), Path(path)
    try:
        if p.is_dir():
            raise InputError(name, "is a directory", _LOG_FIX)
        with open(p, "rb") as f:
            data = f.read(MAX_LOG_BYTES + 1)
    except OSError as e:
        raise InputError(name, f"cannot read it: {e.strerror or e}", _LOG_FIX) from None
    if len(data) > MAX_LOG_BYTES:
        raise InputError(name, f"is over the {MAX_LOG_BYTES >> 20} MiB limit", "cut it to the runs you want read")
    return parse_nccl_tests(data.decode("utf-8", errors="replace"), name, collective)


@dataclass(frozen=True)
class _Layout:
    """The columns of a table, from its column-name line (or the modern default)."""

    prefix: tuple[str, ...] = _PREFIX_COLS
    groups: tuple[tuple[str, ...], ...] = (("time", "algbw", "busbw", "#wrong"),) * 2
    out_of_place: bool = True  # the first group is out-of-place
    timestamp: bool = False  # two trailing tokens: date and time
    cputime: bool = False

    @property
    def width(self) -> int:
        return len(self.prefix) + sum(map(len, self.groups)) + 2 * self.timestamp


@dataclass
class _Run:
    """A run being read."""

    line: int
    settings: dict = field(default_factory=dict)
    devices: list = field(default_factory=list)  # (Device, group, pid)
    devices_cut: bool = False
    program: str | None = None  # collective named by the log
    rccl: bool = False
    layout: _Layout | None = None
    rows: list = field(default_factory=list)
    footer: bool = False
    avg: float | None = None
    bad_row: InputError | None = None  # a malformed row, forgiven only as the last of a cut run
    bad_line: int = 0


class _RowError(ValueError):
    """A row that does not parse; ``cut`` unless it is whole but holds an impossible figure
    (a negative size): only a cut row is forgiven at the end of a run with no footer."""

    def __init__(self, problem: str, cut: bool) -> None:
        super().__init__(problem)
        self.cut = cut


def _number(tok: str, col: str, *, whole: bool = False, finite: bool = True) -> float:
    """One printed figure. Harness prints are %li, %f or %g (which may use e-notation); inf and
    nan are printed for bandwidths when a time rounds to zero."""
    try:
        v = int(tok) if whole else float(tok)
    except ValueError:
        raise _RowError(f"{col} {tok!r} is not {'a whole number' if whole else 'a number'}", cut=True) from None
    if (finite and not math.isfinite(v)) or v < 0:
        raise _RowError(f"{col} {tok} is {'negative' if v < 0 else 'not finite'}", cut=False)
    return v


def _wrong(tok: str, col: str) -> int | None:
    """The #wrong count; None for N/A and for the 'error' column (before 2.13: a max difference)."""
    v = None if tok == "N/A" else _number(tok.rstrip("*"), col)
    return None if v is None or col == "error" else int(v)


def _parse_row(tokens: list[str], lay: _Layout, line: int) -> Measurement:
    """A row under ``lay``: the columns are matched by name, so extra ones are skipped."""
    if len(tokens) == lay.width - 1 and "redop" in lay.prefix:
        i = lay.prefix.index("redop")  # HyperCube (and rccl-tests' AlltoAllv) print a blank op
        if i < len(tokens) and _INT.match(tokens[i]):
            tokens = tokens[:i] + [""] + tokens[i:]
    if len(tokens) != lay.width:
        names = " ".join(lay.prefix) + ", then " + " ".join(lay.groups[0]) + (" for each group" if len(lay.groups) > 1 else "")
        raise _RowError(f"table row has {len(tokens)} fields, expected {lay.width} ({names})", cut=True)
    p = dict(zip(lay.prefix, tokens, strict=False))
    k = len(lay.prefix)
    size = int(_number(p["size"], "size", whole=True))
    count = int(_number(p["count"], "count", whole=True)) if "count" in p else 0
    if not _INT.match(p.get("root", "-1")) or int(p.get("root", "-1")) < -1:
        raise _RowError(f"root {p['root']!r} is not a rank or -1", cut=True)
    root = int(p.get("root", "-1"))
    figures = []
    for g in lay.groups:
        vals = dict(zip(g, tokens[k:k + len(g)], strict=True))
        k += len(g)
        tcol = "cputime" if "cputime" in vals else "time"
        t = _number(vals[tcol], tcol)
        a = _number(vals["algbw"], "algbw", finite=False)
        b = _number(vals["busbw"], "busbw", finite=False)
        chk = next((c for c in ("#wrong", "error") if c in vals), None)
        w = _wrong(vals[chk], chk) if chk else None
        for col, tok in vals.items():
            if col not in (tcol, "algbw", "busbw", chk) and tok != "N/A":
                _number(tok, col, finite=False)
        figures.append((t, a, b, w))
    if lay.timestamp and not (re.match(r"\d{4}-\d\d-\d\d$", tokens[-2]) and re.match(r"\d\d:\d\d:\d\d$", tokens[-1])):
        raise _RowError(f"timestamp {' '.join(tokens[-2:])!r} is not a date and time", cut=True)
    oop = figures[0]
    inp = figures[1] if len(figures) > 1 else (figures[0] if not lay.out_of_place else (None,) * 4)
    return Measurement("", size, count, p.get("type", ""), p.get("redop", ""), root, *oop, *inp, line)


def _layout(tokens: list[str], in_place_only: bool, line: str) -> _Layout:
    """The layout a column-name line declares."""
    first = next(i for i, t in enumerate(tokens) if t in ("time", "cputime"))
    prefix = tuple(tokens[:first])
    timestamp = tokens[-1] == "timestamp"
    rest = tokens[first:len(tokens) - timestamp]
    groups: list[list[str]] = []
    for t in rest:
        if t in ("time", "cputime"):
            groups.append([])
        groups[-1].append(t)
    if not set(prefix) <= set(_PREFIX_COLS) or "size" not in prefix or len(groups) > 2 or \
            any(not {"algbw", "busbw"} <= set(g) for g in groups):
        raise InputError(line, "this column header is not one nccl-tests prints", _ROW_FIX)
    return _Layout(prefix, tuple(map(tuple, groups)), len(groups) == 2 or not in_place_only, timestamp, "cputime" in rest)


def _half_ulp(x: float) -> float:
    """Half the last printed digit of a bandwidth, by the harness's formats (%6.2f; newer
    builds drop decimals to stay six wide, then switch to %.0e)."""
    return 0.005 if x < 999.995 else 0.05 if x < 9999.95 else 0.5 if x < 99999.5 else 0.5 * 10 ** math.floor(math.log10(x))


def _groups(r: Measurement):
    """(time, algbw, busbw) of each group that says something (a bandwidth printed above 0)."""
    for t, a, b in ((r.time_us, r.algbw_GBps, r.busbw_GBps), (r.in_place_time_us, r.in_place_algbw_GBps, r.in_place_busbw_GBps)):
        if t is not None and math.isfinite(a) and math.isfinite(b) and a > 0.005:
            yield t, a, b


def _bw_misfit(rows: list[Measurement], k: float | None, f: float, timed: bool) -> tuple[int, str] | None:
    """The first row whose figures are not algbw = k x size / time and busbw = f x algbw, to
    within the harness's rounding (the time too: %7.2f, fewer decimals from 100 us)."""
    for r in rows:
        for t, a, b in _groups(r):
            if abs(b - f * a) > _half_ulp(b) + f * _half_ulp(a) + 1e-9:
                return r.line, f"busbw/algbw is {b / a:.3f}, not {f:.3f}"
            ht = 0.005 if t < 100 else 0.05 if t < 1e4 else 0.5 if t < 1e7 else 0.05 * t
            want = (k or 0) * r.size_bytes / 1e3
            if timed and k is not None and t > 10 * ht and abs(a - want / t) > _half_ulp(a) + want * ht / (t * (t - ht)) + 1e-9:
                return r.line, f"algbw is {a}, not {'(ranks-1)/ranks x ' if k != 1 else ''}size / time ({want / t:.2f})"
    return None


def _factor_ranks(c: str, rows: list[Measurement]) -> int | None:
    """The one rank count whose busbw factor every row's printed bandwidths allow, if one."""
    lo, hi = 0.0, math.inf
    for r in rows:
        for _, a, b in _groups(r):
            ha, hb = _half_ulp(a), _half_ulp(b)
            lo = max(lo, (b - hb) / (a + ha))
            hi = min(hi, (b + hb) / (a - ha) if a > ha else math.inf)
    top = 2.0 if c == "allreduce" else 1.0
    if c not in _FACTOR_OF_N or hi >= top or lo >= top:
        return None
    n_lo, n_hi = top / (top - lo), top / (top - hi)  # factor = top x (n-1)/n
    fits = range(max(1, math.ceil(n_lo - 1e-9)), math.floor(n_hi + 1e-9) + 1)
    return fits[0] if len(fits) == 1 else None


def _table_ranks(c: str, rows: list[Measurement]) -> int | None:
    """Ranks as the table shows them: count vs size (exact) for per-rank counts, else the factor."""
    if c in _PER_RANK_COUNT - {"alltoallv"}:
        ns = {r.size_bytes // (r.count * _WORD[r.dtype]) for r in rows if r.count and r.dtype in _WORD}
        if len(ns) == 1:
            return ns.pop()
    return _factor_ranks(c, rows)


def _mismatch(c: str, rows: list[Measurement], n: int | None, lay: _Layout) -> tuple[int, str] | None:
    """The first row ``c`` on ``n`` ranks could not have printed, and why (None: it fits)."""
    for r in rows:
        if "redop" in lay.prefix:
            kind = _BLANK_OP if r.redop == "" else _NONE_OP if r.redop == "none" else _OP_NAMED
            if c not in kind:
                said = " or ".join(t for t, k in (("its op", _OP_NAMED), ("'none'", _NONE_OP), ("nothing", _BLANK_OP)) if c in k)
                return r.line, f"redop is {r.redop or 'blank'}; {c} prints {said} there"
        if "root" in lay.prefix and (r.root >= 0) != (c in _ROOTED):
            return r.line, f"root is {r.root}; {c} prints {'its root rank' if c in _ROOTED else '-1'} there"
        ws = _WORD.get(r.dtype)
        if ws and c != "alltoallv" and "count" in lay.prefix:
            per = n if c in _PER_RANK_COUNT else 1
            if per is not None and r.size_bytes != r.count * ws * per:
                how = f"count x {ws} B x {n} ranks" if c in _PER_RANK_COUNT else f"count x {ws} B"
                return r.line, f"size {r.size_bytes} is not {how}, as {c} prints it"
            if per is None and r.count and r.size_bytes % (r.count * ws):
                return r.line, f"size {r.size_bytes} is not a multiple of count x {ws} B"
    if n is not None or c not in _FACTOR_OF_N:
        k = 1.0 if c != "hypercube" else (n - 1) / n if n else None  # HyperCube's algbw counts n-1 peers' data
        variants = [(k, busbw_factor(c, n or 1))]
        if c in ("allgather", "reducescatter") and n and any("error" in g for g in lay.groups):
            variants.append(((n - 1) / n, 1.0))  # before mid-2020 (nccl-tests 2.9) their algbw was HyperCube's
        misfits = [_bw_misfit(rows, k, f, not lay.cputime) for k, f in variants]
        if all(misfits):
            return misfits[0]
    if len(lay.groups) == 2 and lay.out_of_place:
        if c in _NO_INPLACE_CHECK:
            r = next((r for r in rows if r.in_place_wrong is not None), None)
            if r:
                return r.line, f"the in-place #wrong is a count; {c} prints N/A there"
        else:
            r = next((r for r in rows if r.wrong is not None and r.in_place_wrong is None), None)
            if r:
                return r.line, f"only the in-place #wrong is N/A; {c} checks both or neither"
    return None


def _fits(c: str, rows: list[Measurement], n: int | None, lay: _Layout) -> bool:
    return _mismatch(c, rows, n if n is not None else _table_ranks(c, rows), lay) is None


def _ranks_from_devices(run: _Run) -> tuple[int | None, int, tuple[Device, ...]]:
    """Ranks and hosts of rank 0's communicator, from the device lines (None: they cannot say)."""
    group = run.devices[0][1] if run.devices else 0
    mine = [(d, pid) for d, g, pid in run.devices if g == group]
    n = len({d.rank for d, _ in mine}) or None
    if run.devices_cut:  # the harness cuts each process's lines at 2 KiB with '...': count processes
        n = run.settings.get("nThread", 0) * run.settings.get("nGpus", 0) * len({(d.host, pid) for d, pid in mine}) or None
    return n, len({d.host for d, _ in mine}), tuple(d for d, _, _ in run.devices)


def _finish(run: _Run, source: str, collective: str | None) -> TestRun | None:
    """Settle a run's collective and ranks, and check the table against them."""
    if not run.rows:
        return None
    if run.bad_row is not None:
        if run.footer:
            raise run.bad_row
        run.settings["truncated_at_line"] = run.bad_line
    lay = run.layout or _Layout()
    rows = run.rows
    n, hosts, devices = _ranks_from_devices(run)
    where = f"{source} line {run.line}"
    name = run.program or collective
    if name is None:
        fits = [c for c in COLLECTIVES if _fits(c, rows, n, lay)]
        if "alltoall" in fits and "alltoallv" in fits:  # nccl-tests 2.19's alltoallv_perf can print AlltoAll's
            fits.remove("alltoallv")  # very table; the plain binary is the one users run
        if not fits:
            raise InputError(where, "this table fits no nccl-tests collective (redop, root, count and busbw/algbw "
                             "disagree with each)", "check the rows and the '#  Rank' lines, or name the collective")
        if len(fits) > 1:
            raise InputError(where, f"cannot tell which collective ran: the table fits {' and '.join(fits)} alike "
                             "(the log does not name the binary)",
                             f"name the collective: {' or '.join(fits)}; or keep the line that ran the binary, "
                             f"e.g. './build/{_BINARY_OF.get(fits[0], fits[0])}_perf -b 8 ...', in the log")
        name = fits[0]
    c = canonical_collective(name, where)
    if n is None:
        n = _table_ranks(c, rows)
        if n is None:
            raise InputError(where, f"cannot tell how many ranks ran this {c}: the log has no '#  Rank' device "
                             "lines and the table does not pin the number down",
                             "keep the '# Using devices' lines of the output in the log")
    bad = _mismatch(c, rows, n, lay)
    if bad is not None:
        said = "the log names" if run.program else "the collective given is"
        raise InputError(f"{source} line {bad[0]}", f"not a row {c} on {n} ranks prints ({said} {c}): {bad[1]}",
                         "check the collective and the '#  Rank' lines (the rank count) for this run")
    rows = [replace(r, collective=c) for r in rows]
    if lay.cputime:
        run.settings["cputime"] = True
    return TestRun(source, "rccl" if run.rccl else "nccl", c, n, hosts, devices, run.settings, tuple(rows), run.avg,
                   not run.footer or run.bad_row is not None, lay.out_of_place, run.line)


def parse_nccl_tests(text: str, source: str = "<text>", collective: str | None = None) -> list[TestRun]:
    """Every run in ``text``, the standard output of nccl-tests or rccl-tests binaries as users
    save it: several runs one after another, wrapped in mpirun or srun noise, NCCL INFO lines,
    OpenMPI ``--tag-output`` or srun ``--label`` prefixes, CRLF line ends. Lines that are not the
    harness's are skipped; a table row that does not parse is an InputError naming its line,
    unless it is the last line of a run with no footer (the log was cut there): that run keeps
    its whole rows and is ``truncated``. Runs that printed no rows are left out.

    The collective of a run is the one its log names (``# Collective test starting: X_perf``,
    or a command line running ``X_perf``); else ``collective``; else the one the table fits
    (redop and root columns, count vs size, busbw/algbw vs the rank count, which #wrong columns
    are N/A, algbw vs size / time); where two fit alike (AllGather and AlltoAll under ``-c 0``,
    Gather and Scatter) it is an InputError that asks for the collective. (AlltoAllv, new in
    nccl-tests 2.19, can print AlltoAll's very table: that case is read as AlltoAll.)"""
    if collective is not None:
        collective = canonical_collective(collective)
    if not text.strip():
        raise InputError(source, "is empty", _LOG_FIX)
    runs: list[TestRun] = []
    run: _Run | None = None
    pending = _Run(0)  # what a preamble says before its run's header (version, program, command)
    in_place_label = False

    def close() -> None:
        nonlocal run
        done = _finish(run, source, collective) if run is not None else None
        if done:
            runs.append(done)
        run = None

    def start(lineno: int) -> _Run:
        nonlocal run, pending
        close()
        run, pending = _Run(lineno, dict(pending.settings), program=pending.program, rccl=pending.rccl), _Run(0)
        return run

    def here() -> _Run:
        """The run a header fact belongs to: the open one before its table, else the next one."""
        return run if run is not None and not run.rows else pending

    for i, raw in enumerate(text.lstrip("\ufeff").split("\n"), 1):
        s = _PREFIX.sub("", raw.replace("\r", " "), count=1).strip()
        if not s:
            continue
        if s.startswith("#"):
            body = s[1:].strip()
            toks = body.split()
            if re.match(r"nThread\s+\d", body):
                r = start(i)
                for m in _SETTING.finditer(body):
                    key = m.group(1).strip().replace(" ", "_")
                    key = ("stepFactor" if m.group(3) == "factor" else "stepBytes") if key == "step" else key
                    r.settings[key] = int(m.group(2))
            elif body.startswith(("nccl-tests version", "Collective test starting:")):
                close()  # these precede a run's header
                if body[0] == "n":
                    pending.settings["version"] = body
                else:
                    pending.settings["program"] = body.split(":", 1)[1].strip()
                    pending.program = (_BINARY.findall(body) or [pending.program])[0]
            elif m := _RANK.match(s):
                d = Device(int(m.group(1)), m.group(4), int(m.group(5)), m.group(7).strip())
                r = run if run is not None and not run.rows else start(i)
                r.devices.append((d, int(m.group(2) or 0), int(m.group(3))))
                r.devices_cut |= d.name.endswith("...")
                r.rccl |= bool(_AMD.search(d.name)) or "." in m.group(6)  # hipDeviceGetPCIBusId: dom:bus:dev.fn
            elif re.match(r"Rank\s+\d", body):
                here().devices_cut = True
            elif body.startswith("Reducing maxBytes to"):
                here().settings["maxBytes_reduced_to"] = int(toks[3]) if toks[3:] and toks[3].isdigit() else body
            elif body.startswith(("Blocking Enabled", "Parallel Init", "Per-Iteration Report")):
                here().settings[{"Bl": "blocking", "Pa": "parallel_init"}.get(body[:2], "per_iteration")] = body
            elif toks and toks[0] == "size" and "count" in toks and {"time", "cputime"} & set(toks):
                r = run if run is not None and not run.rows and run.layout is None else start(i)
                r.layout = _layout(toks, in_place_label, f"{source} line {i}")
                in_place_label = False
            elif "out-of-place" in body or "in-place" in body:
                in_place_label = "out-of-place" not in body
            elif body.startswith(("Out of bounds values", "Avg bus bandwidth")) and run is not None:
                run.footer = True
                value = body.split(":", 1)[1].split()[0] if ":" in body and body.split(":", 1)[1].split() else ""
                try:
                    if body[0] == "O":
                        run.settings["out_of_bounds"] = int(value)
                    else:
                        run.avg = float(value)
                except ValueError:
                    raise InputError(f"{source} line {i}", f"{body.split(':')[0].strip()} {value!r} is not a number",
                                     _ROW_FIX) from None
                if body[0] == "A":  # the last footer line: what follows belongs to the next run
                    close()
                    pending = _Run(0)  # a binary named mid-table was noise: this run named its own
            continue
        tokens = s.split()
        if _INT.match(tokens[0]) and len(tokens) > 1 and _INT.match(tokens[1]):  # size and count: a row
            lay = run.layout if run is not None and run.layout is not None else _Layout()
            try:
                row = _parse_row(tokens, lay, i)
            except _RowError as e:
                if run is None or (run.layout is None and not run.rows):
                    continue  # before any table: a number-led line that is no row is noise
                if run.bad_row is not None:
                    raise run.bad_row from None
                run.bad_row, run.bad_line = InputError(f"{source} line {i}", str(e), _ROW_FIX), i
                if not e.cut:
                    raise run.bad_row from None
                continue
            r = run if run is not None else start(i)
            if r.bad_row is not None:
                raise r.bad_row
            r.rows.append(row)
            continue
        if s.startswith("rccl-tests:"):
            here().settings["version"], here().rccl = s, True
            continue
        if m := _LIB.search(s):
            here().settings["library"] = f"{m.group(1)} {m.group(2)}"
            here().rccl |= m.group(1) == "RCCL" or "hip" in m.group(2)
        progs = set(_BINARY.findall(s))
        if len(progs) == 1 and not re.search(r"NCCL (INFO|WARN)", s):
            t = here()
            if t is pending or t.program is None:
                t.program, t.settings["command"] = progs.pop(), s
                t.rccl |= "rccl" in s.lower()
    close()
    if not runs:
        raise InputError(source, "has no nccl-tests result table: expected a '# nThread ...' header and rows of "
                         "size, count, type, redop, root, time, algbw, busbw, #wrong", _LOG_FIX + " (e.g. all_reduce_perf)")
    return runs
