"""The CSV that NCCL's example tuner plugin reads, and a checker that reads it by the plugin's rules.

NCCL (2.2x) lets a tuner plugin override, per call, the algorithm, protocol and channel count its
own cost model would pick. NVIDIA/nccl ships an example plugin (``plugins/tuner/example``, once
``ext-tuner/example``) that reads its overrides from a CSV file named by ``NCCL_TUNER_CONFIG_FILE``
(default ``nccl_tuner.conf`` in the working directory). How it reads that file (``plugin.c``,
``loadConfig`` and ``pluginGetCollInfo``), which this module mirrors:

- the file is read line by line with ``fgets`` into a 256-byte buffer: a line of up to 255
  characters (its newline not counted) is read whole; a longer one is cut every 255 characters,
  each piece read as a line of its own;
- a line whose first character is ``#``, or an empty line, is skipped; nothing else is a comment
  (a header line of column names is read as a row, and so is an indented ``#`` line of 8 fields
  or more: its first field names no collective, so it becomes an ``allreduce`` row);
- fields are split at commas the way ``strtok`` does, so an empty field vanishes and the fields
  after it move left; spaces and tabs around a field are dropped, a carriage return is not, but
  the number parsers stop at it, so a row ending in CRLF reads as without it;
- 8 to 10 fields make a row (``numPipeOps`` and ``regBuff`` are optional, ``-1`` when left out);
  fewer are dropped without a word, more than 10 are read as their first 10;
- names are compared exactly, in lower case: an unknown collective silently becomes
  ``allreduce``, an unknown algorithm ``ring``, an unknown protocol ``simple``;
- numbers go through ``strtoull`` (bytes) and ``atoi`` (the rest): text that is no number reads
  as 0, and a number followed by other text as its leading digits, without a word;
- a row applies to a call when the collective matches, ``min_bytes <= nBytes <= max_bytes`` (both
  ends inclusive; ``nBytes`` is the larger of the send and receive buffers: AllGather's output,
  ReduceScatter's input, AllReduce's buffer) and each of nNodes, nRanks, numPipeOps and regBuff
  equals the communicator's or is ``-1``; the first matching row wins, so rows that overlap let
  the earlier one shadow the later one;
- ``channels`` is a count or ``-1``. The plugin's README says ``-1`` keeps NCCL's own count, but
  ``pluginGetCollInfo`` sets the count to 1 before it looks for a row and leaves it there for a
  ``-1`` row and for a call no row matches, and NCCL (``src/enqueue.cc``, ``ncclGetAlgoInfo``) takes
  any non-zero count the plugin returns: with the example plugin loaded, such calls run on one
  channel (seen at 2.28.7 and at the commit below). flowride's rows always name a count.

The plugin parses only ``broadcast``, ``reduce``, ``allgather``, ``reducescatter`` and
``allreduce``: there is no AlltoAll (NCCL runs it as grouped sends, with no algorithm to pick).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

PLUGIN_SOURCE = "NVIDIA/nccl plugins/tuner/example/plugin.c (ext-tuner/example before), read at commit 5067397c"
COLUMNS = ("collective_type", "min_bytes", "max_bytes", "algorithm", "protocol", "channels", "nNodes", "nRanks", "numPipeOps",
           "regBuff")
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
FIELDS_MIN, FIELDS_MAX = 8, 10
MAX_LINE_CHARS = 255  # fgets into char[256]: 255 characters and the terminating NUL
SIZE_MAX = 2**64 - 1  # the largest max_bytes strtoull gives a 64-bit size_t: "no upper limit"
INT_MAX = 2**31 - 1
PLUGIN_DEFAULT_CHANNELS = 1  # what pluginGetCollInfo returns for a call no row matches, and for a -1 row
DEFAULT_TAG = "# nccl-default,"  # flowride's comment line for a range left to NCCL's default (the plugin skips it)

_UINT = re.compile(r"[0-9]+")
_INT = re.compile(r"-?[0-9]+")
_LEADING = re.compile(r"[ \t]*([+-]?[0-9]*)")


@dataclass(frozen=True)
class TunerRow:
    """One line of the plugin's CSV, spelled as the plugin parses it."""

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int = -1
    nnodes: int = -1
    nranks: int = -1
    num_pipe_ops: int = -1
    reg_buff: int = -1

    def line(self) -> str:
        return ",".join(str(v) for v in (self.collective, self.min_bytes, self.max_bytes, self.algorithm, self.protocol,
                                         self.channels, self.nnodes, self.nranks, self.num_pipe_ops, self.reg_buff))

    def as_dict(self) -> dict:
        return dict(zip(COLUMNS, (self.collective, self.min_bytes, self.max_bytes, self.algorithm, self.protocol, self.channels,
                                  self.nnodes, self.nranks, self.num_pipe_ops, self.reg_buff), strict=True))


