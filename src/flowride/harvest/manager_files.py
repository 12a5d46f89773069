"""The side-task manager's files in a run directory, written and read in one place.

``flowride manager status|restart|stop`` reads these from any shell, often long after the run,
so every read is checked: a truncated ``manager.json``, a key a newer or older flowride wrote, or
a ``manager.pid`` someone edited is one line naming the file and what to do, never a traceback.

The pid file records the manager's pid *and* its start time (``/proc/<pid>/stat`` field 22, in
clock ticks since boot) and run directory. A pid is reused once its process exits, so ``stop``
signals a process only when all three still match: an unrelated process that took the number is
left alone.

- ``manager.json``: :class:`ManagerOptions`, so a restart starts an identical manager (with the
  same task store, ``store``, and host id, ``host``: it leases under the same name);
- ``task-profiles.json``: task name -> measured profile;
- ``manager.pid``: ``{"pid", "start_ticks", "run_dir"}`` while the manager runs;
- ``manager.ready``: the UDP port, written once the manager listens.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from flowride.errors import InputError
from flowride.files import parse_json_text, read_text, write_json_atomic
from flowride.harvest.hostfs import check_host

OPTIONS_FILE = "manager.json"
PROFILES_FILE = "task-profiles.json"
PID_FILE = "manager.pid"
READY_FILE = "manager.ready"
MODES = ("freeride", "naive", "priority")
PLACEMENTS = ("float", "stage")
MANAGER_MODULE = "flowride.harvest.manager"  # on the manager's command line
_FIX = "restart the harvesting run (flowride train --side-tasks ...), which rewrites it"


@dataclass(frozen=True)
class ManagerOptions:
    """Everything a manager is started with (also written to ``manager.json`` so that
    ``flowride manager restart`` can start an identical one)."""

    stages: int
    mode: str = "freeride"
    port: int = 0
    pin: bool = True
    placement: str = "float"
    factor: float = 1.2
    pause_grace_s: float = 1.0
    default_memory_mb: int = 2048
    device: str = "cpu"  # where side tasks compute: cpu | cuda
    mps_thread_percentage: int = 50  # applied only when an MPS daemon runs
    budget_pct: float | None = 2.0  # the overhead the budget guard holds harvesting to (None: no guard)
    guard_block: int = 1  # iterations per block of the guard's measurement
    guard_every: int = 8  # blocks per cycle of the guard's own measurement; the last two are its pair
    # the training's own paired on/off blocks (flowride train --paired-block): their length and the
    # first paired iteration (after warm-up); the guard pairs those instead of keeping its own
    paired_block: int = 0
    paired_offset: int = 0
    # where the tasks are kept: None, each host's SQLite file (RUN_DIR/<host>/tasks.sqlite); or a
    # postgresql:// URL, one queue every host's manager leases from (harvest/stores.py)
    store: str | None = None
    host: str = ""  # this manager's host id ("": FLOWRIDE_HOST_ID or the hostname, fixed when it starts)
    lease_s: float = 10.0  # the queue: a lease not renewed for this long lapses and the task goes back
    lease_tasks: int = 0  # the queue: tasks held at once (0: one per stage)
    # the run's tasks (harvest/rerun.py): the manager runs these and those submitted from run_since
    # (time.time()) on, and leaves other runs' unfinished tasks alone; None (an older manager.json,
    # or the queue): every task
    run_tasks: list[int] | None = None
    run_since: float | None = None

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError("device must be cpu or cuda")
        if not isinstance(self.stages, int) or isinstance(self.stages, bool) or self.stages < 1:
            raise ValueError("stages must be a positive integer")
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 <= self.port <= 65535:
            raise ValueError("port must be 0..65535")
        if self.store is not None and (not isinstance(self.store, str)
                                       or self.store.split("://", 1)[0] not in ("postgresql", "postgres")):
            raise ValueError("store must be null (each host's SQLite file) or a postgresql:// URL")
        if self.host:
            try:
                check_host(self.host)
            except InputError as e:
                raise ValueError(f"host: {e.problem}") from None
        if not isinstance(self.lease_s, int | float) or isinstance(self.lease_s, bool) \
                or not math.isfinite(self.lease_s) or not 0.5 <= self.lease_s <= 3600:
            raise ValueError("lease_s must be 0.5..3600 seconds")
        if not isinstance(self.lease_tasks, int) or isinstance(self.lease_tasks, bool) or self.lease_tasks < 0:
            raise ValueError("lease_tasks must be 0 (one per stage) or more")
        if self.run_tasks is not None and (not isinstance(self.run_tasks, list | tuple)
                                           or not all(isinstance(i, int) and not isinstance(i, bool) for i in self.run_tasks)):
            raise ValueError("run_tasks must be null or a list of task ids")
        if self.run_since is not None and (not isinstance(self.run_since, int | float) or isinstance(self.run_since, bool)
                                           or not math.isfinite(self.run_since)):
            raise ValueError("run_since must be null or a time in seconds")
        if self.budget_pct is not None and not (isinstance(self.budget_pct, int | float) and 0 <= self.budget_pct <= 100):
            raise ValueError("budget_pct must be a percentage 0..100 or null")
        for name in ("paired_block", "paired_offset"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0")
        for name in ("guard_block", "guard_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "guard_block" else 2):
                raise ValueError(f"{name} must be an integer >= {1 if name == 'guard_block' else 2}")


def _read(path: Path, what: str) -> object:
    return parse_json_text(read_text(path, str(path), _FIX), str(path), f"{path.name} ({what})")


def read_options(run_dir: str | Path) -> ManagerOptions:
    """``manager.json`` as :class:`ManagerOptions`: a JSON object of known keys and valid values."""
    f = Path(run_dir) / OPTIONS_FILE
    data = _read(f, "the manager's options")
    if not isinstance(data, dict):
        raise InputError(str(f), "is not a JSON object of manager options", _FIX)
    known = [fl.name for fl in fields(ManagerOptions)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InputError(f"{f}: {unknown[0]}", f"unknown key (known: {', '.join(known)})",
                         "it was written by another flowride version, or edited: " + _FIX)
    if "stages" not in data:
        raise InputError(f"{f}: stages", "is missing", _FIX)
    try:
        opts = ManagerOptions(**data)
        opts.validate()
    except (TypeError, ValueError) as e:
        raise InputError(str(f), str(e), _FIX) from None
    return opts


def write_options(run_dir: str | Path, opts: ManagerOptions) -> None:
    write_json_atomic(Path(run_dir) / OPTIONS_FILE, asdict(opts), indent=1)


def read_profiles(run_dir: str | Path) -> dict[str, dict]:
    """``task-profiles.json`` (none yet: empty): task name -> profile object."""
    f = Path(run_dir) / PROFILES_FILE
    if not f.exists():
        return {}
    data = _read(f, "measured task profiles")
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise InputError(str(f), "is not a JSON object of task name -> profile", "delete it: tasks are profiled again")
    return data


def write_profiles(run_dir: str | Path, profiles: dict[str, dict]) -> None:
    write_json_atomic(Path(run_dir) / PROFILES_FILE, profiles, indent=1)


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class PidRecord:
    pid: int
    start_ticks: int | None  # None: a pid file of an older flowride (a bare number)
    run_dir: str


def write_pid(run_dir: str | Path) -> None:
    """This process is the run directory's manager."""
    pid = os.getpid()
    write_json_atomic(Path(run_dir) / PID_FILE, {"pid": pid, "start_ticks": start_ticks(pid), "run_dir": str(Path(run_dir).resolve())})


