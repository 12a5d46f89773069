"""Pipeline schedules: completeness and deadlock freedom, replayed bubble fractions against the
textbook formulas, bubble typing, drawing, and input validation."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowride.errors import InputError
from flowride.pipeline.schedules import (
    SCHEDULES,
    Instr,
    bubbles,
    build_schedule,
    check_schedule,
    gap_types,
    render_grid,
    replay,
    theoretical_bubble_fraction,
)


def _cases() -> list[tuple[str, int, int, int]]:
    cases = []
    for name in ("gpipe", "1f1b"):
        for p in (1, 2, 3, 4):
            for m in sorted({p, 2 * p, 8}):
                cases.append((name, p, m, 1))
    for p in (2, 4):
        for v in (2, 3):
            for m in (p, 2 * p):
                cases.append(("interleaved", p, m, v))
    for p in (2, 4):
        for m in (4, 8):
            cases.append(("zbh1", p, m, 1))
    return cases


CASES = _cases()


@pytest.mark.parametrize(("name", "p", "m", "v"), CASES)
def test_schedule_is_complete_ordered_and_deadlock_free(name, p, m, v):
    sched = build_schedule(name, p, m, v)
    has_w = name == "zbh1"
    check_schedule(sched, p, m, v, has_w)
    assert len(sched) == p
    for r, lst in enumerate(sched):
        chunks = list(range(r, p * v, p))
        counts = Counter((i.kind, i.mb, i.chunk) for i in lst)
        for j in chunks:
            for mb in range(m):
                assert counts[("F", mb, j)] == 1
                assert counts[("B", mb, j)] == 1
                assert counts[("W", mb, j)] == (1 if has_w else 0)
        assert len(lst) == len(chunks) * m * (3 if has_w else 2)


@pytest.mark.parametrize(("name", "p", "m", "v"), [c for c in CASES if c[0] in ("gpipe", "1f1b")])
def test_gpipe_and_1f1b_bubble_is_textbook(name, p, m, v):
    expected = (p - 1) / (m + p - 1)
    rep = replay(build_schedule(name, p, m, v), p, v, cost_f=1.0, cost_b=1.0, cost_w=1.0)
    assert rep.bubble_fraction == pytest.approx(expected, abs=1e-12)
    assert rep.makespan == pytest.approx(3 * (m + p - 1))
    assert theoretical_bubble_fraction(name, p, m, v) == pytest.approx(expected)


@pytest.mark.parametrize(("name", "p", "m", "v"), [c for c in CASES if c[0] == "interleaved"])
def test_interleaved_bubble_shrinks_with_chunks(name, p, m, v):
    # Costs are per chunk: a chunk is 1/v of a stage.
    rep = replay(build_schedule(name, p, m, v), p, v, cost_f=1 / v, cost_b=1 / v, cost_w=1 / v)
    expected = (p - 1) / (v * m + p - 1)
    assert rep.bubble_fraction == pytest.approx(expected, abs=1e-12)
    assert theoretical_bubble_fraction(name, p, m, v) == pytest.approx(expected)
    assert expected < (p - 1) / (m + p - 1)


@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 4), (2, 8), (3, 5), (4, 4), (4, 8), (6, 12)])
def test_zbh1_beats_1f1b_at_same_memory(p, m):
    zb = theoretical_bubble_fraction("zbh1", p, m)
    one = theoretical_bubble_fraction("1f1b", p, m)
    assert zb < one
    # ZB-H1's bubble (p-1)(T_F + T_B - T_W) at F = B = W = 1: a third of 1F1B's idle time.
    assert zb == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)
    # Same peak memory as 1F1B: micro-batches whose activations are live (F done, W not yet)
    # never exceed p on any rank, which is 1F1B's peak (on rank 0).
    for name, release in (("zbh1", "W"), ("1f1b", "B")):
        peak = 0
        for lst in build_schedule(name, p, m):
            live = 0
            for ins in lst:
                live += 1 if ins.kind == "F" else -1 if ins.kind == release else 0
                peak = max(peak, live)
        assert peak == p


def test_zbh1_single_stage_has_no_bubble():
    assert theoretical_bubble_fraction("zbh1", 1, 3) == 0.0
    assert build_schedule("zbh1", 1, 2) == [
        [
            Instr("F", 0, 0),
            Instr("B", 0, 0),
            Instr("W", 0, 0),
            Instr("F", 1, 0),
            Instr("B", 1, 0),
            Instr("W", 1, 0),
        ]
    ]


def test_1f1b_order_matches_megatron():
    sched = build_schedule("1f1b", 4, 8)
    rank0 = [i.label for i in sched[0]]
    assert rank0[:5] == ["F0", "F1", "F2", "F3", "B0"]  # p - 1 = 3 warm-up forwards
    assert rank0[-5:] == ["F7", "B4", "B5", "B6", "B7"]  # last steady pair, then 3 drained B's
    assert [i.label for i in sched[3]][:4] == ["F0", "B0", "F1", "B1"]  # last stage: no warm-up


def test_interleaved_warmup_count_and_order():
    p, m, v = 4, 8, 2
    sched = build_schedule("interleaved", p, m, v)
    for r, lst in enumerate(sched):
        first_b = next(i for i, ins in enumerate(lst) if ins.kind == "B")
        warmup = min((p - r - 1) * 2 + (v - 1) * p, m * v)
        assert [i.kind for i in lst[:warmup]] == ["F"] * warmup
        # steady state starts with a forward, then the first backward
        assert first_b == (warmup + 1 if warmup < m * v else warmup)
    # Forwards sweep a group of p micro-batches through chunk 0, then the same group through chunk 1.
    fw = [(i.mb, i.chunk) for i in sched[1] if i.kind == "F"][:8]
    assert fw == [(0, 1), (1, 1), (2, 1), (3, 1), (0, 5), (1, 5), (2, 5), (3, 5)]
    # The first backward on every rank is of the last chunk it holds.
    assert all(
        next(i for i in lst if i.kind == "B").chunk == r + (v - 1) * p
        for r, lst in enumerate(sched)
    )


def test_replay_adds_comm_on_cross_rank_dependencies():
    rep = replay(build_schedule("gpipe", 2, 1), 2, 1, cost_f=1.0, cost_b=1.0, cost_w=1.0, comm=0.5)
    # F0@r0 [0,1]; F0@r1 [1.5,2.5]; B0@r1 [2.5,4.5]; B0@r0 [5,7]
    assert [(s, e) for s, e, _ in rep.timeline[0]] == [(0.0, 1.0), (5.0, 7.0)]
    assert [(s, e) for s, e, _ in rep.timeline[1]] == [(1.5, 2.5), (2.5, 4.5)]
    assert rep.makespan == 7.0
    assert rep.idle_fraction == pytest.approx([4 / 7, 4 / 7])


def test_replay_charges_full_backward_without_w_and_split_with_w():
    one = replay(build_schedule("1f1b", 1, 1), 1, 1, cost_f=1.0, cost_b=2.0, cost_w=3.0)
    assert [(s, e, i.kind) for s, e, i in one.timeline[0]] == [(0.0, 1.0, "F"), (1.0, 6.0, "B")]
    zb = replay(build_schedule("zbh1", 1, 1), 1, 1, cost_f=1.0, cost_b=2.0, cost_w=3.0)
    assert [(s, e, i.kind) for s, e, i in zb.timeline[0]] == [
        (0.0, 1.0, "F"),
        (1.0, 3.0, "B"),
        (3.0, 6.0, "W"),
    ]


def test_gap_types_1f1b_p4_m8():
    p, m = 4, 8
    sched = build_schedule("1f1b", p, m)
    for lst in sched:
        types = gap_types(lst)
        assert len(types) == len(lst) + 1
        assert types[0] == "A" and types[-1] == "C"
        first_b = next(i for i, ins in enumerate(lst) if ins.kind == "B")
        assert types[first_b] == "B" and types.count("B") == 1
        assert lst[first_b - 1].kind == "F"  # the B-gap follows the last warm-up forward
    last, first = gap_types(sched[3]), gap_types(sched[0])
    # After rank 0's last forward come B4 (last steady pair) and the drain B5, B6, B7: D gaps.
    last_f = max(i for i, ins in enumerate(sched[0]) if ins.kind == "F")
    assert first[last_f + 1 : -1] == ["D"] * p
    assert set(first[1 : last_f + 1]) <= {"S", "B"}
    assert last[1] == "B" and last[-2] == "D"

    # With times: the last stage waits p - 1 forwards at the start (A) and idles at the end (C);
    # rank 0 waits for gradients in its drain (D) and never before its first forward.
    found = bubbles(replay(sched, p))
    by_rank = {r: [(b.kind, b.length) for b in found if b.rank == r] for r in range(p)}
    assert by_rank[3][0] == ("A", pytest.approx(3.0))
    assert by_rank[3][-1][0] == "C"
    assert [k for k, _ in by_rank[0]] == ["B", "D", "D", "D"]
    assert by_rank[0][0][1] == pytest.approx(2 * (p - 1))
    total = sum(b.length for b in found)
    assert total / (p * replay(sched, p).makespan) == pytest.approx((p - 1) / (m + p - 1))


def test_gap_types_gpipe_and_zbh1():
    g = build_schedule("gpipe", 3, 3)[0]
    assert gap_types(g) == ["A", "S", "S", "B", "D", "D", "C"]
    zb = build_schedule("zbh1", 4, 8)[3]
    types = gap_types(zb)
    last_f = max(i for i, ins in enumerate(zb) if ins.kind == "F")
    assert all(t == "D" for t in types[last_f + 1 : -1])
    assert sum(1 for i in zb[last_f + 1 :] if i.kind == "W") == 4  # deferred W's fill the drain


@pytest.mark.parametrize(
    ("name", "p", "m", "v"),
    [("1f1b", 4, 8, 1), ("gpipe", 3, 3, 1), ("zbh1", 4, 8, 1), ("interleaved", 2, 4, 2)],
)
def test_render_grid(name, p, m, v):
    sched = build_schedule(name, p, m, v)
    text = render_grid(sched, p, m, v)
    lines = text.splitlines()
    assert len(lines) == p + 1  # header of time slots + one row per stage
    rows = [ln for ln in lines if ln.startswith("S")]
    assert len(rows) == p
    slots = lines[0].split()
    assert slots == [str(t) for t in range(len(slots))]
    for r, row in enumerate(rows):
        cells = row.split()[1:]
        assert len(cells) == len(slots)
        for ins in sched[r]:
            label = f"{ins.kind}{ins.mb}" + (f".{ins.chunk // p}" if v > 1 else "")
            assert label in cells
        # busy cells = unit-cost work of the rank
        busy = sum(1 for c in cells if c != ".")
        assert busy == round(replay(sched, p, v).busy(r))


def test_render_grid_1f1b_first_row():
    rows = render_grid(build_schedule("1f1b", 4, 8), 4, 8).splitlines()
    assert rows[1].split()[:12] == [
        "S0",
        "F0",
        "F1",
        "F2",
        "F3",
        ".",
        ".",
        ".",
        ".",
        ".",
        ".",
        "B0",
    ]
    assert rows[4].split()[:7] == ["S3", ".", ".", ".", "F0", "B0", "B0"]


def test_check_schedule_rejects_broken_schedules():
    good = build_schedule("1f1b", 2, 2)
    check_schedule(good, 2, 2, 1, False)
    # Deadlock: rank 0 waits for B0 from rank 1 before sending F1, rank 1 waits for F1.
    dead = [
        [Instr("F", 0, 0), Instr("B", 0, 0), Instr("F", 1, 0), Instr("B", 1, 0)],
        [Instr("F", 0, 1), Instr("F", 1, 1), Instr("B", 0, 1), Instr("B", 1, 1)],
    ]
    with pytest.raises(AssertionError, match="deadlock"):
        check_schedule(dead, 2, 2, 1, False)
    missing = [good[0][:-1], good[1]]
    with pytest.raises(AssertionError, match="missing"):
        check_schedule(missing, 2, 2, 1, False)
    dup = [good[0] + [good[0][0]], good[1]]
    with pytest.raises(AssertionError, match="duplicate"):
        check_schedule(dup, 2, 2, 1, False)
    wrong_rank = [good[1], good[0]]
    with pytest.raises(AssertionError):
        check_schedule(wrong_rank, 2, 2, 1, False)
    backwards = [[Instr("B", 0, 0), Instr("F", 0, 0)]]
    with pytest.raises(AssertionError, match="before"):
        check_schedule(backwards, 1, 1, 1, False)
    w_first = [[Instr("F", 0, 0), Instr("W", 0, 0), Instr("B", 0, 0)]]
    with pytest.raises(AssertionError, match="before"):
        check_schedule(w_first, 1, 1, 1, True)
    with pytest.raises(AssertionError, match="missing"):  # has_w but no W passes
        check_schedule(good, 2, 2, 1, True)
    with pytest.raises(AssertionError):
        check_schedule(good[:1], 2, 2, 1, False)
    with pytest.raises(AssertionError, match="deadlock"):
        replay(dead, 2, 1)


@pytest.mark.parametrize(
    ("name", "p", "m", "v", "field", "text"),
    [
        ("pipedream", 2, 4, 1, "schedule", "unknown schedule"),
        ("1f1b", 0, 4, 1, "stages", "stage"),
        ("gpipe", 2, 0, 1, "microbatches", "micro-batch"),
        ("1f1b", 4, 3, 1, "microbatches", "m >= p"),
        ("zbh1", 4, 2, 1, "microbatches", "m >= p"),
        ("interleaved", 4, 2, 2, "microbatches", "m >= p"),
        ("interleaved", 4, 6, 2, "microbatches", "multiple"),
        ("interleaved", 2, 4, 1, "chunks", "at least 2"),
        ("gpipe", 2, 4, 2, "chunks", "v=1"),
        ("1f1b", 2, 4, 2, "chunks", "v=1"),
        ("zbh1", 2, 4, 3, "chunks", "v=1"),
        ("1f1b", 2.0, 4, 1, "stages", "whole number"),
    ],
)
def test_bad_inputs_raise_input_error(name, p, m, v, field, text):
    for fn in (build_schedule, theoretical_bubble_fraction):
        with pytest.raises(InputError) as exc:
            fn(name, p, m, v)
        assert exc.value.field == field
        assert text in str(exc.value)
        assert exc.value.fix


def test_gpipe_allows_fewer_microbatches_than_stages():
    sched = build_schedule("gpipe", 4, 2)
    check_schedule(sched, 4, 2, 1, False)
    assert replay(sched, 4).bubble_fraction == pytest.approx(3 / 5)


def test_negative_cost_is_input_error():
    with pytest.raises(InputError) as exc:
        replay(build_schedule("1f1b", 2, 2), 2, 1, cost_f=-1.0)
    assert exc.value.field == "cost_f"


@st.composite
def valid_schedules(draw):
    name = draw(st.sampled_from(SCHEDULES))
    p = draw(st.integers(1, 5))
    if name == "interleaved":
        p = max(p, 2)
        v = draw(st.integers(2, 3))
        m = p * draw(st.integers(1, 3))
    else:
        v = 1
        m = draw(st.integers(1 if name == "gpipe" else p, 10))
    return name, p, m, v


costs = st.floats(0.0, 5.0, allow_nan=False, allow_infinity=False)


@given(valid_schedules(), costs, costs, costs, st.floats(0.0, 2.0))
def test_property_valid_schedule_replays_consistently(case, cf, cb, cw, comm):
    name, p, m, v = case
    sched = build_schedule(name, p, m, v)
    has_w = name == "zbh1"
    check_schedule(sched, p, m, v, has_w)
    rep = replay(sched, p, v, cost_f=cf, cost_b=cb, cost_w=cw, comm=comm)
    cost = {"F": cf, "B": cb if has_w else cb + cw, "W": cw}
    end = {}
    for r, timeline in enumerate(rep.timeline):
        assert [i for _, _, i in timeline] == sched[r]  # executed strictly in list order
        assert rep.busy(r) == pytest.approx(sum(cost[i.kind] for i in sched[r]))
        prev = 0.0
        for s, e, ins in timeline:
            assert s >= prev - 1e-9 and e == pytest.approx(s + cost[ins.kind])
            prev = e
            end[ins] = (e, r)
        assert 0.0 <= rep.idle_fraction[r] <= 1.0
    n = p * v
    for r, timeline in enumerate(rep.timeline):
        for s, _, ins in timeline:
            deps = []
            if ins.kind == "F" and ins.chunk > 0:
                deps.append(Instr("F", ins.mb, ins.chunk - 1))
            if ins.kind == "B":
                deps.append(Instr("F", ins.mb, ins.chunk))
                if ins.chunk < n - 1:
                    deps.append(Instr("B", ins.mb, ins.chunk + 1))
            if ins.kind == "W":
                deps.append(Instr("B", ins.mb, ins.chunk))
            for d in deps:
                e, dr = end[d]
                assert s >= e + (comm if dr != r else 0.0) - 1e-9
    assert rep.bubble_fraction == pytest.approx(sum(rep.idle_fraction) / p)
    typed = bubbles(rep)
    assert all(g.kind in "ABSDC" and g.length > 0 for g in typed)
