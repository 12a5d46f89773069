"""End to end through the CLI: reductions, MSCCL export and import, timelines, execution."""

from __future__ import annotations

import json
import struct

import pytest

from flowride.cli import main


@pytest.mark.parametrize("coll", ["reducescatter", "allreduce"])
def test_synth_reductions_verify(tmp_path, capsys, coll):
    sched, rep = tmp_path / "s.json", tmp_path / "r.json"
    assert main(["synth", "-t", "dgx1", "-c", coll, "-s", "1MB", "--chunks", "2", "-o", str(sched), "--report", str(rep)]) == 0
    r = json.loads(rep.read_text())
    assert r["verified"] is True and r["collective"] == coll
    assert r["finish_time_us"] >= r["lower_bound_us"] - 1e-9
    assert r["finish_time_us"] <= r["baseline_us"] + 1e-9
    data = json.loads(sched.read_text())
    assert all(len(s) == 5 and s[4] == 1 for s in data["sends"]) if coll == "reducescatter" else any(len(s) == 5 for s in data["sends"])
    capsys.readouterr()
    assert main(["verify", str(sched)]) == 0
    assert "valid" in capsys.readouterr().out


def test_reducescatter_on_one_way_links_is_valid(tmp_path, capsys):
    """The TE-CCL NDv2 model links the chassis one way; the AllGather runs on the reversed links."""
    rep = tmp_path / "r.json"
    assert main(["synth", "-t", "ndv2", "--chassis", "2", "-c", "reducescatter", "-s", "16MB", "--chunks", "1", "--report", str(rep)]) == 0
    r = json.loads(rep.read_text())
    assert r["verified"] and r["status"] == "optimal"


def test_tampered_reduction_names_the_double_count(tmp_path, capsys):
    sched = tmp_path / "s.json"
    assert main(["synth", "-t", "ring", "--n", "4", "-c", "reducescatter", "-s", "1MB", "-o", str(sched)]) == 0
    data = json.loads(sched.read_text())
    first = data["sends"][0]
    data["sends"].append([first[0] + 50, *first[1:]])  # the same partial sent again, later
    sched.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["verify", str(sched)]) == 1
    assert "twice" in capsys.readouterr().err


@pytest.mark.parametrize("coll", ["allgather", "alltoall", "reducescatter", "allreduce"])
def test_export_then_verify_the_xml(tmp_path, capsys, coll):
    sched, xml = tmp_path / "s.json", tmp_path / "algo.xml"
    assert main(["synth", "-t", "switch", "--n", "4", "-c", coll, "-s", "1MB", "-o", str(sched)]) == 0
    assert main(["export", str(sched), "--msccl", str(xml)]) == 0
    text = xml.read_text()
    assert text.lstrip().startswith("<algo") and f'coll="{coll}"' in text
    capsys.readouterr()
    assert main(["verify", str(xml)]) == 0
    assert "valid" in capsys.readouterr().out
    unfused = tmp_path / "unfused.xml"
    assert main(["export", str(sched), "--msccl", str(unfused), "--unfused"]) == 0
    types = {t.split('"')[0] for t in unfused.read_text().split('type="')[1:]}
    assert types <= {"s", "r", "rrc", "nop"}
    assert main(["verify", str(unfused)]) == 0


def test_show_writes_png_and_trace(tmp_path, capsys):
    sched, png, trace = tmp_path / "s.json", tmp_path / "u.png", tmp_path / "t.json"
    assert main(["synth", "-t", "dgx1", "-s", "1MB", "-o", str(sched)]) == 0
    assert main(["show", str(sched), "--png", str(png), "--trace", str(trace)]) == 0
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24])[0] > 100
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert any(n.startswith("GPU0->") for n in names)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("coll", ["allreduce"])  # an AllGather's outputs through run: test_sweeps (the run sweep, #wrong 0)
def test_run_checks_output_against_torch(tmp_path, capsys, coll):
    """Four ranks of torch.distributed (the costly part: one collective here; the reduction, whose
    partial sums make the stricter check)."""
    sched, rep = tmp_path / "s.json", tmp_path / "r.json"
    assert main(["synth", "-t", "switch", "--n", "4", "-c", coll, "-s", "64KB", "--chunks", "2", "-o", str(sched)]) == 0
    assert main(["run", str(sched), "--repeats", "2", "--timeout", "120", "--report", str(rep)]) == 0
    r = json.loads(rep.read_text())
    assert r["correct"] is True and r["ranks"] == 4 and r["ours_median_s"] > 0 and r["torch_median_s"] > 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["export", "missing.json", "--msccl", "x.xml"], "schedule"),
        (["show", "missing.json"], "--png"),
        (["run", "missing.json", "--repeats", "0"], ""),
        (["verify", "nothing.xml"], "xml"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args, needle, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    errline = capsys.readouterr().err.strip()
    assert errline.startswith("error:") and len(errline.splitlines()) == 1
    assert needle.lower() in errline.lower()


def test_verify_a_wrong_msccl_algorithm_exits_1(tmp_path, capsys):
    sched, xml = tmp_path / "s.json", tmp_path / "algo.xml"
    assert main(["synth", "-t", "ring", "--n", "4", "-c", "reducescatter", "-s", "1MB", "-o", str(sched)]) == 0
    assert main(["export", str(sched), "--msccl", str(xml)]) == 0
    text = xml.read_text()
    # turn the first reduction into a plain receive: a contribution goes missing
    xml.write_text(text.replace('type="rrc"', 'type="r"', 1))
    capsys.readouterr()
    assert main(["verify", str(xml)]) == 1
    assert capsys.readouterr().err.startswith("invalid:")


@pytest.mark.timeout(240)
def test_run_with_a_crashing_rank_fails_cleanly(tmp_path, capsys, monkeypatch):
    sched = tmp_path / "s.json"
    assert main(["synth", "-t", "ring", "--n", "4", "-s", "64KB", "-o", str(sched)]) == 0
    monkeypatch.setenv("FLOWRIDE_COMM_INJECT_FAULT", "crash:2")
    capsys.readouterr()
    assert main(["run", str(sched), "--repeats", "1", "--timeout", "120"]) == 1
    first = capsys.readouterr().err.strip().splitlines()[0]
    assert first.startswith("error: run failed") and "rank 2" in first
