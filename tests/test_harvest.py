"""Harvesting: task life cycle, the fits-the-bubble rule, signals, limits, failures, the durable
store (kill -9 and resume), submissions during a run, the cost formula, and the CLI.

Bubbles published here are real-time events, and a busy machine may hand them to the manager
late. So no verdict counts steps in a window of a few ms: each rests on what the manager decided
(its record keeps every fit decision: the time left, the step's need, the task started or why
none; ``fitting.Decisions``), on the host's own rule (a step starts only while ``until - t0 >
need_s``, judged on the very reading recorded as ``t0``), or on logical events (a bubble stays
open until the test ends it with the stage's ``busy`` event, after the steps it waits for)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clirun import wait_for
from flowride.harvest.cost import harvest_efficiency, savings
from flowride.harvest.fitting import UNPROFILED_STEP_S, fit_time, step_fits
from flowride.harvest.manager import ManagerOptions, read_steps
from flowride.harvest.states import IllegalTransition, TaskState, check_transition
from flowride.harvest.store import TaskStore
from flowride.pipeline.events import BubbleEvent, BubblePublisher
from harvest_fixtures.shared import NORMAL_PRIORITY, once, tiny_1f1b_report

pytestmark = pytest.mark.timeout(240)
TESTS = str(Path(__file__).resolve().parent)
FAKE = "harvest_fixtures.fake_tasks"


OPEN = 600.0  # a bubble the test itself ends (a "busy" event) once it has seen what it waits for


@pytest.fixture(autouse=True)
def _fake_tasks(fake_tasks_importable, monkeypatch):
    """Every test here may start side-task processes that import tests/harvest_fixtures; they
    and the manager keep normal priority (harvest_fixtures.shared.NORMAL_PRIORITY)."""
    for k, v in NORMAL_PRIORITY.items():
        monkeypatch.setenv(k, v)


def start_manager(run_dir: Path, stages: int, mode: str, profiles: dict, **opts):
    """A supervised manager (not watched unless the test asks), and its port."""
    from flowride.harvest.supervise import ManagerProcess

    mp = ManagerProcess(run_dir, ManagerOptions(stages=stages, mode=mode, **opts), profiles)
    return mp, mp.start()


def stop_manager(mp, run_dir: Path) -> dict:
    return mp.stop()


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]


def alive(pid: int) -> bool:
    try:
        return proc_state(pid) not in ("Z", "X")
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------------------------ pieces


def test_state_machine():
    S = TaskState
    path = [S.SUBMITTED, S.CREATED, S.PAUSED, S.RUNNING, S.PAUSED, S.RUNNING, S.FINISHED]
    for a, b in zip(path, path[1:], strict=False):
        assert check_transition(a, b) is b
    for bad in [(S.SUBMITTED, S.RUNNING), (S.FINISHED, S.RUNNING), (S.FAILED, S.PAUSED), (S.STOPPED, S.CREATED), (S.PAUSED, S.CREATED)]:
        with pytest.raises(IllegalTransition):
            check_transition(*bad)
    assert all(s.terminal for s in (S.FINISHED, S.FAILED, S.STOPPED))


def test_fits_the_bubble_rule():
    # median 2.1 ms rounds up to 3 ms, times 1.2
    assert fit_time(0.0021) == pytest.approx(0.0036)
    assert fit_time(0.002) == pytest.approx(0.0024)
    assert step_fits(0.0037, 0.0021) and not step_fits(0.0036, 0.0021) and not step_fits(0.001, 0.0021)
    assert fit_time(0.010, factor=2.0) == pytest.approx(0.020)


def test_cost_formula_overhead_lowers_savings():
    free = savings(t_v=100.0, t_f=100.0, dedicated_seconds=20.0, p_ref=1.0, p_main=2.0)
    slowed = savings(t_v=100.0, t_f=110.0, dedicated_seconds=20.0, p_ref=1.0, p_main=2.0)
    assert free["overhead_term"] == 0.0 and free["value_term"] == pytest.approx(0.1) and free["savings"] == pytest.approx(0.1)
    assert slowed["overhead_term"] == pytest.approx(-0.1)
    assert slowed["savings"] == pytest.approx(0.0) and slowed["savings"] < free["savings"]
    assert harvest_efficiency(5.0, 10.0) == 0.5 and harvest_efficiency(1.0, 0.0) == 0.0


def test_store_is_wal_and_keeps_everything(tmp_path):
    from flowride.harvest.hostfs import host_id

    st = TaskStore.in_run_dir(tmp_path)
    assert st.path == tmp_path / host_id() / "tasks.sqlite"  # this host's own file (RUN_DIR/<host>/)
    assert st.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    a = st.submit("pagerank", {"n": 100}, priority=2, memory_limit_mb=512)
    b = st.submit("cnn")
    st.transition(a, TaskState.CREATED)
    st.transition(a, TaskState.PAUSED)
    with pytest.raises(IllegalTransition):
        st.transition(a, TaskState.SUBMITTED)
    st.save_checkpoint(a, b"state-bytes", 7, 70.0)
    other = TaskStore.in_run_dir(tmp_path)  # a second connection sees it (e.g. the CLI)
    rec = other.get(a)
    assert rec.state is TaskState.PAUSED and rec.params == {"n": 100} and rec.priority == 2 and rec.memory_limit_mb == 512
    assert other.checkpoint(a) == (b"state-bytes", 7, 70.0)
    assert other.request_cancel(b).state is TaskState.STOPPED  # not started: stops at once
    assert st.recover() == [a] and st.get(a).state is TaskState.SUBMITTED and st.get(a).restarts == 1


# ------------------------------------------------------------------------------------ manager


def _switches(pid: int) -> int:
    """Context switches of process ``pid`` so far: they grow only while it runs (the Looper
    sleeps 2 ms per unit, one switch each), never while it is SIGSTOPped."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return sum(int(ln.split()[1]) for ln in lines if ln.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))


