"""Bubble plans of torch.distributed.pipelining schedules, derived from their own action lists.

Checked against two independent derivations: flowride's built-in schedules (same order, replayed
by their own code) and a longest-path computation over the actions' dependency graph (networkx),
for every schedule class torch has; no process group needed (the schedules are built with
stand-in stages)."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowride.errors import InputError
from flowride.pipeline import torch_compat as tc
from flowride.pipeline.schedules import bubbles, build_schedule, replay
from flowride.pipeline.torch_plan import UNIT_COST, implied_idle, plan

ALL = tc.available_schedules()


def chunks_of(name: str) -> int:
    return 1 if name in ("gpipe", "1f1b") else 2


def test_every_schedule_class_is_available_on_this_torch():
    assert set(ALL) == set(tc.SCHEDULE_CLASSES)
    tc.check()


def test_a_missing_private_name_is_named_with_the_torch_version(monkeypatch):
    import torch
    from torch.distributed.pipelining import stage as stage_mod

    monkeypatch.delattr(stage_mod._PipelineStageBase, "backward_weight_one_chunk")
    with pytest.raises(tc.TorchPipeliningChanged, match=r"_PipelineStageBase\.backward_weight_one_chunk") as e:
        tc.check()
    assert torch.__version__ in str(e.value)


def test_1f1b_last_rank_forwards_are_numbered_from_zero():
    """torch's Schedule1F1B.pipeline_order numbers the last rank's forwards from 1; the loop it
    runs walks micro-batches 0..m-1, which is what the plan must follow."""
    acts = tc.compute_actions(tc.dry_schedule("1f1b", 2, 4, 1))
    assert [str(a) for a in acts[1]] == ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]
    assert [str(a) for a in acts[0]] == ["0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"]


def test_dualpipev_overlapped_actions_are_flattened():
    acts = tc.compute_actions(tc.dry_schedule("dualpipev", 2, 4, 2))
    kinds = {a.kind for lst in acts.values() for a in lst}
    assert kinds == {"F", "B", "I", "W"}
    for lst in acts.values():  # every local (stage, micro-batch) is forwarded once and finished once
        fw = [(a.stage, a.mb) for a in lst if a.kind == "F"]
        done = [(a.stage, a.mb) for a in lst if a.kind in ("B", "W")]
        assert sorted(fw) == sorted(done) and len(set(fw)) == len(fw)


@pytest.mark.parametrize(("torch_name", "ours"), [("gpipe", "gpipe"), ("1f1b", "1f1b"), ("interleaved1f1b", "interleaved")])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (2, 8), (3, 6), (4, 8)])
def test_plan_equals_the_builtin_replay(torch_name, ours, p, m):
    """Same order as flowride's own schedule, same bubbles (position, type, length) as its replay."""
    v = chunks_of(torch_name)
    sched = tc.dry_schedule(torch_name, p, m, v)
    plans = plan(sched, iterations=1)
    instrs = build_schedule(ours, p, m, v)
    for r in range(p):
        assert [(a.kind, a.mb, a.stage) for a in plans[r].actions] == [(i.kind, i.mb, i.chunk) for i in instrs[r]]
    expect = {(b.rank, b.index): (b.kind, b.length) for b in bubbles(replay(instrs, p, v))}
    got = {(r, i): (rp.types[i], rp.implied[i]) for r, rp in plans.items() for i in rp.bubble_positions}
    assert got.keys() == expect.keys()
    for k in got:
        assert got[k][0] == expect[k][0] and got[k][1] == pytest.approx(expect[k][1])


