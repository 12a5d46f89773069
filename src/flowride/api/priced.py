"""A report's one NCCL figure and flowride's time beside it, both from the calibrated runtime
model (:mod:`flowride.runtime`): what NCCL is predicted to take for the call (its algorithm and
protocol by NCCL's cost model corrected by the calibration, with the model's error at that size
on the measured curves behind it) and flowride's schedule priced as the runtime would run it
(:mod:`flowride.synth.runtime_price`). The speedup a report headlines is the one of these two.

Reductions are priced by the AllGathers flowride reverses to build them (schedule/reduce.py): a
ReduceScatter is its AllGather on the reversed topology run backwards, at the same price; an
AllReduce is that ReduceScatter followed by an AllGather, paying the call's floor once. Where
NCCL's own modelled algorithm won the search (``nccl ring (modelled)``), flowride's schedule is
NCCL's algorithm, priced as the calibrated model prices it."""

from __future__ import annotations

from dataclasses import dataclass

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.runtime.defaults import Chosen
from flowride.runtime.nccl_tuning import estimates
from flowride.runtime.predict import choose
from flowride.schedule.ir import Schedule
from flowride.synth.nccl import machine
from flowride.synth.runtime_price import RuntimePrice, best_runtime_price

# sends of a schedule priced (three protocols, each a retime and a replay: about 10 us a send on
# one core); beyond it flowride's runtime price is left out and the report says why
PRICE_BUDGET_SENDS = 400_000


@dataclass(frozen=True)
class Priced:
    time_us: float  # modelled: the runtime model's price of flowride's schedule
    protocol: str
    parts: tuple[RuntimePrice, ...]


@dataclass(frozen=True)
class Headline:
    """The two figures of a "faster than NCCL", both modelled by one calibrated model."""

    nccl_us: float
    nccl_algorithm: str
    nccl_protocol: str
    calibration: str
    model_error: float | None  # median |predicted/measured - 1| of the fit near this size; None: unknown
    borrowed: str | None  # the node type whose measured figures stand in, if not this one's
    flowride: Priced | None
    why_unpriced: str = ""

    @property
    def speedup(self) -> float | None:
        return self.nccl_us / self.flowride.time_us if self.flowride and self.flowride.time_us > 0 else None

    def report(self) -> dict:
        return {"time_us": self.nccl_us, "algorithm": self.nccl_algorithm, "protocol": self.nccl_protocol,
                "calibration": self.calibration, "model_error": self.model_error, "borrowed": self.borrowed, "modelled": True}


def price_parts(schedules: tuple[Schedule, ...], chosen: Chosen, arch: str) -> Priced:
    """AllGather (or AlltoAll) schedules run one after another in one call: each priced, the
    call's floor paid once."""
    prices = tuple(best_runtime_price(s, chosen.calibration, arch) for s in schedules)
    total = sum(p.time_us for p in prices) - sum(p.floor_us for p in prices[1:])
    return Priced(total, "+".join(p.protocol for p in prices), prices)


def headline(schedule: Schedule, parts: tuple[Schedule, ...], collective: Collective, size_bytes: int,
             chosen: Chosen) -> Headline | None:
    """NCCL's calibrated prediction for ``collective`` of ``size_bytes`` on ``schedule``'s topology
    and flowride's ``schedule`` (for a reduction: its AllGather ``parts``) priced beside it; None
    where NCCL's cost model has nothing to price (no scale-up or NIC bandwidth it recognises)."""
    topo = schedule.topology
    m = machine(topo)
    if not estimates(collective, m, size_bytes, chosen.calibration):
        return None  # NCCL's cost model sees no bandwidth here (hosts joined by GPU links, no NICs)
    e = choose(collective, m, size_bytes, chosen.calibration)
    method = str(schedule.meta.get("method") or "")
    ours: Priced | None = None
    why = ""
    if method.startswith("nccl "):  # NCCL's own algorithm won: priced as the model prices that algorithm
        name = method.split()[1]
        try:
            own = choose(collective, m, size_bytes, chosen.calibration, algorithm=name)
            ours = Priced(own.time_us, own.protocol, ())
        except InputError:  # an algorithm the closed form lacks for this call: priced as a schedule below
            ours = None
    if ours is None:
        pieces = parts if collective.reduces else (schedule,)
        sends = sum(len(p.sends) for p in pieces)
        if not pieces:
            why = "the reduction's AllGathers were not kept"
        elif sends > PRICE_BUDGET_SENDS:
            why = f"{sends:,} sends: over the {PRICE_BUDGET_SENDS:,} a report prices"
        else:
            ours = price_parts(pieces, chosen, m.arch)
    return Headline(e.time_us, e.algorithm, e.protocol, chosen.name, chosen.error_at(size_bytes), chosen.borrowed, ours, why)



def nccl_priced(topo, collective: Collective, size_bytes: int, algorithm: str, chosen: Chosen) -> float | None:
    """NCCL's ``algorithm`` as the epoch model builds it on ``topo`` (:mod:`flowride.synth.nccl`),
    priced as a schedule by the same function as flowride's (modelled, us); None where the epoch
    IR does not build that algorithm. NCCL's calibrated closed form sees a machine (GPUs, NICs),
    not the fabric behind the NICs; this sees the spines too. A reduction is priced by the
    AllGathers it reverses, as flowride's are. On rails it meets the closed form within 10% at
    256 MiB (tests/test_runtime_price.py)."""
    from flowride.synth.nccl import model_nccl

    ag = Collective.ALLGATHER
    back = topo if topo.symmetric() else topo.reversed()  # the same links either way: keep their order
    plan = {Collective.REDUCESCATTER: [(back, ag)], Collective.ALLREDUCE: [(back, ag), (topo, ag)]}
    parts = []
    for t, c in plan.get(collective, [(topo, collective)]):
        md = model_nccl(t, c, size_bytes).algorithms.get(algorithm)
        if md is None or md.schedule is None:
            return None
        parts.append(md.schedule)
    return price_parts(tuple(parts), chosen, machine(topo).arch).time_us
