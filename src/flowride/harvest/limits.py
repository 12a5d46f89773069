"""Per-side-task limits, applied in the child process before it runs any task code.

What each really enforces:
- memory, CPU: RLIMIT_AS caps the process's address space (a Python/PyTorch process reserves
  about 0.7 GB of it just by importing torch, so the cap is on virtual memory, not RSS). An
  allocation past it fails with MemoryError; the task dies and is marked FAILED ("out of
  memory"). CUDA: torch.cuda.set_per_process_memory_fraction in the task process (an allocator
  limit, not a hardware one).
- priority, CPU: nice 19 and SCHED_IDLE: the kernel runs the task only when the core would
  otherwise idle, so a stage that wakes up preempts it at once. CUDA: MPS client priority and
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE take effect only when an MPS daemon runs; without MPS the
  GPU time-slices and no priority is enforced (stated, not faked).
- affinity: sched_setaffinity pins the task to the stage's cores, so it competes with its own
  stage only.
- lifetime: PR_SET_PDEATHSIG makes the kernel kill the task if its manager dies, so a kill -9 of
  the manager leaves no orphan (the store resumes the task from its checkpoint instead).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Limits:
    memory_mb: int | None = None
    low_priority: bool = True
    cores: tuple[int, ...] | None = None
    cuda_memory_fraction: float | None = None
    mps_thread_percentage: int | None = None

    def child_env(self) -> dict[str, str]:
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        if self.cuda_memory_fraction is not None:
            env["FLOWRIDE_CUDA_MEMORY_FRACTION"] = str(self.cuda_memory_fraction)
        if self.mps_thread_percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(self.mps_thread_percentage)
        return env

    def apply_in_child(self) -> None:
        """Runs in the forked child (subprocess preexec_fn), before exec."""
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
        if self.memory_mb is not None:
            cap = int(self.memory_mb) << 20
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        if self.low_priority:
            os.nice(19)
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except (AttributeError, PermissionError, OSError):
                pass
        if self.cores:
            try:
                os.sched_setaffinity(0, set(self.cores))
            except OSError:
                pass


def stage_cores(stage: int) -> tuple[int, ...]:
    """The core a stage (and its side tasks) is pinned to when harvesting on CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[stage % len(cpus)],)
