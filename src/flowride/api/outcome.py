"""What a synthesis returns: the verified schedule, every figure it is measured by, and the report."""

from __future__ import annotations

from dataclasses import dataclass, field

from flowride.api.priced import Headline
from flowride.collectives.demand import Demand
from flowride.schedule.ir import Schedule
from flowride.schedule.metrics import algbw_GBps
from flowride.schedule.simulate import SimResult
from flowride.synth.bounds import Bounds
from flowride.synth.nccl import NcclModel
from flowride.synth.result import SearchResult
from flowride.topology.group import group_info, relay_nodes
from flowride.topology.model import Topology


@dataclass
class SynthOutcome:
    schedule: Schedule
    sim: SimResult
    demand: Demand
    bounds: Bounds
    baseline_name: str
    baseline: SimResult
    search: SearchResult
    epoch_bounds: dict[str, int]
    status: str  # optimal | feasible | timeout | infeasible
    wall_seconds: float
    nccl: NcclModel | None = None  # NCCL's algorithms on the same model (flowride.synth.nccl)
    chunks_requested: int | str = 1  # a count, or "auto" (the search chose: chunk_search)
    chunk_search: list[dict] = field(default_factory=list)  # what --chunks auto tried, in order
    # the baseline's own schedule, kept only where asked (a reduction reverses it rather than
    # building the same ring again; elsewhere it would double what an outcome holds)
    baseline_schedule: Schedule | None = field(default=None, repr=False)
    # a reduction's AllGathers (on the reversed topology first), which the runtime price reads
    parts: tuple[Schedule, ...] = field(default=(), repr=False)
    headline: Headline | None = None  # NCCL's calibrated prediction and flowride's runtime price (api/priced.py)

    @property
    def finish_time_s(self) -> float:
        return float(self.sim.finish_time_s)

    def report(self) -> dict:
        """The report contract read by outside checks (see README)."""
        topo = self.schedule.topology
        lb = self.bounds.best_s
        fin = self.finish_time_s
        gap_epochs = self.search.T - self.search.lower
        h = self.headline
        out = {
            "topology": topo.name,
            "switch_model": switch_model(topo),
            "switching": "published (teccl_compat)" if topo.teccl_compat else topo.switching,
            "group": group_info(topo),  # process group (ranks of the base topology, relay on/off) or None
            "collective": self.demand.collective.value,
            "size_bytes": self.demand.size_bytes,
            "chunks": self.demand.chunks,
            "chunks_requested": self.chunks_requested,
            "gpus": len(topo.gpus),
            "finish_time_us": fin * 1e6,
            "epochs": self.sim.epochs,
            "epoch_duration_us": self.sim.tau * 1e6,
            "algbw_GBps": algbw_GBps(self.demand.size_bytes, fin),
            "lower_bound_us": lb * 1e6,
            "lower_bound_kind": self.bounds.binding,
            "lower_bounds_us": {k: v * 1e6 for k, v in self.bounds.kinds().items()},
            "ratio_to_lower_bound": fin / lb if lb > 0 else None,
            "baseline": self.baseline_name,
            "baseline_us": self.baseline.finish_time_s * 1e6,
            "speedup_vs_baseline": self.baseline.finish_time_s / fin,
            # the headline: NCCL's calibrated prediction and flowride's schedule priced as the
            # runtime runs it, one model on both sides (modelled, with the model's error)
            "nccl_predicted": self.headline.report() if self.headline else None,
            "runtime_us": h.flowride.time_us if h and h.flowride else None,
            "runtime_protocol": h.flowride.protocol if h and h.flowride else None,
            "runtime_unpriced": h.why_unpriced if h and not h.flowride else None,
            "speedup_vs_nccl": h.speedup if h else None,
            # detail: NCCL's algorithms in the epoch model beside this schedule's epoch-model time
            "nccl": self.nccl.report() if self.nccl else None,
            "speedup_vs_nccl_epoch_model": self.nccl.best.time_us / (fin * 1e6) if self.nccl else None,
            "solver_time_s": self.search.solver_seconds,
            "wall_time_s": self.wall_seconds,
            "status": self.status,
            "proven_minimal_epochs": self.status == "optimal",
            "epoch_lower_bound": self.search.lower,
            "epoch_gap": gap_epochs,
            "verified": self.sim.valid,
            "method": self.schedule.meta.get("method"),
            "method_requested": self.schedule.meta.get("method_requested"),
            "subgraph": self.schedule.meta.get("subgraph"),  # the faster links' subgraph it was made on (api.subgraphs), or None
            "objective": self.schedule.meta.get("objective", "makespan"),
            "chunk_search": self.chunk_search,
            "peak_rss_mb": _peak_rss_mb(),
            "probes": [{"T": p.T, "outcome": p.outcome, "seconds": round(p.seconds, 4), "columns": p.columns, "rows": p.rows} for p in self.search.probes],
        }
        return out


def switch_model(topo: Topology) -> str:
    """How the topology's switches are modelled, for reports: the published TE-CCL model, every
    switch copying (NVLS-class multicast), forwarding only (the physical default of most presets),
    mixed, or none."""
    if topo.teccl_compat:
        return "published (teccl_compat)"
    relays = set(relay_nodes(topo))  # GPUs outside a process group, forwarding: not switches of the machine
    kinds = {topo.nodes[w].copy for w in topo.switches if w not in relays}
    model = {frozenset(): "no switches", frozenset({True}): "copy", frozenset({False}): "forward"}.get(frozenset(kinds), "mixed")
    return model + ("; relays outside the group" if relays else "")


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
