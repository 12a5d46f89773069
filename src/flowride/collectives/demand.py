"""Collectives as demands: which GPU needs which (source, chunk).

A *commodity* is one chunk of one source GPU; its destinations are the GPUs that must end up
holding it. AllGather: every GPU's chunks go to every other GPU (multicast helps). AlltoAll:
source s sends a distinct block to each destination d (unicast), so its commodities have one
destination each.

Sizes follow TE-CCL: ``size`` is the output buffer per GPU; each of the topology's
``buffer_ranks`` contributes ``size / buffer_ranks`` bytes (AllGather) or sends that much to each
peer (AlltoAll), split into ``chunks`` chunks of ``size / buffer_ranks / chunks`` bytes.

Reductions (sum): in ReduceScatter GPU d ends with the sum, over every GPU, of block d of their
inputs; in AllReduce every GPU ends with the sum of every block. A commodity of a reducing
collective is (block owner d, chunk c); every GPU holds a contribution to it from the start, and
its destinations must end with *all* contributions combined, each exactly once. ``size`` is the
input buffer per GPU (ReduceScatter) or the buffer per GPU (AllReduce), so chunk sizes match the
AllGather whose schedule is run backwards to build them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from flowride.errors import InputError
from flowride.topology.model import Topology


class Collective(StrEnum):
    ALLGATHER = "allgather"
    ALLTOALL = "alltoall"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"

    @classmethod
    def parse(cls, text: str) -> Collective:
        key = str(text).strip().lower().replace("_", "").replace("-", "")
        for c in cls:
            if c.value == key:
                return c
        raise InputError("collective", f"unknown collective {text!r}", f"choose one of {', '.join(c.value for c in cls)}")

    @property
    def multicast(self) -> bool:
        """Whether a commodity has several destinations (copies pay off)."""
        return self in (Collective.ALLGATHER, Collective.ALLREDUCE)

    @property
    def reduces(self) -> bool:
        """Whether GPUs combine (sum) contributions instead of only moving chunks."""
        return self in (Collective.REDUCESCATTER, Collective.ALLREDUCE)


@dataclass(frozen=True)
class Commodity:
    source: int  # node id of the source GPU (of a reducing collective: the block's owner)
    chunk: int  # chunk index within the source's input buffer
    dests: tuple[int, ...]  # node ids of the GPUs that must receive it


@dataclass(frozen=True)
class Demand:
    collective: Collective
    size_bytes: int
    chunks: int  # chunks per (source) for AllGather, per (source, destination) for AlltoAll
    chunk_bytes: float
    commodities: tuple[Commodity, ...]

    @property
    def num_deliveries(self) -> int:
        return sum(len(q.dests) for q in self.commodities)

    def needs(self) -> dict[int, int]:
        """Chunks each GPU must receive."""
        out: dict[int, int] = {}
        for q in self.commodities:
            for d in q.dests:
                out[d] = out.get(d, 0) + 1
        return out


def make_demand(topo: Topology, collective: Collective | str, size_bytes: int, chunks: int = 1) -> Demand:
    """The demand of ``collective`` of ``size_bytes`` on ``topo`` with ``chunks`` chunks per block."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    if not isinstance(chunks, int) or chunks < 1:
        raise InputError("chunks", f"{chunks!r} is not a positive integer", "use --chunks 1 or more")
    if not size_bytes > 0:
        raise InputError("size", f"{size_bytes} bytes", "give a size above zero")
    gpus = topo.gpus
    chunk_bytes = size_bytes / topo.buffer_ranks / chunks
    if chunk_bytes < 1:
        raise InputError("size", f"{size_bytes} B over {topo.buffer_ranks} ranks x {chunks} chunks is under a byte per chunk", "use a larger size or fewer chunks")
    comms: list[Commodity] = []
    if coll is Collective.ALLGATHER:
        for s in gpus:
            dests = tuple(d for d in gpus if d != s)
            comms.extend(Commodity(s, c, dests) for c in range(chunks))
    elif coll is Collective.REDUCESCATTER:
        for d in gpus:
            comms.extend(Commodity(d, c, (d,)) for c in range(chunks))
    elif coll is Collective.ALLREDUCE:
        for d in gpus:
            comms.extend(Commodity(d, c, tuple(gpus)) for c in range(chunks))
    else:
        for s in gpus:
            for di, d in enumerate(gpus):
                if d == s:
                    continue
                comms.extend(Commodity(s, di * chunks + c, (d,)) for c in range(chunks))
    return Demand(coll, int(size_bytes), chunks, chunk_bytes, tuple(comms))
