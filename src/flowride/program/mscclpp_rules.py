"""The rules an MSCCL++ execution plan must keep for the executor to load it and run it as
written, checked without running it (the symbolic run is :mod:`flowride.program.mscclpp_exec`).

Read from microsoft/mscclpp's ``src/core/executor/execution_plan.cc`` (how a plan is loaded and
its ids resolved) and ``src/core/include/execution_kernel.hpp`` (what each op does):

- ids: GPU ``id`` i is the i-th GPU; thread block ids run 0, 1, ... (the executor indexes its
  per-thread-block tables by them);
- operation names are the executor's; an op that moves data over a channel names its
  ``channel_type``; reads of a peer's memory (``get``, ``rre``, ``rres``) need a memory channel;
- channels declared before use: an op's ``channel_ids`` index its thread block's channels of that
  type, which index the GPU's channels of that type; channels pair up GPU by GPU (A's k-th channel
  of a type to B with B's k-th to A); where one side declares fewer, MSCCL++ makes the rest on that
  side, which none of its ops can name;
- buffer references in range: a local reference's chunks lie within that buffer of the GPU, a
  remote one's ``buffer_id`` indexes the thread block's remote buffers of the op's channel type,
  which index the GPU's ``remote_buffers`` reachable through that type, and its chunks lie within
  the peer's buffer; an op's references cover the same number of chunks; a put's k-th channel
  leads to the GPU owning its k-th destination;
- fans as the kernel reads them: ``put``, ``pws``, ``pwsf`` and ``ppkt`` give destination k the
  bytes of ``src_buff[k]`` (``handlePut``, ``handlePutPackets``), so they carry a source entry per
  destination; ``copy``, ``upkt`` and ``cpkt`` move entry 0 only, so they carry one of each;
- every signal matched by a wait: on each channel, as many signals (``signal``, ``rlxsignal``,
  ``pws``, ``pwsf``) as the peer's matching channel has waits;
- threads: a signal or wait runs on the first threads of a block, data ops on all of them, so a
  ``nop`` (or ``barrier``) must stand between a wait and the data op after it, and between a data
  op and a signal after it;
- no cycle among thread blocks: ops in order within a thread block, each wait after the signal it
  consumes, each barrier after all its thread blocks arrive, must not wait on each other in a
  circle (a deadlock before any data moves).
"""

from __future__ import annotations

from collections import defaultdict

from flowride.program.mscclpp_plan import (
    DATA_OPS,
    SIGNALS,
    SYNC_OPS,
    WAITS,
    GpuPlan,
    Op,
    Plan,
    Threadblock,
    as_read,
)

CHANNEL_OPS = frozenset({"signal", "wait", "rlxsignal", "rlxwait", "flush", "put", "pws", "pwsf", "get", "rre", "rres", "ppkt", "rppkt"})
READS_REMOTE = frozenset({"get", "rre", "rres"})
PUTS = frozenset({"put", "pws", "pwsf", "ppkt", "rppkt"})
FANS = frozenset({"put", "pws", "pwsf", "ppkt"})  # destination k's bytes from src_buff[k] (handlePut, handlePutPackets)
ENTRY_ZERO = frozenset({"copy", "upkt", "cpkt"})  # handleCopy, handleUnpackPackets, handleCopyPackets: entry 0 only


def _refs(plan: Plan, g: GpuPlan, tb: Threadblock, op: Op, where: str, out: list[str]) -> None:
    sizes = {r.size for r in op.src + op.dst}
    if len(sizes) > 1:
        out.append(f"{where}: its buffer references cover {sorted(sizes)} chunks; they must cover the same number")
    if op.name == "get" and len(op.dst) < len(op.src):
        out.append(f"{where}: get has {len(op.src)} src_buff and {len(op.dst)} dst_buff entries; MSCCL++'s kernel pairs them "
                   "entry by entry (handleGet)")
    src, dst = as_read(op)  # get: the indices as the kernel reads them
    for side, refs in (("src_buff", src), ("dst_buff", dst)):
        for k, r in enumerate(refs):
            w = f"{where}.{side}[{k}]"
            if "switch_channel_id" in r.extra:
                continue
            if r.size < 1 or r.index < 0:
                out.append(f"{w}: index {r.index}, size {r.size} is not a chunk range")
                continue
            if not r.remote:
                if r.index + r.size > g.chunks(r.type):
                    out.append(f"{w}: chunks {r.index}..{r.index + r.size - 1} of {r.type} lie outside its {g.chunks(r.type)} chunks")
                continue
            if op.channel_type not in ("memory", "port"):
                out.append(f"{w}: a peer's buffer is reached through a memory or port channel; the op names {op.channel_type!r}")
                continue
            ids = tb.buffer_list(op.channel_type)
            if not 0 <= r.buffer_id < len(ids):
                out.append(f"{w}: buffer_id {r.buffer_id} is not among the thread block's {len(ids)} {op.channel_type} remote buffer(s)")
                continue
            rb = g.remote_buffers[ids[r.buffer_id]] if 0 <= ids[r.buffer_id] < len(g.remote_buffers) else None
            if rb is None or not 0 <= rb.rank < plan.ngpus:
                continue  # reported with the thread block's remote_buffer_refs
            have = plan.gpus[rb.rank].chunks(rb.type)
            if r.index + r.size > have:
                out.append(f"{w}: chunks {r.index}..{r.index + r.size - 1} of GPU {rb.rank}'s {rb.type} lie outside its {have} chunks")


