"""Parsing of human-written sizes: decimal (KB, MB, GB) and binary (KiB, MiB, GiB) units."""

import math
import re

from flowride.errors import InputError
from flowride.sizes import MAX_BUFFER_BYTES

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int | float, field: str = "size") -> int:
    """Bytes in ``text`` ("16MB", "1GiB", "4096"). Decimal units are powers of 1000, as in TE-CCL."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise InputError(field, f"cannot read {text!r} as a size", "write e.g. 16MB, 1GiB or 4096")
        value, unit = float(m.group(1)), m.group(2).upper()
    if unit not in _UNITS:
        raise InputError(field, f"unknown unit {unit!r}", "use B, KB, MB, GB (decimal) or KiB, MiB, GiB")
    nbytes = value * _UNITS[unit]
    if not math.isfinite(nbytes) or int(round(nbytes)) < 1:
        raise InputError(field, f"{text!r} is not a size of at least one byte", "give a size above zero, e.g. 1MB")
    if nbytes > MAX_BUFFER_BYTES:
        raise InputError(field, f"{text!r} is over the limit of {MAX_BUFFER_BYTES:.0e} bytes (1 PB) per GPU", "give a smaller size")
    return int(round(nbytes))


def format_size(nbytes: float) -> str:
    """Short decimal form of a byte count (1000 -> '1KB')."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale:g}{unit}"
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g}{unit}"
    return f"{nbytes:g}B"


# ---- size sweeps (nccl-tests' -b/-e/-f/-i, or --sizes MIN:MAX:xF | MIN:MAX:+STEP | S1,S2,...) ----

MAX_SWEEP_SIZES = 64  # sizes in one sweep: each is a synthesis or a timed run
_NCCL_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # nccl-tests' parsesize: powers of 1024
_NCCL_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KkMmGgTt])\s*$")
_RANGE_OPTIONS = ("-b/--minbytes", "-e/--maxbytes", "-f/--stepfactor", "-i/--stepbytes")


def parse_sweep_size(text: str | int, field: str) -> int:
    """A size as nccl-tests reads it (``8``, ``64K``, ``1G``: a single K, M, G or T letter is a
    power of 1024, as in nccl-tests' ``parsesize``) or as flowride does (``1KB`` decimal, ``1KiB``)."""
    m = _NCCL_RE.match(str(text))
    if m:
        return parse_size(float(m.group(1)) * _NCCL_UNITS[m.group(2).upper()], field)
    return parse_size(text, field)


MAX_SWEEP_STEPS = 64 * MAX_SWEEP_SIZES  # steps of the loop below (a factor near 1 rounds many to one size)


def _step_sizes(lo: int, hi: int, factor: float | None, step: int | None, field: str, fix: str) -> list[int]:
    """lo, then times ``factor`` (or plus ``step``) while at most hi: nccl-tests' loop. The steps
    are counted first: a factor of 1.0000000001 would otherwise loop for hours."""
    if factor:
        steps = math.floor(math.log(hi / lo) / math.log(factor)) + 1 if lo > 0 else MAX_SWEEP_STEPS + 1
    else:
        steps = (hi - lo) // step + 1 if step and step > 0 else MAX_SWEEP_STEPS + 1
    if steps > MAX_SWEEP_STEPS:
        raise InputError(field, f"takes {steps:,} steps from {lo:,} B to {hi:,} B, over the limit of {MAX_SWEEP_STEPS:,}", fix)
    out: list[int] = []
    x: float = lo
    while x <= hi and len(out) <= MAX_SWEEP_SIZES:
        s = int(round(x))
        if not out or s > out[-1]:
            out.append(s)
        x = x * factor if factor else x + step
    return out


def _checked(sizes: list[int], field: str, fix: str) -> list[int]:
    if len(sizes) > MAX_SWEEP_SIZES:
        raise InputError(field, f"gives more than {MAX_SWEEP_SIZES} sizes", fix)
    return sizes


