"""Write a :class:`~flowride.program.model.Program` as the MSCCL algorithm XML the executor
(Azure/msccl-executor-nccl, ``src/misc/msccl/msccl_parser.cc``) loads, within every limit its
parser and kernel impose (:mod:`flowride.program.msccl_limits`, the rules of
:mod:`flowride.program.msccl_rules`, ``docs/msccl.md``).

The executor runs thread blocks, not step lists: each GPU's steps are cut into one thread block
per (peer, direction, channel), connections keep one FIFO order on both sides, and every data
hazard becomes a (depid, deps) pair, with nops where a step waits on more than one thread block.
What is written is read back (:func:`~flowride.program.msccl_read.from_msccl_xml`) and checked
symbolically before it is returned, so a file this module writes is one flowride can verify.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from flowride.collectives.demand import Collective
from flowride.errors import InputError, InvalidSchedule
from flowride.files import write_text_atomic
from flowride.program.model import (
    GpuProgram,
    Program,
    Slot,
    Step,
    buffer_layout,
    check_program,
    fmt_slot,
    inplace_alias,
    run_program,
    step_deps,
    validate_program,
    writes,
)
from flowride.program.msccl_limits import (
    MAX_CHANNELS,
    MAX_DEP_TB,
    MAX_NODES,
    MAX_OFFSET,
    MAX_STEPS_PER_TB,
    MAX_TBS,
    MAX_TBS_PER_CHANNEL,
    PROTOS,
    clean_name,
)
from flowride.program.msccl_read import from_msccl_xml
from flowride.program.msccl_rules import Deadlock, check_executor
from flowride.program.msccl_xml import parse_algo


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
    li, lo = buffer_layout(coll, program.ngpus, C)
    gpus = []
    for g in program.gpus:
        r = g.rank

        def al(slot, rank=r):
            return None if slot is None else inplace_alias(coll, rank, C, slot)

        items = []  # (aliased step, original src, original dst, original index)
        for i, st in enumerate(g.steps):
            src = al(st.src)
            dst = al(st.dst, st.peer) if st.op == "s" else al(st.dst)
            if st.op == "cpy":
                if src == dst:
                    continue
                raise InputError(
                    "unfused",
                    f"rank {r} step {i} copies {fmt_slot(st.src)} to {fmt_slot(st.dst)}, a local copy that the in-place layout does not make redundant, and unfused output has no cpy",
                    "export without unfused (cpy steps are then written)",
                )
            items.append([replace(st, src=src, dst=dst, deps=[]), st.src, st.dst if st.op != "s" else None, i])
        # original dependencies (on the original slots), by original index
        orig = step_deps(g.steps)
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
                        f"rank {r}: in place, step {oi} ({st.op}) would overwrite {fmt_slot(x)} before it is read as input",
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
        deps = step_deps(steps)
        for k, st in enumerate(steps):
            st.deps = sorted(deps[k])
        i_chunks, o_chunks = (0, lo) if coll is Collective.ALLGATHER else (li, 0)
        gpus.append(GpuProgram(r, g.node, i_chunks, o_chunks, g.s_chunks, steps))
    out = Program(program.name, coll, C, gpus, program.chunk_bytes)
    problems, _ = run_program(out, inplace=True)
    if problems:
        raise InputError("unfused", f"the in-place form of the program is wrong: {problems[0]}", "export without unfused (the out-of-place algorithm is written)")
    return out


def _split(items: list, costs: list[tuple[int, ...]], limit: int, cuts: frozenset = frozenset()) -> list[list]:
    """Cut ``items`` into consecutive blocks whose summed costs (per side) stay within ``limit``,
    and before each item in ``cuts``."""
    blocks: list[list] = []
    cur: list = []
    tot = None
    for it, cost in zip(items, costs, strict=True):
        if tot is not None and (it in cuts or any(t + c > limit for t, c in zip(tot, cost, strict=True))):
            blocks.append(cur)
            cur, tot = [], None
        cur.append(it)
        tot = list(cost) if tot is None else [t + c for t, c in zip(tot, cost, strict=True)]
    if cur:
        blocks.append(cur)
    return blocks


def _build(prog: Program, max_steps: int, max_tbs_ch: int, cuts: frozenset = frozenset()) -> tuple[list[list[_Tb]], int]:
    """Thread blocks of every GPU, with channels, dependencies and nops; and nchannels. A
    connection's transfers start a new thread block (on a channel of its own) at each tag in
    ``cuts``."""
    n = prog.ngpus
    steps = [g.steps for g in prog.gpus]
    deps = [step_deps(s) for s in steps]
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
        blocks = _split(tags, costs, max_steps, cuts)
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
            tb.xml.append(_xstep(st.op, st.src or _NONE_SRC, st.dst or _NONE_DST, dep, i in hasdep, i))


_NONE_SRC: Slot = ("i", -1)
_NONE_DST: Slot = ("o", -1)


def _xstep(kind: str, src: Slot, dst: Slot, dep: tuple[int, int] | None, hasdep: bool, index: int = -1) -> dict:
    return {"type": kind, "src": src, "dst": dst, "dep": dep, "hasdep": hasdep, "index": index}


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
    sms: int | str | None = None,
) -> str:
    """The program as an MSCCL algorithm XML the executor loads.

    Out of place by default (``inplace="0" outofplace="1"``), with ``cpy`` steps for local copies.
    ``unfused=True`` writes only s/r/rrc/nop (what ASTRA-sim's converter reads): the algorithm is
    then written in place (``inplace="1" outofplace="0"``), which makes the local copies
    redundant; a program whose in-place form would still need a copy, or would be wrong, is
    refused. Each step moves one chunk (cnt="1"); receives and sends are never fused into
    rcs/rrcs in either mode. ``min_bytes``/``max_bytes`` set the sizes the executor picks the
    algorithm for (0 = no upper limit); ``sms`` (an SM count or a GPU name) caps the thread
    blocks per GPU. The written XML is judged by the executor's rules
    (:func:`~flowride.program.msccl_rules.check_executor`: a run of the kernel with ``proto``'s
    bounded connections, no deadlock, no race, the collective's result), read back and checked
    symbolically before it is returned."""
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
    validate_program(program)
    problems = check_program(program)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise InputError("program", f"is wrong: {problems[0]}{more}", "export only programs lowered from verified schedules")
    n, C = program.ngpus, program.chunks
    if n * C > MAX_OFFSET:
        raise InputError("program", f"{n * C} chunks per loop exceed the executor's 16-bit offsets", "use fewer chunks")
    prog = _inplace_program(program) if unfused else program
    prog = _fill_informational(prog)
    for g in prog.gpus:
        if g.s_chunks > MAX_OFFSET:
            raise InputError("program", f"rank {g.rank} needs {g.s_chunks} scratch chunks, beyond the executor's 16-bit offsets", "use fewer chunks")
    # a connection holds only a few unreceived sends (msccl_limits.SENDS_IN_FLIGHT); where the
    # kernel run finds sends waiting for room that never comes, their connection is cut there
    # (the rest of it goes to a thread block on another channel, with its own FIFO) and the
    # algorithm is built again
    cuts: set[int] = set()
    while True:
        tbs, nchannels = _build(prog, max_steps_per_tb, max_tbs_per_channel, frozenset(cuts))
        text = _text(prog, tbs, nchannels, name or program.name, proto, unfused, min_bytes, max_bytes)
        try:
            check_executor(parse_algo(text, "exported XML"), sms=sms)
            break
        except Deadlock as e:
            by_id = [{tb.id: tb for tb in gt} for gt in tbs]
            new = {prog.gpus[g].steps[by_id[g][t].xml[s]["index"]].tag for g, t, s in e.full} - cuts
            if not new:
                raise InputError("program", f"the exported XML breaks the executor's rules: {e}", "report this as a bug") from None
            cuts |= new
        except InvalidSchedule as e:
            raise InputError("program", f"the exported XML breaks the executor's rules: {e}", "use fewer chunks, or report this as a bug") from None
    back = from_msccl_xml(text, "exported XML")
    problems = check_program(back)
    if problems:
        raise InputError("program", f"the exported XML does not compute the collective: {problems[0]}", "report this as a bug")
    return text


def _text(prog: Program, tbs: list[list[_Tb]], nchannels: int, name: str, proto: str, unfused: bool, min_bytes: int, max_bytes: int) -> str:
    """The XML of built thread blocks; the executor's limits on elements checked."""
    n, C, coll = prog.ngpus, prog.chunks, prog.collective
    for r, gt in enumerate(tbs):
        nodes = 1 + n + len(gt) + sum(len(t.xml) for t in gt)
        if nodes >= MAX_NODES:
            raise InputError("program", f"rank {r} needs {nodes} XML elements, the executor's parser keeps at most {MAX_NODES - 1}", "use fewer chunks")
    lines = [
        f'<algo name="{clean_name(name)}" proto="{proto}" nchannels="{nchannels}" nchunksperloop="{n * C}" '
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
    return "\n".join(lines) + "\n"


def write_msccl(program: Program, path: str | Path, **kw) -> None:
    """Write :func:`to_msccl_xml` of ``program`` to ``path`` atomically (temp file + rename)."""
    write_text_atomic(path, to_msccl_xml(program, **kw))

