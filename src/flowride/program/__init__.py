"""Per-GPU programs: the floor between schedules (links, epochs) and runtimes (GPUs, steps).

Lowering (``lower``), the one buffer layout, hazard pass and symbolic check (``model``), MSCCL
XML (``msccl_*``), MSCCL++ execution plans (``mscclpp_*``), program -> schedule (``to_schedule``) and JSON-or-XML files (``load``) live
here, so :mod:`flowride.comm` and the CLI execute and convert programs without re-deriving them.
"""

from flowride.program.load import is_msccl_path, is_mscclpp_path, load_as_program, load_as_schedule
from flowride.program.lower import Transfer, lower, transfers
from flowride.program.model import (
    Content,
    GpuProgram,
    Program,
    Slot,
    Step,
    buffer_layout,
    check_program,
    expected_outputs,
    hazards,
    initial_buffers,
    inplace_alias,
    reads,
    run_program,
    slot_hazards,
    step_deps,
    validate_program,
    writes,
)
from flowride.program.msccl_read import from_msccl_xml, read_msccl
from flowride.program.msccl_rules import check_executor
from flowride.program.msccl_verify import verify_msccl
from flowride.program.msccl_write import to_msccl_xml, write_msccl
from flowride.program.mscclpp_plan import Plan, parse_plan
from flowride.program.mscclpp_read import from_mscclpp_json, read_mscclpp
from flowride.program.mscclpp_rules import check_rules
from flowride.program.mscclpp_verify import MscclppVerdict, verify_mscclpp
from flowride.program.mscclpp_write import to_mscclpp, write_mscclpp
from flowride.program.to_schedule import program_to_schedule

__all__ = [
    "Content", "GpuProgram", "Program", "Slot", "Step", "Transfer", "buffer_layout", "check_executor", "check_program",
    "expected_outputs", "from_msccl_xml", "hazards", "initial_buffers", "inplace_alias", "is_msccl_path",
    "load_as_program", "load_as_schedule", "lower", "program_to_schedule", "read_msccl", "reads",
    "run_program", "slot_hazards", "step_deps", "to_msccl_xml", "transfers", "validate_program",
    "verify_msccl", "write_msccl", "writes",
    "MscclppVerdict", "Plan", "check_rules", "from_mscclpp_json", "is_mscclpp_path", "parse_plan", "read_mscclpp",
    "to_mscclpp", "verify_mscclpp", "write_mscclpp",
]
