"""flowride's own schedule for a collective, priced as the runtime would run it
(:mod:`flowride.synth.runtime_price`), beside NCCL's calibrated prediction: the two figures of a
"faster than NCCL" priced by one model.

Reductions are priced by the AllGathers flowride reverses to build them (schedule/reduce.py): a
ReduceScatter is its AllGather on the reversed topology run backwards, at the same price; an
AllReduce is that ReduceScatter followed by an AllGather, paying the call's floor once."""

from __future__ import annotations

from dataclasses import dataclass

from flowride.collectives.demand import Collective
from flowride.runtime.nccl_tuning import Calibration
from flowride.synth.runtime_price import RuntimePrice, best_runtime_price
from flowride.topology.model import Topology


@dataclass(frozen=True)
class Priced:
    time_us: float  # modelled: the runtime model's price of flowride's schedule
    protocol: str
    epoch_model_us: float  # the same schedule(s) by the epoch model (links at line rate, their own alpha)
    parts: tuple[RuntimePrice, ...]


def priced_schedule(topo: Topology, collective: Collective | str, size_bytes: int, cal: Calibration, arch: str,
                    time_limit: float | None = 20.0) -> Priced:
    """Synthesize (``chunks="auto"``) and price flowride's schedule of ``collective`` on ``topo``."""
    from flowride.api import synthesize

    c = collective if isinstance(collective, Collective) else Collective.parse(collective)

    def one(t: Topology, coll: Collective) -> tuple[RuntimePrice, float]:
        out = synthesize(t, coll, size_bytes, "fast", chunks="auto", time_limit=time_limit)
        return best_runtime_price(out.schedule, cal, arch), out.finish_time_s * 1e6

    if c in (Collective.ALLGATHER, Collective.ALLTOALL):
        parts = [one(topo, c)]
    elif c is Collective.REDUCESCATTER:
        parts = [one(topo.reversed(), Collective.ALLGATHER)]
    else:
        parts = [one(topo.reversed(), Collective.ALLGATHER), one(topo, Collective.ALLGATHER)]
    prices = tuple(p for p, _ in parts)
    total = sum(p.time_us for p in prices) - sum(p.floor_us for p in prices[1:])
    return Priced(total, "+".join(p.protocol for p in prices), sum(e for _, e in parts), prices)
