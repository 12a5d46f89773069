"""Pipeline training end to end: equality with single-process training, bubbles, events,
failures, and the CLI. Every multi-process test runs under a timeout and leaves no process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from flowride.errors import InputError
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.data import TokenSource
from flowride.pipeline.events import BubbleSubscriber
from flowride.pipeline.launch import TrainingFailed
from flowride.pipeline.model import build_pieces, loss_fn, preset
from flowride.pipeline.trainer import train
from harvest_fixtures.shared import tiny_1f1b_report

pytestmark = pytest.mark.timeout(180)


def reference_training(cfg: TrainConfig) -> tuple[list[float], dict[int, dict]]:
    """The same model, data, seed and optimizer on one process, without a pipeline."""
    torch.set_num_threads(1)
    mcfg = preset(cfg.model)
    P = cfg.stages * cfg.chunks
    pieces = build_pieces(mcfg, P, cfg.seed)
    params = [p for j in range(P) for p in pieces[j].parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    data = TokenSource(mcfg.vocab_size, mcfg.seq_len, cfg.seed, cfg.data)
    losses = []
    for it in range(cfg.iters):
        batch = data.batch(it, cfg.microbatches, cfg.microbatch_size)
        total = 0.0
        for mb in range(cfg.microbatches):
            x = batch[mb, :, :-1]
            for j in range(P):
                x = pieces[j](x)
            loss = loss_fn(x, batch[mb, :, 1:]) / cfg.microbatches
            loss.backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    return losses, {j: pieces[j].state_dict() for j in range(P)}


def no_worker_left(run_dir: Path) -> bool:
    needle = str(run_dir / "config.json")
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if needle in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                    return False
            except OSError:
                continue
    return True


# the built-in 1F1B runs on 4 stages (first, middle and last stages; 2 stages is the same code
# with no middle one), torch's on 2
@pytest.mark.parametrize(("engine", "schedule", "stages", "chunks"), [
    ("builtin", "gpipe", 2, 1), ("builtin", "interleaved", 2, 2), ("builtin", "zbh1", 2, 1),
    ("builtin", "1f1b", 4, 1), ("torch", "1f1b", 2, 1), ("torch", "interleaved1f1b", 2, 2), ("torch", "dualpipev", 2, 2),
])
def test_pipelined_training_equals_single_process(tmp_path, engine, schedule, stages, chunks):
    cfg = TrainConfig(schedule=schedule, stages=stages, microbatches=4, chunks=chunks, model="tiny", iters=3,
                      run_dir=str(tmp_path / "run"), save_params=True, timeout_s=60, engine=engine)
    res = train(cfg)
    ref_losses, ref_state = reference_training(cfg)
    assert res.report()["losses"] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    got: dict[int, dict] = {}
    for r in range(stages):
        got.update(torch.load(tmp_path / "run" / f"rank{r}.pt"))
    assert sorted(got) == sorted(ref_state)
    for j, sd in ref_state.items():
        for name, tensor in sd.items():
            torch.testing.assert_close(got[j][name], tensor, rtol=1e-5, atol=1e-6, msg=f"piece {j} {name}")
    assert no_worker_left(tmp_path / "run")


@pytest.mark.parametrize("engine", ["builtin", "torch"])
def test_report_contract_and_bubble_types(tmp_path_factory, engine):
    rep = tiny_1f1b_report(tmp_path_factory, engine)  # 1F1B, p = 2, m = 4, tiny, 4 iterations; shared
    assert rep["engine"] == engine
    for key in ("schedule", "stages", "microbatches", "iteration_time_s", "losses", "bubble_fraction_measured", "bubble_fraction_theory", "bubbles"):
        assert key in rep
    assert len(rep["losses"]) == 4 and rep["iteration_time_s"] > 0
    assert rep["bubble_fraction_theory"] == pytest.approx(1 / 5)
    assert 0 < rep["bubble_fraction_measured"] < 1
    kinds = {(b["stage"], b["type"]) for b in rep["bubbles"]}
    # stage 1 (last) waits before its first forward (A); stage 0 drains (D) after its last forward
    assert (1, "A") in kinds and (0, "D") in kinds and (0, "B") in kinds and (1, "C") in kinds
    for b in rep["bubbles"]:
        assert b["min_s"] <= b["median_s"] and b["count"] >= 1 and b["free_memory_bytes"] > 0
    # the last stage's A bubble is the pipeline fill: at least one forward of stage 0 long
    a1 = next(b for b in rep["bubbles"] if (b["stage"], b["type"]) == (1, "A"))
    a0 = next(b for b in rep["bubbles"] if (b["stage"], b["type"]) == (0, "A"))
    assert a1["median_s"] > a0["median_s"]


def _publish_cpu_s(port: int, n: int = 2000) -> float:
    """CPU seconds one publish costs (the thread's own time: a busy machine does not inflate it)."""
    from flowride.pipeline.events import BubbleEvent, BubblePublisher

    pub = BubblePublisher(port)
    ev = BubbleEvent("bubble", 0, "B", 1.0, 2.0, 1 << 30, 0)
    t0 = time.thread_time()
    for _ in range(n):
        pub.publish(ev)
    cpu = time.thread_time() - t0
    pub.close()
    return cpu / n


def test_events_reach_a_subscriber_and_a_deaf_one_costs_nothing(tmp_path, tmp_path_factory):
    """A subscriber nobody reads during training (deaf) changes nothing; what it holds afterwards
    are the stages' bubbles. (Training without a subscriber: the shared run of the same config.)"""
    # min_bubble_s=0: the tiny model's drain (D) gaps are a few ms, near the default floor; this
    # test is about delivery, not about which gaps are long enough on a busy machine
    quiet = tiny_1f1b_report(tmp_path_factory, "torch")  # 1F1B is torch's: the engine "auto" picks
    deaf = BubbleSubscriber()  # bound, not read while training runs
    try:
        loud = train(TrainConfig(schedule="1f1b", stages=2, microbatches=4, model="tiny", iters=4, min_bubble_s=0.0,
                                 run_dir=str(tmp_path / "deaf"), bubble_port=deaf.port))
        events = deaf.drain()
        per_event_cpu_s = _publish_cpu_s(deaf.port)
    finally:
        deaf.close()
    # training is unchanged and publishing is cheap: far below a millisecond of CPU per event
    assert loud.report()["engine"] == quiet["engine"] and loud.report()["losses"] == quiet["losses"]
    for r in loud.ranks:
        pub = r["published"]
        assert pub["sent"] + pub["dropped"] > 0
    assert per_event_cpu_s < 1e-3
    kinds = {(e.stage, e.type) for e in events if e.kind == "bubble"}
    assert (1, "A") in kinds and (0, "D") in kinds
    assert all(e.free_memory > 0 for e in events)


def test_profile_then_train_predicts_bubble_ends(tmp_path):
    prof_path = tmp_path / "profile.json"
    p = subprocess.run([sys.executable, "-m", "flowride", "profile-bubbles", "--stages", "2", "--microbatches", "4", "--iters", "4",
                        "--model", "tiny", "--run-dir", str(tmp_path / "p"), "--out", str(prof_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    prof = json.loads(prof_path.read_text())
    assert prof["schema"] == "flowride.bubble-profile/2"
    assert {(b["stage"], b["type"]) for b in prof["bubbles"]} >= {(0, "B"), (1, "A"), (1, "C")}
    for b in prof["bubbles"]:
        assert b["min_s"] <= b["p10_s"] <= b["median_s"]
    # each stage's learned wait lengths, by wait key: gap i before instruction i, "end" after the optimizer
    assert [s["stage"] for s in prof["lengths"]] == [0, 1]
    assert {"0#0", "end#0"} <= set(prof["lengths"][1]["lengths"])
    sub = BubbleSubscriber()
    try:
        cfg = TrainConfig(schedule="1f1b", stages=2, microbatches=4, model="tiny", iters=3, run_dir=str(tmp_path / "t"),
                          bubble_port=sub.port, profile=str(prof_path), min_bubble_s=0.0)
        train(cfg)
        evs = [e for e in sub.drain() if e.kind == "bubble"]
    finally:
        sub.close()
    assert evs and all(e.predicted_end is not None and e.predicted_end >= e.start for e in evs)
    # a saved profile predicts from the first iteration on: no warm-up needed
    assert 0 in {e.iteration for e in evs}
    bad = TrainConfig(schedule="gpipe", stages=2, microbatches=4, iters=1, run_dir=str(tmp_path / "x"), profile=str(prof_path))
    with pytest.raises(Exception, match="profiled with schedule=1f1b"):
        train(bad)


# the peer timeout: a crash needs none (60 s covers any start-up skew of the ranks); a hang is
# found by it, and it must also outlast the skew of the two ranks' start on a busy machine, or the
# rank that is merely late would be blamed
@pytest.mark.parametrize(("fault", "peer_timeout_s"), [("crash:1", 60), ("hang:1", 10)])
def test_a_failing_rank_brings_the_run_down_cleanly(tmp_path, fault, peer_timeout_s):
    cfg = TrainConfig(schedule="1f1b", stages=2, microbatches=4, iters=5, run_dir=str(tmp_path / "run"), timeout_s=peer_timeout_s)
    t0 = time.monotonic()
    with pytest.raises(TrainingFailed) as ei:
        train(cfg, extra_env={1: {"FLOWRIDE_INJECT_FAULT": fault}})
    assert time.monotonic() - t0 < 170  # it ends at all, well before the launcher's own wall limit
    if fault.startswith("crash"):
        assert ei.value.rank == 1 and "injected crash" in str(ei.value)
    else:
        assert ei.value.rank == 0  # the peer times out waiting on the hung rank
    assert no_worker_left(tmp_path / "run")


def run_cli(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowride", *args], capture_output=True, text=True, timeout=timeout)


# the CLI's own work (report, timeline, trace, summary) is the same for every schedule and stage
# count; those are checked on the library path above
@pytest.mark.parametrize(("stages", "schedule"), [(2, "interleaved")])
def test_cli_train_end_to_end(tmp_path, stages, schedule):
    rep, png, trace = tmp_path / "r.json", tmp_path / "t.png", tmp_path / "tr.json"
    p = run_cli("train", "--stages", str(stages), "--microbatches", "4", "--schedule", schedule, "--model", "tiny",
                "--iters", "3", "--report", str(rep), "--timeline", str(png), "--trace", str(trace), "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 0, p.stderr
    r = json.loads(rep.read_text())
    assert r["stages"] == stages and r["schedule"] == schedule and len(r["losses"]) == 3
    assert {b["stage"] for b in r["bubbles"]} == set(range(stages))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ev = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("cat") == "bubble" for e in ev) and any(e.get("cat") == "F" for e in ev)
    assert "bubble fraction measured" in p.stdout


def test_cli_schedule_show():
    p = run_cli("schedule-show", "1f1b", "--stages", "4", "--microbatches", "8")
    assert p.returncode == 0
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("S")]
    assert len(rows) == 4 and "B7" in p.stdout and "0.2727" in p.stdout


# the CLI turns every refused input into one line (the argument parser's, the configuration's and
# schedule-show's refusals); which configurations are refused, and how they are named, is the
# configuration's check, tested in this process below (each CLI case starts torch: ~4 s of CPU)
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--schedule", "pipedream-x"], "schedule"),
        (["train", "--model", "huge"], "model"),
        (["train", "--iters", "0"], "--iters"),
        (["schedule-show", "interleaved", "--stages", "4", "--microbatches", "6"], "microbatches"),
    ],
)
def test_cli_train_bad_input(args, needle):
    p = run_cli(*args, timeout=60)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    ("kw", "field", "needle"),
    [
        ({"stages": 5, "model": "tiny", "microbatches": 8}, "stages", "5 pipeline pieces"),
        ({"stages": 4, "microbatches": 2, "schedule": "1f1b"}, "--microbatches", "Schedule1F1B refuses p=4, m=2"),
    ],
)
def test_train_config_refusals_name_the_field(kw, field, needle):
    with pytest.raises(InputError) as e:
        TrainConfig(**kw).validate()
    assert e.value.field == field and needle in str(e.value) and "\n" not in str(e.value)


def test_trains_on_a_text_file(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    cfg = TrainConfig(schedule="1f1b", stages=2, microbatches=2, model="tiny", iters=8, lr=3e-3,
                      data=str(corpus), run_dir=str(tmp_path / "run"))
    losses = train(cfg).report()["losses"]
    assert losses[-1] < losses[0] - 0.5  # a repetitive text is learnt quickly
    with pytest.raises(InputError, match="--data"):  # refused before any rank starts
        train(TrainConfig(data=str(tmp_path / "missing.txt"), run_dir=str(tmp_path / "x"), iters=1))


def test_the_worker_runs_under_torchrun(tmp_path):
    """The same worker, started by torchrun instead of flowride's launcher."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = TrainConfig(schedule="gpipe", stages=2, microbatches=2, model="tiny", iters=2, run_dir=str(run_dir))
    (run_dir / "config.json").write_text(cfg.to_json())
    torchrun = Path(sys.executable).with_name("torchrun")
    p = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "flowride.pipeline.worker",
                        str(run_dir / "config.json")], capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(recs[1]["iterations"]) == 2 and recs[1]["iterations"][0]["loss"] > 0
