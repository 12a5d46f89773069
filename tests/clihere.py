"""The CLI in this process: ``flowride.cli.main`` with what it writes captured at the file
descriptors, returned as clirun's ``Ran`` so that ``assert_clean_error`` judges it the same way.

For cases that check only what a refusal says and its exit code: ``python -m flowride.cli`` is
``sys.exit(main())``, so the code ``main`` returns is the process's exit code, and every line it
prints reaches the same stderr. What only a real process shows (the interpreter's own start and
exit, a signal, a traceback of an uncaught error printed at exit) stays with ``clirun.cli``: each
test file keeps at least one subprocess case per subcommand and per kind of refusal it covers.
An uncaught exception here is not turned into a code: it fails the test, which is stricter.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

from clirun import Ran
from flowride.cli import main


def _cpu_s() -> float:
    """User + system CPU of this process and of the children it has waited for (ranks a command
    started and reaped count too)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def cli_here(capfd, *args, env: dict[str, str] | None = None, cwd: Path | None = None) -> Ran:
    """``flowride ARGS`` run by ``main`` in this process, with ``env`` added to the environment and
    ``cwd`` as the working directory for the call (both restored after); ``capfd`` is pytest's
    fixture. ``cpu_s`` is the CPU time of the call alone."""
    capfd.readouterr()  # what earlier steps of the test printed is not this command's
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ["COLUMNS"] = "200"  # as clirun.cli sets it
    os.environ.update(env or {})
    if cwd is not None:
        os.chdir(cwd)
    t0, c0 = time.monotonic(), _cpu_s()
    try:
        code = main([str(a) for a in args])
    finally:
        cpu, wall = _cpu_s() - c0, time.monotonic() - t0
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    out, err = capfd.readouterr()
    return Ran(int(code), out, err, wall, cpu)
