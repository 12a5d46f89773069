"""A pipeline rehearsed on one machine: one real stage, the other p - 1 stood in for.

A user with one GPU wants to know how side tasks will behave in their pipeline's bubbles before
they take a cluster. The bubbles of a stage are set by the other stages: how long they compute
and when their activations and gradients arrive. So the rehearsal runs the real stage (real
model piece, real optimizer, on this machine's GPU or CPU) at its place in the pipeline (first,
middle, last) and every other stage as a **stand-in**: a CPU process that walks the same
schedule, receives and sends tensors of the real shape with the schedule's own dependencies,
and in place of computing sleeps its forward, backward and weight times. The real stage's waits,
and so its bubbles, then have the pipeline's lengths and positions; only the real stage
announces them, so side tasks run where the real stage idles.

Stand-in times (``--stand-in``):

- ``same`` (the default): every stand-in takes the real stage's own median F/B/W times,
  measured in the warm-up iterations and then frozen (a pipeline of equal stages; frozen, so
  a slower real stage under harvesting cannot slow its stand-ins and hide its own cost);
- ``F=0.08,B=0.16,W=0``: seconds per action (per chunk), the same for every stand-in;
- a JSON file: ``{"stages": [{"F": s, "B": s, "W": s}, ...]}`` (one entry per stage, or one
  for all; ``flowride plan --stand-ins`` writes one from a plan's timeline), or the
  ``ranks.json`` of an earlier ``flowride train`` run (each stage's measured median times).

Schedules: every schedule the built-in engine has, and torch's through their action orders
(:func:`flowride.pipeline.torch_compat.compute_actions`), run by the built-in engine's stage
loop, since a stand-in cannot be a torch ``PipelineStage``. The stand-ins' tensors are fixed
(seeded), so the real stage trains deterministically: its losses are the same with and without
side work. What a rehearsal leaves out: real NCCL transfers (activations cross through host
memory over gloo, timed as part of the real stage's action) and the other stages' own
variation.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from flowride.errors import InputError
from flowride.pipeline.schedules import (
    SCHEDULES,
    Instr,
    _deps,
    build_schedule,
    gap_types,
    simulate_lists,
)
from flowride.pipeline.wire import ACT, GRAD, Wire

KINDS = ("F", "B", "W")


@dataclass(frozen=True)
class StageTimes:
    """Seconds one stage spends per action of each kind (per chunk)."""

    F: float
    B: float
    W: float = 0.0

    def of(self, kind: str) -> float:
        return {"F": self.F, "B": self.B, "W": self.W}[kind]


def _times(d: dict, where: str) -> StageTimes:
    try:
        vals = {k: float(d.get(k, 0.0)) for k in KINDS}
    except (TypeError, ValueError):
        raise InputError("--stand-in", f"{where}: F, B, W must be numbers of seconds, got {d!r}",
                         'give e.g. {"F": 0.08, "B": 0.16, "W": 0}') from None
    if not all(math.isfinite(v) and 0 <= v <= 60 for v in vals.values()) or vals["F"] + vals["B"] <= 0:
        raise InputError("--stand-in", f"{where}: {vals} are not action times in seconds",
                         "give F and B between 0 and 60 s, not both 0")
    return StageTimes(**vals)


def stage_times(ranks: list[dict], warmup: int = 1) -> dict[int, StageTimes]:
    """Each stage's median F/B/W compute time in a run's records (warm-up iterations left out)."""
    out: dict[int, StageTimes] = {}
    for rr in ranks:
        its = rr["iterations"]
        out[int(rr["rank"])] = measured_times([r for it in (its[warmup:] or its) for r in it["records"]])
    return out


def _ranks_json_times(doc: dict, stages: int) -> list[StageTimes]:
    """Each stage's median F/B/W compute time from an earlier run's ranks.json."""
    out = stage_times(doc["ranks"])
    if sorted(out) != list(range(stages)):
        raise InputError("--stand-in", f"the run recorded stages {sorted(out)}, this run has {stages}",
                         "use a run with the same number of stages")
    return [out[r] for r in range(stages)]


def parse_stand_in(spec: str | None, stages: int) -> list[StageTimes] | None:
    """Per-stage stand-in times from ``--stand-in``; None means ``same`` (mirror the real stage)."""
    if spec is None or spec == "same":
        return None
    if "=" in spec and not Path(spec).exists():
        try:
            d = dict(part.split("=", 1) for part in spec.split(","))
        except ValueError:
            raise InputError("--stand-in", f"{spec!r} is not KIND=SECONDS,...", "give e.g. F=0.08,B=0.16,W=0") from None
        bad = sorted(set(d) - set(KINDS))
        if bad:
            raise InputError("--stand-in", f"unknown action kind {bad[0]!r}", "use F, B and W")
        return [_times(d, "--stand-in")] * stages
    p = Path(spec)
    if not p.exists():
        raise InputError("--stand-in", f"{spec} is neither 'same', KIND=SECONDS,... nor a file",
                         "give same, F=0.08,B=0.16 or a stand-in JSON file")
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise InputError("--stand-in", f"{p} is not readable JSON ({e})", "give a stand-in JSON file") from None
    if isinstance(doc, dict) and "ranks" in doc:
        return _ranks_json_times(doc, stages)
    entries = doc.get("stages") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or len(entries) not in (1, stages):
        raise InputError("--stand-in", f"{p} holds no 'stages' list of 1 or {stages} entries",
                         'write {"stages": [{"F": s, "B": s, "W": s}, ...]}')
    times = [_times(e, f"{p} stage {k}") for k, e in enumerate(entries)]
    return times * stages if len(times) == 1 else times


def rehearsal_schedule(cfg) -> tuple[list[list[Instr]], dict[int, int]]:
    """Every rank's instruction list and the rank holding each chunk: the built-in schedules
    as built, torch's from their action orders (full B and input-gradient I become our B, W
    stays W; V-shaped schedules keep their placement)."""
    P = cfg.stages * cfg.chunks
    if cfg.schedule in SCHEDULES:
        return build_schedule(cfg.schedule, cfg.stages, cfg.microbatches, cfg.chunks), {j: j % cfg.stages for j in range(P)}
    from flowride.pipeline import torch_compat as tc

    lists: list[list[Instr]] = []
    owner: dict[int, int] = {}
    for r in range(cfg.stages):
        sched = tc.dry_schedule(cfg.schedule, cfg.stages, cfg.microbatches, cfg.chunks, rank=r)
        acts = tc.compute_actions(sched)
        if acts is None:
            raise InputError("--schedule", f"torch's {cfg.schedule} publishes no action order to rehearse",
                             "rehearse one of the built-in schedules")
        lists.append([Instr("B" if a.kind in ("B", "I") else a.kind, a.mb, a.stage) for a in acts[r]])
        owner.update({j: r for j in tc.local_stage_indices(cfg.schedule, cfg.stages, cfg.chunks, r)})
    return lists, owner


def stand_in_tensor(shape: tuple[int, ...], seed: int, kind: int) -> torch.Tensor:
    """The fixed activation (unit scale) or gradient (1e-3 scale) a stand-in sends, seeded."""
    g = torch.Generator().manual_seed(seed * 7919 + 17 + kind)
    t = torch.randn(shape, generator=g)
    return t if kind == ACT else t * 1e-3


def measured_times(recs: list[dict]) -> StageTimes:
    """Median compute time per action kind of one iteration's records (0 for a kind not run)."""
    per = {k: [r["end"] - r["compute"] for r in recs if r["kind"] == k] for k in KINDS}
    return StageTimes(*(statistics.median(v) if v else 0.0 for v in per.values()))


