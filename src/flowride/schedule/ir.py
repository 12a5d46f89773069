"""A schedule as plain, versioned data: the epoch length, the topology, and every send.

A send is (epoch, link, source GPU, chunk): in ``epoch`` the tail of ``link`` puts chunk
``chunk`` of GPU ``source``'s input on the link. In a reducing collective (ReduceScatter,
AllReduce) ``source`` names the block's owner and the sender puts its partial sum of (block,
chunk) on the link; ``reduce`` says the receiver adds it to its own partial (MSCCL's rrc), not
overwrites it (a copy, as in AllReduce's gather phase). Everything else (what each GPU holds when, the
finish time) follows from replaying the sends in :mod:`flowride.schedule.simulate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from flowride.collectives.demand import Collective, Demand, make_demand
from flowride.errors import InputError
from flowride.files import read_json, write_json_atomic
from flowride.sizes import MAX_BUFFER_BYTES, MAX_CHUNKS, MAX_EPOCHS, MAX_SENDS
from flowride.topology.io import topology_from_dict, topology_to_dict
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming, epoch_timing

SCHEMA = "flowride.schedule/1"
SCHEDULE_KEYS = ("schema", "collective", "size_bytes", "chunks", "epoch_duration_s", "topology", "sends", "meta")


@dataclass(frozen=True, order=True)
class Send:
    epoch: int
    link: int
    source: int
    chunk: int
    reduce: bool = False


# The order of Send's fields as one tuple, built in C: ``sorted(sends, key=SEND_ORDER)`` gives the
# dataclass order without its Python ``__lt__`` per comparison (5x faster on 100k sends).
SEND_ORDER = attrgetter("epoch", "link", "source", "chunk", "reduce")


@dataclass
class Schedule:
    topology: Topology
    collective: Collective
    size_bytes: int
    chunks: int
    tau: float  # epoch length, seconds
    sends: list[Send]
    meta: dict[str, Any] = field(default_factory=dict)  # method, solver status, ... (informative)

    @property
    def demand(self) -> Demand:
        return make_demand(self.topology, self.collective, self.size_bytes, self.chunks)

    @property
    def timing(self) -> EpochTiming:
        return epoch_timing(self.topology, self.demand.chunk_bytes, self.tau)

    @classmethod
    def from_tuples(cls, topology: Topology, demand: Demand, tau: float, sends, meta=None) -> Schedule:
        return cls(
            topology,
            demand.collective,
            demand.size_bytes,
            demand.chunks,
            tau,
            [s if isinstance(s, Send) else Send(*map(int, s[:4]), *(bool(x) for x in s[4:])) for s in sends],
            dict(meta or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "collective": self.collective.value,
            "size_bytes": self.size_bytes,
            "chunks": self.chunks,
            "epoch_duration_s": self.tau,
            "topology": topology_to_dict(self.topology),
            "sends": [[s.epoch, s.link, s.source, s.chunk, 1] if s.reduce else [s.epoch, s.link, s.source, s.chunk] for s in self.sends],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Schedule:
        if not isinstance(data, dict):
            raise InputError("schedule", "the JSON is not an object", "give a file written by flowride synth")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise InputError("schema", f"{schema!r} is not a flowride schedule", f"expected {SCHEMA!r}")
        unknown = sorted(set(data) - set(SCHEDULE_KEYS))
        if unknown:
            raise InputError(f"schedule.{unknown[0]}", "is not a known key", f"known keys: {', '.join(SCHEDULE_KEYS)}")
        for key in ("collective", "size_bytes", "chunks", "epoch_duration_s", "topology", "sends"):
            if key not in data:
                raise InputError(key, "is missing from the schedule", "regenerate it with flowride synth")
        for key in ("size_bytes", "chunks"):
            v = data[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(key, f"{v!r} is not a positive integer", "regenerate the schedule with flowride synth")
        if data["size_bytes"] > MAX_BUFFER_BYTES:
            raise InputError("size_bytes", f"{data['size_bytes']:.3g} is over the limit of {MAX_BUFFER_BYTES:.0e} bytes", "give a smaller size")
        if data["chunks"] > MAX_CHUNKS:
            raise InputError("chunks", f"{data['chunks']:,} is over the limit of {MAX_CHUNKS:,} chunks per block", "use fewer chunks")
        if not isinstance(data["sends"], list):
            raise InputError("sends", f"is a {type(data['sends']).__name__}, not a list", "give a list of [epoch, link, source, chunk(, reduce)]")
        if len(data["sends"]) > MAX_SENDS:
            raise InputError("sends", f"{len(data['sends']):,} sends, over the limit of {MAX_SENDS:,} that can be verified in minutes",
                             "split the schedule or use fewer chunks")
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise InputError("meta", f"is a {type(meta).__name__}, not an object", "give an object or leave it out")
        sends = []
        for i, s in enumerate(data["sends"]):
            if not (isinstance(s, list) and len(s) in (4, 5) and all(isinstance(v, int) and not isinstance(v, bool) for v in s)):
                raise InputError(f"sends[{i}]", f"{s!r} is not [epoch, link, source, chunk] or [..., reduce]", "use four integers, and a fifth (1) for a reduction")
            if len(s) == 5 and s[4] not in (0, 1):
                raise InputError(f"sends[{i}][4]", f"{s[4]!r} is not 0 or 1", "use 1 for a reduction, 0 or nothing for a copy")
            if not 0 <= s[0] <= MAX_EPOCHS:
                raise InputError(f"sends[{i}][0]", f"epoch {s[0]:,} is outside 0..{MAX_EPOCHS:,}", "give the epoch the send starts in")
            sends.append(Send(*s[:4], bool(s[4]) if len(s) == 5 else False))
        tau = data["epoch_duration_s"]
        try:
            tau_ok = isinstance(tau, int | float) and not isinstance(tau, bool) and math.isfinite(float(tau)) and tau > 0
        except OverflowError:  # an integer too large for a float
            tau_ok = False
        if not tau_ok:
            raise InputError("epoch_duration_s", f"{tau!r} is not a positive number", "give seconds above zero")
        topo = data["topology"]
        if isinstance(topo, dict) and "switching" not in topo:
            # written before switches cut through: its epochs were counted store-and-forward
            topo = {**topo, "switching": "store-and-forward"}
        return cls(
            topology_from_dict(topo),
            Collective.parse(data["collective"]),
            data["size_bytes"],
            data["chunks"],
            float(tau),
            sends,
            dict(meta),
        )

    def save(self, path: str | Path) -> None:
        """Write atomically (temp file + rename) so a crash never leaves half a schedule."""
        write_json_atomic(path, self.to_dict())


def load_schedule(path: str | Path) -> Schedule:
    return Schedule.from_dict(read_json(path, "schedule", "give an existing schedule JSON"))