def _channels(plan: Plan, g: GpuPlan, tb: Threadblock, where: str, out: list[str]) -> None:
    for t, ids in tb.channels:
        if t == "switch":  # NVLS groups (rank_groups): not modelled; the symbolic run says so
            continue
        have = len(g.peers(t))
        for i in ids:
            if not 0 <= i < have:
                out.append(f"{where}.channels: {t} channel {i} is not among GPU {g.id}'s {have} {t} channel(s)")
    for t, ids in tb.remote_buffer_refs:
        for i in ids:
            if not 0 <= i < len(g.remote_buffers):
                out.append(f"{where}.remote_buffer_refs: remote buffer {i} is not among GPU {g.id}'s {len(g.remote_buffers)}")
                continue
            rb = g.remote_buffers[i]
            if t not in rb.access:
                out.append(f"{where}.remote_buffer_refs: remote buffer {i} is not reachable through a {t} channel (access: {rb.access})")
            if not (0 <= rb.rank < plan.ngpus and rb.rank != g.id):
                out.append(f"GPU {g.id}.remote_buffers[{i}]: rank {rb.rank} is not another GPU of 0..{plan.ngpus - 1}")
            elif rb.rank not in g.peers(t):
                out.append(f"GPU {g.id}.remote_buffers[{i}]: GPU {rb.rank} is reached through a {t} channel that GPU {g.id} never opens")


def _op(plan: Plan, g: GpuPlan, tb: Threadblock, op: Op, where: str, out: list[str]) -> None:
    if op.name in CHANNEL_OPS and op.channel_type not in ("memory", "port"):
        out.append(f"{where}: {op.name} needs channel_type memory or port")
        return
    if op.name in DATA_OPS and op.name != "pipeline" and not (op.src and op.dst):
        out.append(f"{where}: {op.name} moves data but names no {'src_buff' if not op.src else 'dst_buff'}")
        return
    if op.name in FANS and len(op.src) < len(op.dst):
        out.append(f"{where}: {op.name} has {len(op.dst)} destinations but {len(op.src)} src_buff entr"
                   f"{'y' if len(op.src) == 1 else 'ies'}; MSCCL++'s kernel reads destination k's source from src_buff[k], so "
                   "give one src_buff entry per destination")
    if op.name in ENTRY_ZERO and (len(op.src) > 1 or len(op.dst) > 1):
        out.append(f"{where}: {op.name} names {len(op.src)} src_buff and {len(op.dst)} dst_buff entries; MSCCL++'s kernel "
                   "moves entry 0 only: write one op per entry")
    if op.name in READS_REMOTE and op.channel_type != "memory":
        out.append(f"{where}: {op.name} reads a peer's memory, which only a memory channel can")
    if op.name in ("signal", "wait", "rlxsignal", "rlxwait", "flush", "pws", "pwsf") and not op.channel_ids:
        out.append(f"{where}: {op.name} names no channel_ids")
    if op.name == "flush" and op.channel_type != "port":
        out.append(f"{where}: flush applies to port channels only")
    if op.channel_type in ("memory", "port"):
        chans = tb.channel_list(op.channel_type)
        for k in op.channel_ids:
            if not 0 <= k < len(chans):
                out.append(f"{where}: channel {k} is not among the thread block's {len(chans)} {op.channel_type} channel(s)")
                return
        peers = g.peers(op.channel_type)
        if op.name in PUTS and len(op.channel_ids) == len(op.dst):
            bufs = tb.buffer_list(op.channel_type)
            for k, (cid, r) in enumerate(zip(op.channel_ids, op.dst, strict=True)):
                if not (r.remote and 0 <= r.buffer_id < len(bufs) and 0 <= bufs[r.buffer_id] < len(g.remote_buffers)):
                    continue
                to = peers[chans[cid]] if 0 <= chans[cid] < len(peers) else None
                if to is not None and to != g.remote_buffers[bufs[r.buffer_id]].rank:
                    out.append(f"{where}: its channel {cid} leads to GPU {to}, its destination {k} is on GPU {g.remote_buffers[bufs[r.buffer_id]].rank}")
    _refs(plan, g, tb, op, where, out)


