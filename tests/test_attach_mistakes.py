"""A new user's mistakes with flowride.harvest.attach, each met by one clear error on every rank
where it is collective, or by working (issue #25, "Attach forgives").

Two user-style training scripts (written into tmp_path, so the side-task module sits next to the
script and nowhere on PYTHONPATH) run once each under ``torchrun --standalone --nproc-per-node 2``
on gloo: ``mistakes`` makes one mistake after another and records each rank's error;
``lifecycle`` runs short jobs (side work in a 5-step job, a re-run, a real manager restart, a
1-step job, leaving the ``with`` while a 2 s side-task step runs). The tests read what each rank
recorded. Where the script waits on another rank or on the manager, it waits for what it needs
(a file the other rank writes, the supervisor's record of a restart), never a fixed time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harvest_fixtures.shared import NORMAL_PRIORITY, once

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]

TASKS = '''
"""Side tasks a user keeps next to the training script (not installed, not on PYTHONPATH)."""
import time

from flowride.harvest.task import IterativeTask


class Quick(IterativeTask):
    """0.5 ms busy steps: fits a few-ms bubble."""

    step_s = 0.0005

    def setup(self):
        self.i = 0

    def step(self):
        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:
            pass
        self.i += 1
        return 1.0

    def finished(self):
        return False

    def state(self):
        return {"i": self.i}

    def load_state(self, state):
        self.i = state["i"]


class Slow(Quick):
    """2 s steps; each says when it started (in slow-started, next to this module)."""

    step_s = 2.0

    def step(self):
        import os
        from pathlib import Path

        marker = Path(__file__).with_name("slow-started")
        marker.with_suffix(".tmp").write_text(repr(time.time()))
        os.replace(marker.with_suffix(".tmp"), marker)  # whole: the script reads it while this runs
        return super().step()
'''

SCRIPT = '''
"""A user's pipeline-parallel training script, making the mistakes of issue #25 on purpose."""
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, EXAMPLES)

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import Schedule1F1B
from torch_pipeline_attach import batch, build_stages

import flowride.harvest
from attach_tasks import Quick

MODE, OUT = sys.argv[1], Path(sys.argv[2])
WIDTH, LAYERS, BATCH, M = 512, 8, 64, 4
found = {}


def err(name, fn):
    """Run fn; record the error it raised (type, message), or None."""
    try:
        fn()
        found[name] = None
    except Exception as e:
        found[name] = {"type": type(e).__name__, "msg": str(e)}


def steps(sched, rank, n):
    first, last = rank == 0, rank == 1
    for s in range(n):
        x, y = batch(s, BATCH, WIDTH, torch.device("cpu"))
        sched.step(*((x,) if first else ()), target=y if last else None, losses=[] if last else None)


def store_row(run_dir):
    from flowride.harvest.store import TaskStore

    st = TaskStore.in_run_dir(run_dir)
    try:
        return [{"name": t.name, "state": str(t.state), "reason": t.reason, "restarts": t.restarts} for t in st.list()]
    finally:
        st.close()


if MODE == "mistakes":
    rank = int(os.environ["RANK"])
    err("connect_before_init", lambda: flowride.harvest.connect(rank, 2, run_dir=OUT / "early"))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
stage = build_stages(rank, 2, 1, LAYERS, WIDTH, torch.device("cpu"))[0]
sched = Schedule1F1B(stage, M, loss_fn=nn.MSELoss())

if MODE == "mistakes":
    err("stage", lambda: flowride.harvest.attach(stage, run_dir=OUT / "a"))
    err("module", lambda: flowride.harvest.attach(stage.submod, run_dir=OUT / "a"))
    err("klass", lambda: flowride.harvest.attach(Schedule1F1B, run_dir=OUT / "a"))
    (OUT / "a-file").write_text("not a directory")
    err("run_dir_file", lambda: flowride.harvest.attach(sched, run_dir=OUT / "a-file"))
    err("run_dir_unwritable", lambda: flowride.harvest.attach(sched, run_dir="/proc/flowride-run"))
    err("one_rank_bad_dir", lambda: flowride.harvest.attach(sched, run_dir=OUT / ("a-file" if rank == 1 else "b")))
    flowride.harvest.register("only-here", Quick)
    err("registered_only_here", lambda: flowride.harvest.attach(sched, run_dir=OUT / "c", side_tasks=["only-here"]))
    h = flowride.harvest.attach(sched, run_dir=OUT / "d")
    err("attach_twice", lambda: flowride.harvest.attach(sched, run_dir=OUT / "d"))
    other = Schedule1F1B(stage, M, loss_fn=nn.MSELoss())
    err("second_schedule_same_dir", lambda: flowride.harvest.attach(other, run_dir=OUT / "d"))
    with h:
        steps(sched, rank, 1)
    h.wait()
    gave_up = OUT / "rank0-gave-up"
    if rank == 1:  # arrives after rank 0 gave up (it says so in a file), however long that took
        while not gave_up.exists():
            time.sleep(0.05)
    t0 = time.monotonic()
    err("one_rank_only", lambda: flowride.harvest.attach(sched, run_dir=OUT / "e", timeout_s=4))
    found["one_rank_only_s"] = time.monotonic() - t0
    if rank == 0:
        gave_up.write_text("")