def test_imperative_task_paused_and_resumed_by_signal(tmp_path):
    """SIGCONT in the bubble, SIGSTOP at its predicted end: the task ran (its context switches
    grew while the test watched it stopped before), then stopped, and only once the predicted
    end had passed, whenever the manager got to it."""
    st = TaskStore.in_run_dir(tmp_path)
    tid = st.submit(f"{FAKE}:Looper", {"total": 100000})
    proc, port = start_manager(tmp_path, 1, "freeride", {})
    try:
        pid = wait_for(lambda: _host_pid(tmp_path, tid))
        wait_for(lambda: proc_state(pid) == "T")  # SIGSTOPped until its first bubble
        before = _switches(pid)
        pub = BubblePublisher(port)
        now = time.monotonic()
        pub.publish(BubbleEvent("bubble", 0, "B", now, now + 0.6, 10**10, 0))
        wait_for(lambda: _switches(pid) > before)  # SIGCONT: it runs in the bubble
        wait_for(lambda: proc_state(pid) == "T")  # SIGSTOP: at the predicted end, not before
        assert time.monotonic() >= now + 0.6
        pub.close()
    finally:
        stop_manager(proc, tmp_path)
    rec = TaskStore.in_run_dir(tmp_path).get(tid)
    assert 0 < rec.units < 100000  # it worked only inside the bubble, then saved on SIGTERM
    assert rec.state is TaskState.PAUSED


def _host_pid(run_dir: Path, tid: int) -> int | None:
    needle = f"task{tid}.ckpt"
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "flowride.harvest.runner" in cmd and needle in cmd and str(run_dir) in cmd:
                return int(pid)
    return None


def _decisions(rec: dict) -> list[dict]:
    return rec["bubbles"]["decisions"]


def _end_bubble(pub: BubblePublisher, stage: int, tid: int, run_dir: Path) -> None:
    """The stage computes again: the task yields (its state goes back to PAUSED)."""
    pub.publish(BubbleEvent("busy", stage, "-", time.monotonic(), None, 0, 0))
    wait_for(lambda: TaskStore.in_run_dir(run_dir).get(tid).state is TaskState.PAUSED)


