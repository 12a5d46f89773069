"""``flowride export --mscclpp DIR`` (issue #36): a synthesized schedule, or each size range of a
range export, written as an MSCCL++ execution plan that ``flowride verify`` accepts."""

from __future__ import annotations

import json

import pytest

from clirun import assert_clean_error, cli
from flowride.cli import main
from flowride.program import verify_mscclpp


@pytest.fixture(scope="module")
def schedules(tmp_path_factory):
    """One synthesis per collective on two ndv2 chassis (memory channels inside a chassis, port channels across)."""
    d = tmp_path_factory.mktemp("scheds")
    out = {}
    for coll in ("allgather", "alltoall", "reducescatter", "allreduce"):
        out[coll] = d / f"{coll}.json"
        assert main(["synth", "-t", "ndv2", "--chassis", "2", "-c", coll, "-s", "1MB", "--time-limit", "10", "-o", str(out[coll])]) == 0
    return out


@pytest.mark.parametrize("coll", ["allgather", "alltoall", "reducescatter", "allreduce"])
@pytest.mark.parametrize("proto", ["Simple", "LL"])
def test_export_a_schedule_then_verify_the_plan(tmp_path, capsys, schedules, coll, proto):
    out = tmp_path / "plans"
    assert main(["export", str(schedules[coll]), "--mscclpp", str(out), "--proto", proto]) == 0
    (plan,) = out.glob("*.json")
    data = json.loads(plan.read_text())
    assert data["collective"] == coll and data["protocol"] == proto and len(data["gpus"]) == 16
    kinds = {c["channel_type"] for g in data["gpus"] for c in g["channels"]}
    assert kinds == {"memory", "port"}
    v = verify_mscclpp(plan)
    assert v.collective == coll and v.sim is not None and v.sim.valid  # raises InvalidSchedule if not
    capsys.readouterr()
    assert main(["verify", str(plan)]) == 0
    assert "valid" in capsys.readouterr().out


def test_export_both_formats_at_once(tmp_path):
    sched = tmp_path / "s.json"
    assert main(["synth", "-t", "dgx1", "-c", "allgather", "-s", "64KB", "-o", str(sched)]) == 0
    assert main(["export", str(sched), "--msccl", str(tmp_path / "a.xml"), "--mscclpp", str(tmp_path / "p")]) == 0
    assert (tmp_path / "a.xml").exists() and len(list((tmp_path / "p").glob("*.json"))) == 1


def test_export_refusals_are_one_line(tmp_path):
    sched = tmp_path / "s.json"
    assert main(["synth", "-t", "dgx1", "-c", "allgather", "-s", "64KB", "-o", str(sched)]) == 0
    assert_clean_error(cli("export", sched), 2, "--msccl", "--mscclpp")
    assert_clean_error(cli("export", sched, "--mscclpp", tmp_path / "p", "--proto", "LL128"), 2, "--proto", "LL128")
    assert_clean_error(cli("export", "-t", "dgx1", "--mscclpp", tmp_path / "p", "--nccl-tuner", tmp_path / "t.csv"), 2,
                       "--mscclpp")
    assert not (tmp_path / "p").exists()


def test_range_export_writes_one_plan_per_range(tmp_path):
    """Each range's plan carries the range's inclusive bounds, is listed in ranges.json, and verifies."""
    out, pp = tmp_path / "out", tmp_path / "out" / "mscclpp"
    r = cli("export", "-t", "ring", "--n", "4", "-c", "allgather", "--sizes", "1KB:4MB:x4", "--out-dir", out, "--mscclpp", pp)
    assert r.code == 0, r.err
    ranges = json.loads((out / "ranges.json").read_text())["ranges"]
    assert len(ranges) == len(list(pp.glob("*.json"))) >= 1
    for rg in ranges:
        data = json.loads((tmp_path / "out" / "mscclpp" / rg["mscclpp"].split("/")[-1]).read_text())
        assert data["min_message_size"] == rg["min_bytes"]
        assert data["max_message_size"] == (rg["max_bytes"] or 2**64 - 1)
        assert data["protocol"] == ("LL" if rg["proto"] == "LL" else "Simple")
        assert verify_mscclpp(rg["mscclpp"]).collective == "allgather"  # raises InvalidSchedule if not
