"""Re-runs: the tasks a run names are the tasks it runs (issue #32; harvest/rerun.py).

A task's identity across runs is its name and parameters; a run resumes the unfinished twin of
each task it names (one per naming), submits the rest, and leaves the unfinished tasks of other
runs as they are unless asked (``--resume-leftovers``). Checked on the store directly, through
``connect`` (the library call that ``attach`` shares), and through ``flowride train``."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from clirun import cli, wait_for
from flowride.harvest.rerun import (
    BY_HAND,
    LEFTOVER,
    RESUMED,
    SUBMITTED,
    WHILE_RUNNING,
    choose,
    identity,
    prepare_run,
    runs,
    summary_line,
)
from flowride.harvest.states import TaskState
from flowride.harvest.store import SCHEMA, TaskStore
from harvest_fixtures.shared import NORMAL_PRIORITY

pytestmark = pytest.mark.timeout(300)
TESTS = str(Path(__file__).resolve().parent)
COUNTER = "harvest_fixtures.fake_tasks:Counter"
# three different tasks for flowride train (one 0.5 ms busy step under three names: quick to
# start, nothing to set up, and a step fits the tiny preset's bubbles many times over)
A, B, C = (f"harvest_fixtures.fake_tasks:{n}" for n in ("Tick", "Tally", "Score"))


@pytest.fixture(autouse=True)
def _fake_tasks(fake_tasks_importable, monkeypatch):
    """Every test here may start side-task processes that import tests/harvest_fixtures; they
    and the manager keep normal priority (harvest_fixtures.shared.NORMAL_PRIORITY)."""
    for k, v in NORMAL_PRIORITY.items():
        monkeypatch.setenv(k, v)


def _paused(store: TaskStore, tid: int) -> None:
    store.transition(tid, TaskState.CREATED)
    store.transition(tid, TaskState.PAUSED)


# ------------------------------------------------------------------------------ the store


def test_a_task_is_its_name_and_parameters_and_each_naming_takes_one_twin(tmp_path):
    assert identity("pagerank", {"n": 5, "seed": 1}) == identity("pagerank", {"seed": 1, "n": 5})
    assert identity("pagerank", {"n": 5}) != identity("pagerank", {"n": 6}) != identity("sssp", {"n": 5})
    st = TaskStore(tmp_path / "t.sqlite")
    p1, p2 = st.submit("pagerank", {"n": 5, "seed": 1}), st.submit("pagerank", {"seed": 1, "n": 5})
    img, done = st.submit("image", {"a": 1}), st.submit("pagerank", {"n": 5, "seed": 1})
    _paused(st, p1)
    _paused(st, done)
    st.transition(done, TaskState.RUNNING)
    st.transition(done, TaskState.FINISHED)  # finished: never a twin
    cancelled = st.submit("cnn", {})
    _paused(st, cancelled)
    st.request_cancel(cancelled)  # its user asked it to stop: never resumed
    named = [("pagerank", {"n": 5, "seed": 1})] * 3 + [("image", {"a": 2}), ("cnn", {})]
    resume, submit, left = choose(st.unfinished(), named)
    assert [t.id for t in resume] == [p1, p2]  # two namings, two twins, oldest first; the third is new
    assert submit == [("pagerank", {"n": 5, "seed": 1}), ("image", {"a": 2}), ("cnn", {})]  # other params: a new task
    assert sorted(t.id for t in left) == [img, cancelled]
    before = st.get(img)
    plan = prepare_run(st, named)
    origins = [(t["id"], t["origin"]) for t in plan["tasks"]]
    assert origins[:2] == [(p1, RESUMED), (p2, RESUMED)] and [o for _, o in origins[2:]] == [SUBMITTED] * 3
    assert plan["ids"] == [i for i, _ in origins] and {t["id"] for t in plan["left"]} == {img, cancelled}
    r1 = st.get(p1)  # back to SUBMITTED, labelled a re-run, no restart counted
    assert r1.state is TaskState.SUBMITTED and r1.reason == "resumed by a re-run of this run_dir" and r1.restarts == 0
    assert r1.to_dict()["origin"] == RESUMED
    assert st.get(img) == before  # the leftover is untouched
    # the same run again: every naming finds its twin, nothing is submitted
    again = prepare_run(st, named)
    assert [t["origin"] for t in again["tasks"]] == [RESUMED] * 5 and len(st.list()) == 8
    # asked for: the leftovers are taken too
    more = prepare_run(st, [], resume_leftovers=True)
    assert [t["origin"] for t in more["tasks"]] == [LEFTOVER] * 6 and [t["id"] for t in more["left"]] == [cancelled]
    assert st.get(img).origin == LEFTOVER
    st.close()


def test_recovery_and_the_manager_keep_to_the_runs_tasks(tmp_path):
    from flowride.harvest.manager_files import ManagerOptions

    st = TaskStore(tmp_path / "t.sqlite")
    mine, other = st.submit("pagerank"), st.submit("pagerank", {"n": 9})
    _paused(st, mine)
    _paused(st, other)
    opts = ManagerOptions(stages=1, run_tasks=[mine], run_since=time.time())
    assert runs(st.get(mine), opts) and not runs(st.get(other), opts)
    assert runs(st.get(other), ManagerOptions(stages=1))  # an older manager.json names no tasks: all run
    late = st.submit("image")
    assert runs(st.get(late), opts)  # submitted while the run runs
    _paused(st, late)
    assert sorted(st.recover(opts.run_tasks, opts.run_since)) == [mine, late]
    assert st.get(other).state is TaskState.PAUSED and st.get(other).restarts == 0
    st.close()


def test_an_old_store_gains_the_origin_column(tmp_path):
    f = tmp_path / "old.sqlite"
    db = sqlite3.connect(f)
    db.executescript(SCHEMA.replace(",\n    origin TEXT", ""))
    db.execute("INSERT INTO tasks (name, params, state, created, updated) VALUES ('pagerank', '{}', 'PAUSED', 1, 1)")
    db.commit()
    db.close()
    st = TaskStore(f)
    (rec,) = st.list()
    assert rec.origin is None and rec.to_dict()["origin"] is None
    assert prepare_run(st, [("pagerank", {})])["tasks"] == [{"id": rec.id, "name": "pagerank", "origin": RESUMED}]
    st.close()


def test_the_summary_line_says_what_ran_and_what_was_left():
    tasks = [{"id": 1, "name": "pagerank", "origin": SUBMITTED}, {"id": 2, "name": "image", "origin": RESUMED}]
    left = [{"id": 3, "name": "cnn"}]
    assert summary_line(tasks, left) == ("2 side tasks: 1 submitted by this run, 1 resumed (same name and parameters); "
                                         "1 left from earlier runs not run (3:cnn; --resume-leftovers runs them)")
    assert summary_line([], []) == "0 side tasks"


# ------------------------------------------------------------------------------ connect


def test_connect_reruns_resume_the_named_tasks_and_leave_the_rest(tmp_path):
    """connect (attach's set-up) by the rule: a re-run resumes its twin and submits a second
    naming; a task left by someone else is not run; one submitted while the job runs is; and
    ``resume_leftovers=True`` takes the leftovers."""
    import flowride.harvest

    run = tmp_path / "job"
    first = flowride.harvest.connect(0, 1, run_dir=run, side_tasks=[COUNTER], ready_timeout_s=60)
    first.close()
    assert first.tasks["origin"] == "fresh" and [t["origin"] for t in first.tasks["tasks"]] == [SUBMITTED]
    (t1,) = first.tasks["ids"]
    st = TaskStore.in_run_dir(run)
    other = st.submit(COUNTER, {"total": 7}, origin=BY_HAND)  # another job's, never run
    before = st.get(other)
    h = flowride.harvest.connect(0, 1, run_dir=run, side_tasks=[COUNTER, COUNTER], ready_timeout_s=60)
    try:
        assert h.tasks["origin"] == "mixed" and h.tasks["tasks"][0] == {"id": t1, "name": COUNTER, "origin": RESUMED}
        assert h.tasks["tasks"][1]["origin"] == SUBMITTED and "resume_leftovers=True" in h.tasks["note"]
        assert [t["id"] for t in h.tasks["left"]] == [other]
        late = st.submit(COUNTER, {"total": 10**9, "step_ms": 1})
        wait_for(lambda: st.get(late).state is not TaskState.SUBMITTED)
    finally:
        record = h.close()
    assert st.get(late).origin == WHILE_RUNNING
    assert {t["id"] for t in record["tasks"]} == {t1, h.tasks["ids"][1], late}
    assert [t["id"] for t in record["tasks_left"]] == [other]
    assert st.get(other) == before  # never taken up: as it was
    last = flowride.harvest.connect(0, 1, run_dir=run, side_tasks=[], resume_leftovers=True, ready_timeout_s=60)
    last.close()
    assert {t["id"]: t["origin"] for t in last.tasks["tasks"]}[other] == LEFTOVER and last.tasks["left"] == []
    assert st.get(other).state is not TaskState.SUBMITTED  # it was started this time
    st.close()


# ------------------------------------------------------------------------------ flowride train


def _train(run: Path, report: Path, tasks: str, *extra: str):
    r = cli("train", "--stages", "2", "--microbatches", "4", "--model", "tiny", "--iters", "6", "--paired-block", "1",
            "--side-tasks", tasks, "--run-dir", run, "--report", report, "--baseline-report", run.parent / "base.json",
            *extra, timeout=240)
    assert r.code == 0, r.err[-3000:]
    return r, json.loads(report.read_text())


def _step_lines(run: Path) -> dict[int, int]:
    out: dict[int, int] = {}
    for line in (run / "steps.jsonl").read_text().splitlines():
        tid = json.loads(line)["task"]
        out[tid] = out.get(tid, 0) + 1
    return out


def test_train_reruns_resume_the_named_tasks_and_leave_the_others(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # no baseline training and no profiling: a given baseline report and measured profiles
    (tmp_path / "base.json").write_text(json.dumps({"iteration_times_s": [0.03] * 4, "iteration_time_s": 0.03,
                                                    "losses": [0.0] * 6, "bubble_seconds_total": 0.05}))
    prof = {"unit": "ticks", "steps": 30, "setup_s": 0.0, "peak_memory_bytes": 1 << 20, "device": "cpu",
            "median_step_s": 0.0005, "p90_step_s": 0.0006, "throughput": 2000.0}
    (run / "task-profiles.json").write_text(json.dumps({name: {**prof, "task": name} for name in (A, B, C)}))
    r1, rep1 = _train(run, tmp_path / "r1.json", f"{A},{B}")
    assert [(t["name"], t["origin"]) for t in rep1["tasks"]] == [(A, SUBMITTED), (B, SUBMITTED)]
    assert "2 side tasks: 2 submitted by this run" in r1.out
    lines1 = sum(_step_lines(run).values())
    # the same run again: the same two tasks, resumed; nothing submitted twice
    r2, rep2 = _train(run, tmp_path / "r2.json", f"{A},{B}")
    st = TaskStore.in_run_dir(run)
    assert sorted(t.name for t in st.list()) == sorted([A, B])
    ids = {t.name: t.id for t in st.list()}
    assert [(t["id"], t["origin"]) for t in rep2["tasks"]] == [(ids[A], RESUMED), (ids[B], RESUMED)]
    assert rep2["tasks_by_origin"] == {RESUMED: 2} and rep2["tasks_left"] == []
    assert "2 side tasks: 2 resumed (same name and parameters)" in r2.out
    # the second report counts only its own steps: none of the first run's (earlier than its iterations)
    assert sum(d["steps"] for d in rep2["side_work"].values()) <= sum(_step_lines(run).values()) - lines1
    # another task named: the two are left as they are, their steps do not grow, and the report says so
    before = {t.id: t for t in st.list()}
    steps_before = _step_lines(run)
    r3, rep3 = _train(run, tmp_path / "r3.json", C)
    third = next(t.id for t in st.list() if t.name == C)
    assert [(t["id"], t["origin"]) for t in rep3["tasks"]] == [(third, SUBMITTED)]
    assert sorted(t["id"] for t in rep3["tasks_left"]) == sorted(ids.values())
    assert set(rep3["side_work"]) <= {str(third)}
    for tid in ids.values():
        assert st.get(tid) == before[tid]  # untouched: state, steps, origin, even the time it was updated
        assert _step_lines(run).get(tid, 0) == steps_before.get(tid, 0)
    assert "1 side task: 1 submitted by this run; 2 left from earlier runs not run" in r3.out
    assert "--resume-leftovers runs them" in r3.out
    ls = cli("tasks", "list", "--run-dir", run)
    assert ls.code == 0 and "origin" in ls.out and "submitted by this run" in ls.out
    # asked for: the leftovers run beside the named task
    r4, rep4 = _train(run, tmp_path / "r4.json", C, "--resume-leftovers", "--iters", "14")  # bubbles enough for all three
    origins = {t["id"]: t["origin"] for t in rep4["tasks"]}
    assert origins == {third: RESUMED, ids[A]: LEFTOVER, ids[B]: LEFTOVER} and rep4["tasks_left"] == []
    assert rep4["tasks_by_origin"] == {RESUMED: 1, LEFTOVER: 2}
    grown = _step_lines(run)
    assert sum(grown.get(t, 0) for t in ids.values()) > sum(steps_before.get(t, 0) for t in ids.values())
    assert "2 resumed from earlier runs (--resume-leftovers)" in r4.out
    st.close()
