"""A job priced end to end: its collectives on the fabric (NCCL's way and flowride's), one
iteration simulated with each, its bubbles, and what harvesting and synthesis win.

:func:`plan_job` is the one call behind ``flowride plan``; the report it returns is plain data
(:meth:`Plan.report`), with every assumption that shaped a figure written next to it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from flowride.plan.comm import Group, Priced, Pricer, p2p_seconds
from flowride.plan.costs import (
    chunk_costs,
    dp_bytes,
    p2p_bytes,
    tp_allreduce_bytes,
    tp_allreduces_per_chunk,
)
from flowride.plan.harvestable import Harvestable, harvestable
from flowride.plan.iteration import Timeline, simulate
from flowride.plan.job import Job
from flowride.synth.result import Progress
from flowride.topology.fabrics import NODE_TYPES


@dataclass
class Plan:
    job: Job
    nccl: Timeline  # the iteration with NCCL's best modelled collectives
    ours: Timeline  # with flowride's synthesized ones (the same when synthesis is off)
    collectives: list[Priced]
    harvest: Harvestable
    seconds: float
    assumptions: list[str] = field(default_factory=list)
    tp_action_s: float = 0.0  # TP all-reduce seconds inside each forward and backward (flowride's prices)

    def report(self) -> dict:
        j, tl = self.job, self.ours
        t = tl.iteration_s
        n = tl.ranks
        compute = statistics.fmean(tl.compute_s) / t
        tp = statistics.fmean(tl.tp_s) / t
        dp = statistics.fmean(tl.dp_s) / t
        bub = statistics.fmean(tl.bubble_s()) / t
        by_type: dict[str, dict] = {}
        for g in tl.gaps:
            d = by_type.setdefault(g.type, {"count": 0, "seconds": 0.0, "lengths_s": []})
            d["count"] += 1
            d["seconds"] += g.seconds
            d["lengths_s"].append(g.seconds)
        for d in by_type.values():
            ls = sorted(d.pop("lengths_s"))
            d.update({"median_s": statistics.median(ls), "min_s": ls[0], "max_s": ls[-1]})
        tokens = j.model.microbatch_size * j.model.seq_len * j.parallel.microbatches * j.parallel.dp
        return {
            "job": j.name, "gpus": j.gpus, "nodes": j.nodes, "node": j.hardware.node, "network": j.hardware.network,
            "parallel": j.parallel.model_dump(), "iteration_s": t, "iteration_s_nccl": self.nccl.iteration_s,
            "tokens_per_s": tokens / t, "tokens_per_s_nccl": tokens / self.nccl.iteration_s,
            "shares": {"compute": compute, "tp_comm": tp, "dp_comm": dp, "bubbles": bub},
            "per_stage": [{"stage": r, "compute_s": tl.compute_s[r], "tp_comm_s": tl.tp_s[r], "dp_comm_s": tl.dp_s[r],
                           "bubble_s": tl.bubble_s()[r], "bubble_share": tl.bubble_s()[r] / t} for r in range(n)],
            "bubbles_by_type": by_type,
            "collectives": [c.as_dict() for c in self.collectives],
            "synthesis_saves_s_per_iteration": self.nccl.iteration_s - t,
            "synthesis_saves_share": (self.nccl.iteration_s - t) / self.nccl.iteration_s,
            "harvest": self.harvest.as_dict(),
            "plan_seconds": self.seconds,
            "assumptions": self.assumptions,
        }


def groups(job: Job) -> tuple[Group, Group]:
    """The TP group (``tp`` GPUs of one node, or ``tp / gpus_per_node`` whole nodes) and a DP
    group (the same GPU of ``dp`` nodes when TP fills a node; else ``gpus_per_node / tp`` of them
    share a node), ranks ordered TP fastest, then DP, then PP (Megatron's default)."""
    hw, p = job.hardware, job.parallel
    per = NODE_TYPES[hw.node].gpus
    common = dict(node=hw.node, network=hw.network, nic=hw.nic, oversubscription=hw.oversubscription)
    tp = Group(nodes=max(1, p.tp // per), per_node=min(p.tp, per), **common)
    in_node = max(1, per // p.tp) if p.tp < per else 1  # DP peers sharing a node
    dp_per_node = min(in_node, p.dp)
    dp = Group(nodes=max(1, p.dp // dp_per_node), per_node=dp_per_node if p.tp < per else 1, **common)
    return tp, dp


def plan_job(job: Job, pricer: Pricer | None = None, progress: Progress | None = None) -> Plan:
    """Price ``job``: see the module. ``pricer`` holds the collective cache (a fresh one, with
    the job's synthesis settings and the default cache file, when None)."""
    t0 = time.perf_counter()
    pricer = pricer or Pricer(synth=job.synthesis.enabled, time_limit_s=job.synthesis.time_limit_s)
    p = job.parallel
    tp_g, dp_g = groups(job)
    priced: list[Priced] = []

    def price(coll: str, size: int, g: Group) -> Priced:
        if progress:
            progress({"stage": "collective", "collective": coll, "size": size, "group": g.size})
        pr = pricer.price(coll, size, g)
        priced.append(pr)
        return pr

    n_ar = tp_allreduces_per_chunk(job)
    tp_pr = price("allreduce", tp_allreduce_bytes(job), tp_g) if n_ar else None
    if p.distributed_optimizer:
        rs = price("reducescatter", dp_bytes(job), dp_g)
        ag = price("allgather", dp_bytes(job), dp_g)
        dp_nccl, dp_ours = (rs.nccl_us + ag.nccl_us) * 1e-6, (rs.ours_us + ag.ours_us) * 1e-6
    else:
        ar = price("allreduce", dp_bytes(job), dp_g)
        dp_nccl, dp_ours = ar.nccl_us * 1e-6, ar.ours_us * 1e-6
    per = NODE_TYPES[job.hardware.node].gpus
    p2p = p2p_seconds(tp_g, p2p_bytes(job), same_node=p.tp * p.dp < per) if p.pp > 1 else 0.0
    if job.model.p2p_s is not None:
        p2p = job.model.p2p_s
    chunks = chunk_costs(job)
    tp_nccl = n_ar * (tp_pr.nccl_us * 1e-6 if tp_pr else 0.0)
    tp_ours = n_ar * (tp_pr.ours_us * 1e-6 if tp_pr else 0.0)
    if progress:
        progress({"stage": "simulate", "ranks": p.pp, "microbatches": p.microbatches})
    nccl = simulate(job, chunks, tp_nccl, p2p, dp_nccl)
    ours = simulate(job, chunks, tp_ours, p2p, dp_ours) if (tp_ours, dp_ours) != (tp_nccl, dp_nccl) else nccl
    pricer.save()
    return Plan(job, nccl, ours, priced, harvestable(job, ours), time.perf_counter() - t0, assumptions(job), tp_ours)


def assumptions(job: Job) -> list[str]:
    """What shaped the figures, said next to them."""
    hw, m = job.hardware, job.model
    out = []
    if m.forward_s is None:
        out.append(f"compute from FLOPs (Megatron's per-layer count, backward = 2 x forward split evenly into input and weight "
                   f"gradients) at {job.peak_tflops:g} TFLOP/s peak x {hw.mfu:g} MFU = {job.peak_tflops * hw.mfu:.0f} TFLOP/s "
                   "sustained per GPU (an assumption)")
    else:
        out.append("compute from the measured per-stage profile")
    out.append("tensor-parallel all-reduces exposed (on the critical path); p2p transfers one NIC (or NVLink) hop each, "
               "added to every cross-stage dependency")
    out.append(f"data-parallel synchronisation after each stage's last backward, {job.parallel.dp_overlap:.0%} of it hidden; "
               "optimizer step, embedding and data loading not modelled")
    out.append("collectives priced on the group's own nodes only (no traffic from other groups on shared links)")
    if job.harvest.tasks:
        out.append(f"harvesting: FreeRide's fit rule (factor {job.harvest.factor:g}), a step on a training GPU worth a step on "
                   f"the reference device, GPU memory not checked, training slowed by {job.harvest.overhead_pct:g}% while "
                   "harvesting")
    return out
