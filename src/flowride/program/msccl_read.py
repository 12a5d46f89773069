"""Read any MSCCL algorithm (ours or msccl-tools') back into a :class:`~flowride.program.model.Program`,
executing it the way the executor would (thread blocks, dependency flags, per-connection FIFO
matching) to find a valid order, and rejecting races and deadlocks.

Executor semantics followed here: a step ``s`` sends a local slot; ``r`` receives into a local
slot; ``rrc`` writes local dst = local src + received; ``rcs`` receives into dst and forwards it;
``rrs`` sends local src + received without storing it; ``rrcs`` is ``rrc`` then a send of dst;
``cpy`` copies locally; ``re`` (local dst += src) has no counterpart in the Program model and is
read only where it adds a chunk just received (as one ``rrc``); ``nop`` only carries a dependency
for the step after it. Offsets count chunks of ``count * sizeMultiplier / nchunksperloop``
elements. The elements themselves are read and checked by :mod:`flowride.program.msccl_xml`.
"""

from __future__ import annotations

import re
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.program.model import (
    GpuProgram,
    Program,
    Slot,
    Step,
    buffer_layout,
    fmt_slot,
    inplace_alias,
    reads,
    slot_hazards,
    writes,
)
from flowride.program.msccl_exec import first_race
from flowride.program.msccl_limits import LOCAL_DST, LOCAL_SRC, clean_name
from flowride.program.msccl_rules import connections, pairs, release, step_slots, tb_groups
from flowride.program.msccl_xml import Algo, Reader, XGpu, XStep, parse_algo


@dataclass(eq=False)
class _Trans:
    """One executed step (the executor's transmission): a real step and the nops before it."""

    gpu: int
    tb: int
    step: XStep
    deps: list[tuple[int, int]]  # (tb, s) it waits for
    match: _Trans | None = None  # the send a receive takes its data from
    out: _Trans | None = None  # the receive its send feeds
    tags_in: list[int] = field(default_factory=list)
    tags_out: list[int] = field(default_factory=list)
    seq: int = -1
    level: int = 0
    last: int = -1  # program index of its last step


def from_msccl_xml(text: str, source_name: str = "xml") -> Program:
    """A Program equivalent to the MSCCL algorithm ``text`` (any MSCCL XML with the collectives
    flowride knows). Each GPU's steps come in an order the executor could run them in; receives
    share a tag with the send they are matched to (first in, first out per sender, receiver and
    channel). In-place algorithms are brought to the out-of-place form, leaving the input
    unwritten: an in-place AllGather, AllReduce or AlltoAll starts by copying its input into the
    output and works there; an in-place ReduceScatter copies its input into scratch (after the
    declared scratch), works there, and ends by copying its block out to the output."""
    algo = parse_algo(text, source_name)
    li, lo = buffer_layout(algo.coll, algo.n, algo.chunks)
    return _assemble(algo.reader, algo.gpus, algo.coll, algo.n, algo.chunks, li, lo, algo.inplace, algo.name)