def exchange_times(times: StageTimes | None, src: int) -> StageTimes:
    """The real stage's times, broadcast to every stand-in (each rank calls this at the same point)."""
    import torch.distributed as dist

    t = torch.tensor([times.F, times.B, times.W] if times is not None else [0.0, 0.0, 0.0], dtype=torch.float64)
    dist.broadcast(t, src)
    return StageTimes(*t.tolist())


class StandInRunner:
    """A stage that walks its schedule, moves real-shaped tensors and sleeps its action times."""

    def __init__(self, cfg, rank: int, act_shape: tuple[int, ...], times: StageTimes | None, reporter) -> None:
        self.cfg, self.rank, self.reporter = cfg, rank, reporter
        lists, owner = rehearsal_schedule(cfg)
        self.instrs = lists[rank]
        self.gaps = gap_types(self.instrs)
        self.P = len(owner)
        self.mine = [j for j in range(self.P) if owner[j] == rank]
        self.times = times or StageTimes(0.0, 0.0, 0.0)  # ``same``: set after the first iteration
        self.fold_w = not any(i.kind == "W" for lst in lists for i in lst)  # B is the full backward
        self.wire = Wire(rank, owner, cfg.microbatches, act_shape, torch.device("cpu"))
        self.act = stand_in_tensor(act_shape, cfg.seed, ACT)
        self.grad = stand_in_tensor(act_shape, cfg.seed, GRAD)

    def make_batch(self, it: int) -> None:
        return None

    def state_dicts(self) -> dict:
        return {}

    def iteration(self, it: int, batch) -> tuple[None, list[dict]]:
        rep, w = self.reporter, self.wire
        pending: list = []
        recs: list[dict] = []
        for i, ins in enumerate(self.instrs):
            t0 = time.monotonic()
            rep.idle(i, self.gaps[i])
            j = ins.chunk
            if ins.kind == "F" and j > 0:
                w.recv(ACT, ins.mb, j, j - 1)
            elif ins.kind == "B" and j < self.P - 1:
                w.recv(GRAD, ins.mb, j, j + 1)
            tc = time.monotonic()
            rep.busy(tc)
            _sleep_until(tc + self.times.of(ins.kind) + (self.times.W if self.fold_w and ins.kind == "B" else 0.0))
            if ins.kind == "F" and j < self.P - 1:
                w.send(self.act, ACT, ins.mb, j + 1, j + 1, pending)
            elif ins.kind == "B" and j > 0:
                w.send(self.grad, GRAD, ins.mb, j - 1, j - 1, pending)
            recs.append({"kind": ins.kind, "mb": ins.mb, "chunk": j, "start": t0, "compute": tc, "end": time.monotonic()})
        for p in pending:
            p.wait()
        now = time.monotonic()
        recs.append({"kind": "O", "mb": -1, "chunk": -1, "start": now, "compute": now, "end": now})
        return None, recs


