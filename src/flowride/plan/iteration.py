"""One training iteration of one pipeline, simulated: every stage's actions, their waits, the
collectives around them, and the bubbles that are left.

The actions are the schedule's own: flowride's instruction lists (GPipe, 1F1B, interleaved,
ZB-H1: :func:`flowride.pipeline.schedules.build_schedule`) or torch.distributed.pipelining's
``pipeline_order`` (its seven schedules, built without a process group:
:func:`flowride.pipeline.torch_compat.dry_schedule`). They run through the one dependency
simulator flowride times its pipelines with (:func:`flowride.pipeline.schedules.simulate_lists`):
each action as early as its rank and its data allow, a transfer's time added to every dependency
that crosses ranks. An action's time is its compute plus the tensor-parallel all-reduces and the
context-parallel ring exchanges inside it (exposed: Megatron runs the all-reduces on the critical
path; the ring's overlap with the attention is not modelled). After its last action a stage
synchronises its gradients with its data-parallel peers (``dp_overlap`` of that hidden behind the
backward), then runs its optimizer step; the iteration ends when the slowest stage is done. All
ranks start together, as after the optimizer step that ends the previous iteration.

Every DP replica runs the same pipeline and every TP and CP rank of a stage idles alike, so one
pipeline of ``pp`` ranks stands for all ``tp*cp*pp*dp`` GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flowride.pipeline.schedules import build_schedule, gap_types, simulate_lists
from flowride.pipeline.torch_compat import Act
from flowride.pipeline.torch_plan import action_dependencies
from flowride.plan.costs import StageCost
from flowride.plan.job import BUILTIN_SCHEDULES, Job


@dataclass(frozen=True)
class Gap:
    rank: int
    type: str  # A, B, C, D, S (flowride.pipeline.schedules.gap_types)
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class ChunkComm:
    """Exposed communication seconds inside one chunk's actions: tensor-parallel all-reduces and
    context-parallel ring exchanges, in its forward and in its backward (I, or the full B)."""

    tp_f: float = 0.0
    tp_b: float = 0.0
    cp_f: float = 0.0
    cp_b: float = 0.0


@dataclass
class Timeline:
    """One simulated iteration: per rank its actions (start, end, action) and its gaps."""

    iteration_s: float
    actions: list[list[tuple[float, float, Act]]]
    gaps: list[Gap]
    compute_s: list[float]  # per rank: pure compute
    tp_s: list[float]  # per rank: tensor-parallel collectives inside its actions
    dp_s: list[float]  # per rank: exposed data-parallel synchronisation at its end
    dp_start: list[float] = field(default_factory=list)
    cp_s: list[float] = field(default_factory=list)  # per rank: context-parallel ring exchanges inside its actions

    @property
    def ranks(self) -> int:
        return len(self.actions)

    def stand_ins(self) -> dict:
        """Each rank's median action time by kind, as ``flowride train --rehearse --stand-in FILE``
        reads it (torch's input-gradient I and full B are the rehearsal's B; W stays W): a
        one-machine rehearsal of this plan's bubbles."""
        import statistics

        stages = []
        for tl in self.actions:
            per: dict[str, list[float]] = {"F": [], "B": [], "W": []}
            for s, e, a in tl:
                per["B" if a.kind in ("B", "I") else a.kind].append(e - s)
            stages.append({k: statistics.median(v) if v else 0.0 for k, v in per.items()})
        return {"stages": stages}

    def bubble_s(self) -> list[float]:
        """Per rank: the iteration less its compute and exposed collectives. That is its gaps plus
        any measured host time around actions (a profile's ``action_overhead_s``), which a run's
        own bubble fraction counts as idle too (``flowride train``: 1 - busy / iteration)."""
        cp = self.cp_s or [0.0] * len(self.tp_s)
        return [max(0.0, self.iteration_s - c - t - d - x)
                for c, t, d, x in zip(self.compute_s, self.tp_s, self.dp_s, cp, strict=True)]