@dataclass(frozen=True)
class Kept:
    """A size range flowride leaves to NCCL's default, written as a ``# nccl-default,...`` comment
    so that a checker can see the rows and these together tile every size."""

    collective: str
    min_bytes: int
    max_bytes: int
    nnodes: int
    nranks: int
    algorithm: str = ""
    protocol: str = ""

    def line(self) -> str:
        return DEFAULT_TAG + ",".join(str(v) for v in (self.collective, self.min_bytes, self.max_bytes, self.nnodes, self.nranks,
                                                       self.algorithm, self.protocol))


@dataclass(frozen=True)
class Finding:
    """One thing the plugin would read otherwise than meant: the line (1-based; 0 for the file),
    a kind (``line-length``, ``header``, ``indent``, ``carriage-return``, ``empty-field``, ``fields``,
    ``collective``, ``algorithm``, ``protocol``, ``number``, ``channels``, ``range``, ``overlap``,
    ``gap``) and what."""

    line: int
    kind: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.kind}: {self.message}" if self.line else f"{self.kind}: {self.message}"


def _as_read(tok: str, unsigned: bool) -> int:
    """What ``strtoull`` (``unsigned``) or ``atoi`` make of ``tok``: its leading digits, else 0."""
    m = _LEADING.match(tok)
    digits = m.group(1) if m else ""
    try:
        v = int(digits)
    except ValueError:
        return 0
    return v % 2**64 if unsigned else max(-(2**31), min(INT_MAX, v))


def _number(tok: str, name: str, lo: int, hi: int, unsigned: bool) -> tuple[int, str | None]:
    """The value the plugin reads, and what is wrong with the field, if anything."""
    v = _as_read(tok, unsigned)
    if not (_UINT if unsigned else _INT).fullmatch(tok):
        return v, f"{name} {tok!r} is not a whole number (the plugin reads {v})"
    if not lo <= v <= hi:
        return v, f"{name} {v} is outside {lo}..{hi}"
    return v, None


def _parse_row(n: int, tokens: list[str], out: list[Finding]) -> TunerRow:
    """The row as the plugin loads it (an unknown name as the plugin's default, a number as
    ``strtoull``/``atoi`` read it), each thing read otherwise than written a finding."""
    names_read = []
    for kind, val, names, default in (("collective", tokens[0], COLLECTIVES, "allreduce"),
                                      ("algorithm", tokens[3], ALGORITHMS, "ring"), ("protocol", tokens[4], PROTOCOLS, "simple")):
        if val not in names:
            out.append(Finding(n, kind, f"{val!r} is not one the plugin knows (it would read {default}); use one of {', '.join(names)}"))
        names_read.append(val if val in names else default)
    coll, alg, proto = names_read
    nums: list[int] = []
    specs = [("min_bytes", 0, SIZE_MAX, True), ("max_bytes", 0, SIZE_MAX, True), ("channels", -1, INT_MAX, False),
             ("nNodes", -1, INT_MAX, False), ("nRanks", -1, INT_MAX, False), ("numPipeOps", -1, INT_MAX, False),
             ("regBuff", -1, 1, False)]
    for k, (name, lo, hi, unsigned) in enumerate(specs):
        idx = 1 + k if k < 2 else 3 + k
        if idx >= len(tokens):
            nums.append(-1)
            continue
        v, msg = _number(tokens[idx], name, lo, hi, unsigned)
        if msg is None and name in ("channels", "nNodes", "nRanks", "numPipeOps") and v == 0:
            msg = f"{name} 0 matches nothing useful: give a positive count or -1 (any / NCCL's own)"
        if msg:
            out.append(Finding(n, "number", msg))
        elif name == "channels" and v == -1:
            out.append(Finding(n, "channels", "-1 does not keep NCCL's channel count: the plugin leaves it at 1 (one channel); "
                                              "give the count"))
        nums.append(v)
    lo_b, hi_b = nums[0], nums[1]
    if lo_b > hi_b:
        out.append(Finding(n, "range", f"min_bytes {lo_b} > max_bytes {hi_b}: the row matches no size"))
    return TunerRow(coll, lo_b, hi_b, alg, proto, *nums[2:])


