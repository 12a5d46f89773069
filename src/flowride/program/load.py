"""A file a user names as "a schedule": flowride schedule JSON or an MSCCL algorithm XML.

Both describe a collective; which form a caller needs depends on what it does next. Verifying and
drawing need a schedule (an XML algorithm becomes one on a full mesh,
:func:`~flowride.program.to_schedule.program_to_schedule`); running needs a program (a schedule
is lowered, and verified by the simulator on the way). The file's suffix decides how it is read.
"""

from __future__ import annotations

from pathlib import Path

from flowride.program.lower import lower
from flowride.program.model import Program
from flowride.program.msccl_read import read_msccl
from flowride.program.to_schedule import program_to_schedule
from flowride.schedule.ir import Schedule, load_schedule


def is_msccl_path(path: str | Path) -> bool:
    """Whether ``path`` names an MSCCL algorithm XML (by its suffix)."""
    return Path(path).suffix.lower() == ".xml"


def load_as_schedule(path: str | Path) -> Schedule:
    """A flowride schedule JSON, or an MSCCL algorithm XML turned into one (on a full mesh)."""
    if is_msccl_path(path):
        return program_to_schedule(read_msccl(path))
    return load_schedule(path)


def load_as_program(path: str | Path) -> Program:
    """An MSCCL algorithm XML as it is, or a flowride schedule JSON lowered to a program."""
    if is_msccl_path(path):
        return read_msccl(path)
    return lower(load_schedule(path))
