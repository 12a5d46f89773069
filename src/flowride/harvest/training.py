"""Harvest the bubbles of a training job: one call for torch.distributed.pipelining, a few for any loop.

::

    schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=loss_fn)   # the user's own
    with flowride.harvest.attach(schedule, run_dir="runs/job", side_tasks=["cnn"]):
        for batch in data:
            schedule.step(...)                                          # unchanged
            optimizer.step()

Every rank of the job calls :func:`attach` (it is collective: the ranks agree on the manager's
address through the process group's store, with a timeout). On each host, local rank 0 starts a
supervised side-task manager (:class:`flowride.harvest.supervise.ManagerProcess`) for its stages,
submits the side tasks and lets them set up before the first step; every rank wraps its own
schedule (:mod:`flowride.pipeline.torch_observe`) so that its bubbles are learned online and
announced, with their predicted end, to its host's manager. Training computes exactly what it
computes without ``attach``; the wrappers only read the clock and send a datagram per bubble.

Leaving the ``with`` returns at once: the manager is stopped and its record collected in the
background, and written to the run directory when done (training never waits on the manager).

The learned bubble lengths are saved in the run directory when the job ends and reused by the
next job with the same schedule (class, stages, micro-batches), so its first iteration is
predicted too.

Loops that cannot be wrapped (a hand-written schedule, Megatron-LM, DeepSpeed) use
:func:`connect`, which does the same set-up and hands back the :class:`BubbleReporter` to call
around their waits. The checks a new user's mistakes meet are in :mod:`flowride.harvest.attach_setup`.
"""

from __future__ import annotations

import atexit
import json
import os
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowride.errors import InputError
from flowride.files import write_json_atomic
from flowride.harvest import attach_setup as setup
from flowride.harvest.manager_files import PROFILES_FILE, ManagerOptions, read_profiles
from flowride.harvest.session import HARVEST_MODES, job_params, no_work_cause
from flowride.harvest.supervise import ManagerProcess, ManagerUnavailable
from flowride.pipeline import torch_compat as tc
from flowride.pipeline.events import BubblePublisher
from flowride.pipeline.reporter import BubbleReporter
from flowride.pipeline.torch_observe import TorchObserver, observe

STOP_AT_EXIT_S = 120.0  # at interpreter exit, how long to wait for a manager still being stopped
TASKS_POLL_S = 1.0  # how often a rank checks whether its host's store holds a task a bubble could serve
MANAGER_START_S = 90.0  # what the other ranks allow the manager's start on top of timeout_s

_OPEN: dict[int, Harvest] = {}  # id(schedule) -> the open Harvest on it: a second attach is refused
_STOPPING: dict[str, threading.Thread] = {}  # resolved run_dir -> its manager's stop, in flight


def _signature(schedule: Any) -> dict:
    return {"schedule": type(schedule).__name__, "stages": len(tc.stage_to_rank(schedule)),
            "ranks": tc.group_size(schedule), "microbatches": tc.n_microbatches(schedule)}