def test_iterative_steps_only_when_they_fit(tmp_path):
    """A 4 ms bubble can never hold a step that needs 6 ms (5 ms rounded up, x 1.2): the manager
    starts none there, however soon it sees it. An open bubble gets steps, each started while
    its bubble had more than the need left (the host's rule); none outside it."""
    st = TaskStore.in_run_dir(tmp_path)
    tid = st.submit(f"{FAKE}:Counter", {"step_ms": 5})
    profiles = {f"{FAKE}:Counter": {"median_step_s": 0.005}}
    proc, port = start_manager(tmp_path, 1, "freeride", profiles)
    pub = BubblePublisher(port)
    try:
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(tid).state is TaskState.PAUSED)
        short = time.monotonic()
        pub.publish(BubbleEvent("bubble", 0, "D", short, short + 0.004, 10**10, 0))  # too short for a 6 ms need
        time.sleep(0.05)
        long = time.monotonic()
        pub.publish(BubbleEvent("bubble", 0, "B", long, long + OPEN, 10**10, 1))
        wait_for(lambda: len(read_steps(tmp_path)) >= 5)
        _end_bubble(pub, 0, tid, tmp_path)
    finally:
        pub.close()
        rec = stop_manager(proc, tmp_path)
    shorts = [d for d in _decisions(rec) if d.get("type") == "D"]
    assert shorts and all(d["task"] is None and d["left_s"] <= 0.004 < d["need_s"] == pytest.approx(0.006) for d in shorts)
    assert shorts[0]["why"].startswith(("no side task's step fits", "the bubble had ended", "every side task was busy"))
    (d_long,) = [d for d in _decisions(rec) if d.get("type") == "B" and d["task"] is not None]
    assert d_long["task"] == tid and d_long["need_s"] == pytest.approx(0.006) and d_long["need_s"] < d_long["left_s"]
    steps = rec["steps"]
    assert len(steps) >= 5 and all(s["t0"] >= long for s in steps)  # none in the 4 ms bubble
    assert all(long + OPEN - s["t0"] > d_long["need_s"] for s in steps)


@pytest.mark.parametrize(
    ("task", "params", "mem", "reason"),
    [
        ("Crasher", {"after": 3}, None, "side task crashed on purpose"),
        ("Hog", {"mb": 4096}, 1500, "out of memory (limit 1500 MB)"),
        ("Stubborn", {}, None, "ignored a pause"),
    ],
)
def test_misbehaving_task_fails_alone(tmp_path, task, params, mem, reason):
    st = TaskStore.in_run_dir(tmp_path)
    bad = st.submit(f"{FAKE}:{task}", params, memory_limit_mb=mem)
    good = st.submit(f"{FAKE}:Counter", {"total": 400})
    proc, _ = start_manager(tmp_path, 2, "naive", {})
    try:
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(bad).state is TaskState.FAILED, timeout=120)
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(good).state is TaskState.FINISHED, timeout=120)
    finally:
        rec = stop_manager(proc, tmp_path)
    r = TaskStore.in_run_dir(tmp_path).get(bad)
    assert reason in r.reason
    assert [f["task"] for f in rec["failures"]] == [bad]
    assert not _host_pid(tmp_path, bad)


def _saved(run_dir: Path, tid: int) -> int:
    """Steps in task ``tid``'s last checkpoint in the store (0: none yet)."""
    return (TaskStore.in_run_dir(run_dir).checkpoint(tid) or (b"", 0, 0))[1]


def _resumed_from_its_checkpoint(run_dir: Path, tid: int, saved: int) -> None:
    """A Counter's own count (pickled) equals the steps the store holds for it, past ``saved``:
    it went on from the checkpoint (from zero, its count would lag the store's by ``saved``).
    Read from a checkpoint taken while the manager runs (its events all read first)."""
    blob, steps, units = TaskStore.in_run_dir(run_dir).checkpoint(tid)
    assert pickle.loads(blob)["i"] == steps == units > saved


def test_store_survives_kill_9_and_resumes(tmp_path):
    st = TaskStore.in_run_dir(tmp_path)
    tid = st.submit(f"{FAKE}:Counter", {"step_ms": 2})  # endless: still running when the manager dies
    waiting = st.submit(f"{FAKE}:Counter", {"total": 5})  # stage 1
    proc, _ = start_manager(tmp_path, 2, "naive", {})
    wait_for(lambda: _saved(tmp_path, tid) > 0)
    host = _host_pid(tmp_path, tid)
    os.killpg(proc.proc.pid, signal.SIGKILL)  # the manager dies without saying goodbye
    proc.proc.wait()
    wait_for(lambda: not alive(host))  # its side task went with it (no orphan)
    saved = _saved(tmp_path, tid)
    proc2, _ = start_manager(tmp_path, 2, "naive", {})
    try:
        wait_for(lambda: _saved(tmp_path, tid) > saved)  # the new manager's own checkpoint of it
        _resumed_from_its_checkpoint(tmp_path, tid, saved)
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(waiting).state is TaskState.FINISHED)
    finally:
        stop_manager(proc2, tmp_path)
    assert TaskStore.in_run_dir(tmp_path).get(tid).restarts == 1