def read_pid(run_dir: str | Path) -> PidRecord | None:
    """``manager.pid`` (None when there is none: no manager runs)."""
    f = Path(run_dir) / PID_FILE
    if not f.exists():
        return None
    data = _read(f, "the manager's process id")
    if isinstance(data, int) and not isinstance(data, bool):
        data = {"pid": data, "start_ticks": None, "run_dir": str(Path(run_dir).resolve())}
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int) or isinstance(data.get("pid"), bool) \
            or not 1 <= data["pid"] <= 2**22 or not isinstance(data.get("start_ticks"), int | None):
        raise InputError(str(f), "does not hold a process id", "delete it if no manager runs, or " + _FIX)
    return PidRecord(data["pid"], data.get("start_ticks"), str(data.get("run_dir", "")))


def read_port(run_dir: str | Path) -> int | None:
    """``manager.ready``: the UDP port the manager listens on (None before it listens)."""
    f = Path(run_dir) / READY_FILE
    if not f.exists():
        return None
    port = _read(f, "the manager's port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise InputError(str(f), "does not hold a port", "delete it: the manager writes it again when it starts")
    return port


def is_our_manager(rec: PidRecord, run_dir: str | Path) -> tuple[bool, str]:
    """Whether the process ``rec`` names is still this run directory's manager: alive, started
    when the record says, and running flowride's manager on this directory. The reason when not."""
    ticks = start_ticks(rec.pid)
    if ticks is None or not pid_alive(rec.pid):
        return False, f"process {rec.pid} has exited"
    if rec.start_ticks is not None and ticks != rec.start_ticks:
        return False, f"process {rec.pid} started after the manager did: its pid was reused by another program"
    try:
        argv = Path(f"/proc/{rec.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False, f"process {rec.pid} cannot be inspected"
    args = [a.decode(errors="replace") for a in argv]
    if MANAGER_MODULE not in args:
        return False, f"process {rec.pid} is not a flowride manager ({' '.join(args)[:80]}): its pid was reused"
    here = str(Path(run_dir).resolve())
    if "--run-dir" in args:
        i = args.index("--run-dir")
        if i + 1 < len(args) and str(Path(args[i + 1]).resolve()) != here:
            return False, f"process {rec.pid} is the manager of another run directory ({args[i + 1]})"
    return True, ""


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def ready_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / READY_FILE


def remove_pid(run_dir: str | Path) -> None:
    (Path(run_dir) / PID_FILE).unlink(missing_ok=True)


