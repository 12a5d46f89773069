"""Input files checked against a schema (pydantic): unknown keys, types and ranges.

A file a user hands us is validated in full before anything is built from it. A misspelled key
(``alpha_ns`` for ``alpha_us``) is an error that lists the known keys, not a key silently ignored
that gives a schedule for a different machine. :func:`validated` turns pydantic's errors into
the project's :class:`~flowride.errors.InputError`, naming the field as written in the file
(``links[3].alpha_ns``).
"""

from __future__ import annotations

import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from flowride.errors import InputError

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """A file object: unknown keys are errors, no type is coerced (``"5"`` is not 5)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class that holds the last key of ``loc`` (to list its known keys)."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)) or part not in cur.model_fields:
            return None
        cur = cur.model_fields[part].annotation
        while typing.get_origin(cur) in (list, tuple, typing.Union, types.UnionType):
            args = [a for a in typing.get_args(cur) if a is not type(None) and a is not Ellipsis]
            cur = args[0] if args else None
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def validated(model: type[M], data: Any, field: str, fix: str) -> M:
    """``data`` as ``model``; the first problem as an InputError on ``field`` + its path."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        # top-level keys carry the file's name (topology.nodes); deeper ones read as written (nodes[3].id)
        where = (f"{field}.{_where(loc)}" if field else _where(loc)) if len(loc) == 1 else (_where(loc) or field)
        if err["type"] == "extra_forbidden":
            holder = _model_at(model, loc)
            known = ", ".join(f.alias or k for k, f in holder.model_fields.items()) if holder else "see the documentation"
            raise InputError(where, "is not a known key", f"known keys: {known}") from None
        if err["type"] == "too_long":
            ctx = err.get("ctx", {})
            n, cap = ctx.get("actual_length"), ctx.get("max_length")
            raise InputError(where, f"{n:,} items, over the limit of {cap:,}" if isinstance(n, int) and isinstance(cap, int)
                             else "has too many items", "give a smaller input") from None
        if err["type"] == "missing":
            raise InputError(where, "is missing", fix) from None
        got = err.get("input")
        shown = repr(got) if not isinstance(got, dict | list) else type(got).__name__
        more = f" (and {e.error_count() - 1} more problem(s))" if e.error_count() > 1 else ""
        raise InputError(where, f"{shown}: {err['msg'].lower()}{more}", fix) from None
