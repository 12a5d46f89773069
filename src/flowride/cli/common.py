"""What every flowride subcommand shares: the consoles, the parser that exits 2 on one line,
library field names shown as the options the user wrote, and the exit codes.

Exit codes (README, "Exit codes"): 0 success; 1 the input was understood and found wrong, or the
work failed (an invalid schedule or algorithm, a failed run or training, wrong results); 2 bad
input (an option or file the command cannot use); 130 interrupted. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

from flowride.errors import InputError, InvalidSchedule

console = Console()
err = Console(stderr=True)


# the pipeline library's field names -> the options of train, profile-bubbles and schedule-show
PIPELINE_OPTIONS = {"schedule": "--schedule", "model": "--model", "chunks": "--chunks", "stages": "--stages",
                    "microbatches": "--microbatches", "engine": "--engine"}


@contextmanager
def as_options(**option_of: str) -> Iterator[None]:
    """Within the block, the library's field ``name`` is what the user wrote as ``option_of[name]``
    (only around calls whose values came from those options, never around reading a file)."""
    try:
        yield
    except InputError as e:
        key = e.field.replace(" ", "_")
        if key not in option_of:
            raise
        raise InputError(option_of[key], e.problem, e.fix) from None


def say_error(msg: str) -> None:
    """One plain line on stderr (no wrapping or markup, so it stays one line for scripts)."""
    print(f"error: {msg}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, exit 2
        say_error(f"{self.prog}: {message}")
        sys.exit(2)


class RunFailed(Exception):
    """A training rank failed: shown with its error, exit code 1."""


def json_arg(text: str | None, field: str) -> dict:
    if not text:
        return {}
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(field, f"is not JSON ({e.msg})", 'write e.g. \'{"n": 1000}\'') from None
    if not isinstance(v, dict):
        raise InputError(field, "is not a JSON object", 'write e.g. \'{"n": 1000}\'')
    return v


def run_command(args: argparse.Namespace) -> int:
    """Call the subcommand ``args`` was parsed for and turn what it raises into an exit code and
    one line on stderr."""
    try:
        return int(args.func(args) or 0)
    except InvalidSchedule as e:  # understood and found wrong: a failed verification, not a usage error
        print(f"invalid: {e}", file=sys.stderr)
        return 1
    except InputError as e:
        say_error(str(e))
        return 2
    except RunFailed as e:
        print(f"error: training failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except OSError as e:  # the work ran and could not write or read what it had to (a full disk, ...)
        say_error(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")
        return 1
