"""Replay a schedule under the alpha-beta epoch model and check it, independently of the solver.

Checks, in this order of reporting: every send names a real link, GPU and chunk; nothing is sent
before it is held (a GPU) or forwarded in another epoch than it arrived (a switch; a switch that
cannot copy sends out no more than came in); no link exceeds its capacity in any window of b+1
epochs; every demand is met. The finish time is the epoch at whose start the last needed chunk
is held, times tau.

Reducing collectives (ReduceScatter, AllReduce) are replayed with the contributions each partial
sum carries (:func:`_simulate_reduce`): a send carries the sender's partial as it stands when the
send starts; a reducing receive adds it, and is an error if any contribution would be counted
twice; a copy overwrites. A switch cannot add, so it forwards each partial it receives as its own
message. A GPU that forwards before it has combined everything it should have is caught at the
end: its destination then lacks a contribution (or, if the rest follows later, counts one twice).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from flowride.schedule.ir import SEND_ORDER, Schedule
from flowride.schedule.links import window_loads


@dataclass
class SimResult:
    valid: bool
    violations: list[str]
    epochs: int | None  # K_req: epochs until every demand is met
    finish_time_s: float | None
    tau: float
    holds: dict[tuple[int, int, int], int] = field(repr=False, default_factory=dict)

    @property
    def first_violation(self) -> str | None:
        return self.violations[0] if self.violations else None


def check_capacity(schedule: Schedule, sends, bad) -> None:
    """No link starts more chunks than its window capacity in any b+1 consecutive epochs (counting
    ``sends``, the ones that passed the other checks, so one bad send is reported once)."""
    timing = schedule.timing
    links = schedule.topology.links
    use: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for s in sends:
        use[s.link][s.epoch] += 1
    for li in sorted(use):
        b = int(timing.beta_epochs[li])
        cap = int(timing.window_cap[li])
        per = use[li]
        lk = links[li]
        # the windows that start at a send hold the most (by bisection in the sorted starts)
        ep = np.sort(np.repeat(np.fromiter(per.keys(), dtype=np.int64), np.fromiter(per.values(), dtype=np.int64)))
        starts, n = window_loads(ep, b)
        for start, cnt in zip(starts[n > cap].tolist(), n[n > cap].tolist(), strict=True):
            span = f"epoch {start}" if b == 0 else f"epochs {start}..{start + b}"
            bad(f"link {li} ({lk.src}->{lk.dst}) carries {cnt} chunks in {span}, capacity {cap}")


def simulate(schedule: Schedule, max_violations: int = 50) -> SimResult:
    if schedule.collective.reduces:
        return _simulate_reduce(schedule, max_violations)
    topo = schedule.topology
    demand = schedule.demand
    timing = schedule.timing
    nodes = topo.nodes
    links = topo.links
    commodities = {(q.source, q.chunk) for q in demand.commodities}
    violations: list[str] = []

    def bad(msg: str) -> None:
        if len(violations) < max_violations:
            violations.append(msg)

    hold: dict[tuple[int, int, int], int] = {}  # (source, chunk, gpu) -> epoch held from
    at_switch: dict[tuple[int, int, int, int], int] = defaultdict(int)  # (s, c, switch, epoch) -> arrivals
    switch_out: dict[tuple[int, int, int, int], int] = defaultdict(int)
    accepted: list = []

    # When each GPU would eventually hold each chunk, for messages that do not depend on order.
    eventual: dict[tuple[int, int, int], int] = {}
    for s in schedule.sends:
        if 0 <= s.link < len(links) and nodes[links[s.link].dst].is_gpu:
            key3 = (s.source, s.chunk, links[s.link].dst)
            t = timing.arrival(s.link, s.epoch)
            eventual[key3] = min(t, eventual.get(key3, t))

    def where(s) -> str:
        return f"send (epoch {s.epoch}, link {s.link}, source {s.source}, chunk {s.chunk})"

    def arrive(s) -> None:
        accepted.append(s)
        t = timing.arrival(s.link, s.epoch)
        v = links[s.link].dst
        if nodes[v].is_gpu:
            key3 = (s.source, s.chunk, v)
            if key3 not in hold or t < hold[key3]:
                hold[key3] = t
        else:
            at_switch[(s.source, s.chunk, v, t)] += 1

    # Per epoch: the switches first (what arrived for this epoch, cut-through switches passing a
    # chunk on to one another within the epoch, so in as many rounds as the chain is long), then
    # the GPUs (a switch -> GPU hop may take no epoch: what the switches just delivered counts).
    by_epoch: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
    for s in schedule.sends:
        if not 0 <= s.link < len(links):
            bad(f"{where(s)}: no link {s.link} in {topo.name} ({len(links)} links)")
        elif s.epoch < 0:
            bad(f"{where(s)}: negative epoch")
        elif s.reduce:
            bad(f"{where(s)}: a reduction in a {demand.collective.value}, which only moves chunks")
        elif (s.source, s.chunk) not in commodities:
            bad(f"{where(s)}: GPU {s.source} has no chunk {s.chunk} in this {demand.collective.value}")
        else:
            by_epoch[s.epoch][0 if not nodes[links[s.link].src].is_gpu else 1].append(s)
    for e in sorted(by_epoch):
        from_switches, from_gpus = by_epoch[e]
        waiting = sorted(from_switches, key=SEND_ORDER)
        while waiting:
            later = []
            for s in waiting:
                key = (s.source, s.chunk, links[s.link].src, e)
                arrived = at_switch.get(key, 0)
                if arrived > switch_out[key] or (arrived and nodes[links[s.link].src].copy):
                    switch_out[key] += 1
                    arrive(s)
                else:
                    later.append(s)
            if len(later) == len(waiting):
                break
            waiting = later
        for s in waiting:
            u = links[s.link].src
            key = (s.source, s.chunk, u, e)
            arrived = at_switch.get(key, 0)
            if arrived == 0:
                bad(f"{where(s)}: switch {u} forwards chunk ({s.source},{s.chunk}) that does not arrive in epoch {s.epoch}")
            else:
                bad(f"{where(s)}: switch {u} cannot copy, yet sends ({s.source},{s.chunk}) {switch_out[key] + 1} times with {arrived} arrival(s)")
        for s in sorted(from_gpus, key=SEND_ORDER):
            u = links[s.link].src
            h = 0 if u == s.source else hold.get((s.source, s.chunk, u))
            if h is None or h > s.epoch:
                h = h if h is not None else eventual.get((s.source, s.chunk, u))
                when = "never" if h is None else f"only from epoch {h}"
                bad(f"{where(s)}: GPU {u} sends chunk ({s.source},{s.chunk}) it holds {when}")
                continue
            arrive(s)

    check_capacity(schedule, accepted, bad)

    last = 0
    for q in demand.commodities:
        for d in q.dests:
            h = hold.get((q.source, q.chunk, d))
            if h is None:
                bad(f"demand not met: GPU {d} never receives chunk {q.chunk} of GPU {q.source}")
            else:
                last = max(last, h)
    valid = not violations
    epochs = last if valid else None
    return SimResult(valid, violations, epochs, epochs * timing.tau if valid else None, timing.tau, hold)


def _names(mask: int, gpus: list[int]) -> str:
    return ", ".join(str(g) for i, g in enumerate(gpus) if mask >> i & 1)


def _simulate_reduce(schedule: Schedule, max_violations: int) -> SimResult:
    """Replay a ReduceScatter / AllReduce, tracking which GPUs' contributions each partial holds."""
    topo = schedule.topology
    demand = schedule.demand
    timing = schedule.timing
    nodes, links = topo.nodes, topo.links
    gpus = list(topo.gpus)
    bit = {g: 1 << i for i, g in enumerate(gpus)}
    full = (1 << len(gpus)) - 1
    commodities = {(q.source, q.chunk) for q in demand.commodities}
    violations: list[str] = []

    def bad(msg: str) -> None:
        if len(violations) < max_violations:
            violations.append(msg)

    part: dict[tuple[int, int, int], int] = {}  # (block, chunk, gpu) -> contributions held (bitmask)

    def held(d: int, c: int, g: int) -> int:
        return part.get((d, c, g), bit[g])

    # (block, chunk, gpu) -> epoch its partial became complete (a single GPU starts complete)
    complete: dict[tuple[int, int, int], int] = {(d, c, g): 0 for (d, c) in commodities for g in gpus} if len(gpus) == 1 else {}
    # arrivals not yet applied: (epoch, seq, node, block, chunk, mask, reduce, in-link)
    pending: list[tuple[int, int, int, int, int, int, bool, int]] = []
    at_switch: dict[tuple[int, int, int, int], list[tuple[int, int, bool]]] = defaultdict(list)
    taken: dict[tuple[int, int, int, int], int] = defaultdict(int)
    seq = 0
    accepted: list = []

    def apply(t: int, v: int, d: int, c: int, mask: int, reduce: bool, li: int) -> None:
        if not nodes[v].is_gpu:
            at_switch[(d, c, v, t)].append((li, mask, reduce))
            return
        cur = held(d, c, v)
        if reduce:
            if cur & mask:
                bad(f"GPU {v} adds contributions of GPU(s) {_names(cur & mask, gpus)} to (block {d}, chunk {c}) twice (epoch {t})")
                return
            cur |= mask
        else:
            cur = mask
        part[(d, c, v)] = cur
        if cur == full:
            complete.setdefault((d, c, v), t)
        else:
            complete.pop((d, c, v), None)

    by_epoch: dict[int, list] = defaultdict(list)
    for s in schedule.sends:
        where = f"send (epoch {s.epoch}, link {s.link}, block {s.source}, chunk {s.chunk})"
        if not 0 <= s.link < len(links):
            bad(f"{where}: no link {s.link} in {topo.name} ({len(links)} links)")
        elif s.epoch < 0:
            bad(f"{where}: negative epoch")
        elif (s.source, s.chunk) not in commodities:
            bad(f"{where}: there is no (block {s.source}, chunk {s.chunk}) in this {demand.collective.value}")
        else:
            by_epoch[s.epoch].append(s)
    def drain(e: int) -> None:
        while pending and pending[0][0] <= e:
            t, _, v2, d, c, mask, reduce, li = heapq.heappop(pending)
            apply(t, v2, d, c, mask, reduce, li)

    def send(s, e: int, mask: int) -> None:
        nonlocal seq
        seq += 1
        accepted.append(s)
        heapq.heappush(pending, (timing.arrival(s.link, e), seq, links[s.link].dst, s.source, s.chunk, mask, s.reduce, s.link))

    def from_switch(s, e: int, last_round: bool) -> bool:
        """Forward what arrived: the i-th send out (by link) takes the i-th arrival (by link) of
        that (block, chunk); a copy-capable switch may copy a plain copy. Before the last round a
        send with no arrival left waits (a cut-through switch upstream may still pass one on)."""
        where = f"send (epoch {s.epoch}, link {s.link}, block {s.source}, chunk {s.chunk})"
        u = links[s.link].src
        key = (s.source, s.chunk, u, e)
        queue = sorted(at_switch.get(key, []))
        n = taken[key]
        if n >= len(queue) and not last_round:
            return False
        taken[key] += 1
        if not queue:
            bad(f"{where}: switch {u} forwards (block {s.source}, chunk {s.chunk}) that does not arrive in epoch {e}")
            return True
        if n >= len(queue):
            if s.reduce or any(r for _, _, r in queue):
                bad(f"{where}: switch {u} sends (block {s.source}, chunk {s.chunk}) {n + 1} times with {len(queue)} arrival(s); a switch cannot copy a partial sum")
                return True
            if not nodes[u].copy:
                bad(f"{where}: switch {u} cannot copy, yet sends (block {s.source}, chunk {s.chunk}) {n + 1} times with {len(queue)} arrival(s)")
                return True
            n = 0
        _, mask, was_reduce = queue[n]
        if was_reduce != s.reduce:
            bad(f"{where}: switch {u} turns a {'reduction' if was_reduce else 'copy'} into a {'reduction' if s.reduce else 'copy'}")
            return True
        send(s, e, mask)
        return True

    for e in sorted(by_epoch):
        drain(e)
        sends = sorted(by_epoch[e], key=lambda s: (nodes[links[s.link].src].is_gpu, s.link))
        waiting = [s for s in sends if not nodes[links[s.link].src].is_gpu]
        while waiting:  # switches pass chunks on to one another within the epoch (cut-through)
            later = [s for s in waiting if not from_switch(s, e, last_round=False)]
            drain(e)
            if len(later) == len(waiting):
                for s in later:
                    from_switch(s, e, last_round=True)
                break
            waiting = later
        drain(e)  # a switch -> GPU hop may take no epoch: what the switches just delivered counts
        for s in sends:
            if nodes[links[s.link].src].is_gpu:
                send(s, e, held(s.source, s.chunk, links[s.link].src))
    pending.sort()
    for t, _, v, d, c, mask, reduce, li in pending:
        apply(t, v, d, c, mask, reduce, li)

    check_capacity(schedule, accepted, bad)
    last = 0
    for q in demand.commodities:
        for g in q.dests:
            h = complete.get((q.source, q.chunk, g))
            if h is None:
                missing = full & ~held(q.source, q.chunk, g)
                bad(f"demand not met: GPU {g} lacks the contributions of GPU(s) {_names(missing, gpus)} to (block {q.source}, chunk {q.chunk})")
            else:
                last = max(last, h)
    valid = not violations
    epochs = last if valid else None
    return SimResult(valid, violations, epochs, epochs * timing.tau if valid else None, timing.tau, dict(complete))
