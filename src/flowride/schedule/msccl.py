"""MSCCL algorithm XML: export per-GPU programs, import any MSCCL algorithm, verify it.

- :func:`to_msccl_xml` / :func:`write_msccl` write a :class:`~flowride.schedule.program.Program`
  as the XML the MSCCL executor (Azure/msccl-executor-nccl, ``src/misc/msccl/msccl_parser.cc``)
  loads, within every limit its parser and kernel impose (see ``docs/msccl.md``).
- :func:`from_msccl_xml` / :func:`read_msccl` read any MSCCL algorithm (ours or msccl-tools') back
  into a Program, executing it the way the executor would (thread blocks, dependency flags,
  per-connection FIFO matching) to find a valid order, and rejecting races and deadlocks.
- :func:`program_to_schedule` turns a Program into a flowride schedule on a full mesh, so the
  independent simulator can verify any MSCCL algorithm (``flowride verify algo.xml``).

Executor semantics followed here: a step ``s`` sends a local slot; ``r`` receives into a local
slot; ``rrc`` writes local dst = local src + received; ``rcs`` receives into dst and forwards it;
``rrs`` sends local src + received without storing it; ``rrcs`` is ``rrc`` then a send of dst;
``cpy`` copies locally; ``re`` (local dst += src) has no counterpart in the Program model and is
read only where it adds a chunk just received (as one ``rrc``); ``nop`` only carries a dependency
for the step after it. Offsets count chunks of ``count * sizeMultiplier / nchunksperloop``
elements.
"""

from __future__ import annotations

import heapq
import re
import weakref
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from flowride.collectives.demand import Collective
from flowride.errors import InputError, InvalidSchedule
from flowride.files import write_text_atomic
from flowride.schedule.ir import Schedule, Send
from flowride.schedule.program import (
    Content,
    GpuProgram,
    Program,
    Slot,
    Step,
    check_program,
    expected_outputs,
    initial_buffers,
    reads,
    writes,
)

# Limits of the executor (msccl_struct.h, msccl_parser.h, msccl_kernel.cu).
MAX_STEPS_PER_TB = 64  # MSCCL_MAX_NUM_STEPS: bound on a step's ``s``
MAX_TBS_PER_CHANNEL = 32  # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL, counted for send and recv peers
MAX_CHANNELS = 32  # MAXCHANNELS of NCCL
MAX_TBS = MAX_TBS_PER_CHANNEL * MAX_CHANNELS  # MSCCL_MAX_NUM_THREAD_BLOCKS
MAX_COUNT = 72  # MSCCL_MAX_COUNT: cnt must stay below it
MAX_DEP_TB = 127  # dependentBid is an int8_t
MAX_OFFSET = 32767  # srcOffset / dstOffset are int16_t
MAX_NODES = 4096  # XML elements the parser keeps per rank: algo, every gpu, own tbs and steps
MAX_NAME = 128  # attribute values are read into 255-byte buffers without a bound check

COLLS = {c.value: c for c in Collective}
OTHER_COLLS = ("reduce", "broadcast", "send", "recv", "gather", "scatter", "alltoallv")
PROTOS = ("Simple", "LL128", "LL")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")
SEND_TYPES = frozenset({"s", "rcs", "rrs", "rrcs"})
RECV_TYPES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
STEP_TYPES = SEND_TYPES | RECV_TYPES | {"cpy", "re", "nop"}
# local slots each step type reads (src) and writes (dst); the other field is informational
LOCAL_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
LOCAL_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})
# the fields the executor bounds-checks (checkSrc / checkDst in msccl_parser.cc)
CHECKED_SRC = frozenset({"s", "rrs", "rrcs", "cpy", "re"})
CHECKED_DST = frozenset({"r", "rcs", "rrcs", "cpy", "re"})
BUF_NAMES = {"i": "input", "o": "output", "s": "scratch"}


def _layout(coll: Collective, n: int, c: int) -> tuple[int, int]:
    """(input, output) chunks of an out-of-place buffer, in MSCCL's units (nchunksperloop = n*c)."""
    if coll is Collective.ALLGATHER:
        return c, n * c
    if coll is Collective.REDUCESCATTER:
        return n * c, c
    return n * c, n * c


def _alias(coll: Collective, rank: int, c: int, slot: Slot) -> Slot:
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


def _fmt(slot: Slot | None) -> str:
    return "-" if slot is None else f"{slot[0]}[{slot[1]}]"


# ---------------------------------------------------------------------------------------------
# Symbolic execution (the semantics of check_program, with the contents each transfer carries)


def _run(prog: Program, inplace: bool = False, order: list | None = None) -> tuple[list[str], dict[int, Content]]:
    """Execute every GPU's steps symbolically, in order, each receive waiting for its send.
    Returns (problems, content carried by each tag); ``order`` receives the (rank, step) pairs in
    the order they ran. ``inplace``: input and output alias as :func:`_alias` says (initial
    values and expected results are read through it)."""
    n, C, coll = prog.ngpus, prog.chunks, prog.collective

    def at(r: int, slot: Slot) -> Slot:
        return _alias(coll, r, C, slot) if inplace else slot

    bufs = [{at(g.rank, k): v for k, v in initial_buffers(prog, g.rank).items()} for g in prog.gpus]
    sent: dict[int, Content] = {}
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
                if st.op in ("s", "cpy", "rrc") and val is None:
                    problems.append(f"{where}: reads {_fmt(st.src)} before anything is there")
                    break
                if st.op == "s":
                    if st.tag in sent:
                        problems.append(f"{where}: transfer {st.tag} is sent twice")
                        break
                    sent[st.tag] = val
                elif st.op == "cpy":
                    bufs[r][st.dst] = val
                elif st.op == "r":
                    bufs[r][st.dst] = sent[st.tag]
                else:
                    (k1, m1), (k2, m2) = sent[st.tag], val
                    if k1 != k2:
                        problems.append(f"{where}: adds chunk {k1} to chunk {k2}")
                        break
                    if m1 & m2:
                        problems.append(f"{where}: counts the contribution of rank(s) {_ranks(m1 & m2)} to {k1} twice")
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
    if problems:
        return problems, sent
    for g in prog.gpus:
        for slot, want in expected_outputs(prog, g.rank).items():
            got = bufs[g.rank].get(at(g.rank, slot))
            if got != want:
                have = "nothing" if got is None else f"chunk {got[0]} with contributions of rank(s) {_ranks(got[1])}"
                problems.append(f"rank {g.rank} {_fmt(at(g.rank, slot))} holds {have}; expected chunk {want[0]} with contributions of rank(s) {_ranks(want[1])}")
    return problems, sent


def _ranks(mask: int) -> str:
    return ", ".join(str(i) for i in range(mask.bit_length()) if mask >> i & 1)


def _hazards(rw: list[tuple[list, list]]) -> list[set[int]]:
    """For items given as (read keys, written keys), in order: the earlier items each must wait
    for (it reads what they wrote, or writes what they wrote or read)."""
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


def _slot_deps(steps: list[Step]) -> list[set[int]]:
    """Data-hazard dependencies of a step list plus the ones it declares."""
    deps = _hazards([(reads(st), writes(st)) for st in steps])
    for i, st in enumerate(steps):
        deps[i].update(d for d in st.deps if 0 <= d < i)
    return deps


# ---------------------------------------------------------------------------------------------
# Validation of a Program


