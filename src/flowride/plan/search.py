"""The fastest parallel configuration of one model on N GPUs that fits (``flowride plan --search``).

The space: for the job's model, fabric and global batch (``microbatch_size x microbatches x dp``
samples, kept), every ``tp`` dividing the node's GPUs, ``cp`` in 1, 2, 4, 8, 16 when the sequence
is 16k tokens or longer (else 1), ``pp`` dividing the layers (``layers + 2`` under Llama 3's rule),
``dp = gpus / (tp*cp*pp)`` and ``microbatches = batch / (dp * microbatch_size)`` (both whole, else
refused), the schedules 1F1B and ZB-H1 (one chunk per rank) and Megatron's interleaved 1F1B with
``virtual`` in 2, 3, 4, 5, 6, 8 dividing ``layers / pp`` (GPipe is left out: it keeps every
micro-batch), and ``model.recompute`` none, selective, full. One pipeline stage (``pp = 1``) runs
1F1B only. The job's own configuration, scaled to the GPUs, is always in the space (the reference).

Pruning, before anything is simulated:

1. the job's rules: each candidate is built through :func:`job_from_dict` (so :func:`check_job`)
   and the schedule's own rules (:func:`flowride.pipeline.schedules.validate`); an InputError is
   a refusal counted under its key;
2. memory: a closed-form floor of the peak per GPU (:func:`memory_floor`: the model states
   exactly, the micro-batches in flight of the first and last stage from the schedules' warm-ups)
   over the device refuses a candidate; the exact check runs again when it is priced;
3. branch and bound: the rest are priced (one shared Pricer, NCCL's modelled collectives, cached)
   in order of a lower bound on their iteration (:func:`iteration_bound`), and pricing stops once
   the next bound cannot enter the top ``top`` nor beat the reference, so the ranks are exact.

The bound, per pipeline rank ``r`` whose lowest chunk is ``c``: micro-batch 0 must pass the ``c``
chunks before it (their forwards and ``c`` transfers), then the rank runs all its work, then (its
last backward) the gradient must pass back through those chunks to rank 0, which then steps its
optimizer; the tensor- and context-parallel collectives inside each action are priced exactly, the
data-parallel synchronisation is counted only when the cache already holds its price (else 0). At
uniform stages it is the closed form of 1F1B, interleaved 1F1B and ZB-H1. It never exceeds the
simulated iteration (tests/test_plan_search.py checks it), so a pruned candidate cannot be faster.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from flowride.errors import InputError
from flowride.pipeline.schedules import validate
from flowride.plan.comm import Pricer, _key, p2p_seconds
from flowride.plan.costs import (
    chunk_costs,
    chunk_layers,
    chunk_rank,
    cp_chunk_bytes,
    cp_passes,
    dp_bytes,
    optimizer_seconds,
    p2p_bytes,
    rank_params_per_gpu,
    tp_allreduce_bytes,
    tp_allreduces,
)
from flowride.plan.job import BUILTIN_SCHEDULES, MAX_PLAN_GPUS, Job, job_from_dict
from flowride.plan.memory import (
    GIB,
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    layer_activation_bytes,
    logits_activation_bytes,
    recompute_working_bytes,
)
from flowride.plan.price import cp_group, groups, plan_job
from flowride.synth.result import Progress
from flowride.topology.fabrics import NODE_TYPES

CP_CHOICES = (1, 2, 4, 8, 16)
CP_MIN_SEQ = 16_384  # context parallelism is searched for sequences this long or longer
VIRTUALS = (2, 3, 4, 5, 6, 8)
RECOMPUTES = ("none", "selective", "full")
SYNTH_TOP = 3  # with a synthesizing pricer, the top candidates re-priced with synthesized collectives
KEYS = ("tp", "pp", "dp", "cp", "virtual", "microbatches", "schedule", "recompute")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def label(cfg: dict) -> str:
    cp = f" cp{cfg['cp']}" if cfg["cp"] > 1 else ""
    v = f" v{cfg['virtual']}" if cfg["virtual"] > 1 else ""
    return f"tp{cfg['tp']}{cp} pp{cfg['pp']} dp{cfg['dp']}{v} m{cfg['microbatches']} {cfg['schedule']} rc={cfg['recompute']}"


def global_batch(job: Job) -> int:
    """Samples per iteration: ``microbatch_size * microbatches * dp``."""
    return job.model.microbatch_size * job.parallel.microbatches * job.parallel.dp


def check_gpus(job: Job, gpus: int) -> None:
    per = NODE_TYPES[job.hardware.node].gpus
    if gpus < 1:
        raise InputError("--gpus", f"{gpus} GPUs", "give 1 or more")
    if gpus > MAX_PLAN_GPUS:
        raise InputError("--gpus", f"{gpus:,} GPUs, over the planner's {MAX_PLAN_GPUS:,}", "search fewer")
    if gpus > per and gpus % per:
        raise InputError("--gpus", f"{gpus} GPUs do not fill whole {job.hardware.node} nodes of {per}",
                         f"give a multiple of {per}")
    if job.model.forward_s is not None:
        raise InputError("--search", "a measured profile fixes the stages, so it cannot be re-split",
                         "search with the FLOP model (no model.forward_s, no --profile)")


def space(job: Job, gpus: int) -> list[dict]:
    """Every (tp, cp, pp, schedule, virtual, recompute) of the space (dp and micro-batches follow),
    the reference (the job's own, scaled to ``gpus``) first."""
    m, p = job.model, job.parallel
    per = NODE_TYPES[job.hardware.node].gpus
    cps = CP_CHOICES if m.seq_len >= CP_MIN_SEQ else (1,)
    pps = sorted(set(_divisors(m.layers)) | (set(_divisors(m.layers + 2)) if p.llama3_stages else set()))
    ref = {"tp": p.tp, "cp": p.cp, "pp": p.pp, "schedule": p.schedule, "virtual": p.virtual, "recompute": m.recompute}
    out = [ref]
    for tp in _divisors(per):
        for cp in cps:
            for pp in pps:
                scheds = [("1f1b", 1)] if pp == 1 else [("1f1b", 1), ("zbh1", 1)] + [
                    ("interleaved", v) for v in VIRTUALS if (m.layers // pp) % v == 0 and m.layers % pp == 0]
                for sched, v in scheds:
                    for rc in RECOMPUTES:
                        c = {"tp": tp, "cp": cp, "pp": pp, "schedule": sched, "virtual": v, "recompute": rc}
                        if c != ref:
                            out.append(c)
    return out


def build(job: Job, gpus: int, c: dict) -> Job:
    """Candidate ``c`` as a job (the global batch kept), or an InputError naming what refuses it."""
    batch, mbs = global_batch(job), job.model.microbatch_size
    n = c["tp"] * c["cp"] * c["pp"]
    if gpus % n:
        raise InputError("parallel.dp", f"{gpus} GPUs are not a multiple of tp x cp x pp = {n}", "")
    dp = gpus // n
    if batch % (dp * mbs):
        raise InputError("parallel.microbatches", f"the batch of {batch} samples does not split over dp {dp} "
                         f"x micro-batch {mbs}", "")
    mb = batch // (dp * mbs)
    try:
        if c["schedule"] in BUILTIN_SCHEDULES:  # torch's (a reference only) are checked by check_job
            validate(c["schedule"], c["pp"], mb, c["virtual"])
    except InputError as e:  # the schedule's own rules, named as the job's keys
        key = {"chunks": "virtual", "stages": "pp"}.get(e.field, e.field)
        raise InputError(f"parallel.{key}", e.problem, e.fix) from None
    data = job.model_dump()
    par = data["parallel"]
    par.update(tp=c["tp"], cp=c["cp"], pp=c["pp"], dp=dp, virtual=c["virtual"], microbatches=mb, schedule=c["schedule"],
               first_stage_layers=None, last_stage_layers=None, llama3_stages=par["llama3_stages"] and c["pp"] > 1)
    data["model"]["recompute"] = c["recompute"]
    data["synthesis"]["enabled"] = False
    return job_from_dict(data, "candidate")


def config(job: Job) -> dict:
    p = job.parallel
    return {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "virtual": p.virtual, "microbatches": p.microbatches,
            "schedule": p.schedule, "recompute": job.model.recompute}


def _in_flight(job: Job, r: int) -> float:
    """Chunk-forwards held at rank ``r``'s peak (first or last rank), from the schedules' warm-ups:
    1F1B ``min(p - r, m)``, ZB-H1 ``p`` (its deferred W's), interleaved ``2(p-r-1) + (v-1)p + 1``."""
    p = job.parallel
    pp, m, v = p.pp, p.microbatches, p.virtual
    if p.schedule == "zbh1":
        return min(pp, m)
    if p.schedule == "interleaved":
        return min(2 * (pp - r - 1) + (v - 1) * pp + 1, m * v)
    if p.schedule == "gpipe":
        return m
    if p.schedule == "1f1b":
        return min(pp - r, m)
    return 1  # the torch schedules (a reference only): one chunk-forward, a floor


def memory_floor(job: Job) -> float:
    """A floor of the peak bytes per GPU (exact for 1F1B and ZB-H1, and at the first stage of the
    interleaved schedule; at its last stage it counts one logit chunk in flight): the model states
    of the first and last pipeline rank and the activations their warm-ups hold."""
    m, p = job.model, job.parallel
    shard = p.dp * p.cp if p.distributed_optimizer else 1
    per_param = WEIGHT_BYTES + m.grad_bytes + OPTIMIZER_BYTES / shard
    layers = chunk_layers(job)
    per_layer = layer_activation_bytes(job)
    logits = logits_activation_bytes(job)
    params = rank_params_per_gpu(job)
    working = recompute_working_bytes(job)
    best = 0.0
    last = len(layers) - 1
    for r in {0, p.pp - 1}:
        mine = [c for c in range(len(layers)) if chunk_rank(job, c) == r]
        k = _in_flight(job, r)
        if last in mine and p.schedule == "interleaved" and len(mine) > 1:  # the rest of the warm-up on other chunks
            act = layers[last] * per_layer + logits + (k - 1) * min(layers[c] for c in mine if c != last) * per_layer
        else:
            act = k * (min(layers[c] for c in mine) * per_layer + (logits if mine == [last] else 0.0))
        best = max(best, params[r] * per_param + act + working)
    return best


def _cached_s(pricer: Pricer, coll: str, size: int, g) -> float:
    """A collective's NCCL price when the cache already holds it, else 0 (a floor)."""
    if g.size < 2:
        return 0.0
    hit = pricer.entries.get(_key(coll, max(1, int(size)), g, pricer.synth, pricer.calibration_key))
    return hit["nccl_us"] * 1e-6 if hit else 0.0


def iteration_bound(job: Job, pricer: Pricer) -> float:
    """A lower bound on the simulated iteration (NCCL's prices; see the module)."""
    p, mo = job.parallel, job.model
    m = p.microbatches
    chunks = chunk_costs(job)
    layers = chunk_layers(job)
    tp_g, dp_g = groups(job)
    n_ar = tp_allreduces(job)
    ar = pricer.price("allreduce", tp_allreduce_bytes(job), tp_g).nccl_us * 1e-6 if max(n_ar) else 0.0
    cp_f, cp_b = cp_passes(job)
    ag = pricer.price("allgather", p.cp * cp_chunk_bytes(job), cp_group(job)).nccl_us * 1e-6 if cp_f else 0.0
    back = 2 if mo.recompute == "full" else 1
    overlap = getattr(p, "tp_overlap", False)  # async TP: the input-gradient all-reduces partly hidden (a floor: 0 of them)
    host = mo.action_overhead_s
    zb = p.schedule in ("zbh1", "interleavedzb", "zbv", "dualpipev")  # W split off the backward
    f = [c.f + n * ar + k * cp_f * ag + host for c, n, k in zip(chunks, n_ar, layers, strict=True)]
    def tp_b(n: int, k: int) -> float:
        if not overlap or not n:
            return n * ar * back
        return k * ((ar if p.sequence_parallel else 0.0) + (2 * ar if back == 2 else 0.0))

    i = [c.i + (0.0 if zb else c.w) + tp_b(n, k) + k * cp_b * ag + host for c, n, k in zip(chunks, n_ar, layers, strict=True)]
    w = [c.w + host if zb else 0.0 for c in chunks]
    per = NODE_TYPES[job.hardware.node].gpus
    hop = 0.0
    if p.pp > 1:
        hop = mo.p2p_s if mo.p2p_s is not None else p2p_seconds(tp_g, p2p_bytes(job), same_node=p.tp * p.cp * p.dp < per)
    opt = optimizer_seconds(job)
    if p.distributed_optimizer:
        dp = _cached_s(pricer, "reducescatter", dp_bytes(job), dp_g) + _cached_s(pricer, "allgather", dp_bytes(job), dp_g)
    else:
        dp = _cached_s(pricer, "allreduce", dp_bytes(job), dp_g)
    dp *= 1.0 - p.dp_overlap
    best = 0.0
    for r in range(p.pp):
        mine = [c for c in range(len(chunks)) if chunk_rank(job, c) == r]
        lo = min(mine)
        head = sum(f[:lo]) + lo * hop
        work = m * sum(f[c] + i[c] + w[c] for c in mine)
        best = max(best, head + work + opt[r])
        if lo:  # the last micro-batch's gradient back through the chunks below, then rank 0's step
            until_last_i = m * sum(f[c] + i[c] for c in mine) if zb else work
            best = max(best, head + until_last_i + sum(i[:lo]) + lo * hop + (w[0] if zb else 0.0) + opt[0])
    return best + dp + mo.iteration_overhead_s


@dataclass
class SearchResult:
    """Plain data: the ranked configurations, the reference's rank, what was refused and why."""

    gpus: int
    global_batch: int
    tokens_per_iteration: int
    rows: list[dict]  # every priced candidate, best tokens/s first (rank = index + 1)
    top: int
    reference: dict | None  # the job's own configuration scaled: its row (with "rank") or {"config", "refused"}
    counts: dict[str, int]
    refusals: dict[str, dict]  # key -> {"count", "examples"}
    explanations: list[str]
    wall_s: float
    space: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"gpus": self.gpus, "global_batch": self.global_batch, "tokens_per_iteration": self.tokens_per_iteration,
                "space": self.space, "counts": self.counts, "wall_s": self.wall_s, "top": self.rows[:self.top],
                "explanations": self.explanations, "reference": self.reference, "refusals": self.refusals,
                "priced": self.rows}


def _row(job: Job, plan: Any, bound: float) -> dict:
    rep = plan.report()
    t, sh = rep["iteration_s"], rep["shares"]
    p = job.parallel
    plain = job.model_copy(update={"model": job.model.model_copy(update={"recompute": "none"})})
    recompute = p.microbatches * sum(a.i - b.i for a, b in zip(chunk_costs(job), chunk_costs(plain), strict=True)) / p.pp
    mem = plan.memory
    return {"config": config(job), "label": label(config(job)), "iteration_s": t, "tokens_per_s": rep["tokens_per_s"],
            "bound_s": bound, "bubble_share": sh["bubbles"], "tp_comm_share": sh["tp_comm"], "cp_comm_share": sh["cp_comm"],
            "dp_comm_share": sh["dp_comm"], "compute_share": sh["compute"], "recompute_s": recompute,
            "memory_peak_gib": mem.peak.total / GIB, "device_gib": mem.device_gib,
            "harvest_value": rep["harvest"]["cost"]["value_term"] if job.harvest.tasks else None}


PARTS = (("bubbles", "bubble_share"), ("TP comm", "tp_comm_share"), ("CP comm", "cp_comm_share"), ("DP comm", "dp_comm_share"))


def _seconds(row: dict) -> dict[str, float]:
    t = row["iteration_s"]
    out = {name: row[key] * t for name, key in PARTS}
    out["recompute FLOPs"] = row["recompute_s"]
    out["other compute"] = row["compute_share"] * t - row["recompute_s"]
    return out


def seconds_text(x: float) -> str:
    """Seconds in a unit that keeps three figures or more: ``8.205 s``, ``12.40 ms``, ``312.4 us``."""
    a = abs(x)
    return f"{x:.3f} s" if a >= 0.1 else f"{x * 1e3:.2f} ms" if a >= 1e-3 else f"{x * 1e6:.1f} us"


def explain(win: dict, nxt: dict | None) -> str:
    """Why ``win`` beats ``nxt`` (the next in the ranking): the parts of the iteration it saves
    (seconds and share of the next's iteration), what it pays, and the memory headroom."""
    room = win["device_gib"] - win["memory_peak_gib"]
    if nxt is None:
        return f"{win['label']}: the only feasible configuration ({room:.1f} GiB headroom)"
    a, b = _seconds(win), _seconds(nxt)
    t2 = nxt["iteration_s"]
    delta = sorted(((b[k] - a[k], k) for k in a), reverse=True)
    saves = [f"{k} -{seconds_text(d)} ({d / t2:.1%})" for d, k in delta if d > 1e-4 * t2][:3]
    pays = [f"{k} +{seconds_text(-d)}" for d, k in delta if -d > 1e-4 * t2][:2]
    gain = (t2 - win["iteration_s"]) / t2
    text = f"{win['label']}: {gain:.2%} faster than {nxt['label']}"
    text += ("; saves " + ", ".join(saves)) if saves else ""
    text += ("; pays " + ", ".join(pays)) if pays else ""
    return text + f"; {room:.1f} GiB headroom (next {nxt['device_gib'] - nxt['memory_peak_gib']:.1f})"


def _nccl_view(pricer: Pricer) -> Pricer:
    """A pricer with NCCL's modelled collectives only, sharing ``pricer``'s cache (its keys differ)."""
    if not pricer.synth:
        return pricer
    view = Pricer(cache=None, synth=False, time_limit_s=pricer.time_limit_s, calibration=pricer.calibration,
                  network_kind=pricer.network_kind)
    view.entries, view.path = pricer.entries, pricer.path
    return view


def search(job: Job, gpus: int, pricer: Pricer, progress: Progress | None = None, top: int = 10) -> SearchResult:
    """The fastest memory-feasible configurations of ``job``'s model on ``gpus`` GPUs, the job's
    global batch kept (see the module). ``pricer`` prices with NCCL's modelled collectives; when
    it synthesizes, only the top :data:`SYNTH_TOP` are re-priced with it (``iteration_s_synth``)."""
    t0 = time.perf_counter()
    check_gpus(job, gpus)
    nccl = _nccl_view(pricer)
    cands = space(job, gpus)
    refusals: dict[str, dict] = {}
    counts = Counter(enumerated=len(cands))

    def refuse(kind: str, key: str, cfg: dict, why: str) -> None:
        counts[kind] += 1
        d = refusals.setdefault(key, {"kind": kind, "count": 0, "examples": []})
        d["count"] += 1
        if len(d["examples"]) < 3:
            d["examples"].append(f"{label(cfg)}: {why}")

    live: list[tuple[float, int, Job]] = []
    ref_key: dict | None = None
    reference: dict | None = None
    for n, c in enumerate(cands):
        if progress and n % 50 == 0:
            progress({"stage": "search", "phase": "pruning", "i": n + 1, "of": len(cands)})
        cfg = {**c, "dp": "?", "microbatches": "?"}
        try:
            j = build(job, gpus, c)
        except InputError as e:
            refuse("refused_by_rules", e.field, cfg, e.problem)
            if n == 0:
                reference = {"config": cfg, "label": label(cfg), "refused": f"{e.field}: {e.problem}"}
            continue
        cfg = config(j)
        if n == 0:
            ref_key = cfg
        floor = memory_floor(j)
        if floor > j.memory_gib * GIB:
            refuse("refused_by_memory", "memory", cfg, f"at least {floor / GIB:.1f} of {j.memory_gib:g} GiB per GPU")
            if n == 0:
                reference = {"config": cfg, "label": label(cfg), "refused": f"memory: over {j.memory_gib:g} GiB"}
            continue
        try:
            live.append((iteration_bound(j, nccl), n, j))
        except InputError as e:  # a group the fabric cannot build
            refuse("refused_by_rules", e.field, cfg, e.problem)
    live.sort(key=lambda x: (x[0], x[1]))
    if ref_key is not None:  # the reference first: its time bounds the search too
        live.sort(key=lambda x: x[1] != 0)
    rows: list[dict] = []
    ref_s = None
    for k, (bound, n, j) in enumerate(live):
        times = sorted(r["iteration_s"] for r in rows)
        cutoff = times[top - 1] if len(times) >= top else float("inf")
        if ref_s is not None:
            cutoff = max(cutoff, ref_s)
        if n != 0 and bound > cutoff:
            counts["pruned_by_bound"] += len(live) - k
            break
        if progress:
            progress({"stage": "search", "phase": "pricing", "i": k + 1, "of": len(live), "config": label(config(j))})
        try:
            pl = plan_job(j, nccl, progress)
        except InputError as e:
            mem = e.field.startswith("parallel / model.recompute")
            refuse("refused_by_memory" if mem else "refused_by_rules", "memory" if mem else e.field, config(j), e.problem)
            if n == 0:
                reference = {"config": config(j), "label": label(config(j)), "refused": f"{e.field}: {e.problem}"}
            continue
        counts["priced"] += 1
        row = _row(j, pl, bound)
        row["reference"] = n == 0
        rows.append(row)
        if n == 0:
            ref_s = row["iteration_s"]
    rows.sort(key=lambda r: (r["iteration_s"], r["label"]))
    for i, r in enumerate(rows):
        r["rank"] = i + 1
        if r["reference"]:
            reference = r
    if pricer.synth:
        for r in rows[:SYNTH_TOP]:
            if progress:
                progress({"stage": "search", "phase": "synthesizing", "config": r["label"]})
            j = build(job, gpus, r["config"])
            j = j.model_copy(update={"synthesis": job.synthesis.model_copy(update={"enabled": True})})
            r["iteration_s_synth"] = plan_job(j, pricer, progress).ours.iteration_s
    if nccl is not pricer:  # one account of what was priced and what came from the cache
        pricer.hits += nccl.hits
        pricer.solved += nccl.solved
    pricer.save()
    expl = [explain(rows[i], rows[i + 1] if i + 1 < len(rows) else None) for i in range(min(3, len(rows)))]
    tokens = global_batch(job) * job.model.seq_len
    counts.setdefault("refused_by_rules", 0)
    counts.setdefault("refused_by_memory", 0)
    counts.setdefault("pruned_by_bound", 0)
    counts.setdefault("priced", 0)
    sp = {"tp": _divisors(NODE_TYPES[job.hardware.node].gpus),
          "cp": list(CP_CHOICES if job.model.seq_len >= CP_MIN_SEQ else (1,)),
          "schedules": ["1f1b", "zbh1", "interleaved"], "virtual": list(VIRTUALS), "recompute": list(RECOMPUTES),
          "reference": ref_key or (reference or {}).get("config")}
    return SearchResult(gpus, global_batch(job), tokens, rows, top, reference, dict(counts), refusals, expl,
                        time.perf_counter() - t0, sp)


__all__ = ["SearchResult", "build", "explain", "iteration_bound", "memory_floor", "search", "seconds_text", "space"]
