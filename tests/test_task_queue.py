"""Several hosts: each host's own SQLite store (RUN_DIR/<host>/tasks.sqlite), a run directory on
a network filesystem, and the cluster queue in a real PostgreSQL server that this module starts
(leases, heartbeats, a dead host's tasks coming back, exactly-once progress, two managers on one
queue with one of them killed -9), and ``flowride train --side-tasks`` under torchrun on two
"nodes" (two launches on this machine, rendezvous on 127.0.0.1, each its own host id)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from clirun import ROOT, assert_clean_error, cli, wait_for
from flowride.errors import InputError
from flowride.harvest.hostfs import (
    HOST_ENV,
    MOUNTINFO_ENV,
    mount_of,
    network_mount,
    sanitize_host,
    store_path,
)
from flowride.harvest.manager import read_steps
from flowride.harvest.manager_files import ManagerOptions, write_options
from flowride.harvest.states import TaskState
from flowride.harvest.store import TaskStore
from flowride.harvest.stores import open_store, store_notes
from harvest_fixtures.shared import NORMAL_PRIORITY

pytestmark = pytest.mark.timeout(180)
TESTS = str(Path(__file__).resolve().parent)
FAKE = "harvest_fixtures.fake_tasks"
LEASE_S = 3.0  # short leases: a dead host's tasks come back within seconds (a renewal may be 2 s late)


@pytest.fixture(autouse=True)
def _fake_tasks(fake_tasks_importable, monkeypatch):
    """Every test here may start side-task processes that import tests/harvest_fixtures; they
    and the managers keep normal priority (harvest_fixtures.shared.NORMAL_PRIORITY)."""
    for k, v in NORMAL_PRIORITY.items():
        monkeypatch.setenv(k, v)


# ----------------------------------------------------------------------- a PostgreSQL server


def _pg_bin() -> Path | None:
    """The directory of initdb and pg_ctl: Debian's /usr/lib/postgresql/<version>/bin (newest),
    else wherever PATH finds them."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_server():
    """A throw-away PostgreSQL server on a free loopback port, trusting local connections; as
    root, initdb refuses to run, so the server runs as ``nobody`` in a directory it owns."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("no PostgreSQL server could be used: psycopg is not installed (pip install -e '.[cluster]')")
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server could be started: initdb not found (apt-get install postgresql)")
    base = Path(tempfile.mkdtemp(prefix="flowride-pg-"))
    as_user = {}
    if os.geteuid() == 0:
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        as_user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    data, log, port = base / "data", base / "server.log", _free_port()

    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bindir / cmd[0]), *cmd[1:]], capture_output=True, text=True, cwd=base, timeout=60, **as_user)

    r = run("initdb", "-D", str(data), "-A", "trust", "-U", "flowride", "-E", "UTF8", "--no-sync")
    if r.returncode == 0:
        r = run("pg_ctl", "start", "-w", "-t", "30", "-D", str(data), "-l", str(log),
                "-o", f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200")
    if r.returncode != 0:
        tail = (log.read_text(errors="replace") if log.exists() else r.stderr)[-400:]
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"no PostgreSQL server could be started ({bindir}): {tail.strip()}")
    try:
        yield f"postgresql://flowride@127.0.0.1:{port}"
    finally:
        run("pg_ctl", "stop", "-m", "immediate", "-D", str(data))
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server):
    """A fresh database of its own for each test."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{pg_server}/postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return f"{pg_server}/{name}"


def _expire(store) -> None:
    """A host that stops renewing (its heartbeat gone, as when the host dies), waited out."""
    store._stop.set()
    if store._beat is not None:
        store._beat.join(timeout=60)
    time.sleep(store.lease_s + 0.3)


# ----------------------------------------------------------------------- per-host SQLite


