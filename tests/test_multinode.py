"""Runs across nodes: ``flowride run`` and ``flowride train`` under torchrun with ``--nnodes 2``
(two launches on this host, each its own node, rendezvous on 127.0.0.1, each in its own working
directory: nothing shared), and the clock-offset measurement that puts every rank's times on
rank 0's clock (:mod:`flowride.clocks`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from clirun import ROOT, assert_clean_error, cli
from flowride.clocks import (
    ClockOffset,
    describe,
    injected_skew,
    measure_offsets,
    offset_from_samples,
)
from flowride.errors import InputError
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.trainer import train_as_rank
from flowride.pipeline.worker import shift_record
from flowride.ranks import RANK_GROUP_ENV, launched_as_rank

NODE_TIMEOUT_S = 150  # per two-node run (about 8 s on an idle 2-core machine): a bound for "it ends", not a speed
SLACK_S = 1e-6  # clock-read granularity on top of the bound


# ---------------------------------------------------------------------------------------- clocks
def _measure_in_threads(skews: list[float], rounds: int = 8) -> list[list[ClockOffset]]:
    """measure_offsets on len(skews) gloo process groups in threads of this process (one clock,
    each rank's reads moved by its skew): what every rank got."""
    store = dist.HashStore()
    out: list = [None] * len(skews)
    errs: list = []

    def rank(r: int) -> None:
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore("clocks", store), r, len(skews), timedelta(seconds=20))
            out[r] = measure_offsets(pg, rounds=rounds, clock=lambda s=skews[r]: time.monotonic() + s)
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(e)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(len(skews))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errs, errs
    return out


def test_offsets_are_zero_within_the_bound_on_one_clock():
    got = _measure_in_threads([0.0, 0.0, 0.0])
    assert got[0] == got[1] == got[2]  # every rank gets the whole table
    table = got[0]
    assert [c.rank for c in table] == [0, 1, 2] and table[0] == ClockOffset(0, 0.0, 0.0, 0.0)
    for c in table[1:]:
        # the bound is half the best round trip seen: how small it is depends on the machine's
        # load (speed is not what this checks); that the offset lies within it does not
        assert 0 < c.error_s and c.error_s == pytest.approx(c.rtt_s / 2)
        assert abs(c.offset_s) <= c.error_s + SLACK_S, c


def test_an_injected_skew_is_recovered_within_the_bound():
    skews = [0.0, 5.0, -2.5, 1000.0]
    table = _measure_in_threads(skews)[0]
    for c, skew in zip(table, skews, strict=True):
        assert abs(c.offset_s - skew) <= c.error_s + SLACK_S, (c, skew)
        assert c.to_rank0(skew + 12.0) == pytest.approx(12.0, abs=c.error_s + SLACK_S)
    assert "rank 3" in describe([c.as_dict() for c in table])


@given(theta=st.floats(-1e4, 1e4), start=st.floats(0, 1e5),
       legs=st.lists(st.tuples(st.floats(0, 1e-2), st.floats(0, 1e-3), st.floats(0, 1e-2), st.floats(0, 1e-2)), min_size=1, max_size=20))
def test_the_ntp_estimate_is_within_half_the_best_round_trip(theta, start, legs):
    """Whatever the one-way delays (each at least zero), the true offset lies within rtt/2 of the
    estimate, and the estimate kept is the one with the smallest round trip."""
    samples, t = [], start
    for d1, busy, d2, gap in legs:
        t0 = t
        t1 = t0 + d1 + theta
        t2 = t1 + busy
        t3 = t2 - theta + d2
        samples.append((t0, t1, t2, t3))
        t = t3 + gap
    offset, err, rtt = offset_from_samples(samples)
    assert abs(offset - theta) <= err + 1e-9 * (1 + abs(theta) + start)
    assert err == pytest.approx(rtt / 2)
    assert rtt == pytest.approx(min(d1 + d2 for d1, _, d2, _ in legs), abs=1e-9 * (1 + abs(theta) + start))


def test_the_skew_hook_is_read_per_rank_and_refuses_nonsense():
    env = {"FLOWRIDE_CLOCK_SKEW": "3:1000, 1:-0.5"}
    assert [injected_skew(r, env) for r in range(4)] == [0.0, -0.5, 0.0, 1000.0]
    assert injected_skew(2, {}) == 0.0
    with pytest.raises(InputError, match="RANK:SECONDS"):
        injected_skew(0, {"FLOWRIDE_CLOCK_SKEW": "three"})