def test_tasks_cli_submit_list_cancel_while_running(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "flowride", "tasks", *args, "--run-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=60)

    proc, _ = start_manager(tmp_path, 1, "naive", {})
    try:
        p = cli("submit", f"{FAKE}:Counter", "--params", '{"total": 200}')
        assert p.returncode == 0 and "submitted task 1" in p.stdout
        long = cli("submit", f"{FAKE}:Counter", "--params", '{"total": 100000000}', "--priority", "5")
        assert long.returncode == 0
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(2).steps > 0)
        c = cli("cancel", "2")
        assert c.returncode == 0 and "cancel requested" in c.stdout
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(2).state is TaskState.STOPPED)
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(1).state is TaskState.FINISHED)
        ls = cli("list")
        assert ls.returncode == 0 and "FINISHED" in ls.stdout and "STOPPED" in ls.stdout
        show = cli("show", "1")
        assert json.loads(show.stdout)["units"] == 200
        bad = cli("submit", "no-such-task")
        assert bad.returncode == 2 and "unknown side task" in bad.stderr
    finally:
        stop_manager(proc, tmp_path)


# ------------------------------------------------------------------------------------ end to end


def test_train_with_side_tasks_through_the_cli(tmp_path):
    rep_path, png = tmp_path / "r.json", tmp_path / "t.png"
    p = subprocess.run(
        [sys.executable, "-m", "flowride", "train", "--stages", "2", "--microbatches", "4", "--model", "small", "--iters", "6",
         "--paired-block", "1",
         "--side-tasks", "pagerank,image", "--harvest", "freeride", "--run-dir", str(tmp_path / "run"),
         "--report", str(rep_path), "--timeline", str(png)],
        capture_output=True, text=True, timeout=200,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    rep = json.loads(rep_path.read_text())
    for key in ("harvest_mode", "overhead_pct", "overhead_ci95", "bubble_prediction_error", "side_work", "harvest_efficiency",
                "cost", "losses_identical", "failures", "budget_verdict", "manager_restarts", "harvest_stopped"):
        assert key in rep
    assert rep["overhead_pairs"] == 2 and rep["overhead_ci95"][0] <= rep["overhead_pct"] <= rep["overhead_ci95"][1]
    assert rep["harvest_mode"] == "freeride" and rep["losses_identical"] is True and rep["failures"] == []
    assert {"overhead_term", "value_term", "savings"} <= set(rep["cost"])
    assert rep["cost"]["savings"] == pytest.approx(rep["cost"]["overhead_term"] + rep["cost"]["value_term"])
    done = sum(d["units"] for d in rep["side_work"].values())
    assert done > 0 and 0 < rep["harvest_efficiency"] < 5
    assert png.read_bytes()[:4] == b"\x89PNG"
    # every step of a side task started inside one of its stage's bubbles: none ran before the
    # first bubble event, and the task states are durable
    states = {t["name"]: t["state"] for t in rep["tasks"]}
    assert set(states) == {"pagerank", "image"} and all(s == "PAUSED" for s in states.values())


SMALL = {"schedule": "1f1b", "stages": 2, "microbatches": 4, "model": "small", "iters": 5, "pin_cores": True}


@pytest.fixture
def small_alone(tmp_path_factory) -> dict:
    """Training alone on :data:`SMALL`: its report and its bubble profile, once per session."""
    from flowride.pipeline.config import TrainConfig
    from flowride.pipeline.trainer import train

    def make(where: Path) -> dict:
        base = train(TrainConfig(**SMALL, run_dir=str(where / "run")))
        return {"report": base.report(), "profile": base.profile()}

    return once(tmp_path_factory, "harvest-small-alone", make)


def test_naive_mode_runs_all_along_and_losses_stay_identical(tmp_path, tmp_path_factory):
    """Naive co-location: the task runs all along (its steps need no bubble, so the tiny preset
    does), training's losses are those of training alone (a run shared with other tests)."""
    from flowride.harvest.session import harvest_report, run_harvest
    from flowride.pipeline.config import TrainConfig

    alone = tiny_1f1b_report(tmp_path_factory, "torch")  # 1F1B, p = 2, m = 4, tiny, 4 iterations
    cfg = TrainConfig(schedule="1f1b", stages=2, microbatches=4, model="tiny", iters=4, engine="torch", run_dir=str(tmp_path / "naive"))
    profiles = {"pagerank": {"median_step_s": 0.002, "throughput": 1000.0, "unit": "sweeps"}}  # profiling: the CLI test
    res, record = run_harvest(cfg, "naive", ["pagerank"], profiles)
    h = harvest_report(alone, res.report(), record, "naive", profiles)
    assert h["losses_identical"] is True
    assert h["side_work"] and h["cost"]["value_term"] > 0  # naive: the task runs all along
    # a slowdown lowers savings below the value of the work done
    assert h["cost"]["savings"] == pytest.approx(h["cost"]["value_term"] + h["cost"]["overhead_term"])


def test_memory_limit_kill_during_training_leaves_training_untouched(tmp_path, small_alone):
    from flowride.harvest.session import run_harvest
    from flowride.pipeline.config import TrainConfig

    (tmp_path / "b.json").write_text(json.dumps(small_alone["profile"]))
    profiles = {f"{FAKE}:Hog": {"median_step_s": 0.002}, f"{FAKE}:Counter": {"median_step_s": 0.002}}
    store = TaskStore.in_run_dir(tmp_path / "h")
    store.submit(f"{FAKE}:Hog", {"mb": 4096}, memory_limit_mb=1500)  # dies on its first step
    store.close()
    # the Hog is not a task the run names: it runs only because the run takes the leftovers
    res, record = run_harvest(TrainConfig(**SMALL, run_dir=str(tmp_path / "h")), "freeride", [f"{FAKE}:Counter"], profiles,
                              bubble_profile=str(tmp_path / "b.json"), resume_leftovers=True)
    assert [f["reason"] for f in record["failures"]] == ["out of memory (limit 1500 MB)"]
    assert res.report()["losses"] == small_alone["report"]["losses"]  # training is unaffected
    assert any(st["name"].endswith("Counter") for st in record["steps"])  # the other task kept working


def test_task_restored_already_done_finishes(tmp_path):
    """A kill -9 between a task's last checkpoint and its FINISHED state: the restart finishes it."""
    import pickle

    st = TaskStore.in_run_dir(tmp_path)
    tid = st.submit(f"{FAKE}:Counter", {"total": 3})
    st.transition(tid, TaskState.CREATED)
    st.transition(tid, TaskState.RUNNING)
    st.save_checkpoint(tid, pickle.dumps({"i": 3}), 3, 3.0)
    proc, _ = start_manager(tmp_path, 1, "naive", {})
    try:
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(tid).state is TaskState.FINISHED, timeout=60)
    finally:
        stop_manager(proc, tmp_path)
    rec = TaskStore.in_run_dir(tmp_path).get(tid)
    assert rec.units == 3 and rec.restarts == 1


