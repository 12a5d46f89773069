"""The MSCCL executor's rules (Azure/msccl-executor-nccl), in one place, for the reader, for
``flowride verify`` and for export: what its parser (``src/misc/msccl/msccl_parser.cc``) refuses
or reads differently than it looks, what its kernel (``src/device/msccl_kernel.cu``) needs to
make progress, and :func:`check_executor`, which runs an algorithm symbolically the way the
kernel does (:mod:`flowride.program.msccl_exec`) in every mode the executor picks it for.

The elements are checked one by one first (:func:`~flowride.program.msccl_xml.parse_algo`). A
file the executor cannot run (a deadlock, a race, a wrong result, a dependency that never
releases) raises :class:`~flowride.errors.InvalidSchedule`; a file it would refuse to load but
flowride can still judge gives a :class:`Finding` (``flowride verify --strict`` fails on those).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from flowride.errors import InputError, InvalidSchedule
from flowride.program.model import (
    BUF_NAMES,
    GpuProgram,
    Program,
    Slot,
    buffer_layout,
    expected_outputs,
    fmt_slot,
    initial_buffers,
    inplace_alias,
    ranks_text,
)
from flowride.program.msccl_exec import Key, Tx, race_of, run_kernel
from flowride.program.msccl_limits import (
    GPU_SMS,
    LOCAL_DST,
    LOCAL_SRC,
    MAX_DEP_TB,
    MAX_REDUCE_FUSION,
    MAX_TBS,
    MAX_TBS_PER_CHANNEL,
    RECV_TYPES,
    SEND_TYPES,
    SENDS_IN_FLIGHT,
    SMS_WARN,
)
from flowride.program.msccl_xml import Algo, Reader, XGpu, XStep, XTb

MODES = {True: "in-place", False: "out-of-place"}


@dataclass(frozen=True)
class Finding:
    """Something the executor refuses or does differently than written, that does not make the
    algorithm wrong where it runs (``flowride verify`` warns; ``--strict`` fails)."""

    where: str
    problem: str

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


class Deadlock(InvalidSchedule):
    """A deadlock of the kernel run; ``full`` names each stuck send that waits for room in its
    connection, as (gpu, thread block, s), so a writer can cut its connection there."""

    def __init__(self, field: str, problem: str, fix: str = "", full: tuple[tuple[int, int, int], ...] = ()) -> None:
        super().__init__(field, problem, fix)
        self.full = full


@dataclass
class ExecutorReport:
    """What :func:`check_executor` ran: the modes found correct, and what it only warns about."""

    modes: list[str]
    proto: str
    room: int  # unreceived sends a connection holds
    transfers: int  # chunks sent, per run
    thread_blocks: int  # most thread blocks of one GPU
    findings: list[Finding]


def sm_count(value: int | str | None) -> int | None:
    """SMs of the target GPU: a count, or a name from :data:`GPU_SMS` (None: not given)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        if value is not None and value < 1:
            raise InputError("sms", f"{value} is not a positive number of SMs", "give the GPU's SM count, e.g. 132, or its name")
        return value
    text = str(value).strip().lower()
    if text.isdigit() and int(text) > 0:
        return int(text)
    if text in GPU_SMS:
        return GPU_SMS[text]
    raise InputError("sms", f"{value!r} is neither a number of SMs nor a known GPU", f"give a count or one of {', '.join(GPU_SMS)}")


# ---------------------------------------------------------------------------------------------
# Rules on elements, shared with the reader (msccl_read)


def header_findings(algo: Algo) -> list[Finding]:
    """<algo> attributes the parser requires (a missing one fails the load; it reads no
    defaults) and a size range the scheduler can never pick (``msccl_lifecycle.cc``)."""
    rd = algo.reader
    out = [Finding(f"{rd.source}:algo.{x}", "is missing: the executor's parser requires it and refuses the file (msccl_parser.cc)") for x in algo.missing]
    if algo.max_bytes and algo.max_bytes < algo.min_bytes:
        raise rd.wrong("algo.maxBytes", f"{algo.max_bytes} is below minBytes ({algo.min_bytes}), so the executor never picks the algorithm",
                       'give maxBytes >= minBytes, or maxBytes="0" for no upper limit')
    return out