if MODE == "lifecycle":
    run = OUT / "job"
    with flowride.harvest.attach(sched, run_dir=run, side_tasks=["attach_tasks:Quick"]) as h:
        steps(sched, rank, 5)
    # a re-run into the same directory, at once (the first manager may still be stopping)
    with flowride.harvest.attach(sched, run_dir=run, side_tasks=["attach_tasks:Quick"]) as h2:
        if rank == 0:
            found["rerun_store"] = store_row(run)
        steps(sched, rank, 2)
        if rank == 0:  # a real restart: the manager dies, its supervisor starts a new one
            os.kill(h2.manager.proc.pid, signal.SIGKILL)
            t0 = time.monotonic()
            while not h2.manager.history and time.monotonic() - t0 < 120:  # the new one is up: it recovered the task
                time.sleep(0.05)
            found["restart_store"] = store_row(run)
        dist.barrier()
        steps(sched, rank, 2)
    found["first"] = h.wait() is not None and h.summary()
    found["rerun"] = h2.wait() is not None and h2.summary()
    with flowride.harvest.attach(sched, run_dir=OUT / "one-step", side_tasks=["attach_tasks:Quick"]) as h3:
        steps(sched, rank, 1)
    h3.wait()
    found["one_step"] = h3.summary()
    slow = {"attach_tasks:Slow": {"median_step_s": 2.0}}
    with flowride.harvest.attach(sched, run_dir=OUT / "slow", side_tasks=["attach_tasks:Slow"], mode="naive", profiles=slow):
        steps(sched, rank, 2)
        marker, t0 = OUT / "slow-started", time.monotonic()
        while time.monotonic() - t0 < 120:  # until a 2 s step has just begun (naive: the task runs continuously)
            began = float(marker.read_text()) if marker.exists() else 0.0
            if time.time() - began < 0.3:
                found["slow_step_began"] = began
                break
            time.sleep(0.02)
        t_exit = time.monotonic()
    found["slow_exit_s"] = time.monotonic() - t_exit  # nothing waits for it: the process exit does

