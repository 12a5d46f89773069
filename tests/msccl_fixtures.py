"""MSCCL algorithm XMLs for the tests, each written here from the algorithm's definition.

Why a generator and not files: the tests need algorithms of the kinds real deployments ship (an
all-pairs one-pass AllReduce reducing scratch with fused ``re`` steps, an all-pairs AlltoAll,
a direct AllGather in place, ring AllReduces over LL128, hierarchical AllReduce and AllGather
over two groups of GPUs), and every line of them here follows from the algorithm, so a test can
say why it expects the number it does. The XML is in the executor's format (``docs/msccl.md``):
all ten ``<algo>`` attributes, all ten step attributes, ``s`` counted with the nops.

A step waits for earlier steps of other thread blocks through ``after``: the executor takes one
dependency per step, so all but the last go on ``nop`` steps just before it, and every step
waited for gets ``hasdep="1"`` (only such steps post the flag a waiting thread block reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class Step:
    type: str
    src: tuple[str, int]  # (buffer, offset); offset -1: not used
    dst: tuple[str, int]
    cnt: int = 1
    after: list[tuple[Tb, Step]] = field(default_factory=list)  # steps of other thread blocks waited for
    s: int = -1  # set when the algorithm is written


@dataclass(eq=False)
class Tb:
    id: int
    send: int
    recv: int
    chan: int
    steps: list[Step] = field(default_factory=list)

    def add(self, typ: str, src: tuple[str, int], dst: tuple[str, int], cnt: int = 1,
            after: list[tuple[Tb, Step]] | None = None) -> Step:
        st = Step(typ, src, dst, cnt, list(after or []))
        self.steps.append(st)
        return st


@dataclass
class Gpu:
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: list[Tb] = field(default_factory=list)

    def tb(self, send: int = -1, recv: int = -1, chan: int = 0) -> Tb:
        t = Tb(len(self.tbs), send, recv, chan)
        self.tbs.append(t)
        return t


NOWHERE_SRC, NOWHERE_DST = ("i", -1), ("o", -1)


def to_xml(name: str, coll: str, proto: str, loop: int, gpus: list[Gpu], *, inplace: bool,
           min_bytes: int = 0, max_bytes: int = 0) -> str:
    """The algorithm as the executor reads it: the nops that carry extra dependencies placed and
    counted, ``hasdep`` set on exactly the steps some step waits for."""
    waited: set[int] = set()
    for g in gpus:
        for t in g.tbs:
            s = 0
            for st in t.steps:
                s += max(0, len(st.after) - 1)  # the nops before it
                st.s = s
                s += 1
                waited.update(id(x) for _, x in st.after)
    nch = 1 + max(t.chan for g in gpus for t in g.tbs)
    head = (f'<algo name="{name}" proto="{proto}" nchannels="{nch}" nchunksperloop="{loop}" ngpus="{len(gpus)}" coll="{coll}" '
            f'inplace="{int(inplace)}" outofplace="{int(not inplace)}" minBytes="{min_bytes}" maxBytes="{max_bytes}">')
    lines = [head]
    for g in gpus:
        lines.append(f'  <gpu id="{g.id}" i_chunks="{g.i_chunks}" o_chunks="{g.o_chunks}" s_chunks="{g.s_chunks}">')
        for t in g.tbs:
            lines.append(f'    <tb id="{t.id}" send="{t.send}" recv="{t.recv}" chan="{t.chan}">')
            for st in t.steps:
                for k, (tb, x) in enumerate(st.after[:-1]):
                    lines.append(_step(st.s - len(st.after) + 1 + k, "nop", NOWHERE_SRC, NOWHERE_DST, 0, tb.id, x.s, 0))
                dep = st.after[-1] if st.after else None
                lines.append(_step(st.s, st.type, st.src, st.dst, st.cnt, dep[0].id if dep else -1, dep[1].s if dep else -1,
                                   int(id(st) in waited)))
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def _step(s: int, typ: str, src: tuple[str, int], dst: tuple[str, int], cnt: int, depid: int, deps: int, hasdep: int) -> str:
    return (f'      <step s="{s}" type="{typ}" srcbuf="{src[0]}" srcoff="{src[1]}" dstbuf="{dst[0]}" dstoff="{dst[1]}" '
            f'cnt="{cnt}" depid="{depid}" deps="{deps}" hasdep="{hasdep}"/>')


def peers(r: int, n: int) -> list[int]:
    return [p for p in range(n) if p != r]


# ---------------------------------------------------------------------------------------------
# The algorithms


def allpairs_allreduce(n: int = 4, instances: int = 2, proto: str = "LL", drop: tuple[int, int, int] | None = None) -> str:
    """One-pass all-pairs AllReduce, in place: every GPU sends its whole buffer to every peer,
    which receives it into scratch, and each GPU then adds its peers' copies into its own buffer.

    The buffer is ``n * instances`` chunks; instance ``h`` (on channel ``h``) moves chunks
    ``h*n .. h*n+n-1`` in one step of ``cnt = n`` per peer and direction. Per instance, a GPU
    has one thread block per peer (send and receive that peer) and one reduce thread block: for
    each chunk of the instance, one ``re`` per peer, all adding into the same chunk, so the
    executor fuses them into one reduction. The reduce thread block's first reduction waits for
    every peer thread block's receive (the scratch it adds is there, and, the receive coming
    after the send, the chunk it overwrites has been sent); its later ones wait for nothing
    more. ``drop=(gpu, chunk, peer)`` leaves out that GPU's addition of that peer's copy of the
    chunk (a broken variant). Transfers: ``n * (n-1) * n * instances`` chunks; thread blocks
    per GPU: ``instances * n``.
    """
    loop = n * instances

    def landing(writer: int, reader: int, h: int) -> int:
        """Where ``writer``'s chunks of instance ``h`` land in ``reader``'s scratch: a block of
        ``loop`` chunks per peer of the reader, in peer order, instance ``h`` at ``h * n`` in it."""
        return (peers(reader, n).index(writer) * instances + h) * n

    gpus = []
    for r in range(n):
        g = Gpu(r, loop, 0, (n - 1) * loop)
        for h in range(instances):
            recvs = []
            for p in peers(r, n):
                t = g.tb(p, p, h)
                t.add("s", ("i", h * n), ("s", landing(r, p, h)), n)
                recvs.append((t, t.add("r", ("i", h * n), ("s", landing(p, r, h)), n)))
            red = g.tb(chan=h)
            for j in range(n):
                k = h * n + j
                for p in peers(r, n):
                    if drop != (r, k, p):
                        red.add("re", ("s", landing(p, r, h) + j), ("i", k), 1, recvs if not red.steps else None)
        gpus.append(g)
    return to_xml("allpairs_allreduce", "allreduce", proto, loop, gpus, inplace=True)


def allpairs_alltoall(n: int = 4, instances: int = 2, proto: str = "LL") -> str:
    """All-pairs AlltoAll, out of place: each GPU sends block ``p`` of its input to GPU ``p``,
    which stores it as block ``r`` of its output, and copies its own block locally.

    A block is ``instances`` chunks, chunk ``h`` of every block on channel ``h``; per instance a
    GPU has a send-only and a receive-only thread block per peer (receive thread blocks first),
    then one thread block copying its own block. In place the receive from ``p`` lands on the
    block the send to ``p`` reads, with nothing ordering the two: a race."""
    C = instances
    gpus = []
    for r in range(n):
        g = Gpu(r, n * C, n * C, 0)
        for h in range(C):
            for p in peers(r, n):
                g.tb(recv=p, chan=h).add("r", ("i", r * C + h), ("o", p * C + h))
            for p in peers(r, n):
                g.tb(send=p, chan=h).add("s", ("i", p * C + h), ("o", r * C + h))
        g.tb().add("cpy", ("i", r * C), ("o", r * C), C)
        gpus.append(g)
    return to_xml("allpairs_alltoall", "alltoall", proto, n * C, gpus, inplace=False)


def direct_allgather(n: int = 4, chunks: int = 2, proto: str = "LL") -> str:
    """AllGather in place (the input is the GPU's own block of the output, so only ``o`` is named
    and ``i_chunks`` is 0): each GPU sends its block straight to every peer and receives every
    peer's, chunk ``c`` of a block on channel ``c``, one thread block per peer and channel. The
    size range is 1 KiB to 1 MiB - 1 in the executor's inclusive form."""
    C = chunks
    gpus = []
    for r in range(n):
        g = Gpu(r, 0, n * C, 0)
        for c in range(C):
            for p in peers(r, n):
                t = g.tb(p, p, c)
                t.add("s", ("o", r * C + c), ("o", r * C + c))
                t.add("r", ("o", p * C + c), ("o", p * C + c))
        gpus.append(g)
    return to_xml("direct_allgather", "allgather", proto, n * C, gpus, inplace=True, min_bytes=1024, max_bytes=(1 << 20) - 1)


