"""``flowride export --mscclpp DIR`` (issue #36): a synthesized schedule, or each size range of a
range export, written as an MSCCL++ execution plan that ``flowride verify`` accepts.

Most cases call ``main()`` in this process (its return is the exit code); one refusal and one
export run as a user runs them. The 16-chunk ring, the costly synthesis, is made once."""

from __future__ import annotations

import json

import pytest

from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.cli import main
from flowride.program import verify_mscclpp
from flowride.program.mscclpp_read import load_plan


@pytest.fixture(scope="module")
def schedules(tmp_path_factory):
    """One synthesis per collective on GPUs 0, 1, 8 and 9 of two DGX H100 nodes: memory channels
    inside a node, port channels across; one chunk, so each GPU's thread block stays within the
    MSCCL++ executor's 64 ops."""
    d = tmp_path_factory.mktemp("scheds")
    out = {}
    for coll in ("allgather", "alltoall", "reducescatter", "allreduce"):
        out[coll] = d / f"{coll}.json"
        assert main(["synth", "-t", "fabric", "--node", "dgx-h100", "--nodes", "2", "--ranks", "0,1,8,9", "--relay", "off",
                     "-c", coll, "-s", "64KB", "--chunks", "1", "--time-limit", "10", "-o", str(out[coll])]) == 0
    return out


@pytest.mark.parametrize("coll", ["allgather", "alltoall", "reducescatter", "allreduce"])
@pytest.mark.parametrize("proto", ["Simple", "LL"])
def test_export_a_schedule_then_verify_the_plan(tmp_path, capsys, schedules, coll, proto):
    out = tmp_path / "plans"
    assert main(["export", str(schedules[coll]), "--mscclpp", str(out), "--proto", proto]) == 0
    (plan,) = out.glob("*.json")
    data = json.loads(plan.read_text())
    assert data["collective"] == coll and data["protocol"] == proto and len(data["gpus"]) == 4
    kinds = {c["channel_type"] for g in data["gpus"] for c in g["channels"]}
    assert kinds == {"memory", "port"}
    v = verify_mscclpp(plan)
    assert v.collective == coll and v.sim is not None and v.sim.valid and v.limits == []  # raises InvalidSchedule if not
    capsys.readouterr()
    assert main(["verify", str(plan)]) == 0
    assert "valid" in capsys.readouterr().out


def test_export_both_formats_at_once(tmp_path):
    sched = tmp_path / "s.json"
    assert main(["synth", "-t", "dgx1", "-c", "allgather", "-s", "64KB", "-o", str(sched)]) == 0
    assert main(["export", str(sched), "--msccl", str(tmp_path / "a.xml"), "--mscclpp", str(tmp_path / "p")]) == 0
    assert (tmp_path / "a.xml").exists() and len(list((tmp_path / "p").glob("*.json"))) == 1


def test_export_refusals_are_one_line(tmp_path, capfd):
    sched = tmp_path / "s.json"
    assert main(["synth", "-t", "dgx1", "-c", "allgather", "-s", "64KB", "-o", str(sched)]) == 0
    assert_clean_error(cli("export", sched), 2, "--msccl", "--mscclpp")
    assert_clean_error(cli_here(capfd, "export", sched, "--mscclpp", tmp_path / "p", "--proto", "LL128"), 2, "--proto", "LL128")
    assert_clean_error(cli_here(capfd, "export", "-t", "dgx1", "--mscclpp", tmp_path / "p", "--nccl-tuner", tmp_path / "t.csv"), 2,
                       "--mscclpp")
    assert not (tmp_path / "p").exists()


@pytest.fixture(scope="module")
def ring8_16(tmp_path_factory):
    """An 8-GPU ring AllGather in 16 chunks: 530 ops on GPU 0, over one thread block's 64."""
    sched = tmp_path_factory.mktemp("ring8") / "s.json"
    assert main(["synth", "-t", "ring", "--n", "8", "-c", "allgather", "-s", "1MB", "--chunks", "16", "-o", str(sched)]) == 0
    return sched


