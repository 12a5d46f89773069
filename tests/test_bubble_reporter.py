"""The bubble reporter (online prediction, events, on/off) and the paired overhead statistics."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowride.harvest.stats import paired_overhead, pairs
from flowride.pipeline.config import TrainConfig, onoff_blocks
from flowride.pipeline.events import BubbleSubscriber
from flowride.pipeline.reporter import BubbleReporter, GapPredictor


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def one_iteration(rep: BubbleReporter, clock: FakeClock, waits: list[tuple[str, float]], it: int) -> None:
    rep.begin_iteration(it)
    for label, length in waits:
        clock.advance(0.010)  # computing
        with rep.waiting(label, "B"):
            clock.advance(length)
    rep.end_iteration()


def test_learns_each_wait_and_announces_its_end_from_the_second_iteration():
    sub = BubbleSubscriber()
    clock = FakeClock()
    rep = BubbleReporter(1, port=sub.port, clock=clock, min_bubble_s=0.002)
    try:
        one_iteration(rep, clock, [("recv", 0.100), ("recv", 0.300), ("tiny", 0.001)], 0)
        assert [e for e in sub.drain() if e.kind == "bubble"] == []  # nothing learned yet: nothing announced
        one_iteration(rep, clock, [("recv", 0.110), ("recv", 0.300), ("tiny", 0.001)], 1)
        evs = sub.drain()
    finally:
        rep.close()
        sub.close()
    bubbles = [e for e in evs if e.kind == "bubble"]
    # "recv#0" and "recv#1" are different waits (ordinal per label); the 1 ms one is below min_bubble_s.
    # Until the pace-scaled prediction has shown it does better (three iterations), the plain median rules
    assert [round(e.predicted_end - e.start, 6) for e in bubbles] == [0.1, 0.3]
    assert all(e.stage == 1 and e.type == "B" and e.iteration == 1 for e in bubbles)
    assert [e.kind for e in evs] == ["bubble", "busy", "bubble", "busy"]
    errs = rep.prediction_errors()
    assert errs == pytest.approx([0.01 / 0.11, 0.0])
    # lengths are kept at the typical pace; the last iteration, whose length is not known yet, counts as typical
    assert rep.profile() == pytest.approx({"recv#0": 0.105, "recv#1": 0.3, "tiny#0": 0.001})


def test_predictions_follow_a_pipeline_whose_pace_jitters_20pct():
    """A replayed stream: every iteration of a fixed pattern (compute, then waits of 40-300 ms)
    runs at its own pace, drawn within +-20% of the typical one. Lengths normalized by the pace
    read off the iteration, times the current pace, stay within 15% (one length per wait, the
    old way, misses by the jitter itself)."""
    rng = random.Random(7)
    pattern = [("F", 0.030), ("w", 0.040), ("F", 0.030), ("w", 0.120), ("B", 0.060), ("w", 0.300), ("B", 0.060), ("w", 0.080)]
    clock = FakeClock()
    rep = BubbleReporter(1, clock=clock, window=5)
    naive: list[float] = []
    hist: dict[int, list[float]] = {}
    for it in range(80):
        pace = rng.uniform(0.8, 1.2)
        rep.begin_iteration(it)
        for k, (what, secs) in enumerate(pattern):
            if what != "w":
                clock.advance(secs * pace)
                continue
            length = secs * pace
            h = hist.setdefault(k, [])
            if len(h) >= 2:
                naive.append(abs(float(np.median(h[-5:])) - length) / length)
            h.append(length)
            with rep.waiting("recv", "B"):
                clock.advance(length)
        rep.end_iteration()
    errs = rep.prediction_errors()
    assert len(errs) > 200
    assert float(np.median(errs)) < 0.05 and float(np.percentile(errs, 90)) < 0.15
    assert float(np.median(naive)) > 0.08  # what one length per wait gets: the jitter's own size
    # every key found the pace-scaled prediction the better one
    assert all(rep.predictor._medians(k)[3] for k in rep.predictor.seen)


def test_waits_that_do_not_follow_the_pace_keep_the_plain_median():
    """A wait whose length is noise of its own (its neighbour's, not the iteration's pace): the
    pace-scaled prediction does no better, so the plain median stays in use."""
    rng = random.Random(3)
    clock = FakeClock()
    rep = BubbleReporter(1, clock=clock, window=5)
    for it in range(60):
        pace = rng.uniform(0.8, 1.2)
        rep.begin_iteration(it)
        clock.advance(0.050 * pace)
        with rep.waiting("recv", "B"):
            clock.advance(0.100 * rng.uniform(0.9, 1.1))  # not scaled by this iteration's pace
        clock.advance(0.200 * pace)
        rep.end_iteration()
    assert not rep.predictor._medians("recv#0")[3]
    assert float(np.median(rep.prediction_errors())) < 0.08  # the wait's own +-10% noise, no worse


def test_disabled_reporter_measures_but_announces_nothing():
    sub = BubbleSubscriber()
    clock = FakeClock()
    rep = BubbleReporter(0, port=sub.port, clock=clock)
    try:
        for it in range(3):
            rep.enabled = it != 2
            one_iteration(rep, clock, [("w", 0.05)], it)
            n = len([e for e in sub.drain() if e.kind == "bubble"])
            assert n == (1 if it == 1 else 0)
        rep.control("off")
        assert [e.kind for e in sub.drain()] == ["off"]
    finally:
        rep.close()
        sub.close()
    assert len(rep.waits) == 3


def test_a_saved_profile_predicts_the_first_iteration_and_until_overrides():
    sub = BubbleSubscriber()
    clock = FakeClock()
    rep = BubbleReporter(0, port=sub.port, clock=clock, profile={"w#0": 0.2}, warmup_iters=0)
    try:
        one_iteration(rep, clock, [("w", 0.2)], 0)
        rep.begin_iteration(1)
        rep.idle("known", until=clock() + 0.5)  # the loop knows when its wait ends
        clock.advance(0.5)
        rep.busy()
        evs = [e for e in sub.drain() if e.kind == "bubble"]
    finally:
        rep.close()
        sub.close()
    assert [round(e.predicted_end - e.start, 6) for e in evs] == [0.2, 0.5]


def test_positional_keys_without_labels_and_idle_closes_an_open_wait():
    clock = FakeClock()
    rep = BubbleReporter(0, clock=clock)
    rep.begin_iteration(0)
    rep.idle()
    clock.advance(0.01)
    rep.idle()  # a new wait closes the open one
    clock.advance(0.02)
    rep.end_iteration()
    assert [(w.key, round(w.seconds, 6)) for w in rep.waits] == [("#0", 0.01), ("#1", 0.02)]


@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=30), st.integers(1, 9))
def test_predictor_is_the_median_of_the_last_window(values, window):
    g = GapPredictor(window)
    for v in values:
        g.observe("k", v)
    assert g.predict("k") == pytest.approx(float(np.median(values[-window:])))
    assert g.predict("other") is None


@pytest.mark.parametrize("mode", ["auto", "pace", "plain"])
def test_bulk_learning_is_exactly_learning_one_wait_at_a_time(mode):
    """observe_columns (the torch observer's shorter pass: the same keys every iteration, windows
    full) learns exactly what observe_iteration learns from the same waits, through a stretch
    with scoring off (the reporter disabled) too."""
    rng = random.Random(11)
    keys = [f"{g}#0" for g in range(9)]
    bulk, one = GapPredictor(5, mode=mode), GapPredictor(5, mode=mode)
    for it in range(60):
        pace = rng.uniform(0.8, 1.2)
        starts, ends, t = [], [], 0.0
        for _ in keys:
            t += rng.uniform(0.0, 0.004) * pace
            starts.append(t)
            t += rng.uniform(0.0, 0.02) * pace
            ends.append(t)
        score = not 20 <= it < 25
        one.observe_iteration([(k, e - s, s) for k, s, e in zip(keys, starts, ends, strict=True)], t + 0.01, score)
        bulk.observe_columns(keys, starts, ends, 0.0, t + 0.01, score)
        assert bulk.plan(keys, 0.004) == one.plan(list(keys), 0.004)
        assert [bulk.predict(k, 0.01) for k in keys] == [one.predict(k, 0.01) for k in keys]
    assert bulk._bulk[2]  # it did take the shorter pass
    assert bulk.medians() == one.medians()


def test_waits_booked_in_columns_and_one_at_a_time_keep_their_order():
    clock = FakeClock()
    rep = BubbleReporter(0, clock=clock)
    for it in range(3):
        rep.begin_iteration(it)
        t0 = rep.iter_start
        rep.book_columns(["0#0", "1#0"], ["A", "S"], [t0, t0 + 0.01], [t0 + 0.005, t0 + 0.02], [None, None], [False, False])
        clock.advance(0.03)
        with rep.waiting("tail"):
            clock.advance(0.004)
        rep.end_iteration()
    assert [w.key for w in rep.waits] == ["0#0", "1#0", "tail#0"] * 3
    assert rep.profile() == pytest.approx({"0#0": 0.005, "1#0": 0.01, "tail#0": 0.004})


# ---------------------------------------------------------------------------- on/off blocks


@given(iters=st.integers(1, 60), block=st.integers(1, 5), seed=st.integers(0, 10**6), warm=st.integers(0, 3))
def test_onoff_blocks_are_balanced_pairs(iters, block, seed, warm):
    cfg = TrainConfig(iters=iters, paired_block=block, paired_seed=seed, warmup_iters=warm)
    flags = onoff_blocks(cfg)
    assert len(flags) == iters and all(flags[: min(warm, iters)])
    body = flags[min(warm, iters):]
    full = len(body) // (2 * block)
    for k in range(full):
        chunk = body[k * 2 * block:(k + 1) * 2 * block]
        if k % cfg.paired_aa_every == cfg.paired_aa_every - 1:  # an A/A pair: training alone in both blocks
            assert chunk.count(False) == 2 * block
            continue
        assert chunk.count(True) == chunk.count(False) == block
        assert len(set(chunk[:block])) == 1 and len(set(chunk[block:])) == 1
    assert all(body[full * 2 * block:])  # the tail that fills no pair stays on
    assert onoff_blocks(cfg) == flags  # every rank computes the same list


def test_onoff_order_is_random_but_seeded():
    firsts = {tuple(onoff_blocks(TrainConfig(iters=42, paired_block=2, paired_seed=s))) for s in range(20)}
    assert len(firsts) > 10
    assert onoff_blocks(TrainConfig(iters=10)) is None


# ---------------------------------------------------------------------------- paired statistics


def synthetic_run(n_pairs: int, block: int, overhead: float, drift: float, noise: float, seed: int):
    """Iteration times of a paired run: a slow drift of the machine, noise, and ``overhead``
    on the harvesting iterations."""
    rng = random.Random(seed)
    times, flags = [], []
    t = 0
    for _ in range(n_pairs):
        first = rng.random() < 0.5
        for on in [first] * block + [not first] * block:
            base = 1.0 + drift * t / (n_pairs * 2 * block)
            times.append(base * (1 + (overhead if on else 0.0)) * (1 + rng.gauss(0, noise)))
            flags.append(on)
            t += 1
    return times, flags


def test_paired_overhead_recovers_a_known_effect_despite_drift():
    times, flags = synthetic_run(30, 2, overhead=0.02, drift=0.30, noise=0.005, seed=1)
    s = paired_overhead(times, flags, 2)
    assert s["pairs"] == 30
    lo, hi = s["ci95_pct"]
    assert lo <= 2.0 <= hi and hi - lo < 1.5
    # the unpaired figure sees the 30% drift as noise: a far wider interval
    ulo, uhi = s["unpaired_ci95_pct"]
    assert uhi - ulo > 3 * (hi - lo)


def test_paired_overhead_of_nothing_is_zero_within_its_interval():
    times, flags = synthetic_run(20, 1, overhead=0.0, drift=0.1, noise=0.01, seed=7)
    s = paired_overhead(times, flags, 1)
    assert s["ci95_pct"][0] <= 0.0 <= s["ci95_pct"][1]


def test_pairs_skip_chunks_that_are_not_one_block_of_each():
    assert pairs([1, 2, 3, 4], [True, False, True, True], 1) == [([1], [2])]
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_overhead([1.0, 1.0], [True, False], 1)
    with pytest.raises(ValueError):
        pairs([1.0], [True, False], 1)
