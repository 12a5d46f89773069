"""End-to-end tests through the CLI: the report contract, verify, and bad input (exit 2, one line).

``python -m flowride`` runs as a user runs it where the process matters (the package's entry
point, its exit code); the other bad inputs call ``main()`` in this process, whose return value
is that exit code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flowride.cli import main

REPORT_KEYS = {
    "finish_time_us", "epochs", "epoch_duration_us", "algbw_GBps", "lower_bound_us", "baseline_us",
    "solver_time_s", "status", "verified", "gpus",
}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowride", *args], capture_output=True, text=True, timeout=300)


def test_synth_writes_schedule_and_report_then_verify(tmp_path):
    # "optimal" within synth's default 60 s search: the trees search ends in under 2 s here even
    # on a loaded 2-core machine (30x margin), so the limit does not decide the verdict
    sched, rep = tmp_path / "s.json", tmp_path / "r.json"
    p = run("synth", "--topology", "dgx1", "--collective", "allgather", "--size", "1MB", "--out", str(sched), "--report", str(rep))
    assert p.returncode == 0, p.stderr
    r = json.loads(rep.read_text())
    assert REPORT_KEYS <= set(r)
    assert r["verified"] is True and r["gpus"] == 8 and r["status"] == "optimal"
    assert r["finish_time_us"] >= r["lower_bound_us"] - 1e-9
    assert r["finish_time_us"] <= r["baseline_us"]
    assert r["algbw_GBps"] == pytest.approx(1e6 / (r["finish_time_us"] * 1e-6) / 1e9)
    assert "finish time" in p.stdout
    v = run("verify", str(sched))
    assert v.returncode == 0 and "valid" in v.stdout


def test_compat_ndv2_slow_1GB_matches_published(tmp_path, capsys):
    # the published optimum within the default 60 s search: found in about 0.5 s (100x margin)
    rep = tmp_path / "r.json"
    rc = main(["synth", "-t", "ndv2", "--chassis", "2", "--teccl-compat", "-c", "allgather", "-s", "1GB", "--epoch", "slow", "--report", str(rep)])
    assert rc == 0
    r = json.loads(rep.read_text())
    assert r["epochs"] == 10 and r["finish_time_us"] == pytest.approx(50000.0)
    assert r["gpus"] == 15 and r["algbw_GBps"] == pytest.approx(20.0)


def test_verify_rejects_a_tampered_schedule(tmp_path, capsys):
    sched = tmp_path / "s.json"
    assert main(["synth", "-t", "ring", "--n", "4", "-s", "1MB", "-o", str(sched)]) == 0
    data = json.loads(sched.read_text())
    data["sends"] = data["sends"][:-1]  # the last send completes some demand
    sched.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["verify", str(sched)]) == 1
    assert "demand not met" in capsys.readouterr().err


def test_alltoall_on_a_switch_and_time_limit(tmp_path):
    rep = tmp_path / "r.json"
    assert main(["synth", "-t", "switch", "--n", "4", "-c", "alltoall", "-s", "4MB", "--time-limit", "30", "--report", str(rep)]) == 0
    r = json.loads(rep.read_text())
    assert r["verified"] and r["status"] in ("optimal", "feasible", "timeout")  # whatever the limit cut off


def test_topology_roundtrip_through_a_file(tmp_path, capsys):
    f = tmp_path / "t.json"
    assert main(["topology", "-t", "torus", "--rows", "2", "--cols", "3", "-o", str(f)]) == 0
    rep = tmp_path / "r.json"
    assert main(["synth", "-t", str(f), "-s", "1MB", "--report", str(rep)]) == 0
    assert json.loads(rep.read_text())["gpus"] == 6


def test_topologies_lists_every_builtin(capsys):
    from flowride.topology import BUILTINS

    assert main(["topologies"]) == 0
    out = capsys.readouterr().out
    for name in BUILTINS:
        assert name in out


def test_example_topology_file_loads(capsys):
    assert main(["topology", "-t", "examples/two_chassis.json"]) == 0
    assert "GPUs" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["synth", "-t", "nosuch", "-s", "1MB"], "unknown topology"),
        (["synth", "-t", "dgx1", "-s", "0"], "--size"),
        (["synth", "-t", "dgx1", "-s", "12 parsecs"], "--size"),
        (["synth", "-t", "dgx1", "-s", "1MB", "-c", "broadcastish"], "collective"),
        (["synth", "-t", "dgx1", "-s", "1MB", "--epoch", "medium"], "--epoch"),
        (["synth", "-t", "dgx1", "-s", "1MB", "--time-limit", "-3"], "--time-limit"),
        (["synth", "-t", "dgx1", "-s", "1MB", "--chunks", "0"], "chunks"),
        (["synth", "-t", "ring", "--chassis", "2", "-s", "1MB"], "--chassis"),
        (["synth", "-t", "ring", "--n", "1", "-s", "1MB"], "--n"),
        (["synth", "-t", "dgx1"], "--size"),
        (["verify", "does/not/exist.json"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, args, needle):
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert "Traceback" not in err


def test_bad_input_through_the_package_entry_point():
    p = run("synth", "-t", "nosuch", "-s", "1MB")
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "unknown topology" in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_malformed_files_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    p = run("verify", str(bad))
    assert p.returncode == 2 and "not valid JSON" in p.stderr and "Traceback" not in p.stderr
    capsys.readouterr()
    assert main(["synth", "-t", str(bad), "-s", "1MB"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "flowride.topology/1", "nodes": [{"id": 0}, {"id": 1}], "links": [{"src": 0, "dst": 1, "bandwidth_GBps": 10}]}))
    assert main(["synth", "-t", str(wrong), "-s", "1MB"]) == 2
    assert "cannot be reached" in capsys.readouterr().err
