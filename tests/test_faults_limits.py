"""Work too large to finish (issue #16, class 5): refused up front, with the size and the limit,
instead of a hang, an exhausted memory or a crash in native code.

"Up front" is judged on CPU time (``within``), a generous multiple of what the refusal costs and
far below what the work would: the work here is hours of solving, terabytes, or a loop that never
ends. Most cases call ``main()`` in this process (clihere), the refusal only; one per kind runs
as a user does, a subprocess."""

from __future__ import annotations

import json

import pytest

import flowride.comm.launch as comm_launch
from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.sizes import MAX_CHUNKS, MAX_NODES

# ------------------------------------------------------------------ class 5: unbounded work


def _ring_json(n: int) -> dict:
    return {"schema": "flowride.topology/1", "name": "big",
            "nodes": [{"id": i} for i in range(n)],
            "links": [{"src": i, "dst": (i + 1) % n, "bandwidth_GBps": 50} for i in range(n)]}


def test_a_10000_node_topology_is_refused_quickly(tmp_path):
    """As a process: reading a file over the node limit costs about a second of CPU (the
    interpreter, the imports, the JSON); solving on 10,000 nodes would not end."""
    p = tmp_path / "big.json"
    p.write_text(json.dumps(_ring_json(10_000)))
    assert_clean_error(cli("synth", "-t", p, "-s", "1MB"), 2, "nodes", f"over the limit of {MAX_NODES:,}", within=10)


HUGE = [
    (["synth", "-t", "ring", "--n", "100000", "-s", "1MB"], "--n"),
    (["topology", "-t", "torus", "--rows", "100000", "--cols", "100000"], "--rows"),
    (["topology", "-t", "torus", "--rows", "4096", "--cols", "4096"], "rows x cols"),  # each fine, the product not
    (["topology", "-t", "full", "--n", "4096"], "links"),
    (["synth", "-t", "ring", "--n", "8", "-s", "1MB", "--chunks", "100000"], "--chunks"),
    (["synth", "-t", "ring", "--n", "8", "-s", "1MB", "--epoch", "1e-30"], "--epoch"),
    (["synth", "-t", "ring", "--n", "8", "-s", "1e30GB"], "--size"),
    (["schedule-show", "1f1b", "--stages", "2000", "--microbatches", "2000"], "--stages"),
    (["schedule-show", "1f1b", "--stages", "64", "--microbatches", "2000"], "--microbatches"),
    (["synth", "-t", "torus", "--rows", "8", "--cols", "8", "-s", "1GB", "--chunks", "1000"], "--time-limit"),
    # a factor just above 1: each step rounds to the same size, and the loop used to run for hours
    (["synth", "-t", "ring", "-b", "8", "-e", "1G", "-f", "1.0000000001"], "-b/--minbytes .. -e/--maxbytes"),
    (["synth", "-t", "ring", "--sizes", "8:1G:x1.0000000001"], "--sizes"),
]


@pytest.mark.parametrize(("args", "needle"), HUGE, ids=[f"{a[0]} {n}" for a, n in HUGE])
def test_huge_requests_are_refused_up_front(capfd, args, needle):
    line = assert_clean_error(cli_here(capfd, *args), 2, needle, within=10)
    assert any(w in line for w in ("limit", "outside", "over", "<=", "needed")), line


def test_a_huge_sweep_is_refused_up_front_as_a_process_sees_it():
    """The loop that used to run for hours, end to end: one line, exit 2, about a second of CPU."""
    line = assert_clean_error(cli("synth", "-t", "ring", "--sizes", "8:1G:x1.0000000001"), 2, "--sizes", within=10)
    assert "limit" in line or "over" in line, line


def test_a_run_larger_than_memory_is_refused_before_any_rank_starts(tmp_path, capfd, monkeypatch):
    """The launcher's memory check refuses it; no rank group (the ranks' rendezvous store) is
    ever made: its constructor here fails the test if it is called."""
    sched = tmp_path / "s.json"
    assert cli_here(capfd, "synth", "-t", "ring", "--n", "2", "-s", "64KB", "-o", sched).code == 0

    def no_ranks(*a, **k):
        raise AssertionError("a rank group was started for a run over the machine's memory")

    monkeypatch.setattr(comm_launch, "RankGroup", no_ranks)
    line = assert_clean_error(cli_here(capfd, "run", sched, "--size", "100TB"), 2, "--size", "GiB")
    assert "this machine" in line


def test_a_schedule_file_over_the_limits_is_refused(tmp_path, capfd):
    from flowride.api import synthesize
    from flowride.topology import ring

    d = synthesize(ring(3), "allgather", 1 << 16, "fast").schedule.to_dict()
    d["chunks"] = MAX_CHUNKS * 100
    (tmp_path / "s.json").write_text(json.dumps(d))
    assert_clean_error(cli_here(capfd, "verify", tmp_path / "s.json"), 2, "chunks", "over the limit", within=10)
