"""What each GPU does: ordered steps on chunk-sized buffer slots, and the one set of rules about
them that every reader and writer of programs shares.

This is the form a runtime executes, after the MSCCL algorithm model (msccl-tools' IR): each GPU
has an input buffer ``i``, an output buffer ``o`` and a scratch buffer ``s``, counted in chunks,
and a list of steps: ``s`` (send a slot to a peer), ``r`` (receive from a peer into a slot),
``rrc`` (receive, add a local slot, write a slot), ``cpy`` (local copy). A step with ``cnt=k``
touches k consecutive slots (the executor runs such steps, and the hazard pass honours them;
export and the symbolic run take one chunk per step, and the MSCCL reader splits wider ones).
The lowering (:mod:`flowride.program.lower`), the MSCCL XML writer and reader (:mod:`flowride.program.msccl_write`, :mod:`flowride.program.msccl_read`) and the
torch.distributed executor (:mod:`flowride.comm`) all use this module's buffer layout, slot
accesses and hazard pass, so what is exported, what is read back and what is run agree by
construction rather than by three copies kept in step.

Buffer layout (C chunks per block, N ranks, blocks in rank order), as MSCCL lays them out:
AllGather i[C], o[N*C]; AlltoAll i[N*C] (block for rank j at j*C), o[N*C] (from rank j at j*C);
ReduceScatter i[N*C], o[C]; AllReduce i[N*C], o[N*C] (out of place).

Each step lists the earlier steps of its GPU it must wait for: those that wrote a slot it reads or
writes, or read a slot it overwrites (:func:`hazards`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from flowride.collectives.demand import Collective
from flowride.errors import InputError

Slot = tuple[str, int]  # (buffer "i" | "o" | "s", chunk offset)
Content = tuple[tuple[int, int], int]  # ((source or block owner rank, chunk), contributions bitmask)

BUF_NAMES = {"i": "input", "o": "output", "s": "scratch"}
PROGRAM_OPS = ("s", "r", "rrc", "cpy")
READS_SRC = frozenset({"s", "rrc", "cpy"})  # ops whose src is a local slot they read
WRITES_DST = frozenset({"r", "rrc", "cpy"})  # ops whose dst is a local slot they write


@dataclass
class Step:
    op: str  # "s" | "r" | "rrc" | "cpy"
    peer: int  # rank of the other GPU; -1 for cpy
    src: Slot | None  # s: the slot sent; rrc: the local slot added; cpy: the source
    dst: Slot | None  # r, rrc, cpy: the local slot written; s: where the receiver puts it
    epoch: int
    tag: int = -1  # the transfer a send/receive belongs to (send and receive share it)
    deps: list[int] = field(default_factory=list)  # indices of earlier steps of this GPU
    cnt: int = 1


@dataclass
class GpuProgram:
    rank: int
    node: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    steps: list[Step] = field(default_factory=list)


@dataclass
class Program:
    name: str
    collective: Collective
    chunks: int  # C: chunks per block
    gpus: list[GpuProgram]
    chunk_bytes: float = 0.0

    @property
    def ngpus(self) -> int:
        return len(self.gpus)

    @property
    def nchunksperloop(self) -> int:
        """Chunks the collective's per-rank buffer is cut into (MSCCL's unit of offsets)."""
        return self.ngpus * self.chunks


# ---------------------------------------------------------------------------------------------
# Layout


def buffer_layout(coll: Collective, n: int, c: int) -> tuple[int, int]:
    """(input chunks, output chunks) per rank of an out-of-place buffer, in MSCCL's units
    (nchunksperloop = n*c)."""
    if coll is Collective.ALLGATHER:
        return c, n * c
    if coll is Collective.REDUCESCATTER:
        return n * c, c
    return n * c, n * c


def inplace_alias(coll: Collective, rank: int, c: int, slot: Slot) -> Slot:
    """Where ``slot`` lives when the collective runs in place (sendbuff and recvbuff share memory,
    as NCCL lays them out): AllGather's input is its block of the output; ReduceScatter's output is
    its block of the input; AllReduce and AlltoAll share one buffer. Canonical names: AllGather
    'o', the others 'i'."""
    buf, off = slot
    if coll is Collective.ALLGATHER:
        return ("o", rank * c + off) if buf == "i" else slot
    if coll is Collective.REDUCESCATTER:
        return ("i", rank * c + off) if buf == "o" else slot
    return ("i", off) if buf == "o" else slot


def fmt_slot(slot: Slot | None) -> str:
    return "-" if slot is None else f"{slot[0]}[{slot[1]}]"


# ---------------------------------------------------------------------------------------------
# Slot accesses and hazards


def span(slot: Slot | None, cnt: int) -> list[Slot]:
    """The ``cnt`` consecutive slots starting at ``slot`` (none for no slot)."""
    return [] if slot is None else [(slot[0], slot[1] + j) for j in range(cnt)]


def reads(step: Step) -> list[Slot]:
    """The local slots ``step`` reads (its src, ``cnt`` of them, for s, rrc and cpy)."""
    return span(step.src, step.cnt) if step.op in READS_SRC else []


def writes(step: Step) -> list[Slot]:
    """The local slots ``step`` writes (its dst, ``cnt`` of them, for r, rrc and cpy)."""
    return span(step.dst, step.cnt) if step.op in WRITES_DST else []


def hazards(rw: list[tuple[list, list]]) -> list[set[int]]:
    """For items given as (read keys, written keys), in order: the earlier items each must wait
    for (it reads what they wrote, or writes what they wrote or read): read after write, write
    after write, write after read, the order any execution must keep."""
    last_write: dict = {}
    reads_since: dict = defaultdict(list)
    out: list[set[int]] = []
    for i, (rd, wr) in enumerate(rw):
        deps: set[int] = set()
        for x in rd:
            if x in last_write:
                deps.add(last_write[x])
        for x in wr:
            if x in last_write:
                deps.add(last_write[x])
            deps.update(reads_since.get(x, []))
        deps.discard(i)
        out.append(deps)
        for x in rd:
            reads_since[x].append(i)
        for x in wr:
            last_write[x] = i
            reads_since[x] = []
    return out


def slot_hazards(steps: list[Step]) -> list[set[int]]:
    """:func:`hazards` of a step list on the slots its steps read and write."""
    return hazards([(reads(st), writes(st)) for st in steps])


def step_deps(steps: list[Step]) -> list[set[int]]:
    """Data-hazard dependencies of a step list plus the earlier steps each declares."""
    deps = slot_hazards(steps)
    for i, st in enumerate(steps):
        deps[i].update(d for d in st.deps if 0 <= d < i)
    return deps


# ---------------------------------------------------------------------------------------------
# The collective's definition, symbolically


def initial_buffers(prog: Program, rank: int) -> dict[Slot, Content]:
    """What each input slot of ``rank`` holds before the collective, symbolically. Keys use ranks
    (not node ids) so programs read from MSCCL files can be checked the same way."""
    n, C = prog.ngpus, prog.chunks
    coll = prog.collective
    me = 1 << rank
    if coll is Collective.ALLGATHER:
        return {("i", c): ((rank, c), me) for c in range(C)}
    if coll is Collective.ALLTOALL:
        return {("i", k): ((rank, k), me) for k in range(n * C)}
    return {("i", b * C + c): ((b, c), me) for b in range(n) for c in range(C)}


def expected_outputs(prog: Program, rank: int) -> dict[Slot, Content]:
    """The collective's definition: what each output slot of ``rank`` must hold afterwards."""
    n, C = prog.ngpus, prog.chunks
    coll = prog.collective
    full = (1 << n) - 1
    if coll is Collective.ALLGATHER:
        return {("o", s * C + c): ((s, c), 1 << s) for s in range(n) for c in range(C)}
    if coll is Collective.ALLTOALL:
        return {("o", s * C + c): ((s, rank * C + c), 1 << s) for s in range(n) for c in range(C)}
    if coll is Collective.REDUCESCATTER:
        return {("o", c): ((rank, c), full) for c in range(C)}
    return {("o", b * C + c): ((b, c), full) for b in range(n) for c in range(C)}


