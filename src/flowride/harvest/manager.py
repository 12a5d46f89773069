"""The side-task manager: fills the pipeline stages' bubbles with side tasks.

The manager listens for the trainer's bubble events (UDP on 127.0.0.1, never blocking training),
keeps every task's state in the durable store, and hosts each side task in its own process
(:mod:`flowride.harvest.runner`) under its limits (:mod:`flowride.harvest.limits`).

This module decides what runs when; the rule for whether a task fits a bubble is in
:mod:`flowride.harvest.fitting`, and starting, signalling and reading the task processes is in
:mod:`flowride.harvest.hosts`.

One scheduler thread owns all state: bubble events, the task hosts' messages, new submissions
and cancellations all arrive on one queue and are handled in order, so no two decisions race.

Modes: ``freeride`` runs a task only inside a bubble. An iterative task steps while its next
step fits the bubble's predicted end and yields at the stage's next compute action; an
imperative task is resumed with SIGCONT and paused with SIGSTOP. ``naive`` runs tasks
continuously at normal priority (co-location), and ``priority`` runs them continuously at idle
priority (the MPS-style baseline). Training can switch harvesting off and on (``off``/``on``
events) for paired overhead measurements: off pauses every task.

Placement. On CPU a freeride task floats: it runs in whichever stage's bubble it fits, pinned to
that stage's core for the time, so one task can use every stage's bubbles (on p = 2 1F1B the two
stages idle at different times). On CUDA a task is bound to one stage's device (moving GPU state
between devices costs more than a bubble); submit one instance per stage to use them all.

Failures are contained. A task that crashes, runs out of memory or ignores a pause is killed and
marked FAILED with the reason; the other tasks go on, and training never waits on any of it.
Every completed step is appended to ``steps.jsonl`` as it happens, so a manager killed with -9
loses no record of work done; a restarted manager resumes every unfinished task of its run from the
store (the run's tasks: :mod:`flowride.harvest.rerun`).
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from flowride.files import write_json_atomic
from flowride.harvest.fitting import BubbleMargins, Decisions, candidates, why_none
from flowride.harvest.guard import BudgetGuard
from flowride.harvest.hosts import Live, cuda_devices, start_host
from flowride.harvest.leasing import poll_queue
from flowride.harvest.limits import Limits, mps_daemon_running, stage_cores
from flowride.harvest.manager_files import (
    ManagerOptions,
    read_options,
    read_profiles,
    ready_file,
    remove_pid,
    write_pid,
)
from flowride.harvest.rerun import split_tasks, takes
from flowride.harvest.states import TaskState
from flowride.harvest.store import TaskRecord
from flowride.harvest.stores import open_store
from flowride.harvest.task import ImperativeSpec, resolve
from flowride.pipeline.events import BubbleEvent, BubbleSubscriber

PROBE_STEPS = 3  # an unprofiled CPU task runs this many steps at idle priority to learn its step time
CHECKPOINT_EVERY_S = 2.0
STARVED_MAX_S = 60.0  # a starved host that has not yielded by then is failed all the same
STORE_POLL_S = 0.2


class Manager:
    def __init__(self, run_dir: str | Path, opts: ManagerOptions, profiles: dict[str, dict] | None = None) -> None:
        opts.validate()
        self.opts = opts
        self.run_dir = Path(run_dir)
        (self.run_dir / "tasks").mkdir(parents=True, exist_ok=True)
        # this host's SQLite file in the run directory, or the cluster queue (opts.store: a URL)
        self.store = open_store(opts.store, self.run_dir, opts.host or None, opts.lease_s)
        self.last_queue_poll = 0.0  # harvest/leasing.py
        self.stages, self.mode, self.factor = opts.stages, opts.mode, opts.factor
        # GPUs on this host (NVML count: no CUDA context in the manager)
        self.gpus = cuda_devices() if opts.device == "cuda" else 0
        # a task floats in freeride on CPU, or on CUDA when every stage shares one GPU; with
        # several GPUs its state lives on one stage's device and it stays there
        self.floating = opts.placement == "float" and opts.mode == "freeride" and (opts.device == "cpu" or self.gpus <= 1)
        self.profiles = profiles or {}
        self.sub = BubbleSubscriber(opts.port)
        self.port = self.sub.port
        self.q: queue.Queue = queue.Queue()
        self.live: dict[int, Live] = {}
        self.running_on: dict[int, Live] = {}
        self.bubble: dict[int, BubbleEvent] = {}
        self.harvesting = True  # switched by "on"/"off" events (paired overhead runs)
        # the budget guard (harvest/guard.py): fed stage 0's iteration times, it sets what may run
        self.guard = (BudgetGuard(opts.budget_pct, block=opts.guard_block, every=opts.guard_every,
                                  external=opts.paired_block > 0, ext_block=opts.paired_block or None,
                                  ext_offset=opts.paired_offset)
                      if opts.budget_pct is not None and opts.mode == "freeride" else None)
        self.iter_start: tuple[int, float] | None = None  # stage 0's current iteration and its start
        self.iter_on = True  # whether side work may run in that iteration
        self.type_steps: dict[str, list[int]] = {}  # bubble type -> [steps, steps that overran]
        self.type_of: dict[int, str] = {}  # task id -> the bubble type it runs in now
        self.failures: list[dict] = []
        self.margins = BubbleMargins()  # per bubble type: how bubbles ended against their prediction (fitting.py)
        self.decisions = Decisions()  # what the fit rule decided, bubble by bubble (fitting.py)
        self.unused: Counter[str] = Counter()  # why an announced bubble got no side step, by rule
        self.unused_example: dict[str, str] = {}  # rule -> the last such reason in full
        self.bubbles_announced = 0
        self.stop = threading.Event()
        self.next_stage = 0
        self.events_seen = 0
        self.mps = opts.device == "cuda" and mps_daemon_running()
        self.steps_file = open(self.run_dir / "steps.jsonl", "a", buffering=1)  # line-buffered: one write per step

    # ------------------------------------------------------------------ processes
    def _spawn(self, rec: TaskRecord) -> Live:
        spec = resolve(rec.name)
        kind = "imperative" if isinstance(spec, ImperativeSpec) else "iterative"
        if rec.stage is not None and rec.stage < self.stages:
            stage = rec.stage
        else:
            stage = self.next_stage
            self.next_stage = (stage + 1) % self.stages
        home = None if self.floating else stage
        steps, units, checkpoint = 0, 0.0, None
        saved = self.store.checkpoint(rec.id)
        if saved is not None:  # resume from the durable checkpoint
            checkpoint, steps, units = saved
        cuda = self.opts.device == "cuda"
        limits = Limits(
            memory_mb=rec.memory_limit_mb or self.opts.default_memory_mb,
            low_priority=self.mode != "naive",
            # a GPU task is not pinned to its stage's core: the training thread spins there in CUDA
            # syncs, and an idle-priority host on it learned its kernels were done ~200 ms late (H200)
            cores=stage_cores(stage) if self.opts.pin and not cuda else None,
            cuda=cuda,
            cuda_device=(stage % max(1, self.gpus)) if cuda else None,
            mps_thread_percentage=self.opts.mps_thread_percentage if self.mps else None,
        )
        live = start_host(rec, kind, stage, home, self.run_dir / "tasks", limits, self.profiles.get(rec.name, {}),
                          checkpoint, steps, units, self.q)
        self.store.transition(rec.id, TaskState.CREATED)
        self.store.progress(rec.id, steps, units, 0.0, 0, stage)
        self.live[rec.id] = live
        return live

    def _set_state(self, live: Live, state: TaskState, reason: str | None = None) -> None:
        cur = self.store.get(live.rec.id).state
        if cur != state and not cur.terminal:
            self.store.transition(live.rec.id, state, reason)

    def _progress(self, live: Live) -> None:
        self.store.progress(live.rec.id, live.steps, live.units, live.busy_s, live.overruns, live.stage)

    def _forget(self, live: Live) -> None:
        self.live.pop(live.rec.id, None)
        if self.running_on.get(live.stage) is live:
            del self.running_on[live.stage]
        live.running = False

    def _fail(self, live: Live, reason: str) -> None:
        live.kill()
        self._forget(live)
        self.failures.append({"task": live.rec.id, "name": live.rec.name, "stage": live.stage, "reason": reason})
        self._set_state(live, TaskState.FAILED, reason)
        self._progress(live)

    # ------------------------------------------------------------------ scheduling
    def _fill(self, stage: int) -> str | None:
        """Inside a bubble and no task running there: start the best one whose next step fits what
        is left of it, with the fit factor widened by its type's spread (fitting.BubbleMargins).
        Returns why none started (None: one did, or one runs already); each decision is kept
        (fitting.Decisions)."""
        ev = self.bubble.get(stage)
        if ev is None or stage in self.running_on:
            return None
        now = time.monotonic()
        factor = self._factor() / self.margins.shrink(ev.type)
        why, chosen = self._choose(ev, now, factor)
        if chosen is not None:
            self.type_of[chosen.rec.id] = ev.type
            self._start(chosen, stage, ev.predicted_end, factor)
        self.decisions.add(ev, now, factor, self.live.values(), chosen, why)
        return why

    def _choose(self, ev: BubbleEvent, now: float, factor: float) -> tuple[str | None, Live | None]:
        """The task to start in bubble ``ev`` seen at ``now``, or why none may start."""
        if not self.harvesting:
            return "harvesting was off (the training's own off block of a paired measurement)", None
        if ev.predicted_end is None or ev.predicted_end <= now:
            return "the bubble had ended (its predicted end) when it was seen", None
        why = self._guard_why(ev)
        if why:
            return why, None
        cands = candidates(self.live.values(), ev.stage, ev, now, factor)
        if self.guard is not None and self.guard.setting.skip_overrunning:
            cands = [c for c in cands if not _overran(c.steps, c.overruns)]
        if not cands:
            return why_none(self.live.values(), ev.stage, ev, now, factor), None
        return None, cands[0]

    # ------------------------------------------------------------------ the budget guard
    def _factor(self) -> float:
        return max(self.factor, self.guard.setting.factor) if self.guard is not None else self.factor

    def _may_harvest(self, iteration: int) -> bool:
        if self.guard is None:
            return self.harvesting
        return self.harvesting and self.guard.setting.harvest and not self.guard.measuring_off(iteration)

    def _guard_why(self, ev: BubbleEvent) -> str | None:
        """Why the guard's current rung keeps steps out of bubble ``ev`` (None: it lets one
        start): an iteration kept for measuring, the top rung, a bubble too short, no room for one
        more running task, a bubble type whose steps overran."""
        if self.guard is None:
            return None
        s = self.guard.setting
        if not s.harvest:
            return f"the budget guard's top rung (harvesting paused: {self.guard.verdict()['text']})"
        if self.guard.measuring_off(ev.iteration):
            return "the budget guard's own off block (training alone, to measure the overhead)"
        if ev.predicted_end - ev.start < s.min_bubble_s:
            return f"shorter than the budget guard's shortest bubble on rung {self.guard.level} ({s.min_bubble_s * 1e3:g} ms)"
        if s.max_running is not None and len(self.running_on) >= s.max_running:
            return f"the budget guard's rung {self.guard.level} runs {s.max_running} side task at a time"
        if s.skip_overrunning and _overran(*self.type_steps.get(ev.type, (0, 0))):
            return f"steps in {ev.type} bubbles overran, and the budget guard's rung {self.guard.level} skips them"
        return None

    def _on_iteration(self, ev: BubbleEvent) -> None:
        """Stage 0 began iteration ``ev.iteration``: the last one's time goes to the guard, and
        an iteration kept for measuring starts with every side task paused."""
        if self.guard is None or ev.stage != 0:
            return
        if self.iter_start is not None and ev.iteration > self.iter_start[0]:
            self.guard.observe(self.iter_start[0], ev.start - self.iter_start[1], self.iter_on)
        self.iter_start = (ev.iteration, ev.start)
        self.iter_on = self._may_harvest(ev.iteration)
        if not self.iter_on:
            for t in list(self.live.values()):
                self._pause(t)

    def _start(self, live: Live, stage: int, until: float, factor: float | None = None) -> None:
        if live.home is None and live.stage != stage:
            live.move(stage, self.opts.pin and self.opts.device == "cpu")
        live.running = True
        live.bubble_end = until
        self.running_on[live.stage] = live
        self._set_state(live, TaskState.RUNNING)
        if live.kind == "iterative":
            live.send({"cmd": "run", "until": until, "need_s": live.need_s(factor or self._factor()), "pauses": live.pauses_sent})
        else:
            live.send_signal(signal.SIGCONT)

    def _pause(self, live: Live) -> None:
        if not live.running:
            return
        if live.kind == "iterative":
            if live.yield_asked is None:
                live.yield_asked = time.monotonic()
                live.yield_cpu_s = live.cpu_state()[1]
                live.send_signal(signal.SIGUSR1)
        else:
            live.send_signal(signal.SIGSTOP)
            live.running = False
            if self.running_on.get(live.stage) is live:
                del self.running_on[live.stage]
            self._set_state(live, TaskState.PAUSED)

    def _on_host(self, live: Live, ev: dict) -> None:
        kind = ev["ev"]
        if kind == "ready":
            if live.kind == "imperative" and self.mode == "freeride":
                live.send_signal(signal.SIGSTOP)  # it waits for its first bubble
            live.ready = True
            live.finished = bool(ev["finished"])
            self._set_state(live, TaskState.PAUSED)
            if live.finished:  # resumed from a checkpoint taken after its last step
                self._finish(live)
            elif (live.kind == "iterative" and live.profiled_step_s is None and self.opts.device == "cpu"
                  and self.mode == "freeride"):
                # no profile: learn the step time from a few steps at idle priority (on CPU the
                # host only gets a core the stage leaves idle) instead of guessing
                live.probing = True
                live.send({"cmd": "run", "until": time.monotonic() + 3600, "need_s": 0.0, "max_steps": PROBE_STEPS,
                           "pauses": live.pauses_sent})
        elif kind == "step":
            live.steps += 1
            live.units += float(ev["units"])
            live.busy_s += ev["t1"] - ev["t0"]
            live.step_times.append(ev["t1"] - ev["t0"])
            over = 0.0
            if self.mode == "freeride" and live.bubble_end is not None and ev["t1"] > live.bubble_end:
                over = ev["t1"] - live.bubble_end
                live.overruns += 1
                live.overrun_s += over
            if self.mode == "freeride" and live.rec.id in self.type_of:
                counts = self.type_steps.setdefault(self.type_of[live.rec.id], [0, 0])
                counts[0] += 1
                counts[1] += over > 0
            rec = {"stage": live.stage, "task": live.rec.id, "name": live.rec.name, "t0": ev["t0"], "t1": ev["t1"],
                   "units": ev["units"], "overrun_s": over, "type": self.type_of.get(live.rec.id), "gpu_s": ev.get("gpu_s"),
                   # the device's view: its kernels began at t0 (the GPU idles in a bubble) and ran gpu_s
                   "gpu_overrun_s": (max(0.0, ev["t0"] + ev["gpu_s"] - live.bubble_end) if self.mode == "freeride" and
                                     ev.get("gpu_s") is not None and live.bubble_end is not None else None)}
            self.steps_file.write(json.dumps(rec) + "\n")
        elif kind == "yield":
            live.running = False
            live.probing = False
            live.yield_asked = None
            if self.running_on.get(live.stage) is live:
                del self.running_on[live.stage]
            live.finished = bool(ev["finished"])
            self._progress(live)
            if live.finished:
                self._finish(live)
            else:
                self._set_state(live, TaskState.PAUSED)
                self._fill(live.stage)  # what is left of the bubble may fit a shorter step
        elif kind == "saved":
            live.saving = False
            live.last_ckpt = time.monotonic()
            self._store_checkpoint(live)
            for stage in list(self.bubble):  # a bubble that came while it saved may still hold a step
                self._fill(stage)

    def _store_checkpoint(self, live: Live) -> None:
        """Copy the task's checkpoint file into the durable store."""
        if live.ckpt.exists():
            self.store.save_checkpoint(live.rec.id, live.ckpt.read_bytes(), live.steps, live.units)

    def _stop_host(self, live: Live) -> None:
        """Ask an iterative host to save and exit (killed if it will not), then keep its state."""
        live.stop()
        self._store_checkpoint(live)

    def _finish(self, live: Live) -> None:
        self._stop_host(live)
        self._forget(live)
        self._set_state(live, TaskState.FINISHED)
        self._progress(live)

    def _on_exit(self, live: Live) -> None:
        code = live.proc.wait()
        if live.kind == "imperative" and code == 0:
            self._read_imperative_progress(live)
            self._forget(live)
            self._set_state(live, TaskState.FINISHED)
            self._progress(live)
        elif live.rec.id in self.live and not self.stop.is_set():
            self._fail(live, live.exit_reason(self.opts.default_memory_mb))

    def _read_imperative_progress(self, live: Live) -> None:
        if live.ckpt.exists():
            try:
                data = json.loads(live.ckpt.read_text())
                live.units = float(data.get("units", live.units))  # an imperative task may report "units"
            except (ValueError, UnicodeDecodeError):
                pass
            self._store_checkpoint(live)

    def _on_bubble_event(self, ev: BubbleEvent) -> None:
        if ev.kind == "iter":
            self._on_iteration(ev)
            return
        if ev.kind in ("on", "off"):
            self.harvesting = ev.kind == "on"
            if self.guard is not None:
                self.guard.external = True
            if not self.harvesting:
                for t in list(self.live.values()):
                    self._pause(t)
            self.decisions.switched(ev.kind, time.monotonic())  # after every pause was signalled
            return
        if not 0 <= ev.stage < self.stages or self.mode != "freeride":
            return
        if ev.kind == "bubble":
            self.bubble[ev.stage] = ev
            self.bubbles_announced += 1
            why = self._fill(ev.stage)
            if why:  # counted by the rule (the text before its figures), the last figures kept as its example
                rule = why.split(":")[0]
                self.unused[rule] += 1
                self.unused_example[rule] = why
        else:  # the stage computes again: give its core back
            b = self.bubble.pop(ev.stage, None)
            if b is not None:
                self.margins.observe(b.type, b.start, b.predicted_end, ev.start)
            t = self.running_on.get(ev.stage)
            if t is not None:
                self._pause(t)

    def _housekeeping(self, now: float) -> None:
        for t in list(self.live.values()):
            if self.mode == "freeride" and t.running and t.kind == "imperative" and t.bubble_end and now >= t.bubble_end:
                self._pause(t)
            grace = max(self.opts.pause_grace_s, 20 * t.need_s(self._factor()))
            # ignoring a pause: past the grace, unless starved (a host at idle priority on a core
            # training keeps busy may not run at all for a while), and never past STARVED_MAX_S
            late = t.yield_asked is not None and now - t.yield_asked > grace
            if late and (now - t.yield_asked > STARVED_MAX_S or not t.starved(grace)):
                self._fail(t, f"ignored a pause for {now - t.yield_asked:.2f} s")
                continue
            due = t.kind == "iterative" and now - t.last_ckpt > CHECKPOINT_EVERY_S
            if not t.running and t.ready and not t.saving and not t.finished and not t.probing:
                if due:  # checkpoint while paused (the host runs at idle priority)
                    t.saving = True
                    t.send({"cmd": "checkpoint"})
                elif self.mode != "freeride" and self.harvesting and t.stage not in self.running_on:
                    self._start(t, t.stage, float("inf"))
            elif t.running and due and self.mode != "freeride":
                self._pause(t)  # continuous modes: yield now and then so the task can checkpoint

    def _poll_store(self) -> None:
        """New submissions and cancellations, seen while running (the store is shared); on the
        cluster queue, leases taken, lost and cancelled (:func:`flowride.harvest.leasing.poll_queue`)."""
        if self.store.is_queue:
            poll_queue(self)
            return
        for rec in self.store.list():  # the run's tasks only: other runs' stay as they are (harvest/rerun.py)
            if rec.state is TaskState.SUBMITTED and rec.id not in self.live and not rec.cancel_requested \
                    and takes(self.store, rec, self.opts):
                try:
                    self._spawn(rec)
                except Exception as e:  # a task that cannot even start fails alone
                    self.store.transition(rec.id, TaskState.FAILED, f"could not start: {e}")
            elif rec.cancel_requested and rec.id in self.live:
                live = self.live[rec.id]
                live.kill()
                self._forget(live)
                self._set_state(live, TaskState.STOPPED, "cancelled by the user")

    # ------------------------------------------------------------------ loops
    def _schedule_loop(self) -> None:
        last_poll = 0.0
        while not self.stop.is_set():
            wait = 0.05
            for t in self.live.values():  # wake for an imperative task's bubble end
                if t.running and t.kind == "imperative" and t.bubble_end:
                    wait = max(0.0, min(wait, t.bubble_end - time.monotonic()))
            try:
                item = self.q.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is not None:
                src, tid, payload = item
                live = self.live.get(tid) if tid is not None else None
                if src == "bubble":
                    self._on_bubble_event(payload)
                elif src == "host" and live is not None:
                    self._on_host(live, payload)
                elif src == "exit" and live is not None:
                    self._on_exit(live)
            now = time.monotonic()
            self._housekeeping(now)
            if now - last_poll >= STORE_POLL_S:
                last_poll = now
                self._poll_store()

    def _event_loop(self) -> None:
        while not self.stop.is_set():
            ev = self.sub.receive(timeout=0.05)
            if ev is not None:
                self.events_seen += 1
                self.q.put(("bubble", None, ev))

    def serve(self) -> None:
        self.store.recover(self.opts.run_tasks, self.opts.run_since)
        write_pid(self.run_dir)
        listener = threading.Thread(target=self._event_loop, daemon=True)
        listener.start()
        self._poll_store()
        # atomically: the launcher reads the port as soon as the file exists
        write_json_atomic(ready_file(self.run_dir), self.port)
        try:
            self._schedule_loop()
        finally:
            self.stop.set()
            listener.join(timeout=2)
            self.shutdown()

    def shutdown(self) -> None:
        """Save every live task's state and leave it resumable (PAUSED), then write the record."""
        for live in list(self.live.values()):
            if live.kind == "iterative" and live.proc.poll() is None:
                if live.running:  # finish the step in progress, then read the stop command
                    live.send_signal(signal.SIGUSR1)
                self._stop_host(live)
            elif live.proc.poll() is None:
                live.terminate()
                self._read_imperative_progress(live)
            self._progress(live)
            state = self.store.get(live.rec.id).state
            if state in (TaskState.RUNNING, TaskState.CREATED):
                self._set_state(live, TaskState.PAUSED)
        self.steps_file.close()
        tasks, left = split_tasks(self.store.list(), self.opts)  # this run's; other runs' unfinished ones
        record = {
            "mode": self.mode,
            "device": self.opts.device,
            "mps": self.mps,
            "events_seen": self.events_seen,
            "steps": read_steps(self.run_dir),
            # from the store, so failures seen by an earlier (crashed) manager are kept
            "failures": [{"task": t.id, "name": t.name, "stage": t.stage, "reason": t.reason}
                         for t in tasks if t.state is TaskState.FAILED],
            "tasks": [t.to_dict() for t in tasks],
            "tasks_left": [t.to_dict() for t in left],
            "guard": self.guard.report() if self.guard is not None else None,
            # every announced bubble, and why those that got no side step got none
            "bubbles": {"announced": self.bubbles_announced, "unused_by_reason": dict(self.unused.most_common()),
                        "unused_examples": self.unused_example,
                        "prediction_by_type": self.margins.report(), "decisions": list(self.decisions.log)},
        }
        write_json_atomic(self.run_dir / "harvest.json", record)
        remove_pid(self.run_dir)
        self.sub.close()
        self.store.close()


OVERRAN_SHARE = 0.1  # a task or bubble type whose steps overran this often is skipped on the guard's upper rungs


def _overran(steps: int, overruns: int) -> bool:
    return steps >= 5 and overruns > OVERRAN_SHARE * steps


def read_steps(run_dir: str | Path, offset: int = 0) -> list[dict]:
    """Every side-task step recorded in a run directory, by this and any earlier manager (from
    byte ``offset`` of ``steps.jsonl`` on: a run's own steps begin where the file ended when it began)."""
    f = Path(run_dir) / "steps.jsonl"
    out = []
    if f.exists():
        with open(f, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill -9
                continue
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flowride.harvest.manager")
    ap.add_argument("--run-dir", required=True, help="holds manager.json (its options) and task-profiles.json")
    a = ap.parse_args(argv)
    m = Manager(a.run_dir, read_options(a.run_dir), read_profiles(a.run_dir))
    signal.signal(signal.SIGTERM, lambda *_: m.stop.set())
    signal.signal(signal.SIGINT, lambda *_: m.stop.set())
    m.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
