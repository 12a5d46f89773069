"""flowride's schedules priced as the runtime would run them (synth/runtime_price.py), by the
same calibrated model that predicts NCCL, and `flowride predict --synth`."""

from __future__ import annotations

import json

import pytest

from clihere import cli_here
from flowride.runtime.defaults import builtin
from flowride.runtime.predict import choose
from flowride.synth.bounds import lower_bounds
from flowride.synth.nccl import machine, model_nccl
from flowride.synth.runtime_price import PROTOCOL_SHARE, best_runtime_price, runtime_price
from flowride.topology.fabrics import build_fabric

MIB = 1 << 20


@pytest.fixture(scope="module")
def h100x2():
    return build_fabric("dgx-h100", 2)


def test_nccls_own_ring_priced_as_a_schedule_meets_its_closed_form(h100x2):
    """The check of the method: NCCL's ring AllGather, modelled as a schedule and priced step by
    step, against the calibrated closed form of the same ring, at a size where bandwidth rules."""
    cal = builtin("dgx-h100", 2).calibration
    ring = model_nccl(h100x2, "allgather", 256 * MIB).algorithms["ring"]
    priced = runtime_price(ring.schedule, "Simple", cal)
    closed = choose("allgather", machine(h100x2), 256 * MIB, cal, algorithm="ring")
    assert closed.protocol == "Simple" and priced.time_us == pytest.approx(closed.time_us, rel=0.10)
    assert priced.crosses_nodes and priced.floor_us > 0


def test_a_price_is_never_below_the_schedules_bound_and_each_protocol_costs_its_share(h100x2):
    cal = builtin("dgx-h100", 2).calibration
    ring = model_nccl(h100x2, "allgather", 16 * MIB).algorithms["ring"]
    bound_us = lower_bounds(h100x2, ring.schedule.demand).best_s * 1e6
    prices = {p: runtime_price(ring.schedule, p, cal) for p in PROTOCOL_SHARE}
    assert all(r.time_us >= bound_us for r in prices.values())
    assert best_runtime_price(ring.schedule, cal).time_us == min(r.time_us for r in prices.values())
    big = model_nccl(h100x2, "allgather", 256 * MIB).algorithms["ring"]
    at_256 = {p: runtime_price(big.schedule, p, cal).time_us for p in PROTOCOL_SHARE}
    assert min(at_256, key=at_256.get) == "Simple" and at_256["LL"] > 1.5 * at_256["Simple"]  # where bandwidth rules


def test_a_reduction_is_priced_by_the_allgathers_it_reverses(h100x2):
    ar = model_nccl(h100x2, "allreduce", 4 * MIB).algorithms["ring"]
    with pytest.raises(ValueError, match="AllGathers it reverses"):
        runtime_price(ar.schedule, "Simple")


def test_predict_synth_prices_flowrides_schedule_beside_nccls_prediction(capfd):
    r = cli_here(capfd, "predict", "-t", "fabric", "--node", "dgx-h100", "--nodes", "1", "-c", "allgather", "--sizes", "1M",
                 "--synth", "--time-limit", "10", "--json")
    assert r.code == 0, r.err
    (row,) = json.loads(r.out)
    assert row["bytes"] == MIB and row["modelled"] and row["flowride_protocol"] in PROTOCOL_SHARE
    assert row["speedup_vs_nccl"] == pytest.approx(row["time_us"] / row["flowride_us"])
    assert row["flowride_us"] > row["flowride_epoch_model_us"] > 0  # the runtime's costs on top of the epoch model's


# ---- the report's headline (api/priced.py): one calibrated model on both sides -------------------


def test_a_reductions_headline_prices_its_allgathers_and_pays_the_floor_once(h100x2):
    from flowride.api import synthesize
    from flowride.api.priced import price_parts

    out = synthesize(h100x2, "allreduce", MIB, "fast", 4, None, method="trees")
    assert len(out.parts) == 2 and all(not any(s.reduce for s in p.sends) for p in out.parts)
    chosen = builtin("dgx-h100", 2)
    parts = [best_runtime_price(p, chosen.calibration) for p in out.parts]
    h = out.headline
    assert h.flowride.time_us == pytest.approx(parts[0].time_us + parts[1].time_us - parts[1].floor_us)
    assert h.flowride.time_us == pytest.approx(price_parts(out.parts, chosen, "hopper").time_us)
    assert h.nccl_us == pytest.approx(choose("allreduce", machine(h100x2), MIB, chosen.calibration).time_us)
    assert h.model_error == chosen.error_at(MIB) and h.speedup == pytest.approx(h.nccl_us / h.flowride.time_us)
    rep = out.report()
    assert rep["runtime_us"] >= rep["lower_bound_us"] and rep["nccl_predicted"]["algorithm"] == h.nccl_algorithm