def test_shifting_a_record_moves_every_time_and_nothing_else():
    rec = {"rank": 1, "lengths": {"#0": 0.5}, "published": {"sent": 2, "dropped": 0, "seconds": 0.001},
           "iterations": [{"iteration": 0, "start": 100.0, "end": 110.0, "loss": 3.0, "free_memory": 7,
                           "records": [{"kind": "F", "mb": 0, "chunk": 1, "start": 101.0, "compute": 102.0, "end": 103.0}]}],
           "waits": [{"iteration": 0, "key": "#0", "type": "A", "start": 100.0, "end": 102.0, "predicted_s": 2.0, "announced": True}]}
    shift_record(rec, 100.0)
    it = rec["iterations"][0]
    assert (it["start"], it["end"], it["loss"], it["free_memory"]) == (0.0, 10.0, 3.0, 7)
    assert [it["records"][0][k] for k in ("start", "compute", "end")] == [1.0, 2.0, 3.0]
    w = rec["waits"][0]
    assert (w["start"], w["end"], w["predicted_s"]) == (0.0, 2.0, 2.0)
    assert rec["lengths"] == {"#0": 0.5} and rec["published"]["seconds"] == 0.001


# ---------------------------------------------------------------------------------- detection
def test_a_torchrun_rank_is_told_from_a_rank_flowride_started():
    rank_env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert launched_as_rank({**rank_env, "TORCHELASTIC_RUN_ID": "x"})
    assert launched_as_rank({**rank_env, "SLURM_PROCID": "1"})  # a Slurm or MPI script exporting the same
    assert launched_as_rank({**rank_env, "FLOWRIDE_AS_RANK": "1"})  # any other launcher, said so
    assert not launched_as_rank({**rank_env, RANK_GROUP_ENV: "1"})  # flowride's own worker
    assert not launched_as_rank({"RANK": "1", "WORLD_SIZE": "4"})
    assert not launched_as_rank({})


def test_a_world_of_the_wrong_size_names_stages(tmp_path, monkeypatch):
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(InputError, match="--stages") as e:
        train_as_rank(TrainConfig(stages=4, microbatches=4, iters=1, run_dir=str(tmp_path / "rd")))
    assert "WORLD_SIZE" in str(e.value)


