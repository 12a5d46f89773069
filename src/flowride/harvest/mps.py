"""A private NVIDIA MPS control daemon, started and stopped by the caller (a benchmark).

Why a directory of its own: daemon and clients meet through ``CUDA_MPS_PIPE_DIRECTORY`` (the
daemon logs to ``CUDA_MPS_LOG_DIRECTORY``); a fresh root keeps this daemon apart from a system-wide
one in /tmp/nvidia-mps, and only clients whose environment carries :meth:`MpsDaemon.env` join it.
Why refusals carry one sentence: MPS is optional, so where it cannot run the caller says why and
goes on without it (:func:`try_start`).

What it relies on (seen with CUDA 13's binary on an H200): ``nvidia-cuda-mps-control -d`` forks
the daemon and returns 0 at once (1 and "An instance of this daemon is already running" when one
holds the pipe directory); the daemon makes the socket ``control`` and the file
``nvidia-cuda-mps-control.pid`` there. Without ``-d`` the binary is a client reading commands
from stdin: ``get_server_list`` prints server PIDs (none before a CUDA client came), ``quit``
stops the daemon, and with no daemon it fails ("Cannot find MPS control daemon process"). After
``quit`` the daemon removes its pid file but leaves ``control`` behind, so :meth:`MpsDaemon.stop`
clears it (limits.mps_daemon_running() looks at ``control``). ``quit`` waits for MPS clients to
finish, so a daemon still up after the timeout is reported with its PID, never killed: killing it
under a live MPS server would orphan that server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

MPS_CONTROL = "nvidia-cuda-mps-control"
_POLL_S = 0.05


class MpsUnavailable(Exception):
    """No MPS daemon here; the message is one sentence saying why."""


@dataclass
class MpsDaemon:
    root: Path
    binary: str = MPS_CONTROL
    start_timeout_s: float = 10
    pid: int | None = field(default=None, init=False)  # read from the daemon's own pid file
    _running: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @property
    def pipe_dir(self) -> Path:
        return self.root / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def control(self) -> Path:
        """The daemon's ``control`` socket (a FIFO in fakes); only its existence is checked."""
        return self.pipe_dir / "control"

    @property
    def pid_file(self) -> Path:
        return self.pipe_dir / "nvidia-cuda-mps-control.pid"

    def env(self) -> dict[str, str]:
        """What a client (and the control binary) needs to reach this daemon, not the system's."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def _run(self, args: list[str], stdin: str | None = None) -> tuple[int, str]:
        """Run the control binary with our env: (exit code, stderr or else stdout). Output goes to
        files, not pipes: a daemon forked by ``-d`` may hold them open, and a pipe read would hang."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.run(
                [self.binary, *args],
                input=None if stdin is None else stdin.encode(),
                stdin=subprocess.DEVNULL if stdin is None else None,
                stdout=out,
                stderr=err,
                env={**os.environ, **self.env()},
                timeout=self.start_timeout_s,
                check=False,
            )
            out.seek(0)
            err.seek(0)
            text = err.read().decode(errors="replace").strip()
            text = text or out.read().decode(errors="replace").strip()
        return proc.returncode, " ".join(text.split())

    def answers(self) -> bool:
        """True when a daemon answers ``get_server_list`` at our pipe directory."""
        if not self.control.exists():
            return False
        try:
            code, _ = self._run([], stdin="get_server_list\n")
        except (OSError, subprocess.TimeoutExpired):
            return False
        return code == 0

    def _gone(self) -> bool:
        """No control entry, or no pid file and no answer (asked last: it starts a process)."""
        if not self.control.exists():
            return True
        return not self.pid_file.exists() and not self.answers()

    def _clear_leftovers(self) -> None:
        """Remove the sockets and pipes that a daemon now gone left in our pipe directory."""
        for entry in self.pipe_dir.iterdir() if self.pipe_dir.is_dir() else ():
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(entry.lstat().st_mode) or stat.S_ISFIFO(entry.lstat().st_mode):
                    entry.unlink()

    def _last_log_line(self) -> str:
        try:
            lines = (self.log_dir / "control.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")

    def _prohibited_gpus(self) -> list[str]:
        """GPU indices whose compute mode is Prohibited (no CUDA context, so no MPS server).
        Empty when nvidia-smi is absent or says nothing useful: the daemon itself will then say."""
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return []
        query = [smi, "--query-gpu=index,compute_mode", "--format=csv,noheader"]
        try:
            proc = subprocess.run(
                query, capture_output=True, text=True, timeout=self.start_timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        wanted = {v.strip() for v in visible.split(",")} if visible else None
        bad = []
        for line in proc.stdout.splitlines() if proc.returncode == 0 else ():
            index, _, mode = (p.strip() for p in line.partition(","))
            if mode.lower() == "prohibited" and (wanted is None or index in wanted):
                bad.append(index)
        return bad

    def start(self) -> None:
        """Start the daemon in ``root`` and check that it answers; MpsUnavailable if not."""
        name = self.binary
        if shutil.which(name) is None:
            raise MpsUnavailable(f"{name} not found on PATH, so no MPS daemon can be started.")
        bad = self._prohibited_gpus()
        if bad:
            raise MpsUnavailable(
                f"GPU {', '.join(bad)} is in compute mode Prohibited (nvidia-smi)."
            )
        try:
            self.pipe_dir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MpsUnavailable(f"cannot create MPS directories under {self.root}: {e}.") from e
        if self.control.exists():
            if self.answers():
                raise MpsUnavailable(f"an MPS daemon is already running in {self.root}.")
            self._clear_leftovers()  # left by a daemon that is gone; ours to clear
        try:
            code, text = self._run(["-d"])
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsUnavailable(f"{name} -d failed to run: {e}.") from e
        if code != 0:
            why = text or self._last_log_line() or "no message"
            raise MpsUnavailable(f"{name} -d exited with code {code}: {why}{self._path_hint()}.")
        deadline = time.monotonic() + self.start_timeout_s
        while not self.control.exists():
            if time.monotonic() > deadline:
                log = self._last_log_line()
                said = f" (control.log: {log})" if log else " (no control.log line)"
                raise MpsUnavailable(
                    f"the MPS control pipe {self.control} did not appear within "
                    f"{self.start_timeout_s:g} s{said}{self._path_hint()}."
                )
            time.sleep(_POLL_S)
        self._running = True
        with contextlib.suppress(OSError, ValueError):
            self.pid = int(self.pid_file.read_text().strip())
        try:
            code, text = self._run([], stdin="get_server_list\n")
        except (OSError, subprocess.TimeoutExpired) as e:
            code, text = -1, str(e)
        if code != 0:
            with contextlib.suppress(MpsUnavailable):
                self.stop()
            why = text or self._last_log_line() or "no message"
            raise MpsUnavailable(f"the MPS daemon started but get_server_list failed: {why}.")

    def _path_hint(self) -> str:
        """Unix socket paths are capped at 107 bytes; a deep root may be why the daemon failed."""
        n = len(str(self.pipe_dir))
        hint = f"; its pipe directory path is {n} characters long, try a shorter root"
        return hint if n > 80 else ""

    def stop(self) -> None:
        """Send ``quit``, wait for the daemon to go, then clear what it left. Idempotent: nothing
        to do when no daemon is here. Raises MpsUnavailable only when the daemon still answers
        after the timeout (``quit`` waits for MPS clients to finish)."""
        self._running = False
        if self._gone():
            self._clear_leftovers()
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self._run([], stdin="quit\n")  # judged below by whether the daemon is gone
        deadline = time.monotonic() + self.start_timeout_s
        while not self._gone():
            if time.monotonic() > deadline:
                raise MpsUnavailable(
                    f"the MPS daemon in {self.root} (pid {self.pid or 'unknown'}) still answers "
                    f"{self.start_timeout_s:g} s after quit, maybe waiting for MPS clients; stop "
                    f"it with: echo quit | CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir} {self.binary}"
                )
            time.sleep(_POLL_S)
        self._clear_leftovers()

    def __enter__(self) -> MpsDaemon:
        """Starts the daemon, unless this object already did (as after :func:`try_start`)."""
        if not self._running:
            self.start()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self.stop()
        except MpsUnavailable as e:
            if exc is None:
                raise
            exc.add_note(str(e))  # keep the caller's error; note ours on it


def try_start(
    root: Path, binary: str = MPS_CONTROL, start_timeout_s: float = 10
) -> tuple[MpsDaemon | None, str]:
    """The benchmark's one call: ``(daemon, "")`` when a daemon runs in ``root`` (stop it, or
    use it as a context manager), ``(None, reason)`` when not, reason being one sentence."""
    daemon = MpsDaemon(Path(root), binary, start_timeout_s)
    try:
        daemon.start()
    except MpsUnavailable as e:
        return None, str(e)
    return daemon, ""
