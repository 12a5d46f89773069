"""An MSCCL++ execution plan as its JSON holds it: parsed with errors that name the JSON path,
and written back.

The format is microsoft/mscclpp's (read from its ``src/core/executor/execution_plan.cc`` and its
example plans under ``test/execution-files`` and ``test/executor-tests/execution-plans``; see
``docs/mscclpp.md``). A plan names a collective, a protocol (``Simple`` or ``LL``) and, per GPU,
chunk counts of its input, output and scratch buffers, the channels it opens (memory channels
within a node, port channels across nodes; one channel per peer listed in ``connected_to``,
numbered in that order per channel type), the peers' buffers it may touch (``remote_buffers``),
and its thread blocks. A thread block lists the GPU channels and remote buffers it uses; its ops
name those by their place in the thread block's lists (``channel_ids``, ``buffer_id``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowride.errors import InputError

BUFFERS = ("i", "o", "s")
CHANNEL_TYPES = ("memory", "port", "switch", "none")
PROTOCOLS = ("Simple", "LL")
COLLECTIVES = ("allgather", "alltoall", "reducescatter", "allreduce")

# Every op name the executor's parser knows (execution_plan.cc getOpType).
SYNC_OPS = frozenset({"nop", "barrier", "signal", "wait", "rlxsignal", "rlxwait", "flush", "sem_acquire", "sem_release"})
DATA_OPS = frozenset({
    "put", "pws", "pwsf", "get", "copy", "re", "res", "rre", "rres", "ppkt", "rppkt", "respkt", "cpkt", "upkt",
    "repkt", "recpkt", "recspkt", "glres", "gstore", "gstorepkt", "pipeline",
})
OP_NAMES = SYNC_OPS | DATA_OPS
SIGNALS = frozenset({"signal", "rlxsignal", "pws", "pwsf"})  # ops that signal their channels
WAITS = frozenset({"wait", "rlxwait"})
MAX_U64 = (1 << 64) - 1


@dataclass
class BufRef:
    """A buffer reference of an op: a local buffer (``type``) or a peer's (``buffer_id``, the
    place in the thread block's remote buffers of the op's channel type), ``size`` chunks from
    ``index``."""

    index: int
    size: int = 1
    type: str | None = None
    buffer_id: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        return self.buffer_id is not None

    def to_json(self) -> dict:
        d: dict[str, Any] = {"type": self.type} if self.buffer_id is None else {"buffer_id": self.buffer_id}
        d.update(index=self.index, size=self.size)
        d.update(self.extra)
        return d


@dataclass
class Op:
    name: str
    src: list[BufRef] = field(default_factory=list)
    dst: list[BufRef] = field(default_factory=list)
    channel_type: str | None = None
    channel_ids: list[int] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # reduce_op, barrier_id, num_threadblocks, tbg_info, ...

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name}
        if self.src:
            d["src_buff"] = [b.to_json() for b in self.src]
        if self.dst:
            d["dst_buff"] = [b.to_json() for b in self.dst]
        if self.channel_ids:
            d["channel_ids"] = list(self.channel_ids)
        if self.channel_type is not None:
            d["channel_type"] = self.channel_type
        d.update(self.extra)
        return d


def as_read(op: Op) -> tuple[list[BufRef], list[BufRef]]:
    """The op's (source, destination) entries as MSCCL++'s kernel reads them. Only ``get`` differs
    from what the JSON says: ``handleGet`` (``execution_kernel.hpp``) copies from the peer's buffer
    of ``src_buff[i]`` at ``dst_buff[i]``'s index into the local buffer of ``dst_buff[i]`` at
    ``src_buff[i]``'s index (the offsets swapped with respect to ``put``)."""
    if op.name != "get":
        return op.src, op.dst
    pairs = list(zip(op.src, op.dst, strict=False))
    return ([BufRef(d.index, s.size, None, s.buffer_id, s.extra) for s, d in pairs],
            [BufRef(s.index, s.size, d.type, d.buffer_id, d.extra) for s, d in pairs])


@dataclass
class Threadblock:
    id: int
    ops: list[Op] = field(default_factory=list)
    channels: list[tuple[str, list[int]]] = field(default_factory=list)  # (channel type, GPU channel indices)
    remote_buffer_refs: list[tuple[str, list[int]]] = field(default_factory=list)  # (channel type, GPU remote buffer ids)

    def channel_list(self, ctype: str) -> list[int]:
        """The GPU channel indices of type ``ctype`` this thread block holds, in op order."""
        return [i for t, ids in self.channels if t == ctype for i in ids]

    def buffer_list(self, ctype: str) -> list[int]:
        """The GPU remote buffer ids reached through ``ctype`` channels, in op (``buffer_id``) order."""
        return [i for t, ids in self.remote_buffer_refs if t == ctype for i in ids]

    def to_json(self) -> dict:
        return {"id": self.id, "ops": [o.to_json() for o in self.ops],
                "channels": [{"channel_type": t, "channel_ids": list(ids)} for t, ids in self.channels],
                "remote_buffer_refs": [{"access_channel_type": t, "remote_buffer_ids": list(ids)} for t, ids in self.remote_buffer_refs]}


