"""flowride command line: parse, call the library, print.

One module per group of subcommands (:mod:`~flowride.cli.synth`, :mod:`~flowride.cli.run`,
:mod:`~flowride.cli.train`, :mod:`~flowride.cli.harvest`, :mod:`~flowride.cli.demo`), the
options in :mod:`~flowride.cli.parser`, and what they share (consoles, option names in errors,
exit codes 0/1/2/130) in :mod:`~flowride.cli.common`.
"""

from __future__ import annotations

from flowride.cli.common import run_command
from flowride.cli.parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # a usage error (already printed) or --help: a code, for callers of main() too
        return e.code if isinstance(e.code, int) else 2
    if getattr(args, "chunks", 0) is None and hasattr(args, "schedule"):  # pipeline commands: multi-stage schedules hold 2 chunks by default
        from flowride.pipeline.config import default_chunks

        args.chunks = default_chunks(args.schedule)
    return run_command(args)
