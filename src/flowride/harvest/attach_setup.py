"""What :func:`flowride.harvest.attach` checks and prepares before training starts.

A new user's mistakes with ``attach`` used to end in a hang, a raw ``OSError`` or silently lost
side work. Each check here turns one of them into one :class:`~flowride.errors.InputError` that
names the fix, raised on every rank of the job where the mistake is collective:

- :class:`Gate`: the ranks agree through the process group's key-value store, with a timeout,
  instead of a collective that hangs without a word when one rank never calls ``attach``; a
  problem found on one rank is raised on all of them;
- :func:`usable_run_dir`: a run directory that is a file or cannot be written;
- :func:`manager_import_path` and :class:`ManagerWithPath`: the manager is its own process, so a
  ``module:Class`` task that sits next to the training script is importable there only if the
  script's ``sys.path`` goes with it (as ``PYTHONPATH``);
- :func:`prepare_store`: a re-run into the same run directory resumes the unfinished tasks it
  names (same name and parameters), labelled as a re-run (the store's own recovery labels them
  "recovered after a manager restart", which is for real restarts only), submits the others
  fresh, and leaves other jobs' unfinished tasks alone (:mod:`flowride.harvest.rerun`);
- :func:`wait_ready`: the side tasks' processes are started and set up at ``attach`` (a task
  without a profile also learns its step time there), so a short job's first bubbles find them
  ready, and a task the manager cannot start is reported at once.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flowride.errors import InputError
from flowride.files import check_output_dir
from flowride.harvest.manager_files import is_our_manager, read_pid
from flowride.harvest.rerun import SUBMITTED, prepare_run
from flowride.harvest.states import TaskState
from flowride.harvest.store import TaskStore
from flowride.harvest.supervise import ManagerProcess, ManagerUnavailable
from flowride.pipeline import torch_compat as tc

_CALLS = itertools.count()  # this process's attach/connect calls: every rank numbers them alike
_POLL_S = 0.02


def _ranks(rs: Sequence[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


class Gate:
    """Agreement among the ranks of the default process group, each round bounded in time.

    Every rank writes its value under its own key of the group's store and reads the others'.
    A rank missing after ``timeout_s`` is named in an InputError raised on every rank that came;
    a rank that comes later finds the round abandoned and raises too, instead of waiting in a
    collective nobody else will join. Without torch.distributed (one process) a round returns
    this rank's value alone.
    """

    def __init__(self, what: str) -> None:
        import torch.distributed as dist

        self.what = what
        self.on = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.on else 0
        self.world = dist.get_world_size() if self.on else 1
        self.store = tc.default_store() if self.on else None
        self.prefix = f"flowride/{what}/{next(_CALLS)}"

    def exchange(self, phase: str, value: Any, timeout_s: float, late: str) -> list[Any]:
        """Every rank's ``value`` (JSON-able), by global rank. ``late`` says what a missing rank
        did not do, for the error."""
        if not self.on or self.world == 1:
            return [value]
        if self.store is None:  # a torch without the store accessor: a collective, unbounded
            import torch.distributed as dist

            out: list = [None] * self.world
            dist.all_gather_object(out, value)
            return out
        tag = f"{self.prefix}/{phase}"
        keys = [f"{tag}/{r}" for r in range(self.world)]
        self.store.set(keys[self.rank], json.dumps(value))
        gone = f"{tag}/abandoned"
        deadline = time.monotonic() + timeout_s
        while True:
            if self.store.check([gone]):
                missing = json.loads(self.store.get(gone))
                raise InputError(self.what, f"{_ranks(missing)} {late} within {timeout_s:.0f} s, so the others gave up",
                                 self._fix())
            if self.store.check(keys):
                return [json.loads(self.store.get(k)) for k in keys]
            if time.monotonic() > deadline:
                missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
                self.store.set(gone, json.dumps(missing))
                raise InputError(self.what, f"{_ranks(missing)} of {self.world} {late} within {timeout_s:.0f} s", self._fix())
            time.sleep(_POLL_S)

    def _fix(self) -> str:
        return (f"{self.what} is collective: call it on every rank of the job, after init_process_group and before "
                f"the first step; pass a larger timeout_s if some ranks reach it later")

    def agree(self, phase: str, problem: Exception | None, timeout_s: float, late: str, extra: Any = None) -> list[Any]:
        """Exchange ``extra`` and this rank's ``problem``; if any rank has one, raise it here too,
        naming the ranks that had it: an InputError as itself, anything else (the manager would not
        start) as ManagerUnavailable."""
        mine = None
        if isinstance(problem, InputError):
            mine = ["input", problem.field, problem.problem, problem.fix]
        elif isinstance(problem, ManagerUnavailable):
            mine = ["manager", "", str(problem), ""]
        elif problem is not None:
            mine = ["manager", "", f"{type(problem).__name__}: {problem}", ""]
        got = self.exchange(phase, {"problem": mine, "extra": extra}, timeout_s, late)
        bad = [r for r, g in enumerate(got) if g["problem"] is not None]
        if bad:
            kind, field, text, fix = got[bad[0]]["problem"]
            where = f" (on {_ranks(bad)})" if self.world > 1 else ""
            if kind == "input":
                raise InputError(field, f"{text}{where}", fix)
            raise ManagerUnavailable(f"{text}{where}")
        return [g["extra"] for g in got]


def hostname() -> str:
    return socket.gethostname()


def usable_run_dir(run_dir: str | Path) -> Path:
    """``run_dir``, created if missing; a file, or a place we cannot write, is an InputError on
    ``run_dir`` (not a raw FileExistsError or PermissionError from deep inside)."""
    d = check_output_dir(run_dir, "run_dir")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError("run_dir", f"cannot create {d}: {e.strerror or e}", "give a directory you can write") from None
    return d


def manager_import_path() -> list[str]:
    """The entries of this process's ``sys.path`` that a fresh interpreter (the manager's) would
    not have: the training script's directory, and whatever the script added. Found by asking
    such an interpreter, in the same environment, for its path (stdlib and site-packages are not
    repeated, so nothing the manager imports is shadowed)."""
    mine = []
    for p in sys.path:
        a = os.path.abspath(p or os.getcwd())
        if os.path.isdir(a) and a not in mine:
            mine.append(a)
    try:
        out = subprocess.run([sys.executable, "-c", "import json, os, sys; print(json.dumps([os.path.abspath(p or os.getcwd()) for p in sys.path]))"],
                             capture_output=True, text=True, timeout=30, check=True)
        theirs = set(json.loads(out.stdout))
    except (OSError, subprocess.SubprocessError, ValueError):
        theirs = set()
    return [p for p in mine if p not in theirs]


_ENV_LOCK = threading.Lock()


@contextmanager
def _python_path(extra: Sequence[str]):
    """``PYTHONPATH`` extended by ``extra`` while a manager is started (it copies the
    environment when it starts); put back at once, so the user's own subprocesses never see it."""
    if not extra:
        yield
        return
    with _ENV_LOCK:
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([*extra, *([old] if old else [])])
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old


