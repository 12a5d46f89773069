"""benchmarks/gpu_harvest.py, the one GPU measurement of issue #33, kept runnable on the CPU: the
same arms at toy size, its JSON and table, and the repricing of a saved run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harvest_fixtures.shared import NORMAL_PRIORITY

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(400)


@pytest.mark.slow  # the benchmark script end to end, about 80 s on 2 cores: `make test-slow`
def test_the_gpu_benchmark_runs_its_arms_on_the_cpu(tmp_path):
    """At toy size: two stages (the real one last, as by default), blocks of one iteration (the
    fewest that pair), and no time budget: on a busy machine an arm must not be left out for
    lack of time (the budget is for a lent GPU's hour)."""
    out = tmp_path / "g.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_harvest.py"), "--run-dir", str(tmp_path / "run"),
                        "--out", str(out), "--arms", "none,freeride", "--stages", "2", "--pairs", "2", "--block", "1",
                        "--tasks", "gpu-pagerank", "--budget-s", "100000"],
                       capture_output=True, text=True, timeout=380, cwd=ROOT, env={**os.environ, **NORMAL_PRIORITY})
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["config"]["rehearse_stage"] == 1 and doc["alone"]["rehearsal"]["planned_by_type_s"]
    arms = {r["arm"]: r for r in doc["arms"]}
    assert set(arms) == {"none", "freeride"} and arms["none"]["side_steps"] == 0
    fr = arms["freeride"]
    assert fr["side_steps"] > 0 and fr["efficiency"] > 0 and fr["losses_identical"] is True
    assert fr["ci95"][0] <= fr["overhead_pct"] <= fr["ci95"][1]
    assert set(fr["overrun_by_type"]) <= {"A", "B", "C", "D", "S"}
    assert doc["profiles"]["gpu-pagerank"]["warmup_steps"] == 3 and doc["profiles"]["gpu-pagerank"]["units_per_step"] == 2
    assert "no MPS arms: no GPU" in doc["notes"]
    assert "| freeride |" in p.stdout


def test_a_saved_run_is_repriced_at_its_warm_step_time():
    """The H200 run's profiles counted a cold first step: repriced from the warm median step, the
    work is the same and only X changes (its dedicated seconds, efficiency and value scale alike)."""
    src = ROOT / "benchmarks" / "data" / "gpu_harvest_h200.json"
    doc = json.loads(src.read_text())
    before = {r["arm"]: r for r in json.loads(src.read_text())["arms"]}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from gpu_harvest import reprice
    finally:
        sys.path.pop(0)
    notes = reprice(doc, {"gpu-cnn": 32, "gpu-pagerank": 2, "gpu-image": 4})
    assert len(notes) == 3
    fr, old = {r["arm"]: r for r in doc["arms"]}["freeride"], before["freeride"]
    x = {n: p["throughput"] for n, p in doc["profiles"].items()}
    assert x["gpu-pagerank"] == pytest.approx(2 / doc["profiles"]["gpu-pagerank"]["median_step_s"])
    assert old["efficiency"] == pytest.approx(3.91, abs=0.01) and fr["efficiency"] == pytest.approx(0.80, abs=0.01)
    assert fr["cost"]["value_term"] / fr["efficiency"] == pytest.approx(old["cost"]["value_term"] / old["efficiency"])
    assert fr["overhead_pct"] == old["overhead_pct"]
