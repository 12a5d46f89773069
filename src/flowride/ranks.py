"""Start one local process per rank, the torchrun way, and make sure none outlives its launcher.

Both launchers (``flowride run``: :mod:`flowride.comm.launch`; ``flowride train``:
:mod:`flowride.pipeline.launch`) start their ranks through :class:`RankGroup`, so the
rules below hold for both and are fixed in one place:

- **Rendezvous without a port race.** The launcher hosts the c10d TCPStore itself, bound to port
  0 and never released, and every rank joins it as a client (``TORCHELASTIC_USE_AGENT_STORE``:
  the way torchrun's elastic agent hosts the store for its workers). Picking a "free" port by
  binding and releasing it let another process take it in between.
- **No orphans.** Each rank gets ``PR_SET_PDEATHSIG`` (SIGKILL; Linux), and a small guard process
  holds a pipe from the launcher: if the launcher dies, even by SIGKILL, the pipe closes, and the
  guard kills every rank's process group and removes the launcher's temporary directory.
- **The right rank blamed.** :meth:`RankGroup.stopped` reads the kernel's process state, so a
  rank stopped by SIGSTOP (or a debugger) is named as such the moment it is seen, whatever its
  peers report about the timeouts it caused.
- **Prompt stops.** :meth:`RankGroup.stop` sends SIGTERM *and* SIGCONT (a stopped process
  handles nothing until continued), then SIGKILL after a short grace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path

from flowride.errors import InputError

STOP_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this long
RANK_GROUP_ENV = "FLOWRIDE_RANK_GROUP"  # set in the environment of every rank RankGroup starts
RANK_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what a torchrun-style launcher gives a rank


LAUNCHER_ENV = ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
AS_RANK_ENV = "FLOWRIDE_AS_RANK"  # "1": a launcher of another kind exported RANK, WORLD_SIZE, ... on purpose
LEFTOVER_FIX = ("unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT to let flowride start its own ranks, or export "
                f"{AS_RANK_ENV}=1 if a launcher of yours set them")


def launched_as_rank(env: dict[str, str] | None = None) -> bool:
    """Whether this process is one rank of a run somebody else launched: torchrun (it sets
    ``TORCHELASTIC_RUN_ID``), srun or mpirun (``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``,
    ``PMI_RANK``, ...) with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT exported, or any other
    launcher that exports those and ``FLOWRIDE_AS_RANK=1``. Then ``flowride run`` and ``flowride
    train`` run as that rank instead of starting their own. Ranks :class:`RankGroup` starts carry
    ``FLOWRIDE_RANK_GROUP`` and never count: they are flowride's own workers.

    The four variables with no launcher behind them are most often left over in a shell from an
    earlier job; run as a rank, the process would wait for peers that never come and fail after
    the rendezvous timeout with C++ stack frames. That is refused at once, in one line, as is a
    RANK, WORLD_SIZE or MASTER_PORT that is not a number in range (:func:`rank_and_world`)."""
    env = os.environ if env is None else env
    if env.get(RANK_GROUP_ENV):
        return False
    if env.get("TORCHELASTIC_RUN_ID") and "RANK" in env:
        rank_and_world(env)
        return True
    if not all(env.get(k) for k in RANK_ENV):
        return False
    if not any(env.get(k) for k in LAUNCHER_ENV) and env.get(AS_RANK_ENV) != "1":
        raise InputError("RANK", f"RANK={env['RANK']}, WORLD_SIZE={env['WORLD_SIZE']}, MASTER_ADDR and MASTER_PORT are set in "
                         "the environment, but no launcher (torchrun, srun, mpirun) started this process", LEFTOVER_FIX)
    rank_and_world(env)
    return True


def rank_and_world(env: dict[str, str] | None = None) -> tuple[int, int]:
    """RANK and WORLD_SIZE of a launched rank, checked: whole numbers, 0 <= RANK < WORLD_SIZE,
    MASTER_PORT (when set) a port. The one reading both launchers' workers use."""
    env = os.environ if env is None else env
    vals = {}
    for k, lo in (("RANK", 0), ("WORLD_SIZE", 1)):
        try:
            vals[k] = int(env.get(k, ""))
        except ValueError:
            raise InputError(k, f"{env.get(k)!r} in the environment is not a whole number", LEFTOVER_FIX) from None
        if vals[k] < lo:
            raise InputError(k, f"{vals[k]} in the environment is below {lo}", LEFTOVER_FIX)
    if vals["RANK"] >= vals["WORLD_SIZE"]:
        raise InputError("RANK", f"{vals['RANK']} is not below WORLD_SIZE={vals['WORLD_SIZE']}", LEFTOVER_FIX)
    port = env.get("MASTER_PORT")
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise InputError("MASTER_PORT", f"{port!r} in the environment is not a port", LEFTOVER_FIX)
    return vals["RANK"], vals["WORLD_SIZE"]