def _conn(g: GpuPlan, tb: Threadblock, op: Op, k: int, sending: bool) -> tuple | None:
    chans = tb.channel_list(op.channel_type)
    peers = g.peers(op.channel_type)
    if not (0 <= k < len(chans) and 0 <= chans[k] < len(peers)):
        return None
    peer = peers[chans[k]]
    nth = peers[: chans[k]].count(peer)
    return (g.id, peer, op.channel_type, nth) if sending else (peer, g.id, op.channel_type, nth)


def _cycles(plan: Plan, out: list[str]) -> None:
    """Kahn's order on ops (in order per thread block; each wait after its signal; barriers after
    all arrivals); ops left over wait on each other in a circle."""
    succ: dict[tuple, list[tuple]] = defaultdict(list)
    indeg: dict[tuple, int] = defaultdict(int)
    nodes: list[tuple] = []
    sig: dict[tuple, list[tuple]] = defaultdict(list)
    wts: dict[tuple, list[tuple]] = defaultdict(list)
    bars: dict[tuple, list[tuple]] = defaultdict(list)

    def edge(u: tuple, v: tuple) -> None:
        succ[u].append(v)
        indeg[v] += 1

    for g in plan.gpus:
        for t, tb in enumerate(g.threadblocks):
            seen: dict[int, int] = defaultdict(int)
            for j, op in enumerate(tb.ops):
                u = (g.id, t, j)
                nodes.append(u)
                indeg.setdefault(u, 0)
                if j:
                    edge((g.id, t, j - 1), u)
                for k in op.channel_ids if op.channel_type in ("memory", "port") else []:
                    if op.name in SIGNALS:
                        sig[_conn(g, tb, op, k, True)].append(u)
                    elif op.name in WAITS:
                        wts[_conn(g, tb, op, k, False)].append(u)
                if op.name == "barrier":
                    b = int(op.extra.get("barrier_id", 0))
                    bars[(g.id, b, seen[b])].append(u)
                    seen[b] += 1
    for key, ws in wts.items():
        for s, w in zip(sig.get(key, []), ws, strict=False):
            edge(s, w)
    for key, us in bars.items():
        hub = ("barrier",) + key
        nodes.append(hub)
        indeg.setdefault(hub, 0)
        for u in us:  # the barrier op is where a block waits: it ends after the hub
            r, t, j = u
            if j:
                edge((r, t, j - 1), hub)
            edge(hub, u)
    ready = [u for u in nodes if indeg[u] == 0]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for v in succ.get(u, []):
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if done < len(nodes):
        left = sorted({(u[0], u[1]) for u in nodes if indeg[u] > 0 and u[0] != "barrier"})
        out.append("cycle: thread blocks wait on each other in a circle (GPU/thread block " +
                   ", ".join(f"{r}/{t}" for r, t in left[:8]) + (" ..." if len(left) > 8 else "") + ")")


def check_rules(plan: Plan) -> list[str]:
    """What ``plan`` breaks of the executor's rules (empty when nothing): see the module text."""
    out: list[str] = []
    n = plan.ngpus
    for k, g in enumerate(plan.gpus):
        if g.id != k:
            out.append(f"gpus[{k}].id: is {g.id}; the executor reads GPU i from place i")
        for t, tb in enumerate(g.threadblocks):
            if tb.id != t:
                out.append(f"GPU {g.id} threadblocks[{t}].id: is {tb.id}; thread block ids must run 0, 1, ... in order")
        for t, peers in g.channels:
            for p in peers:
                if not (0 <= p < n and p != g.id):
                    out.append(f"GPU {g.id}.channels: {t} channel to {p}, not another GPU of 0..{n - 1}")
    if out:
        return out
    # Channels to a peer need not be as many both ways: MSCCL++'s executor makes the missing ones on
    # the side with fewer (execution_plan.cc getUnpairedChannelInfos, after its declared ones), and
    # pairs them in order per peer (executor.cc setupConnections' per-peer tags), as the run does; no
    # op of that side can name them, so a signal sent into one is a signal without its wait (below).
    for g in plan.gpus:
        for tb in g.threadblocks:
            where = f"GPU {g.id} thread block {tb.id}"
            _channels(plan, g, tb, where, out)
            prev_wait = prev_data = False
            for j, op in enumerate(tb.ops):
                w = f"{where} op {j} ({op.name})"
                _op(plan, g, tb, op, w, out)
                if op.name in DATA_OPS and prev_wait:
                    out.append(f"{w}: follows a wait with no nop between them; its threads may run before the wait ends")
                if op.name in ("signal", "rlxsignal") and prev_data:
                    out.append(f"{w}: follows a data op with no nop between them; it may signal before the data is written")
                if op.name in ("nop", "barrier"):
                    prev_wait = prev_data = False
                elif op.name in WAITS:
                    prev_wait = True
                elif op.name in DATA_OPS:
                    prev_data, prev_wait = True, False
                elif op.name not in SYNC_OPS:
                    prev_wait = False
    if out:
        return out
    sig: dict[tuple, int] = defaultdict(int)
    wts: dict[tuple, int] = defaultdict(int)
    for g in plan.gpus:
        for tb in g.threadblocks:
            for op in tb.ops:
                if op.channel_type not in ("memory", "port"):
                    continue
                for k in op.channel_ids:
                    if op.name in SIGNALS:
                        sig[_conn(g, tb, op, k, True)] += 1
                    elif op.name in WAITS:
                        wts[_conn(g, tb, op, k, False)] += 1
    for key in sorted(set(sig) | set(wts), key=str):
        if sig.get(key, 0) != wts.get(key, 0):
            a, b, t, nth = key
            out.append(f"GPU {a} signals GPU {b} {sig.get(key, 0)} time(s) on {t} channel pair {nth}, which GPU {b} waits for "
                       f"{wts.get(key, 0)} time(s); every signal needs its wait")
    _cycles(plan, out)
    return out