def rank_actions(job: Job) -> tuple[dict[int, list[Act]], dict[int, int]]:
    """Every rank's compute actions in order (torch's letters: F, B full backward, I, W) and the
    rank that holds each model chunk (stage index)."""
    p = job.parallel
    pp, v, m = p.pp, p.virtual, p.microbatches
    if p.schedule in BUILTIN_SCHEDULES:
        lists = build_schedule(p.schedule, pp, m, v)
        has_w = any(ins.kind == "W" for lst in lists for ins in lst)
        acts = {r: [Act("I" if (ins.kind == "B" and has_w) else ins.kind, ins.chunk, ins.mb) for ins in lst]
                for r, lst in enumerate(lists)}
        return acts, {c: c % pp for c in range(pp * v)}
    from flowride.pipeline import torch_compat as tc

    sched = tc.dry_schedule(p.schedule, pp, m, v)
    acts = tc.compute_actions(sched)
    if acts is None:
        raise AssertionError(f"torch's {p.schedule} publishes no pipeline_order")
    s2r = {s: r for r in range(pp) for s in tc.local_stage_indices(p.schedule, pp, v, r)}
    return acts, s2r


def simulate(job: Job, chunks: list[StageCost], tp_s: float | Sequence[ChunkComm], p2p_s: float, dp_s: float,
             opt_s: Sequence[float] | None = None) -> Timeline:
    """The iteration: ``chunks`` the compute of each model chunk, ``tp_s`` the communication
    inside each chunk's actions (one :class:`ChunkComm` per chunk, or the TP all-reduce seconds
    inside every F and again inside every backward), ``p2p_s`` one stage-to-stage transfer,
    ``dp_s`` one stage's DP synchronisation (before ``dp_overlap``), ``opt_s`` each stage's
    optimizer step (default: the measured ``optimizer_s``, else none)."""
    per_chunk = [ChunkComm(tp_s, tp_s) for _ in chunks] if isinstance(tp_s, int | float) else list(tp_s)
    acts, s2r = rank_actions(job)
    ranks = sorted(acts)
    index = {r: k for k, r in enumerate(ranks)}
    deps = action_dependencies(acts, len(s2r))

    def compute(a: Act) -> float:
        c = chunks[a.stage]
        return {"F": c.f, "B": c.b, "I": c.i, "W": c.w}[a.kind]

    def tp_comm(a: Act) -> float:
        c = per_chunk[a.stage]
        return c.tp_f if a.kind == "F" else c.tp_b if a.kind in ("B", "I") else 0.0

    def cp_comm(a: Act) -> float:
        c = per_chunk[a.stage]
        return c.cp_f if a.kind == "F" else c.cp_b if a.kind in ("B", "I") else 0.0

    def comm(a: Act) -> float:
        return tp_comm(a) + cp_comm(a)

    host = job.model.action_overhead_s  # measured host time around each action (0 for FLOP plans)
    cost: Callable[[Act], float] = lambda a: compute(a) + comm(a) + host  # noqa: E731
    timeline = simulate_lists([acts[r] for r in ranks], deps, cost, lambda a: index[s2r[a.stage]], comm=p2p_s)
    exposed = dp_s * (1.0 - job.parallel.dp_overlap)
    opt = list(opt_s if opt_s is not None else job.model.optimizer_s or [0.0] * len(timeline))  # after its DP sync
    ends = [tl[-1][1] if tl else 0.0 for tl in timeline]
    # the measured time between iterations (barrier, next batch) is idle for every stage: a C bubble
    t_iter = max(e + exposed + opt[k] for k, e in enumerate(ends)) + job.model.iteration_overhead_s
    gaps: list[Gap] = []
    for k, tl in enumerate(timeline):
        types = gap_types([a for _, _, a in tl])  # reads .kind only; torch's I counts as a backward
        edge = 0.0
        for i, (s, e, _a) in enumerate(tl):
            if s > edge + 1e-12:
                gaps.append(Gap(ranks[k], types[i], edge, s))
            edge = e
        tail_start = edge + exposed + opt[k]
        if t_iter > tail_start + 1e-12:
            gaps.append(Gap(ranks[k], types[-1], tail_start, t_iter))
    return Timeline(t_iter, timeline, gaps,
                    [sum(compute(a) for _, _, a in tl) + opt[k] for k, tl in enumerate(timeline)],
                    [sum(tp_comm(a) for _, _, a in tl) for tl in timeline],
                    [exposed] * len(timeline), [e for e in ends], [sum(cp_comm(a) for _, _, a in tl) for tl in timeline])