class Harvest:
    """What :func:`attach` or :func:`connect` set up on this rank; :meth:`close` (or leaving the
    ``with``) undoes it. ``reporter`` is the rank's :class:`BubbleReporter`.

    ``tasks`` (on the rank that started the manager): whether the side tasks were submitted
    fresh or resumed from the run directory, and whether they were ready before the first step.
    ``side_work`` and ``record`` are filled once the manager has stopped."""

    def __init__(self, rank: int, reporter: BubbleReporter, run_dir: Path, manager: ManagerProcess | None,
                 tasks: dict | None = None) -> None:
        self.rank = rank
        self.reporter = reporter
        self.run_dir = run_dir
        self.manager = manager
        self.tasks = tasks
        self.observer: TorchObserver | None = None
        self.signature: dict | None = None  # the torch schedule's, for reusing learned lengths
        self.record: dict | None = None
        self.side_work: dict | None = None
        self.stop_error: str | None = None
        self.announce_off: str | None = None  # why this rank announces nothing, if it does not
        self.closed = False
        self.paused = False
        self.has_work = True  # this host's store holds a task that a bubble could serve
        self._schedule_id: int | None = None
        self._poll_stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._publisher = reporter.pub  # the manager's address; swapped for _silent while no task could use it
        self._silent = BubblePublisher(None)
        self._stopper: threading.Thread | None = None
        self._closed_at: float | None = None

    def __enter__(self) -> Harvest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(wait=False)  # training goes on at once; the manager stops in the background

    # ------------------------------------------------------------------ on / off
    def pause(self) -> None:
        """Stop observing until :meth:`resume`: torch's own methods run again (no wrapper is left
        on the path) and nothing is announced. For phases the harvest should not see (evaluation),
        and for measuring the observer's cost on and off in one run (benchmarks/attach_cost.py)."""
        if self.paused or self.closed:
            return
        self.paused = True
        if self.observer is not None:
            self.observer.detach()
        self.reporter.busy()
        self._apply()

    def resume(self) -> None:
        """Observe and announce again after :meth:`pause`."""
        if not self.paused or self.closed:
            return
        self.paused = False
        self._apply()
        if self.observer is not None:
            self.observer.install()

    def _apply(self) -> None:
        """Announce only when it can serve: not paused, a manager on this host, and a task in its
        store. With no task, every datagram is pure cost (sent from inside a training step, with
        cold caches, one took ~45-60 us on a 2-core VM, against ~6 us in a tight loop): the
        observer then only measures, and sends nothing at all (not even the iteration marks of
        the manager's budget guard, which has no harvesting to guard)."""
        if self.closed:
            return
        self.reporter.enabled = not self.paused and self.announce_off is None and self.has_work
        self.reporter.pub = self._publisher if self.has_work else self._silent

    def watch_tasks(self) -> None:
        """Check now, and then every :data:`TASKS_POLL_S` from a thread, whether this host's store
        holds an unfinished task; announcements follow (a task submitted while training runs, with
        ``flowride tasks submit``, gets its bubbles within a second)."""
        from flowride.harvest.manager_files import read_options
        from flowride.harvest.rerun import runs
        from flowride.harvest.store import TaskStore

        try:
            opts = read_options(self.run_dir)  # the run's tasks: other jobs' leftovers do not run
            store = TaskStore.in_run_dir(self.run_dir)
        except (InputError, OSError):
            return  # announce, as without the check

        def has_work() -> bool:
            try:
                return any(not t.cancel_requested and runs(t, opts) for t in store.unfinished())
            except Exception:  # a store being written: announce, as without the check
                return True

        self.has_work = has_work()
        self._apply()

        def loop() -> None:
            try:
                while not self._poll_stop.wait(TASKS_POLL_S):
                    now = has_work()
                    if now != self.has_work:
                        self.has_work = now
                        self._apply()
            finally:
                store.close()

        self._poller = threading.Thread(target=loop, name="flowride-harvest-tasks", daemon=True)
        self._poller.start()

    # ------------------------------------------------------------------ results
    def summary(self) -> dict:
        """This rank's bubbles: waits seen, announced (really sent to a manager), prediction
        error, events sent; the side tasks' origin and readiness on the manager's rank, and the
        side work done in the bubbles (or why there was none) once the manager has stopped."""
        out = self.reporter.summary()
        if self.announce_off:
            out["announce_off"] = self.announce_off
        elif not self.has_work:
            out["announce_off"] = "no unfinished side task in this host's store (announcing starts within a second of one)"
        if self.observer is not None:
            out["plan_mismatches"] = self.observer.plan_mismatches
            out["gap_types"] = self.observer.gap_types()
        out["lengths"] = self.reporter.profile()
        if self.tasks is not None:
            out["side_tasks"] = self.tasks
        if self.side_work is not None:
            out["side_work"] = self.side_work
        if self.stop_error:
            out["stop_error"] = self.stop_error
        return out

    def close(self, wait: bool = True) -> dict | None:
        """Stop observing and write ``attach-rank{r}.json`` (this rank's summary). On the rank
        that started the manager, stop it (tasks are saved and stay resumable) in the background;
        with ``wait`` (the default of an explicit call) wait for it and return its record.
        Leaving the ``with`` does not wait: :meth:`wait` does, and the record is written to
        ``harvest.json`` in the run directory when the manager has stopped."""
        if not self.closed:
            self.closed = True
            self._closed_at = time.monotonic()
            if self._schedule_id is not None:
                _OPEN.pop(self._schedule_id, None)
            self._poll_stop.set()
            try:
                if self.observer is not None:
                    self.observer.detach()
                self.reporter.pub = self._publisher  # its counts go in the summary; it is the one to close
                self.reporter.close()
                self._write_summary()
                if self.signature is not None:
                    write_json_atomic(self.run_dir / f"bubble-lengths-rank{self.rank}.json",
                                      {"signature": self.signature, "lengths": self.reporter.profile()}, indent=1)
            finally:
                if self.manager is not None:
                    self._stopper = threading.Thread(target=self._stop_manager, name="flowride-harvest-stop", daemon=True)
                    _STOPPING[str(self.run_dir.resolve())] = self._stopper
                    self._stopper.start()
        if wait:
            self.wait()
        return self.record

    def wait(self, timeout: float | None = None) -> dict | None:
        """Wait until the manager has stopped (after :meth:`close`); its record, or None."""
        if self._stopper is not None:
            self._stopper.join(timeout)
        return self.record

    def _write_summary(self) -> None:
        write_json_atomic(self.run_dir / f"attach-rank{self.rank}.json", self.summary(), indent=1)

    def _stop_manager(self) -> None:
        assert self.manager is not None
        try:
            record = self.manager.stop()
            self.side_work = self._side_work(record)
            record["side_work"] = self.side_work
            write_json_atomic(self.run_dir / "harvest.json", record)
            self._write_summary()
            self.record = record
        except Exception as e:  # a background thread: keep the reason where the user looks
            self.stop_error = f"{type(e).__name__}: {e}"
            try:
                self._write_summary()
            except OSError:
                pass
        finally:
            key = str(self.run_dir.resolve())
            if _STOPPING.get(key) is threading.current_thread():
                del _STOPPING[key]

    def _side_work(self, record: dict) -> dict:
        """The side-task steps taken while this job trained, and, when there were none, why."""
        waits = self.reporter.waits
        began = waits[0].start if waits else None
        ended = self._closed_at or time.monotonic()
        steps = [s for s in record.get("steps") or [] if began is not None and began <= float(s.get("t0", -1)) <= ended]
        out: dict[str, Any] = {"steps": len(steps), "units": round(sum(float(s.get("units", 0)) for s in steps), 6)}
        if not steps:
            out["why_none"] = self._why_none(record)
        return out

    def _why_none(self, record: dict) -> str:
        ids = set((self.tasks or {}).get("ids") or [])
        tasks = [t for t in record.get("tasks") or [] if t.get("id") in ids]
        if not tasks:
            return ("no side task to run: side_tasks was empty and no unfinished task was resumed (resume_leftovers=True "
                    "runs those earlier jobs left in the run directory)")
        failed = [t for t in tasks if t.get("state") == "FAILED"]
        if len(failed) == len(tasks):
            return "every side task failed: " + "; ".join(f"{t['name']}: {t.get('reason')}" for t in failed)
        if record.get("harvest_stopped"):
            return f"harvesting stopped: {record['harvest_stopped']}"
        rep = self.reporter
        longest = max((w.seconds for w in rep.waits), default=0.0)
        announced = [w for w in rep.waits if w.announced and w.predicted_s is not None]
        if not announced:  # this rank's view (each rank's attach-rank{r}.json has its own)
            if rep.iterations_seen <= rep.warmup_iters:
                return (f"the job ran {rep.iterations_seen} iteration(s): bubble lengths are learned in the first and announced "
                        "from the second on (a re-run into this run_dir starts from the lengths saved now)")
            return (f"rank {self.rank} announced no bubble: no wait was predicted to last min_bubble_s "
                    f"({rep.min_bubble_s * 1e3:.1f} ms) or more (its longest measured wait: {longest * 1e3:.2f} ms)")
        if (self.tasks or {}).get("ready") is False:
            return (f"the side tasks were not ready when the bubbles came (still setting up after ready_timeout_s: "
                    f"{', '.join(self.tasks.get('not_ready', []))})")
        if (record.get("bubbles") or {}).get("unused_by_reason"):  # the manager counted why each bubble went unused
            return no_work_cause(record["bubbles"], 0)
        own = [float(s["t1"]) - float(s["t0"]) for s in record.get("steps") or [] if "t1" in s and "t0" in s]
        best = max((w.predicted_s for w in announced), default=0.0)
        need = f", a side-task step needs about {statistics.median(own) * 1.2e3:.1f} ms (median step x 1.2)" if own else ""
        return (f"bubbles were announced, but none had room for a side-task step: the longest predicted bubble on rank "
                f"{self.rank} was {best * 1e3:.2f} ms{need}")


