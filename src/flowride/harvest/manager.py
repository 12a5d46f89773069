"""The side-task manager: one worker per pipeline stage, each filling its stage's bubbles.

The manager listens for the trainer's bubble events (UDP on 127.0.0.1, never blocking training),
keeps every task's state in the durable store, and hosts each side task in its own process
(:mod:`flowride.harvest.runner`) under its limits (:mod:`flowride.harvest.limits`).

Modes: ``freeride`` runs a task only inside a bubble. An iterative task steps while its next
step fits the bubble's predicted end and yields at the stage's next instruction; an imperative
task is resumed with SIGCONT and paused with SIGSTOP. ``naive`` runs tasks continuously at normal
priority (co-location), and ``priority`` runs them continuously at idle priority (the MPS-style
baseline).

Failures are contained. A task that crashes, runs out of memory or ignores a pause is killed and
marked FAILED with the reason; the stage's other tasks go on, and training never waits on any of it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from flowride.files import write_json_atomic
from flowride.harvest.limits import Limits, stage_cores
from flowride.harvest.states import TaskState
from flowride.harvest.store import TaskRecord, TaskStore
from flowride.harvest.task import ImperativeSpec, resolve
from flowride.pipeline.events import BubbleEvent, BubbleSubscriber

MODES = ("freeride", "naive", "priority")
DEFAULT_STEP_S = 0.005  # step time assumed before a task is profiled
CHECKPOINT_EVERY_S = 2.0


def fit_time(median_step_s: float, factor: float = 1.2) -> float:
    """The time a bubble must still have for one more step: median step rounded up to the next
    millisecond, times ``factor`` (FreeRide's rule)."""
    return math.ceil(median_step_s * 1000.0 - 1e-9) / 1000.0 * factor


def step_fits(remaining_s: float, median_step_s: float, factor: float = 1.2) -> bool:
    return remaining_s > fit_time(median_step_s, factor)


@dataclass
class Live:
    """A side task with a process."""

    rec: TaskRecord
    kind: str  # iterative | imperative
    stage: int
    proc: subprocess.Popen
    ckpt: Path
    log: Path
    need_s: float
    peak_bytes: int
    steps: int = 0
    units: float = 0.0
    busy_s: float = 0.0
    overruns: int = 0
    overrun_s: float = 0.0
    running: bool = False
    ready: bool = False
    finished: bool = False
    yield_asked: float | None = None
    bubble_end: float | None = None
    last_ckpt: float = field(default_factory=time.monotonic)
    saving: bool = False


class Manager:
    def __init__(self, run_dir: str | Path, stages: int, mode: str = "freeride", port: int = 0,
                 profiles: dict[str, dict] | None = None, pin: bool = True, factor: float = 1.2,
                 pause_grace_s: float = 1.0, default_memory_mb: int = 2048) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.run_dir = Path(run_dir)
        (self.run_dir / "tasks").mkdir(parents=True, exist_ok=True)
        self.store = TaskStore.in_run_dir(self.run_dir)
        self.db_lock = threading.Lock()
        self.stages, self.mode, self.pin, self.factor = stages, mode, pin, factor
        self.pause_grace_s = pause_grace_s
        self.default_memory_mb = default_memory_mb
        self.profiles = profiles or {}
        self.sub = BubbleSubscriber(port)
        self.port = self.sub.port
        self.inbox: list[queue.Queue] = [queue.Queue() for _ in range(stages)]
        self.live: dict[int, Live] = {}
        self.steps: list[dict] = []
        self.failures: list[dict] = []
        self.stop = threading.Event()
        self.next_stage = 0
        self.events_seen = 0
        # the bubble each stage is in now (the last event said "bubble" and no "busy" since)
        self.bubble: list[BubbleEvent | None] = [None] * stages

    # ------------------------------------------------------------------ processes
    def _spawn(self, rec: TaskRecord) -> Live:
        spec = resolve(rec.name)
        kind = "imperative" if isinstance(spec, ImperativeSpec) else "iterative"
        stage = rec.stage if rec.stage is not None and rec.stage < self.stages else self.next_stage
        self.next_stage = (stage + 1) % self.stages
        ckpt = self.run_dir / "tasks" / f"task{rec.id}.ckpt"
        log = self.run_dir / "tasks" / f"task{rec.id}.log"
        steps, units = 0, 0.0
        with self.db_lock:
            saved = self.store.checkpoint(rec.id)
        if saved is not None:  # resume from the durable checkpoint
            data, steps, units = saved
            ckpt.write_bytes(data)
        limits = Limits(
            memory_mb=rec.memory_limit_mb or self.default_memory_mb,
            low_priority=self.mode != "naive",
            cores=stage_cores(stage) if self.pin else None,
        )
        env = dict(os.environ)
        env.update(limits.child_env())
        src_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src_root + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowride.harvest.runner", kind, rec.name, json.dumps(rec.params), str(ckpt)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True, env=env,
            preexec_fn=limits.apply_in_child,
        )
        prof = self.profiles.get(rec.name, {})
        live = Live(rec, kind, stage, proc, ckpt, log, fit_time(prof.get("median_step_s", DEFAULT_STEP_S), self.factor),
                    int(prof.get("peak_memory_bytes", 0)), steps=steps, units=units)
        threading.Thread(target=self._read_host, args=(live,), daemon=True).start()
        with self.db_lock:
            self.store.transition(rec.id, TaskState.CREATED)
            self.store.progress(rec.id, steps, units, 0.0, 0, stage)
        self.live[rec.id] = live
        return live

    def _read_host(self, live: Live) -> None:
        assert live.proc.stdout is not None
        for line in live.proc.stdout:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.inbox[live.stage].put(("host", live.rec.id, ev))
        self.inbox[live.stage].put(("exit", live.rec.id, None))

    def _send(self, live: Live, cmd: dict) -> None:
        try:
            assert live.proc.stdin is not None
            live.proc.stdin.write(json.dumps(cmd) + "\n")
            live.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def _set_state(self, live: Live, state: TaskState, reason: str | None = None) -> None:
        with self.db_lock:
            cur = self.store.get(live.rec.id).state
            if cur != state and not cur.terminal:
                self.store.transition(live.rec.id, state, reason)

    def _progress(self, live: Live) -> None:
        with self.db_lock:
            self.store.progress(live.rec.id, live.steps, live.units, live.busy_s, live.overruns, live.stage)

    def _fail(self, live: Live, reason: str) -> None:
        if live.proc.poll() is None:
            live.proc.kill()
            live.proc.wait()
        live.running = False
        self.failures.append({"task": live.rec.id, "name": live.rec.name, "stage": live.stage, "reason": reason})
        self._set_state(live, TaskState.FAILED, reason)
        self._progress(live)
        self.live.pop(live.rec.id, None)

    def _exit_reason(self, live: Live) -> str:
        lines = [ln for ln in live.log.read_text(errors="replace").splitlines() if ln.strip()] if live.log.exists() else []
        if any("MemoryError" in ln for ln in lines[-5:]):
            return f"out of memory (limit {live.rec.memory_limit_mb or self.default_memory_mb} MB)"
        last = lines[-1].strip() if lines else "no output"
        return f"crashed (exit code {live.proc.returncode}): {last[-300:]}"

    # ------------------------------------------------------------------ scheduling
    def _candidates(self, stage: int, ev: BubbleEvent | None) -> list[Live]:
        out = []
        now = time.monotonic()
        for live in self.live.values():
            if live.stage != stage or not live.ready or live.finished or live.running or live.saving:
                continue
            if ev is not None:
                if ev.predicted_end is None or ev.predicted_end - now <= live.need_s:
                    continue
                if live.peak_bytes and live.peak_bytes > ev.free_memory:
                    continue
            out.append(live)
        return sorted(out, key=lambda t: (-t.rec.priority, t.rec.id))

    def _fill(self, stage: int, ev: BubbleEvent) -> None:
        """Inside a bubble and no task running: start the best one that fits what is left of it."""
        if ev.predicted_end is None or ev.predicted_end <= time.monotonic():
            return
        if any(t.running for t in self.live.values() if t.stage == stage):
            return
        cands = self._candidates(stage, ev)
        if cands:
            self._start(cands[0], ev.predicted_end)

    def _start(self, live: Live, until: float) -> None:
        live.running = True
        live.bubble_end = until
        self._set_state(live, TaskState.RUNNING)
        if live.kind == "iterative":
            self._send(live, {"cmd": "run", "until": until, "need_s": live.need_s})
        else:
            os.kill(live.proc.pid, signal.SIGCONT)

    def _pause(self, live: Live) -> None:
        if not live.running:
            return
        if live.kind == "iterative":
            if live.yield_asked is None:
                live.yield_asked = time.monotonic()
                try:
                    os.kill(live.proc.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        else:
            try:
                os.kill(live.proc.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
            live.running = False
            self._set_state(live, TaskState.PAUSED)

    def _on_host(self, live: Live, ev: dict) -> None:
        kind = ev["ev"]
        if kind == "ready":
            if live.kind == "imperative" and self.mode == "freeride":
                os.kill(live.proc.pid, signal.SIGSTOP)  # it waits for its first bubble
            live.ready = True
            live.finished = bool(ev["finished"])
            self._set_state(live, TaskState.PAUSED)
            if live.finished:  # resumed from a checkpoint taken after its last step
                self._finish(live)
        elif kind == "step":
            live.steps += 1
            live.units += float(ev["units"])
            live.busy_s += ev["t1"] - ev["t0"]
            over = 0.0
            if self.mode == "freeride" and live.bubble_end is not None and ev["t1"] > live.bubble_end:
                over = ev["t1"] - live.bubble_end
                live.overruns += 1
                live.overrun_s += over
            self.steps.append({"stage": live.stage, "task": live.rec.id, "name": live.rec.name, "t0": ev["t0"],
                               "t1": ev["t1"], "units": ev["units"], "overrun_s": over})
        elif kind == "yield":
            live.running = False
            live.yield_asked = None
            live.finished = bool(ev["finished"])
            self._progress(live)
            if live.finished:
                self._finish(live)
            else:
                self._set_state(live, TaskState.PAUSED)
        elif kind == "saved":
            live.saving = False
            live.last_ckpt = time.monotonic()
            self._store_checkpoint(live)

    def _store_checkpoint(self, live: Live) -> None:
        """Copy the task's checkpoint file into the durable store."""
        if live.ckpt.exists():
            with self.db_lock:
                self.store.save_checkpoint(live.rec.id, live.ckpt.read_bytes(), live.steps, live.units)

    def _stop_host(self, live: Live) -> None:
        """Ask an iterative host to save and exit (killed if it will not), then keep its state."""
        self._send(live, {"cmd": "stop"})
        try:
            live.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            live.proc.kill()
        self._store_checkpoint(live)

    def _finish(self, live: Live) -> None:
        self._stop_host(live)
        self._set_state(live, TaskState.FINISHED)
        self._progress(live)
        self.live.pop(live.rec.id, None)

    def _on_exit(self, live: Live) -> None:
        code = live.proc.wait()
        if live.kind == "imperative" and code == 0:
            self._read_imperative_progress(live)
            self._set_state(live, TaskState.FINISHED)
            self._progress(live)
            self.live.pop(live.rec.id, None)
        elif live.rec.id in self.live and not self.stop.is_set():
            self._fail(live, self._exit_reason(live))

    def _read_imperative_progress(self, live: Live) -> None:
        if live.ckpt.exists():
            try:
                data = json.loads(live.ckpt.read_text())
                live.units = float(data.get("units", live.units))  # an imperative task may report "units"
            except (ValueError, UnicodeDecodeError):
                pass
            self._store_checkpoint(live)

    # ------------------------------------------------------------------ loops
    def _stage_loop(self, stage: int) -> None:
        q = self.inbox[stage]
        while not self.stop.is_set():
            wait = 0.05
            for t in self.live.values():  # wake for an imperative task's bubble end
                if t.stage == stage and t.running and t.kind == "imperative" and t.bubble_end:
                    wait = max(0.0, min(wait, t.bubble_end - time.monotonic()))
            try:
                item = q.get(timeout=wait)
            except queue.Empty:
                item = None
            now = time.monotonic()
            if item is not None:
                src, tid, payload = item
                live = self.live.get(tid) if tid is not None else None
                if src == "host" and live is not None:
                    self._on_host(live, payload)
                elif src == "exit" and live is not None:
                    self._on_exit(live)
                elif src == "bubble" and self.mode == "freeride":
                    ev: BubbleEvent = payload
                    if ev.kind == "bubble":
                        self.bubble[stage] = ev
                    else:  # the stage computes again: give its core back
                        self.bubble[stage] = None
                        for t in list(self.live.values()):
                            if t.stage == stage and t.running:
                                self._pause(t)
                if self.mode == "freeride" and self.bubble[stage] is not None:
                    self._fill(stage, self.bubble[stage])
            for t in list(self.live.values()):
                if t.stage != stage:
                    continue
                if self.mode == "freeride" and t.running and t.kind == "imperative" and t.bubble_end and now >= t.bubble_end:
                    self._pause(t)
                if t.yield_asked is not None and now - t.yield_asked > max(self.pause_grace_s, 20 * t.need_s):
                    self._fail(t, f"ignored a pause for {now - t.yield_asked:.2f} s")
                    continue
                due = t.kind == "iterative" and now - t.last_ckpt > CHECKPOINT_EVERY_S
                if not t.running and t.ready and not t.saving and not t.finished:
                    if due:  # checkpoint while paused (the host runs at idle priority)
                        t.saving = True
                        self._send(t, {"cmd": "checkpoint"})
                    elif self.mode != "freeride" and not any(o.running for o in self.live.values() if o.stage == stage):
                        self._start(t, float("inf"))
                elif t.running and due and self.mode != "freeride":
                    self._pause(t)  # continuous modes: yield now and then so the task can checkpoint

    def _event_loop(self) -> None:
        while not self.stop.is_set():
            ev = self.sub.receive(timeout=0.05)
            if ev is not None and 0 <= ev.stage < self.stages:
                self.events_seen += 1
                self.inbox[ev.stage].put(("bubble", None, ev))

    def _poll_store(self) -> None:
        """New submissions and cancellations, seen while running (the store is shared)."""
        with self.db_lock:
            recs = self.store.list()
        for rec in recs:
            if rec.state is TaskState.SUBMITTED and rec.id not in self.live and not rec.cancel_requested:
                try:
                    self._spawn(rec)
                except Exception as e:  # a task that cannot even start fails alone
                    with self.db_lock:
                        self.store.transition(rec.id, TaskState.FAILED, f"could not start: {e}")
            elif rec.cancel_requested and rec.id in self.live:
                live = self.live.pop(rec.id)
                live.proc.kill()
                live.proc.wait()
                self._set_state(live, TaskState.STOPPED, "cancelled by the user")

    def serve(self) -> None:
        with self.db_lock:
            self.store.recover()
        threads = [threading.Thread(target=self._event_loop, daemon=True)]
        threads += [threading.Thread(target=self._stage_loop, args=(s,), daemon=True) for s in range(self.stages)]
        for t in threads:
            t.start()
        # atomically: the launcher reads the port as soon as the file exists
        write_json_atomic(self.run_dir / "manager.ready", self.port)
        try:
            while not self.stop.is_set():
                self._poll_store()
                self.stop.wait(0.2)
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=2)
            self.shutdown()

    def shutdown(self) -> None:
        """Save every live task's state and leave it resumable (PAUSED), then write the record."""
        for live in list(self.live.values()):
            if live.kind == "iterative" and live.proc.poll() is None:
                if live.running:  # finish the step in progress, then read the stop command
                    try:
                        os.kill(live.proc.pid, signal.SIGUSR1)
                    except ProcessLookupError:
                        pass
                self._stop_host(live)
            elif live.proc.poll() is None:
                os.kill(live.proc.pid, signal.SIGCONT)
                live.proc.terminate()
                try:
                    live.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    live.proc.kill()
                self._read_imperative_progress(live)
            self._progress(live)
            with self.db_lock:
                state = self.store.get(live.rec.id).state
            if state in (TaskState.RUNNING, TaskState.CREATED):
                self._set_state(live, TaskState.PAUSED)
        record = {
            "mode": self.mode,
            "events_seen": self.events_seen,
            "steps": self.steps,
            "failures": self.failures,
            "tasks": [t.to_dict() for t in self.store.list()],
        }
        write_json_atomic(self.run_dir / "harvest.json", record)
        self.sub.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flowride.harvest.manager")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--stages", type=int, required=True)
    ap.add_argument("--mode", default="freeride", choices=MODES)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--profiles", help="JSON file: task name -> profile (median_step_s, peak_memory_bytes, throughput)")
    ap.add_argument("--no-pin", action="store_true")
    a = ap.parse_args(argv)
    profiles = json.loads(Path(a.profiles).read_text()) if a.profiles else {}
    m = Manager(a.run_dir, a.stages, a.mode, a.port, profiles, pin=not a.no_pin)
    signal.signal(signal.SIGTERM, lambda *_: m.stop.set())
    signal.signal(signal.SIGINT, lambda *_: m.stop.set())
    m.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