def test_where_nccls_own_algorithm_is_the_schedule_it_is_priced_as_the_model_prices_nccl(h100x2):
    from flowride.api.priced import headline

    chosen = builtin("dgx-h100", 2)
    ring = model_nccl(h100x2, "allreduce", 4 * MIB).algorithms["ring"]
    ring.schedule.meta["method"] = "nccl ring (modelled)"
    h = headline(ring.schedule, (), ring.schedule.collective, 4 * MIB, chosen)
    assert h.flowride.time_us == pytest.approx(choose("allreduce", machine(h100x2), 4 * MIB, chosen.calibration, "ring").time_us)
    assert h.speedup <= 1 + 1e-9  # NCCL's own ring can be no faster than NCCL's choice


def test_a_topology_without_a_node_type_is_headlined_by_nccls_own_model_with_its_error_unknown():
    from flowride.api import synthesize
    from flowride.topology import ring

    out = synthesize(ring(4), "allgather", MIB, "fast", 2, None)
    pred = out.report()["nccl_predicted"]
    assert pred["calibration"].startswith("NCCL's own model") and pred["model_error"] is None
    assert out.report()["runtime_us"] > 0


def test_synth_takes_a_calibration_and_refuses_a_bad_one_before_any_work(tmp_path, capfd):
    r = cli_here(capfd, "synth", "-t", "fabric", "--node", "dgx-h100", "--nodes", "1", "-c", "allgather", "-s", "1MiB",
                 "--chunks", "2", "--calibration", "nccl", "--report", str(tmp_path / "r.json"))
    assert r.code == 0, r.err
    pred = json.loads((tmp_path / "r.json").read_text())["nccl_predicted"]
    assert pred["calibration"] == "NCCL's own model (uncorrected)" and pred["model_error"] is None
    (tmp_path / "bad.json").write_text('{"schema": "something else"}')
    bad = cli_here(capfd, "synth", "-t", "fabric", "--node", "dgx-h100", "--nodes", "1", "-s", "1MiB", "--calibration",
                   str(tmp_path / "bad.json"), "--report", str(tmp_path / "r2.json"))
    assert bad.code == 2 and "--calibration" in bad.err and len(bad.err.strip().splitlines()) == 1
    assert not (tmp_path / "r2.json").exists()


def test_nccls_algorithm_priced_as_a_schedule_sees_what_the_closed_form_cannot(h100x2):
    """On rails it meets the closed form of the same algorithm (within 10% at 256 MiB); a
    ReduceScatter is its AllGather on the reversed links, at the same price as that AllGather."""
    from flowride.api.priced import nccl_priced
    from flowride.collectives.demand import Collective

    chosen = builtin("dgx-h100", 2)
    ag = nccl_priced(h100x2, Collective.ALLGATHER, 256 * MIB, "ring", chosen)
    closed = choose("allgather", machine(h100x2), 256 * MIB, chosen.calibration, algorithm="ring").time_us
    assert ag == pytest.approx(closed, rel=0.10)
    rs = nccl_priced(h100x2, Collective.REDUCESCATTER, 16 * MIB, "ring", chosen)
    rev = nccl_priced(h100x2.reversed(), Collective.ALLGATHER, 16 * MIB, "ring", chosen)
    assert rs == pytest.approx(rev)
    assert nccl_priced(h100x2, Collective.ALLREDUCE, 16 * MIB, "nvls_tree", chosen) is None  # not built in the epoch IR


def test_a_step_pays_its_latency_once_whatever_switches_it_passes(h100x2):
    """NCCL's per-step latency is per GPU-to-GPU send: a link out of a GPU carries it (NVLink or
    the network proxy, by where it goes), a link out of a switch none."""
    from flowride.synth.runtime_price import crosses, runtime_links

    cal = builtin("dgx-h100", 2).calibration
    links = runtime_links(h100x2, cal, "LL")
    for lk, rt in zip(h100x2.links, links, strict=True):
        if h100x2.nodes[lk.src].is_gpu:
            assert rt.alpha_s > 0
        else:
            assert rt.alpha_s == 0.0
    out_of_gpu = {crosses(h100x2, lk): rt.alpha_s for lk, rt in zip(h100x2.links, links, strict=True) if h100x2.nodes[lk.src].is_gpu}
    assert out_of_gpu[True] > out_of_gpu[False]  # the proxy's step costs more than an NVLink one
