"""A supervised side-task manager: started, watched, restarted, stopped, by run directory.

The manager is its own process, so nothing it does can touch training; but if it dies, bubbles
go unharvested. :class:`ManagerProcess` watches it from the training launcher (a thread polling
every 0.2 s): a manager that exits while it should be running is restarted on the same UDP port
(the trainers' bubble events keep their address), and the new manager resumes every unfinished
task from the durable store. After ``max_restarts`` restarts, or a restart that fails, it gives
up and says why; training goes on either way, its events simply go unheard.

Everything needed to start an identical manager is kept in the run directory (``manager.json``,
``task-profiles.json``), so ``flowride manager status|restart|stop --run-dir D`` works from any
shell while training runs. ``manager.json`` also names the manager's task store (``store``: each
host's SQLite file, or the cluster queue's URL) and its host id (``host``), fixed when it is first
started, so a restart leases under the same name and finds the same tasks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

from flowride.errors import InputError
from flowride.harvest.hostfs import host_id
from flowride.harvest.limits import take_idle_priority
from flowride.harvest.manager_files import (
    OPTIONS_FILE,
    ManagerOptions,
    is_our_manager,
    pid_alive,
    read_options,
    read_pid,
    read_port,
    read_profiles,
    ready_file,
    write_options,
    write_profiles,
)
from flowride.harvest.stores import (
    check_store,
    describe_store,
    open_store,
    store_exists,
    store_notes,
)
from flowride.ranks import set_parent_death_signal


class ManagerUnavailable(RuntimeError):
    """The manager could not be started (its log's last lines say why)."""


def _idle_priority_and_tie_to_parent() -> None:
    """The manager only works while a stage idles: on CPU it runs at idle priority, so it can
    never take a core from training (limits.take_idle_priority). It also dies (SIGTERM: it saves
    and exits) with whoever started it, so a killed launcher leaves no manager behind."""
    set_parent_death_signal(signal.SIGTERM)
    take_idle_priority()


def _idle_priority_detached() -> None:
    take_idle_priority()


class ManagerProcess:
    """One run directory's manager: ``start``, ``watch`` (restart on death), ``stop``."""

    def __init__(self, run_dir: str | Path, opts: ManagerOptions, profiles: dict[str, dict] | None = None,
                 max_restarts: int = 3, poll_s: float = 0.2, start_timeout_s: float = 60.0, detached: bool = False) -> None:
        self.run_dir = Path(run_dir)
        # the host id and the store are fixed here and kept in manager.json: a restart (here or
        # by `flowride manager restart`) leases under the same name from the same store
        self.opts = replace(opts, host=opts.host or host_id(), store=check_store(opts.store))
        self.profiles = profiles or {}
        self.max_restarts = max_restarts
        self.poll_s = poll_s
        self.start_timeout_s = start_timeout_s
        self.detached = detached  # survives the caller (flowride manager restart)
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.restarts = 0
        self.gave_up: str | None = None
        self.history: list[dict] = []
        self.steps_offset: int | None = None  # where this run's steps begin in steps.jsonl (set at the first start)
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def from_run_dir(cls, run_dir: str | Path, **kw) -> ManagerProcess:
        """An identical manager to the one last started in ``run_dir`` (same options and port)."""
        d = Path(run_dir)
        return cls(d, read_options(d), read_profiles(d), **kw)

    # ------------------------------------------------------------------ start / stop
    def start(self) -> int:
        """Start the manager and wait until it listens; returns its UDP port."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ready = ready_file(self.run_dir)
        ready.unlink(missing_ok=True)
        write_options(self.run_dir, self.opts)
        write_profiles(self.run_dir, self.profiles)
        if self.steps_offset is None:  # steps of earlier runs in this run directory are not this run's
            steps = self.run_dir / "steps.jsonl"
            self.steps_offset = steps.stat().st_size if steps.exists() else 0
        env = dict(os.environ)
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.run_dir / "manager.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flowride.harvest.manager", "--run-dir", str(self.run_dir)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                preexec_fn=_idle_priority_detached if self.detached else _idle_priority_and_tie_to_parent,
            )
        t0 = time.monotonic()
        while not ready.exists():
            if self.proc.poll() is not None:
                raise ManagerUnavailable(f"the side-task manager exited: {self.log_tail()}")
            if time.monotonic() - t0 > self.start_timeout_s:
                self.proc.kill()
                self.proc.wait()
                raise ManagerUnavailable(f"the side-task manager did not start within {self.start_timeout_s:.0f} s")
            time.sleep(0.02)
        self.port = read_port(self.run_dir)
        if self.opts.port != self.port:  # restarts reuse the port the trainers already send to
            self.opts = replace(self.opts, port=self.port)
            write_options(self.run_dir, self.opts)
        return self.port

    def log_tail(self, n: int = 600) -> str:
        f = self.run_dir / "manager.log"
        return f.read_text(errors="replace")[-n:] if f.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 90.0) -> dict:
        """Stop watching, ask the manager to save and exit, and return its record."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        f = self.run_dir / "harvest.json"
        record = json.loads(f.read_text()) if f.exists() else {"steps": [], "failures": [], "tasks": []}
        from flowride.harvest.manager import read_steps

        # this run's steps (a dead manager wrote no record: its steps are kept all the same)
        record["steps"] = read_steps(self.run_dir, self.steps_offset or 0)
        record["manager_restarts"] = self.restarts
        record["harvest_stopped"] = self.gave_up
        record["manager_history"] = self.history
        record.update(self.store_summary())
        return record

    def store_summary(self) -> dict:
        """Where this manager's tasks are kept, and what the summary must say about it (a run
        directory on a network filesystem)."""
        return {"host": self.opts.host, "store": describe_store(self.opts.store, self.run_dir, self.opts.host),
                "store_notes": store_notes(self.opts.store, self.run_dir)}

    # ------------------------------------------------------------------ supervision
    def watch(self) -> None:
        """Restart the manager whenever it dies, from a background thread, until :meth:`stop`."""
        self._watcher = threading.Thread(target=self._watch_loop, name="flowride-manager-watch", daemon=True)
        self._watcher.start()

    def check(self) -> None:
        """One supervision step: restart a dead manager (or give up after too many restarts)."""
        if self._stopping.is_set() or self.gave_up or self.proc is None or self.proc.poll() is None:
            return
        code = self.proc.returncode
        died = time.monotonic()  # noticed now: within poll_s of the death
        if self.restarts >= self.max_restarts:
            self.gave_up = f"the manager died {self.restarts + 1} times (last exit code {code}); harvesting stopped"
            self.history.append({"exit_code": code, "restarted": False, "detected_at": died})
            return
        self.restarts += 1
        try:
            self.start()
        except (ManagerUnavailable, OSError) as e:
            self.gave_up = f"restart {self.restarts} failed: {e}; harvesting stopped"
            self.history.append({"exit_code": code, "restarted": False, "detected_at": died})
            return
        self.history.append({"exit_code": code, "restarted": True, "detected_at": died, "restart_s": time.monotonic() - died})

    def _watch_loop(self) -> None:
        while not self._stopping.wait(self.poll_s):
            self.check()


def check_manager_dir(run_dir: str | Path, field: str = "run_dir") -> Path:
    """``run_dir`` if a side-task manager was started there (its options file is there)."""
    d = Path(run_dir)
    if not (d / OPTIONS_FILE).exists():
        raise InputError(field, f"{d} holds no side-task manager (no {OPTIONS_FILE})", "give the run directory of a harvesting run")
    return d


def manager_status(run_dir: str | Path, store: str | None = None) -> dict:
    """What a run directory's manager is doing: alive or not, its port, its store and its tasks
    (every file read through :mod:`~flowride.harvest.manager_files`, so a damaged one is one
    clear error). ``store`` reads another store than the manager's own (``--store``)."""
    d = Path(run_dir)
    rec = read_pid(d)
    ours, why = is_our_manager(rec, d) if rec else (False, "no manager.pid: no manager runs")
    opts = read_options(d)
    store = check_store(store) if store is not None else opts.store
    host = opts.host or host_id()
    out = {
        "run_dir": str(d),
        "pid": rec.pid if rec else None,
        "alive": ours,
        "port": read_port(d),
        "options": asdict(opts),
        "host": host,
        "store": describe_store(store, d, host),
    }
    if rec and not ours:
        out["note"] = why
    notes = store_notes(store, d)
    if notes:
        out["store_notes"] = notes
    if store_exists(store, d, host):
        ts = open_store(store, d, host)
        try:
            out["tasks"] = [{"id": t.id, "name": t.name, "state": str(t.state), "steps": t.steps, "units": t.units,
                             "restarts": t.restarts, "origin": t.origin, **({"host": t.host} if ts.is_queue else {})} for t in ts.list()]
        finally:
            ts.close()
    return out


def stop_running(run_dir: str | Path, timeout: float = 60.0) -> tuple[bool, str]:
    """Ask the manager of ``run_dir`` to save and exit. The process ``manager.pid`` names is
    signalled only if it is still that manager (:func:`~flowride.harvest.manager_files.is_our_manager`:
    same start time, flowride's manager on this directory), never a process that reused its pid.
    Returns (whether one was stopped, why not)."""
    rec = read_pid(run_dir)
    if rec is None:
        return False, "no manager was running (no manager.pid)"
    ours, why = is_our_manager(rec, run_dir)
    if not ours:
        return False, f"no manager was running: {why}; nothing was signalled"
    os.kill(rec.pid, signal.SIGTERM)
    t0 = time.monotonic()
    while pid_alive(rec.pid) and time.monotonic() - t0 < timeout:
        time.sleep(0.05)
    if pid_alive(rec.pid) and is_our_manager(rec, run_dir)[0]:
        os.kill(rec.pid, signal.SIGKILL)
    return True, ""


def restart(run_dir: str | Path, store: str | None = None) -> int:
    """Stop the run directory's manager if it runs, and start an identical one (same options,
    same port; ``store`` given: that store instead) that outlives this call. Returns its port."""
    mp = ManagerProcess.from_run_dir(run_dir, detached=True)  # its files read first: a damaged one stops nothing
    if store is not None:
        mp.opts = replace(mp.opts, store=check_store(store))
    stop_running(run_dir)
    return mp.start()