def _parse_kept(n: int, line: str, out: list[Finding]) -> Kept | None:
    parts = line[len(DEFAULT_TAG):].split(",")
    try:
        coll, lo, hi, nn, nr = parts[0], int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4])
    except (IndexError, ValueError):
        out.append(Finding(n, "fields", f"a {DEFAULT_TAG.strip()} line needs collective,min_bytes,max_bytes,nNodes,nRanks"))
        return None
    return Kept(coll, lo, hi, nn, nr, *(parts[5:7] + ["", ""])[:2])


def _compatible(a: int, b: int) -> bool:
    return a == -1 or b == -1 or a == b


def parse_tuner_csv(text: str) -> tuple[list[tuple[int, TunerRow]], list[tuple[int, Kept]], list[Finding]]:
    """The rows the plugin would load as meant (with their line numbers; a ``-1`` channel row too,
    which it loads as written), flowride's ``# nccl-default`` lines, and every line-level finding
    (what the plugin would drop, cut or read otherwise)."""
    rows: list[tuple[int, TunerRow]] = []
    kept: list[tuple[int, Kept]] = []
    out: list[Finding] = []
    for n, physical in enumerate(text.split("\n"), 1):
        if len(physical) > MAX_LINE_CHARS:
            out.append(Finding(n, "line-length", f"{len(physical)} characters: the plugin reads {MAX_LINE_CHARS} at a time, so it "
                                                 "cuts the line and reads each piece as a line of its own"))
        elif len(physical) == MAX_LINE_CHARS:
            out.append(Finding(n, "line-length", f"{MAX_LINE_CHARS} characters: the most the plugin reads whole (one more and "
                                                 "it cuts the line)"))
        for k in range(0, max(1, len(physical)), MAX_LINE_CHARS):  # fgets' pieces
            _read_line(n, physical[k:k + MAX_LINE_CHARS], rows, kept, out)
    return rows, kept, out


def _read_line(n: int, line: str, rows: list, kept: list, out: list[Finding]) -> None:
    """One line as ``loadConfig`` reads it."""
    if line.startswith(DEFAULT_TAG):
        k = _parse_kept(n, line, out)
        if k:
            kept.append((n, k))
        return
    if line == "" or line.startswith("#"):
        return
    if "\r" in line:
        out.append(Finding(n, "carriage-return", "a carriage return (CRLF line ends): the plugin's number parsers stop at it, "
                                                 "so the row reads as without it; write LF line ends"))
        line = line.replace("\r", "") if line.rstrip("\r").find("\r") < 0 else line
    raw = line.split(",")
    if line.lstrip(" \t").startswith("#"):
        read = "as an allreduce row" if len(raw) >= FIELDS_MIN else f"not at all ({len(raw)} fields)"
        out.append(Finding(n, "indent", f"a comment must start in the first column; the plugin reads this line {read}"))
    elif line.split(",")[0].strip() == COLUMNS[0]:
        out.append(Finding(n, "header", "a header of column names is read as a row (an allreduce of 0..0 bytes): make it a "
                                        "comment with '#'"))
        return
    if any(t.strip(" \t") == "" for t in raw):
        out.append(Finding(n, "empty-field", "an empty field: the plugin's strtok skips it and the fields after it move left"))
    tokens = [t.strip(" \t") for t in raw if t != ""]  # strtok: no empty token; a blank one is read as empty text
    if not FIELDS_MIN <= len(tokens) <= FIELDS_MAX:
        if len(tokens) > 1 or not line.lstrip(" \t").startswith("#"):
            what = "drops the line" if len(tokens) < FIELDS_MIN else f"reads the first {FIELDS_MAX} and ignores the rest"
            out.append(Finding(n, "fields", f"{len(tokens)} fields, the plugin takes {FIELDS_MIN} to {FIELDS_MAX} ({what})"))
        if len(tokens) < FIELDS_MIN:
            return
        tokens = tokens[:FIELDS_MAX]
    if line.lstrip(" \t").startswith("#"):
        tokens[0] = "allreduce"  # an unknown collective: the plugin's default, said by the indent finding above
    rows.append((n, _parse_row(n, tokens, out)))


