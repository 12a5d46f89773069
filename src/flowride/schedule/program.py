"""A schedule lowered to what each GPU does: ordered steps on chunk-sized buffer slots.

This is the form a runtime executes, after the MSCCL algorithm model (msccl-tools' IR): each GPU
has an input buffer ``i``, an output buffer ``o`` and a scratch buffer ``s``, counted in chunks,
and a list of steps: ``s`` (send a slot to a peer), ``r`` (receive from a peer into a slot),
``rrc`` (receive, add a local slot, write a slot), ``cpy`` (local copy). Both the MSCCL XML
exporter (:mod:`flowride.schedule.msccl`) and the torch.distributed executor (:mod:`flowride.comm`)
read this form, so what is exported is what is run.

Lowering rules:

- switches disappear: a GPU -> switch -> ... -> GPU path becomes one GPU-to-GPU transfer (a
  runtime sees only GPUs); a switch's copies become one transfer per receiving GPU. Which arrival
  a switch forwards follows the simulator's rule (the i-th send out, by link, takes the i-th
  arrival, by link);
- store and forward: a GPU that relays a chunk it does not need receives it into scratch and sends
  it from there later; a chunk it needs goes straight to its output slot;
- reductions: the first partial a GPU receives for (block, chunk) is added to its own input
  contribution and written to an accumulator (scratch, or the output slot where the result
  belongs); later partials are added into that accumulator; the GPU sends the accumulator;
- buffer layout (C chunks per block, N ranks, blocks in rank order), as MSCCL lays them out:
  AllGather i[C], o[N*C]; AlltoAll i[N*C] (block for rank j at j*C), o[N*C] (from rank j at j*C);
  ReduceScatter i[N*C], o[C]; AllReduce i[N*C], o[N*C] (out of place).

Steps are ordered by epoch (receives that arrive by an epoch come before that epoch's sends);
each step lists the earlier steps of its GPU it must wait for: those that wrote a slot it reads or
writes, or read a slot it overwrites.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from flowride.collectives.demand import Collective
from flowride.errors import InvalidSchedule
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate

Slot = tuple[str, int]  # (buffer "i" | "o" | "s", chunk offset)


@dataclass(frozen=True)
class Transfer:
    """One GPU-to-GPU message: ``key`` = (source or block owner, chunk) as in the schedule."""

    tag: int
    src: int  # node id of the sending GPU
    dst: int  # node id of the receiving GPU
    key: tuple[int, int]
    send_epoch: int
    arrive_epoch: int
    reduce: bool
    links: tuple[int, ...]


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


def transfers(schedule: Schedule) -> list[Transfer]:
    """The schedule's GPU-to-GPU messages, switch hops folded into them."""
    topo, timing = schedule.topology, schedule.timing
    nodes, links = topo.nodes, topo.links
    # arrivals at each switch, per (key, switch, epoch), in link order: (in-link, origin)
    arrivals: dict[tuple, list[tuple[int, tuple[int, int, tuple[int, ...]]]]] = defaultdict(list)
    out_count: dict[tuple, int] = defaultdict(int)
    result: list[Transfer] = []
    order = sorted(schedule.sends, key=lambda s: (s.epoch, nodes[links[s.link].src].is_gpu, s.link))
    for s in order:
        lk = links[s.link]
        key = (s.source, s.chunk)
        if nodes[lk.src].is_gpu:
            origin = (lk.src, s.epoch, (s.link,))
        else:
            k = (key, lk.src, s.epoch, s.reduce)
            queue = sorted(arrivals.get(k, []))
            if not queue:
                raise InvalidSchedule("schedule", f"switch {lk.src} forwards {key} that never reaches it in epoch {s.epoch}", "verify the schedule with flowride verify")
            n = out_count[k]
            out_count[k] += 1
            _, (u, e0, path) = queue[n] if n < len(queue) else queue[0]
            origin = (u, e0, path + (s.link,))
        t = timing.arrival(s.link, s.epoch)
        if nodes[lk.dst].is_gpu:
            u, e0, path = origin
            result.append(Transfer(len(result), u, lk.dst, key, e0, t, s.reduce, path))
        else:
            arrivals[(key, lk.dst, t, s.reduce)].append((s.link, origin))
    return result


