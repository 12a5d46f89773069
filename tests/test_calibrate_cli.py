"""`flowride calibrate` and `flowride predict` end to end: a log built from a published curve,
fitted, then predicted back; the refusals are one line naming what to change."""

from __future__ import annotations

import json
import statistics

import pytest

from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.runtime.measured import curve
from nccl_tests_logs import make_log

MIB = 1 << 20
FABRIC2 = ("-t", "fabric", "--node", "dgx-h100", "--nodes", "2")


def _log(tmp_path, curve_id: str, n: int, hosts: int) -> tuple:
    c = curve(curve_id)
    pts = [(p.bytes, p.time_us, p.time_us) for p in c.points]
    path = tmp_path / f"{curve_id}.log"
    path.write_text(make_log("allreduce", n, pts, hosts=hosts))
    return c, path


def test_calibrate_then_predict_reproduces_the_curve(tmp_path):
    """As a user runs it: the log of their cluster in, a profile out, predict with it."""
    c, log = _log(tmp_path, "hgx_h100_2node_allreduce_ib400_nccl2262_i309", 16, 2)
    prof = tmp_path / "p.json"
    r = cli("calibrate", "--nccl-tests", log, *FABRIC2, "-o", prof, timeout=300)
    assert r.code == 0, r.err
    assert "median |predicted/measured - 1|" in r.out and "profile written to" in r.out
    doc = json.loads(prof.read_text())
    assert doc["schema"] == "flowride.calibration/1" and doc["fitted_on"] == [str(log)]
    assert doc["cluster"]["nodes"] == 2 and doc["fields_fitted"]
    sizes = ",".join(str(p.bytes) for p in c.points if p.bytes >= MIB)
    ran = cli("predict", *FABRIC2, "-c", "allreduce", "--sizes", sizes, "--calibration", prof, "--json", timeout=120)
    assert ran.code == 0, ran.err
    p = json.loads(ran.out)
    measured = {pt.bytes: pt.time_us for pt in c.points}
    errs = [abs(row["time_us"] / measured[row["bytes"]] - 1) for row in p]
    assert statistics.median(errs) <= 0.05
    assert all(row["modelled"] and row["algorithm"] and row["model_error"] is not None for row in p)


def test_predict_prints_what_nccl_tests_would_with_the_model_labelled(capfd):
    r = cli_here(capfd, "predict", "-t", "fabric", "--node", "dgx-h100", "--nodes", "1", "-c", "allreduce", "-b", "1K", "-e", "1G",
                 "-f", "32")
    assert r.code == 0, r.err
    assert "modelled (NCCL's cost model, fitted: dgx-h100)" in r.out and "model" in r.out
    lines = [ln.split() for ln in r.out.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert [int(ln[0]) for ln in lines] == [1024, 32768, 1048576, 33554432, 1073741824]
    assert lines[0][4] == "ring" and lines[-1][4] == "nvls"  # NCCL's choice on one H100 node (nccl-tests#309)


def test_predict_with_nccls_own_model_and_a_forced_algorithm(capfd):
    r = cli_here(capfd, "predict", *FABRIC2, "-c", "allgather", "--sizes", "1M,64M", "--calibration", "nccl",
                 "--algorithm", "ring", "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)
    assert [x["bytes"] for x in rows] == [MIB, 64 * MIB] and {x["algorithm"] for x in rows} == {"ring"}


@pytest.mark.parametrize("args,needles", [
    (["predict", *FABRIC2, "-c", "allreduce"], ["-b/--sizes", "no size given"]),
    (["predict", *FABRIC2, "-c", "allreduce", "--sizes", "1M", "--calibration", "nope.json"], ["--calibration", "nope.json"]),
    (["predict", "-t", "fabric", "--node", "dgx-a100", "--nodes", "1", "-c", "allreduce", "--sizes", "1M", "--algorithm", "nvls"],
     ["--algorithm", "no nvls"]),
])
def test_predict_refusals_are_one_line(capfd, args, needles):
    assert_clean_error(cli_here(capfd, *args), 2, *needles)


def test_calibrate_refuses_a_log_of_another_cluster_and_a_bad_log(tmp_path, capfd):
    _c, log = _log(tmp_path, "aws_p5_1node_allreduce", 8, 1)
    r = cli_here(capfd, "calibrate", "--nccl-tests", log, *FABRIC2, "-o", tmp_path / "p.json")
    assert_clean_error(r, 2, "--nccl-tests", "8 ranks", "16 GPUs")
    text = log.read_text().splitlines()
    bad = next(i for i, ln in enumerate(text) if ln.strip().startswith("1024 "))
    text[bad] = text[bad].replace("1024", "-1024", 1)
    log.write_text("\n".join(text) + "\n")
    r = cli_here(capfd, "calibrate", "--nccl-tests", log, "-t", "fabric", "--node", "dgx-h100", "--nodes", "1", "-o", tmp_path / "p.json")
    assert_clean_error(r, 2, f"line {bad + 1}")
    assert not (tmp_path / "p.json").exists()


def test_a_one_node_calibration_moves_the_nodes_fields_and_is_read_back(tmp_path, capfd):
    _c, log = _log(tmp_path, "aws_p5_1node_allreduce", 8, 1)
    prof = tmp_path / "p.json"
    r = cli_here(capfd, "calibrate", "--nccl-tests", log, "-t", "fabric", "--node", "dgx-h100", "--nodes", "1", "-o", prof)
    assert r.code == 0, r.err
    doc = json.loads(prof.read_text())
    assert set(doc["fields_fitted"]) <= {"floor_us", "bw_intra", "ramp_MiB", "lat_intra", "launch_us", "nvls_eff", "lat_nvls"}
    assert doc["summary"]["median_err_ge_1MiB"] <= 0.10
