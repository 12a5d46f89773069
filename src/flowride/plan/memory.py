"""Memory per GPU: weights, gradients, optimizer state and the activations the schedule keeps.

Model states, per parameter a GPU holds (Megatron-LM's accounting, docs/distrib_optimizer.md):
bf16 weights (2 B), gradients (``grad_bytes``: 4, fp32 as Megatron, or 2) and the optimizer
state (fp32 master copy, Adam's m and v: 12 B), the last over ``dp * cp`` with the distributed
optimizer: 18 B without it, ``6 + 12/(dp*cp)`` with it. A GPU holds its stage's layers over
``tp``, and the first and last stages the embedding and the logit layer (``V*h/tp`` each).

Activations per layer and micro-batch on one GPU (Korthikanti et al., "Reducing activation
recomputation in large transformer models", MLSys 2023, arXiv 2205.05198, Table 2, bf16 values
and 1-byte dropout masks; ``s' = s/cp``, ``t = tp``, ``a`` heads):

- no recomputation ``s'bh(10 + 24/t) + 5as's b/t``; with sequence parallelism the 10 is over
  ``t`` too: ``s'bh(34/t) + 5as'sb/t`` (``sbh(34/t + 5as/(ht))`` at cp 1);
- selective recomputation drops the attention scores ``5as'sb/t`` (so does FlashAttention,
  ``model.flash_attention``, which never stores them);
- full recomputation keeps each layer's input, ``2s'bh`` (over t with sequence parallelism), and
  rebuilds one layer's activations at a time in the backward (that one layer is added).

The 34 counts specific tensors: 10 not split by tp (two layer-norm inputs 4, the QKV and MLP
inputs 2 + 2, two dropout masks 1 + 1) and 24 split (Q and K 4, V 2, the projection's input 2,
the MLP's two f-wide tensors 16 at f = 4h). With grouped-query attention K and V are
``kv_heads/heads`` as wide (on a rank: ``kv_heads/tp`` heads, or one when fewer); SwiGLU keeps
three f-wide tensors (gate, up, their product: ``6bsf``) where GeLU keeps two (``4bsf``); other
widths scale those terms. The last stage also keeps its logit layer's input and the fp32 softmax
of the cross-entropy, ``4s'bV/t``.

How many micro-batches are in flight is read off the schedule's own actions
(:func:`flowride.plan.iteration.rank_actions`): a forward adds its chunk's activations, the
backward frees them (the weight-gradient W where the schedule splits it off: W still needs the
linear layers' inputs). That gives, on the rank that holds most: GPipe ``m``, 1F1B and ZB-H1
``p`` (the first stage, ``min(p, m)``), interleaved 1F1B ``p(1 + (p-1)/(pv))`` stage-activations
(Megatron's warm-up of ``2(p-1) + (v-1)p`` forward chunks plus one, Korthikanti 4.2.3), ZB-V
``2p`` chunk-activations of ``1/(2p)`` of the model each (``p`` stage-activations, 1F1B's), and
torch's DualPipeV ``2p + 1`` of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowride.errors import InputError
from flowride.plan.costs import chunk_layers, chunk_rank, kv_width, rank_params_per_gpu
from flowride.plan.job import Job

GIB = float(1 << 30)
WEIGHT_BYTES = 2  # bf16 weights
OPTIMIZER_BYTES = 12  # fp32 master copy, Adam m and v


def layer_activation_bytes(job: Job, recompute: str | None = None) -> float:
    """Bytes one layer keeps for the backward per micro-batch, on one GPU (see the module)."""
    m, p = job.model, job.parallel
    rc = recompute or m.recompute
    b, h, t, v = m.microbatch_size, m.hidden, p.tp, m.bytes_per_value
    s, s1 = m.seq_len, m.seq_len / p.cp
    sp = t if p.sequence_parallel else 1
    if rc == "full":
        return v * s1 * b * h / sp
    unsplit = (4 * v + 2) * s1 * b * h / sp  # two norm inputs, QKV and MLP inputs, two dropout masks (10 at bf16)
    q_proj = 2 * v * s1 * b * h / t  # Q, and the output projection's input
    kv = 2 * v * s1 * b * kv_width(job)  # K and V
    mlp = (3 if m.mlp == "swiglu" else 2) * v * s1 * b * job.ffn_hidden / t
    scores = 0.0 if (rc == "selective" or m.flash_attention) else (2 * v + 1) * job.heads * s1 * s * b / t
    return unsplit + q_proj + kv + mlp + scores


def recompute_working_bytes(job: Job) -> float:
    """What the backward rebuilds at a time: one layer's activations (full; less its kept input)
    or one layer's attention scores (selective)."""
    rc = job.model.recompute
    if rc == "full":
        return layer_activation_bytes(job, "none") - layer_activation_bytes(job, "full")
    if rc == "selective":
        return layer_activation_bytes(job, "none") - layer_activation_bytes(job, "selective")
    return 0.0


