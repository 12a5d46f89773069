"""MSCCL++ execution plans for the tests, each written here from the algorithm's definition in
the executor's JSON format (``docs/mscclpp.md``), of the two kinds MSCCL++'s own 2-GPU AllReduce
plans take: thread blocks that reduce a peer's memory directly (``rres``, Simple), and LL packets
through scratch (``ppkt``, ``respkt``, ``upkt``).

Both are in place (one buffer of ``n * chunks`` chunks per GPU, block ``r`` owned by GPU ``r``)
and written for any number of GPUs; the tests use 2.
"""

from __future__ import annotations

from typing import Any

MAX_SIZE = (1 << 64) - 1  # max_message_size: any size


def _plan(name: str, proto: str, gpus: list[dict]) -> dict[str, Any]:
    return {"name": name, "collective": "allreduce", "protocol": proto, "inplace": True, "reuse_resources": False,
            "num_threads_per_block": 1024, "use_double_scratch_buffer": proto == "LL", "buffer_alignment": 16,
            "min_message_size": 0, "max_message_size": MAX_SIZE, "gpus": gpus}


def _local(buf: str, index: int, size: int = 1) -> dict:
    return {"type": buf, "index": index, "size": size}


def _remote(k: int, index: int, size: int = 1) -> dict:
    return {"buffer_id": k, "index": index, "size": size}


def _sync(name: str, channels: list[int]) -> dict:
    return {"name": name, "channel_ids": channels, "channel_type": "memory"}


def rres_allreduce(n: int = 2, chunks: int = 4) -> dict[str, Any]:
    """AllReduce with Simple protocol: GPU ``r`` gives each chunk ``c`` of its block its own
    thread block, which reads that chunk from every peer over memory channels, adds it to its own
    and writes the sum back to its own buffer and every peer's (one ``rres``).

    Each thread block first signals each peer on its own channel and waits for the peer's signal
    (both GPUs have their buffers in place), then, after a ``nop``, does the ``rres``, then after
    a ``nop`` signals and waits again (the peer's writes into this GPU's buffer are done before
    either GPU leaves). A GPU opens ``chunks`` channels to each peer, channel ``c`` of thread block
    ``c``, so every thread block counts only its own signals."""
    ps_of = [[p for p in range(n) if p != r] for r in range(n)]
    gpus = []
    for r in range(n):
        ps = ps_of[r]
        tbs = []
        for c in range(chunks):
            k = r * chunks + c
            mine = list(range(len(ps)))  # the thread block's channels and remote buffers: one per peer
            ops = [_sync("signal", mine), _sync("wait", mine), {"name": "nop"},
                   {"name": "rres", "src_buff": [_local("i", k)] + [_remote(j, k) for j in mine],
                    "dst_buff": [_local("i", k)] + [_remote(j, k) for j in mine], "channel_type": "memory", "reduce_op": "sum"},
                   {"name": "nop"}, _sync("signal", mine), _sync("wait", mine)]
            tbs.append({"id": c, "ops": ops,
                        "channels": [{"channel_type": "memory", "channel_ids": [c * len(ps) + j for j in mine]}],
                        "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": mine}]})
        gpus.append({"id": r, "input_chunks": n * chunks, "output_chunks": n * chunks, "scratch_chunks": 0, "threadblocks": tbs,
                     "channels": [{"channel_type": "memory", "connected_to": ps * chunks}],
                     "remote_buffers": [{"rank": p, "type": "i", "access_channel_types": ["memory"]} for p in ps],
                     "semaphores": []})
    return _plan("rres_allreduce", "Simple", gpus)


def packet_allreduce(n: int = 2, chunks: int = 2) -> dict[str, Any]:
    """AllReduce with LL packets through scratch, in three phases per chunk ``c`` of a block
    (thread block ``c`` on every GPU): (1) ``ppkt``: GPU ``r`` writes chunk ``c`` of every peer's
    block as packets into that peer's scratch; (2) ``respkt``: it adds the packets its peers wrote
    into chunk ``c`` of its own block, in place, and writes the sum as packets into every peer's
    scratch; (3) ``upkt``: it unpacks the sums its peers wrote into their blocks' chunk ``c``.

    Scratch of GPU ``r``: the partials from peer ``j`` (its place among ``r``'s peers) for chunk
    ``c`` at ``j * chunks + c``, the finished sums after them, ``(n - 1) * chunks`` further on.
    A packet read waits for its flag: no signal, no wait, no channel of its own beyond the one
    per peer the packet writes go through."""
    ps_of = [[p for p in range(n) if p != r] for r in range(n)]
    half = (n - 1) * chunks  # where the finished sums start in scratch

    def slot(writer: int, reader: int, c: int) -> int:  # where ``writer``'s packets for chunk c land on ``reader``
        return ps_of[reader].index(writer) * chunks + c

    gpus = []
    for r in range(n):
        ps = ps_of[r]
        mine = list(range(len(ps)))
        tbs = []
        for c in range(chunks):
            own = r * chunks + c
            ops = [{"name": "ppkt", "src_buff": [_local("i", p * chunks + c)], "dst_buff": [_remote(j, slot(r, p, c))],
                    "channel_ids": [j], "channel_type": "memory"} for j, p in enumerate(ps)]
            ops.append({"name": "respkt", "src_buff": [_local("i", own)] + [_local("s", slot(p, r, c)) for p in ps],
                        "dst_buff": [_local("i", own)] + [_remote(j, half + slot(r, p, c)) for j, p in enumerate(ps)],
                        "channel_type": "memory", "reduce_op": "sum"})
            ops += [{"name": "upkt", "src_buff": [_local("s", half + slot(p, r, c))], "dst_buff": [_local("i", p * chunks + c)]}
                    for p in ps]
            tbs.append({"id": c, "ops": ops, "channels": [{"channel_type": "memory", "channel_ids": mine}],
                        "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": mine}]})
        gpus.append({"id": r, "input_chunks": n * chunks, "output_chunks": n * chunks, "scratch_chunks": 2 * half,
                     "threadblocks": tbs, "channels": [{"channel_type": "memory", "connected_to": ps}],
                     "remote_buffers": [{"rank": p, "type": "s", "access_channel_types": ["memory"]} for p in ps],
                     "semaphores": []})
    return _plan("packet_allreduce", "LL", gpus)


PLANS = {"rres_allreduce.json": rres_allreduce, "packet_allreduce.json": packet_allreduce}
