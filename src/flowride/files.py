"""Reading and writing the JSON files users hand us, with errors a user can act on."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from flowride.errors import InputError


def read_json(path: str | Path, field: str, fix: str) -> Any:
    """Parsed JSON of ``path``; an unreadable file or bad JSON is an InputError on ``field``."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(field, f"cannot read {p}: {e.strerror}", fix) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(field, f"{p} is not valid JSON (line {e.lineno}: {e.msg})", "fix the file") from None


def write_json_atomic(path: str | Path, data: Any, indent: int | None = None) -> None:
    """Write via a temp file and rename, so a crash never leaves half a file behind."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=indent, separators=None if indent else (",", ":"))
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
