"""The published TE-CCL NDv2 2-chassis AllGather results, reproduced with the compat variant.

Epochs and finish times must equal the published TE-CCL results (tests/data/teccl_published_ndv2_2chassis.csv,
a copy of the table published with the TE-CCL artifact).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from flowride.api import synthesize
from flowride.topology import ndv2
from flowride.units import parse_size

REF = Path(__file__).resolve().parent / "data" / "teccl_published_ndv2_2chassis.csv"


def published(variant: str, size: str) -> dict:
    with open(REF) as f:
        for r in csv.DictReader(f):
            if r["collective"] == "AllGather" and r["variant"] == variant and r["size"] == size:
                return r
    raise KeyError((variant, size))


@pytest.mark.parametrize(("variant", "size"), [("Slow", "1MB"), ("Slow", "16MB"), ("Slow", "1GB"), ("Fast", "1GB")])
def test_matches_published_epochs_and_finish(variant, size):
    ref = published(variant, size)
    out = synthesize(ndv2(2, teccl_compat=True), "allgather", parse_size(size), variant.lower(), time_limit=None)  # untimed: "optimal" is the search's, not the machine's
    rep = out.report()
    assert rep["verified"]
    assert rep["epoch_duration_us"] == pytest.approx(float(ref["epoch_duration_s"]) * 1e6)
    assert rep["epochs"] == int(ref["epochs_required"])
    assert rep["finish_time_us"] == pytest.approx(float(ref["collective_finish_time_us"]))
    assert rep["algbw_GBps"] == pytest.approx(float(ref["algo_bandwidth_GBps"]))
    assert rep["status"] == "optimal"  # and proven minimal in our model


def test_default_ndv2_is_16_real_gpus_and_no_slower_than_bound():
    out = synthesize(ndv2(2), "allgather", parse_size("1GB"), "slow", time_limit=300)
    rep = out.report()
    assert rep["gpus"] == 16 and rep["verified"]
    assert rep["finish_time_us"] >= rep["lower_bound_us"]