def test_each_host_keeps_its_own_sqlite_store(tmp_path, monkeypatch):
    assert sanitize_host("gpu-node 7/a") == "gpu-node_7_a" and sanitize_host("../up") == "_up"
    with pytest.raises(InputError, match=HOST_ENV):
        sanitize_host("...")
    monkeypatch.setenv(HOST_ENV, "alpha")
    a = TaskStore.in_run_dir(tmp_path)
    assert a.path == tmp_path / "alpha" / "tasks.sqlite" == store_path(tmp_path)
    a.submit(f"{FAKE}:Counter", {"total": 5})
    b = TaskStore.in_run_dir(tmp_path, "beta")
    assert b.path == tmp_path / "beta" / "tasks.sqlite" and b.list() == []  # never the same file
    assert open_store(None, tmp_path).path == a.path and [t.name for t in open_store(None, tmp_path).list()] == [f"{FAKE}:Counter"]
    # the CLI follows the same function: each host sees its own tasks
    env_a, env_b = {HOST_ENV: "alpha"}, {HOST_ENV: "beta"}
    r = cli("tasks", "submit", f"{FAKE}:Counter", "--run-dir", tmp_path, env=env_b)
    assert r.code == 0 and "submitted task 1" in r.out
    assert "Counter" in cli("tasks", "list", "--run-dir", tmp_path, env=env_a).out
    assert json.loads(cli("tasks", "show", "1", "--run-dir", tmp_path, env=env_b).out)["state"] == "SUBMITTED"
    assert (tmp_path / "beta" / "tasks.sqlite").exists() and not (tmp_path / "tasks.sqlite").exists()


def test_a_run_directory_of_the_old_layout_keeps_its_store(tmp_path, monkeypatch):
    monkeypatch.setenv(HOST_ENV, "alpha")
    old = TaskStore(tmp_path / "tasks.sqlite")  # written before stores were kept per host
    tid = old.submit("pagerank")
    assert store_path(tmp_path) == tmp_path / "tasks.sqlite"
    assert TaskStore.in_run_dir(tmp_path).get(tid).name == "pagerank"


def _nfs_mountinfo(tmp_path: Path, fstype: str = "nfs4") -> Path:
    """This machine's mount table with ``tmp_path`` mounted over NFS (its own device numbers)."""
    st = os.stat(tmp_path)
    real = Path("/proc/self/mountinfo").read_text()
    line = f"999 1 {os.major(st.st_dev)}:{os.minor(st.st_dev)} / {tmp_path} rw,relatime - {fstype} fileserver:/export/runs rw\n"
    f = tmp_path.parent / f"mountinfo-{tmp_path.name}"
    f.write_text(real + line)
    return f


def test_a_network_filesystem_is_detected_and_said(tmp_path, monkeypatch):
    assert mount_of("/proc").fstype == "proc" and network_mount(tmp_path) is None
    wal = TaskStore.in_run_dir(tmp_path / "local", "h")
    assert wal.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal" and wal.notes == []
    info = _nfs_mountinfo(tmp_path)
    monkeypatch.setenv(MOUNTINFO_ENV, str(info))
    m = network_mount(tmp_path / "run" / "deeper")
    assert m is not None and m.fstype == "nfs4" and m.point == str(tmp_path)
    st = TaskStore.in_run_dir(tmp_path / "run", "h")
    assert st.db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # WAL is unsafe there
    assert "nfs4" in st.notes[0] and "postgresql://" in st.notes[0]
    assert store_notes(None, tmp_path / "run") == st.notes
    (tmp_path / "run" / "tasks.sqlite").write_bytes(b"")  # an old-layout file may be another host's there
    assert store_path(tmp_path / "run", "h") == tmp_path / "run" / "h" / "tasks.sqlite"
    # said by `flowride manager status` too
    write_options(tmp_path / "run", ManagerOptions(stages=1, host="h"))
    r = cli("manager", "status", "--run-dir", tmp_path / "run", env={MOUNTINFO_ENV: str(info)})
    s = json.loads(r.out)
    assert r.code == 0 and "nfs4" in s["store_notes"][0] and s["store"].endswith("h/tasks.sqlite")


# ----------------------------------------------------------------------- the queue, piece by piece