FAKE_TORCHRUN = {"TORCHELASTIC_RUN_ID": "t", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


def test_side_tasks_need_torchruns_store_and_sweeps_are_refused_under_torchrun(tmp_path):
    """Side tasks under torchrun: one manager per host, whose port the host's ranks learn from
    torchrun's agent store (tests/test_task_queue.py runs it); a launcher without one is refused."""
    r = cli("train", "--side-tasks", "pagerank", "--run-dir", tmp_path / "rd", env=FAKE_TORCHRUN, timeout=60)
    assert_clean_error(r, 2, "--side-tasks", "torchrun")
    agent = {**FAKE_TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    r = cli("train", "--side-tasks", "pagerank", "--paired-block", "0", "--run-dir", tmp_path / "rd", env=agent, timeout=60)
    assert_clean_error(r, 2, "--paired-block", "--baseline-report")
    r = cli("run", tmp_path / "missing.xml", "--sizes", "1KB,2KB", env=FAKE_TORCHRUN, timeout=60)
    assert_clean_error(r, 2, "--sizes", "torchrun")


# ----------------------------------------------------------------------------- two nodes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _left(marker: str) -> list[int]:
    """Processes (torchrun agents, ranks) whose command line holds ``marker``."""
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmd and "pytest" not in cmd:
                left.append(int(pid))
    return left


def _two_nodes(tmp_path: Path, args: list[str], env: dict[str, str] | None = None) -> list[tuple[int, str, str]]:
    """``torchrun --nnodes 2 --node-rank k --nproc-per-node 2 -m flowride ARGS`` for k = 0, 1 at
    once, node k in ``tmp_path/nodek`` (``{node}`` in ARGS: that directory). Returns each node's
    (exit code, stdout, stderr); on a timeout everything started is killed and the test fails."""
    port = _free_port()
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), e.get("PYTHONPATH", "")])
    e.update({"COLUMNS": "200", "OMP_NUM_THREADS": "1", **(env or {})})
    procs = []
    for k in range(2):
        node = tmp_path / f"node{k}"
        node.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0",
               "-m", "flowride", *[a.replace("{node}", str(node)) for a in args]]
        procs.append(subprocess.Popen(cmd, cwd=node, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    outs = []
    try:
        deadline = time.monotonic() + NODE_TIMEOUT_S
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append((p.returncode, out, err))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the two-node run did not finish within {NODE_TIMEOUT_S} s")
    finally:
        for p in procs:  # torchrun passes a SIGTERM on to its ranks
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        time.sleep(0.2 if any(p.poll() is None for p in procs) else 0)
        for pid in _left(str(tmp_path)):  # the ranks run in sessions of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.kill()
            p.wait()
    return outs


def _check_offsets(offsets: list[dict], skews: dict[int, float] | None = None) -> None:
    assert [o["rank"] for o in offsets] == [0, 1, 2, 3]
    assert offsets[0]["offset_s"] == 0.0 and offsets[0]["error_s"] == 0.0
    for o in offsets[1:]:
        assert 0 < o["error_s"] < 0.05, o  # one host: well under a millisecond unless the CPUs are busy
        assert abs(o["offset_s"] - (skews or {}).get(o["rank"], 0.0)) <= o["error_s"] + SLACK_S, o


def test_run_on_two_nodes(tmp_path):
    from flowride.api import synthesize
    from flowride.program import lower
    from flowride.program.msccl_write import write_msccl
    from flowride.topology import build_topology

    sched = synthesize(build_topology("ring", n=4), "allgather", 64 * 1024, "fast").schedule
    for k in range(2):  # the algorithm file, on every node at the same (relative) path
        (tmp_path / f"node{k}").mkdir()
        write_msccl(lower(sched), tmp_path / f"node{k}" / "algo.xml")
    outs = _two_nodes(tmp_path, ["run", "algo.xml", "-s", "64KB", "--repeats", "2", "--report", "{node}/report.json"])
    (c0, out0, err0), (c1, out1, err1) = outs
    assert c0 == 0 and c1 == 0, (err0[-3000:], err1[-3000:])
    assert "allgather on 4 ranks" in out0 and "equal to torch.distributed and the definition" in out0, out0
    assert "clocks: 3 rank(s) aligned to rank 0's" in out0
    assert out1.strip() == "", out1  # node 1's ranks report nothing
    assert not (tmp_path / "node1" / "report.json").exists()
    rep = json.loads((tmp_path / "node0" / "report.json").read_text())
    assert rep["correct"] is True and rep["ranks"] == 4 and len(rep["ours_s"]) == 2
    _check_offsets(rep["clock_offsets"])
    assert _left(str(tmp_path)) == []


def test_train_on_two_nodes_with_a_skewed_clock(tmp_path):
    """Rank 3's clock reads 1000 s ahead: the offset measured recovers it, and its records land
    on rank 0's clock (else the training's window would span 1000 s)."""
    outs = _two_nodes(tmp_path, ["train", "-p", "4", "-m", "4", "--iters", "3", "--run-dir", "{node}/rd",
                                 "--report", "{node}/report.json"], env={"FLOWRIDE_CLOCK_SKEW": "3:1000"})
    (c0, out0, err0), (c1, out1, err1) = outs
    assert c0 == 0 and c1 == 0, (err0[-3000:], err1[-3000:])
    assert "bubble fraction measured" in out0 and "clocks: 3 rank(s)" in out0, out0
    assert out1.strip() == "", out1
    assert not (tmp_path / "node1" / "report.json").exists()
    rep = json.loads((tmp_path / "node0" / "report.json").read_text())
    assert rep["stages"] == 4 and len(rep["losses"]) == 3 and all(loss > 0 for loss in rep["losses"])
    assert {b["stage"] for b in rep["bubbles"]} == {0, 1, 2, 3}
    _check_offsets(rep["clock_offsets"], {3: 1000.0})
    lo, hi = rep["window_monotonic"]
    assert 0 < hi - lo < NODE_TIMEOUT_S
    # each node keeps its own ranks' records; none was shared
    assert sorted(p.name for p in (tmp_path / "node0" / "rd").glob("rank*.json")) == ["rank0.json", "rank1.json"]
    assert sorted(p.name for p in (tmp_path / "node1" / "rd").glob("rank*.json")) == ["rank2.json", "rank3.json"]
    assert _left(str(tmp_path)) == []
