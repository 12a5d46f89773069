"""What one micro-batch costs on one pipeline stage: compute seconds from the model's FLOPs (or a
measured profile), and the bytes its collectives and transfers move.

FLOPs per transformer layer and micro-batch, forward (Narayanan et al., SC'21, "Efficient
large-scale language model training on GPU clusters using Megatron-LM", section 5.1, with the
MLP width ``f`` and grouped-query attention): the Q and output projections ``2bsh*2h``, the K
and V projections ``2bsh*2h_kv`` (``h_kv = kv_heads * h / heads``; ``8bsh^2`` in all when
``kv_heads = heads``), the MLP ``4bshf`` (GeLU: two matrices) or ``6bshf`` (SwiGLU: three),
the attention scores and weighted sum ``4bs^2h`` (half of it where a FlashAttention kernel
skips the blocks a causal mask hides: :func:`attention_share`); the logit layer adds ``2bshV``
on the last chunk. The backward is twice the forward, split (as Zero Bubble, Qi et al. ICLR 2024, takes it)
into an input-gradient half I and a weight-gradient half W, each the forward's cost; activation
recomputation (Korthikanti et al. 2022, arXiv 2205.05198) adds to I the layers' forward
(``full``) or their core attention ``4bs^2h`` (``selective``). Tensor parallelism divides the
FLOPs by ``tp`` (K/V heads fewer than ``tp`` are replicated: each rank projects one) and adds,
per layer, two all-reduces of ``bsh`` values in the forward and two in the backward (Megatron's
f/g operators; with sequence parallelism a reduce-scatter and an all-gather of the same total
volume). Context parallelism divides every token-wise cost by ``cp`` (the attention too: each
rank's ``s/cp`` queries attend over all ``s`` keys) and adds ring attention's K/V exchange. A
stage hands the next one ``bsh/cp`` values per micro-batch (``/tp`` more with sequence
parallelism). Data parallelism reduce-scatters the stage's gradients and all-gathers its
parameters (the distributed optimizer) or all-reduces them, ``params / (pp*tp)`` values per GPU.

Compute seconds: the FLOPs at one flat ``peak * mfu``, or op by op (:func:`layer_ops`) at the
efficiency the GPU type's description gives each op's size (:mod:`flowride.plan.efficiency`),
plus the memory-bound work between the GEMMs at ``hbm_share`` of HBM bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flowride.errors import InputError
from flowride.plan.efficiency import (
    BUILTIN,
    START,
    Curve,
    fit_ops,
    fit_scale,
    read_measured,
    to_efficiency,
)
from flowride.plan.job import Job, llama3_chunks, stage_layers
from flowride.plan.measured import profile_from_run

ADAM_BYTES = 26  # per parameter: fp32 master read + write (8), Adam m and v read + write (16), bf16 param write (2)


@dataclass(frozen=True)
class StageCost:
    """Seconds of one micro-batch through one model chunk of one stage (compute only)."""

    f: float
    i: float  # input-gradient backward (with any recomputed forward)
    w: float  # weight-gradient backward

    @property
    def b(self) -> float:
        return self.i + self.w


def chunk_layers(job: Job) -> list[int]:
    """Transformer layers of each model chunk (``pp * virtual`` of them, in pipeline order)."""
    p = job.parallel
    if p.llama3_stages and p.virtual > 1:
        return llama3_chunks(job)
    if job.uneven_stages:  # virtual is 1 (check_job)
        return stage_layers(job)
    n = p.pp * p.virtual
    return [job.model.layers // n] * n


def chunk_rank(job: Job, chunk: int) -> int:
    """The pipeline rank that holds ``chunk``: ``chunk % pp``, or the V shape of ZBV and DualPipeV."""
    pp = job.parallel.pp
    if job.parallel.schedule in ("zbv", "dualpipev"):
        return chunk if chunk < pp else 2 * pp - 1 - chunk
    return chunk % pp


def kv_width(job: Job) -> float:
    """Width of the keys (and of the values) one TP rank holds: ``kv_heads / tp`` heads of
    ``h / heads`` each, or one head when the K/V heads are fewer than tp (replicated)."""
    h, a, kv, tp = job.model.hidden, job.heads, job.kv_heads, job.parallel.tp
    per_rank = 1.0 if (kv < a and kv < tp) else kv / tp
    return per_rank * h / a


def layer_flops(job: Job) -> float:
    """Forward FLOPs of one transformer layer for one micro-batch (whole layer, before tp and cp)."""
    m = job.model
    b, s, h = m.microbatch_size, m.seq_len, m.hidden
    f = job.ffn_hidden
    h_kv = h if job.kv_heads == job.heads else h * job.kv_heads / job.heads
    mlp = (6.0 if m.mlp == "swiglu" else 4.0) * b * s * h * f
    return 2.0 * b * s * h * (2 * h + 2 * h_kv) + mlp + attention_core_flops(job)


def attention_share(job: Job) -> float:
    """The share of the ``s x s`` scores the attention core computes: a FlashAttention kernel under
    a causal mask skips the tiles above the diagonal (half, as FlashAttention's own benchmarks
    count it); without FlashAttention Megatron computes every score and masks them afterwards."""
    return 0.5 if (job.model.causal and job.model.flash_attention) else 1.0


def attention_core_flops(job: Job) -> float:
    """Forward FLOPs of one layer's scores and weighted sum, ``4bs^2h`` times :func:`attention_share`
    (what selective recompute redoes)."""
    m = job.model
    return 4.0 * m.microbatch_size * m.seq_len * m.seq_len * m.hidden * attention_share(job)


def replicated_kv_flops(job: Job) -> float:
    """K/V heads fewer than tp are replicated: each TP rank projects one, so the TP group does
    ``tp - kv_heads`` heads' K and V projections more than the layer's count."""
    m, tp = job.model, job.parallel.tp
    if not (job.kv_heads < job.heads and job.kv_heads < tp):
        return 0.0
    return 2.0 * m.microbatch_size * m.seq_len * m.hidden * 2 * (tp - job.kv_heads) * m.hidden / job.heads


def layer_flops_per_gpu(job: Job) -> float:
    """One layer's forward on one GPU: the layer (and any replicated K/V work) over ``tp * cp``."""
    return (layer_flops(job) + replicated_kv_flops(job)) / job.parallel.tp / job.parallel.cp


