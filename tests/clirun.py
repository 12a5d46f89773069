"""Run the flowride CLI as a user does (a subprocess) and check the shape of its failures."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Ran:
    code: int
    out: str
    err: str
    seconds: float


def cli(*args: str, timeout: float = 120, cwd: Path | None = None, env: dict | None = None) -> Ran:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), e.get("PYTHONPATH", "")])
    e["COLUMNS"] = "200"
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "flowride.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=e, cwd=cwd or ROOT)
    return Ran(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


def assert_clean_error(r: Ran, code: int, *needles: str, within: float | None = None) -> str:
    """Exit ``code``, one line on stderr holding every needle, no traceback; returns the line."""
    assert r.code == code, (r.code, r.out[-2000:], r.err[-2000:])
    assert "Traceback" not in r.err and "Traceback" not in r.out, r.err[-3000:]
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1, r.err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    if within is not None:
        assert r.seconds < within, f"took {r.seconds:.1f} s"
    return lines[0]


def wait_for(pred, timeout: float = 30.0, every: float = 0.05):
    """Poll ``pred`` until it returns something true (returned), or fail after ``timeout`` s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError("condition not reached in time")
