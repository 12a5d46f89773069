"""A training job as the planner reads it: model, parallelism, hardware, side work (plain data).

One JSON (or YAML) file, checked against this schema before anything is priced: an unknown key,
a wrong type or an impossible combination (pp that does not divide the layers, GPUs that do not
fill whole nodes) is one error naming the field and the fix. Every default is stated here and in
docs/plan.md; the FLOP/s a GPU sustains per operation comes from its efficiency description
(:mod:`flowride.plan.efficiency`: built-in per GPU type, or ``hardware.efficiency``) or from one
flat ``mfu``, a description the report repeats next to every figure it shapes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from flowride.errors import InputError
from flowride.files import parse_json_text, read_text
from flowride.plan.efficiency import DEFAULT_MFU, Curve, Efficiency, resolve
from flowride.schema import Strict, validated
from flowride.topology.fabrics import NETWORKS, NODE_TYPES

# dense BF16 peak per GPU (TFLOP/s), datasheet figures (docs/plan.md gives the sources)
PEAK_TFLOPS = {"dgx-a100": 312.0, "a800": 312.0, "dgx-h100": 989.0, "h800": 989.0, "hgx-b200": 2250.0,
               "mi300x": 1307.0, "dgx2": 125.0, "ndv2": 125.0, "mi250": 181.0}
# HBM bandwidth per GPU (TB/s) and memory per GPU (GiB: HBM stacks come in binary sizes), datasheets:
# NVIDIA A100 datasheet (80GB SXM: 2,039 GB/s; the A800 80GB SXM the same), H100 datasheet (SXM 80GB:
# 3.35 TB/s; H800 SXM the same memory), DGX B200 datasheet (1,440 GB and 64 TB/s over 8 GPUs: 180 and 8),
# AMD Instinct MI300X datasheet (192 GB HBM3, 5.3 TB/s), V100 datasheet (32 GB, 900 GB/s), AMD Instinct
# MI250 datasheet (128 GB and 3.2768 TB/s per package of two GCDs). An H200 (141 GB, 4.8 TB/s) is a
# dgx-h100 node with hardware.memory_gib 141 and hbm_tbps 4.8.
HBM_TBPS = {"dgx-a100": 2.039, "a800": 2.039, "dgx-h100": 3.35, "h800": 3.35, "hgx-b200": 8.0,
            "mi300x": 5.3, "dgx2": 0.9, "ndv2": 0.9, "mi250": 1.6384}
MEMORY_GIB = {"dgx-a100": 80.0, "a800": 80.0, "dgx-h100": 80.0, "h800": 80.0, "hgx-b200": 180.0,
              "mi300x": 192.0, "dgx2": 32.0, "ndv2": 32.0, "mi250": 64.0}
BUILTIN_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zbh1")
TORCH_SCHEDULES = ("interleaved1f1b", "loopedbfs", "interleavedzb", "zbv", "dualpipev")
SCHEDULES = BUILTIN_SCHEDULES + TORCH_SCHEDULES
MAX_PLAN_GPUS = 1 << 20


class Model(Strict):
    """The model: a decoder-only transformer by shape, or measured per-stage times."""

    layers: int = Field(ge=1, le=100_000)
    hidden: int = Field(ge=1, le=1 << 20)
    seq_len: int = Field(ge=1, le=1 << 24)
    microbatch_size: int = Field(default=1, ge=1, le=1 << 16)
    vocab: int = Field(default=32_000, ge=1, le=1 << 24)
    ffn_hidden: int | None = Field(default=None, ge=1, le=1 << 22)  # default 4 x hidden (gelu), ~8h/3 (swiglu)
    heads: int | None = Field(default=None, ge=1, le=1 << 16)  # attention heads; default hidden // 128 (at least 1)
    kv_heads: int | None = Field(default=None, ge=1, le=1 << 16)  # key/value heads (GQA, MQA); default = heads
    mlp: Literal["gelu", "swiglu"] = "gelu"  # two matrices (h x f, f x h), or three (gate, up, down)
    tied_embeddings: bool = True  # the logit layer shares the embedding (one V x h counted); false: two
    recompute: Literal["none", "selective", "full"] = "none"  # activation recomputation (Korthikanti et al. 2022)
    flash_attention: bool = False  # the s x s attention scores are never stored; with `causal`, the masked half is skipped
    causal: bool = True  # a decoder's causal mask: a FlashAttention kernel skips the masked half of the scores
    params: float | None = Field(default=None, gt=0, le=1e15)  # stated count; default from the shape
    bytes_per_value: int = Field(default=2, ge=1, le=8)  # bf16 activations and gradients
    grad_bytes: Literal[2, 4] = 4  # gradient buffer per parameter: fp32 as Megatron (4), or bf16 (2)
    # measured per-stage seconds of one micro-batch (flowride profile / a train report), one entry per stage
    forward_s: list[float] | None = None
    backward_s: list[float] | None = None  # the full backward (input + weight gradients)
    weight_s: list[float] | None = None  # the weight-gradient part of backward_s, where known
    p2p_s: float | None = Field(default=None, ge=0, le=1e6)  # measured stage-to-stage transfer (default: priced on the fabric)
    optimizer_s: list[float] | None = None  # measured optimizer step per stage (default: priced from its bytes)
    action_overhead_s: float = Field(default=0.0, ge=0, le=1e3)  # measured host time between two actions of a rank
    iteration_overhead_s: float = Field(default=0.0, ge=0, le=1e3)  # measured: barrier, next batch, ... between iterations


class Parallel(Strict):
    tp: int = Field(default=1, ge=1, le=1024)
    pp: int = Field(ge=1, le=4096)
    dp: int = Field(default=1, ge=1, le=1 << 20)
    cp: int = Field(default=1, ge=1, le=1024)  # context parallelism: the sequence split over cp ranks (ring attention)
    virtual: int = Field(default=1, ge=1, le=64)  # model chunks per pipeline rank (interleaved, looped, V schedules)
    microbatches: int = Field(ge=1, le=1 << 16)
    schedule: Literal["gpipe", "1f1b", "interleaved", "zbh1", "interleaved1f1b", "loopedbfs", "interleavedzb", "zbv", "dualpipev"] = "1f1b"
    sequence_parallel: bool = True  # Megatron's: p2p activations split by tp
    distributed_optimizer: bool = True  # DP as reduce-scatter of gradients + all-gather of parameters (else one all-reduce)
    dp_overlap: float = Field(default=0.0, ge=0.0, le=1.0)  # share of the DP collective hidden behind backward compute
    # Megatron-LM's async TP communication: each backward's input-gradient all-reduce (reduce-scatter with
    # sequence parallelism) runs behind the layer's weight-gradient GEMMs; false: every TP collective exposed
    tp_overlap: bool = False
    first_stage_layers: int | None = Field(default=None, ge=1, le=100_000)  # uneven stages (virtual 1); default even
    last_stage_layers: int | None = Field(default=None, ge=1, le=100_000)
    llama3_stages: bool = False  # Llama 3's rule: one layer fewer on the first and on the last stage (or model chunk)


class Hardware(Strict):
    node: str
    network: Literal["rail", "clos", "single"] = "rail"
    nic: str | None = None  # e.g. "400Gbps"; default: the node type's
    oversubscription: float = Field(default=1.0, ge=1.0, le=64.0)
    peak_tflops: float | None = Field(default=None, gt=0, le=1e6)  # default: the node type's GPU (PEAK_TFLOPS)
    hbm_tbps: float | None = Field(default=None, gt=0, le=1e4)  # default: the node type's GPU (HBM_TBPS)
    memory_gib: float | None = Field(default=None, gt=0, le=1e5)  # default: the node type's GPU (MEMORY_GIB)
    mfu: float | None = Field(default=None, gt=0.0, le=1.0)  # one flat share of peak for every op (the earlier model)
    # per-op efficiency curves (plan/efficiency.py): "builtin", or parameters over the GPU type's built-in
    efficiency: Efficiency | None = None

    @field_validator("efficiency", mode="before")
    @classmethod
    def _builtin(cls, v: Any) -> Any:
        """``"builtin"`` is the GPU type's description: an object that sets nothing over it."""
        if isinstance(v, str):
            if v != "builtin":
                raise ValueError(f"{v!r}: give \"builtin\" or an object of the curve's parameters")
            return {}
        return v


