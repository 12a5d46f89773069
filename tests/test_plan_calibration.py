"""Issue #34 parts 3 and 5: compute efficiency per operation size (``hardware.efficiency``), the
flat ``mfu`` path kept, ``--calibrate``, and the published runs (Korthikanti et al. 2022 Table 5,
Llama 3 Table 4) through ``flowride plan``."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest

from clirun import ROOT, assert_clean_error, cli
from flowride.cli import main
from flowride.plan import Pricer, job_from_dict, plan_job
from flowride.plan.costs import (
    calibrate,
    chunk_costs,
    chunk_layers,
    layer_flops,
    layer_flops_per_gpu,
    layer_ops,
    logits_op,
    model_flops_per_token,
    param_count,
)
from flowride.plan.efficiency import BUILTIN, Curve, saturating
from synth_helpers import refused_here

PUBLISHED = ROOT / "examples" / "plans" / "published"
INDEX = json.loads((PUBLISHED / "published.json").read_text())
# what docs/plan.md states this planner reaches on Korthikanti Table 5 with the built-in A100 description
ROW_TOLERANCE_PCT, MAE_TOLERANCE_PCT = 5.0, 3.0


def _job(**over) -> dict:
    d = {"model": {"layers": 4, "hidden": 4096, "seq_len": 2048, "heads": 32},
         "parallel": {"tp": 8, "pp": 2, "microbatches": 4},
         "hardware": {"node": "dgx-a100"}, "synthesis": {"enabled": False}}
    for k, v in over.items():
        d[k] = {**d[k], **v}
    return d


def test_the_curve_rises_with_size_and_stays_under_its_maximum():
    c = BUILTIN["dgx-a100"]
    xs = [10.0 ** (k / 4) for k in range(-8, 60)]  # 1e7 .. 1e15 FLOPs
    effs = [c.gemm(x) for x in xs]
    assert all(b > a for a, b in zip(effs, effs[1:], strict=False))
    assert all(0 < e < c.gemm_max for e in effs)
    assert c.gemm(c.gemm_half_gflop * 1e9) == pytest.approx(c.gemm_max / 2)
    assert saturating(0, 0.9, 1) == 0 and saturating(1e12, 0.9, 1) == pytest.approx(0.9, rel=1e-9)
    assert c.gemm(1e16) == pytest.approx(c.gemm_max, rel=1e-5)


@pytest.mark.parametrize("over", [
    {},
    {"model": {"kv_heads": 8, "mlp": "swiglu"}},
    {"model": {"kv_heads": 2, "mlp": "swiglu", "ffn_hidden": 11008}, "parallel": {"cp": 2, "dp": 2}},  # K/V replicated over tp
    {"model": {"microbatch_size": 2, "flash_attention": True}, "parallel": {"tp": 4, "sequence_parallel": False}},
])
def test_the_ops_sum_to_the_layer_count(over):
    job = job_from_dict(_job(**over))
    ops = layer_ops(job)
    assert sum(o.flops for o in ops) == pytest.approx(layer_flops_per_gpu(job), rel=1e-12)
    assert {o.name for o in ops if o.kind == "gemm"} == {"qkv", "proj", "mlp_up", "mlp_down"}
    assert [o.kind for o in ops].count("attention") == 1
    m, p = job.model, job.parallel
    assert logits_op(job).flops == pytest.approx(2 * m.microbatch_size * m.seq_len * m.hidden * m.vocab / p.tp / p.cp)
    assert ("scores" in {o.name for o in ops}) == (not m.flash_attention)


def test_a_job_without_mfu_or_efficiency_takes_its_gpus_built_in_description():
    """The best model flowride has, by default: the built-in description where the node type has
    one (issue #49); a node type without one is priced at the flat default."""
    job = job_from_dict(_job())
    assert job.efficiency == BUILTIN["dgx-a100"]
    rep = plan_job(job, Pricer(cache=None, synth=False)).report()
    assert rep["efficiency"]["model"] != "flat"
    b200 = job_from_dict(_job(hardware={"node": "hgx-b200"}))
    assert b200.efficiency is None and b200.mfu == 0.4


def test_the_flat_mfu_path_is_unchanged():
    """With mfu: one rate, I = W = F, the old count."""
    for hw, mfu in (({"mfu": 0.5}, 0.5), ({"mfu": 0.4}, 0.4)):
        job = job_from_dict(_job(hardware=hw))
        assert job.efficiency is None
        rate = 312e12 * mfu
        f = (layer_flops(job) / 8 * 2) / rate  # 2 layers per stage, tp 8
        logits = 2 * 2048 * 4096 * 32000 / 8 / rate
        costs = chunk_costs(job)
        assert costs[0].f == pytest.approx(f) and costs[0].i == costs[0].w == costs[0].f
        assert costs[1].f == pytest.approx(f + logits)
        rep = plan_job(job, Pricer(cache=None, synth=False)).report()
        assert rep["efficiency"]["model"] == "flat" and rep["efficiency"]["mfu"] == mfu
        assert any("one flat share of peak" in a for a in rep["assumptions"])


def test_the_curve_prices_op_by_op():
    job = job_from_dict(_job(hardware={"efficiency": "builtin"}))
    eff = job.efficiency
    assert eff == BUILTIN["dgx-a100"]
    c = chunk_costs(job)[0]
    gemms = sum(o.flops / (312e12 * eff.gemm(o.flops)) for o in layer_ops(job) if o.kind == "gemm")
    assert c.w == pytest.approx(2 * gemms)  # weight gradients: the GEMMs only
    assert c.f > c.w and c.i > c.f  # the attention core's backward and the memory-bound work go to I
    partial = job_from_dict(_job(hardware={"efficiency": {"gemm_max": 0.5}}))
    assert partial.efficiency.gemm_max == 0.5 and partial.efficiency.hbm_share == BUILTIN["dgx-a100"].hbm_share


def test_efficiency_errors_name_the_key(tmp_path, capsys):
    """The first end to end in a subprocess, the others through ``main`` in this process."""
    for i, (hw, needle) in enumerate((({"mfu": 0.5, "efficiency": "builtin"}, "hardware.mfu"),
                                      ({"node": "mi300x", "efficiency": "builtin"}, "hardware.efficiency"),
                                      ({"efficiency": {"gemm_maxx": 0.5}}, "gemm_maxx"))):
        f = tmp_path / "j.json"
        f.write_text(json.dumps(_job(hardware=hw)))
        if i == 0:
            assert_clean_error(cli("plan", f, "--no-cache", "--no-synth"), 2, needle, within=30)
        else:
            refused_here(capsys, ["plan", f, "--no-cache", "--no-synth"], needle, within=30)


def _synthetic_ops(e: float, h: float, ea: float, ha: float, share: float, peak: float, hbm: float) -> list[dict]:
    rnd = random.Random(7)
    ops = []
    for _ in range(40):
        m, n, k = (rnd.choice([256, 512, 1024, 2048, 4096, 8192, 16384]) for _ in range(3))
        x = 2 * m * n * k / 1e9
        ops.append({"kind": "gemm", "m": m, "n": n, "k": k, "seconds": (x + h) * 1e9 / (peak * e) * rnd.uniform(0.99, 1.01)})
    for _ in range(12):
        x = 10 ** rnd.uniform(-0.5, 3)
        ops.append({"kind": "attention", "flops": x * 1e9, "seconds": (x + ha) * 1e9 / (peak * ea) * rnd.uniform(0.99, 1.01)})
    for b in (1e7, 1e8, 1e9):
        ops.append({"kind": "memory", "bytes": b, "seconds": b / (hbm * share)})
    return ops


def test_calibrate_recovers_known_parameters_from_synthetic_ops(tmp_path):
    truth = {"gemm_max": 0.72, "gemm_half_gflop": 12.0, "attention_max": 0.45, "attention_half_gflop": 3.0, "hbm_share": 0.8}
    f = tmp_path / "ops.json"
    f.write_text(json.dumps({"ops": _synthetic_ops(*truth.values(), 312e12, 2.039e12)}))
    job = tmp_path / "job.json"
    job.write_text(json.dumps(_job()))
    r = cli("plan", job, "--calibrate", f, "--no-cache", "--no-synth", "--json", tmp_path / "r.json")
    assert r.code == 0, r.err[-2000:]
    line = next(ln for ln in r.out.splitlines() if ln.startswith("calibrated hardware.efficiency: "))
    got = json.loads(line.split(": ", 1)[1])
    for k, v in truth.items():
        assert got[k] == pytest.approx(v, rel=0.05), (k, got[k], v)
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["efficiency"]["model"] == "curve" and "fitted to ops.json" in rep["efficiency"]["source"]


def test_calibrate_from_a_train_run_scales_the_curve(tmp_path):
    """A run's per-stage forward + backward seconds, made from a known curve (the built-in with
    e_max x 0.8): the fit gives back that factor."""
    d = _job(parallel={"pp": 1, "microbatches": 1}, model={"layers": 2})
    base = job_from_dict({**d, "hardware": {"node": "dgx-a100", "efficiency": "builtin"}})
    truth = BUILTIN["dgx-a100"]
    scaled = {"gemm_max": truth.gemm_max * 0.8, "attention_max": truth.attention_max * 0.8}
    c = chunk_costs(job_from_dict({**d, "hardware": {"node": "dgx-a100", "efficiency": scaled}}))[0]
    recs, t = [], 0.0
    for it in range(3):
        its = []
        for kind, dur in (("F", c.f), ("B", c.i + c.w)):
            its.append({"kind": kind, "chunk": 0, "mb": 0, "start": t, "compute": t, "end": t + dur})
            t += dur
        recs.append({"iteration": it, "end": t, "records": its})
    run = tmp_path / "run"
    run.mkdir()
    (run / "ranks.json").write_text(json.dumps({"config": {"warmup_iters": 1}, "ranks": [{"iterations": recs}]}))
    got = calibrate(base, run)
    assert got.gemm_max == pytest.approx(scaled["gemm_max"], rel=0.01)
    assert got.gemm_half_gflop == truth.gemm_half_gflop and "fitted to the run" in got.source


def _cache(tmp_path: Path) -> Path:
    c = tmp_path / "cache.json"
    shutil.copy(PUBLISHED / "collectives-cache.json", c)
    return c


def test_korthikanti_table5_through_flowride_plan(tmp_path, capsys):
    """The eight rows with the one built-in A100 description: each within the documented error.
    The first row end to end in a subprocess, the others through ``main`` in this process."""
    cache, errs = _cache(tmp_path), []
    for row in INDEX["rows"]:
        if row["metric"] != "iteration_s":
            continue
        out = tmp_path / "r.json"
        args = ["plan", str(PUBLISHED / row["job"]), "--cache", str(cache), "--json", str(out)]
        if not errs:
            r = cli(*args)
            assert r.code == 0, r.err[-2000:]
            text = r.out
        else:
            capsys.readouterr()
            assert main(args) == 0
            text = capsys.readouterr().out
        assert "efficiency per operation (fitted to Korthikanti et al. 2022 Table 5" in " ".join(text.split())  # the caption
        assert "collectives: 1 from the cache, 0 priced now" in " ".join(text.split())
        rep = json.loads(out.read_text())
        assert rep["efficiency"]["source"] == BUILTIN["dgx-a100"].source
        errs.append(abs(rep["iteration_s"] / row["published"] - 1) * 100)
    assert len(errs) == 8
    assert max(errs) < ROW_TOLERANCE_PCT, errs
    assert sum(errs) / len(errs) < MAE_TOLERANCE_PCT, errs


def test_llama3_throughput_ratios(tmp_path):
    """Per-GPU model TFLOP/s: 16K over 8K GPUs within 2 points of 400/430, the CP 16 row at 128K
    over 8K within 5 points of 380/430 (the issue's targets; the planner reaches -0.4 and -3.2,
    docs/plan.md), and every row within 14% of its published figure (-8.5, -8.9 and -13.2% with the
    collectives priced by the calibrated model of NCCL, which prices the CP group's AllGathers 1.36x
    and the DP groups' 1.04x the epoch model's; -7.3 to -10.6% before)."""
    pricer = Pricer(cache=_cache(tmp_path), synth=False)
    tf = {}
    for row in INDEX["rows"]:
        if row["metric"] != "tflops_per_gpu":
            continue
        job = job_from_dict(json.loads((PUBLISHED / row["job"]).read_text()))
        rep = plan_job(job, pricer).report()
        tf[row["published"]] = rep["tokens_per_s"] * model_flops_per_token(job) / job.gpus / 1e12
    assert pricer.solved == 0
    assert abs(tf[400] / tf[430] - 400 / 430) < 0.02, tf
    assert abs(tf[380] / tf[430] - 380 / 430) < 0.05, tf
    assert all(abs(v / k - 1) < 0.14 for k, v in tf.items()), tf


def test_llama3_stages_over_interleaved_chunks():
    """Llama 3's rule with virtual 8: 128 chunk slots of one layer, the first holding only the
    embedding and the last only the logits."""
    d = json.loads((PUBLISHED / "llama3-405b-8k-gpus8192.json").read_text())
    job = job_from_dict(d)
    layers = chunk_layers(job)
    assert len(layers) == 128 and layers[0] == layers[-1] == 0 and set(layers[1:-1]) == {1} and sum(layers) == 126
    d["parallel"]["virtual"] = 3
    with pytest.raises(Exception, match="llama3_stages"):
        job_from_dict(d)
    m = job.model  # 6 x (parameters less the embedding lookup) + 6 L s h (causal attention, FlashAttention), per token
    assert math.isclose(model_flops_per_token(job), 6 * (param_count(job) - m.vocab * m.hidden) + 6 * m.layers * m.seq_len * m.hidden)
    d["parallel"]["virtual"], d["model"]["causal"] = 8, False  # every score computed: 12 L s h
    dense = job_from_dict(d)
    assert math.isclose(model_flops_per_token(dense), 6 * (param_count(job) - m.vocab * m.hidden) + 12 * m.layers * m.seq_len * m.hidden)
    assert 400e9 < param_count(job) < 410e9


def test_the_h100_description_matches_its_reference():
    """Issue #34: one H200 (dgx-h100 at 4.8 TB/s), a GPT layer at h 4096-12288, seq 2048-4096, forward +
    backward at 0.61-0.67 of 989 TFLOP/s (two digits: 0.605-0.675); the built-in H100 description
    (FlashAttention-3's attention, causal) lands there."""
    from flowride.plan.costs import layer_seconds

    c: Curve = BUILTIN["dgx-h100"]
    for h in (4096, 8192, 12288):
        for s in (2048, 4096):
            job = job_from_dict({"model": {"layers": 1, "hidden": h, "seq_len": s, "heads": h // 128, "flash_attention": True},
                                 "parallel": {"pp": 1, "microbatches": 1},
                                 "hardware": {"node": "dgx-h100", "hbm_tbps": 4.8, "memory_gib": 141, "efficiency": "builtin"}})
            f, i, w, _ = layer_seconds(job, c)
            assert 0.605 <= 3 * layer_flops(job) / (f + i + w) / 989e12 <= 0.675


def test_the_h100_attention_is_the_flashattention3_benchmark_fitted():
    """The built-in H100 attention pair is --calibrate's fit to the shipped FlashAttention-3 points
    (benchmarks/data/attention_h100_fa3.json), and it follows each point within 2%."""
    from flowride.plan.efficiency import fit_ops, read_measured

    ops = read_measured(ROOT / "benchmarks" / "data" / "attention_h100_fa3.json")
    c, fit = BUILTIN["dgx-h100"], fit_ops(ops, BUILTIN["dgx-h100"], 989.0, 3.35, "fa3")
    assert math.isclose(c.attention_max, fit.attention_max, rel_tol=2e-3)
    assert math.isclose(c.attention_half_gflop, fit.attention_half_gflop, rel_tol=5e-3)
    assert (c.gemm_max, c.gemm_half_gflop) == (fit.gemm_max, fit.gemm_half_gflop)  # attention ops leave the GEMMs alone
    for o in ops:
        assert abs(c.attention(o.size) / (o.size / o.seconds / 989e12) - 1) < 0.02, o