# ------------------------------------------------------------------------------------ placement, on/off, probe


def _affinity(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list"):
            return line.split()[-1]
    return ""


def test_one_floating_task_uses_every_stages_bubbles(tmp_path):
    """One task, bubbles on stage 0, 1, 0, 1: it runs in each, pinned to that stage's core."""
    st = TaskStore.in_run_dir(tmp_path)
    tid = st.submit(f"{FAKE}:Counter", {"step_ms": 2})
    proc, port = start_manager(tmp_path, 2, "freeride", {f"{FAKE}:Counter": {"median_step_s": 0.002}})
    pub = BubblePublisher(port)
    cores = sorted(os.sched_getaffinity(0))
    try:
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(tid).state is TaskState.PAUSED)
        pid = _host_pid(tmp_path, tid)
        for stage in (0, 1, 0, 1):
            now = time.monotonic()
            pub.publish(BubbleEvent("bubble", stage, "B", now, now + OPEN, 10**10, 0))
            wait_for(lambda: sum(s["t0"] >= now and s["stage"] == stage for s in read_steps(tmp_path)) >= 5)  # noqa: B023
            if len(cores) > 1:  # it sits on the core of the stage whose bubble it fills
                assert _affinity(pid) == str(cores[stage])
            _end_bubble(pub, stage, tid, tmp_path)
    finally:
        pub.close()
        rec = stop_manager(proc, tmp_path)
    stages = [s["stage"] for s in rec["steps"]]
    assert stages.count(0) >= 10 and stages.count(1) >= 10
    assert [(d["stage"], d["task"]) for d in _decisions(rec) if d["task"] is not None] == [(0, tid), (1, tid)] * 2