def logits_activation_bytes(job: Job) -> float:
    """The logit layer's input and the cross-entropy's fp32 softmax, per micro-batch on one GPU."""
    m, p = job.model, job.parallel
    s1 = m.seq_len / p.cp
    sp = p.tp if p.sequence_parallel else 1
    return m.bytes_per_value * s1 * m.microbatch_size * m.hidden / sp + 4 * s1 * m.microbatch_size * m.vocab / p.tp


@dataclass(frozen=True)
class RankMemory:
    rank: int
    params: float  # bytes
    grads: float
    optimizer: float
    activations: float
    in_flight: float  # micro-batches of the whole stage's activations kept at the peak

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def as_dict(self) -> dict:
        return {"stage": self.rank, "params_gib": self.params / GIB, "grads_gib": self.grads / GIB,
                "optimizer_gib": self.optimizer / GIB, "activations_gib": self.activations / GIB,
                "total_gib": self.total / GIB, "in_flight_microbatches": self.in_flight}


@dataclass(frozen=True)
class Memory:
    ranks: list[RankMemory]
    device_gib: float
    bytes_per_param: float
    layer_activation_bytes: float

    @property
    def peak(self) -> RankMemory:
        return max(self.ranks, key=lambda r: r.total)

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.device_gib * GIB

    def as_dict(self) -> dict:
        pk = self.peak
        return {"per_gpu_gib": {k.removesuffix("_gib"): v for k, v in pk.as_dict().items() if k.endswith("_gib")},
                "peak_stage": pk.rank, "in_flight_microbatches": pk.in_flight, "device_gib": self.device_gib,
                "fits": self.fits, "bytes_per_param": self.bytes_per_param,
                "activation_per_layer_gib": self.layer_activation_bytes / GIB,
                "per_stage": [r.as_dict() for r in self.ranks]}

    def summary(self) -> str:
        pk = self.peak
        return (f"{pk.total / GIB:.1f} of {self.device_gib:g} GiB (stage {pk.rank}: params {pk.params / GIB:.1f}, "
                f"grads {pk.grads / GIB:.1f}, optimizer {pk.optimizer / GIB:.1f}, activations {pk.activations / GIB:.1f}; "
                f"{pk.in_flight:.2f} micro-batches in flight)")


def peak_live(actions: list, chunk_bytes: list[float]) -> float:
    """The most activation bytes a rank keeps while running ``actions`` in order: a forward adds
    its chunk's, the backward frees them (W when the rank's list splits it off, else B or I)."""
    has_w = any(a.kind == "W" for a in actions)
    live = best = 0.0
    for a in actions:
        if a.kind == "F":
            live += chunk_bytes[a.stage]
            best = max(best, live)
        elif a.kind == "B" or a.kind == ("W" if has_w else "I"):
            live -= chunk_bytes[a.stage]
    return best


def memory(job: Job) -> Memory:
    """Each pipeline rank's memory per GPU at its peak (see the module)."""
    from flowride.plan.iteration import rank_actions

    m, p = job.model, job.parallel
    shard = p.dp * p.cp if p.distributed_optimizer else 1
    per_layer = layer_activation_bytes(job)
    layers = chunk_layers(job)
    n = len(layers)
    chunk_bytes = [k * per_layer + (logits_activation_bytes(job) if c == n - 1 else 0.0) for c, k in enumerate(layers)]
    acts, _ = rank_actions(job)
    params = rank_params_per_gpu(job)
    working = recompute_working_bytes(job)
    out = []
    for r in range(p.pp):
        stage_bytes = sum(chunk_bytes[c] for c in range(n) if chunk_rank(job, c) == r)
        live = peak_live(acts.get(r, []), chunk_bytes)
        act = live + working
        n_params = params[r]
        out.append(RankMemory(r, WEIGHT_BYTES * n_params, m.grad_bytes * n_params, OPTIMIZER_BYTES * n_params / shard,
                              act, live / stage_bytes if stage_bytes else 0.0))
    return Memory(out, job.memory_gib, WEIGHT_BYTES + m.grad_bytes + OPTIMIZER_BYTES / shard, per_layer)


def check_memory(job: Job, mem: Memory | None = None) -> Memory:
    """``job``'s memory, or one InputError when its peak does not fit the GPU, with what would help."""
    mem = mem or memory(job)
    if mem.fits:
        return mem
    m, p = job.model, job.parallel
    fixes = ["more tp, pp or cp"]
    if m.recompute != "full":
        fixes.append("model.recompute " + ("selective or full" if m.recompute == "none" else "full"))
    if not p.distributed_optimizer:
        fixes.append("parallel.distributed_optimizer true")
    if m.microbatch_size > 1:
        fixes.append("a smaller model.microbatch_size")
    if p.schedule in ("gpipe", "loopedbfs"):
        fixes.append("a 1F1B schedule (gpipe keeps every micro-batch)")
    raise InputError("parallel / model.recompute", f"peak memory per GPU is {mem.summary()}, over a "
                     f"{job.hardware.node} GPU", "give " + ", ".join(fixes))