def _layout(coll: Collective, n: int, c: int) -> tuple[int, int]:
    if coll is Collective.ALLGATHER:
        return c, n * c
    if coll is Collective.REDUCESCATTER:
        return n * c, c
    return n * c, n * c


def lower(schedule: Schedule, check: bool = True) -> Program:
    """Per-GPU programs of a (verified) schedule."""
    if check:
        sim = simulate(schedule)
        if not sim.valid:
            raise InvalidSchedule("schedule", f"is invalid: {sim.first_violation}", "only verified schedules can be lowered; run flowride verify")
    topo = schedule.topology
    coll = schedule.collective
    gpus = list(topo.gpus)
    rank = {g: r for r, g in enumerate(gpus)}
    n, C = len(gpus), schedule.chunks
    if coll is Collective.ALLTOALL and n * n * C != n * n * schedule.demand.chunks:
        raise AssertionError("AlltoAll layout")
    i_chunks, o_chunks = _layout(coll, n, C)
    demand = schedule.demand
    needs = {(q.source, q.chunk, d) for q in demand.commodities for d in q.dests}

    def block_offset(key: tuple[int, int]) -> int:
        """Offset of (source/owner, chunk) in the block-ordered buffers."""
        s, c = key
        if coll is Collective.ALLTOALL:
            return rank[s] * C + c % C
        return rank[s] * C + c

    def input_slot(g: int, key: tuple[int, int]) -> Slot | None:
        s, c = key
        if coll is Collective.ALLGATHER:
            return ("i", c) if g == s else None
        if coll is Collective.ALLTOALL:
            return ("i", c) if g == s else None  # chunk index = dest rank * C + c
        return ("i", rank[s] * C + c)  # every GPU contributes to every block

    def final_slot(g: int, key: tuple[int, int]) -> Slot | None:
        """Where the collective's output for ``key`` lives on ``g``, if ``g`` needs it."""
        if (key[0], key[1], g) not in needs and not (coll.reduces and (coll is Collective.ALLREDUCE or key[0] == g)):
            return None
        if coll is Collective.REDUCESCATTER:
            return ("o", key[1])
        return ("o", block_offset(key))

    progs = [GpuProgram(r, g, i_chunks, o_chunks, 0) for r, g in enumerate(gpus)]
    moves = transfers(schedule)
    events: dict[int, list[tuple[tuple, str, Transfer]]] = defaultdict(list)
    for t in moves:
        events[t.src].append(((t.send_epoch, 1, t.tag), "send", t))
        events[t.dst].append(((t.arrive_epoch, 0, t.tag), "recv", t))
    for prog in progs:
        g = prog.node
        where: dict[tuple[int, int], Slot] = {}  # current home of each key's value on g
        scratch: dict[tuple[int, int], Slot] = {}
        steps: list[Step] = []

        def home(key: tuple[int, int], g: int = g, scratch: dict = scratch) -> Slot:
            """Slot to write a received value of ``key`` to: its output slot, else scratch."""
            slot = final_slot(g, key)
            if slot is None:
                if key not in scratch:
                    scratch[key] = ("s", len(scratch))
                slot = scratch[key]
            return slot

        # out-of-place collectives start with the GPU's own part copied to its output
        if coll in (Collective.ALLGATHER, Collective.ALLTOALL):
            for c in range(C):
                key = (g, c) if coll is Collective.ALLGATHER else (g, rank[g] * C + c)
                src = input_slot(g, key)
                steps.append(Step("cpy", -1, src, ("o", rank[g] * C + c), 0))
        for _, kind, t in sorted(events[g], key=lambda e: e[0]):
            key = t.key
            if kind == "send":
                src = where.get(key) or input_slot(g, key)
                if src is None:
                    raise InvalidSchedule("schedule", f"GPU {g} sends {key} it never holds", "verify the schedule")
                dst_home = None  # informational: the receiver decides
                steps.append(Step("s", rank[t.dst], src, dst_home, t.send_epoch, t.tag))
            elif t.reduce:
                acc = where.get(key)
                if acc is None:
                    dst = home(key) if not coll.reduces or coll is Collective.REDUCESCATTER else ("o", block_offset(key))
                    steps.append(Step("rrc", rank[t.src], input_slot(g, key), dst, t.arrive_epoch, t.tag))
                    where[key] = dst
                else:
                    steps.append(Step("rrc", rank[t.src], acc, acc, t.arrive_epoch, t.tag))
            else:
                dst = home(key) if not coll.reduces else ("o", block_offset(key))
                steps.append(Step("r", rank[t.src], None, dst, t.arrive_epoch, t.tag))
                where[key] = dst
        # a ReduceScatter owner (or AllReduce GPU) that received nothing still owes its output
        if coll.reduces:
            for q in demand.commodities:
                for d in q.dests if coll is Collective.ALLREDUCE else (q.source,):
                    if d == g and q_key(q) not in where:
                        steps.append(Step("cpy", -1, input_slot(g, q_key(q)), final_slot(g, q_key(q)), 0))
        prog.steps = steps
        prog.s_chunks = len(scratch)
        _add_deps(prog)
    return Program(schedule.meta.get("method") or "flowride", coll, C, progs, schedule.demand.chunk_bytes)


