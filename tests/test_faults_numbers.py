"""Numbers outside their domain (issue #16, class 2): every numeric option is checked where
argparse parses it, and the error names the option as written and its allowed range."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.argtypes import PORT, SECONDS, integer, number
from flowride.cli import build_parser

BAD_REALS = ["nan", "inf", "-inf", "0", "-1", "1e300", "abc"]
BAD_COUNTS = ["0", "-3", "1.5", "nan", "99999999999999999999", "x"]

# (subcommand prefix, option, bad values); the prefix is valid on its own
CASES = [
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB"], "--time-limit", BAD_REALS),
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB"], "--memory-limit", BAD_REALS),
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB"], "--mip-gap", ["nan", "-0.1", "1.5", "inf"]),
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB"], "--threads", BAD_COUNTS),
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB"], "--chunks", [*BAD_COUNTS, "100000"]),
    (["synth", "-t", "ring", "-s", "1MB"], "--n", ["1", "0", "-4", "100000", "nan"]),
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB"], "--bandwidth", ["1e-300", "1e300", "0", "-5", "nan", "inf"]),
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB"], "--alpha-us", ["-1", "nan", "inf", "1e300"]),
    (["synth", "-t", "dgx2", "-s", "1MB"], "--chassis", ["0", "-1", "1000", "x"]),
    (["synth", "-t", "torus", "--cols", "4", "-s", "1MB"], "--rows", ["0", "-1", "100000"]),
    (["run", "s.json"], "--repeats", BAD_COUNTS),
    (["run", "s.json"], "--warmup", ["-1", "nan", "1.5"]),
    (["run", "s.json"], "--timeout", BAD_REALS),
    (["train"], "--stages", ["0", "-1", "1000", "nan"]),
    (["train"], "--microbatches", ["0", "-1", "100000"]),
    (["train"], "--iters", BAD_COUNTS),
    (["train"], "--microbatch-size", ["0", "-2"]),
    (["train"], "--lr", ["0", "-1e-3", "nan", "inf"]),
    (["train"], "--timeout", BAD_REALS),
    (["train"], "--threads", BAD_COUNTS),
    (["train"], "--min-bubble", ["-1", "nan", "inf"]),
    (["train"], "--bubble-port", ["0", "-1", "70000", "65536", "http"]),
    (["train"], "--budget", ["-1", "101", "nan"]),
    (["train"], "--paired-block", ["-1", "nan"]),
    (["train"], "--price-main", ["0", "-1", "nan", "inf"]),
    (["train"], "--seed", ["-1", "1.5"]),
    (["profile-task", "pagerank"], "--steps", BAD_COUNTS),
    (["profile-task", "pagerank"], "--seconds", BAD_REALS),
    (["tasks", "submit", "pagerank"], "--memory-mb", ["0", "-5", "nan"]),
    (["tasks", "submit", "pagerank"], "--priority", ["nan", "1e9", "1.5"]),
    (["schedule-show", "1f1b"], "--stages", ["0", "-1", "1000"]),
    (["schedule-show", "1f1b"], "--microbatches", ["0", "100000"]),
]
IDS = [f"{c[0][0]}{c[1]}" for c in CASES]


@pytest.mark.parametrize(("prefix", "option", "values"), CASES, ids=IDS)
def test_bad_number_is_refused_naming_the_option_and_range(prefix, option, values):
    parser = build_parser()
    for v in values:
        with pytest.raises(SystemExit) as e:
            parser.parse_args([*prefix, f"{option}={v}"])
        assert e.value.code == 2, (option, v)


@pytest.mark.parametrize(("prefix", "option", "values"), CASES, ids=IDS)
def test_through_the_cli_one_line_with_the_range(capfd, prefix, option, values):
    """What the user reads: one line naming the option and its allowed range (main() in this
    process). "argument --x" is argparse's own wording: refused while parsing, before any command
    code runs."""
    r = cli_here(capfd, *prefix, f"{option}={values[0]}")
    line = assert_clean_error(r, 2, f"argument {option}", "give")
    assert "<=" in line or ">=" in line or ">" in line  # the allowed range is spelled out


def test_a_bad_number_as_a_process_sees_it():
    """The same refusal end to end: exit code 2, one line, no traceback."""
    line = assert_clean_error(cli("synth", "-t", "ring", "--n", "4", "-s", "1MB", "--time-limit=nan"), 2,
                              "argument --time-limit", "give")
    assert "<=" in line or ">" in line


def test_a_zero_budget_is_allowed():
    assert build_parser().parse_args(["train", "--budget", "0"]).budget == 0.0


def test_bad_task_id_and_epoch(capfd):
    assert_clean_error(cli_here(capfd, "tasks", "show", "0"), 2, "id", ">= 1")
    for eps in ("1e-30", "0", "-1", "nan", "10"):
        assert_clean_error(cli_here(capfd, "synth", "-t", "ring", "--n", "4", "-s", "1MB", "--epoch", eps), 2, "--epoch", "outside")


@given(st.text(max_size=12) | st.floats(allow_nan=True, allow_infinity=True).map(repr) | st.integers().map(str))
@settings(max_examples=300, deadline=None)
def test_number_types_parse_in_range_or_refuse(text):
    """Property: each value type returns a value inside its range or raises ArgumentTypeError,
    never anything else (no ValueError, OverflowError, NaN slipping through)."""
    for parse, lo, hi, lo_open in ((SECONDS, 0, 1e6, True), (number(0, 1), 0, 1, False)):
        try:
            v = parse(text)
        except argparse.ArgumentTypeError:
            continue
        assert math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi
    for parse, lo, hi in ((PORT, 1, 65535), (integer(0, 10), 0, 10)):
        try:
            v = parse(text)
        except argparse.ArgumentTypeError:
            continue
        assert isinstance(v, int) and lo <= v <= hi


WORD_OPTIONS = [
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB", "--collective", "foo"], "--collective"),
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB", "--method", "foo"], "--method"),
    (["synth", "-t", "ring", "--n", "4", "-s", "1MB", "--speedups", "foo"], "--speedups"),
    (["train", "--schedule", "nosuch", "--iters", "1"], "--schedule"),
    (["train", "--model", "huge", "--iters", "1"], "--model"),
    (["schedule-show", "1f1b", "--chunks", "3"], "--chunks"),
]  # and --data, as a process sees it, below


@pytest.mark.parametrize(("args", "option"), WORD_OPTIONS, ids=[f"{a[0]}{o}" for a, o in WORD_OPTIONS])
def test_word_options_are_named_as_written(capfd, args, option):
    """Not only numbers: every option's error names it with its dashes, as the user typed it."""
    assert_clean_error(cli_here(capfd, *args), 2, f"error: {option}:")


def test_a_word_option_refused_by_the_library_as_a_process_sees_it():
    """End to end, a refusal the library makes (not argparse) after torch is imported: training
    data over the size limit, /dev/zero, which has no end (read up to the limit, then refused)."""
    assert_clean_error(cli("train", "--data", "/dev/zero", "--iters", "1", "--model", "small"), 2, "error: --data:")