def _validate_program(program: Program) -> None:
    """Structure a Program must have before it can be exported or scheduled."""
    if not isinstance(program, Program):
        raise InputError("program", f"is a {type(program).__name__}, not a Program", "lower a schedule with flowride.schedule.program.lower")
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
            if st.op not in ("s", "r", "rrc", "cpy"):
                raise InputError(f"{where}.op", f"{st.op!r} is not a program op", "use s, r, rrc or cpy")
            if st.cnt != 1:
                raise InputError(f"{where}.cnt", f"is {st.cnt}", "programs move one chunk per step; split the step")
            if st.op != "cpy" and not (0 <= st.peer < n and st.peer != r):
                raise InputError(f"{where}.peer", f"{st.peer} is not another rank of 0..{n - 1}", "name the GPU it sends to or receives from")
            need = (["src"] if st.op in ("s", "rrc", "cpy") else []) + (["dst"] if st.op in ("r", "rrc", "cpy") else [])
            for attr in need:
                slot = getattr(st, attr)
                if slot is None or len(slot) != 2 or slot[0] not in size:
                    raise InputError(f"{where}.{attr}", f"{slot!r} is not a slot", "give (\"i\"|\"o\"|\"s\", offset)")
                if not (isinstance(slot[1], int) and 0 <= slot[1] < size[slot[0]]):
                    raise InputError(f"{where}.{attr}", f"{_fmt(slot)} is outside the {size[slot[0]]} {BUF_NAMES[slot[0]]} chunks", "keep offsets within the GPU's buffers")
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
# Export


@dataclass
class _Tb:
    kind: str  # "send" | "recv" | "local"
    peer: int
    block: int
    chan: int = 0
    steps: list[int] = field(default_factory=list)  # program step indices, in order
    id: int = -1
    xml: list[dict] = field(default_factory=list)


def _inplace_program(program: Program) -> Program:
    """The program with input and output aliased as an in-place MSCCL algorithm has them, its
    now redundant local copies removed, and receives that would overwrite an input still to be
    sent moved after those sends. Raises when a copy remains or the result is wrong."""
    coll, C = program.collective, program.chunks
    li, lo = _layout(coll, program.ngpus, C)
    gpus = []
    for g in program.gpus:
        r = g.rank

        def al(slot, rank=r):
            return None if slot is None else _alias(coll, rank, C, slot)

        items = []  # (aliased step, original src, original dst, original index)
        for i, st in enumerate(g.steps):
            src = al(st.src)
            dst = al(st.dst, st.peer) if st.op == "s" else al(st.dst)
            if st.op == "cpy":
                if src == dst:
                    continue
                raise InputError(
                    "unfused",
                    f"rank {r} step {i} copies {_fmt(st.src)} to {_fmt(st.dst)}, a local copy that the in-place layout does not make redundant, and unfused output has no cpy",
                    "export without unfused (cpy steps are then written)",
                )
            items.append([replace(st, src=src, dst=dst, deps=[]), st.src, st.dst if st.op != "s" else None, i])
        # original dependencies (on the original slots), by original index
        orig = _slot_deps(g.steps)
        for _ in range(len(items) + 1):
            moved = False
            for p, (st, _osrc, odst, oi) in enumerate(items):
                if not writes(st):
                    continue
                x = writes(st)[0]
                later = [q for q in range(p + 1, len(items)) if items[q][0].src == x and items[q][1] != odst and items[q][0].op in ("s", "rrc", "cpy")]
                if not later:
                    continue
                q = max(later)
                # W may move past the steps in (p, q] only if none of them depends on it
                blocked, reach = False, {oi}
                for k in range(p + 1, q + 1):
                    if orig[items[k][3]] & reach:
                        blocked = True
                        break
                if blocked:
                    raise InputError(
                        "unfused",
                        f"rank {r}: in place, step {oi} ({st.op}) would overwrite {_fmt(x)} before it is read as input",
                        "export without unfused (the out-of-place algorithm is written)",
                    )
                items.insert(q, items.pop(p))
                moved = True
                break
            if not moved:
                break
        steps = [it[0] for it in items]
        index = {it[3]: k for k, it in enumerate(items)}
        for k, it in enumerate(items):
            steps[k].deps = sorted(index[d] for d in g.steps[it[3]].deps if d in index and index[d] < k)
        deps = _slot_deps(steps)
        for k, st in enumerate(steps):
            st.deps = sorted(deps[k])
        i_chunks, o_chunks = (0, lo) if coll is Collective.ALLGATHER else (li, 0)
        gpus.append(GpuProgram(r, g.node, i_chunks, o_chunks, g.s_chunks, steps))
    out = Program(program.name, coll, C, gpus, program.chunk_bytes)
    problems, _ = _run(out, inplace=True)
    if problems:
        raise InputError("unfused", f"the in-place form of the program is wrong: {problems[0]}", "export without unfused (the out-of-place algorithm is written)")
    return out


def _split(items: list, costs: list[tuple[int, ...]], limit: int) -> list[list]:
    """Cut ``items`` into consecutive blocks whose summed costs (per side) stay within ``limit``."""
    blocks: list[list] = []
    cur: list = []
    tot = None
    for it, cost in zip(items, costs, strict=True):
        if tot is not None and any(t + c > limit for t, c in zip(tot, cost, strict=True)):
            blocks.append(cur)
            cur, tot = [], None
        cur.append(it)
        tot = list(cost) if tot is None else [t + c for t, c in zip(tot, cost, strict=True)]
    if cur:
        blocks.append(cur)
    return blocks


def _build(prog: Program, max_steps: int, max_tbs_ch: int) -> tuple[list[list[_Tb]], int]:
    """Thread blocks of every GPU, with channels, dependencies and nops; and nchannels."""
    n = prog.ngpus
    steps = [g.steps for g in prog.gpus]
    deps = [_slot_deps(s) for s in steps]
    send_at: dict[int, tuple[int, int]] = {}
    recv_at: dict[int, tuple[int, int]] = {}
    for r in range(n):
        for i, st in enumerate(steps[r]):
            if st.op == "s":
                send_at[st.tag] = (r, i)
            elif st.op in ("r", "rrc"):
                recv_at[st.tag] = (r, i)

    def cost(r: int, i: int) -> int:
        """Steps an XML step may take with its nops (every dependency on another thread block)."""
        return max(1, len(deps[r][i]))

    for r in range(n):
        for i in range(len(steps[r])):
            if cost(r, i) > max_steps:
                raise InputError("max_steps_per_tb", f"rank {r} step {i} waits for {len(deps[r][i])} earlier steps, more than {max_steps} steps of a thread block can carry", "raise max_steps_per_tb (up to 64)")
    tbs: list[list[_Tb]] = [[] for _ in range(n)]
    # connections: one FIFO order of transfers for both sides, the receiver's order of receives
    # as far as what each side's steps wait for (directly or not) allows
    anc: list[list[int]] = []
    for r in range(n):
        bits: list[int] = []
        for i in range(len(steps[r])):
            x = 0
            for d in deps[r][i]:
                x |= bits[d] | (1 << d)
            bits.append(x)
        anc.append(bits)
    conns: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b in range(n):
        for st in steps[b]:
            if st.op in ("r", "rrc"):
                conns[(st.peer, b)].append(st.tag)
    for (a, b), tags in conns.items():
        sa = {t: send_at[t][1] for t in tags}
        ra = {t: recv_at[t][1] for t in tags}
        before = {t: {u for u in tags if u != t and (anc[a][sa[t]] >> sa[u] & 1 or anc[b][ra[t]] >> ra[u] & 1)} for t in tags}
        rank_of = {t: k for k, t in enumerate(tags)}
        left = {t: len(before[t]) for t in tags}
        after: dict[int, list[int]] = defaultdict(list)
        for t in tags:
            for u in before[t]:
                after[u].append(t)
        heap = [(rank_of[t], t) for t in tags if not left[t]]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            _, t = heapq.heappop(heap)
            order.append(t)
            for v in after[t]:
                left[v] -= 1
                if not left[v]:
                    heapq.heappush(heap, (rank_of[v], v))
        if len(order) < len(tags):
            raise InputError("program", f"the transfers from rank {a} to rank {b} have no order both ranks can keep", "fix the step dependencies")
        conns[(a, b)] = order
    send_count: dict[tuple[int, int], int] = defaultdict(int)
    recv_count: dict[tuple[int, int], int] = defaultdict(int)
    nchannels = 1
    for (a, b) in sorted(conns):
        tags = conns[(a, b)]
        costs = [(cost(*send_at[t]), cost(*recv_at[t])) for t in tags]
        blocks = _split(tags, costs, max_steps)
        chan = -1
        for k, block in enumerate(blocks):
            chan += 1
            while send_count[(a, chan)] >= max_tbs_ch or recv_count[(b, chan)] >= max_tbs_ch:
                chan += 1
            if chan >= MAX_CHANNELS:
                raise InputError("program", f"the transfers from rank {a} to rank {b} need more than {MAX_CHANNELS} channels", "raise max_steps_per_tb / max_tbs_per_channel, or use fewer chunks")
            send_count[(a, chan)] += 1
            recv_count[(b, chan)] += 1
            nchannels = max(nchannels, chan + 1)
            tbs[a].append(_Tb("send", b, k, chan, [send_at[t][1] for t in block]))
            tbs[b].append(_Tb("recv", a, k, chan, [recv_at[t][1] for t in block]))
    for r in range(n):
        local = [i for i, st in enumerate(steps[r]) if st.op == "cpy"]
        for k, block in enumerate(_split(local, [(cost(r, i),) for i in local], max_steps)):
            tbs[r].append(_Tb("local", -1, k, 0, block))
    for r in range(n):
        _wire(r, tbs[r], deps[r], steps[r], max_steps)
    return tbs, nchannels


