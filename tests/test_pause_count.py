"""The host counts pauses: one that arrives before its run command is read still stops that run,
and a late one meant for an earlier run does not stop the next (issue #32's lost pause)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.usefixtures("fake_tasks_importable")


def _host(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowride.harvest.runner", "iterative", "harvest_fixtures.fake_tasks:Counter",
         json.dumps({"step_ms": 5}), str(tmp_path / "ckpt.pkl")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert json.loads(proc.stdout.readline())["ev"] == "ready"
    return proc


def _run(proc, pauses: int, seconds: float) -> int:
    """Send one run command; the number of steps the host ran before it yielded."""
    proc.stdin.write(json.dumps({"cmd": "run", "until": time.monotonic() + seconds, "need_s": 0.006,
                                 "pauses": pauses}) + "\n")
    proc.stdin.flush()
    steps = 0
    while True:
        ev = json.loads(proc.stdout.readline())
        if ev["ev"] == "yield":
            return steps
        steps += 1


def test_pause_before_the_run_is_read_stops_that_run(tmp_path):
    proc = _host(tmp_path)
    try:
        assert _run(proc, 0, 0.1) > 3  # no pause: it runs until the time is up
        os.kill(proc.pid, signal.SIGUSR1)  # the pause for the run below, before the host reads it
        time.sleep(0.2)
        assert _run(proc, 0, 5.0) == 0  # the old flag was cleared here and the run took 5 s
    finally:
        proc.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
        proc.stdin.flush()
        proc.wait(timeout=30)


def test_a_late_pause_for_an_earlier_run_is_not_counted_against_the_next(tmp_path):
    proc = _host(tmp_path)
    try:
        assert _run(proc, 0, 0.05) > 0
        os.kill(proc.pid, signal.SIGUSR1)  # meant for the run above, which had already yielded
        time.sleep(0.2)
        t0 = time.monotonic()
        assert _run(proc, 1, 0.3) > 10  # the worker says it had sent 1: this run is not paused
        assert time.monotonic() - t0 > 0.2
    finally:
        proc.stdin.write(json.dumps({"cmd": "stop"}) + "\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
