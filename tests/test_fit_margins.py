"""The fit rule on a noisy node: the margin taken from how bubbles really ended, and the reason a
bubble got no side step (issue #32)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from flowride.harvest.fitting import BubbleMargins, candidates, fit_time, why_none
from flowride.pipeline.events import BubbleEvent


def _ev(start: float, length: float, typ: str = "B") -> BubbleEvent:
    return BubbleEvent("bubble", 0, typ, start, start + length, 8 << 30, 3)


def test_a_quiet_node_keeps_freerides_rule():
    m = BubbleMargins()
    for k in range(30):
        m.observe("B", k, k + 0.2, k + 0.2)  # every bubble ended as predicted
    assert m.shrink("B") == 1.0


def test_a_noisy_node_fits_against_the_low_tail_of_its_type_only():
    rng = random.Random(1)
    m = BubbleMargins()
    for k in range(50):
        m.observe("B", k, k + 0.2, k + 0.2 * rng.uniform(0.8, 1.2))  # +-20%
        m.observe("D", k, k + 0.2, k + 0.2)
    assert 0.8 <= m.shrink("B") < 0.9  # 9 in 10 bubbles lasted at least that share
    assert m.shrink("D") == 1.0  # each type its own
    # the fit factor widens by the share: a 50 ms step needs 1.2 / share x 51 ms left
    ev = _ev(0.0, 0.2, "B")
    t = T(need=0.050)
    left_ok = fit_time(0.050, 1.2 / m.shrink("B")) + 0.001
    assert candidates([t], 0, _ev(0.0, left_ok, "B"), 0.0, 1.2 / m.shrink("B")) == [t]
    assert candidates([t], 0, _ev(0.0, fit_time(0.050, 1.2) + 0.001, "B"), 0.0, 1.2 / m.shrink("B")) == []
    assert ev.predicted_end == 0.2
    rep = m.report()
    assert rep["B"]["bubbles"] == 50 and rep["B"]["fit_share"] == m.shrink("B")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.0, 5.0), min_size=0, max_size=80))
def test_the_margin_never_stretches_a_bubble_nor_falls_below_the_floor(ratios):
    m = BubbleMargins(floor=0.5)
    for k, r in enumerate(ratios):
        m.observe("A", float(k), k + 1.0, k + r)
    assert 0.5 <= m.shrink("A") <= 1.0


@dataclass
class T:
    need: float = 0.05
    ready: bool = True
    finished: bool = False
    running: bool = False
    saving: bool = False
    probing: bool = False
    home: int | None = None
    peak_bytes: int = 0
    busy_s: float = 0.0
    rec: object = field(default_factory=lambda: type("R", (), {"priority": 0, "id": 1})())

    def need_s(self, factor: float) -> float:
        return fit_time(self.need, factor)


def test_why_no_task_started_names_the_rule():
    ev = _ev(10.0, 0.040)
    tasks = [T(need=0.051)]
    assert candidates(tasks, 0, ev, 10.0, 1.2) == []
    why = why_none(tasks, 0, ev, 10.0, 1.2)
    assert "the shortest needs 61.2 ms" in why and "the bubble had 40.0 ms left" in why
    assert "was ready yet" in why_none([T(ready=False)], 0, ev, 10.0, 1.2)
    assert "finished" in why_none([T(finished=True)], 0, ev, 10.0, 1.2)
    assert "memory" in why_none([T(need=0.001, peak_bytes=16 << 30)], 0, ev, 10.0, 1.2)
    assert "no side task may run on this stage" in why_none([T(home=1)], 0, ev, 10.0, 1.2)