def _sleep_until(deadline: float) -> None:
    """Sleep to ``deadline``; the last half millisecond spun, so short actions keep their length."""
    left = deadline - time.monotonic()
    if left > 0.001:
        time.sleep(left - 0.0005)
    while time.monotonic() < deadline:
        pass


def planned_bubbles(cfg, real: int, real_times: StageTimes, stand_ins: list[StageTimes]) -> dict:
    """The real stage's bubbles as the schedule implies them with these times (one iteration,
    ending at a barrier as the runs do): seconds per iteration by gap type, and the idle share."""
    lists, owner = rehearsal_schedule(cfg)
    P = len(owner)
    times = [real_times if r == real else stand_ins[r] for r in range(cfg.stages)]
    has_w = any(i.kind == "W" for lst in lists for i in lst)
    tl = simulate_lists(lists, lambda ins: _deps(ins, P), lambda ins: times[owner[ins.chunk]].of(ins.kind)
                        + (times[owner[ins.chunk]].W if ins.kind == "B" and not has_w else 0.0),
                        lambda ins: owner[ins.chunk])
    makespan = max((t[-1][1] for t in tl if t), default=0.0)
    types = gap_types(lists[real])
    by_type: dict[str, float] = {}
    edge = 0.0
    for k, (s, e, _ins) in enumerate(tl[real]):
        by_type[types[k]] = by_type.get(types[k], 0.0) + max(0.0, s - edge)
        edge = e
    by_type[types[-1]] = by_type.get(types[-1], 0.0) + max(0.0, makespan - edge)
    idle = sum(by_type.values())
    return {"by_type_s": {t: v for t, v in sorted(by_type.items()) if v > 1e-9}, "iteration_s": makespan,
            "bubble_fraction": idle / makespan if makespan > 0 else 0.0}


def rehearsal_report(cfg, ranks: list[dict], bubbles: list[dict], warmup: int) -> dict:
    """What the rehearsal ran and whether the real stage's bubbles are the planned ones: each
    stage's measured action times, the bubbles those times imply for the real stage (by type,
    seconds per iteration) beside the ones it measured."""
    real = cfg.rehearse_stage
    times = stage_times(ranks, warmup)
    plan = planned_bubbles(cfg, real, times[real], [times[r] for r in range(cfg.stages)])
    measured = {b["type"]: b["total_s"] for b in bubbles if b["stage"] == real and b["total_s"] > 1e-9}
    return {
        "real_stage": real,
        "stand_in": cfg.stand_in,
        "times_s": {str(r): {"F": t.F, "B": t.B, "W": t.W} for r, t in sorted(times.items())},
        "planned_by_type_s": plan["by_type_s"],
        "measured_by_type_s": measured,
        "planned_bubble_fraction": plan["bubble_fraction"],
    }