def sweep_sizes(minbytes: str | None = None, maxbytes: str | None = None, stepfactor: str | None = None,
                stepbytes: str | None = None, sizes: str | None = None) -> list[int] | None:
    """The sizes of a sweep, from nccl-tests' options or flowride's ``--sizes``; None when none was
    given (a single ``--size`` run). Every error names the option it comes from.

    nccl-tests' meanings: sizes start at ``-b``, are multiplied by ``-f`` (when above 1) or
    increased by ``-i`` bytes, and stop at ``-e`` (inclusive). Unlike nccl-tests (whose default is
    ``-i 1M``), no step given means ``-f 2``. ``--sizes`` takes ``MIN:MAX:xF`` (times F),
    ``MIN:MAX:+STEP`` (plus STEP bytes), ``MIN:MAX`` (times 2) or a comma list ``S1,S2,...``. The
    result is sorted, without repeats, at most :data:`MAX_SWEEP_SIZES` long."""
    ranged = any(v is not None for v in (minbytes, maxbytes, stepfactor, stepbytes))
    if sizes is not None and ranged:
        raise InputError("--sizes", "is given together with -b/-e/-f/-i", "give either --sizes or nccl-tests' -b/-e/-f (or -i)")
    if sizes is not None:
        return parse_size_list(sizes)
    if not ranged:
        return None
    b, e, f, i = _RANGE_OPTIONS
    if minbytes is None:
        raise InputError(b, "is missing", "give the smallest size, e.g. -b 8 (nccl-tests' -b)")
    lo = parse_sweep_size(minbytes, b)
    hi = lo if maxbytes is None else parse_sweep_size(maxbytes, e)
    if hi < lo:
        raise InputError(e, f"{maxbytes} ({hi:,} B) is below -b {minbytes} ({lo:,} B)", "give -e at least -b")
    factor = step = None
    if stepfactor is not None:
        try:
            factor = float(stepfactor)
        except ValueError:
            raise InputError(f, f"{stepfactor!r} is not a number", "give a factor above 1, e.g. -f 2") from None
        if not (math.isfinite(factor) and factor > 1):
            if factor == 1 and stepbytes is not None:
                factor = None  # nccl-tests: -f 1 means "step by -i"
            else:
                what = "is not a finite number" if not math.isfinite(factor) else "is not above 1"
                raise InputError(f, f"{stepfactor} {what}", "give a factor above 1, e.g. -f 2, or an additive step -i 1M")
    if stepbytes is not None:
        if factor is not None:
            raise InputError(i, "is given together with -f", "give one step: -f (times) or -i (plus bytes)")
        step = parse_sweep_size(stepbytes, i)
    if factor is None and step is None:
        factor = 2.0
    where, fix = f"{b} .. {e}", f"use a larger -f or -i, or a narrower -b .. -e (at most {MAX_SWEEP_SIZES} sizes)"
    return _checked(_step_sizes(lo, hi, factor, step, where, fix), where, fix)


def parse_size_list(text: str, field: str = "--sizes") -> list[int]:
    """``--sizes``: ``MIN:MAX:xF``, ``MIN:MAX:+STEP``, ``MIN:MAX`` or ``S1,S2,...`` (see :func:`sweep_sizes`)."""
    text = str(text).strip()
    fix = "write e.g. 8B:1GB:x2, 1KB:64KB:+1KB or 1KB,4KB,16KB"
    if not text:
        raise InputError(field, "is empty", fix)
    if ":" not in text:
        got = sorted({parse_sweep_size(p.strip(), field) for p in text.split(",") if p.strip()})
        if not got:
            raise InputError(field, f"{text!r} names no size", fix)
        return _checked(got, field, f"give at most {MAX_SWEEP_SIZES} sizes")
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise InputError(field, f"{text!r} is not MIN:MAX or MIN:MAX:STEP", fix)
    lo, hi = parse_sweep_size(parts[0], field), parse_sweep_size(parts[1], field)
    if hi < lo:
        raise InputError(field, f"the largest size {parts[1]} is below the smallest {parts[0]}", "write MIN:MAX with MIN <= MAX")
    factor = step = None
    how = parts[2].strip().lower() if len(parts) == 3 else "x2"
    if how[:1] in ("x", "*"):
        try:
            factor = float(how[1:])
        except ValueError:
            raise InputError(field, f"step {parts[2]!r} is not xF", fix) from None
        if not (math.isfinite(factor) and factor > 1):
            what = "is not a finite number" if not math.isfinite(factor) else "is not above 1"
            raise InputError(field, f"factor {how[1:]} {what}", "give a factor above 1, e.g. x2")
    elif how[:1] == "+":
        step = parse_sweep_size(how[1:], field)
    else:
        raise InputError(field, f"step {parts[2]!r} is neither xF (times) nor +STEP (plus bytes)", fix)
    fix = f"use a larger step or a narrower range (at most {MAX_SWEEP_SIZES} sizes)"
    return _checked(_step_sizes(lo, hi, factor, step, field, fix), field, fix)
