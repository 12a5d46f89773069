"""What one micro-batch costs on one pipeline stage: compute seconds from the model's FLOPs (or a
measured profile), and the bytes its collectives and transfers move.

FLOPs per transformer layer and micro-batch, forward (Narayanan et al., SC'21, "Efficient
large-scale language model training on GPU clusters using Megatron-LM", section 5.1, with the
MLP width ``f`` instead of 4h): ``8bsh^2 + 4bshf + 4bs^2h``; the logit layer adds ``2bshV`` on the
last stage. The backward is twice the forward, split (as Zero Bubble, Qi et al. ICLR 2024, takes
it) into an input-gradient half I and a weight-gradient half W, each the forward's cost. Tensor
parallelism divides the FLOPs by ``tp`` and adds, per layer, two all-reduces of ``bsh`` values in
the forward and two in the backward (Megatron's f/g operators; with sequence parallelism a
reduce-scatter and an all-gather of the same total volume). A stage hands the next one ``bsh``
values per micro-batch (``bsh/tp`` per GPU with sequence parallelism). Data parallelism
reduce-scatters the stage's gradients and all-gathers its parameters (the distributed optimizer)
or all-reduces them, ``params / (pp*tp)`` values per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowride.plan.job import Job


@dataclass(frozen=True)
class StageCost:
    """Seconds of one micro-batch through one model chunk of one stage (compute only)."""

    f: float
    i: float  # input-gradient backward
    w: float  # weight-gradient backward

    @property
    def b(self) -> float:
        return self.i + self.w


def layer_flops(job: Job) -> float:
    """Forward FLOPs of one transformer layer for one micro-batch (whole layer, before tp)."""
    m = job.model
    b, s, h = m.microbatch_size, m.seq_len, m.hidden
    f = m.ffn_hidden or 4 * h
    return 8.0 * b * s * h * h + 4.0 * b * s * h * f + 4.0 * b * s * s * h


def param_count(job: Job) -> float:
    """The model's parameters: as stated, else per layer ``4h^2 + 2hf`` plus the embedding ``Vh``."""
    m = job.model
    if m.params is not None:
        return float(m.params)
    f = m.ffn_hidden or 4 * m.hidden
    return m.layers * (4.0 * m.hidden * m.hidden + 2.0 * m.hidden * f) + m.vocab * m.hidden


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
    rate = job.peak_tflops * 1e12 * job.hardware.mfu  # sustained FLOP/s of one GPU
    per_chunk = m.layers // n
    fl = layer_flops(job) * per_chunk / p.tp
    logits = 2.0 * m.microbatch_size * m.seq_len * m.hidden * m.vocab / p.tp
    out = []
    for c in range(n):
        extra = logits if c == n - 1 else 0.0
        t = (fl + extra) / rate
        out.append(StageCost(t, t, t))
    return out


def tp_allreduce_bytes(job: Job) -> int:
    """One tensor-parallel all-reduce: ``bsh`` values."""
    m = job.model
    return m.microbatch_size * m.seq_len * m.hidden * m.bytes_per_value


def tp_allreduces_per_chunk(job: Job) -> int:
    """All-reduces in one chunk's forward (and again in its backward): two per layer."""
    if job.parallel.tp == 1 or job.model.forward_s is not None:
        return 0
    return 2 * (job.model.layers // (job.parallel.pp * job.parallel.virtual))


def p2p_bytes(job: Job) -> int:
    """Activations (or their gradients) one stage hands the next per micro-batch, per GPU."""
    m, p = job.model, job.parallel
    v = m.microbatch_size * m.seq_len * m.hidden * m.bytes_per_value
    return v // p.tp if p.sequence_parallel else v


def dp_bytes(job: Job) -> int:
    """The gradient buffer one GPU synchronises across its data-parallel group."""
    p = job.parallel
    return int(param_count(job) / (p.pp * p.tp) * job.model.bytes_per_value)
