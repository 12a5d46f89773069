"""Process faults (issue #16, class 6): a launcher killed with SIGKILL leaves no rank and no
temporary directory behind; a rank stopped with SIGSTOP is the one named, and the timeout fires
within a second of its value. Both launchers (``flowride run`` and ``flowride train``) start
their ranks through flowride.ranks, so each case runs against both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowride.api import synthesize
from flowride.comm.launch import CommFailed, as_program, run_schedule
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.launch import TrainingFailed, launch
from flowride.ranks import RankGroup, guard, process_state
from flowride.topology.builtins import build_topology

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[1]


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
    path = tmp_path_factory.mktemp("sched") / "ring4.json"
    synthesize(build_topology("ring", n=4), "allgather", 64 << 10, "fast").schedule.save(path)
    return path


# ---------------------------------------------------------------- SIGKILL of the launcher


def test_killed_run_launcher_leaves_no_rank_and_no_temp_dir(tmp_path, ring_schedule):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    launcher = subprocess.Popen([sys.executable, "-m", "flowride.cli", "run", str(ring_schedule), "--repeats", "100000",
                                 "--timeout", "120"], env=_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_dir = wait_for(lambda: next(iter(tmp.glob("flowride-comm-*")), None), 60, "the run's temp dir")
        wait_for(lambda: len(list(run_dir.glob("rank*.state"))) == 4, 60, "4 ranks running")
        marker = str(run_dir)
        assert len(processes_with(marker)) == 4
        launcher.kill()
        launcher.wait()
        time.sleep(5)
        assert processes_with(marker) == [], "ranks outlived their launcher"
        assert not run_dir.exists(), "the launcher's temp dir was left behind"
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
        wait_for(lambda: (run_dir / "progress.jsonl").exists(), 120, "training to start")
        assert len(processes_with(marker)) == 2
        launcher.kill()
        launcher.wait()
        time.sleep(5)
        assert processes_with(marker) == [], "ranks outlived their launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_guard_kills_groups_and_removes_the_dir_when_its_input_ends(tmp_path):
    """The guard's rule alone: input that ends without 'done' means the launcher died."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "f").write_text("x")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    guard([f"pgid {sleeper.pid}\n", f"rmtree {d}\n"])
    assert sleeper.wait(timeout=5) == -signal.SIGKILL
    assert not d.exists()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        d.mkdir()
        guard([f"pgid {other.pid}\n", f"rmtree {d}\n", "done\n"])  # a clean end touches nothing
        assert other.poll() is None and d.exists()
    finally:
        other.kill()
        other.wait()


def test_rank_group_hosts_the_store_and_cleans_up(tmp_path):
    d = tmp_path / "g"
    with RankGroup(d, 2, remove_dir=True) as g:
        assert g.port > 0
        env = g.rank_env(1)
        assert env["MASTER_PORT"] == str(g.port) and env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        g.start(lambda r: [sys.executable, "-c", "import time; time.sleep(60)"], lambda r: g.rank_env(r))
        pids = [p.pid for p in g.procs]
        os.kill(pids[1], signal.SIGSTOP)
        wait_for(lambda: g.stopped() == [1], 5, "rank 1 to show as stopped")
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 2.0  # a stopped rank is continued and killed at once
    assert all(process_state(p) in (None, "Z") for p in pids)
    assert not d.exists()


# ---------------------------------------------------------------- SIGSTOP of one rank


@pytest.mark.parametrize("victim", [1, 3])
def test_stopped_comm_rank_is_named_and_timeout_is_prompt(tmp_path, ring_schedule, victim):
    from flowride.schedule import load_schedule

    prog = as_program(load_schedule(ring_schedule))
    rd = tmp_path / "run"
    stopped_at: list[float] = []

    def on_progress(ev: dict) -> None:
        if ev.get("event") == "repeat" and not stopped_at:
            pid = json.loads((rd / f"rank{victim}.state").read_text())["pid"]
            os.kill(pid, signal.SIGSTOP)
            stopped_at.append(time.monotonic())

    timeout = 12.0
    t0 = time.monotonic()
    with pytest.raises(CommFailed) as info:
        run_schedule(prog, repeats=100000, warmup=0, timeout_s=timeout, progress=on_progress, run_dir=rd)
    took = time.monotonic() - t0
    assert stopped_at, "the run never reached its repeats"
    assert info.value.rank == victim, str(info.value)
    assert f"rank {victim} is stopped" in str(info.value)
    assert took <= timeout + 1.0, f"the timeout fired {took - timeout:.2f} s late"
    assert processes_with(str(rd)) == []


def test_stopped_train_rank_is_named_within_a_second_of_the_peer_timeout(tmp_path):
    rd = tmp_path / "train"
    cfg = TrainConfig(stages=2, microbatches=4, iters=100000, run_dir=str(rd), timeout_s=6.0, device="cpu")
    stopped_at: list[float] = []

    def on_progress(ev: dict) -> None:
        if not stopped_at and ev.get("iteration", 0) >= 1:
            pids = processes_with(str(rd / "config.json"))
            pid = next(p for p in pids if "RANK=1" in Path(f"/proc/{p}/environ").read_bytes().decode(errors="replace").split("\0"))
            os.kill(pid, signal.SIGSTOP)
            stopped_at.append(time.monotonic())

    with pytest.raises(TrainingFailed) as info:
        launch(cfg, on_progress)
    assert stopped_at, "training never reached its second iteration"
    assert info.value.rank == 1, str(info.value)
    assert "rank 1 is stopped" in str(info.value)
    late = time.monotonic() - stopped_at[0] - cfg.timeout_s
    assert late <= 1.0, f"failed {late:.2f} s after the peer timeout"
    assert processes_with(str(rd / "config.json")) == []