(OUT / f"found-rank{rank}.json").write_text(json.dumps(found))
dist.destroy_process_group()
'''


def _run(tmp: Path, mode: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    (tmp / "attach_tasks.py").write_text(textwrap.dedent(TASKS))
    script = tmp / "train.py"
    script.write_text(SCRIPT.replace("EXAMPLES", repr(str(ROOT / "examples"))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])  # not tmp: the tasks sit by the script
    env["OMP_NUM_THREADS"] = "1"
    env.update(NORMAL_PRIORITY)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), mode, str(tmp)],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp)
    found = [json.loads((tmp / f"found-rank{r}.json").read_text()) if (tmp / f"found-rank{r}.json").exists() else {} for r in (0, 1)]
    return p, found


def _script_run(tmp_path_factory, mode: str) -> tuple[Path, list[dict]]:
    """The script run once per session in ``mode`` (harvest_fixtures.shared.once: the tests that
    read it may land on different xdist workers): its directory and what each rank recorded."""

    def make(tmp: Path) -> dict:
        p, found = _run(tmp, mode)
        assert p.returncode == 0, p.stderr[-4000:]
        return {"tmp": str(tmp), "found": found}

    done = once(tmp_path_factory, f"attach-{mode}", make)
    return Path(done["tmp"]), done["found"]


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory):
    return _script_run(tmp_path_factory, "mistakes")


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory):
    return _script_run(tmp_path_factory, "lifecycle")


def _errors(found: list[dict], name: str) -> list[dict]:
    """The error each rank recorded for ``name``: an InputError, one line, on both ranks."""
    out = [f[name] for f in found]
    for e in out:
        assert e is not None, name
        assert e["type"] == "InputError", e
        assert "\n" not in e["msg"], e
    return out


def test_connect_before_init_process_group_is_refused_on_every_rank(mistakes):
    for e in _errors(mistakes[1], "connect_before_init"):
        assert e["msg"].startswith("connect: torch.distributed is not initialized") and "init_process_group" in e["msg"]


def test_a_stage_a_module_or_a_class_is_named_not_blamed_on_torch(mistakes):
    for e in _errors(mistakes[1], "stage"):
        assert e["msg"].startswith("schedule: expected a torch.distributed.pipelining schedule instance")
        assert "pipeline stage (PipelineStage" in e["msg"] and "Schedule1F1B(stage" in e["msg"]
        assert "TorchPipeliningChanged" not in e["msg"] and "_stage" not in e["msg"].split("(build")[0]
    for e in _errors(mistakes[1], "module"):
        assert "a torch.nn.Module of type torch.nn.modules.container.Sequential" in e["msg"]
    for e in _errors(mistakes[1], "klass"):
        assert "the class Schedule1F1B itself, not an instance" in e["msg"]


def test_a_run_dir_that_is_a_file_or_unwritable_is_one_error_naming_run_dir(mistakes):
    for e in _errors(mistakes[1], "run_dir_file"):
        assert e["msg"].startswith("run_dir: ") and "is a file, not a directory" in e["msg"]
    for e in _errors(mistakes[1], "run_dir_unwritable"):
        assert e["msg"].startswith("run_dir: cannot create /proc/flowride-run")


def test_a_mistake_on_one_rank_is_raised_on_every_rank(mistakes):
    for e in _errors(mistakes[1], "one_rank_bad_dir"):
        assert e["msg"].startswith("run_dir: ") and "(on rank 1)" in e["msg"]
    assert not (mistakes[0] / "b" / "manager.ready").exists()  # rank 0 started no manager for it


def test_a_task_the_manager_cannot_import_fails_attach_not_silently(mistakes):
    for e in _errors(mistakes[1], "registered_only_here"):
        assert e["msg"].startswith("side_tasks: the side-task manager (its own process) could not start 'only-here'")
        assert "register() lasts only in this process" in e["msg"]


def test_attaching_twice_is_refused(mistakes):
    for e in _errors(mistakes[1], "attach_twice"):
        assert e["msg"].startswith("schedule: this schedule is already attached")
    # another schedule into the same run_dir: the manager already there is named (both ranks)
    for e in _errors(mistakes[1], "second_schedule_same_dir"):
        assert e["msg"].startswith("run_dir: a side-task manager (pid ") and "flowride manager stop" in e["msg"]
    # the first attach went on unharmed
    record = json.loads((mistakes[0] / "d" / "harvest.json").read_text())
    assert record["manager_restarts"] == 0 and not record["failures"]


def test_attach_on_one_rank_only_names_the_missing_rank_on_every_rank(mistakes):
    r0, r1 = _errors(mistakes[1], "one_rank_only")
    assert r0["msg"].startswith("attach: rank 1 of 2 did not call attach within 4 s") and "collective" in r0["msg"]
    assert r1["msg"].startswith("attach: rank 1 did not call attach within 4 s, so the others gave up")
    assert 4 <= mistakes[1][0]["one_rank_only_s"] < 60  # it waited its timeout, then gave up (not hung)


def test_a_task_next_to_the_script_runs_and_a_short_job_uses_its_bubbles(lifecycle):
    tmp, found = lifecycle
    first = found[0]["first"]
    assert first["side_tasks"]["origin"] == "fresh" and first["side_tasks"]["ready"] is True
    assert first["side_work"]["steps"] > 0, first["side_work"]  # 5 steps were enough: the task was warm


def test_a_rerun_is_labelled_a_rerun_and_only_a_real_restart_a_restart(lifecycle):
    _, found = lifecycle
    rerun = found[0]["rerun"]["side_tasks"]
    assert rerun["origin"] == "resumed" and rerun["names"] == ["attach_tasks:Quick"]
    (row,) = found[0]["rerun_store"]
    assert row["reason"] == "resumed by a re-run of this run_dir" and row["restarts"] == 0
    (row,) = found[0]["restart_store"]
    assert row["reason"] == "recovered after a manager restart" and row["restarts"] == 1


def test_a_job_with_no_bubble_used_says_why(lifecycle):
    _, found = lifecycle
    why = found[0]["one_step"]["side_work"]
    assert why["steps"] == 0 and why["why_none"].startswith("the job ran 1 iteration(s)")
    assert "announce_off" not in found[1]["one_step"] and found[1]["one_step"]["events"]["sent"] == 0


def test_leaving_the_with_block_does_not_wait_for_a_running_side_task_step(lifecycle):
    """The with block was left while a 2 s step had at least 1.7 s to go: leaving took far less
    (waiting for the step would take that long), and the record came after the step ended."""
    tmp, found = lifecycle
    assert found[0]["slow_exit_s"] < 1.0 and found[1]["slow_exit_s"] < 1.0
    # the manager was stopped in the background, and its record written when it was done
    record = json.loads((tmp / "slow" / "harvest.json").read_text())
    assert "side_work" in record and record["manager_restarts"] == 0
    # ... later: the step running at the exit had to end first (what the with block used to wait for;
    # a file's time may lag the clock by a tick)
    assert (tmp / "slow" / "harvest.json").stat().st_mtime - found[0]["slow_step_began"] > 2.0 - 0.05
    assert any(s["name"] == "attach_tasks:Slow" for s in record["steps"])
    assert "side_work" in json.loads((tmp / "slow" / "attach-rank0.json").read_text())


# ---------------------------------------------------------------------------------------------
# The observer's own cost (benchmarks/attach_cost.py): the cheaper paths keep what it reports.


def _dry_observer(min_bubble_s: float, port: int | None = None):
    """rank 0 of torch's Schedule1F1B (p=2, m=4) on stand-in stages whose compute does nothing."""
    from flowride.pipeline import torch_compat as tc
    from flowride.pipeline.events import BubblePublisher
    from flowride.pipeline.reporter import BubbleReporter
    from flowride.pipeline.torch_observe import TorchObserver

    sched = tc.dry_schedule("1f1b", 2, 4, 1, rank=0)
    stage = tc.local_stages(sched)[0]
    calls = []

    def noop(*_a, **_k) -> None:
        return None

    for m in tc.STAGE_METHODS:
        setattr(stage, m, noop)
    acts = tc.compute_actions(sched)[0]

    def step(*_a, **_k) -> None:
        for a in acts:
            calls.append(a)
            if a.kind == "F":
                stage.forward_one_chunk(a.mb, (), {})
            else:
                stage.backward_one_chunk(a.mb, loss=None, full_backward=True)

    sched.step = step
    rep = BubbleReporter(0, BubblePublisher(port), min_bubble_s=min_bubble_s)
    return sched, stage, rep, TorchObserver(sched, rep), acts


def test_the_observer_books_every_gap_and_announces_from_the_second_iteration():
    from flowride.pipeline.events import BubbleSubscriber

    sub = BubbleSubscriber()
    try:
        sched, _, rep, obs, acts = _dry_observer(0.0, sub.port)
        for _ in range(3):
            sched.step()
        n = len(acts) + 1
        assert [w.key for w in rep.waits] == [f"{g}#0" for g in range(n)] * 3
        assert [w.type for w in rep.waits[:n]] == obs.gap_types() and obs.plan_mismatches == 0
        assert [w.announced for w in rep.waits] == [False] * n + [True] * 2 * n  # lengths learned in the first
        assert all(w.predicted_s is not None for w in rep.waits[n:])
        assert [r["kind"] for r in obs.records] == [a.kind for a in acts]
        events = sub.drain()
        assert [e.kind for e in events if e.kind != "iter"] == ["bubble", "busy"] * 2 * n
        assert sorted(rep.profile()) == sorted(f"{g}#0" for g in range(n))
    finally:
        sub.close()


def test_pausing_puts_torchs_own_methods_back():
    sched, stage, rep, obs, acts = _dry_observer(0.0)
    fake_step, fake_forward = obs._saved[-1][2], obs._saved[0][2]  # what was there before observing
    obs.detach()
    assert vars(sched)["step"] is fake_step and stage.forward_one_chunk is fake_forward
    sched.step()  # nothing observed
    assert rep.waits == []
    obs.install()
    assert stage.forward_one_chunk is not fake_forward and stage.forward_one_chunk.__wrapped__ is fake_forward
    sched.step()
    assert len(rep.waits) == len(acts) + 1


def test_an_event_is_the_same_json_on_the_fast_path():
    from dataclasses import asdict

    from flowride.pipeline.events import BubbleEvent

    for ev in (BubbleEvent("bubble", 1, "S", 12.5, 12.75, 2**40, 7), BubbleEvent("busy", 0, "A", 3.0, None, 0, -1),
               BubbleEvent("bubble", 0, 'odd "label"', 1.0, float("inf"), 1, 0)):
        assert json.loads(ev.to_bytes()) == asdict(ev)