def recompute_flops_per_gpu(job: Job) -> float:
    """Per layer and micro-batch on one GPU, the forward FLOPs the backward recomputes."""
    rc = job.model.recompute
    if rc == "full":
        return layer_flops_per_gpu(job)
    if rc == "selective":
        return attention_core_flops(job) / job.parallel.tp / job.parallel.cp
    return 0.0


def model_flops_per_token(job: Job) -> float:
    """Model FLOPs per token of one training step (forward + backward, no recomputation, the
    logits): ``3 (L * layer + 2shV) / s``, the count MFU figures use, with the attention the kernel
    computes (dense, or half of it under a causal mask with FlashAttention: :func:`attention_share`)."""
    m = job.model
    return 3.0 * (m.layers * layer_flops(job) + 2.0 * m.microbatch_size * m.seq_len * m.hidden * m.vocab) / (m.microbatch_size * m.seq_len)


def param_count(job: Job) -> float:
    """The model's parameters: as stated, else per layer ``2h^2 + 2h*h_kv`` (attention) plus
    ``2hf`` (GeLU) or ``3hf`` (SwiGLU), plus the embedding ``Vh`` (and the logit layer's ``Vh``
    when not tied): ``L(4h^2 + 2hf) + Vh`` by default."""
    m = job.model
    if m.params is not None:
        return float(m.params)
    h, f = m.hidden, job.ffn_hidden
    h_kv = h if job.kv_heads == job.heads else h * job.kv_heads / job.heads
    mats = 3.0 if m.mlp == "swiglu" else 2.0
    return m.layers * (2.0 * h * h + 2.0 * h * h_kv + mats * h * f) + m.vocab * h * (1 if m.tied_embeddings else 2)


def layer_params_per_gpu(job: Job) -> float:
    """One layer's parameters on one TP rank (from the stated count less the embeddings, if stated)."""
    m, tp = job.model, job.parallel.tp
    if m.params is not None:
        rest = m.params - m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
        return (rest if rest > 0 else m.params) / m.layers / tp
    h = m.hidden
    mats = 3.0 if m.mlp == "swiglu" else 2.0
    return 2.0 * h * h / tp + 2.0 * h * kv_width(job) + mats * h * job.ffn_hidden / tp


