"""The budget guard on synthetic timings (issue #25): a known overhead driven under the budget,
relaxing when well under, and the off blocks it keeps for measuring."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowride.harvest.guard import LADDER, BudgetGuard


def _drive(guard: BudgetGuard, overhead_at_level, iters: int, seed: int = 0, noise: float = 0.005, base: float = 0.1) -> list[float]:
    """Feed ``iters`` iterations whose harvested time is ``base * (1 + overhead_at_level(level))``
    with multiplicative noise; returns the true overhead (%) of each harvested iteration."""
    rng = random.Random(seed)
    seen = []
    for it in range(iters):
        on = not guard.measuring_off(it) and guard.setting.harvest
        over = overhead_at_level(guard.level) if on else 0.0
        guard.observe(it, base * (1 + over / 100) * (1 + rng.gauss(0, noise)), on)
        if on:
            seen.append(over)
    return seen


def test_a_known_5pct_overhead_is_driven_under_a_2pct_budget():
    # each rung of the ladder takes some overhead away: 5, 3.5, 1.2, 0.6, 0.3, 0
    cost = [5.0, 3.5, 1.2, 0.6, 0.3, 0.0]
    g = BudgetGuard(budget_pct=2.0)
    seen = _drive(g, lambda lv: cost[lv], 800)
    assert g.actions and g.actions[0]["action"] == "back off"
    assert cost[g.level] <= 2.0  # settled on a rung within the budget
    tail = seen[-200:]
    assert sum(tail) / len(tail) <= 2.0
    rep = g.report()
    assert rep["settled_overhead_pct"] is not None and rep["settled_ci95_pct"][1] <= 2.0 + 1.5


def test_it_relaxes_when_well_under_and_stays_put_when_within():
    g = BudgetGuard(budget_pct=2.0, level=3)
    _drive(g, lambda lv: 0.0, 600)
    assert g.level == 0 and all(a["action"] == "relax" for a in g.actions)
    g2 = BudgetGuard(budget_pct=2.0)
    _drive(g2, lambda lv: 1.2, 600, noise=0.002)
    assert g2.level <= 1  # 1.2% is within a 2% budget: no climb to the top


def test_one_block_in_every_eight_is_off():
    g = BudgetGuard(budget_pct=2.0, block=2, every=8)
    offs = [it for it in range(64) if g.measuring_off(it)]
    assert offs == [14, 15, 30, 31, 46, 47, 62, 63]


def test_external_off_blocks_pair_too():
    """A paired benchmark's own on/off blocks (control events) give pairs as well."""
    g = BudgetGuard(budget_pct=2.0, every=1000, skip_first=0)
    for it in range(40):
        on = (it // 2) % 2 == 0
        g.observe(it, 0.105 if on else 0.1, on)
    assert len(g.all_pairs) == 10
    assert all(abs(p.overhead_pct - 5.0) < 1e-9 for p in g.all_pairs)


def test_bad_budget_is_refused():
    with pytest.raises(ValueError):
        BudgetGuard(budget_pct=float("nan"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 1.0), st.booleans()), max_size=200), st.floats(0.0, 10.0))
def test_the_level_stays_on_the_ladder_and_every_action_is_recorded(steps, budget):
    g = BudgetGuard(budget_pct=budget)
    for it, (s, on) in enumerate(steps):
        g.observe(it, s, on)
        assert 0 <= g.level < len(LADDER)
    ups = sum(a["action"] == "back off" for a in g.actions)
    downs = sum(a["action"] in ("relax", "probe") for a in g.actions)
    assert ups - downs == g.level


def test_the_guard_runs_end_to_end_on_the_small_preset(tmp_path):
    """``flowride train --side-tasks``: stage 0's iteration times reach the manager, the guard
    pairs its own off iterations, and the report and table say what it did."""
    import json

    from clirun import cli

    rep = tmp_path / "r.json"
    r = cli("train", "--stages", "2", "--microbatches", "4", "--schedule", "1f1b", "--engine", "builtin", "--model", "small",
            "--iters", "24", "--side-tasks", "pagerank", "--budget", "2", "--paired-block", "0",
            "--run-dir", tmp_path / "rd", "--report", rep, timeout=600)
    assert r.code == 0, r.err[-3000:]
    g = json.loads(rep.read_text())["guard"]
    assert g["budget_pct"] == 2.0 and g["every"] == 8
    assert g["pairs"] >= 2  # iterations 7 and 15 ran training alone and were paired
    assert 0 <= g["level"] < 6
    ups = sum(a["action"] == "back off" for a in g["actions"])
    assert ups - (len(g["actions"]) - ups) == g["level"]  # every move of the rung is a recorded action
    for a in g["actions"]:
        assert a["action"] in ("back off", "relax", "probe") and "setting" in a
    assert "budget guard: rung" in r.out
    record = json.loads((tmp_path / "rd" / "harvest.json").read_text())
    assert record["guard"]["pairs"] == g["pairs"]


def test_an_efficiency_that_cannot_be_computed_says_why():
    from flowride.harvest.session import _efficiency

    side = {"1": {"name": "cnn", "units": 100.0, "dedicated_throughput": 0.0}}
    e, why = _efficiency(side, 0.0, 5.0, 0)
    assert e is None and "profile-task" in why
    e, why = _efficiency({}, 0.0, 0.0, 3)
    assert e is None and "no bubble time" in why
    e, why = _efficiency({}, 0.0, 5.0, 52)
    assert e == 0.0 and "52 side step(s) ran outside" in why
    ok = {"1": {"name": "cnn", "units": 100.0, "dedicated_throughput": 50.0}}
    assert _efficiency(ok, 2.0, 4.0, 0) == (0.5, None)
