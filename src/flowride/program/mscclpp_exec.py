"""A symbolic run of an MSCCL++ execution plan: every thread block of every GPU runs its ops in
order, waits block until a matching signal arrives, packet reads until the packets are written,
barriers until all their thread blocks arrive; the outputs must equal the collective's definition
(:func:`~flowride.program.model.expected_outputs`), chunk by chunk and contribution by
contribution.

Races are found with vector clocks: a thread block knows what happened before it through its
own earlier ops, the signals it waited for, the packets it read and the barriers it passed. A
read of a slot whose last write it does not know of, or a write over a slot another thread block
wrote or read unknown to it, is a race, whatever order the run happened to take. Each thread
block is taken as sequential: the ``nop`` its threads need between ops is a rule of
:mod:`flowride.program.mscclpp_rules`, not of this run.

The run also records, in the order it happened, where each chunk written came from
(:class:`Event`), which :mod:`flowride.program.mscclpp_read` turns into a flowride Program.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flowride.collectives.demand import Collective
from flowride.program.model import (
    Content,
    GpuProgram,
    Program,
    buffer_layout,
    expected_outputs,
    initial_buffers,
    inplace_alias,
    ranks_text,
)
from flowride.program.mscclpp_plan import WAITS, BufRef, Op, Plan, as_read

Loc = tuple[int, str, int]  # (rank, buffer, chunk)
MAX_THREAD_BLOCKS = 4096  # vector clocks grow with the square of the thread blocks
PACKET_SRC_FROM = {"ppkt": None, "rppkt": 0, "upkt": 0, "repkt": 1, "respkt": 1, "recpkt": 1, "recspkt": 1}
MODELLED = frozenset({"nop", "barrier", "signal", "wait", "rlxsignal", "rlxwait", "flush", "put", "pws", "pwsf", "get", "copy",
                      "re", "res", "rre", "rres", "ppkt", "rppkt", "cpkt", "upkt", "repkt", "respkt", "recpkt", "recspkt"})


@dataclass
class Event:
    """``target`` := the sum of ``sources`` (one source: a copy), done by ``rank``'s thread block."""

    rank: int
    target: Loc
    sources: list[Loc]


@dataclass
class ExecResult:
    problems: list[str]
    unmodelled: str = ""  # an op (or feature) the run does not model: nothing proven either way
    events: list[Event] = field(default_factory=list)
    ops: int = 0
    chunks_moved: int = 0  # chunks written into another GPU's memory or read from it


def plan_chunks(plan: Plan) -> int | None:
    """C, chunks per block in flowride's layout, from GPU 0's buffers (None if they do not fit
    one). An in-place plan may leave the buffer it never names at 0 chunks."""
    n, g = plan.ngpus, plan.gpus[0]
    coll = plan.collective
    if coll == "allgather":
        c = g.input_chunks or g.output_chunks // n
    elif coll == "reducescatter":
        c = g.output_chunks or g.input_chunks // n
    else:
        c = (g.input_chunks or g.output_chunks) // n
    if c < 1:
        return None
    want = {"allgather": (c, n * c), "reducescatter": (n * c, c)}.get(coll, (n * c, n * c))
    for gp in plan.gpus:
        for have, w in zip((gp.input_chunks, gp.output_chunks), want, strict=True):
            if have != w and not (plan.inplace and have == 0):
                return None
    return c


def stub_program(plan: Plan, c: int) -> Program:
    coll = Collective.parse(plan.collective)
    i, o = buffer_layout(coll, plan.ngpus, c)
    gp = [GpuProgram(g.id, g.id, i, o, g.scratch_chunks) for g in plan.gpus]
    return Program(plan.name, coll, c, gp)


class _Cell:
    __slots__ = ("value", "w", "reads")

    def __init__(self, value: Content | None = None) -> None:
        self.value = value
        self.w: tuple[int, int] | None = None  # (actor, its clock) of the last write
        self.reads: list[tuple[int, int]] = []


class _Blocked(Exception):
    pass


