"""The host counts pauses: one that arrives before its run command is read still stops that run,
and a late one meant for an earlier run does not stop the next (issue #32's lost pause). Also the
host's own fit rule: a step starts only while the time left before ``until`` exceeds ``need_s``.

Verdicts rest on what the host did, never on how many steps fit in a window: a run that must not
be stopped gets ``max_steps`` and a far ``until`` (it runs exactly those steps unless paused), and
the time-up rule is checked on each step's recorded start, the very reading the host judged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.usefixtures("fake_tasks_importable")
NEED_S = 0.006  # a 5 ms step's need: 5 ms x 1.2
FAR = 600.0  # an until that no run below reaches


def _host(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowride.harvest.runner", "iterative", "harvest_fixtures.fake_tasks:Counter",
         json.dumps({"step_ms": 5}), str(tmp_path / "ckpt.pkl")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert json.loads(proc.stdout.readline())["ev"] == "ready"
    return proc


def _run(proc, pauses: int, until: float, max_steps: int | None = None) -> list[dict]:
    """Send one run command; the steps the host reported before it yielded."""
    cmd = {"cmd": "run", "until": until, "need_s": NEED_S, "pauses": pauses}
    if max_steps is not None:
        cmd["max_steps"] = max_steps
    proc.stdin.write(json.dumps(cmd) + "\n")
    proc.stdin.flush()
    steps = []
    while True:
        ev = json.loads(proc.stdout.readline())
        if ev["ev"] == "yield":
            return steps
        steps.append(ev)


def _stop(proc) -> None:
    proc.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
    proc.stdin.flush()
    proc.wait(timeout=60)


def test_pause_before_the_run_is_read_stops_that_run(tmp_path):
    proc = _host(tmp_path)
    try:
        assert len(_run(proc, 0, time.monotonic() + FAR, max_steps=4)) == 4  # no pause: it runs
        os.kill(proc.pid, signal.SIGUSR1)  # the pause for the run below, before the host reads it
        assert _run(proc, 0, time.monotonic() + FAR) == []  # had the flag been cleared, it would run 600 s
    finally:
        _stop(proc)


def test_a_late_pause_for_an_earlier_run_is_not_counted_against_the_next(tmp_path):
    proc = _host(tmp_path)
    try:
        assert len(_run(proc, 0, time.monotonic() + FAR, max_steps=2)) == 2
        os.kill(proc.pid, signal.SIGUSR1)  # meant for the run above, which had already yielded
        assert len(_run(proc, 1, time.monotonic() + FAR, max_steps=5)) == 5  # the worker says it had sent 1: not paused
    finally:
        _stop(proc)


def test_a_step_starts_only_while_it_fits_before_until(tmp_path):
    """The run ends by itself once the time left is no more than the need: every step began with
    more than ``need_s`` left (on its recorded start), and the yield came once it was not."""
    proc = _host(tmp_path)
    try:
        until = time.monotonic() + 0.1
        steps = _run(proc, 0, until)
        assert time.monotonic() >= until - NEED_S  # not cut short: the time was up
        assert all(until - s["t0"] > NEED_S for s in steps)
    finally:
        _stop(proc)
