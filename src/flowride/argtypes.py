"""Command-line value types: each option's value is checked once, where argparse parses it.

A value outside its domain (NaN, infinity, zero where a positive number is needed, a port above
65535, a ratio above 1, a path that cannot be written) stops the command before any work starts,
with one line that names the option as the user wrote it and gives the allowed range:
``error: flowride synth: argument --time-limit: 0 is out of range: give seconds > 0 and <= 1e+06``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from flowride.errors import InputError
from flowride.files import check_output_dir, check_output_file

Parse = Callable[[str], object]


def _range_text(lo: float | None, hi: float | None, lo_open: bool, what: str) -> str:
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"<= {hi:g}")
    return f"give {what} {' and '.join(parts)}".rstrip()


def integer(lo: int | None = None, hi: int | None = None, what: str = "a whole number") -> Parse:
    """A whole number in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            v = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: {_range_text(lo, hi, False, what)}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is out of range: {_range_text(lo, hi, False, what)}")
        return v

    parse.__name__ = "integer"
    return parse


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False, what: str = "a number") -> Parse:
    """A finite number in [lo, hi] (or (lo, hi] with ``lo_open``)."""

    def parse(text: str) -> float:
        try:
            v = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: {_range_text(lo, hi, lo_open, what)}") from None
        bad = not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi)
        if bad:
            raise argparse.ArgumentTypeError(f"{text.strip()} is out of range: {_range_text(lo, hi, lo_open, what)}")
        return v

    parse.__name__ = "number"
    return parse


def _from_input_error(check: Callable[[str, str], object]) -> Parse:
    def parse(text: str) -> str:
        try:
            check(text, "")
        except InputError as e:
            raise argparse.ArgumentTypeError(f"{e.problem}" + (f" ({e.fix})" if e.fix else "")) from None
        return text

    return parse


out_file = _from_input_error(check_output_file)
"""An output file: its directory exists and is writable, and it is not itself a directory."""
out_file.__name__ = "output file"
out_dir = _from_input_error(check_output_dir)
"""An output directory: an existing writable one, or one that can be created."""
out_dir.__name__ = "output directory"

SECONDS = number(0, 1e6, lo_open=True, what="seconds")
PORT = integer(1, 65535, "a port")
COUNT = integer(1, 10**6, "a count")
THREADS = integer(1, 1024, "threads")
