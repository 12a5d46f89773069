"""The noisy neighbour (flowride.neighbour): it takes about its duty of a core, stops when its
block ends or its parent dies, refuses bad input naming the field, and states a run's jitter."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowride.errors import InputError
from flowride.neighbour import Neighbour, iteration_jitter, parse_noise

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads CPU time from /proc")
TICK = os.sysconf("SC_CLK_TCK")
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _cpu_s(pid: int) -> tuple[float, float]:
    """Seconds ``pid`` has run on a CPU, and seconds it has run or waited to (runnable): from
    /proc/<pid>/schedstat where the kernel keeps it, else user + system time from /proc/<pid>/stat
    (no wait known). On a shared, loaded machine a spinning process gets less than it asks for;
    run + wait is what it asked for."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
        return run_ns / 1e9, (run_ns + wait_ns) / 1e9
    except (OSError, ValueError):
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rfind(")") + 2:].split()
        run = (int(fields[11]) + int(fields[12])) / TICK
        return run, run


def _gone(pid: int) -> bool:
    """The process is gone (or a zombie nobody reaps any more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"


def _wait_gone(pids: list[int], timeout: float = 30.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if all(_gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_takes_about_its_duty_of_a_core_and_stops_on_exit():
    nb = Neighbour(duty=0.5, period_s=0.1, cores=1, seed=1)
    with nb:
        pids = nb.pids
        assert len(pids) == 1 and nb.alive() == [True]
        (run0, asked0), t0 = _cpu_s(pids[0]), time.monotonic()
        time.sleep(1.0)
        (run1, asked1), wall = _cpu_s(pids[0]), time.monotonic() - t0
        assert nb.spec()["nice"] is not None
    ran, asked = (run1 - run0) / wall, (asked1 - asked0) / wall
    # asked: runnable for the duty (spinning on wall time), plus however long the busy machine
    # took to wake it each period (at most a third of a period here) - never all of the period
    assert 0.3 <= asked <= 0.85, f"duty 0.5 asked for {asked:.2f} of a core (ran {ran:.2f})"
    assert 0.03 <= ran <= asked + 0.02, f"duty 0.5 ran {ran:.2f} of a core (asked for {asked:.2f})"
    assert _wait_gone(pids, 30.0), "a neighbour process outlived its block"
    assert nb.pids == []


def test_two_cores_start_and_stop_and_it_can_be_entered_again():
    nb = Neighbour(duty=0.2, period_s=0.05, cores=2, jitter=0.1, seed=3)
    for _ in range(2):
        with nb:
            pids = nb.pids
            assert len(set(pids)) == 2 and all(nb.alive())
        assert _wait_gone(pids, 30.0)
    spec = nb.spec()
    assert {k: spec[k] for k in ("duty", "period_s", "cores", "jitter")} == {"duty": 0.2, "period_s": 0.05, "cores": 2, "jitter": 0.1}


def test_a_worker_that_dies_early_is_reported():
    nb = Neighbour(duty=0.0, period_s=0.05)
    with pytest.raises(RuntimeError, match="ended before the run did"):
        with nb:
            os.kill(nb.pids[0], 9)
            assert _wait_gone(nb.pids[:1])  # dead (a zombie its parent reaps at the block's end)


def test_dies_with_its_parent():
    """A parent killed with SIGKILL (no __exit__ runs) leaves no neighbour behind."""
    code = ("import sys, time\nfrom flowride.neighbour import Neighbour\n"
            "nb = Neighbour(0.5, 0.1, cores=2).start()\nprint(*nb.pids, flush=True)\ntime.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and not any(_gone(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    assert _wait_gone(pids, 30.0), "neighbour processes outlived their killed parent"  # 50 ms polls: a bound, not a speed


@pytest.mark.parametrize("kwargs, field", [
    ({"duty": 1.5, "period_s": 0.1}, "duty"),
    ({"duty": -0.1, "period_s": 0.1}, "duty"),
    ({"duty": float("nan"), "period_s": 0.1}, "duty"),
    ({"duty": 0.5, "period_s": 0}, "period_s"),
    ({"duty": 0.5, "period_s": -1}, "period_s"),
    ({"duty": 0.5, "period_s": 0.1, "cores": 0}, "cores"),
    ({"duty": 0.5, "period_s": 0.1, "cores": 1.5}, "cores"),
    ({"duty": 0.5, "period_s": 0.1, "jitter": 2}, "jitter"),
    ({"duty": 0.5, "period_s": 0.1, "cpus": []}, "cpus"),
    ({"duty": 0.5, "period_s": 0.1, "cpus": [10**6]}, "cpus"),
])
def test_input_errors_name_the_field(kwargs, field):
    with pytest.raises(InputError) as e:
        Neighbour(**kwargs)
    assert e.value.field == field and str(e.value).startswith(field)


def test_parse_noise():
    nb = parse_noise("0.5:100:2")
    assert nb is not None and nb.spec() | {"nice": None} == {"duty": 0.5, "period_s": 0.1, "cores": 2, "jitter": 0.0, "nice": None}
    assert parse_noise("0.3").spec()["period_s"] == 0.1 and parse_noise("0.3").cores == 1
    assert parse_noise("0.7:250").period_s == 0.25
    for quiet in ("none", "", " off ", None):
        assert parse_noise(quiet) is None
    for bad, words in [("1.2", "outside [0, 1]"), ("x", "not a number"), ("0.5:0", "not > 0"), ("0.5:100:0", "not >= 1"),
                       ("0.5:100:1.5", "not a whole number"), ("0.5:100:1:9", "4 fields"), ("0.5:inf", "not finite")]:
        with pytest.raises(InputError) as e:
            parse_noise(bad)
        assert e.value.field == "--noise" and words in e.value.problem, (bad, str(e.value))
        assert "DUTY[:PERIOD_MS[:CORES]]" in e.value.fix


def test_iteration_jitter_on_a_known_sequence():
    j = iteration_jitter([float(t) for t in range(1, 12)])  # 1..11: median 6, p10 2, p90 10
    assert j["n"] == 11 and j["median_s"] == 6.0 and j["mean_s"] == 6.0
    assert j["p10_s"] == pytest.approx(2.0) and j["p90_s"] == pytest.approx(10.0)
    assert j["band_pct"] == pytest.approx(8 / 2 / 6 * 100)
    assert j["cv"] == pytest.approx((110 / 10) ** 0.5 / 6)
    assert iteration_jitter([0.2] * 5)["band_pct"] == 0.0 and iteration_jitter([0.2])["cv"] == 0.0
    # only the off iterations of a paired run count; an unpaired run (all None) counts whole
    paired = iteration_jitter([1.0, 9.0, 1.0, 9.0], [False, True, False, True])
    assert paired["n"] == 2 and paired["band_pct"] == 0.0
    assert iteration_jitter([1.0, 3.0], [None, None])["n"] == 2
    for bad in ([], [1.0, float("nan")], [0.0]):
        with pytest.raises(InputError, match="times"):
            iteration_jitter(bad)
    with pytest.raises(InputError, match="harvest"):
        iteration_jitter([1.0], [False, True])