def test_leases_are_exclusive_and_by_priority(pg_url):
    a, b = open_store(pg_url, "unused", "host-a"), open_store(pg_url, "unused", "host-b")
    low = a.submit(f"{FAKE}:Counter")
    high = a.submit(f"{FAKE}:Counter", priority=5)
    third = b.submit(f"{FAKE}:Counter")
    assert [r.id for r in a.lease(2)] == [high, low]
    assert [r.id for r in b.lease(5)] == [third] and a.lease(1) == []
    assert {t.id: t.host for t in b.list()} == {low: "host-a", high: "host-a", third: "host-b"}
    # many managers leasing at once never take the same task (FOR UPDATE SKIP LOCKED)
    ids = {a.submit(f"{FAKE}:Counter") for _ in range(30)}
    stores = [open_store(pg_url, "unused", f"h{i}") for i in range(4)]
    got: list[list[int]] = [[] for _ in stores]

    def take(i):
        while True:
            recs = stores[i].lease(1)
            if not recs:
                return
            got[i] += [r.id for r in recs]

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    taken = [i for g in got for i in g]
    assert sorted(taken) == sorted(ids)
    for s in (a, b, *stores):
        s.close()


def _lease_expires(store, tid: int):
    return store.db.execute("SELECT lease_expires AS t FROM flowride_tasks WHERE id = %s", (tid,)).fetchone()["t"]


def _db_now(store):
    return store.db.execute("SELECT clock_timestamp() AS t").fetchone()["t"]


def test_a_heartbeat_keeps_the_lease_and_a_dead_host_loses_it(pg_url):
    a = open_store(pg_url, "unused", "host-a", lease_s=LEASE_S)
    b = open_store(pg_url, "unused", "host-b", lease_s=LEASE_S)
    tid = a.submit(f"{FAKE}:Counter")
    assert [r.id for r in a.lease(1)] == [tid]
    first = _lease_expires(a, tid)
    wait_for(lambda: _db_now(a) > first)  # past the first lease: held only because it was renewed
    assert _lease_expires(a, tid) > first
    assert b.lease(1) == [] and a.lost() == set() and [r.id for r in a.held_records()] == [tid]
    _expire(a)  # host a stops renewing
    assert [r.id for r in b.lease(1)] == [tid]
    assert a.lost() == {tid}  # the dead host's manager, were it alive, now stops the task
    assert b.get(tid).host == "host-b"
    b.close()


def test_exactly_once_progress_through_a_host_death(pg_url):
    a = open_store(pg_url, "unused", "host-a", lease_s=1.0)
    b = open_store(pg_url, "unused", "host-b", lease_s=1.0)
    tid = a.submit(f"{FAKE}:Counter", {"total": 20})
    a.lease(1)
    a.transition(tid, TaskState.CREATED)
    a.transition(tid, TaskState.RUNNING)
    assert a.save_checkpoint(tid, pickle.dumps({"i": 5}), 5, 5.0)
    a.progress(tid, 8, 8.0, 0.1, 0)  # three more steps, not checkpointed: they die with host a
    assert a.get(tid).steps == 8
    _expire(a)
    rec = b.lease(1)[0]
    assert (rec.state, rec.steps, rec.units, rec.restarts) == (TaskState.SUBMITTED, 5, 5.0, 1)
    assert "host-a" in rec.reason and b.checkpoint(tid) == (pickle.dumps({"i": 5}), 5, 5.0)
    # host a was only slow: its late writes change nothing (the lease epoch moved on)
    assert not a.save_checkpoint(tid, pickle.dumps({"i": 8}), 8, 8.0)
    a.progress(tid, 9, 9.0, 0.2, 0)
    assert a.transition(tid, TaskState.FINISHED) is TaskState.SUBMITTED
    assert b.get(tid).steps == 5 and b.checkpoint(tid)[1] == 5
    b.transition(tid, TaskState.CREATED)
    b.transition(tid, TaskState.RUNNING)
    assert b.save_checkpoint(tid, pickle.dumps({"i": 12}), 12, 12.0)  # steps 6..8 redone, counted once
    assert not b.save_checkpoint(tid, pickle.dumps({"i": 3}), 3, 3.0)  # never backwards
    assert b.save_checkpoint(tid, pickle.dumps({"i": 20}), 20, 20.0)
    b.transition(tid, TaskState.FINISHED)
    ledger = b.ledger(tid)
    assert [(r["host"], r["steps_from"], r["steps_to"]) for r in ledger] == [("host-a", 0, 5), ("host-b", 5, 12), ("host-b", 12, 20)]
    assert sum(r["steps_to"] - r["steps_from"] for r in ledger) == 20 == b.get(tid).steps
    b.close()


