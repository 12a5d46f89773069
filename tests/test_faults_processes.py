"""Process faults (issue #16, class 6): a launcher killed with SIGKILL leaves no rank and no
temporary directory behind; a rank stopped with SIGSTOP is the one named when the run's timeout
passes. Both launchers (``flowride run`` and ``flowride train``) start their ranks through
flowride.ranks, so each case runs against both.

No verdict here rests on how fast anything happened. "It ends" is a generous bound (wait_for,
the pytest timeout); when the comm launcher's timeout passes is decided by the test, through the
launcher's clock (``LaunchClock``, from test_comm), right after the logical event it waits for
(the rank the kernel reports stopped), so a busy machine that starts ranks slowly changes
nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flowride.comm.launch as comm_launch
from flowride.api import synthesize
from flowride.comm.launch import CommFailed, as_program, run_schedule
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.launch import TrainingFailed, launch
from flowride.ranks import RankGroup, guard, process_state
from flowride.topology.builtins import build_topology
from test_comm import LaunchClock

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]
RANKS = 3  # the ring the comm cases run: the fewest ranks with a stopped rank between two peers
ENDS_S = 120  # a bound for "it happens at all", not a speed test (a busy 2-core machine is slow)


def processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``marker``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and process_state(int(pid)) not in (None, "Z"):
            out.append(int(pid))
    return out


def wait_for(pred, timeout: float, what: str):
    """Poll ``pred`` until it holds (returned) or fail after ``timeout`` s: a bound for "it
    happens at all", never for how soon."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["TMPDIR"] = str(tmp)  # the launcher's temporary directory lands where the test can see it
    return env


