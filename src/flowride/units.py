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