def test_cancel_recover_and_a_clean_close(pg_url):
    a = open_store(pg_url, "unused", "host-a")
    idle, leased = a.submit("pagerank"), a.submit("pagerank")
    assert a.request_cancel(idle).state is TaskState.STOPPED  # nobody held it: stopped at once
    a.lease(5)
    assert a.request_cancel(leased).state is TaskState.SUBMITTED  # its manager stops it at its next poll
    assert a.held_records()[0].cancel_requested
    with pytest.raises(InputError, match="already STOPPED"):
        a.request_cancel(idle)
    other = a.submit("pagerank")
    assert [r.id for r in a.lease(5)] == [other]
    # the manager dies; the next one on this host hands its leases back at once, while a
    # live manager's are left alone
    a.db.execute("UPDATE flowride_tasks SET owner = 'host-a:999999:1' WHERE id = %s", (other,))
    again = open_store(pg_url, "unused", "host-a")
    assert again.recover() == [other] and again.get(other).host == "host-a"
    assert [r.id for r in again.lease(5)] == [other] and again.get(other).restarts == 0
    again.transition(other, TaskState.CREATED)
    again.transition(other, TaskState.PAUSED)
    again.close()  # a clean stop hands the lease back: another host takes it without waiting
    b = open_store(pg_url, "unused", "host-b")
    rec = b.lease(5)
    assert [r.id for r in rec] == [other] and rec[0].restarts == 1 and "host-b" in rec[0].reason
    b.close()
    a.close()


def test_a_rerun_submits_only_what_the_queue_lacks(pg_url):
    """The queue's rule (harvest/rerun.py): a run submits only the named tasks with no unfinished
    twin in the queue; tasks left in the queue are the cluster's work, leased by any manager."""
    from flowride.harvest.rerun import RESUMED, SUBMITTED, prepare_run

    q = open_store(pg_url, "unused", "host-a")
    named = [("pagerank", {"n": 10}), ("pagerank", {"n": 10}), ("image", {})]
    first = prepare_run(q, named)
    assert [t["origin"] for t in first["tasks"]] == [SUBMITTED] * 3
    leftover = q.submit("cnn", {})
    (held,) = q.lease(1)  # one of them runs on a host now
    again = prepare_run(q, named + [("pagerank", {"n": 11})])
    assert [t["id"] for t in again["tasks"][:3]] == first["ids"] and again["tasks"][3]["origin"] == SUBMITTED
    assert [t["origin"] for t in again["tasks"][:3]] == [RESUMED] * 3 and again["left"] == []
    assert len(q.list()) == 5 and q.get(held.id).state is TaskState.SUBMITTED and q.get(held.id).origin == RESUMED
    assert q.get(leftover).origin is None and q.get(leftover).state is TaskState.SUBMITTED  # untouched, and ...
    assert leftover in {r.id for r in q.lease(10)}  # ... leased like any other task
    # a queue made before tasks kept their origin gains the column
    q.db.execute("ALTER TABLE flowride_tasks DROP COLUMN origin")
    old = open_store(pg_url, "unused", "host-b")
    assert old.get(leftover).origin is None and old.get(leftover).to_dict()["origin"] is None
    old.close()
    q.close()


# ----------------------------------------------------------------------- two hosts, one queue


