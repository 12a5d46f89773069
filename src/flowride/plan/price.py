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
    attention_share,
    chunk_costs,
    chunk_layers,
    cp_chunk_bytes,
    cp_passes,
    dp_bytes,
    layer_weight_seconds,
    optimizer_seconds,
    p2p_bytes,
    tp_allreduce_bytes,
    tp_allreduces,
)
from flowride.plan.efficiency import flat_description
from flowride.plan.harvestable import Harvestable, harvestable
from flowride.plan.iteration import ChunkComm, Timeline, simulate
from flowride.plan.job import Job
from flowride.plan.memory import Memory, check_memory
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
    tp_action_s: float = 0.0  # TP all-reduce (and CP ring) seconds inside a forward (flowride's prices; the largest chunk's)
    memory: Memory | None = None

    def report(self) -> dict:
        j, tl = self.job, self.ours
        t = tl.iteration_s
        n = tl.ranks
        compute = statistics.fmean(tl.compute_s) / t
        tp = statistics.fmean(tl.tp_s) / t
        cp = statistics.fmean(tl.cp_s) / t if tl.cp_s else 0.0
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
            "shares": {"compute": compute, "tp_comm": tp, "cp_comm": cp, "dp_comm": dp, "bubbles": bub},
            "per_stage": [{"stage": r, "compute_s": tl.compute_s[r], "tp_comm_s": tl.tp_s[r],
                           "cp_comm_s": tl.cp_s[r] if tl.cp_s else 0.0, "dp_comm_s": tl.dp_s[r],
                           "bubble_s": tl.bubble_s()[r], "bubble_share": tl.bubble_s()[r] / t} for r in range(n)],
            "bubbles_by_type": by_type,
            "collectives": [c.as_dict() for c in self.collectives],
            "synthesis_saves_s_per_iteration": self.nccl.iteration_s - t,
            "synthesis_saves_share": (self.nccl.iteration_s - t) / self.nccl.iteration_s,
            "harvest": self.harvest.as_dict(),
            "memory": self.memory.as_dict() if self.memory else None,
            "efficiency": efficiency_dict(j),
            "plan_seconds": self.seconds,
            "assumptions": self.assumptions,
        }