def check_world(world: int, want: int, field: str, fix: str) -> None:
    """The processes started (WORLD_SIZE) must be the ranks the work has: else one line naming
    ``field``, the option that sets them."""
    if world != want:
        raise InputError(field, f"is {want} but {world} processes were started (WORLD_SIZE)", fix)


def pick_device(device: str, need: int = 1, field: str = "device") -> str:
    """``cpu`` or ``cuda`` for ``device`` (auto, cpu or cuda), checked before any rank starts:
    ``cuda`` needs CUDA and at least ``need`` GPUs here; ``auto`` takes cuda only then."""
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise InputError(field, f"{device!r} is unknown", "use auto, cpu or cuda")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        return "cuda" if have >= need else "cpu"
    if device == "cuda" and have < need:
        why = "this torch build has no CUDA" if not torch.backends.cuda.is_built() else f"{have} GPU(s) are visible here"
        raise InputError(field, f"cuda needs {need} GPU(s) and {why}", "use --device cpu (gloo), or run where the GPUs are")
    return device


def _load_prctl():
    """libc's prctl, loaded here in the parent: the child must not dlopen between fork and exec
    (another thread of the launcher, e.g. a progress bar, may hold the loader's lock)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (PR_SET_PDEATHSIG,
    Linux; nothing elsewhere). Safe in a preexec_fn: prctl was resolved in the parent."""
    if _PRCTL is not None:
        _PRCTL(1, sig)


