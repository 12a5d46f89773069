"""The cluster-wide side-task queue: the task store in PostgreSQL, shared by every host's manager.

Side tasks are submitted once, to one database; each host's manager *leases* the tasks it runs
(``SELECT ... FOR UPDATE SKIP LOCKED``: two managers never take the same row, and neither waits
on the other) and a thread of its own renews the leases every ``lease_s / 3`` seconds. A task
therefore runs on one host at a time. When a host dies its leases lapse (``lease_s``, 10 s by
default) and the next manager to poll takes its tasks; they resume from their last checkpoint,
which lives in the database (``bytea``) beside the progress counters.

**Exactly-once progress.** Every lease bumps the task's ``lease_epoch``, a fencing token: a write
from a manager whose lease was taken over (a host that was only slow, or cut off) matches no
row and changes nothing. The steps a task has done are committed in the same transaction as its
checkpoint, together with a row of ``flowride_progress`` (steps from, steps to): steps done after
the last checkpoint are lost with their host, redone by the next one and committed once. The
ledger of a finished task therefore covers 0..steps once, without a gap or an overlap, whichever
hosts ran it. The counters that a running task reports between checkpoints are only a live view;
a new lease resets them to the checkpoint's.

Expiry is judged by the database server's clock (``clock_timestamp()``), so the hosts' clocks
need not agree. A manager that cannot renew its leases for 0.8 x ``lease_s`` (the database is
unreachable) gives its tasks up before anyone else can take them (:meth:`PgTaskStore.lost`).

**Re-runs.** The queue's tasks are the cluster's work and outlive jobs: a run submits only the
tasks it names that have no unfinished twin (same name and parameters) in the queue, and every
task left in the queue is leased by whichever manager polls (``--resume-leftovers`` is implied;
:mod:`flowride.harvest.rerun`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from flowride.errors import InputError
from flowride.harvest.hostfs import host_id
from flowride.harvest.manager_files import pid_alive, start_ticks
from flowride.harvest.states import TaskState, check_transition
from flowride.harvest.store import TASK_COLUMNS, TaskRecord, record_from

DEFAULT_LEASE_S = 10.0
LIVE = ["SUBMITTED", "CREATED", "PAUSED", "RUNNING"]
SCHEMA_LOCK = 0x666C6F77  # pg_advisory_xact_lock key: managers starting together create the tables once
SUBMIT_LOCK = 0x666C6F78  # ... and runs starting together look for their tasks' twins one at a time
CONNECT_FIX = ("check that the server runs and the URL (postgresql://USER@HOST[:PORT]/DB); keep a password in "
               "~/.pgpass or PGPASSWORD, not in the URL")

SCHEMA = """
CREATE TABLE IF NOT EXISTS flowride_tasks (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL,
    params TEXT NOT NULL DEFAULT '{}',
    priority INTEGER NOT NULL DEFAULT 0,
    memory_limit_mb INTEGER,
    state TEXT NOT NULL,
    reason TEXT,
    stage INTEGER,
    steps BIGINT NOT NULL DEFAULT 0,
    units DOUBLE PRECISION NOT NULL DEFAULT 0,
    busy_s DOUBLE PRECISION NOT NULL DEFAULT 0,
    overruns BIGINT NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    created DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    host TEXT,
    owner TEXT,
    lease_epoch BIGINT NOT NULL DEFAULT 0,
    lease_expires TIMESTAMPTZ,
    origin TEXT
);
CREATE INDEX IF NOT EXISTS flowride_tasks_queue ON flowride_tasks (priority DESC, id) WHERE state IN ('SUBMITTED', 'CREATED', 'PAUSED', 'RUNNING');
CREATE TABLE IF NOT EXISTS flowride_checkpoints (
    task_id BIGINT PRIMARY KEY REFERENCES flowride_tasks(id),
    data BYTEA NOT NULL,
    steps BIGINT NOT NULL,
    units DOUBLE PRECISION NOT NULL,
    saved DOUBLE PRECISION NOT NULL,
    host TEXT NOT NULL,
    lease_epoch BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS flowride_progress (
    id BIGSERIAL PRIMARY KEY,
    task_id BIGINT NOT NULL REFERENCES flowride_tasks(id),
    host TEXT NOT NULL,
    lease_epoch BIGINT NOT NULL,
    steps_from BIGINT NOT NULL,
    steps_to BIGINT NOT NULL,
    units_from DOUBLE PRECISION NOT NULL,
    units_to DOUBLE PRECISION NOT NULL,
    saved DOUBLE PRECISION NOT NULL,
    UNIQUE (task_id, lease_epoch, steps_from, units_from)
);
"""
QUEUE_COLUMNS = TASK_COLUMNS | {"host", "owner", "lease_epoch", "lease_expires"}
FREE = "(owner IS NULL OR lease_expires IS NULL OR lease_expires < clock_timestamp())"


def is_postgres(store: str | None) -> bool:
    return bool(store) and store.split("://", 1)[0] in ("postgresql", "postgres")


def redact(url: str) -> str:
    """``url`` without its password, for messages, status and reports."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def _psycopg():
    try:
        import psycopg
    except ImportError:
        raise InputError("--store", "a PostgreSQL store needs psycopg 3, which is not installed",
                         "pip install 'flowride[cluster]' (or psycopg[binary])") from None
    return psycopg


def _connect(url: str):
    psycopg = _psycopg()
    from psycopg.rows import dict_row

    try:
        return psycopg.connect(url, autocommit=True, row_factory=dict_row, connect_timeout=10,
                               application_name="flowride")
    except psycopg.Error as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise InputError("--store", f"cannot use {redact(url)}: {first}", CONNECT_FIX) from None


def _owner_alive(owner: str, host: str) -> bool:
    """Whether the manager that ``owner`` (``host:pid:start_ticks``) names still runs, judged from
    this host (only an owner on this host can be judged; any other counts as alive)."""
    try:
        o_host, pid, ticks = owner.rsplit(":", 2)
        pid_n = int(pid)
    except ValueError:
        return False
    if o_host != host:
        return True
    return pid_alive(pid_n) and str(start_ticks(pid_n)) == ticks


class PgTaskStore:
    """The queue: TaskStore's interface, plus leases (:meth:`lease`, :meth:`lost`, :meth:`held_records`)."""

    is_queue = True

    def __init__(self, url: str, host: str | None = None, lease_s: float = DEFAULT_LEASE_S) -> None:
        self.url = url
        self.host = host or host_id()
        self.lease_s = float(lease_s)
        self.owner = f"{self.host}:{os.getpid()}:{start_ticks(os.getpid())}"
        self.notes: list[str] = []
        self.held: dict[int, int] = {}  # task id -> the lease epoch of each unfinished task held (renewed)
        self.fences: dict[int, int] = {}  # task id -> the lease epoch of every task this manager leased
        self._lost: set[int] = set()
        self._lock = threading.Lock()
        self._last_renewed = time.monotonic()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.db = _connect(url)
        self._ensure_schema()

    def _ensure_schema(self) -> None:
        psycopg = _psycopg()
        try:
            with self.db.transaction():
                self.db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                self.db.execute(SCHEMA)
                have = {r["column_name"] for r in self.db.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'flowride_tasks' "
                    "AND table_schema = current_schema()")}
                if QUEUE_COLUMNS - have == {"origin"}:  # a queue made before tasks kept their origin
                    self.db.execute("ALTER TABLE flowride_tasks ADD COLUMN IF NOT EXISTS origin TEXT")
                    have.add("origin")
        except psycopg.Error as e:
            self.db.close()
            raise InputError("--store", f"{redact(self.url)} cannot hold the task queue ({str(e).strip()})",
                             "give a database this user may create tables in") from None
        missing = sorted(QUEUE_COLUMNS - have)
        if missing:
            self.db.close()
            raise InputError("--store", f"{redact(self.url)} has a flowride_tasks table that is not flowride's task queue "
                             f"(it has no {', '.join(missing)})", "give another database, or drop that table")

    def describe(self) -> str:
        return redact(self.url)

    def close(self) -> None:
        """Stop renewing, and hand back every task still held (it is PAUSED and resumable):
        another host may take it at once instead of after its lease lapses."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        with self._lock:
            ids = list(self.held)
            self.held.clear()
        if ids and not self.db.closed:
            try:
                self.db.execute("UPDATE flowride_tasks SET owner = NULL, lease_expires = NULL WHERE id = ANY(%s) "
                                "AND owner = %s", (ids, self.owner))
            except _psycopg().Error:
                pass  # unreachable: the leases lapse on their own
        self.db.close()

    # ------------------------------------------------------------------ writes
    def submit(self, name: str, params: dict | None = None, priority: int = 0, memory_limit_mb: int | None = None,
               origin: str | None = None) -> int:
        now = time.time()
        row = self.db.execute(
            "INSERT INTO flowride_tasks (name, params, priority, memory_limit_mb, state, created, updated, origin) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (name, json.dumps(params or {}), int(priority), memory_limit_mb, TaskState.SUBMITTED.value, now, now, origin),
        ).fetchone()
        return int(row["id"])

    @contextmanager
    def run_lock(self):
        """Runs that start together look for their tasks' twins one at a time (harvest/rerun.py)."""
        with self.db.transaction():
            self.db.execute("SELECT pg_advisory_xact_lock(%s)", (SUBMIT_LOCK,))
            yield

    def resume_for_run(self, task_id: int, origin: str) -> None:
        """A run names a task the queue already holds unfinished: it is not submitted again. Only
        its origin changes: whichever host leases it runs it (it may be running on one now)."""
        self.set_origin(task_id, origin)

    def set_origin(self, task_id: int, origin: str) -> None:
        self.db.execute("UPDATE flowride_tasks SET origin = %s WHERE id = %s", (origin, task_id))

    def _fence(self, task_id: int) -> tuple[str, tuple]:
        """The condition under which this manager may write a task: the lease it was given is
        still the task's (owner and epoch: a lease taken over since bumped the epoch), or, for a
        task it never leased, nobody holds it and it is unfinished."""
        with self._lock:
            epoch = self.fences.get(task_id)
        if epoch is None:
            return f"{FREE} AND state = ANY(%s)", (LIVE,)
        return "owner = %s AND lease_epoch = %s", (self.owner, epoch)

    def _locked(self, task_id: int) -> dict | None:
        """The task's row, locked for this transaction, with ``ours`` (may this manager write it)."""
        cond, args = self._fence(task_id)
        return self.db.execute(f"SELECT *, ({cond}) AS ours FROM flowride_tasks WHERE id = %s FOR UPDATE",
                               (*args, task_id)).fetchone()

    def _lose(self, task_id: int) -> None:
        with self._lock:
            if self.held.pop(task_id, None) is not None:
                self._lost.add(task_id)

    def transition(self, task_id: int, new: TaskState | str, reason: str | None = None) -> TaskState:
        """Move a task to ``new`` if its life cycle allows it (IllegalTransition otherwise). A
        task whose lease this manager lost is left as it is (its state is returned)."""
        with self.db.transaction():
            row = self._locked(task_id)
            if row is None:
                raise InputError("task", f"no task {task_id}", "see flowride tasks list")
            if not row["ours"]:
                if task_id in self.fences:
                    self._lose(task_id)
                    return TaskState(row["state"])
                check_transition(row["state"], new)  # a finished task: IllegalTransition
                raise InputError("task", f"task {task_id} is leased by host {row['host']}",
                                 "cancel it (flowride tasks cancel): its manager stops it")
            state = check_transition(row["state"], new)
            self.db.execute("UPDATE flowride_tasks SET state = %s, reason = COALESCE(%s, reason), updated = %s WHERE id = %s",
                            (state.value, reason, time.time(), task_id))
        if state.terminal:
            with self._lock:
                self.held.pop(task_id, None)  # nothing left to renew
        return state

    def progress(self, task_id: int, steps: int, units: float, busy_s: float, overruns: int, stage: int | None = None) -> None:
        """The live counters of a running task (a view: the committed ones come with checkpoints)."""
        cond, args = self._fence(task_id)
        cur = self.db.execute(
            f"UPDATE flowride_tasks SET steps = %s, units = %s, busy_s = %s, overruns = %s, stage = COALESCE(%s, stage), "
            f"updated = %s WHERE id = %s AND {cond}",
            (steps, units, busy_s, overruns, stage, time.time(), task_id, *args))
        if cur.rowcount == 0:
            self._lose(task_id)

    def save_checkpoint(self, task_id: int, data: bytes, steps: int, units: float) -> bool:
        """The checkpoint, the steps and units it holds and their ledger row, in one transaction
        (False: not written, the lease was lost or the steps ran backwards)."""
        with self.db.transaction():
            row = self._locked(task_id)
            if row is None or not row["ours"]:
                self._lose(task_id)
                return False
            prev = self.db.execute("SELECT steps, units FROM flowride_checkpoints WHERE task_id = %s", (task_id,)).fetchone()
            s0, u0 = (int(prev["steps"]), float(prev["units"])) if prev else (0, 0.0)
            if steps < s0:
                return False
            now = time.time()
            if steps > s0 or units != u0:
                self.db.execute(
                    "INSERT INTO flowride_progress (task_id, host, lease_epoch, steps_from, steps_to, units_from, units_to, saved) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (task_id, self.host, row["lease_epoch"], s0, steps, u0, units, now))
            self.db.execute(
                "INSERT INTO flowride_checkpoints (task_id, data, steps, units, saved, host, lease_epoch) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (task_id) DO UPDATE SET data = excluded.data, "
                "steps = excluded.steps, units = excluded.units, saved = excluded.saved, host = excluded.host, "
                "lease_epoch = excluded.lease_epoch",
                (task_id, data, steps, units, now, self.host, row["lease_epoch"]))
            self.db.execute("UPDATE flowride_tasks SET steps = %s, units = %s, updated = %s WHERE id = %s",
                            (steps, units, now, task_id))
        return True

    def request_cancel(self, task_id: int) -> TaskRecord:
        """Ask for a task to stop: one nobody holds and that has not started stops at once; a
        leased one at its manager's next poll; one whose host died when its lease lapses."""
        with self.db.transaction():
            row = self.db.execute(f"SELECT state, {FREE} AS free FROM flowride_tasks WHERE id = %s FOR UPDATE",
                                  (task_id,)).fetchone()
            if row is None:
                raise InputError("task", f"no task {task_id}", "see flowride tasks list")
            if TaskState(row["state"]).terminal:
                raise InputError("task", f"task {task_id} is already {row['state']}", "only unfinished tasks can be cancelled")
            stop_now = row["state"] == TaskState.SUBMITTED.value and row["free"]
            self.db.execute(
                "UPDATE flowride_tasks SET cancel_requested = TRUE, state = CASE WHEN %s THEN 'STOPPED' ELSE state END, "
                "reason = CASE WHEN %s THEN 'cancelled before it started' ELSE reason END, updated = %s WHERE id = %s",
                (stop_now, stop_now, time.time(), task_id))
        return self.get(task_id)

    def recover(self, only: Any = None, since: float | None = None) -> list[int]:
        """After a manager crash on this host: the leases its dead predecessor held are handed
        back at once (not after they lapse); the next :meth:`lease` resumes them from their last
        checkpoint. Returns their ids. (``only``, ``since``: a SQLite store's run filter; the
        queue's tasks are the cluster's, which any manager leases.)"""
        rows = self.db.execute(
            "SELECT id, owner FROM flowride_tasks WHERE host = %s AND owner IS NOT NULL AND owner <> %s AND state = ANY(%s)",
            (self.host, self.owner, LIVE)).fetchall()
        out = []
        for r in rows:
            if not _owner_alive(r["owner"], self.host):
                self.db.execute("UPDATE flowride_tasks SET owner = NULL, lease_expires = NULL WHERE id = %s AND owner = %s",
                                (r["id"], r["owner"]))
                out.append(int(r["id"]))
        return out

    # ------------------------------------------------------------------ leases
    def lease(self, limit: int) -> list[TaskRecord]:
        """Take up to ``limit`` tasks nobody holds (submitted, or left by a host whose lease
        lapsed or that let them go), highest priority first. A task that had run before goes
        back to SUBMITTED with its counters at its last checkpoint (the steps after it are redone)."""
        self.db.execute(  # cancelled while its host was dying: nobody is left to stop it
            f"UPDATE flowride_tasks SET state = 'STOPPED', reason = 'cancelled by the user', updated = %s "
            f"WHERE cancel_requested AND state = ANY(%s) AND {FREE}", (time.time(), LIVE))
        if limit <= 0:
            return []
        rows = self.db.execute(
            f"""WITH picked AS (
                  SELECT id FROM flowride_tasks WHERE state = ANY(%s) AND NOT cancel_requested AND {FREE}
                  ORDER BY priority DESC, id LIMIT %s FOR UPDATE SKIP LOCKED)
                UPDATE flowride_tasks t SET
                  owner = %s, host = %s, lease_epoch = t.lease_epoch + 1,
                  lease_expires = clock_timestamp() + make_interval(secs => %s),
                  state = 'SUBMITTED',
                  restarts = t.restarts + CASE WHEN t.state = 'SUBMITTED' THEN 0 ELSE 1 END,
                  reason = CASE WHEN t.state = 'SUBMITTED' THEN t.reason
                           WHEN t.owner IS NULL THEN 'resumed from its last checkpoint on host ' || %s
                           ELSE 'resumed from its last checkpoint on host ' || %s || ': host ' || COALESCE(t.host, '?')
                                || ' let its lease lapse' END,
                  steps = COALESCE(c.steps, 0), units = COALESCE(c.units, 0), updated = %s
                FROM picked LEFT JOIN flowride_checkpoints c ON c.task_id = picked.id
                WHERE t.id = picked.id
                RETURNING t.*""",
            (LIVE, int(limit), self.owner, self.host, self.lease_s, self.host, self.host, time.time())).fetchall()
        with self._lock:
            for r in rows:
                self.held[int(r["id"])] = self.fences[int(r["id"])] = int(r["lease_epoch"])
                self._lost.discard(int(r["id"]))
        if rows and self._beat is None:
            self._last_renewed = time.monotonic()
            self._beat = threading.Thread(target=self._heartbeat, name="flowride-lease-heartbeat", daemon=True)
            self._beat.start()
        return [record_from(r) for r in rows]

    def held_records(self) -> list[TaskRecord]:
        """The tasks this manager holds now (a held task another manager took over is lost)."""
        with self._lock:
            held = dict(self.held)
        if not held:
            return []
        rows = self.db.execute("SELECT * FROM flowride_tasks WHERE id = ANY(%s) ORDER BY id", (list(held),)).fetchall()
        out = []
        for r in rows:
            if r["owner"] == self.owner and int(r["lease_epoch"]) == held[int(r["id"])]:
                out.append(record_from(r))
            else:
                self._lose(int(r["id"]))
        return out

    def lost(self) -> set[int]:
        """Tasks this manager must stop running now: another manager took them, or this one could
        not renew its leases for 0.8 x ``lease_s`` (it cannot know whether they lapsed)."""
        with self._lock:
            if self.held and time.monotonic() - self._last_renewed > 0.8 * self.lease_s:
                self._lost.update(self.held)
                self.held.clear()
            out, self._lost = self._lost, set()
        return out

    def _heartbeat(self) -> None:
        """Renew every held lease each ``lease_s / 3`` seconds, on a connection of its own (the
        scheduler may be busy for a while: the leases must not lapse meanwhile)."""
        psycopg = _psycopg()
        db = None
        while not self._stop.wait(self.lease_s / 3):
            with self._lock:
                held = dict(self.held)
            try:
                if db is None or db.closed:
                    db = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(self.lease_s / 3)))
                kept: set[int] = set()
                if held:
                    ids, epochs = list(held), [held[i] for i in held]
                    kept = {int(r[0]) for r in db.execute(
                        "UPDATE flowride_tasks t SET lease_expires = clock_timestamp() + make_interval(secs => %s) "
                        "FROM unnest(%s::bigint[], %s::bigint[]) AS h(id, epoch) "
                        "WHERE t.id = h.id AND t.lease_epoch = h.epoch AND t.owner = %s RETURNING t.id",
                        (self.lease_s, ids, epochs, self.owner)).fetchall()}
                with self._lock:
                    self._last_renewed = time.monotonic()
                    for i in held:
                        if i not in kept and self.held.get(i) == held[i]:
                            self.held.pop(i)
                            self._lost.add(i)
            except psycopg.Error:
                if db is not None:
                    db.close()
                db = None
        if db is not None:
            db.close()

    # ------------------------------------------------------------------ reads
    def get(self, task_id: int) -> TaskRecord:
        row = self.db.execute("SELECT * FROM flowride_tasks WHERE id = %s", (task_id,)).fetchone()
        if row is None:
            raise InputError("task", f"no task {task_id}", "see flowride tasks list")
        return record_from(row)

    def list(self) -> list[TaskRecord]:
        return [record_from(r) for r in self.db.execute("SELECT * FROM flowride_tasks ORDER BY id").fetchall()]

    def unfinished(self) -> list[TaskRecord]:
        return [t for t in self.list() if not t.state.terminal]

    def checkpoint(self, task_id: int) -> tuple[bytes, int, float] | None:
        row = self.db.execute("SELECT data, steps, units FROM flowride_checkpoints WHERE task_id = %s", (task_id,)).fetchone()
        return None if row is None else (bytes(row["data"]), int(row["steps"]), float(row["units"]))

    def ledger(self, task_id: int) -> list[dict[str, Any]]:
        """The committed progress of a task, oldest first: which host committed which steps."""
        rows = self.db.execute("SELECT host, lease_epoch, steps_from, steps_to, units_from, units_to, saved "
                               "FROM flowride_progress WHERE task_id = %s ORDER BY id", (task_id,)).fetchall()
        return [dict(r) for r in rows]