def tb_groups(rd: Reader, g: XGpu, tb: XTb) -> list[tuple[list[XStep], list[tuple[int, int]]]]:
    """The thread block's transmissions as the parser builds them: each real step with the
    dependencies of the nops before it, consecutive ``re`` steps on one destination fused
    (the later ones without a dependency; ``hasdep="1"`` or the thread block's 16th ``re``
    ends a run). Dependencies are checked for existence here, for release in :func:`release`."""
    out: list[tuple[list[XStep], list[tuple[int, int]]]] = []
    pending: list[tuple[int, int]] = []
    open_re, n_re = False, 0
    for k, st in enumerate(tb.steps):
        if st.depid >= 0:
            if st.depid >= len(g.tbs):
                raise rd.err(f"{st.path}.depid", f"GPU {g.id} has no thread block {st.depid}", "point the dependency at an existing thread block")
            if not 0 <= st.deps < len(g.tbs[st.depid].steps):
                raise rd.err(f"{st.path}.deps", f"thread block {st.depid} has no step {st.deps}", "point the dependency at an existing step")
            if st.depid > MAX_DEP_TB:
                raise rd.err(f"{st.path}.depid", f"{st.depid} does not fit the executor's 8-bit dependency ids", f"give thread blocks others wait on ids up to {MAX_DEP_TB}")
            if st.depid == tb.id and st.deps >= k:
                raise rd.err(f"{st.path}.deps", f"waits for step {st.deps} of its own thread block, which runs later", "remove the dependency")
        if st.type == "nop":
            if st.depid >= 0:
                pending.append((st.depid, st.deps))
            elif any(x.type != "nop" for x in tb.steps[k + 1:]):
                raise rd.err(f"{st.path}.depid", "a nop without a dependency shifts the executor's step count", "remove the nop or give it a dependency")
            continue
        last = out[-1][0][-1] if out else None
        if st.type == "re" and open_re and st.depid < 0 and last and (last.dstbuf, last.dstoff, last.srcbuf) == (st.dstbuf, st.dstoff, st.srcbuf):
            if pending:
                raise rd.err(f"{st.path}.depid", "the executor fuses this re with the re before it and moves the dependencies of the nops between them to a later step", "move the nops' dependencies onto a step, or break the run of re steps")
            if st.cnt != last.cnt:
                raise rd.err(f"{st.path}.cnt", f"is {st.cnt}, but the executor fuses it with {last.path} (cnt {last.cnt}) and uses one count for both", "give fused re steps one cnt")
            out[-1][0].append(st)
            if len(out[-1][0]) > MAX_REDUCE_FUSION:
                raise rd.wrong(st.path, f"the executor fuses {len(out[-1][0])} re steps into one reduction; its kernel adds at most {MAX_REDUCE_FUSION}", 'end the run with hasdep="1" or a dependency')
        else:
            if pending and st.depid < 0:
                raise rd.err(f"{st.path}.depid", "follows nops that carry dependencies, so it must carry one too (the executor rejects the XML otherwise)", "move one of the nops' dependencies onto this step")
            out.append(([st], pending + ([(st.depid, st.deps)] if st.depid >= 0 else [])))
            pending = []
        n_re += st.type == "re"
        open_re = st.type == "re" and not st.hasdep and n_re != MAX_REDUCE_FUSION
    return out


