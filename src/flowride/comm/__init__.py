"""Run lowered schedules on real processes with torch.distributed and check them.

:func:`run_schedule` spawns one process per GPU of a schedule's program on this machine (gloo on
CPU, NCCL on CUDA), runs it on closed-form data, and compares every rank's output with the
collective's definition and with torch.distributed's own collective, timing both; :func:`run_sweep` does so at many sizes in one launch, with nccl-tests' columns. The worker
(``python -m flowride.comm.worker``) also runs under ``torchrun`` across machines.
:func:`execute_program` runs one rank's steps inside a process group the caller set up.
"""

from flowride.comm.execute import CommError, ProgramExecutor, execute_program
from flowride.comm.launch import CommFailed, as_program, run_schedule, run_schedules
from flowride.comm.result import RunResult
from flowride.comm.serialize import (
    load_program,
    program_from_dict,
    program_to_dict,
    save_program,
    structural_problems,
)
from flowride.comm.sweep import SizeRow, run_sweep

__all__ = [
    "CommError",
    "CommFailed",
    "ProgramExecutor",
    "RunResult",
    "SizeRow",
    "as_program",
    "execute_program",
    "load_program",
    "program_from_dict",
    "program_to_dict",
    "run_schedule",
    "run_schedules",
    "run_sweep",
    "save_program",
    "structural_problems",
]
