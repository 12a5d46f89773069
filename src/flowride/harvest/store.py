"""The durable side-task store: SQLite in WAL mode, one file per host under the run directory.

Tasks, their states, progress counters and checkpoints live here, so `flowride tasks ...` can
read and write while training runs (WAL lets readers and one writer work at once), and a manager
killed with -9 loses nothing: on restart, every unfinished task of its run is taken up again from
its last checkpoint. Each task keeps where it came from (``origin``: submitted by this run, resumed
from an earlier one, ...; :mod:`flowride.harvest.rerun`); a file written before that column existed
gains it when opened.

Each host has its own file, ``RUN_DIR/<host>/tasks.sqlite`` (:func:`flowride.harvest.hostfs.store_path`),
so hosts sharing a run directory never share a database. On a network filesystem the WAL's
shared-memory index cannot work across the mount, so there the store runs with
``journal_mode=DELETE`` (readers wait for a writer) and says so in :attr:`TaskStore.notes`; a
queue that several hosts share is PostgreSQL's job (:mod:`flowride.harvest.store_pg`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Collection
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowride.errors import InputError
from flowride.harvest.hostfs import network_mount, store_path
from flowride.harvest.states import TaskState, check_transition

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    params TEXT NOT NULL DEFAULT '{}',
    priority INTEGER NOT NULL DEFAULT 0,
    memory_limit_mb INTEGER,
    state TEXT NOT NULL,
    reason TEXT,
    stage INTEGER,
    steps INTEGER NOT NULL DEFAULT 0,
    units REAL NOT NULL DEFAULT 0,
    busy_s REAL NOT NULL DEFAULT 0,
    overruns INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    origin TEXT
);
CREATE TABLE IF NOT EXISTS checkpoints (
    task_id INTEGER PRIMARY KEY REFERENCES tasks(id),
    data BLOB NOT NULL,
    steps INTEGER NOT NULL,
    units REAL NOT NULL,
    saved REAL NOT NULL
);
"""
TASK_COLUMNS = frozenset({"id", "name", "params", "priority", "memory_limit_mb", "state", "reason", "stage", "steps",
                          "units", "busy_s", "overruns", "restarts", "cancel_requested", "created", "updated", "origin"})
# where a task came from, for this run (harvest/rerun.py): "submitted by this run", "resumed ..."
ORIGIN_COLUMN = "origin"
RERUN = "resumed by a re-run of this run_dir"  # the reason a task a re-run takes up goes back to SUBMITTED with


@dataclass
class TaskRecord:
    id: int
    name: str
    params: dict[str, Any]
    priority: int
    memory_limit_mb: int | None
    state: TaskState
    reason: str | None
    stage: int | None
    steps: int
    units: float
    busy_s: float
    overruns: int
    restarts: int
    cancel_requested: bool
    created: float
    updated: float
    host: str | None = None  # the cluster queue: the host that holds (or last held) the task's lease
    origin: str | None = None  # where it came from, as the last run that took it says (harvest/rerun.py)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["state"] = str(self.state)
        return d


RECORD_FIELDS = tuple(TaskRecord.__dataclass_fields__)


def record_from(row) -> TaskRecord:
    """A task record from a row of either store (a mapping of column -> value; columns a
    record does not hold, such as the queue's lease, are left out)."""
    d = {k: row[k] for k in RECORD_FIELDS if k in row.keys()}
    d["params"] = json.loads(d["params"])
    d["state"] = TaskState(d["state"])
    d["cancel_requested"] = bool(d["cancel_requested"])
    return TaskRecord(**d)


_record = record_from


def network_note(run_dir: str | Path) -> str | None:
    """What a run directory on a network filesystem means for the embedded store (None on a local disk)."""
    m = network_mount(run_dir)
    if m is None:
        return None
    return (f"the run directory is on a network filesystem ({m.fstype} at {m.point}): each host keeps its own "
            "SQLite store (RUN_DIR/<host>/tasks.sqlite) in journal_mode=DELETE, since SQLite's WAL does not work "
            "across such a mount; for one queue that every host shares, use --store postgresql://USER@HOST/DB")


