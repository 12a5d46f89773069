"""The MSCCL kernel run symbolically (``mscclRunInterpreter`` in the executor's
``src/device/msccl_kernel.cu``), on transmissions built by :mod:`flowride.program.msccl_rules`.

Why a second run beside :func:`flowride.program.model.run_program`: a Program has no local add
and no bounded connections, while the executor has both. Here every thread block runs its
transmissions in order; a transmission first waits until each thread block it depends on has
posted a flag at or past the step named (flags only grow, and only a transmission with
``hasdep`` posts one, its last step's ``s``); then it moves ``cnt`` chunks one call at a time:
a receive takes the oldest chunk of its connection's FIFO, a send puts one in, and waits while
the connection already holds as many unreceived sends as the protocol has room for (Simple 2,
LL and LL128 8: ``NCCL_STEPS`` slots over the slots one send takes). One call per chunk is the
executor's case for large messages (``maxAllowedCount`` 1); it fills connections fastest, so a
deadlock-free run here is deadlock-free with fewer, larger calls too. Values are symbolic:
(chunk, contributions), checked against the collective's definition by the caller.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from flowride.program.model import Content, Slot, fmt_slot, ranks_text
from flowride.program.msccl_xml import XStep

Key = tuple[int, int, int]  # a connection: (sending GPU, receiving GPU, channel)


@dataclass(eq=False)
class Tx:
    """One transmission as the executor's parser builds it (``msccl_parser.cc``): a real step
    with the dependencies of the nops before it, or several ``re`` steps fused into one."""

    gpu: int
    tb: int
    type: str
    steps: list[XStep]  # the real XML steps it stands for (several for fused re)
    deps: list[tuple[int, int]]  # (thread block, s) waited for, as written
    signal: int  # the kernel's step counter when it completes: s of its last step
    hasdep: bool
    cnt: int
    send: Key | None = None
    recv: Key | None = None
    waits: list[Tx] = field(default_factory=list)  # per dependency, the transmission that releases it
    # slots per mode (set by the caller before each run): canonical, and as written (for messages)
    src: list[list[Slot]] = field(default_factory=list)  # per fused step, cnt slots
    dst: list[Slot] = field(default_factory=list)
    shown_src: list[list[Slot]] = field(default_factory=list)
    shown_dst: list[Slot] = field(default_factory=list)
    fed: list[Tx] = field(default_factory=list)  # the sends its receives took chunks from
    seq: int = -1

    @property
    def path(self) -> str:
        return self.steps[0].path


@dataclass
class KernelRun:
    """What a run did: the transmissions in the order they completed, where it got stuck (if it
    did), the data problems met on the way, and each GPU's buffers at the end."""

    order: list[Tx]
    stuck: Tx | None
    why: str
    nstuck: int
    problems: list[tuple[Tx, str]]
    bufs: list[dict[Slot, Content | None]]
    full: list[Tx] = field(default_factory=list)  # stuck sends waiting for room in their connection


