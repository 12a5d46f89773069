"""``flowride plan`` with the features published runs use (issue #34, parts 1 and 2): grouped-query
attention, SwiGLU, recomputation, context parallelism, uneven first and last stages, the optimizer
step from its bytes, and memory per GPU, each against a closed form worked by hand."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clirun import cli
from flowride.errors import InputError
from flowride.plan import Pricer, job_from_dict, plan_job
from flowride.plan.costs import (
    chunk_costs,
    cp_chunk_bytes,
    layer_flops,
    optimizer_seconds,
    param_count,
    rank_params_per_gpu,
    tp_allreduce_bytes,
)
from flowride.plan.job import stage_layers
from flowride.plan.memory import layer_activation_bytes, memory
from flowride.plan.sweep import parse_sweep, sweep
from synth_helpers import refused_here

H100 = 989e12  # dense BF16 FLOP/s
MFU = 0.5


def _d(model: dict | None = None, **par) -> dict:
    """A small FLOP-model job: 8 layers of hidden 1024, s = 2048, tp 2, pp 2, 1F1B, 4 micro-batches."""
    m = {"layers": 8, "hidden": 1024, "seq_len": 2048, "vocab": 32000, **(model or {})}
    p = {"tp": 2, "pp": 2, "microbatches": 4, "schedule": "1f1b", **par}
    return {"model": m, "parallel": p, "hardware": {"node": "dgx-h100", "mfu": MFU}, "synthesis": {"enabled": False}}


def _job(model: dict | None = None, **par):
    return job_from_dict(_d(model, **par))


B, S, HID, V = 1, 2048, 1024, 32000
RATE = H100 * MFU


# --- FLOPs ---------------------------------------------------------------------------------------

def test_gqa_flops_match_the_closed_forms():
    f = 4 * HID
    mha = 8 * B * S * HID**2 + 4 * B * S * HID * f + 4 * B * S * S * HID  # Narayanan et al.: today's count
    assert layer_flops(_job()) == mha
    assert layer_flops(_job({"heads": 8, "kv_heads": 8})) == mha
    h_kv = HID / 8  # one K/V head of 8: MQA
    assert layer_flops(_job({"heads": 8, "kv_heads": 1}, tp=1)) == pytest.approx(
        2 * B * S * HID * (2 * HID + 2 * h_kv) + 4 * B * S * HID * f + 4 * B * S * S * HID, rel=1e-12)
    # per GPU at tp 1: the chunk's layers at the sustained rate (the last chunk adds the logits 2bshV)
    c = chunk_costs(_job({"heads": 8, "kv_heads": 2}, tp=1))
    per_layer = 2 * B * S * HID * (2 * HID + 2 * HID / 4) + 4 * B * S * HID * f + 4 * B * S * S * HID
    assert c[0].f == pytest.approx(4 * per_layer / RATE, rel=1e-12)
    assert c[1].f == pytest.approx((4 * per_layer + 2 * B * S * HID * V) / RATE, rel=1e-12)


def test_kv_heads_fewer_than_tp_are_replicated():
    """kv_heads 2 over tp 4: each rank projects one K/V head, so the group does 4 heads' K and V."""
    j = _job({"heads": 8, "kv_heads": 2}, tp=4)
    d = HID / 8
    whole = layer_flops(j) + 2 * B * S * HID * 2 * (4 - 2) * d
    assert chunk_costs(j)[0].f == pytest.approx(4 * whole / 4 / RATE, rel=1e-12)


def test_swiglu_flops_and_params():
    f = 2816
    j = _job({"mlp": "swiglu", "ffn_hidden": f})
    assert layer_flops(j) == 8 * B * S * HID**2 + 6 * B * S * HID * f + 4 * B * S * S * HID
    assert param_count(j) == 8 * (4 * HID**2 + 3 * HID * f) + V * HID
    assert job_from_dict(_d({"hidden": 4096, "mlp": "swiglu"}, tp=1)).ffn_hidden == 11008  # Llama's 8h/3 rounded up to 256
    assert param_count(_job({"tied_embeddings": False})) == 8 * (4 * HID**2 + 2 * HID * 4 * HID) + 2 * V * HID


def test_param_count_of_an_old_job_is_unchanged():
    j = _job({"ffn_hidden": 3000})
    assert param_count(j) == 8 * (4.0 * HID * HID + 2.0 * HID * 3000) + V * HID