class SideTask(Strict):
    name: str = Field(min_length=1, max_length=200)
    step_s: float = Field(gt=0, le=3600)  # median step time on one GPU
    throughput: float = Field(gt=0, le=1e15)  # units per second on a dedicated reference device
    unit: str = Field(default="units", max_length=50)
    memory_gib: float = Field(default=0.0, ge=0, le=1e4)


class Harvest(Strict):
    tasks: list[SideTask] = Field(default_factory=list, max_length=64)
    budget_pct: float = Field(default=2.0, ge=0, le=100)
    overhead_pct: float = Field(default=1.0, ge=0, le=100)  # training slowdown assumed while harvesting (FreeRide: ~1%)
    factor: float = Field(default=1.2, ge=1.0, le=100)  # FreeRide's fit rule: a step needs factor x its time left
    min_bubble_s: float = Field(default=0.0, ge=0, le=3600)
    price_ref: float = Field(default=1.0, gt=0)  # reference device's price per hour
    price_main: float | None = Field(default=None, gt=0)  # one training GPU's price per hour (default: price_ref)


class Synthesis(Strict):
    time_limit_s: float = Field(default=30.0, gt=0, le=86_400)  # per distinct collective, first time
    enabled: bool = True  # False: NCCL's modelled algorithms only
    # True: the DP groups that synchronise at once on the same nodes are priced together on their
    # shared fabric (flowride.concurrent: joint schedule vs NCCL's run together), not each alone
    contention: bool = False