class _Wrong(Exception):
    pass


def _add(a: Content, b: Content, where: str) -> Content:
    (k1, m1), (k2, m2) = a, b
    if k1 != k2:
        raise _Wrong(f"{where}: adds chunk {k1} to chunk {k2}")
    if m1 & m2:
        raise _Wrong(f"{where}: counts the contribution of rank(s) {ranks_text(m1 & m2)} to {k1} twice")
    return (k1, m1 | m2)


def run_plan(plan: Plan) -> ExecResult:
    """Run ``plan`` symbolically (after :func:`~flowride.program.mscclpp_rules.check_rules` found
    nothing); returns the problems (empty when every output equals the collective's definition)
    and the events."""
    c = plan_chunks(plan)
    if c is None:
        return ExecResult([], unmodelled=f"the buffers of GPU 0 ({plan.gpus[0].input_chunks} input, {plan.gpus[0].output_chunks} output chunks) "
                           f"do not fit a {plan.collective} of {plan.ngpus} GPUs with the same chunks on every GPU")
    if sum(len(g.threadblocks) for g in plan.gpus) > MAX_THREAD_BLOCKS:
        return ExecResult([], unmodelled=f"{sum(len(g.threadblocks) for g in plan.gpus)} thread blocks in all, over the "
                                         f"{MAX_THREAD_BLOCKS} the symbolic run takes")
    found = unmodelled_features(plan)
    if found:
        return ExecResult([], unmodelled=found)
    return _Run(plan, c).go()


SWITCH_OPS = frozenset({"glres", "gstore", "gstorepkt"})
SEMAPHORE_OPS = frozenset({"sem_acquire", "sem_release"})


def unmodelled_features(plan: Plan) -> str:
    """What ``plan`` uses that flowride does not model, each feature named with where it first
    appears (empty when nothing): switch (NVLS) channels, thread block groups, ``pipeline`` ops,
    semaphores, ``reuse_resources`` with scratch (its scratch folded to a fixed size), reductions
    other than sum, and any other op the run does not model. One line, for a refusal."""
    first: dict[str, str] = {}

    def note(feature: str, where: str) -> None:
        first.setdefault(feature, where)

    nvls = "switch (NVLS) channels"
    if plan.extra.get("reuse_resources") and any(g.scratch_chunks for g in plan.gpus):
        note("reuse_resources with a scratch buffer (scratch folded to a fixed size)", "the plan")
    for g in plan.gpus:
        if g.switch_channels:
            note(nvls, f"GPU {g.id} channels")
        if g.semaphores:
            note("semaphores", f"GPU {g.id} semaphores")
        for tb in g.threadblocks:
            if any(t == "switch" for t, _ in tb.channels):
                note(nvls, f"GPU {g.id} thread block {tb.id} channels")
            for j, op in enumerate(tb.ops):
                w = f"GPU {g.id} thread block {tb.id} op {j}, {op.name}"
                if op.name in SWITCH_OPS or op.channel_type == "switch" or any("switch_channel_id" in r.extra for r in op.src + op.dst):
                    note(nvls, w)
                if "tbg_info" in op.extra:
                    note("thread block groups (tbg_info)", w)
                if op.name == "pipeline":
                    note("pipeline ops", w)
                if op.name in SEMAPHORE_OPS:
                    note("semaphores", w)
                if op.extra.get("reduce_op", "sum") != "sum":
                    note(f"reduce_op {op.extra.get('reduce_op')!r} (only sum is modelled)", w)
                if op.name not in MODELLED and not (op.name in SWITCH_OPS or op.name == "pipeline" or op.name in SEMAPHORE_OPS):
                    note(f"the {op.name} op", w)
    if not first:
        return ""
    return "uses " + "; ".join(f"{f} (first at {w})" for f, w in first.items()) + ", which flowride's symbolic run does not model"