def _finish_stops() -> None:
    """At interpreter exit, let managers still stopping in the background save their tasks and
    write their record (training is over by then; bounded by :data:`STOP_AT_EXIT_S`)."""
    deadline = time.monotonic() + STOP_AT_EXIT_S
    for t in list(_STOPPING.values()):
        t.join(max(0.0, deadline - time.monotonic()))


atexit.register(_finish_stops)


def _probing(names: Sequence[str], ids: Sequence[int], profiles: dict, side_device: str, mode: str) -> set[int]:
    """The tasks whose step time the manager learns from a few steps at start-up (iterative, no
    profile, CPU, freeride): they are ready only after those steps."""
    from flowride.harvest.task import ImperativeSpec, resolve

    if side_device != "cpu" or mode != "freeride":
        return set()
    out = set()
    for name, tid in zip(names, ids, strict=True):
        try:
            factory = resolve(name)
        except InputError:
            continue
        if not isinstance(factory, ImperativeSpec) and not (profiles.get(name) or {}).get("median_step_s"):
            out.add(tid)
    return out


def _start_manager(run_dir: Path, side_tasks: Sequence[str], mode: str, side_device: str, stages: int,
                   profiles: dict[str, dict] | None, ready_timeout_s: float,
                   resume_leftovers: bool = False) -> tuple[ManagerProcess, int, dict]:
    """Start this host's manager with the side tasks (each resuming its unfinished twin in the run
    directory: :mod:`flowride.harvest.rerun`) and wait, at most ``ready_timeout_s``, until they
    are set up, so the first bubbles can be used."""
    setup.wait_stopped(_STOPPING.get(str(run_dir.resolve())))
    setup.refuse_live_manager(run_dir)
    if profiles is None and (run_dir / PROFILES_FILE).exists():
        profiles = read_profiles(run_dir)
    profiles = profiles or {}
    tasks = setup.prepare_store(run_dir, side_tasks, {n: job_params(n, side_device) for n in side_tasks}, resume_leftovers)
    offset = setup.steps_offset(run_dir)
    manager = setup.ManagerWithPath(run_dir, ManagerOptions(stages=stages, mode=mode, device=side_device, run_tasks=tasks["ids"],
                                                            run_since=tasks["since"]), profiles,
                                    extra_path=setup.manager_import_path())
    port = manager.start()
    manager.watch()
    try:
        t0 = time.monotonic()
        probing = _probing(tasks["names"], tasks["ids"], profiles, side_device, mode)
        failed, pending = setup.wait_ready(run_dir, tasks["ids"], probing, ready_timeout_s, offset)
        if failed:
            raise setup.cannot_start(failed)
    except BaseException:
        manager.stop()
        raise
    tasks["ready"] = not pending
    tasks["ready_s"] = round(time.monotonic() - t0, 3)
    if pending:
        tasks["not_ready"] = [f"{t.name} ({t.state})" for t in pending]
    return manager, port, tasks