def release(rd: Reader, g: XGpu, groups: list[list[tuple[list[XStep], list[tuple[int, int]]]]], findings: list[Finding]) -> list[list[list[tuple[int, int]]]]:
    """Per transmission of each thread block, per dependency (x, s): (x, index of the transmission
    of thread block x whose flag releases it). The kernel waits until x's flag reaches s; a flag
    is posted only by a transmission with ``hasdep="1"`` (its last step's ``s``), so the first such
    transmission at or after s releases it, and with none the wait spins forever (refused; on its
    own thread block, one that runs before). Released later than s is a :class:`Finding`."""
    out = []
    for tb, tgroups in zip(g.tbs, groups, strict=True):
        per_tb = []
        for i, (steps, deps) in enumerate(tgroups):
            got = []
            for x, s in deps:
                cands = groups[x] if x != tb.id else tgroups[:i]
                hit = next((j for j, (st2, _) in enumerate(cands) if st2[-1].hasdep and st2[-1].s >= s), None)
                target = g.tbs[x].steps[s]
                if hit is None:
                    what = "a nop" if target.type == "nop" else 'hasdep="0"'
                    mine = " (its own thread block)" if x == tb.id else ""
                    raise rd.wrong(
                        f"{target.path}.hasdep", f"{steps[0].path}{mine} waits for this step, but it is {what} and no later step of thread block {x} "
                        "signals either, so it never signals: the executor spins forever", 'set hasdep="1" on it')
                by = cands[hit][0][-1]
                if by is not target:
                    findings.append(Finding(f"{rd.source}:{steps[0].path}", f"waits for {target.path}, which does not signal; the executor releases it only when {by.path} does"))
                got.append((x, hit))
            per_tb.append(got)
        out.append(per_tb)
    return out


def connections(rd: Reader, glist: list[XGpu]) -> dict[Key, tuple[XTb | None, XTb | None]]:
    """(sending thread block, receiving thread block) of every connection: one thread block per
    (peer, channel) and direction (NCCL keeps one FIFO per connection), at most 32 with a send
    peer and 32 with a receive peer per channel (``MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL``)."""
    send_tb: dict[Key, XTb] = {}
    recv_tb: dict[Key, XTb] = {}
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
    return {k: (send_tb.get(k), recv_tb.get(k)) for k in sorted(set(send_tb) | set(recv_tb))}


def pairs(rd: Reader, conns: dict[Key, tuple[XTb | None, XTb | None]]) -> list[tuple[tuple[int, int, int], tuple[int, int, int], int]]:
    """Every send step with the receive step it feeds, as ((gpu, tb, s), (gpu, tb, s), cnt): the
    k-th sending step of a connection's sending thread block with the k-th receiving step of its
    receiving one (FIFO order)."""
    out = []
    for key, (stb, rtb) in conns.items():
        a, b, ch = key
        snd = [st for st in stb.steps if st.type in SEND_TYPES] if stb else []
        rcv = [st for st in rtb.steps if st.type in RECV_TYPES] if rtb else []
        for k in range(max(len(snd), len(rcv))):
            if k >= len(rcv):
                raise rd.err(snd[k].path, f"sends to GPU {b} on channel {ch}, but GPU {b} receives only {len(rcv)} time(s) from GPU {a} on channel {ch}", f"add the matching receive on GPU {b}, or remove the send")
            if k >= len(snd):
                raise rd.err(rcv[k].path, f"receives from GPU {a} on channel {ch}, but GPU {a} sends only {len(snd)} time(s) to GPU {b} on channel {ch}", f"add the matching send on GPU {a}, or remove the receive")
            if snd[k].cnt != rcv[k].cnt:
                raise rd.err(f"{rcv[k].path}.cnt", f"is {rcv[k].cnt}, but the matching send {snd[k].path} has cnt {snd[k].cnt}", "make both sides move the same number of chunks")
            out.append(((a, stb.id, snd[k].s), (b, rtb.id, rcv[k].s), snd[k].cnt))
    return out