def test_off_pauses_every_task_and_on_resumes(tmp_path):
    """No step starts once the manager has acted on "off" (at most the one its pause raced),
    until "on"; then the task runs again. Judged on the times the manager recorded acting."""
    st = TaskStore.in_run_dir(tmp_path)
    st.submit(f"{FAKE}:Counter", {"step_ms": 2})
    proc, port = start_manager(tmp_path, 1, "naive", {})
    pub = BubblePublisher(port)
    try:
        wait_for(lambda: len(read_steps(tmp_path)) > 10)
        pub.publish(BubbleEvent("off", 0, "-", time.monotonic(), None, 0, 0))
        time.sleep(0.5)  # while off: a running task would take ~200 steps
        pub.publish(BubbleEvent("on", 0, "-", time.monotonic(), None, 0, 0))
        on_sent = time.monotonic()
        wait_for(lambda: any(s["t0"] >= on_sent for s in read_steps(tmp_path)))
    finally:
        pub.close()
        rec = stop_manager(proc, tmp_path)
    (off_at,), (on_at,) = ([d["at"] for d in _decisions(rec) if d.get("event") == e] for e in ("off", "on"))
    assert off_at < on_at
    assert sum(off_at < s["t0"] < on_at for s in rec["steps"]) <= 1
    assert any(s["t0"] > on_at for s in rec["steps"])


def test_an_unprofiled_task_learns_its_step_time_from_a_probe(tmp_path):
    """No profile: 3 probe steps, then the step time is theirs, not the 20 ms guess. Its steps
    take 40 ms, so the need learned (48 ms and up) keeps it out of a 30 ms bubble that the guess
    (24 ms) would have let it into, whenever the manager sees that bubble."""
    st = TaskStore.in_run_dir(tmp_path)
    tid = st.submit(f"{FAKE}:Counter", {"step_ms": 40})
    proc, port = start_manager(tmp_path, 1, "freeride", {})  # no profile at all
    pub = BubblePublisher(port)
    try:
        wait_for(lambda: TaskStore.in_run_dir(tmp_path).get(tid).steps >= 3)  # the probe ran and yielded
        probe = read_steps(tmp_path)
        now = time.monotonic()
        pub.publish(BubbleEvent("bubble", 0, "D", now, now + 0.030, 10**10, 0))
        time.sleep(0.05)
        now = time.monotonic()
        pub.publish(BubbleEvent("bubble", 0, "B", now, now + OPEN, 10**10, 1))
        wait_for(lambda: len(read_steps(tmp_path)) > len(probe))
        _end_bubble(pub, 0, tid, tmp_path)
    finally:
        pub.close()
        rec = stop_manager(proc, tmp_path)
    assert len(probe) == 3  # exactly the probe's steps before any bubble
    d_short = [d for d in _decisions(rec) if d.get("type") == "D"]
    (d_long,) = [d for d in _decisions(rec) if d.get("type") == "B" and d["task"] is not None]
    learned = fit_time(statistics.median(s["t1"] - s["t0"] for s in probe), d_long["factor"])
    assert d_long["need_s"] == pytest.approx(learned) and learned > fit_time(UNPROFILED_STEP_S, d_long["factor"])
    assert d_short and all(d["task"] is None and d["need_s"] == pytest.approx(learned) for d in d_short)
    assert all(s["t0"] >= now for s in rec["steps"][3:])


# ------------------------------------------------------------------------------------ supervision


def test_a_killed_manager_is_restarted_and_nothing_is_lost(tmp_path):
    """The watcher restarts a manager killed -9 on the same port (the trainers keep sending
    there); the steps done before are still on record and the task goes on from its checkpoint.
    How soon the death is seen is the watcher's poll (0.2 s) on a quiet machine: bounded here
    only generously, speed is not what this checks."""
    from flowride.harvest.supervise import ManagerProcess

    st = TaskStore.in_run_dir(tmp_path)
    tid = st.submit(f"{FAKE}:Counter", {"step_ms": 2})  # endless: the test stops it
    mp = ManagerProcess(tmp_path, ManagerOptions(stages=1, mode="naive"), {})
    port = mp.start()
    mp.watch()
    try:
        wait_for(lambda: _saved(tmp_path, tid) > 0)
        first = mp.proc.pid
        killed_at = time.monotonic()
        os.kill(first, signal.SIGKILL)
        before = [s for s in read_steps(tmp_path) if s["t0"] < killed_at]
        wait_for(lambda: len(mp.history) == 1 and mp.alive())
        saved = _saved(tmp_path, tid)
        assert mp.restarts == 1 and mp.history[0]["restarted"] and 0 <= mp.history[0]["detected_at"] - killed_at < 30
        assert mp.proc.pid != first and mp.port == port  # same port: trainers keep sending there
        wait_for(lambda: _saved(tmp_path, tid) > saved)  # the new manager's own checkpoint of it
        _resumed_from_its_checkpoint(tmp_path, tid, saved)
    finally:
        rec = mp.stop()
    assert rec["manager_restarts"] == 1 and rec["harvest_stopped"] is None
    kept = [s for s in rec["steps"] if s["t0"] < killed_at]
    assert len(kept) == len(before) > 0  # the steps done before the crash are still on record
    assert TaskStore.in_run_dir(tmp_path).get(tid).restarts == 1