def test_a_plan_over_the_executors_limits_is_refused_not_written(tmp_path, monkeypatch, capsys):
    """A plan that no spread fits into the thread blocks allowed is refused in one line naming the
    limit and the fix, and nothing is written. (Schedules synthesized for the issue's topologies
    now fit the executor's tables, so the tables are shrunk here, to one thread block of 8 ops, to
    reach the refusal; a 4-GPU ring in 4 chunks needs 4 such blocks, and the search for a spread
    that fits is short, where the 16-chunk ring's takes seconds.)"""
    import flowride.program.mscclpp_rules as rules

    sched = tmp_path / "s.json"
    assert main(["synth", "-t", "ring", "--n", "4", "-c", "allgather", "-s", "1MB", "--chunks", "4", "-o", str(sched)]) == 0
    monkeypatch.setattr(rules, "MAX_THREADBLOCKS", 1)
    monkeypatch.setattr(rules, "MAX_OPERATION", 8)
    capsys.readouterr()
    assert main(["export", str(sched), "--mscclpp", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "--mscclpp" in err and "over the 1 that can all be resident" in err and "--chunks" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not list((tmp_path / "p").glob("*.json")) if (tmp_path / "p").exists() else True


def test_sixteen_chunks_of_a_ring_now_fit_in_thread_blocks(tmp_path, capfd, ring8_16):
    """What the one-thread-block writer refused (530 ops on GPU 0) is spread over thread blocks
    that each keep within 64 ops, and verifies. The export as a process; verify in this one."""
    from flowride.program.mscclpp_rules import MAX_OPERATION, check_limits

    r = cli("export", ring8_16, "--mscclpp", tmp_path / "p")
    assert r.code == 0, r.err
    plan = load_plan(tmp_path / "p" / "s.mscclpp-plan.json")
    assert check_limits(plan) == []
    assert max(len(tb.ops) for g in plan.gpus for tb in g.threadblocks) <= MAX_OPERATION
    assert max(len(g.threadblocks) for g in plan.gpus) > 1
    assert cli_here(capfd, "verify", tmp_path / "p" / "s.mscclpp-plan.json").code == 0


def test_range_export_writes_one_plan_per_range(tmp_path, capfd):
    """Each range's plan carries the range's inclusive bounds, is listed in ranges.json, and verifies."""
    out, pp = tmp_path / "out", tmp_path / "out" / "mscclpp"
    r = cli_here(capfd, "export", "-t", "ring", "--n", "4", "-c", "allgather", "--sizes", "1KB:4MB:x4", "--out-dir", out, "--mscclpp", pp)
    assert r.code == 0, r.err
    ranges = json.loads((out / "ranges.json").read_text())["ranges"]
    fit = [rg for rg in ranges if "mscclpp" in rg]
    assert len(fit) == len(list(pp.glob("*.json"))) >= 1
    assert all("64" in rg["mscclpp_refused"] for rg in ranges if "mscclpp" not in rg)
    for rg in fit:
        data = json.loads((tmp_path / "out" / "mscclpp" / rg["mscclpp"].split("/")[-1]).read_text())
        assert data["min_message_size"] == rg["min_bytes"]
        assert data["max_message_size"] == (rg["max_bytes"] or 2**64 - 1)
        assert data["protocol"] == ("LL" if rg["proto"] == "LL" else "Simple")
        assert verify_mscclpp(rg["mscclpp"]).collective == "allgather"  # raises InvalidSchedule if not


def test_verify_calls_a_plan_over_the_limits_invalid(tmp_path, capfd, ring8_16):
    """A plan the executor would refuse to launch (all of a GPU's ops in one thread block, over 64)
    is invalid (exit 1)."""
    from flowride.program import lower
    from flowride.program.mscclpp_write import build_plan
    from flowride.schedule import load_schedule

    sched = load_schedule(ring8_16)
    obj = build_plan(lower(sched), sched.topology, op_budget=10**6).to_json()
    path = tmp_path / "big.json"
    path.write_text(json.dumps(obj))
    r = cli_here(capfd, "verify", path)
    assert r.code == 1 and "64" in r.err and "Traceback" not in r.err, r.err


def test_a_plan_of_one_schedule_says_what_it_is_and_which_sizes_it_is_for(tmp_path, capsys, schedules):
    """The file name says it is a plan; by default MSCCL++ may pick it only at the size the schedule
    was synthesized for (flowride's size: AllGather's output), and the CLI says so; --plan-sizes
    widens it; a bad range is one line."""
    sched = json.loads(schedules["allgather"].read_text())
    out = tmp_path / "plans"
    capsys.readouterr()
    assert main(["export", str(schedules["allgather"]), "--mscclpp", str(out)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    (plan,) = out.glob("*.json")
    assert plan.name.endswith(".mscclpp-plan.json")
    data = json.loads(plan.read_text())
    size = sched["size_bytes"] if "size_bytes" in sched else data["min_message_size"]
    assert data["min_message_size"] == data["max_message_size"] == size and f"{size:,}..{size:,} bytes" in said
    wide = tmp_path / "wide"
    assert main(["export", str(schedules["allgather"]), "--mscclpp", str(wide), "--plan-sizes", "1KiB:max"]) == 0
    (plan,) = wide.glob("*.json")
    data = json.loads(plan.read_text())
    assert (data["min_message_size"], data["max_message_size"]) == (1024, (1 << 64) - 1)
    capsys.readouterr()
    assert main(["export", str(schedules["allgather"]), "--mscclpp", str(tmp_path / "bad"), "--plan-sizes", "64MiB:1MiB"]) == 2
    assert "--plan-sizes" in capsys.readouterr().err