def ring_allreduce(n: int = 8, rings: int = 4, proto: str = "LL128") -> str:
    """Ring AllReduce in place, ``rings`` rings on channels 0, 1, ... (even rings run 0 -> 1 ->
    ... -> n-1 -> 0, odd ones the other way round), ring ``q`` owning chunks ``q*n .. q*n+n-1``.

    On a ring, the GPU at position ``pos`` (with ``a`` the ring's chunk ``(pos - t) mod n``):
    sends chunk ``pos`` (``s``); for t = 1..n-2 receives chunk a, adds its own and passes the sum
    on without keeping it (``rrs``); at t = n-1 receives chunk pos+1, the last contribution, keeps
    the sum and passes it on (``rrcs``): reduce-scatter done. Then it receives the finished chunks
    pos, pos-1, ..., keeping and forwarding each (``rcs``) but the last, chunk pos+2, which the
    next GPU already has (``r``). One thread block per ring: 2n - 1 steps, 2(n - 1) sends."""
    gpus = [Gpu(r, n * rings, 0, 0) for r in range(n)]
    for q in range(rings):
        order = list(range(n)) if q % 2 == 0 else [0, *range(n - 1, 0, -1)]
        for pos, r in enumerate(order):
            t = gpus[r].tb(order[(pos + 1) % n], order[(pos - 1) % n], q)

            def at(a: int, q: int = q) -> tuple[str, int]:  # the ring's chunk a (mod n) in the buffer
                return ("i", q * n + a % n)

            t.add("s", at(pos), at(pos))
            for k in range(1, n - 1):
                t.add("rrs", at(pos - k), at(pos - k))
            t.add("rrcs", at(pos + 1), at(pos + 1))
            for u in range(n - 2):
                t.add("rcs", at(pos - u), at(pos - u))
            t.add("r", at(pos + 2), at(pos + 2))
    return to_xml("ring_allreduce", "allreduce", proto, n * rings, gpus, inplace=True)