def rank_params_per_gpu(job: Job) -> list[float]:
    """Parameters one GPU of each pipeline rank holds (before any sharding over DP): its layers,
    the embedding with the first chunk and the logit layer with the last, ``V*h/tp`` each (with
    tied embeddings and pp > 1 the last stage keeps its own copy, as Megatron does)."""
    p, m = job.parallel, job.model
    layers = chunk_layers(job)
    per_layer = layer_params_per_gpu(job)
    emb = m.vocab * m.hidden / p.tp
    out = [0.0] * p.pp
    for c, n in enumerate(layers):
        out[chunk_rank(job, c)] += n * per_layer
    out[chunk_rank(job, 0)] += emb
    if len(layers) > 1 or not m.tied_embeddings:
        out[chunk_rank(job, len(layers) - 1)] += emb
    return out


@dataclass(frozen=True)
class Op:
    """One operation of a layer's forward on one GPU: a GEMM, the attention core, or memory-bound work."""

    name: str
    kind: str  # "gemm", "attention" or "memory"
    flops: float = 0.0
    bytes: float = 0.0


def layer_ops(job: Job) -> list[Op]:
    """One transformer layer's forward on one GPU, op by op (``s' = s/cp``, ``t = tp``): the GEMMs
    QKV ``b s' x h x (h/t + 2 kv width)``, the output projection ``b s' x h/t x h``, the MLP's up
    (GeLU ``f/t`` wide; SwiGLU gate and up fused, ``2f/t``) and down ``b s' x f/t x h``; the
    attention core ``4 b s' s h/t`` (scores and weighted sum, batched over the rank's heads); and
    the memory-bound kernels' bytes (Megatron's GPT layer): two layer norms (read + write) and two
    bias-dropout-adds (read two, write one, a 1-byte mask) over ``b s' h`` values (``/t`` with
    sequence parallelism), the MLP's activation (GeLU read + write ``b s' f/t``, SwiGLU read two,
    write one), and without FlashAttention the scores' traffic, ``b (a/t) s' s`` values written by
    the QK^T GEMM, read and written by the softmax and by the dropout (with its 1-byte mask) and
    read by the weighted sum. The FLOPs sum to :func:`layer_flops_per_gpu`."""
    m, p = job.model, job.parallel
    b, s, h, t, f = m.microbatch_size, m.seq_len, m.hidden, p.tp, job.ffn_hidden
    tok = b * s / p.cp
    up = 2 * f if m.mlp == "swiglu" else f
    ops = [Op("qkv", "gemm", 2.0 * tok * h * (h / t + 2 * kv_width(job))), Op("proj", "gemm", 2.0 * tok * (h / t) * h),
           Op("mlp_up", "gemm", 2.0 * tok * h * up / t), Op("mlp_down", "gemm", 2.0 * tok * (f / t) * h),
           Op("attention", "attention", 4.0 * tok * s * h / t * attention_share(job))]
    v = m.bytes_per_value
    norm_tokens = tok * h / (t if p.sequence_parallel else 1)
    act = (3 if m.mlp == "swiglu" else 2) * tok * f / t * v
    ops.append(Op("norms+dropout-add", "memory", bytes=norm_tokens * (10 * v + 2) + act))
    if not m.flash_attention:
        ops.append(Op("scores", "memory", bytes=b * (job.heads / t) * (s / p.cp) * s * (6 * v + 1)))
    return ops


def logits_op(job: Job) -> Op:
    m, p = job.model, job.parallel
    return Op("logits", "gemm", 2.0 * m.microbatch_size * m.seq_len / p.cp * m.hidden * m.vocab / p.tp)


def op_seconds(job: Job, op: Op, eff: Curve) -> float:
    """One op's forward seconds at the description's efficiency for its size."""
    peak = job.peak_tflops * 1e12
    if op.kind == "memory":
        return op.bytes / (job.hbm_tbps * 1e12 * eff.hbm_share)
    return op.flops / (peak * (eff.gemm(op.flops) if op.kind == "gemm" else eff.attention(op.flops)))