def _manager(run_dir: Path, host: str, url: str, monkeypatch):
    from flowride.harvest.supervise import ManagerProcess

    monkeypatch.setenv(HOST_ENV, host)  # the host id the manager takes, as on a real host
    mp = ManagerProcess(run_dir, ManagerOptions(stages=1, mode="naive", store=url, lease_s=LEASE_S), {})
    mp.start()
    return mp


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _task_pids(run_dir: Path) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "flowride.harvest.runner" in cmd and str(run_dir) in cmd:
                out.append(int(pid))
    return out


def test_two_hosts_share_one_queue_and_survive_a_kill_9(tmp_path, pg_url, monkeypatch):
    """One task, submitted once: it runs on exactly one host; that host's manager is killed -9;
    the other host takes the task once the lease lapses and finishes it from the checkpoint.
    Every step is committed exactly once (the ledger covers 0..N without gap or overlap)."""
    total = 4000  # 4 s of work: its first checkpoint on host a comes after about 2 s
    sub = open_store(pg_url, tmp_path, "submitter")
    tid = sub.submit(f"{FAKE}:Counter", {"total": total, "step_ms": 1})
    a = _manager(tmp_path / "a", "host-a", pg_url, monkeypatch)
    b = None
    try:
        wait_for(lambda: sub.get(tid).host == "host-a")
        b = _manager(tmp_path / "b", "host-b", pg_url, monkeypatch)  # polls the queue while a holds the task
        wait_for(lambda: (sub.checkpoint(tid) or (b"", 0, 0))[1] > 0)
        on_a = _task_pids(tmp_path / "a")
        assert len(on_a) == 1
        os.kill(on_a[0], signal.SIGSTOP)  # held still till it dies below: unfinished, however slow all this was
        assert sub.get(tid).state is not TaskState.FINISHED
        assert sub.get(tid).host == "host-a" and read_steps(tmp_path / "b") == [] and _task_pids(tmp_path / "b") == []
        os.killpg(a.proc.pid, signal.SIGKILL)  # host a dies: its manager and (death signal) its task
        a.proc.wait()
        killed = time.monotonic()  # the steps are on the monotonic clock
        wait_for(lambda: not _alive(on_a[0]))
        wait_for(lambda: sub.get(tid).state is TaskState.FINISHED, timeout=120)
    finally:
        a.stop()
        rec_b = b.stop() if b is not None else {}
    t = sub.get(tid)
    ledger = sub.ledger(tid)
    assert t.host == "host-b" and t.restarts == 1 and t.steps == total and t.units == total
    assert {r["host"] for r in ledger} == {"host-a", "host-b"}
    pos = 0
    for r in ledger:  # contiguous: nothing lost, nothing counted twice
        assert r["steps_from"] == pos and r["steps_to"] > pos
        pos = r["steps_to"]
    assert pos == total
    assert pickle.loads(sub.checkpoint(tid)[0]) == {"i": total}  # the task's own count agrees
    steps_a, steps_b = read_steps(tmp_path / "a"), read_steps(tmp_path / "b")
    assert steps_a and steps_b and all(s["t0"] > killed - 0.5 for s in steps_b)  # b began after a died
    committed_by_a = sum(r["steps_to"] - r["steps_from"] for r in ledger if r["host"] == "host-a")
    assert len(steps_a) >= committed_by_a and len(steps_b) == total - committed_by_a  # a's uncommitted steps redone once
    assert rec_b["store"].startswith("postgresql://") and [x["host"] for x in rec_b["tasks"]] == ["host-b"]
    sub.close()


