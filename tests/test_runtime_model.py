"""The calibrated model of NCCL (flowride.runtime) against the published nccl-tests curves the
project carries: the targets of issue #49 as tolerances, so a model regression fails the suite."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.runtime.defaults import builtin, resolve
from flowride.runtime.fit import INTRA_FIELDS, judge, observed
from flowride.runtime.measured import Curve, load_curves
from flowride.runtime.nccl_tuning import IDENTITY, Calibration
from flowride.runtime.predict import busbw_factor, choose, lower_bound_us, machine_for, predict
from flowride.runtime.profile import calibration_from_dict

MIB = 1 << 20
# Curves a single calibration per node type and network cannot also describe, and why: the same
# p5 nodes as aws_p5_2node_allreduce under an older NCCL (2.18.5) and EFA plugin, 25-45% slower at
# 64 MiB-2 GiB (the curve's own notes say so). `flowride calibrate` on its log fits it (see below).
OTHER_STACK = {"aws_p5_2node_allreduce_eks_nccl2185"}


def network(c: Curve) -> str:
    return "efa" if c.id.startswith("aws") else "ib"


def median_error(judged: list) -> float:
    return statistics.median(abs(j.ratio - 1) for j in judged)


def judged_all(curves, cal_of) -> list:
    return [j for c in curves for j in judge(cal_of(c), observed([c]))]


def test_the_project_carries_every_curve_with_its_source():
    curves = load_curves()
    assert len(curves) == 17 and all(c.url.startswith("https://") and c.points for c in curves)
    assert {c.collective for c in curves} == {"allreduce", "allgather", "alltoall"}
    assert sum(p.outlier is not None for c in curves for p in c.points) >= 1  # marked, not dropped
    assert all(p.outlier is None for c in curves for p in c.usable())


def test_the_built_in_calibrations_meet_the_targets_on_the_published_curves():
    curves = [c for c in load_curves() if c.id not in OTHER_STACK]
    judged = judged_all(curves, lambda c: builtin(c.node_type, c.nodes, network(c)).calibration)
    big = [abs(j.ratio - 1) for j in judged if j.bytes >= MIB]
    small = [abs(j.ratio - 1) for j in judged if j.bytes < MIB]
    assert statistics.median(big) <= 0.10 and statistics.median(small) <= 0.20
    # every point within 1.5x, but the ring forced across two nodes (NCCL_ALGO=Ring, NCCL_MIN_CTAS=24)
    # at 1-4 MiB: 157-178 us measured, 0.57-0.65x modelled (a ring's 30 steps cost more there than
    # NCCL's per-step latencies say; the default algorithms on the same nodes are within 1.35x)
    beyond = [j for j in judged if not 1 / 1.5 <= j.ratio <= 1.5]
    assert all(j.label == "h100_2node_allreduce_ib400_ring_minctas24_i309" and j.bytes <= 4 * MIB and j.ratio > 0.55
               for j in beyond), beyond


def test_the_correction_beats_nccls_own_model_on_the_same_points():
    curves = [c for c in load_curves() if c.id not in OTHER_STACK]
    own = judged_all(curves, lambda c: IDENTITY)
    fitted = judged_all(curves, lambda c: builtin(c.node_type, c.nodes, network(c)).calibration)
    assert median_error(fitted) < 0.6 * median_error(own)


def test_two_nodes_predicted_from_the_one_node_fit_alone_stay_within_25_percent():
    """The node's part fitted on one-node curves only; crossing nodes at the NIC's line rate x 0.94
    (NCCL's maintainers: 46-48 GB/s per 400 Gb/s NIC) and nothing else fitted."""
    from dataclasses import replace

    two = [c for c in load_curves() if c.nodes == 2]
    judged = judged_all(two, lambda c: replace(IDENTITY, **{k: getattr(builtin(c.node_type, 1).calibration, k)
                                                           for k in INTRA_FIELDS}, bw_net=0.94))
    assert statistics.median(abs(j.ratio - 1) for j in judged if j.bytes >= MIB) <= 0.25


def test_nccls_stated_choice_is_the_models_choice():
    """NVIDIA's reply in nccl-tests#309: one node of 8 x H100 takes Ring/LL up to 1 MB, NVLS/Simple above."""
    c = next(c for c in load_curves() if c.id == "aws_p5_1node_allreduce")
    cal = builtin("dgx-h100", 1).calibration
    known = [(p, choose("allreduce", machine_for("dgx-h100", 1), p.bytes, cal)) for p in c.usable() if p.nccl_algorithm]
    agree = sum(e.algorithm == p.nccl_algorithm for p, e in known)
    assert len(known) >= 25 and agree >= len(known) - 1


@settings(max_examples=60, deadline=None)
@given(node=st.sampled_from(["dgx-h100", "dgx-a100", "mi300x", "h800", "hgx-b200", "a800"]), nodes=st.sampled_from([1, 2, 4, 16]),
       coll=st.sampled_from(list(Collective)), net=st.sampled_from(["ib", "efa"]), kib=st.integers(1, 1 << 22))
def test_a_prediction_is_never_below_the_bound_and_grows_with_size(node, nodes, coll, net, kib):
    m = machine_for(node, nodes)
    cal = builtin(node, nodes, net).calibration
    size = kib * 1024
    a, b = predict(coll, m, [size, 2 * size], cal)
    assert a.time_us >= lower_bound_us(coll, m, size) * (1 - 1e-9)
    assert b.time_us >= a.time_us * (1 - 1e-9)
    assert b.busbw_GBps == pytest.approx(b.algbw_GBps * busbw_factor(coll, m.ranks))


def test_named_calibrations_and_bad_profiles():
    assert resolve("nccl", "dgx-h100", 2).calibration == IDENTITY
    assert resolve(None, "dgx-h100", 2).name == "fitted: dgx-h100 + ib"
    assert resolve("efa", "dgx-h100", 2).name == "fitted: dgx-h100 + efa"
    borrowed = resolve(None, "h800", 1)
    assert borrowed.borrowed == "dgx-h100" and borrowed.error_at(MIB) is not None
    with pytest.raises(InputError, match=r"calibration.speed: not a calibration field"):
        calibration_from_dict({"speed": 1.0})
    with pytest.raises(InputError, match=r"calibration.floor_us: -1 is not a non-negative number"):
        calibration_from_dict({"floor_us": -1})
    assert calibration_from_dict({"floor_us": 3, "nvls_eff": None}) == Calibration(floor_us=3.0)