# bytes the memory-bound kernels move in the backward over the forward's: a layer norm's backward reads
# the gradient and its input and writes one (6 B a value against the forward's 4), a bias-dropout-add's
# reads the gradient and the mask and writes one, and the residual's gradients are added (11 against 7),
# GeLU's 6 against 4, the scores' softmax and dropout and the gradients the two batched GEMMs read and
# write 19 against 13: about 1.5 in each case.
BACKWARD_BYTES = 1.5


def layer_seconds(job: Job, eff: Curve) -> tuple[float, float, float, float]:
    """One layer on one GPU: (forward, input gradient, weight gradient, recomputed forward). The
    GEMMs' input- and weight-gradient GEMMs each cost their forward (same FLOPs, same size); the
    attention core's backward (no weights) is twice its forward, into the input gradient; the
    memory-bound kernels move :data:`BACKWARD_BYTES` times their forward's bytes."""
    by = {o.name: op_seconds(job, o, eff) for o in layer_ops(job)}
    gemm = sum(v for k, v in by.items() if k in ("qkv", "proj", "mlp_up", "mlp_down"))
    attn, mem, scores = by["attention"], by["norms+dropout-add"], by.get("scores", 0.0)
    fwd = gemm + attn + mem + scores
    rc = job.model.recompute
    rec = fwd if rc == "full" else attn + scores if rc == "selective" else 0.0
    return fwd, gemm + 2 * attn + BACKWARD_BYTES * (mem + scores), gemm, rec


def layer_weight_seconds(job: Job) -> float:
    """One layer's weight-gradient GEMMs on one GPU (what an overlapped TP collective hides behind)."""
    eff = job.efficiency
    if eff is not None:
        return layer_seconds(job, eff)[2]
    return layer_flops_per_gpu(job) / (job.peak_tflops * 1e12 * job.mfu)


def chunk_costs(job: Job) -> list[StageCost]:
    """Compute seconds per model chunk (``pp * virtual`` of them, in pipeline order)."""
    p = job.parallel
    n = p.pp * p.virtual
    m = job.model
    if m.forward_s is not None:  # measured: per stage, split evenly over its chunks
        out = []
        for c in range(n):
            st = c % p.pp
            fwd, bwd = m.forward_s[st] / p.virtual, m.backward_s[st] / p.virtual
            w = (m.weight_s[st] / p.virtual) if m.weight_s is not None else bwd / 2
            out.append(StageCost(fwd, max(0.0, bwd - w), w))
        return out
    eff = job.efficiency
    if eff is not None:  # op by op at the efficiency of each op's size
        f, i, w, rec = layer_seconds(job, eff)
        lg = op_seconds(job, logits_op(job), eff)
        return [StageCost(k * f + (lg if c == n - 1 else 0.0), k * (i + rec) + (lg if c == n - 1 else 0.0),
                          k * w + (lg if c == n - 1 else 0.0)) for c, k in enumerate(chunk_layers(job))]
    rate = job.peak_tflops * 1e12 * job.mfu  # sustained FLOP/s of one GPU
    lf = layer_flops(job) + replicated_kv_flops(job)
    rec = recompute_flops_per_gpu(job)
    logits = 2.0 * m.microbatch_size * m.seq_len * m.hidden * m.vocab / p.tp / p.cp
    out = []
    for c, layers in enumerate(chunk_layers(job)):
        fl = lf * layers / p.tp / p.cp
        extra = logits if c == n - 1 else 0.0
        t = (fl + extra) / rate
        out.append(StageCost(t, t + rec * layers / rate, t))
    return out


