"""Replay a schedule under the alpha-beta epoch model and check it, independently of the solver.

Checks, in this order of reporting: every send names a real link, GPU and chunk; nothing is sent
before it is held (a GPU) or forwarded in another epoch than it arrived (a switch; a switch that
cannot copy sends out no more than came in); no link exceeds its capacity in any window of b+1
epochs; every demand is met. The finish time is the epoch at whose start the last needed chunk
is held, times tau.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from flowride.schedule.ir import Schedule


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


def simulate(schedule: Schedule, max_violations: int = 50) -> SimResult:
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
    use: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    def order(s):
        lk = s.link if 0 <= s.link < len(links) else None
        sender_is_switch = lk is not None and not nodes[links[lk].src].is_gpu
        return (s.epoch, 0 if sender_is_switch else 1)

    # When each GPU would eventually hold each chunk, for messages that do not depend on order.
    eventual: dict[tuple[int, int, int], int] = {}
    for s in schedule.sends:
        if 0 <= s.link < len(links) and nodes[links[s.link].dst].is_gpu:
            key3 = (s.source, s.chunk, links[s.link].dst)
            t = timing.arrival(s.link, s.epoch)
            eventual[key3] = min(t, eventual.get(key3, t))

    for s in sorted(schedule.sends, key=order):
        where = f"send (epoch {s.epoch}, link {s.link}, source {s.source}, chunk {s.chunk})"
        if not 0 <= s.link < len(links):
            bad(f"{where}: no link {s.link} in {topo.name} ({len(links)} links)")
            continue
        if s.epoch < 0:
            bad(f"{where}: negative epoch")
            continue
        if (s.source, s.chunk) not in commodities:
            bad(f"{where}: GPU {s.source} has no chunk {s.chunk} in this {demand.collective.value}")
            continue
        lk = links[s.link]
        u, v = lk.src, lk.dst
        if nodes[u].is_gpu:
            h = 0 if u == s.source else hold.get((s.source, s.chunk, u))
            if h is None or h > s.epoch:
                h = h if h is not None else eventual.get((s.source, s.chunk, u))
                when = "never" if h is None else f"only from epoch {h}"
                bad(f"{where}: GPU {u} sends chunk ({s.source},{s.chunk}) it holds {when}")
                continue
        else:
            key = (s.source, s.chunk, u, s.epoch)
            arrived = at_switch.get(key, 0)
            if arrived == 0:
                bad(f"{where}: switch {u} forwards chunk ({s.source},{s.chunk}) that does not arrive in epoch {s.epoch}")
                continue
            switch_out[key] += 1
            if not nodes[u].copy and switch_out[key] > arrived:
                bad(f"{where}: switch {u} cannot copy, yet sends ({s.source},{s.chunk}) {switch_out[key]} times with {arrived} arrival(s)")
                continue
        use[s.link][s.epoch] += 1
        t = timing.arrival(s.link, s.epoch)
        if nodes[v].is_gpu:
            key3 = (s.source, s.chunk, v)
            if key3 not in hold or t < hold[key3]:
                hold[key3] = t
        else:
            at_switch[(s.source, s.chunk, v, t)] += 1

    for li in sorted(use):
        b = int(timing.beta_epochs[li])
        cap = int(timing.window_cap[li])
        per = use[li]
        lk = links[li]
        for k in sorted(per):
            for start in range(k - b, k + 1):
                n = sum(per.get(j, 0) for j in range(start, start + b + 1))
                if n > cap:
                    span = f"epoch {start}" if b == 0 else f"epochs {start}..{start + b}"
                    bad(f"link {li} ({lk.src}->{lk.dst}) carries {n} chunks in {span}, capacity {cap}")
                    break

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