def step_slots(rd: Reader, g: XGpu, st: XStep, which: str, algo: Algo, inplace: bool) -> tuple[list[Slot], list[Slot]]:
    """The ``cnt`` local slots a step's src or dst names: (where they live, canonical through
    the in-place aliasing when ``inplace``; as written). Checked against the declared chunks and
    against the real buffer of the mode."""
    li, lo = buffer_layout(algo.coll, algo.n, algo.chunks)
    real = {"i": li, "o": lo}
    buf, off = (st.srcbuf, st.srcoff) if which == "src" else (st.dstbuf, st.dstoff)
    field_ = f"{st.path}.{which}off"
    declared = {"i": g.i_chunks, "o": g.o_chunks, "s": g.s_chunks}[buf]
    if off < 0:
        raise rd.err(field_, f"{buf}[{off}] is not a chunk, but {st.type} uses its {which}", "give the offset of the chunk")
    if off + st.cnt - 1 >= declared:
        raise rd.err(field_, f"{buf}[{off}..{off + st.cnt - 1}] is outside the {declared} {BUF_NAMES[buf]} chunks declared by {g.path}.{buf}_chunks", "raise the declared count or fix the offset")
    canon, shown = [], []
    for u in range(st.cnt):
        slot = (buf, off + u)
        c = inplace_alias(algo.coll, g.id, algo.chunks, slot) if inplace else slot
        size = g.s_chunks if c[0] == "s" else real[c[0]]
        if c[1] >= size:
            raise rd.err(field_, f"{buf}[{off + u}] is outside the {BUF_NAMES[buf]} buffer ({size} chunks in an {MODES[inplace]} {algo.coll.value} of {algo.n * algo.chunks} chunks per loop)", "fix the offset")
        canon.append(c)
        shown.append(slot)
    return canon, shown


# ---------------------------------------------------------------------------------------------
# The whole algorithm


def check_executor(algo: Algo, sms: int | str | None = None) -> ExecutorReport:
    """Judge ``algo`` by the executor's rules: the parser's, co-residency of a GPU's thread
    blocks (at most ``sms``, the GPU's SM count or name, when given), dependencies that release,
    and a symbolic run of the kernel with bounded connections in each mode the executor picks it
    for (in place and/or out of place): no deadlock, no race, the collective's result. Raises
    :class:`~flowride.errors.InvalidSchedule` naming the step (and the mode) at fault."""
    rd, glist = algo.reader, algo.gpus
    findings = header_findings(algo)
    cap = sm_count(sms)
    most = max(len(g.tbs) for g in glist)
    for g in glist:
        if cap is not None and len(g.tbs) > cap:
            raise rd.wrong(g.path, f"has {len(g.tbs)} thread blocks, and a GPU with {cap} SMs holds {cap} at once; the executor's blocks spin-wait "
                           "on each other, so all must be resident or the kernel hangs", "use fewer thread blocks, or give the target GPU's SMs")
    if cap is None and most > SMS_WARN:
        findings.append(Finding(f"{rd.source}:algo", f"a GPU runs {most} thread blocks, which must all be resident at once (one per SM); a GPU "
                                f"with fewer SMs (v100: {SMS_WARN}) hangs; give the target GPU's SMs to check (the executor's own cap is {MAX_TBS})"))
    groups = [[tb_groups(rd, g, tb) for tb in g.tbs] for g in glist]
    rel = [release(rd, g, gg, findings) for g, gg in zip(glist, groups, strict=True)]
    conns = connections(rd, glist)
    pairs(rd, conns)
    proto = algo.proto or "Simple"
    room = SENDS_IN_FLIGHT[proto]
    txs: list[list[list[Tx]]] = []
    for g, gg in zip(glist, groups, strict=True):
        txs.append([[Tx(g.id, tb.id, st[0].type, st, deps, st[-1].s, bool(st[-1].hasdep), st[-1].cnt,
                        (g.id, tb.send, tb.chan) if st[0].type in SEND_TYPES else None,
                        (tb.recv, g.id, tb.chan) if st[0].type in RECV_TYPES else None) for st, deps in tg] for tb, tg in zip(g.tbs, gg, strict=True)])
    for g, gt in enumerate(txs):
        for t, lst in enumerate(gt):
            for tx, waits in zip(lst, rel[g][t], strict=True):
                tx.waits = [txs[g][x][j] for x, j in waits]
    modes = [m for m, on in ((True, algo.inplace_flag), (False, algo.outofplace_flag)) if on]
    failed: list[tuple[bool, InvalidSchedule]] = []
    for inplace in modes:
        try:
            _run_mode(algo, txs, inplace, room, proto)
        except InvalidSchedule as e:
            failed.append((inplace, e))
    if failed:
        inplace, e = failed[0]
        other = [MODES[m] for m in modes if m != inplace]
        if other:
            problem = f"{e.problem}; the algorithm is also marked {other[0]}, and that run {'fails too' if len(failed) > 1 else 'is correct'}"
            e = Deadlock(e.field, problem, e.fix, e.full) if isinstance(e, Deadlock) else InvalidSchedule(e.field, problem, e.fix)
        raise e
    transfers = sum(tx.cnt for gt in txs for lst in gt for tx in lst if tx.send)
    return ExecutorReport([MODES[m] for m in modes], proto, room, transfers, most, findings)