def _strided(job: Job, size: int) -> Group:
    """``size`` ranks spaced ``tp`` apart: the same GPU of ``size`` nodes when TP fills a node;
    else ``gpus_per_node / tp`` of them share a node."""
    hw, p = job.hardware, job.parallel
    per = NODE_TYPES[hw.node].gpus
    in_node = max(1, per // p.tp) if p.tp < per else 1  # peers sharing a node
    per_node = min(in_node, size)
    return Group(node=hw.node, network=hw.network, nic=hw.nic, oversubscription=hw.oversubscription,
                 nodes=max(1, size // per_node), per_node=per_node if p.tp < per else 1)


def groups(job: Job) -> tuple[Group, Group]:
    """The TP group (``tp`` GPUs of one node, or ``tp / gpus_per_node`` whole nodes) and the
    gradient (DP) group: the ``cp * dp`` ranks that hold the same weights, spaced ``tp`` apart,
    ranks ordered TP fastest, then CP, then DP, then PP (Megatron's default)."""
    hw, p = job.hardware, job.parallel
    per = NODE_TYPES[hw.node].gpus
    tp = Group(node=hw.node, network=hw.network, nic=hw.nic, oversubscription=hw.oversubscription,
               nodes=max(1, p.tp // per), per_node=min(p.tp, per))
    return tp, _strided(job, p.cp * p.dp)


def cp_group(job: Job) -> Group:
    """The context-parallel group: ``cp`` ranks spaced ``tp`` apart."""
    return _strided(job, job.parallel.cp)


def plan_job(job: Job, pricer: Pricer | None = None, progress: Progress | None = None) -> Plan:
    """Price ``job``: see the module. ``pricer`` holds the collective cache (a fresh one, with
    the job's synthesis settings and the default cache file, when None)."""
    t0 = time.perf_counter()
    mem = check_memory(job)  # a job that does not fit its GPUs is refused before anything is priced
    pricer = pricer or Pricer(synth=job.synthesis.enabled, time_limit_s=job.synthesis.time_limit_s)
    p = job.parallel
    tp_g, dp_g = groups(job)
    priced: list[Priced] = []

    def price(coll: str, size: int, g: Group, together: bool = False) -> Priced:
        if progress:
            progress({"stage": "collective", "collective": coll, "size": size, "group": g.size})
        pr = pricer.price_together(coll, size, g) if together else pricer.price(coll, size, g)
        priced.append(pr)
        return pr

    n_ar = tp_allreduces(job)
    tp_pr = price("allreduce", tp_allreduce_bytes(job), tp_g) if max(n_ar) else None
    cp_f, cp_b = cp_passes(job)
    cp_pr = price("allgather", p.cp * cp_chunk_bytes(job), cp_group(job)) if cp_f else None
    shared = job.synthesis.contention  # the DP groups of a node's GPUs priced together (flowride.concurrent)
    if p.distributed_optimizer:
        rs = price("reducescatter", dp_bytes(job), dp_g, shared)
        ag = price("allgather", dp_bytes(job), dp_g, shared)
        dp_nccl, dp_ours = (rs.nccl_us + ag.nccl_us) * 1e-6, (rs.ours_us + ag.ours_us) * 1e-6
    else:
        ar = price("allreduce", dp_bytes(job), dp_g, shared)
        dp_nccl, dp_ours = ar.nccl_us * 1e-6, ar.ours_us * 1e-6
    per = NODE_TYPES[job.hardware.node].gpus
    p2p = p2p_seconds(tp_g, p2p_bytes(job), same_node=p.tp * p.cp * p.dp < per) if p.pp > 1 else 0.0
    if job.model.p2p_s is not None:
        p2p = job.model.p2p_s
    chunks = chunk_costs(job)
    tp_back = 2 if job.model.recompute == "full" else 1  # a recomputed forward runs its all-reduces again
    w_layer = layer_weight_seconds(job) if p.tp_overlap and max(n_ar) else 0.0

    def tp_backward(n: int, k: int, ar: float) -> float:
        """Exposed TP seconds in a chunk's backward: all of them, or with ``tp_overlap`` per layer
        the two input-gradient all-reduces (reduce-scatters with sequence parallelism, half the
        time each) less the weight-gradient GEMMs they hide behind, the two all-gathers sequence
        parallelism adds (half an all-reduce each), and a full recompute's forward all-reduces."""
        if not p.tp_overlap or not n:
            return n * ar * tp_back
        hidden = ar if p.sequence_parallel else 2 * ar
        layer = max(0.0, hidden - w_layer) + (ar if p.sequence_parallel else 0.0) + (2 * ar if tp_back == 2 else 0.0)
        return k * layer

    def comms(which: str) -> list[ChunkComm]:
        ar = getattr(tp_pr, which) * 1e-6 if tp_pr else 0.0
        ag = getattr(cp_pr, which) * 1e-6 if cp_pr else 0.0
        return [ChunkComm(n * ar, tp_backward(n, k, ar), k * cp_f * ag, k * cp_b * ag)
                for n, k in zip(n_ar, chunk_layers(job), strict=True)]

    comm_nccl, comm_ours = comms("nccl_us"), comms("ours_us")
    opt = optimizer_seconds(job)
    if progress:
        progress({"stage": "simulate", "ranks": p.pp, "microbatches": p.microbatches})
    nccl = simulate(job, chunks, comm_nccl, p2p, dp_nccl, opt)
    ours = simulate(job, chunks, comm_ours, p2p, dp_ours, opt) if (comm_ours, dp_ours) != (comm_nccl, dp_nccl) else nccl
    pricer.save()
    action_s = max(c.tp_f + c.cp_f for c in comm_ours)
    return Plan(job, nccl, ours, priced, harvestable(job, ours), time.perf_counter() - t0, assumptions(job), action_s, mem)


def efficiency_dict(job: Job) -> dict:
    """The compute-rate description the plan used, as data."""
    if job.model.forward_s is not None:
        return {"model": "measured"}
    eff = job.efficiency
    if eff is None:
        return {"model": "flat", "mfu": job.mfu, "peak_tflops": job.peak_tflops,
                "source": "hardware.mfu" if job.hardware.mfu is not None else "default (hardware.efficiency not given)"}
    return {**eff.as_dict(), "peak_tflops": job.peak_tflops, "hbm_tbps": job.hbm_tbps}


def assumptions(job: Job) -> list[str]:
    """What shaped the figures, said next to them."""
    hw, m, p = job.hardware, job.model, job.parallel
    out = []
    if m.forward_s is None:
        rc = {"none": "", "selective": "; selective recomputation adds each layer's core attention to the input gradient",
              "full": "; full recomputation adds each layer's forward to the input gradient"}[m.recompute]
        eff = job.efficiency
        if eff is None:
            out.append(f"compute from FLOPs (Megatron's per-layer count with {job.kv_heads} of {job.heads} K/V heads and a "
                       f"{m.mlp} MLP of width {job.ffn_hidden}, backward = 2 x forward split evenly into input and weight "
                       f"gradients{rc}) at {flat_description(job.mfu, job.peak_tflops, hw.mfu is None)} sustained per GPU "
                       "(an assumption)")
        else:
            out.append(f"compute op by op (Megatron's GPT layer with {job.kv_heads} of {job.heads} K/V heads and a {m.mlp} MLP "
                       f"of width {job.ffn_hidden}: QKV, projection, MLP GEMMs and the logits; the attention core"
                       f"{' (causal: half the scores, as FlashAttention skips the masked tiles)' if attention_share(job) < 1 else ''}; layer norms, "
                       f"dropout-adds, the activation{'' if m.flash_attention else ' and the scores softmax'} as HBM bytes; each "
                       f"GEMM's input and weight gradient at its forward's cost, the attention core's backward twice its "
                       f"forward, the memory-bound kernels' bytes 1.5 times{rc}) at {job.peak_tflops:g} TFLOP/s peak; {eff.describe()}")
    else:
        out.append("compute from the measured per-stage profile")
    tp = ("tensor-parallel all-reduces exposed in the forward; in the backward the input-gradient all-reduces (reduce-"
          "scatters) hidden behind the weight-gradient GEMMs (Megatron-LM's async TP communication), the all-gathers of "
          "sequence parallelism and a recomputed forward's all-reduces exposed" if p.tp_overlap else
          "tensor-parallel all-reduces exposed (on the critical path)")
    out.append(f"{tp}; p2p transfers one NIC (or NVLink) hop each, added to every cross-stage dependency")
    if p.cp > 1 and m.forward_s is None:
        out.append(f"context parallelism: ring attention's K/V exchange over {p.cp} ranks priced as an all-gather per layer "
                   "(twice in the backward, again for a recomputed attention) and exposed: its overlap with the attention "
                   "is not modelled (a first model)")
    if m.optimizer_s is not None:
        opt = "optimizer step as measured"
    elif m.forward_s is None:
        opt = (f"optimizer step from the bytes mixed-precision Adam touches ({26 + m.grad_bytes} B per parameter updated"
               f"{', its 1/' + str(p.dp * p.cp) + ' shard' if p.distributed_optimizer else ''}) at {job.hbm_tbps:g} TB/s HBM")
    else:
        opt = "optimizer step not in the profile, not modelled"
    out.append(f"data-parallel synchronisation after each stage's last backward, {p.dp_overlap:.0%} of it hidden; {opt}; "
               "embedding lookup and data loading not modelled")
    if job.synthesis.contention:
        out.append("DP groups that synchronise at once (one per GPU of a node) priced together on their nodes' shared fabric: "
                   "flowride's joint schedule, NCCL's algorithms run together in a fluid model with flows spread over the spines; "
                   "TP and other collectives priced on their group's own nodes (they share no link with DP unless DP relays)")
    else:
        out.append("collectives priced on the group's own nodes only (no traffic from other groups on shared links)")
    out.append(f"memory: bf16 weights, {m.grad_bytes} B gradients, 12 B fp32 optimizer state"
               f"{' over dp x cp (distributed optimizer)' if p.distributed_optimizer else ''}; activations from Korthikanti "
               f"et al. 2022 (recompute {m.recompute}{', FlashAttention' if m.flash_attention else ''}), micro-batches in "
               "flight read off the schedule; CUDA context, NCCL buffers and fragmentation not counted")
    if job.harvest.tasks:
        out.append(f"harvesting: FreeRide's fit rule (factor {job.harvest.factor:g}), a step on a training GPU worth a step on "
                   f"the reference device, GPU memory not checked, training slowed by {job.harvest.overhead_pct:g}% while "
                   "harvesting")
    return out
