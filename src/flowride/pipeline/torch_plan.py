"""Where a torch.distributed.pipelining schedule leaves each rank idle, derived from its actions.

A rank idles before a compute action when the action waits for a peer: a forward for the
previous stage's activations, a backward for the next stage's gradient. Counting the idle (None)
slots of ``pipeline_order`` does not say that reliably (GPipe's and 1F1B's orders carry none, and
DualPipeV overlaps F and B in one slot), so the plan runs the actions' data dependencies through
the same simulator as flowride's own schedules (:func:`flowride.pipeline.schedules.simulate_lists`)
with unit costs (F = I = W = 1, a full B = 2). The result, per rank and per gap (gap ``i`` lies
just before compute action ``i``, gap ``n`` after the last one), is the idle the schedule implies
and the gap's type (A/B/C/D/S, :func:`flowride.pipeline.schedules.gap_types`).

Steady state. torch's schedules put no barrier between iterations: a rank that finishes early
goes on to its optimizer and its next ``step()``, and waits there. The plan therefore simulates
two iterations back to back and reads the second, so the wait for the slower ranks to finish an
iteration shows up where it is really spent, in the next iteration's A gap.

How long a bubble really lasts is measured at run time (on CPU, two to ten times the unit-cost
theory: per-action overhead, transfers); the plan says where bubbles are and what kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowride.pipeline.schedules import gap_types, simulate_lists
from flowride.pipeline.torch_compat import Act

UNIT_COST = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}


@dataclass(frozen=True)
class RankPlan:
    """One rank's compute actions, the type of each gap and the unit-cost idle it implies."""

    rank: int
    actions: list[Act]
    types: list[str]  # len(actions) + 1
    implied: list[float]  # unit-cost idle of each gap (0.0: none implied)

    @property
    def bubble_positions(self) -> list[int]:
        return [i for i, idle in enumerate(self.implied) if idle > 1e-9]


def action_dependencies(actions: dict[int, list[Act]], num_stages: int) -> Callable[[Act], list[Act]]:
    """F needs the previous stage's F; a backward (B or I) needs its own F and the next stage's
    backward; W needs its own I."""
    backward_kind = {(a.stage, a.mb): a.kind for lst in actions.values() for a in lst if a.kind in ("B", "I")}

    def deps(a: Act) -> list[Act]:
        if a.kind == "F":
            return [Act("F", a.stage - 1, a.mb)] if a.stage > 0 else []
        if a.kind in ("B", "I"):
            out = [Act("F", a.stage, a.mb)]
            if a.stage < num_stages - 1:
                out.append(Act(backward_kind.get((a.stage + 1, a.mb), "B"), a.stage + 1, a.mb))
            return out
        return [Act("I", a.stage, a.mb)]

    return deps


def implied_idle(actions: dict[int, list[Act]], stage_rank: dict[int, int], num_stages: int,
                 iterations: int = 2, cost: dict[str, float] | None = None) -> dict[int, list[float]]:
    """Idle before each compute action (and after the last) of every rank in the last of
    ``iterations`` back-to-back iterations, with per-kind ``cost`` (unit costs by default).

    With ``iterations=1`` all ranks start together and the last gap runs to the makespan (an
    iteration that ends at a barrier); with 2 or more, the steady state of barrier-free iterations.
    Raises ``AssertionError`` if the actions deadlock.
    """
    cost = cost or UNIT_COST
    ranks = sorted(actions)
    index = {r: k for k, r in enumerate(ranks)}
    lists = [[(it, a) for it in range(iterations) for a in actions[r]] for r in ranks]
    deps = action_dependencies(actions, num_stages)
    try:
        timeline = simulate_lists(
            lists,
            lambda ia: [(ia[0], d) for d in deps(ia[1])],
            lambda ia: cost[ia[1].kind],
            lambda ia: index[stage_rank[ia[1].stage]],
        )
    except Exception as e:  # _Deadlock
        raise AssertionError(f"torch schedule actions deadlock: {e}") from None
    makespan = max((t[-1][1] for t in timeline if t), default=0.0)
    last = iterations - 1
    out: dict[int, list[float]] = {}
    for r, tl in zip(ranks, timeline, strict=True):
        mine = [(s, e) for s, e, (it, _a) in tl if it == last]
        prev_end = [e for s, e, (it, _a) in tl if it == last - 1]
        edge = prev_end[-1] if prev_end else 0.0
        gaps = []
        for s, e in mine:
            gaps.append(max(0.0, s - edge))
            edge = e
        gaps.append(max(0.0, makespan - edge) if iterations == 1 else 0.0)
        out[r] = gaps
    return out


def plan_actions(actions: dict[int, list[Act]], stage_rank: dict[int, int], num_stages: int,
                 iterations: int = 2) -> dict[int, RankPlan]:
    """The bubble plan of every rank from explicit per-rank compute actions."""
    idle = implied_idle(actions, stage_rank, num_stages, iterations)
    return {r: RankPlan(r, list(actions[r]), gap_types(actions[r]), idle[r]) for r in actions}


def plan(schedule: Any, iterations: int = 2) -> dict[int, RankPlan] | None:
    """The bubble plan of a torch schedule object (None when it publishes no action order)."""
    from flowride.pipeline import torch_compat as tc

    actions = tc.compute_actions(schedule)
    if actions is None:
        return None
    s2r = tc.stage_to_rank(schedule)
    return plan_actions(actions, s2r, len(s2r), iterations)