# The executor's fixed-size tables (src/core/include/execution_common.hpp): a thread block's ops
# are copied into ``Operation operations[MAX_OPERATION]`` (executor.cc throws above it), its
# channels and remote buffers of a type into arrays of MAX_CHANNEL (not checked there: written
# past the end), an op's channels into MAX_CHANNEL_PER_OPERATION, its buffer references into
# MAX_LOCAL_BUFFER_PER_OPERATION + MAX_CHANNEL_PER_OPERATION.
MAX_OPERATION = 64
MAX_CHANNEL = 16
MAX_CHANNEL_PER_OPERATION = 8
MAX_BUFFERS_PER_OPERATION = 2 + MAX_CHANNEL_PER_OPERATION
# flowride's own rule, not the executor's: a plan's thread blocks wait on each other's signals
# across GPUs, so all of them must be resident at once, one 1024-thread block per SM. The smallest
# GPU flowride models has 104 compute units (an MI250 GCD; an A100 has 108 SMs, an H100 132).
MAX_THREADBLOCKS = 104


def check_limits(plan: Plan) -> list[str]:
    """What ``plan`` exceeds of the executor's fixed-size tables (empty when nothing): ops per
    thread block (MAX_OPERATION 64: the executor refuses to launch the plan), channels and remote
    buffers of one type per thread block (MAX_CHANNEL 16), channels per op (8), buffer references
    per op (10), and thread blocks per GPU (:data:`MAX_THREADBLOCKS`, flowride's residency rule). One finding per kind of excess, naming the worst place and how many places exceed."""
    worst: dict[str, tuple[int, str, int]] = {}  # kind -> (count, where, places over)

    def over(kind: str, count: int, limit: int, where: str) -> None:
        if count > limit:
            c, w, k = worst.get(kind, (0, "", 0))
            worst[kind] = (count, where, k + 1) if count > c else (c, w, k + 1)

    for g in plan.gpus:
        over("thread blocks", len(g.threadblocks), MAX_THREADBLOCKS, f"GPU {g.id}")
        for tb in g.threadblocks:
            where = f"GPU {g.id} thread block {tb.id}"
            over("ops", len(tb.ops), MAX_OPERATION, where)
            for t in ("memory", "port", "switch"):
                over(f"{t} channels", len(tb.channel_list(t)), MAX_CHANNEL, where)
                over(f"{t} remote buffers", len(tb.buffer_list(t)), MAX_CHANNEL, where)
            for j, op in enumerate(tb.ops):
                over("channels of one op", len(op.channel_ids), MAX_CHANNEL_PER_OPERATION, f"{where} op {j}")
                over("buffer references of one op", max(len(op.src), len(op.dst)), MAX_BUFFERS_PER_OPERATION, f"{where} op {j}")
    limit = {"ops": MAX_OPERATION, "thread blocks": MAX_THREADBLOCKS, "channels of one op": MAX_CHANNEL_PER_OPERATION,
             "buffer references of one op": MAX_BUFFERS_PER_OPERATION}

    def limit_text(kind: str) -> str:
        if kind == "thread blocks":
            return f"the {MAX_THREADBLOCKS} that can all be resident at once"
        return f"the executor's {limit.get(kind, MAX_CHANNEL)}"

    return [f"{where} has {c} {kind}, over {limit_text(kind)}" + (f" ({k} places over it)" if k > 1 else "")
            for kind, (c, where, k) in worst.items()]