def q_key(q) -> tuple[int, int]:
    return (q.source, q.chunk)


def reads(step: Step) -> list[Slot]:
    if step.op in ("s", "cpy", "rrc") and step.src is not None:
        return [step.src]
    return []


def writes(step: Step) -> list[Slot]:
    if step.op in ("r", "rrc", "cpy") and step.dst is not None:
        return [step.dst]
    return []


def _add_deps(prog: GpuProgram) -> None:
    """Each step waits for earlier steps that wrote what it touches, or read what it overwrites."""
    last_write: dict[Slot, int] = {}
    reads_since: dict[Slot, list[int]] = defaultdict(list)
    for i, st in enumerate(prog.steps):
        deps: set[int] = set()
        for slot in reads(st):
            if slot in last_write:
                deps.add(last_write[slot])
        for slot in writes(st):
            if slot in last_write:
                deps.add(last_write[slot])
            deps.update(reads_since.get(slot, []))
        deps.discard(i)
        st.deps = sorted(deps)
        for slot in reads(st):
            reads_since[slot].append(i)
        for slot in writes(st):
            last_write[slot] = i
            reads_since[slot] = []


Content = tuple[tuple[int, int], int]  # ((source or block owner rank, chunk), contributions bitmask)


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


def check_program(prog: Program) -> list[str]:
    """Run every GPU's steps symbolically, in order, each receive waiting for its send; return
    what is wrong (empty when every output equals the collective's definition)."""
    problems: list[str] = []
    bufs = [initial_buffers(prog, g.rank) for g in prog.gpus]
    sent: dict[int, Content] = {}
    sender: dict[int, tuple[int, int]] = {}  # tag -> (sending rank, the peer it names)
    received: set[int] = set()
    pos = [0] * prog.ngpus
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
                if st.op in ("s", "cpy", "rrc") and val is None:
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
                        problems.append(f"{where}: counts the contribution of rank(s) {_ranks(m1 & m2)} to {k1} twice")
                        break
                    bufs[r][st.dst] = (k1, m1 | m2)
                pos[r] += 1
                progress = True
    if not problems:
        stuck = [f"rank {g.rank} at step {pos[g.rank]}" for g in prog.gpus if pos[g.rank] < len(g.steps)]
        if stuck:
            problems.append("deadlock: a receive waits for a send that never comes (" + ", ".join(stuck) + ")")
        for tag in sorted(set(sent) - received):
            problems.append(f"rank {sender[tag][0]} sends transfer {tag} to rank {sender[tag][1]}, which never receives it")
    if problems:
        return problems
    for g in prog.gpus:
        for slot, want in expected_outputs(prog, g.rank).items():
            got = bufs[g.rank].get(slot)
            if got != want:
                have = "nothing" if got is None else f"chunk {got[0]} with contributions of rank(s) {_ranks(got[1])}"
                problems.append(f"rank {g.rank} o[{slot[1]}] holds {have}; expected chunk {want[0]} with contributions of rank(s) {_ranks(want[1])}")
    return problems


def _ranks(mask: int) -> str:
    return ", ".join(str(i) for i in range(mask.bit_length()) if mask >> i & 1)