def _assemble(rd: Reader, glist: list[XGpu], coll: Collective, n: int, C: int, li: int, lo: int, inplace: bool, name: str) -> Program:
    """Match sends to receives per connection, run the thread blocks as the executor would
    (refusing deadlocks and races), and write down what ran, GPU by GPU, as program steps."""
    algo = Algo(rd, glist, coll, n, C, inplace, name)

    def local(g: XGpu, st: XStep, which: str) -> list[Slot]:
        return step_slots(rd, g, st, which, algo, inplace)[0]

    # transmissions per thread block, as the executor builds them (msccl_rules): one per real
    # step here (fused re steps stay apart; the dependencies go with the first), each dependency
    # named by the step whose flag releases it
    trans: list[list[list[_Trans]]] = []
    by_s: dict[tuple[int, int, int], _Trans] = {}
    for g in glist:
        groups = [tb_groups(rd, g, tb) for tb in g.tbs]
        rel = release(rd, g, groups, [])
        gt = []
        for tb, tgroups, trel in zip(g.tbs, groups, rel, strict=True):
            lst: list[_Trans] = []
            for (steps, _), waits in zip(tgroups, trel, strict=True):
                deps = [(x, groups[x][j][0][-1].s) for x, j in waits if x != tb.id]
                for k, st in enumerate(steps):
                    t = _Trans(g.id, tb.id, st, deps if k == 0 else [])
                    lst.append(t)
                    by_s[(g.id, tb.id, st.s)] = t
            gt.append(lst)
        trans.append(gt)

    # connections: one thread block per (peer, channel) and direction; the k-th send of one
    # feeds its k-th receive
    tag = 0
    for snd, rcv, cnt in pairs(rd, connections(rd, glist)):
        s_, r_ = by_s[snd], by_s[rcv]
        r_.match, s_.out = s_, r_
        s_.tags_out = list(range(tag, tag + cnt))
        r_.tags_in = list(s_.tags_out)
        tag += cnt

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
                to = inplace_alias(coll, r, C, ("i", k)) if coll is Collective.ALLGATHER else home(r, ("i", k))
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
        deps = slot_hazards(steps[r])
        for i, x in enumerate(steps[r]):
            x.deps = sorted(d for d in deps[i] | explicit[r][i] if 0 <= d < i)
        progs.append(GpuProgram(r, r, li, lo, scratch[r], steps[r]))
    prog = Program(clean_name(name), coll, C, progs, 0.0)
    _remember(prog, rd.source, origin)
    return prog


def _fold_re(rd: Reader, steps: list[Step], origin: list[str], explicit: list[set[int]]) -> tuple[list[Step], list[str], list[set[int]]]:
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
                f"re adds {fmt_slot(x.src)} to {fmt_slot(x.dst)}; flowride's programs have no local add, so only a re whose source a plain receive has just written, for this re alone, can be read (as a receive that reduces)",
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


def explain(prog: Program, problem: str) -> str:
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


def _check_races(rd: Reader, glist: list[XGpu], order: list[_Trans], by_s: dict, local) -> None:
    """Two steps of a GPU that touch the same chunk, one of them writing, must be ordered by the
    algorithm itself (thread block order, dependencies, or a chain of transfers); else the
    executor may run them either way round (:func:`~flowride.program.msccl_exec.first_race`)."""
    prev: dict[tuple[int, int], _Trans] = {}
    preds: list[list[int]] = []
    accesses: list[list[tuple]] = []
    for t in order:
        ps = [by_s[(t.gpu, x, s)] for x, s in t.deps]
        if (t.gpu, t.tb) in prev:
            ps.append(prev[(t.gpu, t.tb)])
        if t.match is not None:
            ps.append(t.match)
        preds.append([p.seq for p in ps])
        prev[(t.gpu, t.tb)] = t
        g, st = glist[t.gpu], t.step
        acc = []
        if st.type in LOCAL_SRC:
            acc += [((t.gpu, slot), False, fmt_slot((st.srcbuf, st.srcoff + u))) for u, slot in enumerate(local(g, st, "src"))]
        if st.type in LOCAL_DST:
            acc += [((t.gpu, slot), True, fmt_slot((st.dstbuf, st.dstoff + u))) for u, slot in enumerate(local(g, st, "dst"))]
        accesses.append(acc)
    hit = first_race(preds, accesses)
    if hit is not None:
        ei, si, wi, ej, sj, wj = hit
        raise rd.wrong(
            order[ej].step.path,
            f"{_rw(wj)} {sj} while {order[ei].step.path} {_rw(wi)} {si}, and nothing orders the two (a race)",
            "make the later step depend on the earlier one (depid/deps)",
        )


def _rw(write: bool) -> str:
    return "writes" if write else "reads"


def read_msccl(path: str | Path) -> Program:
    """:func:`from_msccl_xml` of the file at ``path``."""
    text, name = read_msccl_text(path)
    return from_msccl_xml(text, name)


def read_msccl_text(path: str | Path) -> tuple[str, str]:
    """The text of the MSCCL algorithm XML at ``path`` and its file name (what errors quote);
    an unreadable or binary file is an InputError naming it."""
    p = Path(path)
    try:
        return p.read_text(), p.name
    except OSError as e:
        raise InputError(str(p), f"cannot read it: {e.strerror}", "give an existing MSCCL algorithm XML file") from None
    except UnicodeDecodeError:
        raise InputError(str(p), "is not text", "give an MSCCL algorithm XML file") from None