def _wire(r: int, tbs: list[_Tb], deps: list[set[int]], steps: list[Step], max_steps: int) -> None:
    """Give the thread blocks of rank ``r`` ids, turn step dependencies into (tb, s) with nops,
    and mark the steps waited on."""
    home: dict[int, tuple[_Tb, int]] = {}
    for tb in tbs:
        for p, i in enumerate(tb.steps):
            home[i] = (tb, p)
    # per step: the (tb, position) it waits for, one per other thread block, the latest
    waits: dict[int, list[tuple[_Tb, int]]] = {}
    for tb in tbs:
        seen: dict[int, int] = {}
        for p, i in enumerate(tb.steps):
            latest: dict[int, tuple[_Tb, int]] = {}
            for d in deps[i]:
                t2, p2 = home[d]
                if t2 is tb:
                    if p2 >= p:
                        raise InputError("program", f"rank {r} step {i} must wait for step {d}, which its thread block runs later", "report this as a bug")
                    continue
                if id(t2) not in latest or latest[id(t2)][1] < p2:
                    latest[id(t2)] = (t2, p2)
            need = [(t2, p2) for t2, p2 in latest.values() if seen.get(id(t2), -1) < p2]
            for t2, p2 in need:
                seen[id(t2)] = p2
            waits[i] = need
    # ids: thread blocks others wait on first, so dependency ids fit the executor's int8
    waited = {id(t2) for need in waits.values() for t2, _ in need}
    order = {"local": 0, "recv": 1, "send": 2}
    tbs.sort(key=lambda t: (id(t) not in waited, order[t.kind], t.peer, t.block))
    for k, tb in enumerate(tbs):
        tb.id = k
        if id(tb) in waited and k > MAX_DEP_TB:
            raise InputError("program", f"rank {r} needs {k + 1} thread blocks others wait on; the executor stores dependency ids in 8 bits (at most {MAX_DEP_TB + 1})", "use fewer chunks or a smaller topology")
    if len(tbs) > MAX_TBS:
        raise InputError("program", f"rank {r} needs {len(tbs)} thread blocks, more than the executor's {MAX_TBS}", "use fewer chunks")
    # final step numbers, nops included
    index: dict[int, int] = {}
    for tb in tbs:
        s = 0
        for i in tb.steps:
            s += max(0, len(waits[i]) - 1)
            index[i] = s
            s += 1
        if s > max_steps:
            raise InputError("program", f"rank {r} thread block {tb.id} has {s} steps", "report this as a bug")
    hasdep = {i2 for need in waits.values() for t2, p2 in need for i2 in [t2.steps[p2]]}
    for tb in tbs:
        for i in tb.steps:
            st = steps[i]
            need = sorted(waits[i], key=lambda w: (w[0].id, w[1]))
            for t2, p2 in need[:-1]:
                tb.xml.append(_xstep("nop", _NONE_SRC, _NONE_DST, (t2.id, index[t2.steps[p2]]), False))
            dep = (need[-1][0].id, index[need[-1][0].steps[need[-1][1]]]) if need else None
            tb.xml.append(_xstep(st.op, st.src or _NONE_SRC, st.dst or _NONE_DST, dep, i in hasdep))


_NONE_SRC: Slot = ("i", -1)
_NONE_DST: Slot = ("o", -1)


def _xstep(kind: str, src: Slot, dst: Slot, dep: tuple[int, int] | None, hasdep: bool) -> dict:
    return {"type": kind, "src": src, "dst": dst, "dep": dep, "hasdep": hasdep}


def _fill_informational(prog: Program) -> Program:
    """A copy whose sends name the receiver's slot and receives the sender's (as msccl-tools
    writes them); the executor reads neither."""
    src_of: dict[int, Slot] = {}
    dst_of: dict[int, Slot] = {}
    for g in prog.gpus:
        for st in g.steps:
            if st.op == "s":
                src_of[st.tag] = st.src
            elif st.op in ("r", "rrc"):
                dst_of[st.tag] = st.dst
    gpus = []
    for g in prog.gpus:
        steps = []
        for st in g.steps:
            if st.op == "s":
                st = replace(st, dst=dst_of[st.tag])
            elif st.op == "r":
                st = replace(st, src=src_of[st.tag])
            steps.append(st)
        gpus.append(replace(g, steps=steps))
    return replace(prog, gpus=gpus)


def _clean_name(name: str) -> str:
    text = re.sub(r"[^A-Za-z0-9_.+-]+", "_", str(name)).strip("_") or "flowride"
    return text[:MAX_NAME]