def test_the_cli_drives_the_queue(tmp_path, pg_url):
    r = cli("tasks", "submit", f"{FAKE}:Counter", "--params", '{"total": 3}', "--store", pg_url, "--run-dir", tmp_path / "none")
    assert r.code == 0 and "submitted task 1" in r.out  # no run directory needed
    ls = cli("tasks", "list", "--store", pg_url)
    assert ls.code == 0 and "SUBMITTED" in ls.out and "host" in ls.out
    assert "STOPPED" in cli("tasks", "cancel", "1", "--store", pg_url).out
    assert_clean_error(cli("tasks", "list", "--store", "mysql://x/y"), 2, "--store", "postgresql://")
    dead = f"postgresql://flowride@127.0.0.1:{_free_port()}/nothing"
    assert_clean_error(cli("tasks", "list", "--store", dead), 2, "--store", "cannot use", within=30)
    write_options(tmp_path, ManagerOptions(stages=1, host="h"))  # a manager of the per-host SQLite store ...
    assert json.loads(cli("manager", "status", "--run-dir", tmp_path).out)["store"].endswith("h/tasks.sqlite")
    s = json.loads(cli("manager", "status", "--run-dir", tmp_path, "--store", pg_url).out)  # ... asked about the queue
    assert s["store"] == pg_url and s["tasks"][0]["state"] == "STOPPED" and "host" in s["tasks"][0]
    assert_clean_error(cli("manager", "stop", "--run-dir", tmp_path, "--store", pg_url), 2, "--store")
    try:  # restarted onto the queue: it keeps the store (and its host id) in manager.json
        assert cli("manager", "restart", "--run-dir", tmp_path, "--store", pg_url).code == 0
        s = json.loads(cli("manager", "status", "--run-dir", tmp_path).out)
        assert s["alive"] and s["options"]["store"] == pg_url and s["options"]["host"] == "h"
    finally:
        assert cli("manager", "stop", "--run-dir", tmp_path).code == 0


def test_train_on_one_host_leases_from_the_queue(tmp_path, pg_url):
    from flowride.harvest.hostfs import host_id

    rep_path = tmp_path / "r.json"
    # what the queue changes needs no baseline training and no profiling: both given (training
    # untouched by side work is checked in tests/test_harvest.py)
    (tmp_path / "base.json").write_text(json.dumps({"iteration_times_s": [0.05] * 4, "iteration_time_s": 0.05,
                                                    "losses": [0.0] * 6, "bubble_seconds_total": 0.1}))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "task-profiles.json").write_text(json.dumps({f"{FAKE}:Counter": {
        "task": f"{FAKE}:Counter", "unit": "ticks", "steps": 30, "setup_s": 0.0, "peak_memory_bytes": 1 << 20, "device": "cpu",
        "median_step_s": 0.002, "p90_step_s": 0.003, "throughput": 500.0}}))
    r = cli("train", "-p", "2", "-m", "4", "--model", "tiny", "--iters", "6", "--paired-block", "1", "--side-tasks",
            f"{FAKE}:Counter", "--store", pg_url, "--baseline-report", tmp_path / "base.json", "--run-dir", tmp_path / "run",
            "--report", rep_path, timeout=150)
    assert r.code == 0, r.err[-3000:]
    rep = json.loads(rep_path.read_text())
    q = open_store(pg_url, tmp_path, "reader")
    assert [(t.name, t.host, t.state) for t in q.list()] == [(f"{FAKE}:Counter", host_id(), TaskState.PAUSED)]
    assert rep["tasks"][0]["host"] == host_id() and rep["store_notes"] == []
    assert not (tmp_path / "run" / host_id()).exists()  # no SQLite file: the queue holds the tasks
    assert q.checkpoint(q.list()[0].id) is not None  # saved in the database when the manager stopped
    q.close()
    assert_clean_error(cli("train", "--store", pg_url, "--run-dir", tmp_path / "x"), 2, "--store", "--side-tasks")


# ----------------------------------------------------------------------- flowride train on two nodes

NODE_TIMEOUT_S = 150


def _left(marker: str) -> list[int]:
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmd and "pytest" not in cmd:
                left.append(int(pid))
    return left