def test_the_supervisor_gives_up_after_too_many_deaths(tmp_path):
    from flowride.harvest.supervise import ManagerProcess

    mp = ManagerProcess(tmp_path, ManagerOptions(stages=1, mode="naive"), {}, max_restarts=1)
    mp.start()
    mp.watch()
    try:
        os.kill(mp.proc.pid, signal.SIGKILL)
        wait_for(lambda: len(mp.history) == 1 and mp.alive())
        os.kill(mp.proc.pid, signal.SIGKILL)
        wait_for(lambda: mp.gave_up is not None)
    finally:
        rec = mp.stop()
    assert "harvesting stopped" in rec["harvest_stopped"] and rec["manager_restarts"] == 1


def test_manager_command_status_restart_stop(tmp_path):
    from flowride.harvest.supervise import ManagerProcess

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "flowride", "manager", *args, "--run-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=60)

    assert "holds no side-task manager" in cli("status").stderr
    mp = ManagerProcess(tmp_path, ManagerOptions(stages=2, mode="freeride"), {})
    port = mp.start()
    first = mp.proc.pid
    try:
        s = json.loads(cli("status").stdout)
        assert s["alive"] and s["pid"] == first and s["port"] == port and s["options"]["stages"] == 2
        r = cli("restart")
        assert r.returncode == 0 and f":{port}" in r.stdout
        s2 = json.loads(cli("status").stdout)
        assert s2["alive"] and s2["pid"] != first and s2["port"] == port
        assert cli("stop").returncode == 0
        assert not json.loads(cli("status").stdout)["alive"]
    finally:
        mp.stop()


def _rank_pids(run_dir: Path) -> list[int]:
    """The training ranks of the run in ``run_dir`` (each runs the worker on its config.json)."""
    needle = str(run_dir / "config.json").encode()
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if needle in argv:
                out.append(int(pid))
    return out


def test_kill_9_of_the_manager_during_training(tmp_path, small_alone):
    """Training goes on untouched, the manager comes back, the report keeps the work done before
    the crash and counts the restart. The ranks are held still (SIGSTOP) from the kill until the
    new manager has its task ready again, so the restart falls inside training on any machine."""
    import threading

    from flowride.harvest.manager_files import read_pid
    from flowride.harvest.session import compare
    from flowride.pipeline.config import TrainConfig

    cfg = TrainConfig(**SMALL, run_dir=str(tmp_path / "run"))
    run_dir = Path(cfg.run_dir)
    (tmp_path / "b.json").write_text(json.dumps(small_alone["profile"]))  # bubbles announced from the first iteration
    killed: list[float] = []
    errors: list[BaseException] = []

    def restarted(old: int) -> bool:
        rec, tasks = read_pid(run_dir), TaskStore.in_run_dir(run_dir).list()
        return rec is not None and rec.pid != old and tasks[0].restarts == 1 and tasks[0].state is TaskState.PAUSED

    def killer():
        try:
            wait_for(lambda: len(read_steps(run_dir)) > 3, timeout=120, every=0.01)
            ranks = _rank_pids(run_dir)
            for pid in ranks:
                os.kill(pid, signal.SIGSTOP)
            try:
                old = read_pid(run_dir).pid
                killed.append(time.monotonic())
                os.kill(old, signal.SIGKILL)
                wait_for(lambda: restarted(old), timeout=100)
            finally:
                for pid in ranks:
                    os.kill(pid, signal.SIGCONT)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    profiles = {f"{FAKE}:Counter": {"median_step_s": 0.002, "throughput": 500.0, "unit": "ticks"}}
    c = compare(cfg, "freeride", [f"{FAKE}:Counter"], paired_block=0, baseline_report=small_alone["report"], profiles=profiles,
                bubble_profile=str(tmp_path / "b.json"))
    th.join(timeout=60)
    assert not errors and killed, errors
    rep = c.report
    assert rep["manager_restarts"] == 1 and rep["harvest_stopped"] is None
    assert rep["losses_identical"] is True
    steps = c.record["steps"]
    assert any(s["t0"] < killed[0] for s in steps) and any(s["t0"] > killed[0] for s in steps)
    assert sum(d["steps"] for d in rep["side_work"].values()) > 0
    assert TaskStore.in_run_dir(run_dir).list()[0].restarts == 1