def _groups(r: int) -> tuple[int, int, int]:
    """On 4 GPUs in two groups {0, 1} and {2, 3}: (its place in its group, its partner in the group,
    its counterpart in the other group) of GPU ``r``."""
    group, side = divmod(r, 2)
    return side, 2 * group + 1 - side, 2 * (1 - group) + side


def hier_allreduce(chunks: int = 2, proto: str = "Simple") -> str:
    """Hierarchical AllReduce in place on 4 GPUs in two groups of two: (1) within a group each GPU
    sends its partner the half the partner owns, receives its own half into scratch and adds it
    (``re``); (2) each GPU exchanges its half with its counterpart in the other group, chunk by
    chunk, receiving and adding in place (``s`` then ``rrc``); (3) within the group each GPU sends
    its finished half to its partner and receives the other half in place.

    The buffer is 4 * ``chunks`` chunks, a half is K = 2 * ``chunks``. Thread blocks: 0 sends to
    the partner, 1 receives from it, 2 talks to the counterpart. Dependencies: the add waits for
    the scratch (1's first receive); the final receive overwrites the half 0 sent first, so it
    waits for that send; 0 sends the finished half once 2 has finished it."""
    K = 2 * chunks
    gpus = []
    for r in range(4):
        side, q, x = _groups(r)
        mine, theirs = side * K, (1 - side) * K
        g = Gpu(r, 4 * chunks, 0, K)
        to_q, from_q, cross = g.tb(send=q), g.tb(recv=q), g.tb(x, x)
        rs = to_q.add("s", ("i", theirs), ("s", 0), K)
        got = from_q.add("r", ("i", mine), ("s", 0), K)
        cross.add("re", ("s", 0), ("i", mine), K, [(from_q, got)])
        last = None
        for u in range(K):
            cross.add("s", ("i", mine + u), ("i", mine + u))
            last = cross.add("rrc", ("i", mine + u), ("i", mine + u))
        to_q.add("s", ("i", mine), ("i", mine), K, [(cross, last)])
        from_q.add("r", ("i", theirs), ("i", theirs), K, [(to_q, rs)])
        gpus.append(g)
    return to_xml("hier_allreduce", "allreduce", proto, 4 * chunks, gpus, inplace=True)


def hier_allgather(chunks: int = 2, proto: str = "Simple") -> str:
    """Hierarchical AllGather out of place on 4 GPUs in two groups of two: each GPU sends its
    block to its partner and to its counterpart in the other group; the partner's block, as it
    arrives, is kept and forwarded to the counterpart (``rcs``); from the counterpart come its
    own block and then its partner's. Chunk ``c`` of every block goes on channel ``c``, three
    thread blocks per channel (to the partner; from the partner and to the counterpart; from the
    counterpart), and one more copies the GPU's own block into its output."""
    C = chunks
    gpus = []
    for r in range(4):
        _, q, x = _groups(r)
        y = next(p for p in range(4) if p not in (r, q, x))  # the other group's GPU that is not the counterpart
        g = Gpu(r, C, 4 * C, 0)
        for c in range(C):
            g.tb(send=q, chan=c).add("s", ("i", c), ("o", r * C + c))
            fwd = g.tb(send=x, recv=q, chan=c)
            fwd.add("s", ("i", c), ("o", r * C + c))
            fwd.add("rcs", ("i", c), ("o", q * C + c))
            back = g.tb(recv=x, chan=c)
            back.add("r", ("i", c), ("o", x * C + c))
            back.add("r", ("i", c), ("o", y * C + c))
        g.tb().add("cpy", ("i", 0), ("o", r * C), C)
        gpus.append(g)
    return to_xml("hier_allgather", "allgather", proto, 4 * C, gpus, inplace=False)


ALGORITHMS = {
    "allpairs_allreduce": allpairs_allreduce,
    "allpairs_alltoall": allpairs_alltoall,
    "direct_allgather": direct_allgather,
    "ring_allreduce": ring_allreduce,
    "hier_allreduce": hier_allreduce,
    "hier_allgather": hier_allgather,
}
