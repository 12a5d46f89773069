"""Per-side-task limits, applied in the child process before it runs any task code.

What each really enforces:
- memory, CPU: RLIMIT_AS caps the process's address space (a Python/PyTorch process reserves
  about 0.7 GB of it just by importing torch, so the cap is on virtual memory, not RSS). An
  allocation past it fails with MemoryError; the task dies and is marked FAILED ("out of
  memory"). CUDA: the same megabytes become ``torch.cuda.set_per_process_memory_fraction`` in
  the task process (an allocator limit, not a hardware one); RLIMIT_AS is not set there, since
  the CUDA driver reserves far more address space than any sane cap.
- priority, CPU: nice 19 and SCHED_IDLE: the kernel runs the task only when the core would
  otherwise idle, so a stage that wakes up preempts it at once. CUDA: with an MPS daemon
  running, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the share of SMs the task may use; without
  MPS the GPU time-slices between processes and no priority is enforced (stated, not faked).
- affinity: sched_setaffinity pins the task to the stage's cores, so it competes with its own
  stage only.
- device: ``CUDA_VISIBLE_DEVICES`` gives the task its stage's GPU.
- lifetime: PR_SET_PDEATHSIG makes the kernel kill the task if its manager dies, so a kill -9 of
  the manager leaves no orphan (the store resumes the task from its checkpoint instead).

``FLOWRIDE_HARVEST_PRIORITY=normal`` is a test hook: the manager and the side tasks keep the
priority they inherit (:func:`idle_priority`).
"""

from __future__ import annotations

import os
import resource
import signal
from dataclasses import dataclass
from pathlib import Path

from flowride.ranks import set_parent_death_signal

PRIORITY_ENV = "FLOWRIDE_HARVEST_PRIORITY"


def idle_priority() -> bool:
    """Whether harvesting's own processes (the manager, the side tasks) take idle priority: yes,
    unless ``FLOWRIDE_HARVEST_PRIORITY=normal``. The test suite sets it: on a machine whose cores
    other work keeps busy, an idle-priority process gets a few thousandths of a core (a manager's
    imports took 10-27 s instead of 0.8 s), so the tests would wait on the scheduler, not on the
    code; what they check does not depend on the priority, and one test checks the default."""
    return os.environ.get(PRIORITY_ENV, "idle") != "normal"


def take_idle_priority() -> None:
    """nice 19 and SCHED_IDLE for this process (where the system allows), unless
    :func:`idle_priority` says no."""
    if not idle_priority():
        return
    os.nice(19)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, PermissionError, OSError):
        pass


def mps_daemon_running() -> bool:
    """True when an NVIDIA MPS control daemon is reachable (its pipe directory exists)."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return Path(pipe, "control").exists()


@dataclass(frozen=True)
class Limits:
    memory_mb: int | None = None
    low_priority: bool = True
    cores: tuple[int, ...] | None = None
    cuda: bool = False  # the task computes on a GPU
    cuda_device: int | None = None  # the stage's GPU (index among this host's GPUs)
    mps_thread_percentage: int | None = None  # only when an MPS daemon runs

    def child_env(self) -> dict[str, str]:
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        if self.cuda:
            if self.memory_mb is not None:
                env["FLOWRIDE_CUDA_MEMORY_MB"] = str(int(self.memory_mb))
            if self.cuda_device is not None:
                visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
                env["CUDA_VISIBLE_DEVICES"] = visible[self.cuda_device % len(visible)] if visible else str(self.cuda_device)
            if self.mps_thread_percentage is not None:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(self.mps_thread_percentage)
        return env

    def apply_in_child(self) -> None:
        """Runs in the forked child (subprocess preexec_fn), before exec."""
        set_parent_death_signal(signal.SIGKILL)
        if self.memory_mb is not None and not self.cuda:
            cap = int(self.memory_mb) << 20
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        if self.low_priority:
            take_idle_priority()
        if self.cores:
            try:
                os.sched_setaffinity(0, set(self.cores))
            except OSError:
                pass


def apply_cuda_memory_cap() -> float | None:
    """In a side-task process: turn ``FLOWRIDE_CUDA_MEMORY_MB`` into a per-process memory
    fraction of the visible GPU. Returns the fraction applied (None: no CUDA or no cap)."""
    mb = os.environ.get("FLOWRIDE_CUDA_MEMORY_MB")
    if not mb:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    frac = min(1.0, (int(mb) << 20) / total)
    torch.cuda.set_per_process_memory_fraction(frac)
    return frac


def stage_cores(stage: int) -> tuple[int, ...]:
    """The core a stage (and its side tasks) is pinned to when harvesting on CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[stage % len(cpus)],)
