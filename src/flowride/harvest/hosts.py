"""Side-task host processes: the plumbing under the manager.

Each side task runs in its own process (:mod:`flowride.harvest.runner`) under its limits
(:mod:`flowride.harvest.limits`). This module starts that process, reads its messages onto the
manager's queue from a thread, and sends it commands (JSON lines on stdin) and signals; it also
moves a floating task between stages' cores. :class:`Live` is a task with a process: the process
and its files, and the counters the manager keeps for it.

Kept apart from :mod:`flowride.harvest.manager` (what to run when) so that the scheduling policy
holds no process handling, and this holds no decision: the manager says what, this does it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from flowride.harvest.fitting import need_s
from flowride.harvest.limits import Limits, stage_cores
from flowride.harvest.store import TaskRecord


@dataclass
class Live:
    """A side task with a process."""

    rec: TaskRecord
    kind: str  # iterative | imperative
    home: int | None  # the stage it is bound to (None: it floats between stages)
    stage: int  # the stage whose core it is on now
    proc: subprocess.Popen
    ckpt: Path
    log: Path
    profiled_step_s: float | None
    peak_bytes: int
    steps: int = 0
    units: float = 0.0
    busy_s: float = 0.0
    overruns: int = 0
    pauses_sent: int = 0  # SIGUSR1 sent to an iterative host; each run command carries the count
    overrun_s: float = 0.0
    running: bool = False
    ready: bool = False
    finished: bool = False
    yield_asked: float | None = None
    yield_cpu_s: float = 0.0  # the host's CPU time when the pause was asked (starved, not deaf: see cpu_s)
    bubble_end: float | None = None
    last_ckpt: float = field(default_factory=time.monotonic)
    saving: bool = False
    probing: bool = False
    step_times: deque = field(default_factory=lambda: deque(maxlen=20))

    def need_s(self, factor: float) -> float:
        """Time a bubble must still have for one more step (:func:`flowride.harvest.fitting.need_s`)."""
        return need_s(self.step_times, self.profiled_step_s, factor)

    def cpu_state(self) -> tuple[str, float]:
        """The host's scheduler state (R runnable, S sleeping, ...) and the CPU seconds it has
        used, from /proc ("?", 0 once it is gone). A host at idle priority on a core training
        keeps busy is runnable yet gets no CPU for a while after a pause request: starvation,
        not a task ignoring the pause, and told apart by these two."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # every thread's
        except (OSError, IndexError, ValueError):
            return "?", 0.0
        # runnable if any thread is: a task whose main thread waits on its own starved worker
        # thread (the cnn's batch maker) sleeps, yet is starved all the same
        state = fields[0]
        if state != "R":
            try:
                for t in Path(f"/proc/{self.proc.pid}/task").iterdir():
                    if (t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R":
                        return "R", cpu
            except (OSError, IndexError):
                pass
        return state, cpu

    def starved(self, grace: float) -> bool:
        """Runnable but given less than half ``grace`` of CPU since the pause was asked."""
        state, cpu = self.cpu_state()
        return state == "R" and cpu - self.yield_cpu_s < grace / 2

    def send(self, cmd: dict) -> None:
        """One command to the host (a JSON line on its stdin); a host already gone is ignored."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def send_signal(self, sig: int) -> None:
        if sig == signal.SIGUSR1:
            self.pauses_sent += 1
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """Kill the host if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """Ask an iterative host to save and exit; killed if it has not within 30 s."""
        self.send({"cmd": "stop"})
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def terminate(self) -> None:
        """SIGCONT, then SIGTERM (an imperative task saves and exits); killed after 30 s."""
        self.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def move(self, stage: int, pin: bool) -> None:
        """A floating task goes to ``stage``'s core (every thread of its process)."""
        self.stage = stage
        if not pin:
            return
        cores = set(stage_cores(stage))
        try:
            tids = os.listdir(f"/proc/{self.proc.pid}/task")
        except OSError:
            tids = [str(self.proc.pid)]
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cores)
            except OSError:
                pass

    def exit_reason(self, default_memory_mb: int) -> str:
        """Why the host died, from the last lines of its log."""
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()] if self.log.exists() else []
        if any("MemoryError" in ln or "out of memory" in ln.lower() for ln in lines[-5:]):
            return f"out of memory (limit {self.rec.memory_limit_mb or default_memory_mb} MB)"
        last = lines[-1].strip() if lines else "no output"
        return f"crashed (exit code {self.proc.returncode}): {last[-300:]}"


def start_host(rec: TaskRecord, kind: str, stage: int, home: int | None, tasks_dir: Path, limits: Limits,
               profile: dict, checkpoint: bytes | None, steps: int, units: float, events: queue.Queue) -> Live:
    """Start ``rec``'s host process under ``limits`` (resuming from ``checkpoint`` when given)
    and a thread that puts its messages on ``events``: ``("host", id, message)`` per line, then
    ``("exit", id, None)``."""
    ckpt = tasks_dir / f"task{rec.id}.ckpt"
    log = tasks_dir / f"task{rec.id}.log"
    if checkpoint is not None:  # resume from the durable checkpoint
        ckpt.write_bytes(checkpoint)
    env = dict(os.environ)
    env.update(limits.child_env())
    src_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src_root + os.pathsep + env.get("PYTHONPATH", "")
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowride.harvest.runner", kind, rec.name, json.dumps(rec.params), str(ckpt)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
            preexec_fn=limits.apply_in_child,
        )
    live = Live(rec, kind, home, stage, proc, ckpt, log, profile.get("median_step_s"),
                int(profile.get("peak_memory_bytes", 0)), steps=steps, units=units)
    threading.Thread(target=_read_host, args=(live, events), daemon=True).start()
    return live


def _read_host(live: Live, events: queue.Queue) -> None:
    assert live.proc.stdout is not None
    for line in live.proc.stdout:
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        events.put(("host", live.rec.id, ev))
    events.put(("exit", live.rec.id, None))


def cuda_devices() -> int:
    """GPUs on this host, for the manager (torch counts them through NVML where it can, so the
    manager holds no CUDA context)."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # no usable CUDA: the task processes will say so themselves
        return 0
