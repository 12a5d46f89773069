"""A flowride Program written as an MSCCL++ execution plan (``flowride export --mscclpp``).

Each transfer of the program (a send ``s`` paired with a receive ``r`` or ``rrc`` by its tag)
becomes a one-sided write by the sender into the receiver's memory, over a memory channel when
the two GPUs share a node (NVLink/NVSwitch) and a port channel when they do not (the NIC, driven
by MSCCL++'s proxy):

- ``Simple``: the sender ``put``s the chunk and ``signal``s (a port channel's ``pwsf`` does both
  and flushes); the receiver ``wait``s for that signal, then uses the chunk. A receiver that
  touched the destination slot before its receive, and every ``rrc`` (whose partial is added to a
  local one, ``re``), gets the chunk in a scratch slot of its own instead (staging), so no write
  lands on data still in use. Signals on one channel are counted, not named, so a receiver waits
  for as many as the sender had sent up to the chunk it needs;
- ``LL``: the sender writes the chunk as packets into a scratch slot of the receiver (``ppkt``;
  across nodes it packs it into its own scratch first, ``cpkt``, and the port channel copies the
  packets); the receiver unpacks (``upkt``) or adds (``repkt``) as the packets' flags arrive: no
  signals.

A relay's scratch chunks are the program's own (:mod:`flowride.program.lower`); staging slots
follow them. Each GPU runs one thread block holding its steps in program order, with a ``nop``
(the thread block's barrier) wherever an op must see the previous one finished. See
``docs/mscclpp.md``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flowride.errors import InputError
from flowride.files import write_json_atomic
from flowride.program.model import GpuProgram, Program, Slot, Step, reads, validate_program, writes
from flowride.program.mscclpp_plan import (
    MAX_U64,
    SYNC_OPS,
    BufRef,
    GpuPlan,
    Op,
    Plan,
    RemoteBuffer,
    Threadblock,
)
from flowride.program.mscclpp_rules import (
    MAX_CHANNEL,
    MAX_CHANNEL_PER_OPERATION,
    MAX_OPERATION,
    MAX_THREADBLOCKS,
)
from flowride.program.mscclpp_spread import (
    Bundles,
    Key,
    Places,
    bundle,
    private_scratch,
    relabel,
    spread,
    step_keys,
)
from flowride.topology.model import Topology


def _channel_type(topology: Topology, program: Program, a: int, b: int) -> str:
    na, nb = topology.nodes[program.gpus[a].node], topology.nodes[program.gpus[b].node]
    return "memory" if na.group == nb.group else "port"


def _local(slot: Slot, size: int = 1) -> BufRef:
    return BufRef(slot[1], size, slot[0])


def _check_topology(program: Program, topology: Topology) -> None:
    if not isinstance(topology, Topology):
        raise InputError("topology", f"is a {type(topology).__name__}, not a Topology", "pass the topology the schedule was built on")
    for g in program.gpus:
        if not (0 <= g.node < topology.num_nodes and topology.nodes[g.node].is_gpu):
            raise InputError(f"program rank {g.rank}.node", f"{g.node} is not a GPU of topology {topology.name}",
                             "pass the topology the schedule was built on")


@dataclass
class Prepared:
    """What every spread of one program starts from: the key of each step, the bundles (chunks
    tied together, :func:`~flowride.program.mscclpp_spread.bundle`) and the program with a scratch
    slot per (slot, key) (:mod:`flowride.program.mscclpp_spread`)."""

    keys: list[list[Key]]
    bundles: Bundles
    program: Program


def prepare(program: Program, bundle_size: int = 1, keys: list[list[Key]] | None = None) -> Prepared:
    validate_program(program)
    keys = keys if keys is not None else step_keys(program)
    if bundle_size > 1:  # chunks that are alike side by side first, so that bundles can tie them
        program = relabel(program, keys)
        keys = step_keys(program)
    bundles = bundle(program, keys, bundle_size)
    return Prepared(keys, bundles, private_scratch(program, keys, bundles if bundle_size > 1 else None))


def build_plan(program: Program, topology: Topology, proto: str = "Simple", name: str | None = None,
               min_bytes: int = 0, max_bytes: int | None = None, op_budget: int = MAX_OPERATION,
               prepared: Prepared | None = None, by_chunk: bool = True,
               stage_all: bool = False, by_unit: bool = False, measured: dict[tuple[int, Key], int] | None = None,
               measure: dict[tuple[int, Key], int] | None = None) -> Plan:
    """The :class:`~flowride.program.mscclpp_plan.Plan` of ``program`` on ``topology``, its steps
    spread over thread blocks of at most about ``op_budget`` ops each
    (:mod:`flowride.program.mscclpp_spread`). ``prepared``: :func:`prepare`'s result, when the
    same program is written more than once. ``by_chunk``: deal the keys out chunk by chunk (every
    block's chunk c together, which spreads each GPU's work evenly) rather than block by block;
    ``stage_all``: land every transfer in the receiver's scratch, so a thread block writes one
    remote buffer per peer (16 at most), at the cost of a local copy per receive; ``by_unit``: a
    thread block runs one bundle's steps after another's rather than epoch by epoch (less overlap
    inside it, but a bundle's steps stand together and share ops as they do alone). ``measured``:
    the ops each (rank, bundle) took alone in a thread block, which the spread then uses in place
    of its own pricing; ``measure``: a dict filled with the ops of each thread block holding one
    bundle, by (rank, bundle) (``op_budget=0`` gives every bundle a thread block of its own)."""
    if prepared is None:
        validate_program(program)
    _check_topology(program, topology)
    if proto not in ("Simple", "LL"):
        raise InputError("proto", f"{proto!r} is not an MSCCL++ protocol flowride writes", "use Simple or LL")
    if not (isinstance(min_bytes, int) and min_bytes >= 0 and (max_bytes is None or (isinstance(max_bytes, int) and max_bytes >= min_bytes))):
        raise InputError("min_bytes/max_bytes", f"{min_bytes!r}..{max_bytes!r} is not a size range", "give 0 <= min_bytes <= max_bytes")
    prepared = prepared or prepare(program)
    keys, bundles, program = prepared.keys, prepared.bundles, prepared.program
    n, ll = program.ngpus, proto == "LL"
    steps = [g.steps for g in program.gpus]

    kinds = [[_channel_type(topology, program, a, b) for b in range(n)] for a in range(n)]

    def ctype(a: int, b: int) -> str:
        return kinds[a][b]

    scratch = [g.s_chunks for g in program.gpus]
    land: dict[int, Slot] = {}  # tag -> the receiver's slot the sender writes
    staged: set[int] = set()
    touched: set[tuple[int, int]] = set()  # (rank, step) of receives whose slot an earlier step of the GPU used
    for r in range(n):
        used: set[Slot] = set()
        for i, st in enumerate(steps[r]):
            if st.op in ("r", "rrc") and st.dst in used:
                touched.add((r, i))
            used.update(reads(st))
            used.update(writes(st))
    places = [Places(bundles, scratch[r]) for r in range(n)]  # staging and packets: a bundle's side by side
    for b in range(n):
        for j, st in enumerate(steps[b]):
            if st.op not in ("r", "rrc"):
                continue
            if ll or stage_all or st.op == "rrc" or (b, j) in touched:
                land[st.tag] = ("s", places[b].take(keys[b][j], "stage"))
                staged.add(st.tag)
            else:
                land[st.tag] = st.dst
    pack: dict[int, Slot] = {}  # LL across nodes: the sender's own scratch slot holding the packets
    if ll:
        for r in range(n):
            packed: dict[Slot, Slot] = {}  # sends of one slot share its packets (a fan packs once)
            for i, st in enumerate(steps[r]):
                if st.op == "s" and ctype(r, st.peer) == "port":
                    if st.src not in packed:
                        packed[st.src] = ("s", places[r].take(keys[r][i], "pack"))
                    pack[st.tag] = packed[st.src]
    scratch = [pl.next for pl in places]

    def fans_on(r: int, x: Step, y: Step) -> bool:  # y can join x's fan: one chunk to or from one more peer
        if x.op != y.op or x.op == "cpy" or x.peer == y.peer or ctype(r, x.peer) != ctype(r, y.peer):
            return False
        if ctype(r, x.peer) == "port" and x.op == "s" and not ll:  # a Simple send across nodes is a pwsf per peer
            return False
        if x.op == "s":
            return y.src == x.src
        if x.op == "rrc":
            return x.tag in staged and y.tag in staged and y.src == x.dst == y.dst
        return x.tag not in staged and y.tag not in staged

    # A thread block runs its steps epoch by epoch and, within an epoch, chunk by chunk (a chunk's
    # steps of one epoch side by side, so that they can share ops), or with by_unit bundle by
    # bundle. Chunks are independent and every GPU keeps the same order, so a receive never waits
    # for a send that comes later in it.
    order = (lambda k: (k[1], k[0])) if by_chunk else (lambda k: k)
    nth: list[list[int]] = []  # rank -> step -> its place among its chunk's steps on the rank (alike across a bundle)
    for r in range(n):
        seen: dict[Key, int] = defaultdict(int)
        nth.append([])
        for k in keys[r]:
            nth[r].append(seen[k])
            seen[k] += 1
    first_step = {}  # (rank, bundle) -> its first step on the rank: where a measured cost is put
    for r in range(n):
        for i in range(len(steps[r])):
            first_step.setdefault((r, bundles.rep[keys[r][i]]), i)

    def cost(r: int, i: int) -> int:  # the ops a step takes alone, nops included, one wait assumed (before runs and fans)
        st = steps[r][i]
        if measured is not None:
            unit = (r, bundles.rep[keys[r][i]])
            return measured.get(unit, 0) if first_step[unit] == i else 0
        if bundles.member[keys[r][i]]:  # shares the op of its bundle's first chunk
            return 0
        if st.op == "cpy":
            return 2
        port = ctype(r, st.peer) == "port"
        if st.op == "s":
            return (4 if port else 2) if ll else (1 if port else 3)
        return 2 if ll else (4 if st.tag in staged else 2)

    def peer(r: int, i: int) -> tuple[str, int] | None:
        st = steps[r][i]
        return None if st.op == "cpy" else (ctype(r, st.peer), st.peer)

    def rbuf(r: int, i: int) -> tuple[str, int, str] | None:
        st = steps[r][i]
        return (ctype(r, st.peer), st.peer, land[st.tag][0]) if st.op == "s" else None

    tb_of = spread([[bundles.rep[k] for k in ks] for ks in keys], cost, peer, rbuf, op_budget, MAX_CHANNEL, order=order)

    def next_to(a: Slot | None, b: Slot | None) -> bool:
        return a is not None and b is not None and a[0] == b[0] and a[1] + 1 == b[1]

    def fan(r: int, run: list[int]) -> bool:  # a run over several peers, one chunk each
        return len(run) > 1 and steps[r][run[1]].peer != steps[r][run[0]].peer

    def joins(r: int, run: list[int], i: int) -> bool:
        """Whether step i of rank r shares the op of ``run``, the steps just before it in their
        thread block: the next chunks of contiguous slots to the same peer, or (a fan,
        :func:`fans_on`) the same chunk to or from one more peer (one op, a channel each)."""
        x, y, first = steps[r][run[-1]], steps[r][i], steps[r][run[0]]
        if x.op != y.op:
            return False
        if x.peer == y.peer and not fan(r, run):
            if x.op == "cpy":
                return next_to(x.src, y.src) and next_to(x.dst, y.dst)
            if x.src is not None and not next_to(x.src, y.src):
                return False
            if x.op == "s":
                return next_to(land[x.tag], land[y.tag]) and (x.tag not in pack or next_to(pack[x.tag], pack[y.tag]))
            return (x.tag in staged) == (y.tag in staged) and next_to(x.dst, y.dst) and (x.tag not in staged or next_to(land[x.tag], land[y.tag]))
        if (x.op == "cpy" or len(run) >= MAX_CHANNEL_PER_OPERATION or (len(run) > 1 and not fan(r, run))
                or y.peer in {steps[r][j].peer for j in run} or ctype(r, y.peer) != ctype(r, first.peer)):
            return False
        return fans_on(r, x, y) and (x.op != "s" or y.src == first.src)

    # Each thread block's steps, in program order, cut into runs that share one op: chunks on
    # contiguous slots (one op of as many chunks, one signal) or a fan over peers (one op, a
    # channel per peer).
    runs_of: list[dict[int, list[list[int]]]] = []
    for r in range(n):
        per_tb: dict[int, list[list[int]]] = {}
        for i in sorted(range(len(steps[r])), key=lambda i: (0 if by_unit else bundles.epoch[r][i], order(bundles.rep[keys[r][i]]),
                                                              bundles.epoch[r][i], nth[r][i], bundles.member[keys[r][i]], i)):
            runs = per_tb.setdefault(tb_of[r][i], [])
            if runs and joins(r, runs[-1], i):
                runs[-1].append(i)
            else:
                runs.append([i])
        runs_of.append(per_tb)
    # The channels: thread block t of GPU a holds one channel to b exactly when thread block t of
    # b holds one to a (some transfer of t's keys goes between them), so channels pair in order.
    opened: list[dict[str, set[tuple[int, int]]]] = [{"memory": set(), "port": set()} for _ in range(n)]
    seq: dict[int, int] = {}  # tag -> the place of its run's signal among those of its thread block's channel
    count: dict[tuple[int, int, int], int] = defaultdict(int)
    for r in range(n):
        for t, runs in runs_of[r].items():
            for run in runs:
                st = steps[r][run[0]]
                if st.op == "s":
                    for i in run:
                        p = steps[r][i].peer
                        opened[r][ctype(r, p)].add((t, p))
                        opened[p][ctype(r, p)].add((t, r))
                        seq[steps[r][i].tag] = count[(r, p, t)]
                    for p in {steps[r][i].peer for i in run}:
                        count[(r, p, t)] += 1

    def write_gpu(r: int, g: GpuProgram) -> GpuPlan:  # GPU r's part of the plan
        chans = [(t, sorted(opened[r][t])) for t in ("memory", "port") if opened[r][t]]
        gpu_ch = {(t, tp): k for t, tps in chans for k, tp in enumerate(tps)}  # (type, (tb, peer)) -> GPU channel index
        rbufs: list[RemoteBuffer] = []
        rb_index: dict[tuple[int, str], int] = {}  # (peer, buffer) -> GPU remote buffer index

        def remote_buffer(tb: _Tb, ct: str, p: int, buf: str) -> int:  # the thread block's buffer_id of peer p's buffer
            if (p, buf) not in rb_index:
                rb_index[(p, buf)] = len(rbufs)
                rbufs.append(RemoteBuffer(p, buf, [ct]))
            return tb.buffer(ct, rb_index[(p, buf)])

        def waits(tb: _Tb, t: int, run: list[Step]) -> list[Op]:  # wait for every signal the run's chunks need
            need: dict[int, int] = {}
            for st in run:
                need[st.peer] = max(need.get(st.peer, 0), seq[st.tag] + 1)
            out = []
            while any(need[p] > tb.waited[p] for p in need):
                ps = [p for p in need if need[p] > tb.waited[p]]
                ct = ctype(r, ps[0])
                out.append(Op("wait", [], [], ct, [tb.channel(ct, gpu_ch[(ct, (t, p))]) for p in ps]))
                for p in ps:
                    tb.waited[p] += 1
            return out

        def fan_ops(t: int, run: list[Step], tb: _Tb) -> list[Op]:  # one chunk to or from several peers
            st = run[0]
            ct = ctype(r, st.peer)
            ch = [tb.channel(ct, gpu_ch[(ct, (t, x.peer))]) for x in run]
            if st.op == "s":  # the kernel reads destination k's source from src_buff[k]: one entry per peer
                remotes = [BufRef(land[x.tag][1], 1, None, remote_buffer(tb, ct, x.peer, land[x.tag][0])) for x in run]
                if ll and ct == "port":  # pack once, then the packets to every peer
                    return [Op("cpkt", [_local(st.src)], [_local(pack[st.tag])]),
                            Op("ppkt", [_local(pack[st.tag]) for _ in run], remotes, ct, ch)]
                if ll:
                    return [Op("ppkt", [_local(st.src) for _ in run], remotes, ct, ch)]
                return [Op("put", [_local(st.src) for _ in run], remotes, ct, ch), Op("signal", [], [], ct, ch)]
            out = [] if ll else waits(tb, t, run)
            if st.op == "rrc":
                out.append(Op("repkt" if ll else "re", [_local(st.src)] + [_local(land[x.tag]) for x in run], [_local(run[-1].dst)],
                              extra={"reduce_op": "sum"}))
            return out

        blocks: list[Threadblock] = []
        for t, runs in sorted(runs_of[r].items()):
            tb = _Tb()
            for run in runs:
                st = g.steps[run[0]]
                if fan(r, run):
                    tb.ops += fan_ops(t, [g.steps[i] for i in run], tb)
                    continue
                k = len(run)
                if st.op == "cpy":
                    tb.ops.append(Op("copy", [_local(st.src, k)], [_local(st.dst, k)]))
                    continue
                ct = ctype(r, st.peer)
                ch = [tb.channel(ct, gpu_ch[(ct, (t, st.peer))])]
                if st.op == "s":
                    remote = BufRef(land[st.tag][1], k, None, remote_buffer(tb, ct, st.peer, land[st.tag][0]))
                    if not ll and ct == "memory":
                        tb.ops += [Op("put", [_local(st.src, k)], [remote], ct, ch), Op("signal", [], [], ct, ch)]
                    elif not ll:
                        tb.ops.append(Op("pwsf", [_local(st.src, k)], [remote], ct, ch))
                    elif ct == "memory":
                        tb.ops.append(Op("ppkt", [_local(st.src, k)], [remote], ct, ch))
                    else:
                        tb.ops += [Op("cpkt", [_local(st.src, k)], [_local(pack[st.tag], k)]),
                                   Op("ppkt", [_local(pack[st.tag], k)], [remote], ct, ch)]
                    continue
                if not ll:
                    tb.ops += waits(tb, t, [g.steps[i] for i in run])
                if st.tag not in staged:
                    continue
                stage = _local(land[st.tag], k)
                if st.op == "rrc":
                    tb.ops.append(Op("repkt" if ll else "re", [_local(st.src, k), stage], [_local(st.dst, k)], extra={"reduce_op": "sum"}))
                else:
                    tb.ops.append(Op("upkt" if ll else "copy", [stage], [_local(st.dst, k)]))
            blocks.append(Threadblock(len(blocks), _with_nops(tb.ops), [(ct, list(ids)) for ct, ids in tb.channels.items()],
                                      [(ct, list(ids)) for ct, ids in tb.buffers.items()]))
            if measure is not None and len(units := {bundles.rep[keys[r][i]] for run in runs for i in run}) == 1:
                measure[(r, units.pop())] = len(blocks[-1].ops)
        return GpuPlan(r, g.i_chunks, g.o_chunks, scratch[r], blocks, [(t, [p for _, p in tps]) for t, tps in chans], rbufs, [])
    gpus = [write_gpu(r, g) for r, g in enumerate(program.gpus)]
    extra = {"reuse_resources": False, "num_threads_per_block": 1024, "use_double_scratch_buffer": ll,
             "buffer_alignment": 16, "min_message_size": min_bytes, "max_message_size": MAX_U64 if max_bytes is None else max_bytes}
    return Plan(name or program.name or "flowride", program.collective.value, proto, False, gpus, extra)


@dataclass
class _Tb:
    """A thread block as it is written: its ops, and the GPU channels and remote buffers it holds,
    per channel type, in the order its ops first use them (an op names them by that place)."""

    ops: list[Op] = field(default_factory=list)
    channels: dict[str, dict[int, int]] = field(default_factory=dict)  # type -> {GPU channel: its place}
    buffers: dict[str, dict[int, int]] = field(default_factory=dict)  # type -> {GPU remote buffer: its place}
    waited: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def channel(self, ctype: str, gpu_channel: int) -> int:
        ids = self.channels.setdefault(ctype, {})
        return ids.setdefault(gpu_channel, len(ids))

    def buffer(self, ctype: str, gpu_buffer: int) -> int:
        ids = self.buffers.setdefault(ctype, {})
        return ids.setdefault(gpu_buffer, len(ids))


def _with_nops(ops: list[Op]) -> list[Op]:
    """``ops`` with a ``nop`` (``__syncthreads``) after every data op and between a wait and the
    data op after it: an op runs on all threads, a signal or wait on the first few only."""
    out: list[Op] = []
    for op in ops:
        if out:
            prev = out[-1]
            if prev.name not in SYNC_OPS or (prev.name in ("wait", "rlxwait") and op.name not in SYNC_OPS):
                out.append(Op("nop"))
        out.append(op)
    return out


def to_mscclpp(program: Program, topology: Topology, proto: str = "Simple", name: str | None = None,
               min_bytes: int = 0, max_bytes: int | None = None, within_limits: bool = True) -> dict:
    """The MSCCL++ execution plan of ``program`` (lowered on ``topology``) as a JSON object.
    ``min_bytes``/``max_bytes``: the message sizes the executor may pick the plan for (a size
    range of a range export). Every plan is held to the executor's rules and its symbolic run
    before it is returned, as :func:`~flowride.program.to_msccl_xml` checks its XML: a plan that
    fails either is a bug here, raised as ValueError, never written. A plan over the executor's
    fixed tables (:func:`~flowride.program.mscclpp_rules.check_limits`: 64 ops per thread block,
    16 channels or remote buffers of a type, 104 thread blocks) is refused as :class:`InputError`:
    the executor would refuse to launch it, or could deadlock. The steps are spread over as many
    thread blocks as the ops need (:mod:`~flowride.program.mscclpp_spread`); when a thread block
    needs more waits than the spread counted, it is spread again with less room per thread block.
    ``within_limits=False`` returns the plan whatever its size (tests of the writer's logic)."""
    from flowride.program.mscclpp_exec import run_plan
    from flowride.program.mscclpp_rules import check_rules

    def check(plan: Plan) -> list[str]:
        found = check_rules(plan)
        ran = run_plan(plan) if not found else None
        return found or (ran.problems if ran.problems else ([ran.unmodelled] if ran.unmodelled else []))

    first = None
    for plan, over, coarse in _candidates(program, topology, proto, name, min_bytes, max_bytes):
        if over and within_limits:
            first = first or over
            continue
        why = check(plan)
        if why and coarse:  # a coarser pipeline that does not hold up is passed over, not written
            first = first or [f"the plan with chunks tied together fails its check: {why[0]}"]
            continue
        if why:
            raise ValueError(f"the MSCCL++ plan written for {program.collective.value} on {program.ngpus} GPUs fails its check: "
                             f"{why[0]}" + (f" (and {len(why) - 1} more)" if len(why) > 1 else ""))
        return plan.to_json()
    raise InputError("mscclpp", f"the {program.collective.value} plan on {program.ngpus} GPUs would exceed the MSCCL++ "
                     f"executor's limits: {first[0]}" + (f" (and {len(first) - 1} more)" if len(first) > 1 else ""),
                     f"flowride spreads a GPU's steps over at most {MAX_THREADBLOCKS} thread blocks of "
                     f"{MAX_OPERATION} ops: export a schedule with fewer chunks (flowride synth --chunks N) "
                     "or fewer GPUs (docs/mscclpp.md)")


def _candidates(program: Program, topology: Topology, proto: str, name: str | None, min_bytes: int,
                max_bytes: int | None) -> Iterator[tuple[Plan, list[str], bool]]:
    """Plans of ``program`` in the order they are preferred, each with what it exceeds of the
    executor's tables and whether it ties chunks together (a coarser pipeline than the schedule's).
    Every bundle is first written alone in a thread block, which measures its ops on each GPU; the
    spread deals bundles by those measures into thread blocks of 64 ops, with less room where
    bundles together take more ops than alone (epoch by epoch, a bundle's steps that would share
    an op alone are apart). A way whose GPUs' measured totals exceed 104 thread blocks of 64 ops is
    passed over unbuilt. The ways, in order: chunks dealt chunk first, then landing every transfer
    in scratch, then block first, then bundle by bundle (with and without scratch); then bundle by
    bundle with 2, 4, 8, ... chunks tied together (:func:`~flowride.program.mscclpp_spread.bundle`)."""
    from flowride.program.mscclpp_rules import check_limits

    validate_program(program)
    _check_topology(program, topology)
    keys = step_keys(program)

    def build(budget: int, prepared: Prepared, variant: dict) -> tuple[Plan, list[str], bool]:
        plan = build_plan(program, topology, proto, name, min_bytes, max_bytes, op_budget=budget, prepared=prepared, **variant)
        over = check_limits(plan)
        return plan, over, not any(" ops, over " in o for o in over)

    measured: dict[tuple[int, bool], tuple[Plan, dict[tuple[int, Key], int], bool]] = {}

    def measure(size: int, prepared: Prepared, stage_all: bool) -> tuple[Plan, dict[tuple[int, Key], int], bool]:
        """The plan with every bundle in a thread block of its own, the ops each took there, and
        whether the GPUs' totals could fit the thread blocks allowed at all."""
        if (size, stage_all) not in measured:
            alone: dict[tuple[int, Key], int] = {}
            apart = build_plan(program, topology, proto, name, min_bytes, max_bytes, op_budget=0, prepared=prepared,
                               stage_all=stage_all, measure=alone)
            per_rank: dict[int, int] = defaultdict(int)
            for (r, _), ops in alone.items():
                per_rank[r] += ops
            measured[(size, stage_all)] = (apart, alone, max(per_rank.values(), default=0) <= MAX_THREADBLOCKS * MAX_OPERATION)
        return measured[(size, stage_all)]

    def search(size: int, prepared: Prepared, variant: dict) -> tuple[Plan, list[str], bool]:
        apart, alone, possible = measure(size, prepared, variant.get("stage_all", False))
        if not possible:  # more ops on some GPU than the thread blocks allowed can hold, however dealt
            return apart, check_limits(apart), True
        variant = {**variant, "measured": alone}
        budget, best = MAX_OPERATION, build(MAX_OPERATION, prepared, variant)
        while not best[2] and budget > MAX_OPERATION // 4:  # more ops together than alone: give each less room
            budget -= MAX_OPERATION // 8
            best = build(budget, prepared, variant)
        return best

    size = 1
    while size <= max(1, program.chunks):
        prepared = prepare(program, size, keys)
        if size == 1 or any(v > 1 for v in prepared.bundles.size.values()):
            ways = ({}, {"stage_all": True}, {"by_chunk": False}, {"by_unit": True}, {"by_unit": True, "stage_all": True})
            ways = ways if size == 1 else ({"by_unit": True}, {"by_unit": True, "stage_all": True})
            for variant in ways:
                plan, over, _ = search(size, prepared, variant)
                yield plan, over, size > 1
        size *= 2


def write_mscclpp(program: Program, topology: Topology, path: str | Path, proto: str = "Simple", name: str | None = None,
                  min_bytes: int = 0, max_bytes: int | None = None) -> Path:
    """Write :func:`to_mscclpp` of ``program`` to ``path`` atomically (indented JSON); returns the path."""
    plan = to_mscclpp(program, topology, proto, name, min_bytes, max_bytes)
    write_json_atomic(path, plan, indent=1)
    return Path(path)
