"""What runs at once: the ``--concurrent`` SPEC, a JSON list of collectives on one topology.

Each entry names a collective, the ranks of its process group (the ``--ranks`` syntax or a list
of integers), its buffer size and when it starts, in microseconds after the first one::

    [{"name": "dp0", "collective": "reducescatter", "ranks": "every:8", "size": "1GB"},
     {"name": "tp0", "collective": "allgather", "ranks": "0-7", "size": "256MB", "start_us": 50}]

Groups of different entries may share GPUs (a TP all-gather and a DP reduce-scatter do); one
entry names each of its ranks once. Errors name the entry and its field, never a traceback.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.files import read_text
from flowride.topology.group import format_ranks, parse_group
from flowride.topology.model import Topology
from flowride.units import parse_size

KEYS = ("name", "collective", "ranks", "size", "start_us", "relay")
MAX_ITEMS = 64  # collectives at once: more than a job's groups of one kind times its overlaps
MAX_START_US = 1e9  # a start offset over 1000 s is a typo, not an overlap
FIX = ('write a JSON list of objects such as {"collective": "reducescatter", "ranks": "every:8", "size": "1GB", '
       '"start_us": 0}')


@dataclass(frozen=True)
class Item:
    """One collective of a concurrent set: its group (ranks of the base topology, in group order)."""

    name: str
    collective: Collective
    ranks: tuple[int, ...]
    size_bytes: int
    start_s: float = 0.0
    relay: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "collective": self.collective.value, "ranks": format_ranks(self.ranks),
                "size_bytes": self.size_bytes, "start_us": self.start_s * 1e6, "relay": self.relay}


def read_spec(text_or_path: str, topo: Topology) -> list[Item]:
    """The items of a SPEC given inline (starting with ``[``) or as a JSON file's path."""
    text = str(text_or_path).strip()
    if not text.startswith("["):
        if not Path(text).is_file():
            raise InputError("--concurrent", f"{text!r} is neither a JSON list nor a file", FIX)
        text = read_text(text, "--concurrent", "give a JSON file of the collectives")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError("--concurrent", f"is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})", FIX) from None
    return parse_spec(data, topo)


def parse_spec(data: Any, topo: Topology) -> list[Item]:
    """The items of a SPEC already read from JSON, checked against ``topo``."""
    if not isinstance(data, list) or not data:
        raise InputError("--concurrent", "is not a non-empty JSON list", FIX)
    if len(data) > MAX_ITEMS:
        raise InputError("--concurrent", f"lists {len(data)} collectives, over the limit of {MAX_ITEMS}", "split the set")
    items = [_item(i, e, topo) for i, e in enumerate(data)]
    names = [it.name for it in items]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise InputError("--concurrent", f"the name {dup!r} is used twice", "give each collective its own name")
    return items


def _item(i: int, e: Any, topo: Topology) -> Item:
    where = f"--concurrent[{i}]"
    if not isinstance(e, dict):
        raise InputError(where, f"is a {type(e).__name__}, not an object", FIX)
    unknown = sorted(set(e) - set(KEYS))
    if unknown:
        raise InputError(f"{where}.{unknown[0]}", "is not a known key", f"known keys: {', '.join(KEYS)}")
    for key in ("collective", "ranks", "size"):
        if key not in e:
            raise InputError(f"{where}.{key}", "is missing", FIX)
    name = str(e.get("name", f"c{i}"))
    coll = _field(f"{where}.collective", lambda: Collective.parse(e["collective"]))
    ranks = _ranks(f"{where}.ranks", e["ranks"], len(topo.gpus))
    size = _field(f"{where}.size", lambda: parse_size(e["size"], f"{where}.size"))
    start = e.get("start_us", 0)
    if isinstance(start, bool) or not isinstance(start, int | float) or not math.isfinite(start):
        raise InputError(f"{where}.start_us", f"{start!r} is not a number", "give microseconds after the first start, e.g. 0 or 120.5")
    if not 0 <= start <= MAX_START_US:
        raise InputError(f"{where}.start_us", f"{start} is outside 0..{MAX_START_US:g}", "give microseconds after the first start")
    relay = e.get("relay", False)
    if not isinstance(relay, bool):
        raise InputError(f"{where}.relay", f"{relay!r} is not true or false", "give true to let GPUs outside the group forward")
    return Item(name, coll, ranks, size, float(start) * 1e-6, relay)


def _field(where: str, parse):
    try:
        return parse()
    except InputError as e:
        raise InputError(where, e.problem, e.fix) from None


def _ranks(where: str, value: Any, ngpus: int) -> tuple[int, ...]:
    if isinstance(value, list):
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in value):
            raise InputError(where, f"{value!r} is not a list of integers", "give ranks as integers or as text such as 0-7")
        if any(r < 0 for r in value):
            raise InputError(where, f"{value!r} holds a negative rank", "ranks count from 0")
        value = ",".join(map(str, value))  # parse_group checks the range and repeats
    if not isinstance(value, str):
        raise InputError(where, f"{value!r} is neither text nor a list", "give ranks as text such as 0-7 or every:8, or a list")
    return _field(where, lambda: parse_group(value, ngpus))