def _run_mode(algo: Algo, txs: list[list[list[Tx]]], inplace: bool, room: int, proto: str) -> None:
    """One symbolic run of the kernel in one mode; raises on a deadlock, a race or a result that
    is not the collective's."""
    rd = algo.reader
    tag = f"{MODES[inplace]} run"
    for g, gt in zip(algo.gpus, txs, strict=True):
        for lst in gt:
            for tx in lst:
                tx.src, tx.shown_src, tx.dst, tx.shown_dst = [], [], [], []
                if tx.type in LOCAL_SRC:
                    for st in tx.steps:
                        c, s = step_slots(rd, g, st, "src", algo, inplace)
                        tx.src.append(c)
                        tx.shown_src.append(s)
                if tx.type in LOCAL_DST:
                    tx.dst, tx.shown_dst = step_slots(rd, g, tx.steps[0], "dst", algo, inplace)
    prog = Program(algo.name, algo.coll, algo.chunks, [GpuProgram(r, r, 0, 0, 0, []) for r in range(algo.n)])

    def at(r: int, slot: Slot) -> Slot:
        return inplace_alias(algo.coll, r, algo.chunks, slot) if inplace else slot

    init = [{at(r, k): v for k, v in initial_buffers(prog, r).items()} for r in range(algo.n)]
    run = run_kernel(txs, room, init, proto)
    if run.stuck is not None:
        full = tuple((tx.gpu, tx.tb, tx.steps[0].s) for tx in run.full)
        raise Deadlock(f"{rd.source}:{run.stuck.path}", f"deadlock ({tag}): {run.why} ({run.nstuck} thread block(s) stuck)", "fix the dependencies or the order of sends and receives", full)
    race = race_of(run)
    if race is not None:
        first, did, later, does = race
        raise rd.wrong(later.path, f"{does} while {first.path} {did}, and nothing orders the two (a race, {tag})", "make the later step depend on the earlier one (depid/deps)")
    if run.problems:
        tx, problem = run.problems[0]
        more = f" (and {len(run.problems) - 1} more problem(s))" if len(run.problems) > 1 else ""
        raise rd.wrong(tx.path, f"{problem} ({tag}){more}", "fix the algorithm")
    for r in range(algo.n):
        for slot, want in expected_outputs(prog, r).items():
            got = run.bufs[r].get(at(r, slot))
            if got != want:
                have = "nothing" if got is None else f"chunk {got[0]} with contributions of rank(s) {ranks_text(got[1])}"
                raise rd.wrong(algo.gpus[r].path, f"{tag}: rank {r} {fmt_slot(at(r, slot))} holds {have} at the end; expected chunk {want[0]} with "
                               f"contributions of rank(s) {ranks_text(want[1])} (the {algo.coll.value} is not computed)", "fix the algorithm")
