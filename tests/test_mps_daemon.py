"""flowride.harvest.mps against a fake ``nvidia-cuda-mps-control`` (and the real one where a GPU
and the binary are here).

The fake behaves like NVIDIA's (as seen with CUDA 13 on an H200): ``-d`` forks a daemon in a new
session and returns 0 at once (1 and "An instance of this daemon is already running" if one is
there); the daemon makes ``$CUDA_MPS_PIPE_DIRECTORY/control`` (a FIFO here, a socket in the real
one) and ``nvidia-cuda-mps-control.pid``, logs to ``$CUDA_MPS_LOG_DIRECTORY/control.log`` and
serves until told to quit, when it removes its pid file but leaves ``control`` behind. Without
``-d`` the binary is a client reading commands from stdin, and fails when no daemon is there. The
fake daemon quits when a ``quit`` marker appears in its pipe directory, and on its own after 60 s,
so a crashed test cannot leave it behind for long; the fixture also kills it by the PID it wrote.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flowride.harvest.limits import mps_daemon_running
from flowride.harvest.mps import MPS_CONTROL, MpsDaemon, MpsUnavailable, try_start

FAKE = textwrap.dedent(
    """\
    #!{python}
    import os, subprocess, sys, time
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    logdir = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
    control = os.path.join(pipe, "control")
    pidfile = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
    quit_marker = os.path.join(pipe, "quit")

    def log(msg):
        with open(os.path.join(logdir, "control.log"), "a") as f:
            f.write("[fake] " + msg + "\\n")

    def daemon_alive():
        try:
            stat = open("/proc/%s/stat" % open(pidfile).read()).read()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    if sys.argv[1:] == ["-d"]:
        if daemon_alive():
            print("An instance of this daemon is already running", file=sys.stderr)
            sys.exit(1)
        subprocess.Popen([sys.executable, __file__, "--serve"], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        sys.exit(0)
    if sys.argv[1:] == ["--serve"]:
        for path in (pidfile, os.path.join(logdir, "fake-daemon.pid")):
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        if not os.path.exists(control):
            os.mkfifo(control)
        log("Control daemon started")
        deadline = time.monotonic() + 60
        while not os.path.exists(quit_marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.unlink(pidfile)  # control stays behind, as the real daemon leaves it
        if os.path.exists(quit_marker):
            os.unlink(quit_marker)
        log("Exit")
        sys.exit(0)
    if not (os.path.exists(control) and daemon_alive()):
        print("Cannot find MPS control daemon process", file=sys.stderr)
        sys.exit(1)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "get_server_list":
            pass  # no MPS server yet: prints nothing
        elif cmd == "quit" and not os.environ.get("FAKE_MPS_IGNORE_QUIT"):
            open(quit_marker, "w").close()
        elif cmd and cmd != "quit":
            print("Unknown command " + cmd, file=sys.stderr)
            sys.exit(1)
    """
)


def _script(bindir: Path, name: str, text: str) -> Path:
    path = bindir / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def _alive(pid: int) -> bool:
    """Running and not a zombie (the fake daemon's parent exits, and PID 1 in a container may
    not reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def bindir(tmp_path, monkeypatch) -> Path:
    """An empty directory that is all of PATH (so no real nvidia-smi or MPS binary is seen)."""
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", str(d))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return d


@pytest.fixture
def fake(bindir, tmp_path):
    """PATH holds the fake control binary; every daemon it started is gone afterwards."""
    _script(bindir, MPS_CONTROL, FAKE.format(python=sys.executable))
    made: list[MpsDaemon] = []

    def make(name: str = "mps", **kw) -> MpsDaemon:
        daemon = MpsDaemon(tmp_path / name, **kw)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        try:
            daemon.stop()
        except MpsUnavailable:
            pass
        pidfile = daemon.log_dir / "fake-daemon.pid"
        if pidfile.exists():
            pid = int(pidfile.read_text())
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_start_serves_and_stop_ends_it(fake, monkeypatch):
    daemon = fake()
    daemon.start()
    env = daemon.env()
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(daemon.root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(daemon.root / "log"),
    }
    assert (daemon.root / "pipe" / "control").is_fifo()
    assert daemon.pid is not None and daemon.pid == int(daemon.pid_file.read_text())
    assert daemon.answers()
    assert "Control daemon started" in (daemon.root / "log" / "control.log").read_text()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert mps_daemon_running()
    pid = daemon.pid
    assert _alive(pid)

    daemon.stop()
    assert not daemon.control.exists()
    assert not mps_daemon_running()
    deadline = time.monotonic() + 60  # a bound for "it exits at all", not a speed test
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid)
    daemon.stop()  # twice is fine


def test_stop_before_start_is_a_no_op(fake):
    fake().stop()


def test_context_manager_stops_on_error(fake):
    daemon = fake()
    with pytest.raises(RuntimeError, match="boom"):
        with daemon:
            assert daemon.control.exists()
            raise RuntimeError("boom")
    assert not daemon.control.exists()
    assert not daemon.answers()


def test_daemon_that_ignores_quit_is_reported_not_killed(fake, monkeypatch):
    daemon = fake()
    daemon.start()  # at the default timeout: starting is not what this checks
    monkeypatch.setenv("FAKE_MPS_IGNORE_QUIT", "1")  # like a daemon waiting for its clients
    daemon.start_timeout_s = 1  # how long stop waits for a daemon that will never go
    with pytest.raises(RuntimeError, match="boom") as info:
        with daemon:
            raise RuntimeError("boom")
    assert any("still answers" in note for note in info.value.__notes__)
    with pytest.raises(MpsUnavailable, match=f"pid {daemon.pid}\\) still answers"):
        daemon.stop()
    daemon.start_timeout_s = 60  # a client's answer may take a while on a busy machine
    assert _alive(daemon.pid) and daemon.answers()
    monkeypatch.delenv("FAKE_MPS_IGNORE_QUIT")  # its clients gone: the fixture's stop ends it


def test_try_start_gives_a_running_daemon(fake):
    root = fake().root  # the fixture stops whatever runs in this root
    daemon, reason = try_start(root)
    assert reason == ""
    assert daemon is not None and daemon.answers()
    daemon.stop()
    assert not daemon.control.exists()


def test_try_start_then_with_does_not_start_twice(fake):
    root = fake().root
    daemon, reason = try_start(root)
    assert daemon is not None, reason
    with daemon:
        assert daemon.answers()
    assert not daemon.control.exists()


def test_restart_in_the_same_root(fake):
    daemon = fake()
    for _ in range(2):
        with daemon:
            assert daemon.answers()
        assert not daemon.control.exists()


def test_second_daemon_in_the_same_root_is_refused(fake):
    first = fake()
    first.start()
    with pytest.raises(MpsUnavailable, match="already running"):
        fake().start()
    assert first.answers()


def test_stale_pipe_left_by_a_dead_daemon_is_cleared(fake):
    daemon = fake()
    daemon.pipe_dir.mkdir(parents=True)
    os.mkfifo(daemon.control)
    daemon.start()
    assert daemon.answers()


def test_binary_missing_is_a_reason(bindir, tmp_path):
    daemon, reason = try_start(tmp_path / "mps")
    assert daemon is None
    assert MPS_CONTROL in reason and "not found" in reason and "PATH" in reason


@pytest.mark.parametrize(
    "message",
    ["An instance of this daemon is already running", "Permission denied: /var/log/nvidia-mps"],
)
def test_refusing_binary_says_why(bindir, tmp_path, message):
    _script(bindir, MPS_CONTROL, f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    daemon, reason = try_start(tmp_path / "mps")
    assert daemon is None
    assert message in reason and "code 1" in reason


def test_pipe_that_never_appears_is_a_reason(bindir, tmp_path):
    _script(bindir, MPS_CONTROL, "#!/bin/sh\nexit 0\n")
    t0 = time.monotonic()
    daemon, reason = try_start(tmp_path / "mps", start_timeout_s=1)
    assert daemon is None
    assert "control pipe" in reason and "did not appear within 1 s" in reason
    assert time.monotonic() - t0 < 60  # it gives up at all (1 s on a quiet machine), not a speed test


def test_prohibited_gpu_is_a_reason(fake, bindir):
    _script(bindir, "nvidia-smi", "#!/bin/sh\necho '0, Prohibited'\n")
    with pytest.raises(MpsUnavailable, match="GPU 0 is in compute mode Prohibited"):
        fake().start()


def test_real_daemon_serves_a_cuda_client(tmp_path_factory, monkeypatch):
    """Where the real binary and a GPU are here: a CUDA client joins the daemon via env()."""
    if shutil.which(MPS_CONTROL) is None:
        pytest.skip(f"{MPS_CONTROL} not on PATH")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    root = Path(tmp_path_factory.mktemp("mps", numbered=True))
    daemon, reason = try_start(root)
    if daemon is None:
        pytest.skip(f"real MPS refused: {reason}")
    with daemon:
        assert daemon.control.exists() and daemon.pid is not None
        for key, value in daemon.env().items():
            monkeypatch.setenv(key, value)
        assert mps_daemon_running()
        client = subprocess.run(
            [sys.executable, "-c", "import torch; torch.ones(1, device='cuda').sum().item()"],
            env={**os.environ, **daemon.env()},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert client.returncode == 0, client.stderr
        code, servers = daemon._run([], stdin="get_server_list\n")
        assert code == 0 and servers.strip(), "the client should have made an MPS server"
    assert not daemon.answers() and not daemon.control.exists()
    assert not mps_daemon_running()
    with daemon:  # again in the same root, over what the first daemon left
        assert daemon.answers()
    assert not daemon.control.exists()