def _two_hosts(tmp_path: Path, args: list[str], per_node: int = 2) -> list[tuple[int, str, str]]:
    """``torchrun --nnodes 2 --nproc-per-node PER_NODE -m flowride ARGS`` as two nodes on this machine,
    node k in ``tmp_path/nodek`` with ``FLOWRIDE_HOST_ID=node-k`` (``{node}`` in ARGS: its directory)."""
    port = _free_port()
    procs = []
    for k in range(2):
        node = tmp_path / f"node{k}"
        node.mkdir(exist_ok=True)
        e = dict(os.environ)
        e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), TESTS, e.get("PYTHONPATH", "")])
        e.update({"COLUMNS": "200", "OMP_NUM_THREADS": "1", HOST_ENV: f"node-{k}"})
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", str(per_node),
               "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0",
               "-m", "flowride", *[a.replace("{node}", str(node)) for a in args]]
        procs.append(subprocess.Popen(cmd, cwd=node, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    outs = []
    try:
        deadline = time.monotonic() + NODE_TIMEOUT_S
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append((p.returncode, out, err))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the two-node run did not finish within {NODE_TIMEOUT_S} s")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        time.sleep(0.2 if any(p.poll() is None for p in procs) else 0)
        for pid in _left(str(tmp_path)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.kill()
            p.wait()
    return outs


def _train(stages: int) -> list[str]:
    return ["train", "-p", str(stages), "-m", "4", "--model", "small", "--iters", "6", "--paired-block", "1",
            "--side-tasks", f"{FAKE}:Counter", "--run-dir", "{node}/rd", "--report", "{node}/report.json"]


def test_train_on_two_nodes_starts_one_manager_per_host(tmp_path):
    outs = _two_hosts(tmp_path, _train(4))
    (c0, out0, err0), (c1, out1, err1) = outs
    assert c0 == 0 and c1 == 0, (err0[-3000:], err1[-3000:])
    assert "harvest (freeride)" in out0 and out1.strip() == "", (out0, out1)
    rep = json.loads((tmp_path / "node0" / "report.json").read_text())
    assert [h["host"] for h in rep["hosts"]] == ["node-0", "node-1"] and rep["harvest_mode"] == "freeride"
    assert rep["overhead_pairs"] >= 1 and rep["failures"] == []
    for k in range(2):  # each host its own manager and its own store, with its own copy of the task
        rd = tmp_path / f"node{k}" / "rd"
        store = TaskStore(rd / f"node-{k}" / "tasks.sqlite")
        assert [t.name for t in store.list()] == [f"{FAKE}:Counter"]
        assert json.loads((rd / "manager.json").read_text())["host"] == f"node-{k}"
    assert {t["id"] for t in rep["tasks"]} == {"node-0:1", "node-1:1"}
    # both hosts' stages reached their own manager (node 1's ranks learned its port from torchrun's store)
    assert rep["side_work"]["node-0:1"]["steps"] > 0 and rep["side_work"]["node-1:1"]["steps"] > 0
    assert all(h["steps"] > 0 for h in rep["hosts"])
    assert _left(str(tmp_path)) == []


def test_train_on_two_nodes_submits_once_to_the_queue(tmp_path, pg_url):
    """One rank per node: the queue's rule is per host (several ranks on a host: the test above)."""
    outs = _two_hosts(tmp_path, [*_train(2), "--store", pg_url], per_node=1)
    (c0, out0, err0), (c1, _, err1) = outs
    assert c0 == 0 and c1 == 0, (err0[-3000:], err1[-3000:])
    rep = json.loads((tmp_path / "node0" / "report.json").read_text())
    q = open_store(pg_url, tmp_path, "reader")
    tasks = q.list()
    assert len(tasks) == 1 and tasks[0].host in ("node-0", "node-1")  # submitted once, held by one host
    assert [t["id"] for t in rep["tasks"]] == [tasks[0].id] and [h["host"] for h in rep["hosts"]] == ["node-0", "node-1"]
    ran = [k for k in range(2) if read_steps(tmp_path / f"node{k}" / "rd")]
    assert ran == [int(tasks[0].host[-1])]  # it ran on the host that holds it, and only there
    q.close()