@dataclass
class RemoteBuffer:
    rank: int
    type: str
    access: list[str]


@dataclass
class GpuPlan:
    id: int
    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    threadblocks: list[Threadblock] = field(default_factory=list)
    channels: list[tuple[str, list[int]]] = field(default_factory=list)  # (type, connected_to); switch: raw in extra
    remote_buffers: list[RemoteBuffer] = field(default_factory=list)
    semaphores: list = field(default_factory=list)
    switch_channels: list = field(default_factory=list)

    def peers(self, ctype: str) -> list[int]:
        """The peer of each GPU channel of type ``ctype``, by channel index."""
        return [p for t, to in self.channels if t == ctype for p in to]

    def chunks(self, buf: str) -> int:
        return {"i": self.input_chunks, "o": self.output_chunks, "s": self.scratch_chunks}[buf]

    def to_json(self) -> dict:
        return {"id": self.id, "input_chunks": self.input_chunks, "output_chunks": self.output_chunks,
                "scratch_chunks": self.scratch_chunks, "threadblocks": [t.to_json() for t in self.threadblocks],
                "channels": [{"channel_type": t, "connected_to": list(to)} for t, to in self.channels] + list(self.switch_channels),
                "remote_buffers": [{"rank": b.rank, "type": b.type, "access_channel_types": list(b.access)} for b in self.remote_buffers],
                "semaphores": list(self.semaphores)}


@dataclass
class Plan:
    name: str
    collective: str
    protocol: str
    inplace: bool
    gpus: list[GpuPlan]
    extra: dict = field(default_factory=dict)  # reuse_resources, num_threads_per_block, buffer_alignment, ...

    @property
    def ngpus(self) -> int:
        return len(self.gpus)

    def to_json(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "collective": self.collective, "protocol": self.protocol,
                             "inplace": self.inplace, "gpus": [g.to_json() for g in self.gpus]}
        d.update(self.extra)
        return d


# ---------------------------------------------------------------------------------------------
# Parsing: every field the executor reads, its JSON path named when it is missing or wrong

FIX = "see docs/mscclpp.md for the execution-plan format"