def _connect(stage: int, stages: int, run_dir: str | Path, side_tasks: Sequence[str], mode: str, *, min_bubble_s: float,
             device: str, side_device: str | None, start_manager: bool | None, profiles: dict[str, dict] | None,
             saved_lengths: dict[str, float] | None, timeout_s: float, ready_timeout_s: float, what: str,
             problem: InputError | None, resume_leftovers: bool = False) -> Harvest:
    """:func:`connect`'s work, with a ``problem`` the caller (attach) already found on this rank:
    every rank learns of any rank's problem and raises it."""
    import torch.distributed as dist

    from flowride.harvest.task import resolve

    if stages > 1 and not (dist.is_available() and dist.is_initialized()):
        raise InputError(what, f"torch.distributed is not initialized, and the job has {stages} pipeline ranks: this rank could "
                         "not learn its host's side-task manager, and its bubbles would go unannounced",
                         f"call torch.distributed.init_process_group(...) first, then {what}(...) on every rank")
    run_path = Path(run_dir)
    side_device = side_device or device
    if problem is None:
        try:
            if mode not in HARVEST_MODES or mode == "none":
                raise InputError("mode", f"unknown harvest mode {mode!r}", "use freeride, naive or priority")
            if side_device not in ("cpu", "cuda"):
                raise InputError("side_device", f"unknown device {side_device!r}", "use cpu or cuda")
            if not timeout_s > 0 or not ready_timeout_s >= 0:
                raise InputError("timeout_s", f"timeout_s={timeout_s}, ready_timeout_s={ready_timeout_s}",
                                 "give timeout_s > 0 and ready_timeout_s >= 0 seconds")
            for name in side_tasks:
                resolve(name)
            run_path = setup.usable_run_dir(run_dir)
        except InputError as e:
            problem = e
    gate = setup.Gate(what)
    gate.agree("arrive", problem, timeout_s, f"did not call {what}")
    owner = start_manager if start_manager is not None else int(os.environ.get("LOCAL_RANK", stage)) == 0
    manager: ManagerProcess | None = None
    port: int | None = None
    tasks: dict | None = None
    failure: Exception | None = None
    if owner:
        try:
            manager, port, tasks = _start_manager(run_path, side_tasks, mode, side_device, stages, profiles, ready_timeout_s,
                                                  resume_leftovers)
        except Exception as e:  # every rank must hear of it, or the others wait for this one in vain
            failure = e
    try:
        hosts = gate.agree("manager", failure, timeout_s + MANAGER_START_S + ready_timeout_s,
                           f"did not finish {what}'s set-up (see their own error)", extra=[setup.hostname(), port])
    except BaseException:
        if manager is not None:
            manager.stop()
        if failure is not None and not isinstance(failure, InputError | ManagerUnavailable):
            raise failure from None  # this rank's own error, with its traceback; the others got its message
        raise
    me = setup.hostname()
    my_port = next((int(p) for h, p in hosts if h == me and p is not None), None)
    reporter = BubbleReporter(stage, BubblePublisher(my_port), min_bubble_s=min_bubble_s, device=device,
                              profile=saved_lengths, warmup_iters=0 if saved_lengths else 1)
    h = Harvest(stage, reporter, run_path, manager, tasks)
    if my_port is None:  # so the summary counts as announced only what really went out
        h.announce_off = "no side-task manager runs on this host (start_manager was False on every rank here)"
        h._apply()
    else:
        h.watch_tasks()
    return h