def check_tuner_csv(text: str, tiled: bool | None = None) -> list[Finding]:
    """Every finding for a CSV meant for the example plugin: the line-level ones
    (:func:`parse_tuner_csv`), rows that overlap (same collective, byte ranges that meet, and
    nNodes, nRanks, numPipeOps, regBuff each equal or -1 on either side: the first would shadow
    the second), and gaps. A gap is a size that no row and no ``# nccl-default`` line of a
    (collective, nNodes, nRanks) covers between 0 and :data:`SIZE_MAX`. ``tiled``: None checks
    tiling only for the groups that declare ``# nccl-default`` lines (flowride's files); True for
    every group with rows; False never (a hand-written file of a few overrides)."""
    rows, kept, out = parse_tuner_csv(text)
    for i, (na, a) in enumerate(rows):
        for nb, b in rows[i + 1:]:
            if a.collective == b.collective and a.min_bytes <= b.max_bytes and b.min_bytes <= a.max_bytes and all(
                    _compatible(x, y) for x, y in ((a.nnodes, b.nnodes), (a.nranks, b.nranks), (a.num_pipe_ops, b.num_pipe_ops),
                                                   (a.reg_buff, b.reg_buff))):
                out.append(Finding(nb, "overlap", f"{b.collective} {b.min_bytes}..{b.max_bytes} overlaps line {na} "
                                                  f"({a.min_bytes}..{a.max_bytes}); the plugin takes the first match, line {na}"))
    for n, k in kept:
        if k.min_bytes > k.max_bytes:
            out.append(Finding(n, "range", f"min_bytes {k.min_bytes} > max_bytes {k.max_bytes}"))
    groups: dict[tuple[str, int, int], list[tuple[int, int, int, bool]]] = {}
    declared = {(k.collective, k.nnodes, k.nranks) for _, k in kept}
    for n, r in rows:
        groups.setdefault((r.collective, r.nnodes, r.nranks), []).append((r.min_bytes, r.max_bytes, n, True))
    for n, k in kept:
        groups.setdefault((k.collective, k.nnodes, k.nranks), []).append((k.min_bytes, k.max_bytes, n, False))
    for key, spans in groups.items():
        if tiled is False or (tiled is None and key not in declared):
            continue
        at, last_row = 0, True  # the smallest size not yet covered; whether what covered it is a row
        for lo, hi, n, is_row in sorted(spans):
            if lo < at and not (is_row and last_row):  # two rows: reported as an overlap above
                out.append(Finding(n, "overlap", f"{key[0]} (nNodes {key[1]}, nRanks {key[2]}): {lo}..{hi} overlaps the line "
                                                 f"before it, which reaches {at - 1}"))
            if lo > at:
                out.append(Finding(n, "gap", f"{key[0]} (nNodes {key[1]}, nRanks {key[2]}): sizes {at}..{lo - 1} have no line"))
            if hi + 1 > at:
                at, last_row = hi + 1, is_row
        if at <= SIZE_MAX:
            out.append(Finding(0, "gap", f"{key[0]} (nNodes {key[1]}, nRanks {key[2]}): sizes {at}..{SIZE_MAX} have no line"))
    out.sort(key=lambda f: f.line)
    return out


def match_row(rows: Sequence[TunerRow], collective: str, nbytes: int, nnodes: int, nranks: int, num_pipe_ops: int = 1,
              reg_buff: int = 0, usable: Container[tuple[str, str]] | Callable[[str, str], bool] | None = None) -> TunerRow | None:
    """The row the example plugin applies to one call, or None (NCCL's own choice stands), as
    ``pluginGetCollInfo`` does it: rows in file order; the first whose collective is the call's,
    ``min_bytes <= nbytes <= max_bytes`` and nNodes, nRanks, numPipeOps and regBuff each the
    call's or -1. A matching row whose (algorithm, protocol) NCCL has marked unusable for the call
    (``NCCL_ALGO_PROTO_IGNORE`` in its cost table; ``usable`` says which are usable, None: all) is
    passed over and the search goes on. ``rows``: as :func:`parse_tuner_csv` gives them (pairs of
    line number and row) or bare rows."""
    ok = usable if callable(usable) or usable is None else (lambda a, p: (a, p) in usable)  # type: ignore[operator]
    for item in rows:
        r = item[1] if isinstance(item, tuple) else item
        if r.collective != collective or not r.min_bytes <= nbytes <= r.max_bytes:
            continue
        if not all(want in (-1, have) for want, have in ((r.nnodes, nnodes), (r.nranks, nranks), (r.num_pipe_ops, num_pipe_ops),
                                                          (r.reg_buff, reg_buff))):
            continue
        if ok is None or ok(r.algorithm, r.protocol):
            return r
    return None


def plugin_channels(row: TunerRow | None) -> int:
    """The channel count the example plugin hands NCCL for a call: the row's, or
    :data:`PLUGIN_DEFAULT_CHANNELS` (one) for no row and for a ``-1`` row; NCCL takes any non-zero
    count, so those calls run on one channel unless the plugin's default is changed to 0."""
    return row.channels if row is not None and row.channels != -1 else PLUGIN_DEFAULT_CHANNELS