@pytest.fixture(scope="module")
def ring_schedule(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sched") / "ring.json"
    synthesize(build_topology("ring", n=RANKS), "allgather", 64 << 10, "fast").schedule.save(path)
    return path


# ---------------------------------------------------------------- SIGKILL of the launcher


def test_killed_run_launcher_leaves_no_rank_and_no_temp_dir(tmp_path, ring_schedule):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    launcher = subprocess.Popen([sys.executable, "-m", "flowride.cli", "run", str(ring_schedule), "--repeats", "100000",
                                 "--timeout", "600"], env=_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_dir = wait_for(lambda: next(iter(tmp.glob("flowride-comm-*")), None), ENDS_S, "the run's temp dir")
        wait_for(lambda: len(list(run_dir.glob("rank*.state"))) == RANKS, ENDS_S, f"{RANKS} ranks running")
        marker = str(run_dir)
        assert len(processes_with(marker)) == RANKS
        launcher.kill()
        launcher.wait()
        # the ranks die with their launcher (PR_SET_PDEATHSIG, the guard): waited for, not timed
        wait_for(lambda: processes_with(marker) == [], ENDS_S, "the ranks to die with their launcher")
        wait_for(lambda: not run_dir.exists(), ENDS_S, "the guard to remove the launcher's temp dir")
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_killed_train_launcher_leaves_no_rank(tmp_path):
    run_dir = tmp_path / "train"
    launcher = subprocess.Popen([sys.executable, "-m", "flowride.cli", "train", "--stages", "2", "--iters", "100000",
                                 "--run-dir", str(run_dir), "--device", "cpu"], env=_env(tmp_path),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        marker = str(run_dir / "config.json")
        wait_for(lambda: (run_dir / "progress.jsonl").exists(), ENDS_S, "training to start")
        assert len(processes_with(marker)) == 2
        launcher.kill()
        launcher.wait()
        wait_for(lambda: processes_with(marker) == [], ENDS_S, "the ranks to die with their launcher")
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_guard_kills_groups_and_removes_the_dir_when_its_input_ends(tmp_path):
    """The guard's rule alone: input that ends without 'done' means the launcher died."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "f").write_text("x")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    guard([f"pgid {sleeper.pid}\n", f"rmtree {d}\n"])
    assert sleeper.wait(timeout=ENDS_S) == -signal.SIGKILL
    assert not d.exists()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        d.mkdir()
        guard([f"pgid {other.pid}\n", f"rmtree {d}\n", "done\n"])  # a clean end touches nothing
        assert other.poll() is None and d.exists()
    finally:
        other.kill()
        other.wait()


# a rank that exits 7 on SIGTERM, which it can handle only once it runs: a stopped one that got
# SIGTERM alone would stay stopped until the SIGKILL at the end of stop()'s grace
ON_TERM_EXIT_7 = ("import pathlib, signal, sys, time\n"
                  "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
                  "pathlib.Path(sys.argv[1]).touch()\n"
                  "time.sleep(600)\n")


def test_rank_group_hosts_the_store_and_continues_a_stopped_rank_to_stop_it(tmp_path):
    d = tmp_path / "g"
    with RankGroup(d, 2, remove_dir=True) as g:
        assert g.port > 0
        env = g.rank_env(1)
        assert env["MASTER_PORT"] == str(g.port) and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        g.start(lambda r: [sys.executable, "-c", ON_TERM_EXIT_7, str(d / f"ready{r}")], lambda r: g.rank_env(r))
        wait_for(lambda: all((d / f"ready{r}").exists() for r in range(2)), ENDS_S, "both ranks to handle SIGTERM")
        pids = [p.pid for p in g.procs]
        os.kill(pids[1], signal.SIGSTOP)
        wait_for(lambda: g.stopped() == [1], ENDS_S, "rank 1 to show as stopped")
        # a grace far longer than this test: exit code 7 on both says each one ran its SIGTERM
        # handler, the stopped one too (stop() sent SIGCONT with SIGTERM), not that SIGKILL came
        g.stop(grace=ENDS_S)
        assert [p.returncode for p in g.procs] == [7, 7]
    assert all(process_state(p) in (None, "Z") for p in pids)
    assert not d.exists()


# ---------------------------------------------------------------- SIGSTOP of one rank


@pytest.mark.parametrize("victim", [1, 2])
def test_stopped_comm_rank_is_named_when_the_timeout_passes(tmp_path, ring_schedule, victim, monkeypatch):
    """The run's timeout passes (by the launcher's clock) right after the victim is stopped: the
    launcher names the stopped rank, not the peers left waiting for it, and acts on its first look
    at the clock past the deadline."""
    from flowride.schedule import load_schedule

    timeout = 600.0  # never reached in real time: the test moves the launcher's clock past it
    clock = LaunchClock(timeout)
    monkeypatch.setattr(comm_launch, "time", clock)
    prog = as_program(load_schedule(ring_schedule))
    rd = tmp_path / "run"
    stopped: list[int] = []

    def on_progress(ev: dict) -> None:
        if ev.get("event") == "repeat" and not stopped:
            pid = json.loads((rd / f"rank{victim}.state").read_text())["pid"]
            os.kill(pid, signal.SIGSTOP)
            wait_for(lambda: process_state(pid) == "T", ENDS_S, f"rank {victim} to stop")
            stopped.append(pid)
            clock.pass_deadline()

    with pytest.raises(CommFailed) as info:
        run_schedule(prog, repeats=100000, warmup=0, timeout_s=timeout, progress=on_progress, run_dir=rd)
    assert stopped, "the run never reached its repeats"
    assert info.value.rank == victim, str(info.value)
    assert str(info.value).startswith(f"run did not finish within {timeout:g} s: rank {victim} is stopped"), str(info.value)
    assert clock.sleeps_after == 0, "the launcher slept on after its deadline had passed"
    assert processes_with(str(rd)) == []


def test_stopped_train_rank_is_named_not_the_peers_that_time_out(tmp_path):
    """Rank 1 stopped mid-training: its peer times out waiting for it (timeout_s), and the
    launcher names rank 1, stopped, by the rule it applies (stopped for the peer timeout, or half
    of it once a peer has failed), not the peer, and not the wall timeout's catch-all."""
    rd = tmp_path / "train"
    # the peer timeout: rank 0 fails that long after it began waiting for rank 1, and rank 1 is
    # named then if it has been stopped for half of it; 10 s leaves 5 s for rank 0 to have waited
    # on a running but slow rank 1 before the stop (a loaded machine), without changing the verdict
    cfg = TrainConfig(stages=2, microbatches=4, iters=100000, run_dir=str(rd), timeout_s=10.0, device="cpu")
    stopped: list[int] = []

    def on_progress(ev: dict) -> None:
        if not stopped and ev.get("iteration", 0) >= 1:
            pids = processes_with(str(rd / "config.json"))
            pid = next(p for p in pids if "RANK=1" in Path(f"/proc/{p}/environ").read_bytes().decode(errors="replace").split("\0"))
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)

    with pytest.raises(TrainingFailed) as info:
        launch(cfg, on_progress, wall_timeout=ENDS_S * 2)  # past it, the launcher gives up naming no rank
    assert stopped, "training never reached its second iteration"
    msg = str(info.value)
    assert info.value.rank == 1, msg
    assert msg.startswith("rank 1 is stopped (SIGSTOP or a debugger): no progress for ") and "(peer timeout 10 s)" in msg, msg
    # the launcher's own record of how long it had seen rank 1 stopped when it acted
    seen = float(msg.split("no progress for ")[1].split(" s")[0])
    assert seen >= 0.5 * cfg.timeout_s, msg
    assert processes_with(str(rd / "config.json")) == []