class Job(Strict):
    name: str = Field(default="job", max_length=200)
    model: Model
    parallel: Parallel
    hardware: Hardware
    harvest: Harvest = Field(default_factory=Harvest)
    synthesis: Synthesis = Field(default_factory=Synthesis)

    @property
    def gpus(self) -> int:
        p = self.parallel
        return p.tp * p.cp * p.pp * p.dp

    @property
    def gpus_per_node(self) -> int:
        return NODE_TYPES[self.hardware.node].gpus

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.gpus / self.gpus_per_node))

    @property
    def peak_tflops(self) -> float:
        return self.hardware.peak_tflops or PEAK_TFLOPS[self.hardware.node]

    @property
    def efficiency(self) -> Curve | None:
        """The per-operation efficiency description, or None for one flat share of peak (:attr:`mfu`)."""
        hw = self.hardware
        return resolve(hw.node, hw.efficiency, hw.mfu)

    @property
    def mfu(self) -> float:
        """The flat share of peak (when :attr:`efficiency` is None: ``hardware.mfu``, or a GPU type
        without a built-in description): as given, else the default 0.4."""
        return self.hardware.mfu if self.hardware.mfu is not None else DEFAULT_MFU

    @property
    def hbm_tbps(self) -> float:
        return self.hardware.hbm_tbps or HBM_TBPS[self.hardware.node]

    @property
    def memory_gib(self) -> float:
        return self.hardware.memory_gib or MEMORY_GIB[self.hardware.node]

    @property
    def heads(self) -> int:
        return self.model.heads or max(1, self.model.hidden // 128)

    @property
    def kv_heads(self) -> int:
        return self.model.kv_heads or self.heads

    @property
    def ffn_hidden(self) -> int:
        """The MLP width: as given, else 4h (gelu), or 8h/3 rounded up to a multiple of 256 (swiglu, as Llama)."""
        m = self.model
        if m.ffn_hidden:
            return m.ffn_hidden
        if m.mlp == "swiglu":
            return 256 * -(-int(8 * m.hidden / 3) // 256)
        return 4 * m.hidden

    @property
    def uneven_stages(self) -> bool:
        p = self.parallel
        return p.llama3_stages or p.first_stage_layers is not None or p.last_stage_layers is not None


def llama3_chunks(job: Job) -> list[int]:
    """Llama 3's rule over ``pp * virtual`` model chunks: one layer fewer in the first chunk (with
    the embedding) and in the last (with the logits), the others even; with one layer a chunk
    (Llama 3 405B: 126 layers, pp 16, virtual 8) the first chunk holds only the embedding and the
    last only the logits and the loss (arXiv 2407.21783, 3.3.2). A ValueError when it does not divide."""
    p, n = job.parallel, job.model.layers
    c = p.pp * p.virtual
    if (n + 2) % c:
        raise ValueError(f"layers + 2 = {n + 2} is not a multiple of pp x virtual = {c}, which Llama 3's rule needs")
    k = (n + 2) // c
    if k < (2 if p.virtual == 1 else 1):
        raise ValueError("leaves a stage without layers")
    return [k - 1] + [k] * (c - 2) + [k - 1]


def stage_layers(job: Job) -> list[int]:
    """Transformer layers per pipeline stage: even, or the first and last as given (the rest even),
    or Llama 3's rule (one fewer on the first and on the last; with virtual > 1 on the first and
    last model chunk). A ValueError says what does not divide."""
    p, n = job.parallel, job.model.layers
    if not job.uneven_stages:
        return [n // p.pp] * p.pp
    if p.pp < 2:
        raise ValueError("uneven stages need pp 2 or more")
    if p.llama3_stages and p.virtual > 1:  # chunk c on rank c % pp (the interleaved schedules)
        out = [0] * p.pp
        for c, k in enumerate(llama3_chunks(job)):
            out[c % p.pp] += k
        return out
    if p.llama3_stages:
        if (n + 2) % p.pp:
            raise ValueError(f"layers + 2 = {n + 2} is not a multiple of pp {p.pp}, which Llama 3's rule needs")
        k = (n + 2) // p.pp
        first = last = k - 1
    else:
        first, last = p.first_stage_layers, p.last_stage_layers
        rest = p.pp - (first is not None) - (last is not None)  # stages that share the other layers evenly
        left = n - (first or 0) - (last or 0)
        if rest == 0:
            if left:
                raise ValueError(f"first + last stage layers are {n - left}, and the model has {n}")
            return [first, last]
        if left < rest or left % rest:
            raise ValueError(f"the {left} layers left do not split evenly over the other {rest} stages")
        k = left // rest
        first, last = first or k, last or k
    if first < 1 or last < 1:
        raise ValueError("leaves a stage without layers")
    return [first] + [k] * (p.pp - 2) + [last]


def check_job(job: Job, where: str = "job") -> Job:
    """The rules across fields, each an InputError naming the key and the fix."""
    p, m, hw = job.parallel, job.model, job.hardware

    def bad(key: str, problem: str, fix: str) -> InputError:
        return InputError(f"{where}: {key}", problem, fix)

    if hw.node not in NODE_TYPES:
        raise bad("hardware.node", f"{hw.node!r} is not a node type", f"choose one of {', '.join(NODE_TYPES)}")
    if hw.mfu is not None and hw.efficiency is not None:
        raise bad("hardware.mfu", "and hardware.efficiency both set the compute rate", "give one of them")
    try:
        job.efficiency  # noqa: B018 (resolved here so that a missing parameter is an error now)
    except ValueError as e:
        raise bad("hardware.efficiency", str(e), "give every parameter (docs/plan.md), or hardware.mfu") from None
    chunks = p.pp * p.virtual
    if job.uneven_stages:
        key = "parallel." + ("llama3_stages" if p.llama3_stages else
                             "first_stage_layers" if p.first_stage_layers is not None else "last_stage_layers")
        if p.llama3_stages and (p.first_stage_layers is not None or p.last_stage_layers is not None):
            raise bad(key, "and first_stage_layers / last_stage_layers both set the stages", "give one of them")
        if p.virtual != 1 and not (p.llama3_stages and p.schedule in ("interleaved", "interleaved1f1b", "interleavedzb", "loopedbfs")):
            raise bad(key, f"first/last stage layers are modelled with one chunk per rank, and virtual is {p.virtual}",
                      "give virtual 1 (gpipe, 1f1b, zbh1), llama3_stages with an interleaved schedule, or even stages")
        try:
            stage_layers(job)
        except ValueError as e:
            raise bad(key, str(e), "give stage layer counts that add up to model.layers") from None
    elif m.forward_s is None and m.layers % chunks:
        raise bad("model.layers", f"{m.layers} is not a multiple of pp x virtual = {chunks}", "give layers, pp and virtual that divide")
    if m.hidden % p.tp:
        raise bad("model.hidden", f"{m.hidden} is not a multiple of parallel.tp {p.tp}", "give a tp that divides the hidden size")
    if m.heads is not None or m.kv_heads is not None:  # a stated head count is checked as Megatron splits it
        a, kv = job.heads, job.kv_heads
        if m.hidden % a:
            raise bad("model.heads", f"{a} does not divide model.hidden {m.hidden}", "give heads that divide the hidden size")
        if a % p.tp:
            raise bad("model.heads", f"{a} is not a multiple of parallel.tp {p.tp}", "give heads a multiple of tp, or a smaller tp")
        if kv > a or a % kv:
            raise bad("model.kv_heads", f"{kv} does not divide model.heads {a}", "give kv_heads that divide heads (GQA), 1 for MQA")
        if kv % p.tp and p.tp % kv:
            raise bad("model.kv_heads", f"{kv} and parallel.tp {p.tp}: neither divides the other",
                      "give kv_heads a multiple of tp (split over tp) or a divisor of it (replicated)")
    if m.seq_len % p.cp:
        raise bad("parallel.cp", f"{p.cp} does not divide model.seq_len {m.seq_len}", "give a cp that divides the sequence")
    for name in ("forward_s", "backward_s", "weight_s", "optimizer_s"):
        v = getattr(m, name)
        if v is not None and (len(v) != p.pp or not all(0 <= x < 1e6 for x in v)):
            raise bad(f"model.{name}", f"needs {p.pp} seconds, one per pipeline stage, each 0..1e6", "give one figure per stage")
    if (m.forward_s is None) != (m.backward_s is None):
        raise bad("model.forward_s", "and model.backward_s go together", "give both measured lists, or neither")
    if job.gpus > MAX_PLAN_GPUS:
        raise bad("parallel", f"tp x cp x pp x dp = {job.gpus:,} GPUs, over the planner's {MAX_PLAN_GPUS:,}", "plan a smaller job")
    per = NODE_TYPES[hw.node].gpus
    if job.gpus % per and job.gpus > per:
        raise bad("parallel", f"tp x cp x pp x dp = {job.gpus} GPUs do not fill whole {hw.node} nodes of {per}",
                  "give a multiple of the node size")
    if p.tp > per and p.tp % per:
        raise bad("parallel.tp", f"{p.tp} spans {hw.node} nodes of {per} unevenly", f"give a divisor or a multiple of {per}")
    if p.cp > 1 and p.tp * p.cp > per and (p.tp * p.cp) % per:
        raise bad("parallel.cp", f"tp x cp = {p.tp * p.cp} spans {hw.node} nodes of {per} unevenly",
                  f"give tp x cp a divisor or a multiple of {per}")
    if p.schedule in ("interleaved", "interleaved1f1b", "loopedbfs", "interleavedzb") and p.virtual < 2:
        raise bad("parallel.virtual", f"is {p.virtual}, and {p.schedule} runs several model chunks per rank", "give virtual 2 or more")
    if p.schedule in ("zbv", "dualpipev") and p.virtual != 2:
        raise bad("parallel.virtual", f"is {p.virtual}, and {p.schedule} holds exactly 2 chunks per rank (a V)", "give virtual 2")
    if p.schedule in ("gpipe", "1f1b", "zbh1") and p.virtual != 1:
        raise bad("parallel.virtual", f"is {p.virtual}, and {p.schedule} holds one chunk per rank", "give virtual 1, or an interleaved schedule")
    if p.schedule in TORCH_SCHEDULES or p.schedule == "zbh1":
        if p.microbatches < p.pp and p.schedule not in ("gpipe",):
            raise bad("parallel.microbatches", f"{p.microbatches} is below pp {p.pp}, which {p.schedule} needs", f"give {p.pp} or more")
    return job


SCHEMA_FIX = "see docs/plan.md for the job file's keys"


def job_from_dict(data: Any, where: str = "job") -> Job:
    """A :class:`Job` from parsed JSON/YAML; the first problem is an InputError naming its key."""
    return check_job(validated(Job, data, where, SCHEMA_FIX), where)


def load_job(path: str | Path) -> Job:
    """A job file: JSON, or YAML when the name ends in .yaml/.yml (needs PyYAML)."""
    p = Path(path)
    text = read_text(p, "job", "give a job file (JSON or YAML): see examples/plans/")
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise InputError("job", f"{p.name} is YAML and PyYAML is not installed", "pip install pyyaml, or give JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InputError("job", f"{p} is not valid YAML ({str(e).splitlines()[0]})", "fix the file") from None
    else:
        data = parse_json_text(text, "job", str(p))
    return job_from_dict(data, p.name)


SWEEP_MODEL_KEYS = ("recompute",)  # the model keys a sweep may vary (a memory-for-compute trade)


def sweep_keys() -> list[str]:
    return list(Parallel.model_fields) + list(Hardware.model_fields) + list(SWEEP_MODEL_KEYS)


def with_overrides(job: Job, overrides: dict[str, Any]) -> Job:
    """``job`` with ``parallel`` (or ``hardware``, or ``model.recompute``) keys replaced: a sweep's point, checked again.
    A swept ``schedule`` without a swept ``virtual`` takes the chunks it needs: 1 for GPipe,
    1F1B and ZB-H1, 2 for the V schedules, the job's own (at least 2) for the interleaved ones."""
    data = job.model_dump()
    if "schedule" in overrides and "virtual" not in overrides:  # a schedule swept brings the chunks it holds
        sched, v = overrides["schedule"], data["parallel"]["virtual"]
        if sched in ("gpipe", "1f1b", "zbh1"):
            overrides = {**overrides, "virtual": 1}
        elif sched in ("zbv", "dualpipev"):
            overrides = {**overrides, "virtual": 2}
        elif v < 2:
            overrides = {**overrides, "virtual": 2}
    for key, value in overrides.items():
        section = ("parallel" if key in Parallel.model_fields else "hardware" if key in Hardware.model_fields
                   else "model" if key in SWEEP_MODEL_KEYS else None)
        if section is None:
            raise InputError(f"--sweep {key}", "is not a parallel or hardware key", f"sweep one of {', '.join(sweep_keys())}")
        data[section][key] = value
        if key in ("mfu", "efficiency"):  # a swept compute rate replaces the job's other one
            data["hardware"]["efficiency" if key == "mfu" else "mfu"] = None
    return job_from_dict(data, f"sweep point {overrides}")


__all__ = ["BUILTIN_SCHEDULES", "HBM_TBPS", "MEMORY_GIB", "NETWORKS", "PEAK_TFLOPS", "SCHEDULES", "TORCH_SCHEDULES", "Harvest",
           "Hardware", "Job", "Model", "Parallel", "SideTask", "Synthesis", "check_job", "job_from_dict", "llama3_chunks", "load_job",
           "stage_layers", "sweep_keys",
           "with_overrides"]
