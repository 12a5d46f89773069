"""Any Program as a flowride schedule, so the independent simulator can verify it.

An MSCCL algorithm read from XML (:func:`~flowride.program.msccl_read.read_msccl`) has no
schedule behind it; turning its program into one on a full mesh of its GPUs lets
``flowride verify algo.xml`` run it through the same simulator that checks synthesized schedules,
instead of trusting the symbolic check alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from flowride.errors import InputError, InvalidSchedule
from flowride.program.model import Program, hazards, run_program, validate_program
from flowride.program.msccl_read import explain
from flowride.schedule.ir import Schedule, Send
from flowride.schedule.simulate import SimResult, simulate
from flowride.topology.builtins import full
from flowride.topology.timing import resolve_tau


def program_to_schedule(program: Program) -> Schedule:
    """A flowride schedule doing what ``program`` does, on a full mesh of its GPUs (one chunk per
    link per epoch, no latency), so :func:`~flowride.schedule.simulate.simulate` can verify it.

    The program is executed symbolically first (:func:`~flowride.program.model.check_program`; its first problem is
    raised), which also tells which chunk (and which contributions) each transfer carries. Each
    transfer then gets an epoch: a receive lands one epoch after its send, a link carries one
    chunk per epoch, and each GPU's sends and receives of a chunk keep their program order (the
    simulator keeps one value per chunk per GPU). A transfer's (source, chunk) is the chunk it
    carries; it reduces when its receive is an ``rrc``. The schedule is simulated before it is
    returned; see ``docs/msccl.md``."""
    validate_program(program)
    ran: list[tuple[int, int]] = []
    problems, carried = run_program(program, order=ran)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise InvalidSchedule("program", f"does not compute the {program.collective.value}: {explain(program, problems[0])}{more}", "fix the algorithm")
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
        for k, ds in enumerate(hazards(rw)):
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
    sim = simulate(sched)
    if not sim.valid:
        raise InputError(
            "program",
            f"computes the {coll.value} (symbolic check), but its flowride schedule fails the simulator: {sim.first_violation}",
            "flowride schedules hold one partial sum per chunk per GPU; an algorithm that keeps several at once can only be checked symbolically",
        )
    return sched


def place_and_time(build: Callable[[], Program]) -> tuple[Schedule | None, SimResult | None, str]:
    """A program read from a runtime's file (``build`` reads it) placed on a full mesh and replayed:
    (schedule, replay, "") or (None, None, why not) where the schedule model cannot place it; what
    ``verify`` of an MSCCL XML and of an MSCCL++ plan both report after the file's own rules held."""
    try:
        sched = program_to_schedule(build())
    except InputError as e:  # InvalidSchedule too: the model's limits, the file's own rules held
        return None, None, str(e)
    sim = simulate(sched)
    if not sim.valid:
        return None, None, f"the simulator rejects the schedule built from it: {sim.first_violation}"
    return sched, sim, ""
