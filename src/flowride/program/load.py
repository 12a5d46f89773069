"""A file a user names as "a schedule": flowride schedule JSON, an MSCCL algorithm XML or an
MSCCL++ execution plan (JSON too: told from a schedule by its content).

Both describe a collective; which form a caller needs depends on what it does next. Verifying and
drawing need a schedule (an XML algorithm becomes one on a full mesh,
:func:`~flowride.program.to_schedule.program_to_schedule`); running needs a program (a schedule
is lowered, and verified by the simulator on the way). The suffix tells XML from JSON; a JSON
object with ``protocol`` and ``gpus`` holding ``threadblocks`` is an MSCCL++ plan.
"""

from __future__ import annotations

from pathlib import Path

from flowride.errors import InputError
from flowride.files import read_json
from flowride.program.lower import lower
from flowride.program.model import Program
from flowride.program.msccl_read import read_msccl
from flowride.program.mscclpp_plan import is_plan_object
from flowride.program.mscclpp_read import read_mscclpp
from flowride.program.to_schedule import program_to_schedule
from flowride.schedule.ir import Schedule, load_schedule


def is_msccl_path(path: str | Path) -> bool:
    """Whether ``path`` names an MSCCL algorithm XML (by its suffix)."""
    return Path(path).suffix.lower() == ".xml"


def is_mscclpp_path(path: str | Path) -> bool:
    """Whether ``path`` is an MSCCL++ execution plan JSON (by its content; a file that cannot be
    read or parsed is not one, and its reader will say why)."""
    if Path(path).suffix.lower() == ".xml":
        return False
    try:
        obj = read_json(path, "schedule", "give a schedule JSON, an MSCCL XML or an MSCCL++ plan JSON")
    except (InputError, OSError):
        return False
    return is_plan_object(obj)


def load_as_schedule(path: str | Path) -> Schedule:
    """A flowride schedule JSON, or an MSCCL algorithm XML or MSCCL++ plan turned into one (on a
    full mesh)."""
    if is_msccl_path(path):
        return program_to_schedule(read_msccl(path))
    if is_mscclpp_path(path):
        return program_to_schedule(read_mscclpp(path))
    return load_schedule(path)


def load_as_program(path: str | Path) -> Program:
    """An MSCCL algorithm XML or MSCCL++ plan as it is, or a flowride schedule JSON lowered to a
    program."""
    if is_msccl_path(path):
        return read_msccl(path)
    if is_mscclpp_path(path):
        return read_mscclpp(path)
    return lower(load_schedule(path))