def connect(stage: int, stages: int, run_dir: str | Path = "runs/harvest", side_tasks: Sequence[str] = (),
            mode: str = "freeride", *, min_bubble_s: float = 0.002, device: str = "cpu",
            side_device: str | None = None, start_manager: bool | None = None,
            profiles: dict[str, dict] | None = None, saved_lengths: dict[str, float] | None = None,
            timeout_s: float = 120.0, ready_timeout_s: float = 30.0, resume_leftovers: bool = False) -> Harvest:
    """A :class:`Harvest` whose ``reporter`` is pipeline rank ``stage``'s (of ``stages``)
    :class:`BubbleReporter`, connected to its host's side-task manager, which the rank that
    starts it (default: local rank 0) also holds.

    For training loops that :func:`attach` cannot wrap (hand-written, Megatron-LM, DeepSpeed):
    call it on every rank after ``init_process_group`` (it is collective: refused before it, and
    a rank that does not call it within ``timeout_s`` is named in an error raised on the others),
    then report waits with ``reporter.waiting(...)`` or ``idle()``/``busy()``. ``device`` is this
    rank's training device type ("cpu" or "cuda"); side tasks compute on ``side_device``
    (default: ``device`` of the rank that starts the manager). The side tasks are set up before
    it returns (at most ``ready_timeout_s``; 0: do not wait), so the first bubbles can be used.
    A re-run into ``run_dir`` resumes the tasks it names (same name and parameters) and leaves
    other jobs' unfinished tasks alone unless ``resume_leftovers`` (:mod:`flowride.harvest.rerun`).
    """
    return _connect(stage, stages, run_dir, side_tasks, mode, min_bubble_s=min_bubble_s, device=device,
                    side_device=side_device, start_manager=start_manager, profiles=profiles, saved_lengths=saved_lengths,
                    timeout_s=timeout_s, ready_timeout_s=ready_timeout_s, what="connect", problem=None,
                    resume_leftovers=resume_leftovers)