class _Run:
    def __init__(self, plan: Plan, c: int) -> None:
        self.plan, self.c = plan, c
        self.stub = stub_program(plan, c)
        self.coll = self.stub.collective
        self.actors = [(g.id, k) for g in plan.gpus for k in range(len(g.threadblocks))]
        self.aid = {a: i for i, a in enumerate(self.actors)}
        na = len(self.actors)
        self.clock = [[0] * na for _ in range(na)]
        self.pos = [0] * na
        self.mem: dict[Loc, _Cell] = {}
        self.pkt: dict[Loc, _Cell] = {}
        for g in plan.gpus:
            for slot, v in initial_buffers(self.stub, g.id).items():
                self.mem[self.loc(g.id, slot[0], slot[1])] = _Cell(v)
        self.queues: dict[tuple, list[list[int]]] = {}
        self.barriers: dict[tuple[int, int], dict[int, list[int]]] = {}
        self.released: dict[int, list[int]] = {}
        self.res = ExecResult([])

    def loc(self, rank: int, buf: str, idx: int) -> Loc:
        if self.plan.inplace and buf != "s":
            b, i = inplace_alias(self.coll, rank, self.c, (buf, idx))
            return (rank, b, i)
        return (rank, buf, idx)

    # -- references -------------------------------------------------------------------------
    def ref(self, rank: int, tb, op: Op, r: BufRef, j: int) -> Loc:
        if not r.remote:
            return self.loc(rank, r.type, r.index + j)
        rb = self.plan.gpus[rank].remote_buffers[tb.buffer_list(op.channel_type)[r.buffer_id]]
        return self.loc(rb.rank, rb.type, r.index + j)

    def connection(self, rank: int, tb, op: Op, k: int, sending: bool) -> tuple:
        """The queue of signals a channel of ``op`` sends into (or waits on)."""
        g = self.plan.gpus[rank]
        idx = tb.channel_list(op.channel_type)[k]
        peers = g.peers(op.channel_type)
        peer = peers[idx]
        nth = peers[:idx].count(peer)
        return (rank, peer, op.channel_type, nth) if sending else (peer, rank, op.channel_type, nth)

    # -- memory with race checks ----------------------------------------------------------------
    def knows(self, a: int, stamp: tuple[int, int] | None) -> bool:
        return stamp is None or stamp[0] == a or self.clock[a][stamp[0]] >= stamp[1]

    def who(self, stamp: tuple[int, int]) -> str:
        r, t = self.actors[stamp[0]]
        return f"GPU {r} thread block {t}"

    def read(self, a: int, loc: Loc, packet: bool, where: str) -> Content:
        cell = (self.pkt if packet else self.mem).get(loc)
        if packet:
            if cell is None or cell.value is None:
                raise _Blocked
            self.merge(a, self.stampclock[cell.w])
        elif cell is None or cell.value is None:
            raise _Wrong(f"{where}: reads {loc[1]}[{loc[2]}] of GPU {loc[0]} before anything is there")
        elif not self.knows(a, cell.w):
            raise _Wrong(f"{where}: reads {loc[1]}[{loc[2]}] of GPU {loc[0]}, written by {self.who(cell.w)} with no wait, "
                         "barrier or packet flag ordering the two (a race)")
        cell.reads.append((a, self.clock[a][a]))
        return cell.value

    def write(self, a: int, loc: Loc, value: Content, packet: bool, where: str) -> None:
        space = self.pkt if packet else self.mem
        cell = space.setdefault(loc, _Cell())
        for st in ([cell.w] if cell.w else []) + cell.reads:
            if not self.knows(a, st):
                raise _Wrong(f"{where}: writes {loc[1]}[{loc[2]}] of GPU {loc[0]} while {self.who(st)} may still use it "
                             "(no wait, barrier or packet flag orders the two: a race)")
        cell.value, cell.w, cell.reads = value, (a, self.clock[a][a]), []
        if packet:
            self.stampclock[cell.w] = list(self.clock[a])

    def merge(self, a: int, other: list[int]) -> None:
        mine = self.clock[a]
        for i, v in enumerate(other):
            if v > mine[i]:
                mine[i] = v

    # -- one op ------------------------------------------------------------------------------
    def step(self, a: int) -> None:
        rank, t = self.actors[a]
        tb = self.plan.gpus[rank].threadblocks[t]
        op = tb.ops[self.pos[a]]
        where = f"GPU {rank} thread block {tb.id} op {self.pos[a]} ({op.name})"
        self.clock[a][a] += 1
        name = op.name
        if name in ("signal", "rlxsignal"):
            for k in range(len(op.channel_ids)):
                self.queues.setdefault(self.connection(rank, tb, op, op.channel_ids[k], True), []).append(list(self.clock[a]))
        elif name in WAITS:
            keys = [self.connection(rank, tb, op, op.channel_ids[k], False) for k in range(len(op.channel_ids))]
            if any(not self.queues.get(key) for key in keys):
                self.clock[a][a] -= 1
                raise _Blocked
            for key in keys:
                self.merge(a, self.queues[key].pop(0))
        elif name == "barrier":
            if a in self.released:
                self.merge(a, self.released.pop(a))
            else:
                self.clock[a][a] -= 1
                key = (rank, int(op.extra.get("barrier_id", 0)))
                room = self.barriers.setdefault(key, {})
                room[a] = self.clock[a]
                if len(room) >= int(op.extra.get("num_threadblocks", 1)):
                    merged = [max(v) for v in zip(*room.values(), strict=True)]
                    for b in room:
                        self.released[b] = merged
                    self.barriers[key] = {}
                raise _Blocked
        elif name not in ("nop", "flush"):
            try:
                self.data(a, rank, tb, op, where)
            except _Blocked:
                self.clock[a][a] -= 1
                raise
            if name in ("pws", "pwsf"):
                for k in range(len(op.channel_ids)):
                    self.queues.setdefault(self.connection(rank, tb, op, op.channel_ids[k], True), []).append(list(self.clock[a]))
        self.pos[a] += 1
        self.res.ops += 1

    def data(self, a: int, rank: int, tb, op: Op, where: str) -> None:
        """The op's data movement as MSCCL++'s kernel does it (``execution_kernel.hpp``, read at
        1f5f065d; docs/mscclpp.md lists each handler): ``put``/``pws``/``pwsf``/``ppkt`` give
        destination k the bytes of source entry k; ``rppkt`` sends source entry 0 to every
        destination; ``copy``/``upkt``/``cpkt`` move entry 0 only; ``get`` reads the peer at the
        *destination* entry's offset and writes locally at the *source* entry's."""
        name = op.name
        src, dst = op.src, op.dst
        if name == "get":  # handleGet: local(dst[i].type) + src[i].offset <- remote(src[i]) + dst[i].offset
            if len(dst) < len(src):
                raise _Wrong(f"{where}: get has {len(src)} src_buff entries and {len(dst)} dst_buff entries: MSCCL++'s kernel "
                             f"writes source entry k through dst_buff[k] (handleGet)")
            src, dst = as_read(op)
        elif name in ("put", "pws", "pwsf", "ppkt") and len(src) < len(dst):
            raise _Wrong(f"{where}: {name} has {len(dst)} destinations and {len(src)} src_buff entr{'y' if len(src) == 1 else 'ies'}: "
                         f"MSCCL++'s kernel gives destination k the bytes of src_buff[k] ({'handlePutPackets' if name == 'ppkt' else 'handlePut'}), "
                         f"so destination {len(src)} would get offset 0 and size 0 of it (wrong bytes, or no packets and a reader "
                         "that waits forever)")
        elif name in ("rppkt", "copy", "upkt", "cpkt"):
            src = src[:1]  # the kernel reads entry 0 only
            if name != "rppkt":
                dst = dst[:1]
        first = PACKET_SRC_FROM.get(name)
        port_pkt = name == "ppkt" and op.channel_type == "port"
        if port_pkt:
            first = 0
        size = (src[0] if src else dst[0]).size
        # packet reads first: a thread block spins on the flags before doing anything
        for j in range(size):
            for k, r in enumerate(src):
                if first is not None and k >= first:
                    cell = self.pkt.get(self.ref(rank, tb, op, r, j))
                    if cell is None or cell.value is None:
                        raise _Blocked
        for j in range(size):
            srcs = [self.ref(rank, tb, op, r, j) for r in src]
            dsts = [self.ref(rank, tb, op, r, j) for r in dst]
            vals = [self.read(a, s, first is not None and k >= first, where) for k, s in enumerate(srcs)]
            for s in srcs:
                if s[0] != rank:
                    self.res.chunks_moved += 1
            if name in ("put", "pws", "pwsf", "ppkt", "rppkt", "copy", "get", "upkt", "cpkt"):
                pk = name in ("ppkt", "rppkt", "cpkt")
                for k, d in enumerate(dsts):
                    one = 0 if name == "rppkt" else k
                    self.emit(a, rank, d, [srcs[one]], vals[one], pk, where)
            else:  # reductions: dst[0] := the sum of the sources; the rest get copies of it
                total = vals[0]
                for v in vals[1:]:
                    total = _add(total, v, where)
                self.emit(a, rank, dsts[0], srcs, total, False, where)
                rest = dsts[1:]
                if name in ("recpkt", "recspkt"):
                    self.emit(a, rank, rest[0], [dsts[0]], total, True, where)
                    rest = rest[1:]
                for d in rest:
                    self.emit(a, rank, d, [dsts[0]], total, name in ("respkt", "recspkt"), where)

    def emit(self, a: int, rank: int, target: Loc, sources: list[Loc], value: Content, packet: bool, where: str) -> None:
        self.write(a, target, value, packet, where)
        if target[0] != rank:
            self.res.chunks_moved += 1
        self.res.events.append(Event(rank, target, sources))

    # -- the whole run ---------------------------------------------------------------------
    def go(self) -> ExecResult:
        self.stampclock: dict[tuple[int, int], list[int]] = {}
        plan = self.plan
        ops = [plan.gpus[r].threadblocks[t].ops for r, t in self.actors]
        try:
            progress = True
            while progress:
                progress = False
                for a in range(len(self.actors)):
                    while self.pos[a] < len(ops[a]):
                        try:
                            self.step(a)
                        except _Blocked:
                            if a in self.released:  # a barrier this thread block just completed
                                continue
                            break
                        progress = True
                    if a in self.released:
                        progress = True
        except _Wrong as e:
            self.res.problems.append(str(e))
            return self.res
        except (IndexError, KeyError, TypeError) as e:
            self.res.problems.append(f"a reference the rules should have caught does not resolve ({type(e).__name__}: {e})")
            return self.res
        stuck = [f"GPU {r} thread block {plan.gpus[r].threadblocks[t].id} at op {self.pos[a]} ({ops[a][self.pos[a]].name})"
                 for a, (r, t) in enumerate(self.actors) if self.pos[a] < len(ops[a])]
        if stuck:
            self.res.problems.append("deadlock: " + ", ".join(stuck[:6]) + (f" and {len(stuck) - 6} more" if len(stuck) > 6 else "")
                                     + " wait for what never comes")
            return self.res
        for key, q in self.queues.items():
            if q:
                self.res.problems.append(f"GPU {key[0]} signals GPU {key[1]} ({key[2]} channel) {len(q)} time(s) that no wait consumes")
        for g in plan.gpus:
            for slot, want in expected_outputs(self.stub, g.id).items():
                loc = self.loc(g.id, slot[0], slot[1])
                cell = self.mem.get(loc)
                got = None if cell is None else cell.value
                if got != want:
                    have = "nothing" if got is None else f"chunk {got[0]} with contributions of rank(s) {ranks_text(got[1])}"
                    self.res.problems.append(f"GPU {g.id} {loc[1]}[{loc[2]}] holds {have}; expected chunk {want[0]} "
                                             f"with contributions of rank(s) {ranks_text(want[1])}")
        return self.res