def run_kernel(txs: list[list[list[Tx]]], room: int, init: list[dict[Slot, Content]], proto: str) -> KernelRun:
    """Run every GPU's thread blocks (``txs[gpu][tb]``) until all finish or none can move;
    ``room`` unreceived sends fit in a connection."""
    flags = [[-1] * len(g) for g in txs]
    pos = [[0] * len(g) for g in txs]
    calls = [[0] * len(g) for g in txs]
    fifo: dict[Key, deque[tuple[Content | None, Tx]]] = defaultdict(deque)
    bufs: list[dict[Slot, Content | None]] = [dict(x) for x in init]
    order: list[Tx] = []
    problems: list[tuple[Tx, str]] = []
    for g in txs:
        for lst in g:
            for tx in lst:
                tx.fed, tx.seq = [], -1

    def get(tx: Tx, slot: Slot, shown: Slot) -> Content | None:
        v = bufs[tx.gpu].get(slot)
        if v is None:
            problems.append((tx, f"reads {fmt_slot(shown)} before anything is there"))
        return v

    def add(tx: Tx, a: Content | None, b: Content | None) -> Content | None:
        if a is None or b is None:
            return None
        (k1, m1), (k2, m2) = a, b
        if k1 != k2:
            problems.append((tx, f"adds chunk {k1} to chunk {k2}"))
            return None
        if m1 & m2:
            problems.append((tx, f"counts the contribution of rank(s) {ranks_text(m1 & m2)} to {k1} twice"))
        return (k1, m1 | m2)

    def call(tx: Tx, u: int, got: Content | None) -> Content | None:
        """Chunk ``u`` of ``tx``: its effect on local slots; returns what it sends."""
        t, mem = tx.type, bufs[tx.gpu]
        if t == "s":
            return get(tx, tx.src[0][u], tx.shown_src[0][u])
        if t in ("r", "rcs"):
            mem[tx.dst[u]] = got
            return got
        if t == "cpy":
            mem[tx.dst[u]] = get(tx, tx.src[0][u], tx.shown_src[0][u])
            return None
        if t == "re":
            v = get(tx, tx.dst[u], tx.shown_dst[u])
            for src, shown in zip(tx.src, tx.shown_src, strict=True):
                v = add(tx, get(tx, src[u], shown[u]), v)
            mem[tx.dst[u]] = v
            return None
        v = add(tx, get(tx, tx.src[0][u], tx.shown_src[0][u]), got)  # rrc, rrs, rrcs
        if t != "rrs":
            mem[tx.dst[u]] = v
        return v

    progress = True
    while progress:
        progress = False
        for g, gt in enumerate(txs):
            for t, lst in enumerate(gt):
                while pos[g][t] < len(lst):
                    tx = lst[pos[g][t]]
                    if calls[g][t] == 0 and any(flags[g][x] < s for x, s in tx.deps):
                        break
                    while calls[g][t] < tx.cnt:
                        if (tx.recv and not fifo[tx.recv]) or (tx.send and len(fifo[tx.send]) >= room):
                            break
                        got = None
                        if tx.recv:
                            got, sender = fifo[tx.recv].popleft()
                            tx.fed.append(sender)
                        out = call(tx, calls[g][t], got)
                        if tx.send:
                            fifo[tx.send].append((out, tx))
                        calls[g][t] += 1
                        progress = True
                    if calls[g][t] < tx.cnt:
                        break
                    tx.seq = len(order)
                    order.append(tx)
                    if tx.hasdep:
                        flags[g][t] = tx.signal
                    pos[g][t] += 1
                    calls[g][t] = 0
                    progress = True
    stuck = [(g, t) for g, gt in enumerate(txs) for t, lst in enumerate(gt) if pos[g][t] < len(lst)]
    if not stuck:
        return KernelRun(order, None, "", 0, problems, bufs)
    side = {}
    for gt in txs:
        for lst in gt:
            for tx in lst:
                for key, end in ((tx.send, "send"), (tx.recv, "recv")):
                    if key:
                        side[(key, end)] = (tx.gpu, tx.tb)

    def where(g: int, t: int) -> str:
        lst = txs[g][t]
        return f"thread block {t} of GPU {g} is stuck at {lst[pos[g][t]].path}" if pos[g][t] < len(lst) else f"thread block {t} of GPU {g} has finished"

    def reason(g: int, t: int) -> tuple[int, str]:
        tx = txs[g][t][pos[g][t]]
        if calls[g][t] == 0 and any(flags[g][x] < s for x, s in tx.deps):
            x, s = next((x, s) for x, s in tx.deps if flags[g][x] < s)
            return 1, f"waits for thread block {x} step {s} of GPU {g}, and {where(g, x)}"
        if tx.send and len(fifo[tx.send]) >= room:
            a, b, ch = tx.send
            peer = side.get((tx.send, "recv"))
            return 0, (f"waits for room to send to GPU {b} on channel {ch}: the connection holds {room} unreceived send(s) "
                       f"with {proto} and no more, and {where(*peer) if peer else f'GPU {b} never receives them'}")
        a, b, ch = tx.recv
        peer = side.get((tx.recv, "send"))
        return 2, f"waits to receive from GPU {a} on channel {ch}, and {where(*peer) if peer else f'GPU {a} never sends'}"

    why = sorted((reason(g, t)[0], g, t) for g, t in stuck)
    _, g, t = why[0]
    full = [txs[g2][t2][pos[g2][t2]] for r, g2, t2 in why if r == 0]
    return KernelRun(order, txs[g][t][pos[g][t]], reason(g, t)[1], len(stuck), problems, bufs, full)


def first_race(preds: list[list[int]], accesses: list[list[tuple[Hashable, bool, str]]]) -> tuple[int, str, bool, int, str, bool] | None:
    """Two events touching the same key, one writing, that no chain of ``preds`` orders (events
    are numbered in an order every chain respects): (earlier, what, writes, later, what, writes)."""
    anc: list[int] = []
    by_key: dict[Hashable, list[tuple[int, bool, str]]] = defaultdict(list)
    for e, (ps, acc) in enumerate(zip(preds, accesses, strict=True)):
        bits = 0
        for p in ps:
            bits |= anc[p] | (1 << p)
        anc.append(bits)
        for key, w, shown in acc:
            by_key[key].append((e, w, shown))
    for acc in by_key.values():
        for j in range(len(acc)):
            ej, wj, sj = acc[j]
            for i in range(j):
                ei, wi, si = acc[i]
                if ei != ej and (wi or wj) and not anc[ej] >> ei & 1:
                    return ei, si, wi, ej, sj, wj
    return None


def race_of(run: KernelRun) -> tuple[Tx, str, Tx, str] | None:
    """The first race of a finished run: (earlier, what it does, later, what it does)."""
    preds: list[list[int]] = []
    accesses: list[list[tuple[Hashable, bool, str]]] = []
    last: dict[tuple[int, int], int] = {}
    for tx in run.order:
        ps = [w.seq for w in tx.waits] + [f.seq for f in tx.fed]
        if (tx.gpu, tx.tb) in last:
            ps.append(last[(tx.gpu, tx.tb)])
        last[(tx.gpu, tx.tb)] = tx.seq
        preds.append(ps)
        acc = []
        for src, shown in zip(tx.src, tx.shown_src, strict=True):
            acc += [((tx.gpu, s), False, fmt_slot(x)) for s, x in zip(src, shown, strict=True)]
        if tx.type == "re":
            acc += [((tx.gpu, s), False, fmt_slot(x)) for s, x in zip(tx.dst, tx.shown_dst, strict=True)]
        acc += [((tx.gpu, s), True, fmt_slot(x)) for s, x in zip(tx.dst, tx.shown_dst, strict=True)]
        accesses.append(acc)
    hit = first_race(preds, accesses)
    if hit is None:
        return None
    ei, si, wi, ej, sj, wj = hit
    return run.order[ei], f"{'writes' if wi else 'reads'} {si}", run.order[ej], f"{'writes' if wj else 'reads'} {sj}"