def _get(obj: Any, key: str, where: str, kind: type | tuple, optional: bool = False, default: Any = None) -> Any:
    if not isinstance(obj, dict):
        raise InputError(where, f"is a {type(obj).__name__}, not an object", FIX)
    if key not in obj:
        if optional:
            return default
        raise InputError(f"{where}.{key}", "is missing", FIX)
    v = obj[key]
    bad = isinstance(v, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if bad or not isinstance(v, kind):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InputError(f"{where}.{key}", f"is {v!r}, not a {want}", FIX)
    return v


def _count(obj: Any, key: str, where: str) -> int:
    v = _get(obj, key, where, int)
    if v < 0:
        raise InputError(f"{where}.{key}", f"is {v}, a negative count", FIX)
    return v


def _ints(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise InputError(where, f"is {v!r}, not a list of integers", FIX)
    return list(v)


def _bufref(d: Any, where: str) -> BufRef:
    if not isinstance(d, dict):
        raise InputError(where, f"is a {type(d).__name__}, not an object", FIX)
    extra = {k: v for k, v in d.items() if k not in ("type", "buffer_id", "index", "size")}
    if "switch_channel_id" in d:
        return BufRef(_get(d, "index", where, int), _get(d, "size", where, int), None, None, extra)
    has_type, has_id = "type" in d, "buffer_id" in d
    if has_type == has_id:
        raise InputError(where, "needs exactly one of type (a local buffer) and buffer_id (a peer's)", FIX)
    typ = _get(d, "type", where, str) if has_type else None
    if typ is not None and typ not in BUFFERS:
        raise InputError(f"{where}.type", f"{typ!r} is not a buffer", "use i, o or s")
    bid = _get(d, "buffer_id", where, int) if has_id else None
    return BufRef(_get(d, "index", where, int), _get(d, "size", where, int), typ, bid, extra)


def _op(d: Any, where: str) -> Op:
    name = _get(d, "name", where, str)
    if name not in OP_NAMES:
        raise InputError(f"{where}.name", f"{name!r} is not an MSCCL++ operation", "use one the executor knows: " + ", ".join(sorted(OP_NAMES)))
    src = [_bufref(b, f"{where}.src_buff[{k}]") for k, b in enumerate(_get(d, "src_buff", where, list, True, []))]
    dst = [_bufref(b, f"{where}.dst_buff[{k}]") for k, b in enumerate(_get(d, "dst_buff", where, list, True, []))]
    ctype = _get(d, "channel_type", where, str, True)
    if ctype is not None and ctype not in CHANNEL_TYPES:
        raise InputError(f"{where}.channel_type", f"{ctype!r} is not a channel type", "use memory, port, switch or none")
    ids = _ints(d.get("channel_ids", []), f"{where}.channel_ids")
    extra = {k: v for k, v in d.items() if k not in ("name", "src_buff", "dst_buff", "channel_type", "channel_ids")}
    return Op(name, src, dst, ctype, ids, extra)


def _typed_lists(items: Any, where: str, tkey: str, lkey: str) -> list[tuple[str, list[int]]]:
    if not isinstance(items, list):
        raise InputError(where, f"is a {type(items).__name__}, not a list", FIX)
    out = []
    for k, c in enumerate(items):
        w = f"{where}[{k}]"
        t = _get(c, tkey, w, str)
        if t not in CHANNEL_TYPES:
            raise InputError(f"{w}.{tkey}", f"{t!r} is not a channel type", "use memory, port, switch or none")
        out.append((t, _ints(_get(c, lkey, w, list), f"{w}.{lkey}")))
    return out


def _gpu(d: Any, where: str) -> GpuPlan:
    g = GpuPlan(_get(d, "id", where, int), _count(d, "input_chunks", where), _count(d, "output_chunks", where),
                _count(d, "scratch_chunks", where))
    chans = _get(d, "channels", where, list, True, [])
    g.switch_channels = [c for c in chans if isinstance(c, dict) and c.get("channel_type") == "switch"]
    g.channels = _typed_lists([c for c in chans if not (isinstance(c, dict) and c.get("channel_type") == "switch")],
                              f"{where}.channels", "channel_type", "connected_to")
    for k, b in enumerate(_get(d, "remote_buffers", where, list, True, [])):
        w = f"{where}.remote_buffers[{k}]"
        typ = _get(b, "type", w, str)
        if typ not in BUFFERS:
            raise InputError(f"{w}.type", f"{typ!r} is not a buffer", "use i, o or s")
        acc = _get(b, "access_channel_types", w, list)
        if not all(a in CHANNEL_TYPES for a in acc):
            raise InputError(f"{w}.access_channel_types", f"{acc!r} names an unknown channel type", "use memory or port")
        g.remote_buffers.append(RemoteBuffer(_get(b, "rank", w, int), typ, list(acc)))
    g.semaphores = _get(d, "semaphores", where, list, True, [])
    for k, t in enumerate(_get(d, "threadblocks", where, list)):
        w = f"{where}.threadblocks[{k}]"
        tb = Threadblock(_get(t, "id", w, int))
        tb.ops = [_op(o, f"{w}.ops[{j}]") for j, o in enumerate(_get(t, "ops", w, list))]
        tb.channels = _typed_lists(_get(t, "channels", w, list, True, []), f"{w}.channels", "channel_type", "channel_ids")
        tb.remote_buffer_refs = _typed_lists(_get(t, "remote_buffer_refs", w, list, True, []), f"{w}.remote_buffer_refs",
                                             "access_channel_type", "remote_buffer_ids")
        g.threadblocks.append(tb)
    return g


def parse_plan(obj: Any, where: str = "plan") -> Plan:
    """A plan from its parsed JSON; malformed input is an :class:`InputError` naming the JSON path."""
    name = _get(obj, "name", where, str)
    coll = _get(obj, "collective", where, str)
    if coll.lower() not in COLLECTIVES:
        raise InputError(f"{where}.collective", f"{coll!r} is not a collective flowride models", "use " + ", ".join(COLLECTIVES))
    proto = _get(obj, "protocol", where, str)
    if proto not in PROTOCOLS:
        raise InputError(f"{where}.protocol", f"{proto!r} is not a protocol of the executor", "use Simple or LL")
    inplace = _get(obj, "inplace", where, bool)
    gpus = [_gpu(g, f"{where}.gpus[{k}]") for k, g in enumerate(_get(obj, "gpus", where, list))]
    if len(gpus) < 2:
        raise InputError(f"{where}.gpus", f"has {len(gpus)} GPU(s)", "a collective needs at least two GPUs")
    extra = {k: v for k, v in obj.items() if k not in ("name", "collective", "protocol", "inplace", "gpus")}
    return Plan(name, coll.lower(), proto, inplace, gpus, extra)


def is_plan_object(obj: Any) -> bool:
    """Whether parsed JSON looks like an MSCCL++ execution plan (not a flowride schedule)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("gpus"), list) or "protocol" not in obj:
        return False
    return any(isinstance(g, dict) and "threadblocks" in g for g in obj["gpus"])