def _tie_to_parent() -> None:  # runs in the child between fork and exec
    set_parent_death_signal(signal.SIGKILL)  # the kernel kills this rank when its launcher dies


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, D, T stopped, t traced, Z zombie), or
    None where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None  # the command name may hold spaces and ')'


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a rank's log ('' if there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def leave_process_group() -> None:
    """Tear down torch.distributed's default process group, if one is up, ignoring errors. A
    process that exits with gloo's threads still running aborts (SIGABRT), which would hide the
    exit code it meant to give (a rank of a torchrun run failing with bad input, say)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


class JsonLines:
    """Follow a JSON-lines file the ranks append to (``progress.jsonl``): each call hands the
    complete lines not seen yet to ``sink``; a line still being written waits for the next call."""

    def __init__(self, path: Path, sink: Callable[[dict], None] | None) -> None:
        self.path, self.sink, self.seen = Path(path), sink, 0

    def __call__(self) -> None:
        if self.sink is None or not self.path.exists():
            return
        for line in self.path.read_text().splitlines()[self.seen:]:
            try:
                ev = json.loads(line)
            except ValueError:
                break
            self.sink(ev)
            self.seen += 1


class RankGroup:
    """One process per rank under ``run_dir``: logs ``rank{r}.log``; the rendezvous store; the
    guard. Use as a context manager: leaving it stops every rank and, if ``remove_dir``, removes
    ``run_dir``."""

    def __init__(self, run_dir: Path, world: int, remove_dir: bool = False, store_timeout_s: float = 600.0) -> None:
        self.run_dir = Path(run_dir)
        self.world = int(world)
        self.remove_dir = remove_dir
        self.procs: list[subprocess.Popen] = []
        self.logs = [self.run_dir / f"rank{r}.log" for r in range(self.world)]
        self._stopped_since: dict[int, float] = {}
        import torch.distributed as dist

        # the store lives as long as this object: ranks rendezvous here, port 0 is never released
        self.store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=store_timeout_s))
        self.port = int(self.store.port)
        self._guard = subprocess.Popen([sys.executable, "-m", "flowride.ranks"], stdin=subprocess.PIPE,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                       start_new_session=True, env=_with_src_path(dict(os.environ)))
        if remove_dir:
            self._tell(f"rmtree {self.run_dir.resolve()}")

    def _tell(self, line: str) -> None:
        try:
            assert self._guard.stdin is not None
            self._guard.stdin.write(line + "\n")
            self._guard.stdin.flush()
        except (OSError, ValueError):
            pass

    def rank_env(self, rank: int, threads: int = 1, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment torchrun gives a worker, with the store hosted here."""
        env = _with_src_path(dict(os.environ))
        env.update({
            "RANK": str(rank), "WORLD_SIZE": str(self.world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(self.world), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.port), "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": str(threads),
            RANK_GROUP_ENV: "1",
        })
        env.update(extra or {})
        return env

    def start(self, command: Callable[[int], list[str]], env: Callable[[int], dict[str, str]]) -> None:
        """Start rank 0..world-1 as ``command(rank)`` with ``env(rank)``, output into its log."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for rank in range(self.world):
            with open(self.logs[rank], "w") as log:
                p = subprocess.Popen(command(rank), env=env(rank), stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_tie_to_parent)
            self.procs.append(p)
            self._tell(f"pgid {p.pid}")

    def poll(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def stopped(self) -> list[int]:
        """Ranks whose process is stopped (SIGSTOP, SIGTSTP, a debugger) right now."""
        now = time.monotonic()
        out = []
        for r, p in enumerate(self.procs):
            if p.poll() is None and process_state(p.pid) in ("T", "t"):
                self._stopped_since.setdefault(r, now)
                out.append(r)
            else:
                self._stopped_since.pop(r, None)
        return out

    def stopped_for(self, rank: int) -> float:
        """Seconds ``rank`` has been seen stopped (0 if it is not)."""
        t = self._stopped_since.get(rank)
        return 0.0 if t is None else time.monotonic() - t

    def tail(self, rank: int, lines: int = 15) -> str:
        return tail(self.logs[rank], lines)

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM (and SIGCONT) every rank's process group, SIGKILL what is left after ``grace``."""
        for p in self.procs:
            if p.poll() is None:
                for sig in (signal.SIGTERM, signal.SIGCONT):
                    try:
                        os.killpg(p.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                p.wait()

    def close(self) -> None:
        self.stop()
        if self.remove_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        self._tell("done")
        try:
            assert self._guard.stdin is not None
            self._guard.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self._guard.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._guard.kill()
        del self.store

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _with_src_path(env: dict[str, str]) -> dict[str, str]:
    """Children import flowride from this source tree, installed or not."""
    src_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = src_root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def guard(lines: Iterable[str]) -> None:
    """The guard process: read ``pgid N`` / ``rmtree PATH`` / ``done`` lines from the launcher.
    The input ending without ``done`` means the launcher died: kill the groups, remove the dir."""
    groups: list[int] = []
    dirs: list[str] = []
    for line in lines:
        word, _, arg = line.strip().partition(" ")
        if word == "done":
            return
        if word == "pgid":
            groups.append(int(arg))
        elif word == "rmtree":
            dirs.append(arg)
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 5.0
    for d in dirs:  # ranks may still be closing files in it for a moment
        while True:
            shutil.rmtree(d, ignore_errors=True)
            if not os.path.exists(d) or time.monotonic() > deadline:
                break
            time.sleep(0.1)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    guard(sys.stdin)
