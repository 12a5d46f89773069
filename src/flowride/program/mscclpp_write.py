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
from pathlib import Path

from flowride.errors import InputError
from flowride.files import write_json_atomic
from flowride.program.model import Program, Slot, reads, validate_program, writes
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
from flowride.topology.model import Topology


def _channel_type(topology: Topology, program: Program, a: int, b: int) -> str:
    na, nb = topology.nodes[program.gpus[a].node], topology.nodes[program.gpus[b].node]
    return "memory" if na.group == nb.group else "port"


def _local(slot: Slot) -> BufRef:
    return BufRef(slot[1], 1, slot[0])


def _check_topology(program: Program, topology: Topology) -> None:
    if not isinstance(topology, Topology):
        raise InputError("topology", f"is a {type(topology).__name__}, not a Topology", "pass the topology the schedule was built on")
    for g in program.gpus:
        if not (0 <= g.node < topology.num_nodes and topology.nodes[g.node].is_gpu):
            raise InputError(f"program rank {g.rank}.node", f"{g.node} is not a GPU of topology {topology.name}",
                             "pass the topology the schedule was built on")


def build_plan(program: Program, topology: Topology, proto: str = "Simple", name: str | None = None,
               min_bytes: int = 0, max_bytes: int | None = None) -> Plan:
    """The :class:`~flowride.program.mscclpp_plan.Plan` of ``program`` on ``topology``."""
    validate_program(program)
    _check_topology(program, topology)
    if proto not in ("Simple", "LL"):
        raise InputError("proto", f"{proto!r} is not an MSCCL++ protocol flowride writes", "use Simple or LL")
    if not (isinstance(min_bytes, int) and min_bytes >= 0 and (max_bytes is None or (isinstance(max_bytes, int) and max_bytes >= min_bytes))):
        raise InputError("min_bytes/max_bytes", f"{min_bytes!r}..{max_bytes!r} is not a size range", "give 0 <= min_bytes <= max_bytes")
    n, ll = program.ngpus, proto == "LL"
    steps = [g.steps for g in program.gpus]
    send_of: dict[int, tuple[int, int]] = {}
    recv_of: dict[int, tuple[int, int]] = {}
    for r in range(n):
        for i, st in enumerate(steps[r]):
            if st.op == "s":
                send_of[st.tag] = (r, i)
            elif st.op in ("r", "rrc"):
                recv_of[st.tag] = (r, i)
    seq: dict[int, int] = {}  # tag -> its place among the sends of its (sender, receiver) pair
    count: dict[tuple[int, int], int] = defaultdict(int)
    for r in range(n):
        for st in steps[r]:
            if st.op == "s":
                seq[st.tag] = count[(r, st.peer)]
                count[(r, st.peer)] += 1
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
    for tag, (b, j) in recv_of.items():
        st = steps[b][j]
        if ll or st.op == "rrc" or (b, j) in touched:
            land[tag] = ("s", scratch[b])
            scratch[b] += 1
            staged.add(tag)
        else:
            land[tag] = st.dst
    pack: dict[int, Slot] = {}  # LL across nodes: the sender's own scratch slot holding the packets
    if ll:
        for tag, (a, _) in send_of.items():
            if _channel_type(topology, program, a, recv_of[tag][0]) == "port":
                pack[tag] = ("s", scratch[a])
                scratch[a] += 1

    gpus: list[GpuPlan] = []
    for r, g in enumerate(program.gpus):
        peers: dict[str, set[int]] = {"memory": set(), "port": set()}
        for st in g.steps:
            if st.op != "cpy":
                peers[_channel_type(topology, program, r, st.peer)].add(st.peer)
        chans = [(t, sorted(peers[t])) for t in ("memory", "port") if peers[t]]
        ch_index = {(t, p): k for t, ps in chans for k, p in enumerate(ps)}
        rbufs: list[RemoteBuffer] = []
        rb_index: dict[tuple[int, str], int] = {}  # (peer, buffer) -> buffer_id (its place among its channel type's)
        per_type: dict[str, int] = defaultdict(int)
        for st in g.steps:
            if st.op == "s" and (st.peer, land[st.tag][0]) not in rb_index:
                t = _channel_type(topology, program, r, st.peer)
                rb_index[(st.peer, land[st.tag][0])] = per_type[t]
                per_type[t] += 1
                rbufs.append(RemoteBuffer(st.peer, land[st.tag][0], [t]))
        ops: list[Op] = []
        waited: dict[int, int] = defaultdict(int)
        for st in g.steps:
            if st.op == "cpy":
                ops.append(Op("copy", [_local(st.src)], [_local(st.dst)]))
                continue
            t = _channel_type(topology, program, r, st.peer)
            ch = [ch_index[(t, st.peer)]]
            if st.op == "s":
                slot = land[st.tag]
                remote = BufRef(slot[1], 1, None, rb_index[(st.peer, slot[0])])
                if not ll and t == "memory":
                    ops += [Op("put", [_local(st.src)], [remote], t, ch), Op("signal", [], [], t, ch)]
                elif not ll:
                    ops.append(Op("pwsf", [_local(st.src)], [remote], t, ch))
                elif t == "memory":
                    ops.append(Op("ppkt", [_local(st.src)], [remote], t, ch))
                else:
                    ops += [Op("cpkt", [_local(st.src)], [_local(pack[st.tag])]), Op("ppkt", [_local(pack[st.tag])], [remote], t, ch)]
                continue
            if not ll:
                need = seq[st.tag] + 1 - waited[st.peer]
                ops += [Op("wait", [], [], t, ch) for _ in range(need)]
                waited[st.peer] = max(waited[st.peer], seq[st.tag] + 1)
            if st.tag not in staged:
                continue
            stage = _local(land[st.tag])
            if st.op == "rrc":
                ops.append(Op("repkt" if ll else "re", [_local(st.src), stage], [_local(st.dst)], extra={"reduce_op": "sum"}))
            else:
                ops.append(Op("upkt" if ll else "copy", [stage], [_local(st.dst)]))
        tb = Threadblock(0, _with_nops(ops), [(t, list(range(len(ps)))) for t, ps in chans],
                         [(t, [k for k, b in enumerate(rbufs) if b.access == [t]]) for t, _ in chans if any(b.access == [t] for b in rbufs)])
        i_chunks = g.i_chunks
        gpus.append(GpuPlan(r, i_chunks, g.o_chunks, scratch[r], [tb], chans, rbufs, []))
    extra = {"reuse_resources": False, "num_threads_per_block": 1024, "use_double_scratch_buffer": ll,
             "buffer_alignment": 16, "min_message_size": min_bytes, "max_message_size": MAX_U64 if max_bytes is None else max_bytes}
    return Plan(name or program.name or "flowride", program.collective.value, proto, False, gpus, extra)


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
    16 channels or remote buffers of a type) is refused as :class:`InputError`: the executor would
    refuse to launch it, and flowride writes one thread block per GPU (``within_limits=False``
    skips that check: tests of the writer's logic on large schedules)."""
    from flowride.program.mscclpp_exec import run_plan
    from flowride.program.mscclpp_rules import check_limits, check_rules

    plan = build_plan(program, topology, proto, name, min_bytes, max_bytes)
    over = check_limits(plan) if within_limits else []
    if over:
        raise InputError("mscclpp", f"the {program.collective.value} plan on {program.ngpus} GPUs would exceed the MSCCL++ "
                         f"executor's limits: {over[0]}" + (f" (and {len(over) - 1} more)" if len(over) > 1 else ""),
                         "flowride writes one thread block per GPU: export a schedule with fewer chunks (flowride synth "
                         "--chunks 1) or fewer GPUs (docs/mscclpp.md)")
    found = check_rules(plan)
    ran = run_plan(plan) if not found else None
    if found or ran.problems or ran.unmodelled:
        why = found or (ran.problems if ran.problems else [ran.unmodelled])
        raise ValueError(f"the MSCCL++ plan written for {program.collective.value} on {program.ngpus} GPUs fails its check: "
                         f"{why[0]}" + (f" (and {len(why) - 1} more)" if len(why) > 1 else ""))
    return plan.to_json()


def write_mscclpp(program: Program, topology: Topology, path: str | Path, proto: str = "Simple", name: str | None = None,
                  min_bytes: int = 0, max_bytes: int | None = None) -> Path:
    """Write :func:`to_mscclpp` of ``program`` to ``path`` atomically (indented JSON); returns the path."""
    plan = to_mscclpp(program, topology, proto, name, min_bytes, max_bytes)
    write_json_atomic(path, plan, indent=1)
    return Path(path)