def to_msccl_xml(
    program: Program,
    *,
    name: str | None = None,
    proto: str = "Simple",
    unfused: bool = False,
    max_steps_per_tb: int = MAX_STEPS_PER_TB,
    max_tbs_per_channel: int = MAX_TBS_PER_CHANNEL,
    min_bytes: int = 0,
    max_bytes: int = 0,
) -> str:
    """The program as an MSCCL algorithm XML the executor loads.

    Out of place by default (``inplace="0" outofplace="1"``), with ``cpy`` steps for local copies.
    ``unfused=True`` writes only s/r/rrc/nop (what ASTRA-sim's converter reads): the algorithm is
    then written in place (``inplace="1" outofplace="0"``), which makes the local copies
    redundant; a program whose in-place form would still need a copy, or would be wrong, is
    refused. Each step moves one chunk (cnt="1"); receives and sends are never fused into
    rcs/rrcs in either mode. ``min_bytes``/``max_bytes`` set the sizes the executor picks the
    algorithm for (0 = no upper limit). The written XML is read back (deadlocks and races
    rejected) and checked symbolically before it is returned."""
    if proto not in PROTOS:
        raise InputError("proto", f"{proto!r} is not an MSCCL protocol", f"choose one of {', '.join(PROTOS)}")
    for flag, v, hi in (("max_steps_per_tb", max_steps_per_tb, MAX_STEPS_PER_TB), ("max_tbs_per_channel", max_tbs_per_channel, MAX_TBS_PER_CHANNEL)):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= hi:
            raise InputError(flag, f"{v!r} is not an integer in 1..{hi}", f"the executor allows at most {hi}")
    for flag, v in (("min_bytes", min_bytes), ("max_bytes", max_bytes)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InputError(flag, f"{v!r} is not a non-negative integer", "give bytes (max_bytes 0 = no upper limit)")
    if max_bytes and max_bytes < min_bytes:
        raise InputError("max_bytes", f"{max_bytes} is below min_bytes {min_bytes}", "give max_bytes >= min_bytes, or 0 for no limit")
    _validate_program(program)
    problems = check_program(program)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise InputError("program", f"is wrong: {problems[0]}{more}", "export only programs lowered from verified schedules")
    n, C, coll = program.ngpus, program.chunks, program.collective
    if n * C > MAX_OFFSET:
        raise InputError("program", f"{n * C} chunks per loop exceed the executor's 16-bit offsets", "use fewer chunks")
    prog = _inplace_program(program) if unfused else program
    prog = _fill_informational(prog)
    for g in prog.gpus:
        if g.s_chunks > MAX_OFFSET:
            raise InputError("program", f"rank {g.rank} needs {g.s_chunks} scratch chunks, beyond the executor's 16-bit offsets", "use fewer chunks")
    tbs, nchannels = _build(prog, max_steps_per_tb, max_tbs_per_channel)
    for r, gt in enumerate(tbs):
        nodes = 1 + n + len(gt) + sum(len(t.xml) for t in gt)
        if nodes >= MAX_NODES:
            raise InputError("program", f"rank {r} needs {nodes} XML elements, the executor's parser keeps at most {MAX_NODES - 1}", "use fewer chunks")
    lines = [
        f'<algo name="{_clean_name(name or program.name)}" proto="{proto}" nchannels="{nchannels}" nchunksperloop="{n * C}" '
        f'ngpus="{n}" coll="{coll.value}" inplace="{1 if unfused else 0}" outofplace="{0 if unfused else 1}" '
        f'minBytes="{min_bytes}" maxBytes="{max_bytes}">'
    ]
    for g, gt in zip(prog.gpus, tbs, strict=True):
        lines.append(f'  <gpu id="{g.rank}" i_chunks="{g.i_chunks}" o_chunks="{g.o_chunks}" s_chunks="{g.s_chunks}">')
        for tb in sorted(gt, key=lambda t: t.id):
            send = tb.peer if tb.kind == "send" else -1
            recv = tb.peer if tb.kind == "recv" else -1
            lines.append(f'    <tb id="{tb.id}" send="{send}" recv="{recv}" chan="{tb.chan}">')
            for s, x in enumerate(tb.xml):
                src, dst = x["src"], x["dst"]
                depid, deps = x["dep"] if x["dep"] else (-1, -1)
                lines.append(
                    f'      <step s="{s}" type="{x["type"]}" srcbuf="{src[0]}" srcoff="{src[1]}" dstbuf="{dst[0]}" '
                    f'dstoff="{dst[1]}" cnt="1" depid="{depid}" deps="{deps}" hasdep="{1 if x["hasdep"] else 0}"/>'
                )
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    text = "\n".join(lines) + "\n"
    back = from_msccl_xml(text, "exported XML")
    problems = check_program(back)
    if problems:
        raise InputError("program", f"the exported XML does not compute the collective: {problems[0]}", "report this as a bug")
    return text


def write_msccl(program: Program, path: str | Path, **kw) -> None:
    """Write :func:`to_msccl_xml` of ``program`` to ``path`` atomically (temp file + rename)."""
    write_text_atomic(path, to_msccl_xml(program, **kw))


# ---------------------------------------------------------------------------------------------
# Import


@dataclass
class _XStep:
    path: str
    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: int


@dataclass
class _XTb:
    path: str
    id: int
    send: int
    recv: int
    chan: int
    steps: list[_XStep]


@dataclass
class _XGpu:
    path: str
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: list[_XTb]


@dataclass(eq=False)
class _Trans:
    """One executed step (the executor's transmission): a real step and the nops before it."""

    gpu: int
    tb: int
    step: _XStep
    deps: list[tuple[int, int]]  # (tb, s) it waits for
    match: _Trans | None = None  # the send a receive takes its data from
    out: _Trans | None = None  # the receive its send feeds
    tags_in: list[int] = field(default_factory=list)
    tags_out: list[int] = field(default_factory=list)
    seq: int = -1
    level: int = 0
    last: int = -1  # program index of its last step


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def err(self, where: str, problem: str, fix: str) -> InputError:
        """The XML cannot be read as an MSCCL algorithm (a usage error)."""
        return InputError(f"{self.source}:{where}" if where else self.source, problem, fix)

    def wrong(self, where: str, problem: str, fix: str) -> InvalidSchedule:
        """The XML was understood, and the algorithm it describes is wrong (a race, a deadlock)."""
        return InvalidSchedule(f"{self.source}:{where}" if where else self.source, problem, fix)

    def attr(self, el: ET.Element, name: str, where: str, required: bool = True, default: str | None = None) -> str | None:
        v = el.get(name)
        if v is None:
            if required:
                raise self.err(f"{where}.{name}", "is missing", f'add {name}="..." to <{el.tag}>')
            return default
        return v.strip()

    def int(self, el: ET.Element, name: str, where: str, lo: int | None = None, hi: int | None = None, required: bool = True, default: int | None = None) -> int:
        v = self.attr(el, name, where, required)
        if v is None:
            return default  # type: ignore[return-value]
        try:
            x = int(v, 10)
        except ValueError:
            raise self.err(f"{where}.{name}", f"{v!r} is not an integer", "write a whole number in decimal") from None
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise self.err(f"{where}.{name}", f"{x} is outside {span}", f"give {name} in {span}")
        return x


def from_msccl_xml(text: str, source_name: str = "xml") -> Program:
    """A Program equivalent to the MSCCL algorithm ``text`` (any MSCCL XML with the collectives
    flowride knows). Each GPU's steps come in an order the executor could run them in; receives
    share a tag with the send they are matched to (first in, first out per sender, receiver and
    channel). In-place algorithms are brought to the out-of-place form, leaving the input
    unwritten: an in-place AllGather, AllReduce or AlltoAll starts by copying its input into the
    output and works there; an in-place ReduceScatter copies its input into scratch (after the
    declared scratch), works there, and ends by copying its block out to the output."""
    rd = _Reader(source_name)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise rd.err("", f"is not well-formed XML ({e})", "give an MSCCL algorithm XML file") from None
    if root.tag != "algo":
        raise rd.err("", f"the top element is <{root.tag}>, not <algo>", "give an MSCCL algorithm XML file")
    a = "algo"
    coll_name = rd.attr(root, "coll", a)
    if coll_name not in COLLS:
        if coll_name in OTHER_COLLS:
            raise rd.err(f"{a}.coll", f"{coll_name!r} is not supported by flowride", f"flowride handles {', '.join(COLLS)}")
        raise rd.err(f"{a}.coll", f"{coll_name!r} is not an MSCCL collective", f"use one of {', '.join(COLLS)}")
    coll = COLLS[coll_name]
    n = rd.int(root, "ngpus", a, 2, 65536)
    loop = rd.int(root, "nchunksperloop", a, 1, MAX_OFFSET)
    if loop % n:
        raise rd.err(f"{a}.nchunksperloop", f"{loop} is not a multiple of ngpus ({n})", "flowride needs the same number of chunks per rank")
    C = loop // n
    proto = rd.attr(root, "proto", a, required=False)
    if proto is not None and proto not in PROTOS:
        raise rd.err(f"{a}.proto", f"{proto!r} is not an MSCCL protocol", f"use one of {', '.join(PROTOS)}")
    nchannels = rd.int(root, "nchannels", a, 1, MAX_CHANNELS, required=False)
    inplace_flag = rd.int(root, "inplace", a, 0, 1, required=False, default=0)
    outofplace = rd.int(root, "outofplace", a, 0, 1, required=False, default=1 - inplace_flag)
    if not (inplace_flag or outofplace):
        raise rd.err(f"{a}.inplace", "the algorithm is marked neither in place nor out of place", 'set inplace="1" or outofplace="1"')
    for attr in ("minBytes", "maxBytes"):
        rd.int(root, attr, a, 0, required=False)
    inplace = bool(inplace_flag) and not outofplace
    li, lo = _layout(coll, n, C)

    gpus: dict[int, _XGpu] = {}
    for gi, gel in enumerate(root.findall("gpu")):
        gp = f"gpu[{gi}]"
        gid = rd.int(gel, "id", gp, 0, n - 1)
        if gid in gpus:
            raise rd.err(f"{gp}.id", f"GPU {gid} appears twice", "give each GPU one <gpu> element")
        g = _XGpu(gp, gid, rd.int(gel, "i_chunks", gp, 0), rd.int(gel, "o_chunks", gp, 0), rd.int(gel, "s_chunks", gp, 0), [])
        tbs: dict[int, _XTb] = {}
        for ti, tel in enumerate(gel.findall("tb")):
            tp = f"{gp}/tb[{ti}]"
            tid = rd.int(tel, "id", tp, 0, MAX_TBS - 1)
            if tid in tbs:
                raise rd.err(f"{tp}.id", f"thread block {tid} appears twice on GPU {gid}", "number thread blocks 0, 1, 2, ...")
            send = rd.int(tel, "send", tp, -1, n - 1)
            recv = rd.int(tel, "recv", tp, -1, n - 1)
            for nm, v in (("send", send), ("recv", recv)):
                if v == gid:
                    raise rd.err(f"{tp}.{nm}", f"GPU {gid} cannot {nm} to itself", "name another GPU, or -1 for none")
            chan = rd.int(tel, "chan", tp, 0, MAX_CHANNELS - 1)
            if nchannels is not None and chan >= nchannels:
                raise rd.err(f"{tp}.chan", f"{chan} is not below nchannels ({nchannels})", "raise algo.nchannels or use a lower channel")
            steps = []
            for si, sel in enumerate(tel.findall("step")):
                sp = f"{tp}/step[{si}]"
                s = rd.int(sel, "s", sp, 0)
                if s != si:
                    raise rd.err(f"{sp}.s", f"is {s}, expected {si}", "number the steps of a thread block 0, 1, 2, ... in order")
                if s >= MAX_STEPS_PER_TB:
                    raise rd.err(f"{sp}.s", f"{s} is beyond the executor's {MAX_STEPS_PER_TB} steps per thread block", "split the thread block")
                kind = rd.attr(sel, "type", sp)
                if kind not in STEP_TYPES:
                    raise rd.err(f"{sp}.type", f"{kind!r} is not an MSCCL step type", f"use one of {', '.join(sorted(STEP_TYPES))}")
                bufs = {}
                for nm in ("srcbuf", "dstbuf"):
                    b = rd.attr(sel, nm, sp)
                    if b not in BUF_NAMES:
                        raise rd.err(f"{sp}.{nm}", f"{b!r} is not a buffer", "use i, o or s")
                    bufs[nm] = b
                st = _XStep(
                    sp, s, kind, bufs["srcbuf"], rd.int(sel, "srcoff", sp, -1, MAX_OFFSET), bufs["dstbuf"], rd.int(sel, "dstoff", sp, -1, MAX_OFFSET),
                    rd.int(sel, "cnt", sp, 0, MAX_COUNT - 1), rd.int(sel, "depid", sp, -1), rd.int(sel, "deps", sp, -1), rd.int(sel, "hasdep", sp, 0, 1),
                )
                if kind != "nop" and st.cnt < 1:
                    raise rd.err(f"{sp}.cnt", "is 0", "give the number of chunks the step moves (1 or more)")
                if kind in SEND_TYPES and send < 0:
                    raise rd.err(f"{sp}.type", f"{kind} sends, but its thread block has send=\"-1\"", "set the thread block's send peer")
                if kind in RECV_TYPES and recv < 0:
                    raise rd.err(f"{sp}.type", f"{kind} receives, but its thread block has recv=\"-1\"", "set the thread block's recv peer")
                steps.append(st)
            tbs[tid] = _XTb(tp, tid, send, recv, chan, steps)
        for k in range(len(tbs)):
            if k not in tbs:
                raise rd.err(f"{gp}", f"thread block {k} is missing (ids {sorted(tbs)})", "number thread blocks 0, 1, 2, ... without gaps")
        g.tbs = [tbs[k] for k in range(len(tbs))]
        gpus[gid] = g
    for k in range(n):
        if k not in gpus:
            raise rd.err(a, f"GPU {k} has no <gpu> element (ngpus={n})", "give one <gpu> per rank, ids 0..ngpus-1")
    glist = [gpus[k] for k in range(n)]
    return _assemble(rd, glist, coll, n, C, li, lo, inplace, root.get("name") or source_name)


def _assemble(rd: _Reader, glist: list[_XGpu], coll: Collective, n: int, C: int, li: int, lo: int, inplace: bool, name: str) -> Program:
    # offsets: what the executor checks, then what the real buffers hold
    real = {"i": li, "o": lo}
    layout = "in-place" if inplace else "out-of-place"

    def local(g: _XGpu, st: _XStep, which: str) -> list[Slot]:
        buf, off = (st.srcbuf, st.srcoff) if which == "src" else (st.dstbuf, st.dstoff)
        field_ = f"{st.path}.{which}off"
        declared = {"i": g.i_chunks, "o": g.o_chunks, "s": g.s_chunks}[buf]
        if off < 0:
            raise rd.err(field_, f"{buf}[{off}] is not a chunk, but {st.type} uses its {which}", "give the offset of the chunk")
        last = off + st.cnt - 1
        if last >= declared:
            raise rd.err(field_, f"{buf}[{off}..{last}] is outside the {declared} {BUF_NAMES[buf]} chunks declared by {g.path}.{buf}_chunks", "raise the declared count or fix the offset")
        out = []
        for u in range(st.cnt):
            slot = (buf, off + u)
            canon = _alias(coll, g.id, C, slot) if inplace else slot
            size = g.s_chunks if canon[0] == "s" else real[canon[0]]
            if canon[1] >= size:
                raise rd.err(field_, f"{buf}[{off + u}] is outside the {BUF_NAMES[buf]} buffer ({size} chunks in an {layout} {coll.value} of {n * C} chunks per loop)", "fix the offset")
            out.append(canon)
        return out

    # transmissions per thread block, as the executor builds them
    trans: list[list[list[_Trans]]] = []
    by_s: dict[tuple[int, int, int], _Trans] = {}
    for g in glist:
        gt = []
        for tb in g.tbs:
            lst: list[_Trans] = []
            pending: list[tuple[int, int]] = []
            for k, st in enumerate(tb.steps):
                if st.depid >= 0:
                    if st.depid >= len(g.tbs):
                        raise rd.err(f"{st.path}.depid", f"GPU {g.id} has no thread block {st.depid}", "point the dependency at an existing thread block")
                    target = g.tbs[st.depid]
                    if not 0 <= st.deps < len(target.steps):
                        raise rd.err(f"{st.path}.deps", f"thread block {st.depid} has no step {st.deps}", "point the dependency at an existing step")
                    if st.depid > MAX_DEP_TB:
                        raise rd.err(f"{st.path}.depid", f"{st.depid} does not fit the executor's 8-bit dependency ids", f"give thread blocks others wait on ids up to {MAX_DEP_TB}")
                    ts = target.steps[st.deps]
                    if st.depid == tb.id:
                        if st.deps >= k:
                            raise rd.err(f"{st.path}.deps", f"waits for step {st.deps} of its own thread block, which runs later", "remove the dependency")
                    else:
                        if ts.type == "nop":
                            raise rd.err(f"{st.path}.deps", f"waits for {ts.path}, a nop, which never signals", "point the dependency at the step that does the work")
                        if not ts.hasdep:
                            raise rd.err(f"{ts.path}.hasdep", f"{st.path} waits for this step, but it has hasdep=\"0\" and never signals", 'set hasdep="1"')
                        pending.append((st.depid, st.deps))
                elif st.type == "nop" and any(x.type != "nop" for x in tb.steps[k + 1:]):
                    raise rd.err(f"{st.path}.depid", "a nop without a dependency shifts the executor's step count", "remove the nop or give it a dependency")
                if st.type == "nop":
                    continue
                if pending and st.depid < 0:
                    raise rd.err(f"{st.path}.depid", "follows nops that carry dependencies, so it must carry one too (the executor rejects the XML otherwise)", "move one of the nops' dependencies onto this step")
                t = _Trans(g.id, tb.id, st, pending)
                pending = []
                lst.append(t)
                by_s[(g.id, tb.id, st.s)] = t
            gt.append(lst)
        trans.append(gt)

    # connections: one thread block per (peer, channel) and direction
    send_tb: dict[tuple[int, int, int], _XTb] = {}
    recv_tb: dict[tuple[int, int, int], _XTb] = {}
    for g in glist:
        per_ch: dict[tuple[str, int], int] = defaultdict(int)
        for tb in g.tbs:
            for kind, peer, table, key in (("send", tb.send, send_tb, (g.id, tb.send, tb.chan)), ("recv", tb.recv, recv_tb, (tb.recv, g.id, tb.chan))):
                if peer < 0:
                    continue
                if key in table:
                    raise rd.err(f"{tb.path}.chan", f"{table[key].path} already uses the {kind} connection with GPU {peer} on channel {tb.chan}", "give each thread block talking to the same peer its own channel")
                table[key] = tb
                per_ch[(kind, tb.chan)] += 1
                if per_ch[(kind, tb.chan)] > MAX_TBS_PER_CHANNEL:
                    raise rd.err(f"{tb.path}.chan", f"channel {tb.chan} has more than {MAX_TBS_PER_CHANNEL} thread blocks with a {kind} peer on GPU {g.id}", "spread thread blocks over more channels")
    tag = 0
    for key in sorted(set(send_tb) | set(recv_tb)):
        a, b, ch = key
        snd = [t for t in trans[a][send_tb[key].id] if t.step.type in SEND_TYPES] if key in send_tb else []
        rcv = [t for t in trans[b][recv_tb[key].id] if t.step.type in RECV_TYPES] if key in recv_tb else []
        for k in range(max(len(snd), len(rcv))):
            if k >= len(rcv):
                raise rd.err(snd[k].step.path, f"sends to GPU {b} on channel {ch}, but GPU {b} receives only {len(rcv)} time(s) from GPU {a} on channel {ch}", f"add the matching receive on GPU {b}, or remove the send")
            if k >= len(snd):
                raise rd.err(rcv[k].step.path, f"receives from GPU {a} on channel {ch}, but GPU {a} sends only {len(snd)} time(s) to GPU {b} on channel {ch}", f"add the matching send on GPU {a}, or remove the receive")
            s_, r_ = snd[k], rcv[k]
            if s_.step.cnt != r_.step.cnt:
                raise rd.err(f"{r_.step.path}.cnt", f"is {r_.step.cnt}, but the matching send {s_.step.path} has cnt {s_.step.cnt}", "make both sides move the same number of chunks")
            r_.match, s_.out = s_, r_
            s_.tags_out = list(range(tag, tag + s_.step.cnt))
            r_.tags_in = list(s_.tags_out)
            tag += s_.step.cnt

    # run the thread blocks as the executor would (sends never block)
    flags = [[-1] * len(gt) for gt in trans]
    pos = [[0] * len(gt) for gt in trans]
    done: set[int] = set()
    order: list[_Trans] = []
    progress = True
    while progress:
        progress = False
        for gi, gt in enumerate(trans):
            for ti, lst in enumerate(gt):
                while pos[gi][ti] < len(lst):
                    t = lst[pos[gi][ti]]
                    if any(flags[gi][x] < s for x, s in t.deps):
                        break
                    if t.match is not None and id(t.match) not in done:
                        break
                    preds = [by_s[(gi, x, s)] for x, s in t.deps]
                    if pos[gi][ti]:
                        preds.append(lst[pos[gi][ti] - 1])
                    if t.match is not None:
                        preds.append(t.match)
                    t.level = 1 + max((p.level for p in preds), default=0)
                    t.seq = len(order)
                    order.append(t)
                    done.add(id(t))
                    pos[gi][ti] += 1
                    if t.step.hasdep:
                        flags[gi][ti] = t.step.s
                    progress = True
    for gi, gt in enumerate(trans):
        for ti, lst in enumerate(gt):
            if pos[gi][ti] < len(lst):
                t = lst[pos[gi][ti]]
                why = []
                for x, s in t.deps:
                    if flags[gi][x] < s:
                        why.append(f"waits for thread block {x} step {s}, which never completes")
                if t.match is not None and id(t.match) not in done:
                    why.append(f"waits for {t.match.step.path}, which never runs")
                stuck = sum(1 for g2, gt2 in enumerate(trans) for t2, l2 in enumerate(gt2) if pos[g2][t2] < len(l2))
                raise rd.wrong(t.step.path, f"deadlock: {'; '.join(why)} ({stuck} thread block(s) stuck)", "fix the dependencies or the order of sends and receives")

    _check_races(rd, glist, order, by_s, local)

    # the program, GPU by GPU, in execution order
    steps: list[list[Step]] = [[] for _ in range(n)]
    origin: list[list[str]] = [[] for _ in range(n)]
    explicit: list[list[set[int]]] = [[] for _ in range(n)]
    # in place, the shared buffer becomes the output (AllGather, AllReduce, AlltoAll) or, for a
    # ReduceScatter, scratch after the declared scratch; the input is copied in first and never
    # written, as an out-of-place algorithm leaves it
    shared = [g.s_chunks for g in glist]
    scratch = [g.s_chunks + (li if inplace and coll is Collective.REDUCESCATTER else 0) for g in glist]

    def home(r: int, slot: Slot | None) -> Slot | None:
        if not inplace or slot is None or slot[0] != "i":
            return slot
        return ("s", shared[r] + slot[1]) if coll is Collective.REDUCESCATTER else ("o", slot[1])

    for g in glist:
        r = g.id
        if inplace:
            for k in range(C if coll is Collective.ALLGATHER else li):
                to = _alias(coll, r, C, ("i", k)) if coll is Collective.ALLGATHER else home(r, ("i", k))
                steps[r].append(Step("cpy", -1, ("i", k), to, 0))
                explicit[r].append(set())
                origin[r].append("in-place input")
    for t in order:
        r, st = t.gpu, t.step
        tb = glist[r].tbs[t.tb]
        ext = {by_s[(r, x, s)].last for x, s in t.deps}
        src = local(glist[r], st, "src") if st.type in LOCAL_SRC else [None] * st.cnt
        dst = local(glist[r], st, "dst") if st.type in LOCAL_DST else [None] * st.cnt
        src = [home(r, x) for x in src]
        dst = [home(r, x) for x in dst]
        for u in range(st.cnt):
            new: list[Step] = []
            if st.type == "s":
                new.append(Step("s", tb.send, src[u], None, t.level, t.tags_out[u]))
            elif st.type == "r":
                new.append(Step("r", tb.recv, None, dst[u], t.level, t.tags_in[u]))
            elif st.type == "rcs":
                new += [Step("r", tb.recv, None, dst[u], t.level, t.tags_in[u]), Step("s", tb.send, dst[u], None, t.level, t.tags_out[u])]
            elif st.type == "rrc":
                new.append(Step("rrc", tb.recv, src[u], dst[u], t.level, t.tags_in[u]))
            elif st.type == "rrcs":
                new += [Step("rrc", tb.recv, src[u], dst[u], t.level, t.tags_in[u]), Step("s", tb.send, dst[u], None, t.level, t.tags_out[u])]
            elif st.type == "rrs":
                tmp = ("s", scratch[r])
                scratch[r] += 1
                new += [Step("rrc", tb.recv, src[u], tmp, t.level, t.tags_in[u]), Step("s", tb.send, tmp, None, t.level, t.tags_out[u])]
            else:  # cpy, re (folded into the receive it adds below)
                new.append(Step(st.type, -1, src[u], dst[u], t.level))
            for x in new:
                steps[r].append(x)
                explicit[r].append(set(ext))
                origin[r].append(st.path if st.cnt == 1 else f"{st.path} chunk {u}")
        t.last = len(steps[r]) - 1
    if inplace and coll is Collective.REDUCESCATTER:
        for r in range(n):
            for c in range(C):
                steps[r].append(Step("cpy", -1, home(r, ("i", r * C + c)), ("o", c), max((t.level for t in order), default=0) + 1))
                explicit[r].append(set())
                origin[r].append("in-place output")
    for r in range(n):
        steps[r], origin[r], explicit[r] = _fold_re(rd, steps[r], origin[r], explicit[r])
    # dependencies; sends leave dst unset, as lower() does (the receiver decides)
    progs = []
    for r in range(n):
        deps = _hazards([(reads(x), writes(x)) for x in steps[r]])
        for i, x in enumerate(steps[r]):
            x.deps = sorted(d for d in deps[i] | explicit[r][i] if 0 <= d < i)
        progs.append(GpuProgram(r, r, li, lo, scratch[r], steps[r]))
    prog = Program(_clean_name(name), coll, C, progs, 0.0)
    _remember(prog, rd.source, origin)
    return prog


def _fold_re(rd: _Reader, steps: list[Step], origin: list[str], explicit: list[set[int]]) -> tuple[list[Step], list[str], list[set[int]]]:
    """Turn each ``re`` (local dst += src) whose src was just received by an ``r`` and is read by
    nothing else into an ``rrc`` at the re's place (dst = dst + received), dropping the ``r``:
    Programs have no local add. Any other ``re`` is refused."""
    if not any(x.op == "re" for x in steps):
        return steps, origin, explicit
    last_write: dict[Slot, int] = {}
    readers: dict[int, list[int]] = defaultdict(list)
    feeds: dict[int, int | None] = {}
    for i, x in enumerate(steps):
        rd_slots = [x.src, x.dst] if x.op == "re" else reads(x)
        for slot in rd_slots:
            if slot in last_write:
                readers[last_write[slot]].append(i)
        if x.op == "re":
            feeds[i] = last_write.get(x.src)
        for slot in [x.dst] if x.op == "re" else writes(x):
            last_write[slot] = i
    drop: dict[int, int] = {}
    for i, w in feeds.items():
        x = steps[i]
        if w is None or steps[w].op != "r" or readers[w] != [i] or x.src == x.dst:
            raise rd.err(
                origin[i],
                f"re adds {_fmt(x.src)} to {_fmt(x.dst)}; flowride's programs have no local add, so only a re whose source a plain receive has just written, for this re alone, can be read (as a receive that reduces)",
                "use rrc (or rrs/rrcs) to reduce what is received",
            )
        drop[w] = i
    keep = [i for i in range(len(steps)) if i not in drop]
    new_index = {i: k for k, i in enumerate(keep)}
    for w, i in drop.items():
        new_index[w] = new_index[i]
    out_steps, out_origin, out_explicit = [], [], []
    for i in keep:
        x = steps[i]
        if x.op == "re":
            w = next(w for w, j in drop.items() if j == i)
            recv = steps[w]
            x = Step("rrc", recv.peer, x.dst, x.dst, x.epoch, recv.tag)
            out_origin.append(f"{origin[i]} with {origin[w]}")
            out_explicit.append({new_index[d] for d in explicit[i] | explicit[w]})
        else:
            out_origin.append(origin[i])
            out_explicit.append({new_index[d] for d in explicit[i]})
        out_steps.append(x)
    return out_steps, out_origin, out_explicit


# Where each step of a Program read from XML came from, to name it in messages (a Program has
# no field for it; entries go when the Program does).
_ORIGINS: dict[int, tuple[weakref.ref, str, list[list[str]]]] = {}


def _remember(prog: Program, source: str, origin: list[list[str]]) -> None:
    key = id(prog)
    _ORIGINS[key] = (weakref.ref(prog), source, origin)
    weakref.finalize(prog, _ORIGINS.pop, key, None)


def _explain(prog: Program, problem: str) -> str:
    """``problem`` with each "rank R step I" of a Program read from XML followed by its element."""
    entry = _ORIGINS.get(id(prog))
    if entry is None or entry[0]() is not prog:
        return problem
    _, source, origin = entry

    def sub(m: re.Match) -> str:
        r, i = int(m.group(1)), int(m.group(2))
        if r < len(origin) and i < len(origin[r]):
            return f"{m.group(0)} [{source}:{origin[r][i]}]"
        return m.group(0)

    return re.sub(r"rank (\d+) step (\d+)", sub, problem)


def _check_races(rd: _Reader, glist: list[_XGpu], order: list[_Trans], by_s: dict, local) -> None:
    """Two steps of a GPU that touch the same chunk, one of them writing, must be ordered by the
    algorithm itself (thread block order, dependencies, or a chain of transfers); else the
    executor may run them either way round."""
    anc: dict[int, int] = {}
    prev: dict[tuple[int, int], _Trans] = {}
    access: dict[tuple[int, Slot], list[tuple[_Trans, bool, Slot]]] = defaultdict(list)
    for t in order:
        preds = [by_s[(t.gpu, x, s)] for x, s in t.deps]
        if (t.gpu, t.tb) in prev:
            preds.append(prev[(t.gpu, t.tb)])
        if t.match is not None:
            preds.append(t.match)
        bits = 0
        for p in preds:
            bits |= anc[p.seq] | (1 << p.seq)
        anc[t.seq] = bits
        prev[(t.gpu, t.tb)] = t
        g = glist[t.gpu]
        st = t.step
        if st.type in LOCAL_SRC:
            for u, slot in enumerate(local(g, st, "src")):
                access[(t.gpu, slot)].append((t, False, (st.srcbuf, st.srcoff + u)))
        if st.type in LOCAL_DST:
            for u, slot in enumerate(local(g, st, "dst")):
                access[(t.gpu, slot)].append((t, True, (st.dstbuf, st.dstoff + u)))
    for (_, _), acc in access.items():
        for j in range(len(acc)):
            tj, wj, sj = acc[j]
            for i in range(j):
                ti, wi, si = acc[i]
                if ti is tj or not (wi or wj):
                    continue
                if not anc[tj.seq] >> ti.seq & 1:
                    raise rd.wrong(
                        tj.step.path,
                        f"{_rw(wj)} {_fmt(sj)} while {ti.step.path} {_rw(wi)} {_fmt(si)}, and nothing orders the two (a race)",
                        "make the later step depend on the earlier one (depid/deps)",
                    )


def _rw(write: bool) -> str:
    return "writes" if write else "reads"


def read_msccl(path: str | Path) -> Program:
    """:func:`from_msccl_xml` of the file at ``path``."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(str(p), f"cannot read it: {e.strerror}", "give an existing MSCCL algorithm XML file") from None
    except UnicodeDecodeError:
        raise InputError(str(p), "is not text", "give an MSCCL algorithm XML file") from None
    return from_msccl_xml(text, p.name)


# ---------------------------------------------------------------------------------------------
# Program -> schedule


def program_to_schedule(program: Program) -> Schedule:
    """A flowride schedule doing what ``program`` does, on a full mesh of its GPUs (one chunk per
    link per epoch, no latency), so :func:`~flowride.schedule.simulate.simulate` can verify it.

    The program is executed symbolically first (:func:`check_program`; its first problem is
    raised), which also tells which chunk (and which contributions) each transfer carries. Each
    transfer then gets an epoch: a receive lands one epoch after its send, a link carries one
    chunk per epoch, and each GPU's sends and receives of a chunk keep their program order (the
    simulator keeps one value per chunk per GPU). A transfer's (source, chunk) is the chunk it
    carries; it reduces when its receive is an ``rrc``. The schedule is simulated before it is
    returned; see ``docs/msccl.md``."""
    from flowride.topology.builtins import full
    from flowride.topology.timing import resolve_tau

    _validate_program(program)
    problems = check_program(program)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise InvalidSchedule("program", f"does not compute the {program.collective.value}: {_explain(program, problems[0])}{more}", "fix the algorithm")
    ran: list[tuple[int, int]] = []
    _, carried = _run(program, order=ran)
    n, C, coll = program.ngpus, program.chunks, program.collective
    topo = full(n, alpha_us=0.0)
    link = topo.link_index
    chunk_bytes = program.chunk_bytes if program.chunk_bytes >= 1 else float(1 << 20)
    size = max(1, int(round(chunk_bytes * topo.buffer_ranks * C)))
    tau, _ = resolve_tau(topo, size / topo.buffer_ranks / C, "fast")

    # The simulator keeps one value per chunk per GPU: a send carries what the GPU holds of its
    # chunk when it starts, a receive updates it when it lands. So each GPU's sends and receives
    # of a chunk keep their program order (a receive of a chunk after the sends and receives of it
    # before; a send after the receives of it before). Positions in the simulator's order: a
    # receive landing at the start of epoch t at 2t (arrivals are applied first), a send in epoch
    # e at 2e+1; a receive lands one epoch after its send. Positions rise to the least fixpoint of
    # these difference constraints; then, epoch by epoch, sends sharing a link give way to the one
    # that ran first in the symbolic execution.
    steps = [g.steps for g in program.gpus]
    prio = {rs: k for k, rs in enumerate(ran)}
    node: dict[tuple[int, int], int] = {}
    kind: list[str] = []
    where: list[tuple[int, int]] = []
    for r in range(n):
        for i, x in enumerate(steps[r]):
            if x.op != "cpy":
                node[(r, i)] = len(kind)
                kind.append(x.op)
                where.append((r, i))
    edges: list[list[tuple[int, int]]] = [[] for _ in kind]
    for r in range(n):
        idx = [i for i, x in enumerate(steps[r]) if x.op != "cpy"]
        rw = [([carried[steps[r][i].tag][0]], []) if steps[r][i].op == "s" else ([], [carried[steps[r][i].tag][0]]) for i in idx]
        for k, ds in enumerate(_hazards(rw)):
            for d in ds:
                edges[node[(r, idx[d])]].append((node[(r, idx[k])], 1))
    send_at: dict[int, int] = {}
    recv_at: dict[int, int] = {}
    for (r, i), k in node.items():
        if kind[k] == "s":
            send_at[steps[r][i].tag] = k
        else:
            recv_at[steps[r][i].tag] = k
    for tag, u in send_at.items():
        v = recv_at[tag]
        edges[u].append((v, 1))
        edges[v].append((u, -1))
    pos = [1 if x == "s" else 2 for x in kind]
    bound = 4 * len(kind) + 8

    def settle(work: list[int]) -> None:
        queued = set(work)
        while work:
            u = work.pop()
            queued.discard(u)
            for v, w in edges[u]:
                p = pos[u] + w
                if (kind[v] == "s") != (p % 2 == 1):
                    p += 1
                if p > pos[v]:
                    if p > bound:
                        r, i = where[v]
                        raise InvalidSchedule("program", f"rank {r} step {i} cannot be placed on one chunk per link per epoch: the order it needs is circular", "check the algorithm's dependencies")
                    pos[v] = p
                    if v not in queued:
                        queued.add(v)
                        work.append(v)

    settle(list(range(len(kind))))
    lk_of = {u: (where[u][0], steps[where[u][0]][where[u][1]].peer) for u in send_at.values()}
    e = 0
    while e <= max((pos[u] // 2 for u in send_at.values()), default=-1):
        while True:
            at_e: dict[tuple[int, int], list[int]] = defaultdict(list)
            for u in send_at.values():
                if pos[u] == 2 * e + 1:
                    at_e[lk_of[u]].append(u)
            bumped = []
            for us in at_e.values():
                if len(us) > 1:
                    us.sort(key=lambda u: prio[where[u]])
                    for u in us[1:]:
                        pos[u] = 2 * e + 3
                        bumped.append(u)
            if not bumped:
                break
            settle(bumped)
        e += 1
    sends = []
    for tag, u in send_at.items():
        a, b = lk_of[u]
        key, _ = carried[tag]
        sends.append(Send(pos[u] // 2, link[(a, b)], key[0], key[1], kind[recv_at[tag]] == "rrc"))
    sched = Schedule(topo, coll, size, C, tau, sorted(sends), {"method": "msccl", "program": program.name})
    from flowride.schedule.simulate import simulate

    sim = simulate(sched)
    if not sim.valid:
        raise InputError(
            "program",
            f"computes the {coll.value} (symbolic check), but its flowride schedule fails the simulator: {sim.first_violation}",
            "flowride schedules hold one partial sum per chunk per GPU; an algorithm that keeps several at once can only be checked symbolically",
        )
    return sched