# ------------------------------------------------------------------------------------ limits


def test_cuda_limits_are_applied_in_the_task_process_not_as_rlimit(tmp_path, monkeypatch):
    from flowride.harvest.limits import Limits, mps_daemon_running

    cpu = Limits(memory_mb=1500, low_priority=False)
    gpu = Limits(memory_mb=1500, low_priority=False, cuda=True, cuda_device=1, mps_thread_percentage=40)
    assert "FLOWRIDE_CUDA_MEMORY_MB" not in cpu.child_env()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = gpu.child_env()
    assert env["FLOWRIDE_CUDA_MEMORY_MB"] == "1500" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert gpu.child_env()["CUDA_VISIBLE_DEVICES"] == "6"  # the stage's GPU among the visible ones
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])"
    for lim, capped in ((cpu, True), (gpu, False)):  # RLIMIT_AS would break the CUDA driver
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=lim.apply_in_child)
        assert (int(out.stdout) == 1500 << 20) is capped
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not mps_daemon_running()
    (tmp_path / "control").touch()
    assert mps_daemon_running()


def test_harvest_processes_take_idle_priority_unless_the_test_hook_says_not(monkeypatch):
    """By default the manager and every low-priority side task run at nice 19 under SCHED_IDLE
    (a core only while the stage leaves it idle); ``FLOWRIDE_HARVEST_PRIORITY=normal``, this
    suite's hook, leaves them at the priority they inherit."""
    from flowride.harvest.limits import PRIORITY_ENV, Limits
    from flowride.harvest.supervise import _idle_priority_and_tie_to_parent

    def priority(preexec) -> list[str]:
        code = "import os; print(os.sched_getscheduler(0) == os.SCHED_IDLE, os.nice(0))"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=preexec,
                              timeout=60).stdout.split()

    for preexec in (Limits(low_priority=True).apply_in_child, _idle_priority_and_tie_to_parent):
        monkeypatch.delenv(PRIORITY_ENV, raising=False)
        assert priority(preexec) == ["True", "19"]
        monkeypatch.setenv(PRIORITY_ENV, "normal")
        assert priority(preexec) == ["False", str(os.nice(0))]


def test_harvest_report_counts_only_the_on_blocks_and_judges_the_budget():
    from flowride.harvest.session import harvest_report

    flags = [True, True, False, False, False, False, True, True] * 2
    times = [1.01 if f else 1.00 for f in flags]
    windows = [(10.0 * k, 10.0 * k + t) for k, t in enumerate(times)]
    rep = {"stages": 2, "iteration_times_s": times, "iteration_harvest": flags, "iteration_windows": windows,
           "iteration_idle_s": [0.4] * len(times), "iteration_time_s": 1.005, "losses": [1.0, 0.9], "window_monotonic": [0, 200]}
    on_step = {"task": 1, "name": "cnn", "t0": windows[0][0] + 0.1, "t1": windows[0][0] + 0.2, "units": 32}
    off_step = {"task": 1, "name": "cnn", "t0": windows[2][0] + 0.1, "t1": windows[2][0] + 0.2, "units": 32}
    profiles = {"cnn": {"throughput": 320.0, "unit": "samples"}}
    base = {"iteration_time_s": 1.0, "iteration_times_s": [1.0] * 4, "losses": [1.0, 0.9], "bubble_seconds_total": 1.6}
    h = harvest_report(base, rep, {"steps": [on_step, off_step]}, "freeride", profiles, budget_pct=2.0, block=2)
    assert h["overhead_pct"] == pytest.approx(1.0) and h["overhead_pairs"] == 4
    assert h["side_work"]["1"]["steps"] == 1  # the step in an off block does not count
    assert h["harvest_efficiency"] == pytest.approx((32 / 320) / (0.4 * 8))
    assert h["within_budget"] and h["budget_verdict"] == "within" and h["losses_identical"] is True
    assert harvest_report(base, rep, {"steps": []}, "freeride", profiles, budget_pct=0.5, block=2)["budget_verdict"] == "over"
