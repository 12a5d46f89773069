"""The one-machine rehearsal: one real stage, the other stages timed stand-ins (issue #33).

Its bubbles must be the pipeline's: the schedule's closed-form shares with equal stages, and at
any times the shares and per-type lengths that the schedule implies (the plan), measured on the
real stage. Through the CLI it harvests the real stage's bubbles and trains it identically with
and without side work."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clirun import assert_clean_error, cli
from flowride.errors import InputError
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.rehearsal import (
    StageTimes,
    parse_stand_in,
    planned_bubbles,
    rehearsal_schedule,
)
from flowride.pipeline.schedules import theoretical_bubble_fraction
from flowride.pipeline.trainer import train

pytestmark = pytest.mark.timeout(300)


def test_stand_in_specs_parse_and_bad_ones_name_the_fix(tmp_path):
    assert parse_stand_in("same", 4) is None
    assert parse_stand_in("F=0.05,B=0.1", 3) == [StageTimes(0.05, 0.1, 0.0)] * 3
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"stages": [{"F": 0.01, "B": 0.02}, {"F": 0.02, "B": 0.04, "W": 0.01}]}))
    assert parse_stand_in(str(f), 2)[1] == StageTimes(0.02, 0.04, 0.01)
    for spec, needle in (("F=0.05,X=1", "unknown action kind"), ("F=-1,B=1", "not action times"),
                         ("F=0,B=0", "not both 0"), ("nosuchfile.json", "neither"), (str(f) + "x", "neither")):
        with pytest.raises(InputError) as e:
            parse_stand_in(spec, 2)
        assert needle in str(e.value) and e.value.field == "--stand-in"
    with pytest.raises(InputError, match="1 or 3 entries"):
        parse_stand_in(str(f), 3)
    with pytest.raises(InputError, match="--rehearse"):
        TrainConfig(stages=2, rehearse_stage=2).validate()
    with pytest.raises(InputError, match="without a rehearsal"):
        TrainConfig(stages=2, stand_in="F=0.1,B=0.2").validate()


@pytest.mark.parametrize("schedule,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbh1", 1),
                                             ("interleaved1f1b", 2), ("zbv", 2), ("dualpipev", 2)])
def test_every_rank_runs_each_of_its_chunks_passes_once(schedule, chunks):
    """Built-in schedules as built, torch's from their action orders (V shapes placed as torch does)."""
    cfg = TrainConfig(schedule=schedule, stages=4, microbatches=8, chunks=chunks)
    lists, owner = rehearsal_schedule(cfg)
    assert sorted(owner) == list(range(4 * chunks))
    for r, lst in enumerate(lists):
        for ins in lst:
            assert owner[ins.chunk] == r
        mine = [j for j in owner if owner[j] == r]
        assert sorted((i.chunk, i.mb) for i in lst if i.kind == "F") == sorted((j, mb) for j in mine for mb in range(8))
        assert sorted((i.chunk, i.mb) for i in lst if i.kind == "B") == sorted((j, mb) for j in mine for mb in range(8))


@settings(max_examples=25, deadline=None)
@given(schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]), p=st.integers(2, 6), extra=st.integers(0, 6),
       f=st.floats(0.01, 1.0), real=st.integers(0, 5))
def test_the_plan_at_equal_stages_is_the_closed_form_at_every_place(schedule, p, extra, f, real):
    """Equal stages (B = 2F): the real stage idles (p-1)/(m+p-1) (interleaved: (p-1)/(vm+p-1)),
    first, middle or last."""
    v = 2 if schedule == "interleaved" else 1
    m = p + extra
    cfg = TrainConfig(schedule=schedule, stages=p, microbatches=m, chunks=v)
    t = StageTimes(f / v, 2 * f / v)
    plan = planned_bubbles(cfg, real % p, t, [t] * p)
    assert plan["bubble_fraction"] == pytest.approx(theoretical_bubble_fraction(schedule, p, m, v), rel=1e-9)