def _longest_path_idle(sched) -> dict[int, list[float]]:
    """Idle before each action, from earliest starts computed as longest paths in the DAG of
    program order plus data dependencies (an independent derivation of the plan)."""
    acts = tc.compute_actions(sched)
    s2r = tc.stage_to_rank(sched)
    n = len(s2r)
    back = {(a.stage, a.mb): a for lst in acts.values() for a in lst if a.kind in ("B", "I")}
    g = nx.DiGraph()
    for lst in acts.values():
        for a, b in zip(lst, lst[1:], strict=False):
            g.add_edge(a, b)
        for a in lst:
            g.add_node(a)
            if a.kind == "F" and a.stage > 0:
                g.add_edge(tc.Act("F", a.stage - 1, a.mb), a)
            if a.kind in ("B", "I"):
                g.add_edge(tc.Act("F", a.stage, a.mb), a)
                if a.stage < n - 1:
                    g.add_edge(back[(a.stage + 1, a.mb)], a)
            if a.kind == "W":
                g.add_edge(tc.Act("I", a.stage, a.mb), a)
    start: dict = {}
    for a in nx.topological_sort(g):
        start[a] = max((start[u] + UNIT_COST[u.kind] for u in g.predecessors(a)), default=0.0)
    end = {a: start[a] + UNIT_COST[a.kind] for a in start}
    makespan = max(end.values())
    out = {}
    for r, lst in acts.items():
        edge, gaps = 0.0, []
        for a in lst:
            gaps.append(start[a] - edge)
            edge = end[a]
        gaps.append(makespan - edge)
        out[r] = gaps
    return out


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (2, 6), (3, 6), (4, 8)])
def test_plan_matches_the_dependency_graph(name, p, m):
    sched = tc.dry_schedule(name, p, m, chunks_of(name))
    oracle = _longest_path_idle(sched)
    plans = plan(sched, iterations=1)
    for r, rp in plans.items():
        assert rp.implied == pytest.approx(oracle[r]), f"rank {r}"
        assert len(rp.types) == len(rp.actions) + 1 and rp.types[0] == "A" and rp.types[-1] == "C"


def test_steady_state_moves_the_wait_for_the_last_stage_into_a():
    """Without a barrier, the last GPipe stage waits for stage 0's drain at the start of its next
    iteration (A), not at the end of this one (C)."""
    sched = tc.dry_schedule("gpipe", 2, 4, 1)
    one, steady = plan(sched, iterations=1), plan(sched, iterations=2)
    assert one[1].bubble_positions == [0, 8] and one[1].implied[0] == 1.0 and one[1].implied[8] == 2.0
    assert steady[1].bubble_positions == [0] and steady[1].implied[0] == 3.0
    assert steady[0].bubble_positions == one[0].bubble_positions == [4]


def test_zero_bubble_v_has_no_steady_state_bubble_with_unit_costs():
    plans = plan(tc.dry_schedule("zbv", 2, 4, 2), iterations=2)
    assert all(rp.bubble_positions == [] for rp in plans.values())


@given(p=st.integers(2, 4), extra=st.integers(0, 6), name=st.sampled_from(["gpipe", "1f1b"]))
def test_plan_conserves_time(p, extra, name):
    """Every rank is busy or idle for the whole iteration: busy + implied idle = makespan."""
    sched = tc.dry_schedule(name, p, p + extra, 1)
    plans = plan(sched, iterations=1)
    spans = {r: sum(UNIT_COST[a.kind] for a in rp.actions) + sum(rp.implied) for r, rp in plans.items()}
    assert max(spans.values()) == pytest.approx(min(spans.values()))


def test_torch_refusals_become_input_errors():
    with pytest.raises(InputError, match="DualPipeV"):
        tc.dry_schedule("dualpipev", 2, 2, 2)
    with pytest.raises(InputError, match="--chunks"):
        tc.dry_schedule("zbv", 2, 4, 3)
    with pytest.raises(InputError, match="--chunks"):
        tc.dry_schedule("1f1b", 2, 4, 2)
    with pytest.raises(InputError, match="unknown torch schedule"):
        tc.schedule_class("zb-h1")


def test_implied_idle_reports_a_deadlock():
    a = tc.Act
    with pytest.raises(AssertionError, match="deadlock"):
        # rank 0 wants the gradient before it sent the activation
        implied_idle({0: [a("B", 0, 0), a("F", 0, 0)], 1: [a("F", 1, 0), a("B", 1, 0)]}, {0: 0, 1: 1}, 2)