def tp_allreduce_bytes(job: Job) -> int:
    """One tensor-parallel all-reduce: ``bsh/cp`` values."""
    m = job.model
    return m.microbatch_size * (m.seq_len // job.parallel.cp) * m.hidden * m.bytes_per_value


def tp_allreduces(job: Job) -> list[int]:
    """All-reduces in each chunk's forward (and again in its backward): two per layer."""
    if job.parallel.tp == 1 or job.model.forward_s is not None:
        return [0] * (job.parallel.pp * job.parallel.virtual)
    return [2 * n for n in chunk_layers(job)]


def tp_allreduces_per_chunk(job: Job) -> int:
    """All-reduces in the forward of the largest chunk."""
    return max(tp_allreduces(job))


def cp_chunk_bytes(job: Job) -> int:
    """Ring attention: the keys and values one rank holds of one layer, ``2 * b*(s/cp) * kv width``
    values; in a layer's forward each rank receives the other ``cp - 1`` ranks' chunks (an
    all-gather over the CP group), in its backward twice that (K/V again, and dK/dV back)."""
    m, p = job.model, job.parallel
    return int(2 * m.microbatch_size * (m.seq_len // p.cp) * kv_width(job) * m.bytes_per_value)


def cp_passes(job: Job) -> tuple[int, int]:
    """Ring passes of each layer: (in the forward, in the backward); recomputing the attention
    (selective or full) runs the forward's pass again in the backward."""
    if job.parallel.cp == 1 or job.model.forward_s is not None:
        return 0, 0
    return 1, 2 + (job.model.recompute != "none")


def p2p_bytes(job: Job) -> int:
    """Activations (or their gradients) one stage hands the next per micro-batch, per GPU."""
    m, p = job.model, job.parallel
    v = m.microbatch_size * (m.seq_len // p.cp) * m.hidden * m.bytes_per_value
    return v // p.tp if p.sequence_parallel else v


def dp_bytes(job: Job) -> int:
    """The gradient buffer one GPU synchronises across its data-parallel group (the mean stage's)."""
    p = job.parallel
    return int(param_count(job) / (p.pp * p.tp) * job.model.bytes_per_value)


def optimizer_seconds(job: Job) -> list[float]:
    """Each pipeline rank's optimizer step: measured (``optimizer_s``), none for a measured profile
    without it, else the bytes mixed-precision Adam touches over the GPU's HBM bandwidth:
    ``ADAM_BYTES + grad_bytes`` per parameter the GPU updates (its shard, ``1/(dp*cp)`` of its
    parameters, with the distributed optimizer)."""
    m, p = job.model, job.parallel
    if m.optimizer_s is not None:
        return list(m.optimizer_s)
    if m.forward_s is not None:
        return [0.0] * p.pp
    shard = p.dp * p.cp if p.distributed_optimizer else 1
    per_param = ADAM_BYTES + m.grad_bytes
    return [n / shard * per_param / (job.hbm_tbps * 1e12) for n in rank_params_per_gpu(job)]


def calibrate(job: Job, path: str | Path) -> Curve:
    """``--calibrate PATH`` for ``job``: a JSON of measured ops (:func:`fit_ops`), or a ``flowride
    train`` run dir whose per-stage forward + backward seconds the job's op model is scaled to
    (:func:`fit_scale`), starting from the job's description, else its GPU type's, else Calculon's shape."""
    if job.model.forward_s is not None:
        raise InputError("--calibrate", "the job gives a measured profile (model.forward_s)", "calibrate a job priced from its FLOPs")
    base = job.efficiency or BUILTIN.get(job.hardware.node) or START
    p = Path(path)
    if p.is_dir():
        prof = profile_from_run(p)
        measured = sum(prof["forward_s"]) + sum(prof["backward_s"])
        if measured <= 0 or len(prof["forward_s"]) != job.parallel.pp:
            raise InputError("--calibrate", f"the run in {p} measured {len(prof['forward_s'])} stages, {measured:.3g} s of "
                             f"forward + backward, and the job has pp {job.parallel.pp}", "give the run of the job's model and stages")

        def model_seconds(c: Curve) -> float:  # one micro-batch through every chunk, as the profile sums it
            j = job.model_copy(update={"hardware": job.hardware.model_copy(update={"mfu": None, "efficiency": to_efficiency(c)})})
            return sum(x.f + x.i + x.w for x in chunk_costs(j))

        return fit_scale(model_seconds, measured, base, f"fitted to the run in {p} (one factor on e_max)")
    ops = read_measured(p)
    return fit_ops(ops, base, job.peak_tflops, job.hbm_tbps, f"fitted to {p.name} ({len(ops)} measured ops)")