def ranks_text(mask: int) -> str:
    return ", ".join(str(i) for i in range(mask.bit_length()) if mask >> i & 1)


# ---------------------------------------------------------------------------------------------
# Structure


def validate_program(program: Program) -> None:
    """Structure a Program must have before it can be exported or scheduled."""
    if not isinstance(program, Program):
        raise InputError("program", f"is a {type(program).__name__}, not a Program", "lower a schedule with flowride.program.lower")
    n = program.ngpus
    if n < 2:
        raise InputError("program", f"has {n} GPU(s)", "a collective needs at least two GPUs")
    if not isinstance(program.chunks, int) or program.chunks < 1:
        raise InputError("program.chunks", f"{program.chunks!r} is not a positive integer", "give chunks per block >= 1")
    sends: dict[int, tuple[int, int]] = {}
    recvs: dict[int, tuple[int, int]] = {}
    for r, g in enumerate(program.gpus):
        if g.rank != r:
            raise InputError(f"program.gpus[{r}].rank", f"is {g.rank}", "list the GPUs in rank order 0, 1, 2, ...")
        size = {"i": g.i_chunks, "o": g.o_chunks, "s": g.s_chunks}
        for i, st in enumerate(g.steps):
            where = f"program rank {r} step {i}"
            if st.op not in PROGRAM_OPS:
                raise InputError(f"{where}.op", f"{st.op!r} is not a program op", "use s, r, rrc or cpy")
            if st.cnt != 1:
                raise InputError(f"{where}.cnt", f"is {st.cnt}", "programs move one chunk per step; split the step")
            if st.op != "cpy" and not (0 <= st.peer < n and st.peer != r):
                raise InputError(f"{where}.peer", f"{st.peer} is not another rank of 0..{n - 1}", "name the GPU it sends to or receives from")
            need = (["src"] if st.op in READS_SRC else []) + (["dst"] if st.op in WRITES_DST else [])
            for attr in need:
                slot = getattr(st, attr)
                if slot is None or len(slot) != 2 or slot[0] not in size:
                    raise InputError(f"{where}.{attr}", f"{slot!r} is not a slot", "give (\"i\"|\"o\"|\"s\", offset)")
                if not (isinstance(slot[1], int) and 0 <= slot[1] < size[slot[0]]):
                    raise InputError(f"{where}.{attr}", f"{fmt_slot(slot)} is outside the {size[slot[0]]} {BUF_NAMES[slot[0]]} chunks", "keep offsets within the GPU's buffers")
            for d in st.deps:
                if not (isinstance(d, int) and 0 <= d < i):
                    raise InputError(f"{where}.deps", f"{d!r} is not an earlier step", "list indices of earlier steps of the same GPU")
            if st.op == "s":
                if st.tag in sends:
                    raise InputError(f"{where}.tag", f"transfer {st.tag} is sent twice", "give every transfer its own tag")
                sends[st.tag] = (r, i)
            elif st.op in ("r", "rrc"):
                if st.tag in recvs:
                    raise InputError(f"{where}.tag", f"transfer {st.tag} is received twice", "give every transfer its own tag")
                recvs[st.tag] = (r, i)
    for tag, (r, i) in sends.items():
        if tag not in recvs:
            raise InputError(f"program rank {r} step {i}.tag", f"transfer {tag} is sent but never received", "pair every send with a receive of the same tag")
        rr, j = recvs[tag]
        if program.gpus[r].steps[i].peer != rr or program.gpus[rr].steps[j].peer != r:
            raise InputError(f"program rank {r} step {i}.peer", f"transfer {tag} goes from rank {r} to rank {rr}, but the peers say otherwise", "make each side name the other")
    for tag, (r, i) in recvs.items():
        if tag not in sends:
            raise InputError(f"program rank {r} step {i}.tag", f"transfer {tag} is received but never sent", "pair every receive with a send of the same tag")