@pytest.mark.parametrize("tp", [1, 2])
def test_recompute_adds_one_forward_or_the_core_attention_to_the_backward(tp):
    base = chunk_costs(_job(tp=tp))
    full = chunk_costs(_job({"recompute": "full"}, tp=tp))
    sel = chunk_costs(_job({"recompute": "selective"}, tp=tp))
    layers_fwd = 4 * layer_flops(_job()) / tp / RATE  # the chunk's layers (the logits are not recomputed)
    core = 4 * (4 * B * S * S * HID) / tp / RATE
    for b0, fu, se in zip(base, full, sel, strict=True):
        assert (fu.f, fu.w, se.f, se.w) == (b0.f, b0.w, b0.f, b0.w)
        assert fu.i - b0.i == pytest.approx(layers_fwd, rel=1e-12)
        assert se.i - b0.i == pytest.approx(core, rel=1e-12)


def test_a_causal_mask_halves_the_attention_only_with_flashattention():
    """FlashAttention skips the tiles a causal mask hides (2bs^2h of the 4bs^2h); Megatron's
    unfused attention computes every score and masks them; a bidirectional model (causal false)
    computes them all either way. Selective recompute redoes what the kernel does."""
    f = 4 * HID
    dense = 8 * B * S * HID**2 + 4 * B * S * HID * f + 4 * B * S * S * HID
    causal_flash = dense - 2 * B * S * S * HID
    assert layer_flops(_job()) == dense  # causal by default, no FlashAttention: dense
    assert layer_flops(_job({"flash_attention": True})) == causal_flash
    assert layer_flops(_job({"flash_attention": True, "causal": False})) == dense
    base = chunk_costs(_job({"flash_attention": True}, tp=1))
    sel = chunk_costs(_job({"flash_attention": True, "recompute": "selective"}, tp=1))
    for b0, se in zip(base, sel, strict=True):
        assert se.i - b0.i == pytest.approx(4 * (2 * B * S * S * HID) / RATE, rel=1e-12)