def _saved_lengths(run_dir: str | Path, rank: int, schedule: Any) -> dict[str, float]:
    """The bubble lengths a previous job with the same schedule saved (empty if none, or unreadable)."""
    try:
        data = json.loads((Path(run_dir) / f"bubble-lengths-rank{rank}.json").read_text())
        if data.get("signature") == _signature(schedule):
            return {k: float(v) for k, v in data.get("lengths", {}).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return {}


def attach(schedule: Any, run_dir: str | Path = "runs/harvest", side_tasks: Sequence[str] = (),
           mode: str = "freeride", *, min_bubble_s: float = 0.002, device: str | None = None,
           start_manager: bool | None = None, profiles: dict[str, dict] | None = None,
           reuse_profile: bool = True, timeout_s: float = 120.0, ready_timeout_s: float = 30.0,
           resume_leftovers: bool = False) -> Harvest:
    """Harvest ``schedule``'s bubbles on this rank; returns a :class:`Harvest` (a context manager).

    ``schedule``: a torch.distributed.pipelining schedule instance (Schedule1F1B(stage, ...),
    not the stage or the model). Collective: every rank calls it after ``init_process_group``;
    a rank missing after ``timeout_s`` is named in an error raised on the others, and a mistake
    found on one rank is raised on all. A schedule can be attached once at a time.
    ``side_tasks``: registered task names or ``module:Class`` (the manager imports it with this
    script's ``sys.path``), submitted once by the rank that starts the manager (the store in
    ``run_dir`` is durable: a re-run resumes the unfinished task of the same name and parameters
    instead, labelled as a re-run; other jobs' unfinished tasks are left alone unless
    ``resume_leftovers``: :mod:`flowride.harvest.rerun`).
    They are set up before ``attach`` returns (at most ``ready_timeout_s``), so a short job's
    first bubbles find them ready. ``mode``: freeride (only in bubbles), naive or priority
    (continuous baselines). ``device``: where side tasks compute (default: cuda if this rank
    trains on CUDA, else cpu). ``start_manager``: default, local rank 0 of each host does.
    ``profiles``: task profiles (median step time etc.; default: ``run_dir/task-profiles.json``
    if present, else each task learns its step time from its first steps). ``reuse_profile``:
    start from the bubble lengths a previous job with the same schedule saved in ``run_dir``.
    """
    tc.check()
    problem: InputError | None = None
    rank, world, dev_type, saved = 0, 1, "cpu", {}
    try:
        tc.check_schedule(schedule)
        if id(schedule) in _OPEN:
            raise InputError("schedule", "this schedule is already attached: an earlier attach(...) on it is still open, and a "
                             "second would start a second side-task manager on the same task store",
                             "keep using the Harvest the first attach returned, or leave its with block (or close() it) first")
        rank, world = tc.group_rank(schedule), tc.group_size(schedule)
        dev = getattr(tc.local_stages(schedule)[0], "device", None)
        dev_type = getattr(dev, "type", "cpu") or "cpu"
        if reuse_profile:
            saved = _saved_lengths(run_dir, rank, schedule)
    except InputError as e:
        problem = e
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            world = dist.get_world_size()
    h = _connect(rank, world, run_dir, side_tasks, mode, min_bubble_s=min_bubble_s, device=dev_type, side_device=device,
                 start_manager=start_manager, profiles=profiles, saved_lengths=saved, timeout_s=timeout_s,
                 ready_timeout_s=ready_timeout_s, what="attach", problem=problem, resume_leftovers=resume_leftovers)
    try:
        h.observer = observe(schedule, h.reporter, steady=True)
        h.signature = _signature(schedule)
    except BaseException:
        h.close(wait=True)
        raise
    h._schedule_id = id(schedule)
    _OPEN[id(schedule)] = h
    return h