class TaskStore:
    """One host's SQLite task store (a single file)."""

    is_queue = False  # hosts do not share it: nothing is leased

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.notes: list[str] = []
        fix = "give the run directory of a training run; move the damaged file aside to start a new store"
        if self.path.is_dir():
            raise InputError("task store", f"{self.path} is a directory, not a task store", fix)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            note = network_note(self.path.parent)
            self.db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False)
            self.db.row_factory = sqlite3.Row
            if note is None:
                self.db.execute("PRAGMA journal_mode=WAL")
            else:  # WAL's shared-memory index is unsafe on a network filesystem
                self.db.execute("PRAGMA journal_mode=DELETE")
                self.notes.append(note)
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            have = {r[1] for r in self.db.execute("PRAGMA table_info(tasks)")}
            if TASK_COLUMNS - have == {ORIGIN_COLUMN}:  # a store written before tasks kept their origin
                self.db.execute("ALTER TABLE tasks ADD COLUMN origin TEXT")
                have.add(ORIGIN_COLUMN)
        except (sqlite3.DatabaseError, OSError) as e:
            if getattr(self, "db", None) is not None:
                self.db.close()
            raise InputError("task store", f"{self.path} cannot be used as a task store ({e})", fix) from None
        missing = sorted(TASK_COLUMNS - have)
        if missing:
            self.db.close()
            raise InputError("task store", f"{self.path} is not a flowride task store (its 'tasks' table has no {', '.join(missing)})", fix)

    @classmethod
    def in_run_dir(cls, run_dir: str | Path, host: str | None = None) -> TaskStore:
        """``host``'s (default: this host's) store in ``run_dir`` (:func:`~flowride.harvest.hostfs.store_path`)."""
        return cls(store_path(run_dir, host))

    def describe(self) -> str:
        return f"sqlite:{self.path}"

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ writes
    def submit(self, name: str, params: dict | None = None, priority: int = 0, memory_limit_mb: int | None = None,
               origin: str | None = None) -> int:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO tasks (name, params, priority, memory_limit_mb, state, created, updated, origin) VALUES (?,?,?,?,?,?,?,?)",
            (name, json.dumps(params or {}), int(priority), memory_limit_mb, TaskState.SUBMITTED.value, now, now, origin),
        )
        return int(cur.lastrowid)

    @contextmanager
    def run_lock(self):
        """One writer while a run picks its tasks (harvest/rerun.py: prepare_run)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def resume_for_run(self, task_id: int, origin: str) -> None:
        """A re-run takes up an unfinished task: a live one goes back to SUBMITTED, labelled as a
        re-run (not as a manager restart: no restart is counted), to resume from its checkpoint."""
        state = self.get(task_id).state
        why = {TaskState.SUBMITTED: None, TaskState.PAUSED: RERUN}.get(state, f"{RERUN} (the previous job's manager had died)")
        self.db.execute("UPDATE tasks SET state=?, reason=COALESCE(?, reason), origin=?, updated=? WHERE id=?",
                        (TaskState.SUBMITTED.value, why, origin, time.time(), task_id))

    def set_origin(self, task_id: int, origin: str) -> None:
        self.db.execute("UPDATE tasks SET origin=? WHERE id=?", (origin, task_id))

    def transition(self, task_id: int, new: TaskState | str, reason: str | None = None) -> TaskState:
        """Move a task to ``new`` if its life cycle allows it (IllegalTransition otherwise)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute("SELECT state FROM tasks WHERE id=?", (task_id,)).fetchone()
            if row is None:
                raise InputError("task", f"no task {task_id}", "see flowride tasks list")
            state = check_transition(row["state"], new)
            self.db.execute(
                "UPDATE tasks SET state=?, reason=COALESCE(?, reason), updated=? WHERE id=?",
                (state.value, reason, time.time(), task_id),
            )
            self.db.execute("COMMIT")
            return state
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def progress(self, task_id: int, steps: int, units: float, busy_s: float, overruns: int, stage: int | None = None) -> None:
        self.db.execute(
            "UPDATE tasks SET steps=?, units=?, busy_s=?, overruns=?, stage=COALESCE(?, stage), updated=? WHERE id=?",
            (steps, units, busy_s, overruns, stage, time.time(), task_id),
        )

    def save_checkpoint(self, task_id: int, data: bytes, steps: int, units: float) -> None:
        self.db.execute(
            "INSERT INTO checkpoints (task_id, data, steps, units, saved) VALUES (?,?,?,?,?) "
            "ON CONFLICT(task_id) DO UPDATE SET data=excluded.data, steps=excluded.steps, units=excluded.units, saved=excluded.saved",
            (task_id, sqlite3.Binary(data), steps, units, time.time()),
        )

    def request_cancel(self, task_id: int) -> TaskRecord:
        """Ask for a task to stop. A task not started yet stops at once; a live one at its next pause."""
        rec = self.get(task_id)
        if rec.state.terminal:
            raise InputError("task", f"task {task_id} is already {rec.state}", "only unfinished tasks can be cancelled")
        self.db.execute("UPDATE tasks SET cancel_requested=1, updated=? WHERE id=?", (time.time(), task_id))
        if rec.state is TaskState.SUBMITTED:
            self.transition(task_id, TaskState.STOPPED, "cancelled before it started")
        return self.get(task_id)

    def recover(self, only: Collection[int] | None = None, since: float | None = None) -> list[int]:
        """After a manager crash: tasks that were live go back to SUBMITTED (their processes died
        with the manager) and will resume from their last checkpoint. Returns their ids. ``only``:
        just these tasks, and those created from ``since`` on (a run's own: harvest/rerun.py);
        the unfinished tasks of other runs stay as they are."""
        live = (TaskState.CREATED.value, TaskState.PAUSED.value, TaskState.RUNNING.value)
        rows = self.db.execute(f"SELECT id, created FROM tasks WHERE state IN ({','.join('?' * len(live))})", live).fetchall()
        ids = [int(r["id"]) for r in rows if only is None or int(r["id"]) in only
               or (since is not None and float(r["created"]) >= since)]
        for i in ids:
            self.db.execute(
                "UPDATE tasks SET state=?, restarts=restarts+1, reason=?, updated=? WHERE id=?",
                (TaskState.SUBMITTED.value, "recovered after a manager restart", time.time(), i),
            )
        return ids

    # ------------------------------------------------------------------ reads
    def get(self, task_id: int) -> TaskRecord:
        row = self.db.execute("SELECT * FROM tasks WHERE id=?", (task_id,)).fetchone()
        if row is None:
            raise InputError("task", f"no task {task_id}", "see flowride tasks list")
        return _record(row)

    def list(self) -> list[TaskRecord]:
        return [_record(r) for r in self.db.execute("SELECT * FROM tasks ORDER BY id").fetchall()]

    def unfinished(self) -> list[TaskRecord]:
        return [t for t in self.list() if not t.state.terminal]

    def checkpoint(self, task_id: int) -> tuple[bytes, int, float] | None:
        row = self.db.execute("SELECT data, steps, units FROM checkpoints WHERE task_id=?", (task_id,)).fetchone()
        return None if row is None else (bytes(row["data"]), int(row["steps"]), float(row["units"]))


def existing_run_dir(run_dir: str | Path, field: str = "run_dir") -> Path:
    """``run_dir`` if it already exists: a store nobody reads is refused rather than created
    (``field`` names where the directory came from in errors). The store in it is this host's,
    :func:`~flowride.harvest.hostfs.store_path`."""
    d = Path(run_dir)
    if not d.is_dir():
        raise InputError(field, f"{d} does not exist" if not d.exists() else f"{d} is not a directory",
                         "give the run directory of a training run (flowride train --run-dir), or create it first")
    return d