@pytest.mark.parametrize("schedule,chunks,real", [("gpipe", 1, 0), ("1f1b", 1, 1), ("interleaved", 2, 3)])
def test_the_real_stage_idles_as_planned_and_as_the_closed_form(tmp_path, schedule, chunks, real):
    """CPU, 4 stages, 'same' stand-ins: the real stage's measured bubble share is the plan's (the
    schedule replayed at every stage's measured times) within 5 points, and so are its long
    bubbles by type (15%, or 5% of an iteration); where the stages came out equal (the real
    stage steady through the warm-up it was mirrored from), the share is the closed form within
    5 points."""
    cfg = TrainConfig(schedule=schedule, stages=4, microbatches=4, chunks=chunks, model="medium", iters=9, warmup_iters=3,
                      rehearse_stage=real, run_dir=str(tmp_path))
    rep = train(cfg).report()
    r = rep["rehearsal"]
    assert rep["bubble_fraction_measured"] == pytest.approx(r["planned_bubble_fraction"], abs=0.05), r
    for typ, planned in r["planned_by_type_s"].items():
        if planned > 0.2 * sum(r["planned_by_type_s"].values()):  # within 15%, or 5% of an iteration
            tol = max(0.15 * planned, 0.05 * rep["iteration_time_s"])
            assert r["measured_by_type_s"][typ] == pytest.approx(planned, abs=tol), (typ, r)
    times = [r["times_s"][str(k)] for k in range(4)]
    spread = max(abs(t["F"] + t["B"] - (times[real]["F"] + times[real]["B"])) / (times[real]["F"] + times[real]["B"]) for t in times)
    if spread < 0.05:  # the stand-ins mirrored a steady real stage: the closed form, within 5 points
        assert rep["bubble_fraction_measured"] == pytest.approx(rep["bubble_fraction_theory"], abs=0.05)
    assert {b["stage"] for b in rep["bubbles"]} == {0, 1, 2, 3}
    assert len(rep["losses"]) == 9 and all(x is not None for x in rep["losses"])  # the real stage's


def test_rehearsal_through_the_cli_harvests_the_real_stage_and_leaves_it_unchanged(tmp_path, fake_tasks_importable):
    """torch's Interleaved1F1B through its action order, the real stage first, side work from a
    GPU side task on CPU tensors; the real stage's losses identical with and without it."""
    r = cli("train", "--schedule", "interleaved1f1b", "--stages", "4", "--microbatches", "4", "--model", "small", "--iters", "11",
            "--rehearse", "0", "--stand-in", "F=0.02,B=0.04", "--side-tasks", "gpu-pagerank", "--paired-block", "1",
            "--run-dir", tmp_path / "run", "--report", tmp_path / "rep.json", timeout=280)
    assert r.code == 0, r.err[-3000:]
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert rep["rehearsal"]["real_stage"] == 0 and rep["losses_identical"] is True
    assert {k: v for k, v in rep["rehearsal"]["times_s"]["1"].items() if k != "W"} == pytest.approx({"F": 0.02, "B": 0.04}, rel=0.1)
    assert sum(d["steps"] for d in rep["side_work"].values()) > 0
    assert "rehearsal: stage 0 real" in r.out
    assert set(rep["overrun_by_type"]) <= {"A", "B", "C", "D", "S"}
    bad = cli("train", "--stages", "2", "--rehearse", "5", "--run-dir", tmp_path / "bad")
    assert_clean_error(bad, 2, "--rehearse", "stage 5")


def test_a_plan_writes_stand_ins_a_rehearsal_reads(tmp_path):
    """flowride plan --stand-ins: each stage's action times from the plan's own timeline."""
    out = tmp_path / "stand-ins.json"
    r = cli("plan", "examples/plans/llama70b-8k-h100.json", "--no-synth", "--no-cache", "--stand-ins", out, timeout=200)
    assert r.code == 0, r.err[-2000:]
    doc = json.loads(out.read_text())
    times = parse_stand_in(str(out), len(doc["stages"]))
    assert len(times) == 16 and all(t.F > 0 and t.B > t.F for t in times)
