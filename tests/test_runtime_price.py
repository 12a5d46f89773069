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