def test_context_parallelism_divides_compute_and_adds_the_ring():
    one, two = _job(tp=2), _job(tp=2, cp=2)
    assert two.gpus == 2 * 2 * 2
    for a, b in zip(chunk_costs(one), chunk_costs(two), strict=True):
        assert b.f == pytest.approx(a.f / 2, rel=1e-12) and b.b == pytest.approx(a.b / 2, rel=1e-12)
    # each rank's K and V of one layer: 2 * b * (s/cp) * (h/tp) bf16 values; an all-gather of cp of them
    assert cp_chunk_bytes(two) == 2 * B * (S // 2) * (HID // 2) * 2
    assert tp_allreduce_bytes(two) == B * (S // 2) * HID * 2
    pl = plan_job(two, Pricer(cache=None, synth=False))
    ag = [c for c in pl.collectives if c.collective == "allgather" and c.group.size == 2 and c.size_bytes == 2 * cp_chunk_bytes(two)]
    assert ag, [c.as_dict() for c in pl.collectives]
    # per rank: 4 micro-batches x 4 layers x (one pass in the forward + two in the backward)
    for r in range(2):
        assert pl.ours.cp_s[r] == pytest.approx(4 * 4 * 3 * ag[0].ours_us * 1e-6, rel=1e-9)
    rep = pl.report()
    assert rep["shares"]["cp_comm"] > 0 and rep["gpus"] == 8
    assert sum(rep["shares"].values()) == pytest.approx(1.0, abs=1e-6)


# --- uneven stages --------------------------------------------------------------------------------

def test_llama3_stage_rule_and_given_ends():
    j = _job({"layers": 126}, pp=16, microbatches=16, llama3_stages=True, tp=1)
    assert stage_layers(j) == [7] + [8] * 14 + [7]  # Llama 3 405B: 126 layers over 16 stages
    c = chunk_costs(j)
    per_layer = layer_flops(j) / RATE
    assert c[0].f == pytest.approx(7 * per_layer, rel=1e-12) and c[1].f == pytest.approx(8 * per_layer, rel=1e-12)
    assert c[-1].f == pytest.approx((7 * layer_flops(j) + 2 * B * S * HID * V) / RATE, rel=1e-12)
    assert stage_layers(_job(pp=2, first_stage_layers=3, last_stage_layers=5)) == [3, 5]
    assert stage_layers(_job({"layers": 10}, pp=3, microbatches=3, first_stage_layers=2)) == [2, 4, 4]
    assert stage_layers(_job({"layers": 10}, pp=3, microbatches=3, last_stage_layers=4)) == [3, 3, 4]
    with pytest.raises(InputError, match="parallel.first_stage_layers"):
        _job(pp=2, first_stage_layers=3, last_stage_layers=4)
    with pytest.raises(InputError, match="parallel.llama3_stages"):
        _job({"layers": 9}, pp=2, llama3_stages=True)


def test_uneven_stages_carry_their_own_tp_time():
    pl = plan_job(_job(pp=2, first_stage_layers=2, last_stage_layers=6), Pricer(cache=None, synth=False))
    tp = [s["tp_comm_s"] for s in pl.report()["per_stage"]]
    assert tp[1] == pytest.approx(3 * tp[0], rel=1e-9)  # 2 all-reduces per layer: 6 layers against 2


# --- the optimizer step ---------------------------------------------------------------------------

def test_the_optimizer_step_is_its_bytes_over_hbm_bandwidth():
    j = _job(distributed_optimizer=False)
    params = rank_params_per_gpu(j)
    # stage 0: 4 layers of (4h^2 + 8h^2)/tp and the embedding V*h/tp; the last stage its logit layer's copy
    assert params[0] == params[1] == 4 * 12 * HID * HID / 2 + V * HID / 2
    assert optimizer_seconds(j) == pytest.approx([p * 30 / 3.35e12 for p in params], rel=1e-12)
    j2 = _job({"grad_bytes": 2}, dp=4)  # 16 GPUs, the distributed optimizer: each updates 1/4 of them
    assert optimizer_seconds(j2) == pytest.approx([p / 4 * 28 / 3.35e12 for p in params], rel=1e-12)
    assert optimizer_seconds(_job({"optimizer_s": [0.5, 0.25]})) == [0.5, 0.25]
    a = plan_job(j, Pricer(cache=None, synth=False)).ours
    b = plan_job(_job({"optimizer_s": [0.0, 0.0]}, distributed_optimizer=False), Pricer(cache=None, synth=False)).ours
    assert [x - y for x, y in zip(a.compute_s, b.compute_s, strict=True)] == pytest.approx(optimizer_seconds(j), rel=1e-9)


# --- memory ---------------------------------------------------------------------------------------

def _korthikanti(tp: int, heads: int = 8, s: int = S, b: int = B, h: int = HID) -> float:
    """Table 2 with sequence parallelism: sbh(34/t + 5as/(ht)) bytes per layer."""
    return s * b * h * (34 / tp + 5 * heads * s / (h * tp))


def test_1f1b_keeps_p_micro_batches_and_gpipe_m():
    j = _job()
    a = _korthikanti(2)
    assert layer_activation_bytes(j) == pytest.approx(a, rel=1e-12)
    mem = memory(j)
    r0 = mem.ranks[0]
    assert r0.in_flight == 2 and r0.activations == pytest.approx(2 * 4 * a, rel=1e-12)  # p = 2 micro-batches of 4 layers
    p0 = 4 * 12 * HID * HID / 2 + V * HID / 2
    assert (r0.params, r0.grads, r0.optimizer) == pytest.approx((2 * p0, 4 * p0, 12 * p0), rel=1e-12)
    assert mem.bytes_per_param == 18
    g = memory(_job(schedule="gpipe", microbatches=6)).ranks[0]
    assert g.in_flight == 6 and g.activations == pytest.approx(6 * 4 * a, rel=1e-12)
    # without sequence parallelism the 10 unsplit bytes stay whole: sbh(10 + 24/t + 5as/(ht))
    assert layer_activation_bytes(_job(sequence_parallel=False)) == pytest.approx(
        S * B * HID * (10 + 24 / 2 + 5 * 8 * S / (HID * 2)), rel=1e-12)


def test_interleaved_and_zbv_in_flight():
    j = _job(pp=4, virtual=2, microbatches=8, schedule="interleaved", tp=1)
    assert memory(j).ranks[0].in_flight == pytest.approx(4 * (1 + 3 / 8))  # Korthikanti 4.2.3: p(1 + (p-1)/(pv))
    z = _job(pp=4, virtual=2, microbatches=8, schedule="zbv", tp=1)
    assert memory(z).ranks[1].in_flight == pytest.approx(4)  # 2p chunks of half a stage: 1F1B's p


def test_recompute_and_flash_attention_memory():
    a_sel = S * B * HID * 34 / 2
    a_full = 2 * S * B * HID / 2
    assert layer_activation_bytes(_job({"recompute": "selective"})) == pytest.approx(a_sel, rel=1e-12)
    assert layer_activation_bytes(_job({"flash_attention": True})) == pytest.approx(a_sel, rel=1e-12)
    assert layer_activation_bytes(_job({"recompute": "full"})) == pytest.approx(a_full, rel=1e-12)
    # full: p micro-batches of 4 stored inputs, and one layer rebuilt at a time
    r0 = memory(_job({"recompute": "full"})).ranks[0]
    assert r0.activations == pytest.approx(2 * 4 * a_full + _korthikanti(2) - a_full, rel=1e-12)
    # context parallelism: s -> s/cp for the tokens, the scores keep all s keys
    cp = layer_activation_bytes(_job(cp=2))
    assert cp == pytest.approx((S // 2) * B * HID * 34 / 2 + 5 * 8 * (S // 2) * S * B / 2, rel=1e-12)


def test_gqa_and_swiglu_change_the_constants():
    """kv_heads 2 of 8 (K and V a quarter as wide) and SwiGLU of width f: 10 + 4 + 4/4 + 6f/h, over t."""
    f = 2816
    j = _job({"heads": 8, "kv_heads": 2, "mlp": "swiglu", "ffn_hidden": f, "flash_attention": True})
    assert layer_activation_bytes(j) == pytest.approx(S * B * HID * (10 + 4 + 4 / 4 + 6 * f / HID) / 2, rel=1e-12)


def test_distributed_optimizer_is_6_plus_12_over_dp():
    mem = memory(_job(dp=4))
    assert mem.bytes_per_param == 6 + 12 / 4
    r0 = mem.ranks[0]
    assert r0.optimizer == pytest.approx(12 * r0.params / 2 / 4, rel=1e-12)
    assert memory(_job(dp=2, cp=2)).bytes_per_param == 6 + 12 / 4  # sharded over dp x cp


def test_the_report_holds_memory():
    rep = plan_job(_job(tp=1), Pricer(cache=None, synth=False)).report()
    m = rep["memory"]
    assert m["fits"] and m["device_gib"] == 80 and m["peak_stage"] in (0, 1)
    g = m["per_gpu_gib"]
    assert g["total"] == pytest.approx(g["params"] + g["grads"] + g["optimizer"] + g["activations"])


@given(b=st.integers(1, 8), s=st.sampled_from([256, 1024, 4096]), hk=st.integers(1, 16), tp=st.sampled_from([1, 2, 4]),
       schedule=st.sampled_from(["gpipe", "1f1b", "zbh1"]), rc=st.sampled_from(["none", "selective", "full"]),
       sp=st.booleans(), cp=st.sampled_from([1, 2]))
def test_memory_grows_with_the_micro_batch_and_recompute_never_adds(b, s, hk, tp, schedule, rc, sp, cp):
    h = 128 * hk * tp

    def act(bb: int, r: str) -> float:
        j = job_from_dict(_d({"layers": 8, "hidden": h, "seq_len": s, "microbatch_size": bb, "recompute": r},
                             tp=tp, cp=cp, pp=4, microbatches=6, schedule=schedule, sequence_parallel=sp))
        return memory(j).peak.activations

    assert act(b, rc) <= act(b + 1, rc)
    assert act(b, "full") <= act(b, "selective") <= act(b, "none")


# --- refusals and the CLI -------------------------------------------------------------------------

@pytest.mark.parametrize(("edit", "needle"), [
    (lambda d: d["model"].update(heads=8, kv_heads=3), "model.kv_heads"),
    (lambda d: d["model"].update(heads=12), "model.heads"),
    (lambda d: d["parallel"].update(pp=2, virtual=2, schedule="interleaved", llama3_stages=True), "parallel.llama3_stages"),
    (lambda d: d["parallel"].update(cp=3), "parallel.cp"),
    (lambda d: d["model"].update(layers=80, hidden=8192, seq_len=8192), "parallel / model.recompute"),
])
def test_refusals_are_one_line(tmp_path, capsys, edit, needle):
    """Through ``main`` in this process (a job's refusal end to end: test_plan's YAML case)."""
    d = _d(tp=1)
    edit(d)
    f = tmp_path / "job.json"
    f.write_text(json.dumps(d))
    line = refused_here(capsys, ["plan", f, "--no-synth", "--no-cache"], needle, within=30)
    if "recompute" in needle:
        assert "peak memory per GPU" in line and "model.recompute selective or full" in line


def test_the_cli_prints_memory(tmp_path):
    f = tmp_path / "job.json"
    f.write_text(json.dumps(_d(tp=1)))
    r = cli("plan", f, "--no-synth", "--no-cache")
    assert r.code == 0, r.err[-2000:]
    assert "memory per GPU" in r.out and "of 80 GiB" in r.out


def test_a_sweep_lists_points_that_do_not_fit_as_skipped():
    j = job_from_dict(_d({"layers": 32, "hidden": 4096, "seq_len": 4096}, tp=1, pp=2))
    points = sweep(j, parse_sweep(["recompute=none,full"]), Pricer(cache=None, synth=False))
    by = {p.overrides["recompute"]: p for p in points}
    assert by["full"].plan is not None
    assert by["none"].plan is None and "peak memory per GPU" in by["none"].skipped