# ---------------------------------------------------------------------------------------------
# Symbolic execution


def run_program(prog: Program, inplace: bool = False, order: list | None = None) -> tuple[list[str], dict[int, Content]]:
    """Execute every GPU's steps symbolically, in order, each receive waiting for its send (one
    chunk per step). Returns (problems, content carried by each tag); problems is empty when every
    output equals the collective's definition. ``order`` receives the (rank, step) pairs in the
    order they ran. ``inplace``: input and output alias as :func:`inplace_alias` says (initial
    values and expected results are read through it)."""
    n, C, coll = prog.ngpus, prog.chunks, prog.collective

    def at(r: int, slot: Slot) -> Slot:
        return inplace_alias(coll, r, C, slot) if inplace else slot

    bufs = [{at(g.rank, k): v for k, v in initial_buffers(prog, g.rank).items()} for g in prog.gpus]
    sent: dict[int, Content] = {}
    sender: dict[int, tuple[int, int]] = {}  # tag -> (sending rank, the peer it names)
    received: set[int] = set()
    problems: list[str] = []
    pos = [0] * n
    progress = True
    while progress and not problems:
        progress = False
        for g in prog.gpus:
            r = g.rank
            while pos[r] < len(g.steps) and not problems:
                st = g.steps[pos[r]]
                where = f"rank {r} step {pos[r]} ({st.op})"
                if st.op in ("r", "rrc") and st.tag not in sent:
                    break
                val = bufs[r].get(st.src) if st.src is not None else None
                if st.op in READS_SRC and val is None:
                    problems.append(f"{where}: reads {st.src[0] if st.src else '?'}[{st.src[1] if st.src else '?'}] before anything is there")
                    break
                if st.op in ("r", "rrc"):
                    src_rank, names = sender[st.tag]
                    if st.peer != src_rank or names != r:
                        problems.append(f"{where}: transfer {st.tag} goes from rank {src_rank} to rank {names}, but this receive on rank {r} names peer {st.peer}")
                        break
                    received.add(st.tag)
                if st.op == "s":
                    if st.tag in sent:
                        problems.append(f"{where}: transfer {st.tag} is sent twice")
                        break
                    sent[st.tag] = val
                    sender[st.tag] = (r, st.peer)
                elif st.op == "cpy":
                    bufs[r][st.dst] = val
                elif st.op == "r":
                    bufs[r][st.dst] = sent[st.tag]
                elif st.op == "rrc":
                    (k1, m1), (k2, m2) = sent[st.tag], val
                    if k1 != k2:
                        problems.append(f"{where}: adds chunk {k1} to chunk {k2}")
                        break
                    if m1 & m2:
                        problems.append(f"{where}: counts the contribution of rank(s) {ranks_text(m1 & m2)} to {k1} twice")
                        break
                    bufs[r][st.dst] = (k1, m1 | m2)
                if order is not None:
                    order.append((r, pos[r]))
                pos[r] += 1
                progress = True
    if not problems:
        stuck = [f"rank {g.rank} at step {pos[g.rank]}" for g in prog.gpus if pos[g.rank] < len(g.steps)]
        if stuck:
            problems.append("deadlock: a receive waits for a send that never comes (" + ", ".join(stuck) + ")")
        for tag in sorted(set(sent) - received):
            problems.append(f"rank {sender[tag][0]} sends transfer {tag} to rank {sender[tag][1]}, which never receives it")
    if problems:
        return problems, sent
    for g in prog.gpus:
        for slot, want in expected_outputs(prog, g.rank).items():
            got = bufs[g.rank].get(at(g.rank, slot))
            if got != want:
                have = "nothing" if got is None else f"chunk {got[0]} with contributions of rank(s) {ranks_text(got[1])}"
                problems.append(f"rank {g.rank} {fmt_slot(at(g.rank, slot))} holds {have}; expected chunk {want[0]} with contributions of rank(s) {ranks_text(want[1])}")
    return problems, sent


def check_program(prog: Program) -> list[str]:
    """Run every GPU's steps symbolically, in order, each receive waiting for its send; return
    what is wrong (empty when every output equals the collective's definition)."""
    return run_program(prog)[0]
