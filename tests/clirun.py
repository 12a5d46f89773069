"""Run the flowride CLI as a user does (a subprocess) and check the shape of its failures."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Ran:
    code: int
    out: str
    err: str
    seconds: float  # wall time: for people reading a failure, never for a verdict
    cpu_s: float  # user + system CPU time of the command and the processes it waited for


def cli(*args: str, timeout: float = 120, cwd: Path | None = None, env: dict | None = None) -> Ran:
    """The CLI in a subprocess. ``timeout`` is a bound for "it ends", not a speed test: past it the
    command is killed and the test fails with ``subprocess.TimeoutExpired``."""
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), e.get("PYTHONPATH", "")])
    e["COLUMNS"] = "200"
    e.update(env or {})
    cmd = [sys.executable, "-m", "flowride.cli", *map(str, args)]
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=e, cwd=cwd or ROOT)
        killed = threading.Event()

        def _kill() -> None:
            killed.set()
            p.kill()

        timer = threading.Timer(timeout, _kill)
        timer.start()
        try:
            # wait4 reaps this child alone and gives its own rusage (RUSAGE_CHILDREN would mix in
            # other children a test has running)
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read().decode(errors="replace"), fe.read().decode(errors="replace")
    if killed.is_set():
        raise subprocess.TimeoutExpired(cmd, timeout, out, err)
    return Ran(p.returncode, out, err, wall, usage.ru_utime + usage.ru_stime)


def assert_clean_error(r: Ran, code: int, *needles: str, within: float | None = None) -> str:
    """Exit ``code``, one line on stderr holding every needle, no traceback; returns the line.

    ``within`` (seconds of CPU time, not wall time) says the command refused the input before any
    real work: a refusal costs the interpreter's start and the checks, a solve or a training run
    costs far more CPU. CPU time does not grow when the machine is busy with other work."""
    assert r.code == code, (r.code, r.out[-2000:], r.err[-2000:])
    assert "Traceback" not in r.err and "Traceback" not in r.out, r.err[-3000:]
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1, r.err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    if within is not None:
        assert r.cpu_s < within, f"used {r.cpu_s:.1f} s of CPU ({r.seconds:.1f} s wall)"
    return lines[0]


def wait_for(pred, timeout: float = 60.0, every: float = 0.05):
    """Poll ``pred`` until it returns something true (returned), or fail after ``timeout`` s.

    The timeout is a generous bound for "it happens at all" (a busy machine may be slow): a
    verdict about how soon something happens belongs in a benchmark, or on the logical events."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError("condition not reached in time")