class ManagerWithPath(ManagerProcess):
    """A :class:`ManagerProcess` whose process (and its side-task processes) import with the
    training script's extra ``sys.path`` entries, on its first start and on every restart."""

    def __init__(self, *args: Any, extra_path: Sequence[str] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.extra_path = list(extra_path)

    def start(self) -> int:
        with _python_path(self.extra_path):
            return super().start()


def refuse_live_manager(run_dir: Path) -> None:
    """Another manager still running on ``run_dir`` (another job, or an attach not closed)
    would share its store: the two would take each other's tasks and lose side work."""
    rec = read_pid(run_dir)
    if rec is not None and is_our_manager(rec, run_dir)[0]:
        raise InputError("run_dir", f"a side-task manager (pid {rec.pid}) already runs in {run_dir}, from another job or an "
                         "attach that was not closed", f"give this job its own run_dir, or stop that one: flowride manager stop --run-dir {run_dir}")


def prepare_store(run_dir: Path, side_tasks: Sequence[str], params: dict[str, dict], resume_leftovers: bool = False) -> dict:
    """The job's side tasks, by the re-run rule (:mod:`flowride.harvest.rerun`): each resumes the
    unfinished task of the same name and parameters a previous job left in the store, or is
    submitted; the unfinished tasks it does not name stay as they are, unless ``resume_leftovers``.

    Resumed tasks go back to SUBMITTED labelled as a re-run, so the manager's start-up recovery
    (meant for a manager that died) neither relabels them nor counts a restart. Returns what was
    done: ``origin`` (fresh: all submitted; resumed: all resumed; mixed; none), the task ids and
    names, each task's origin, ``left`` (not run), ``since``, and a note when tasks were left.
    """
    store = TaskStore.in_run_dir(run_dir)
    try:
        plan = prepare_run(store, [(n, params.get(n, {})) for n in side_tasks], resume_leftovers)
    finally:
        store.close()
    kinds = {t["origin"] for t in plan["tasks"]}
    origin = "none" if not kinds else "fresh" if kinds == {SUBMITTED} else "resumed" if SUBMITTED not in kinds else "mixed"
    out = {"origin": origin, "names": [t["name"] for t in plan["tasks"]], **plan}
    if plan["left"]:
        out["note"] = (f"{len(plan['left'])} unfinished task(s) left in {run_dir} by earlier jobs were not run: "
                       f"{', '.join(str(t['id']) + ':' + t['name'] for t in plan['left'])} (resume_leftovers=True runs them)")
    return out


def steps_offset(run_dir: Path) -> int:
    """Where the steps a manager started now will append to ``steps.jsonl`` begin."""
    f = run_dir / "steps.jsonl"
    return f.stat().st_size if f.exists() else 0


def _new_steps(run_dir: Path, offset: int) -> dict[int, int]:
    """Steps per task id recorded past ``offset`` in ``steps.jsonl``."""
    f = run_dir / "steps.jsonl"
    out: dict[int, int] = {}
    if not f.exists():
        return out
    with open(f, "rb") as fh:
        fh.seek(offset)
        for line in fh.read().splitlines():
            try:
                tid = int(json.loads(line)["task"])
            except (ValueError, KeyError, TypeError):
                continue  # a line being written
            out[tid] = out.get(tid, 0) + 1
    return out


def wait_ready(run_dir: Path, ids: Sequence[int], probing: set[int], timeout_s: float, offset: int) -> tuple[list, list]:
    """Wait until every task in ``ids`` is set up (its process started and ``setup`` run; for the
    ids in ``probing``, also the manager's probe steps that learn its step time, counted in
    ``steps.jsonl`` past ``offset``), or failed, or ``timeout_s`` passed. Returns (failed,
    still pending) task records."""
    from flowride.harvest.manager import PROBE_STEPS

    store = TaskStore.in_run_dir(run_dir)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            recs = [store.get(i) for i in ids]
            stepped = _new_steps(run_dir, offset) if probing else {}
            failed = [t for t in recs if t.state is TaskState.FAILED]
            pending = [t for t in recs if not t.state.terminal and (
                t.state in (TaskState.SUBMITTED, TaskState.CREATED) or (t.id in probing and stepped.get(t.id, 0) < PROBE_STEPS))]
            if failed or not pending or time.monotonic() > deadline:
                return failed, pending
            time.sleep(0.05)
    finally:
        store.close()


def wait_stopped(thread: threading.Thread | None, timeout_s: float = 120.0) -> None:
    """An earlier harvest of this process on the same run directory may still be stopping its
    manager in the background: the new manager must not share the store with it."""
    if thread is not None and thread.is_alive():
        thread.join(timeout_s)


def cannot_start(failed: Sequence[Any]) -> InputError:
    """The error for side tasks the manager could not start (import, set-up or first steps)."""
    what = "; ".join(f"{t.name!r} ({t.reason})" for t in failed)
    return InputError("side_tasks", f"the side-task manager (its own process) could not start {what}",
                      "a task must import there: an installed entry-point name, or module:Class on the training "
                      "script's sys.path (attach passes it on); a name given to register() lasts only in this process")
