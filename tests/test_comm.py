"""Schedules executed on real processes (gloo on CPU, loopback): outputs equal torch.distributed's
and the closed form; wrong programs are reported naming rank and chunk; a crashed or hung rank
fails the run, naming the rank, and leaves no process behind. Several schedules share one launch
where they can: start-up (torch import per rank) dominates on 2 cores, so one launch of 4 ranks
runs the correct schedules, the corrupted ones and the 64 MiB one; cases that only need ranks
to exist run 3.

No verdict rests on how fast a run went. When a hung run's timeout passes is decided by the
test, through the launcher's clock (:class:`LaunchClock`), once the ranks report the state the
diagnosis reads (the hung rank and its waiting peers), so a slow start on a busy machine cannot
turn the verdict.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import flowride.comm.launch as comm_launch
from flowride.api import synthesize
from flowride.collectives.demand import Collective
from flowride.comm import (
    CommFailed,
    RunResult,
    as_program,
    load_program,
    program_from_dict,
    program_to_dict,
    run_schedule,
    run_schedules,
    save_program,
    structural_problems,
)
from flowride.comm.data import (
    UNWRITTEN,
    chunk_values,
    compare_output,
    elements_per_chunk,
    expected_chunks,
)
from flowride.comm.worker import FAULT_ENV
from flowride.errors import InputError
from flowride.program import check_program
from flowride.schedule.reduce import allreduce_from_allgather, reduce_scatter_from_allgather
from flowride.topology.builtins import build_topology

pytestmark = pytest.mark.timeout(600)

KIB = 1 << 10
BIG = 64 << 20  # per rank: the size whose memory use is checked
REPORT_FIELDS = ("collective", "ranks", "size_bytes", "actual_bytes", "chunk_bytes", "chunks", "repeats", "warmup",
                 "ours_median_s", "torch_median_s", "ratio", "algbw_GBps", "correct", "errors", "backend", "device",
                 "mode", "reference")


def four_schedules(topo, chunks: int, size: int = 64 * KIB) -> list:
    """AllGather, AlltoAll, ReduceScatter, AllReduce on ``topo`` (reductions from AllGathers)."""
    rev = synthesize(topo.reversed(), "allgather", size, "fast", chunks=chunks, time_limit=20).schedule
    fwd = synthesize(topo, "allgather", size, "fast", chunks=chunks, time_limit=20).schedule
    a2a = synthesize(topo, "alltoall", size, "fast", chunks=chunks, time_limit=20).schedule
    return [fwd, a2a, reduce_scatter_from_allgather(rev, topo), allreduce_from_allgather(rev, fwd, topo)]


class LaunchClock:
    """``flowride.comm.launch``'s ``time`` module, with a clock the test moves: real time until
    the deadline is passed (:meth:`pass_deadline`, or the first look at the clock after ``when()``
    holds), then far ahead. ``sleeps_after`` counts the launcher's sleeps (its watch loop's pause
    between looks) after that: none means it acted on its first look past the deadline."""

    def __init__(self, timeout_s: float, when: Callable[[], bool] | None = None) -> None:
        self.timeout_s, self.when = timeout_s, when
        self.ahead = 0.0
        self.sleeps_after = 0

    def pass_deadline(self) -> None:
        self.ahead = self.timeout_s + 1.0

    def monotonic(self) -> float:
        if not self.ahead and self.when is not None and self.when():
            self.pass_deadline()
        return time.monotonic() + self.ahead

    def sleep(self, s: float) -> None:
        self.sleeps_after += self.ahead > 0
        time.sleep(s)

    def __getattr__(self, name: str):
        return getattr(time, name)


def workers_left(marker: str) -> list[int]:
    """Processes whose command line runs the comm worker with ``marker`` in it (psutil-free)."""
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "flowride.comm.worker" in cmd and marker in cmd:
                left.append(int(pid))
    return left


def assert_all_correct(results: list[RunResult], ranks: int) -> None:
    for r in results:
        rep = r.report()
        assert r.ok, rep["errors"]
        for key in REPORT_FIELDS:
            assert key in rep, key
        assert rep["correct"] is True and rep["ranks"] == ranks and rep["backend"] == "gloo" and rep["device"] == "cpu"
        assert len(rep["ours_s"]) == rep["repeats"] and len(rep["torch_s"]) == rep["repeats"]
        assert rep["ours_median_s"] > 0 and rep["torch_median_s"] > 0 and rep["ratio"] > 0
        assert rep["actual_bytes"] == rep["chunk_bytes"] * ranks * rep["chunks"]


# ---------------------------------------------------------------------- no processes


def test_program_json_round_trip(tmp_path):
    prog = as_program(four_schedules(build_topology("ring", n=4), 2)[3])
    again = program_from_dict(json.loads(json.dumps(program_to_dict(prog))))
    assert program_to_dict(again) == program_to_dict(prog)
    save_program(prog, tmp_path / "p.json")
    assert program_to_dict(load_program(tmp_path / "p.json")) == program_to_dict(prog)
    assert check_program(again) == []
    with pytest.raises(InputError):
        program_from_dict({"schema": "nope"})


def test_structural_problems_catch_what_would_hang():
    prog = as_program(synthesize(build_topology("ring", n=4), "allgather", 64 * KIB, "fast").schedule)
    assert structural_problems(prog) == []
    bad = copy.deepcopy(prog)
    steps = bad.gpus[1].steps
    k = next(i for i, st in enumerate(steps) if st.op == "s")
    tag, peer = steps[k].tag, steps[k].peer
    del steps[k]
    problems = structural_problems(bad)
    assert any(f"rank {peer} receives transfer {tag} from rank 1, which rank 1 never sends" in p for p in problems)
    with pytest.raises(InputError, match="never sends"):
        run_schedule(bad, repeats=0, timeout_s=5)  # refused before any process starts


def test_closed_form_data_and_comparison():
    n, C, E = 4, 2, 3000
    assert elements_per_chunk(Collective.ALLGATHER, n, C, 64 * KIB) == 64 * KIB // (n * C * 4)
    assert elements_per_chunk(Collective.ALLREDUCE, 8, 2, 1) == 1
    vals = chunk_values(2, 5, E)
    assert vals.min() >= 0 and vals.max() < 1000 and torch.equal(vals, vals.round())
    assert not torch.equal(chunk_values(1, 0, E), chunk_values(0, 1, E))
    out = torch.cat([want for _, _, want in expected_chunks(Collective.ALLTOALL, n, C, 3, E)])
    ref = out.clone()
    assert compare_output(out, Collective.ALLTOALL, n, C, 3, E, reference=ref) == []
    out[2 * E + 17] += 2
    out[5 * E:6 * E] = UNWRITTEN
    probs = compare_output(out, Collective.ALLTOALL, n, C, 3, E, reference=ref)
    assert probs[0].startswith("rank 3 chunk 2 (block from rank 1, chunk 0): element 17 is")
    assert probs[0].endswith("(torch.distributed agrees)")
    assert probs[1].startswith("rank 3 chunk 5 (block from rank 2, chunk 1): element 0 is unwritten (-1), expected")
    ref[0] += 1  # a reference that disagrees with the closed form is called out as such
    probs = compare_output(out, Collective.ALLTOALL, n, C, 3, E, reference=ref)
    assert probs[0] == f"rank 3 chunk 0 (block from rank 0, chunk 0): element 0 is {out[0]:g}, torch.distributed gives {ref[0]:g}"
    assert "torch.distributed itself gives" in probs[1]


# ---------------------------------------------------------------------- real processes


@pytest.fixture(scope="module")
def ring4_run(tmp_path_factory):
    """One launch of 4 ranks for every case that expects a finished run: the four collectives at
    1 and 2 chunks, two corrupted programs (wrong outputs are reported, the run goes on), and a
    64 MiB AllGather; with the progress events seen."""
    topo = build_topology("ring", n=4)
    scheds = four_schedules(topo, 1) + four_schedules(topo, 2)
    good = as_program(synthesize(topo, "allgather", 64 * KIB, "fast").schedule)
    swapped = copy.deepcopy(good)
    steps = swapped.gpus[2].steps
    a, b = [i for i, st in enumerate(steps) if st.op == "r"][:2]
    steps[a].dst, steps[b].dst = steps[b].dst, steps[a].dst  # two arrivals land in each other's slot
    dropped = copy.deepcopy(good)
    dropped.gpus[1].steps = [st for st in dropped.gpus[1].steps if st.op != "cpy"]  # its own block never copied
    for st in dropped.gpus[1].steps:
        st.deps = []
    big = as_program(synthesize(topo, "allgather", BIG, "fast").schedule)
    events: list[dict] = []
    rd = tmp_path_factory.mktemp("ring4") / "run"
    results = run_schedules([*scheds, swapped, dropped, big], size_bytes=[64 * KIB] * 8 + [None, None, BIG], repeats=2, warmup=1,
                            timeout_s=300, progress=events.append, run_dir=rd)
    assert workers_left(str(rd)) == []
    shutil.rmtree(rd, ignore_errors=True)
    return {"results": results, "events": events, "schedules": scheds, "swapped": sorted(steps[i].dst[1] for i in (a, b))}


def test_four_ranks_all_collectives_chunks_1_and_2(ring4_run):
    results, events = ring4_run["results"][:8], ring4_run["events"]
    # relays through GPUs without a direct link (scratch slots, store-and-forward) run here too:
    # a ring's AlltoAll cannot do without them
    assert any(g.s_chunks for g in as_program(ring4_run["schedules"][1]).gpus)
    assert [r.collective for r in results] == ["allgather", "alltoall", "reducescatter", "allreduce"] * 2
    assert [r.chunks for r in results] == [1] * 4 + [2] * 4
    assert_all_correct(results, 4)
    assert all(r.actual_bytes == 64 * KIB and r.mode == "dataflow" for r in results)
    assert {r.reference for r in results} <= {"all_gather_into_tensor", "all_gather", "all_to_all_single", "all_to_all",
                                              "isend/irecv", "reduce_scatter_tensor", "all_reduce, then slice", "all_reduce"}
    assert events[0] == {"event": "spawned", "ranks": 4} and events[-1] == {"event": "done"}
    repeats = [e for e in events if e["event"] == "repeat"]
    assert len(repeats) == 11 * 2 and repeats[0]["i"] == 1 and repeats[0]["of"] == 2
    assert [e["program"] for e in events if e["event"] == "check"] == list(range(1, 12))


def test_corrupted_programs_are_reported_naming_rank_and_chunk(ring4_run):
    swapped, dropped = ring4_run["results"][8:10]
    assert not swapped.ok and not dropped.ok
    assert swapped.report()["correct"] is False
    for c in ring4_run["swapped"]:
        assert any(e.startswith(f"rank 2 chunk {c} (block of rank ") and e.endswith("(torch.distributed agrees)")
                   for e in swapped.errors), swapped.errors
    # (what rank 2 forwards from the swapped slots is wrong downstream too; those ranks are named as well)
    assert dropped.errors[0].startswith("rank 1 chunk 1 (block of rank 1, chunk 0): element 0 is unwritten (-1)")


def test_allgather_64_mib_per_rank(ring4_run):
    r = ring4_run["results"][10]
    assert r.ok, r.errors
    assert r.collective == "allgather" and r.actual_bytes == BIG and r.chunk_bytes == BIG // 4
    # the largest rank (64 MiB output, 16 MiB input, torch's output, check temporaries) stays
    # well under 1.5 GB
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 < 1.5e9


@pytest.mark.slow  # eight gloo ranks (about 20 s); the relays it runs are in the four-rank ring above too
def test_eight_ranks_dgx1_all_collectives():
    # DGX-1 relays through GPUs without a direct link: scratch slots and store-and-forward
    scheds = four_schedules(build_topology("dgx1"), 1)
    assert any(g.s_chunks for s in scheds for g in as_program(s).gpus)
    results = run_schedules(scheds, size_bytes=64 * KIB, repeats=1, warmup=0, timeout_s=300)
    assert_all_correct(results, 8)


def test_grouped_mode_with_epoch_barriers():
    """The NCCL-style issue order (one batch per send epoch), exercised on gloo."""
    topo = build_topology("switch", n=3)
    scheds = four_schedules(topo, 2)
    results = run_schedules(scheds, size_bytes=48 * KIB + 4, repeats=1, warmup=0, timeout_s=300, mode="grouped", barrier_per_epoch=True)
    assert_all_correct(results, 3)
    assert all(r.mode == "grouped" and r.barrier_per_epoch for r in results)
    # whole elements per chunk: 3 ranks x 2 chunks of 2048 float32 elements
    assert results[0].size_bytes == 48 * KIB + 4 and results[0].actual_bytes == 48 * KIB


@pytest.fixture(scope="module")
def ring3():
    """The program the fault cases run: the fewest ranks with a rank between two peers."""
    return as_program(synthesize(build_topology("ring", n=3), "allgather", 64 * KIB, "fast").schedule)


@pytest.mark.parametrize("fault", ["crash:1", "kill:2"])
def test_dead_rank_fails_the_run_naming_it(tmp_path, ring3, fault):
    with pytest.raises(CommFailed) as info:
        run_schedule(ring3, repeats=1, warmup=0, timeout_s=300, env={FAULT_ENV: fault}, run_dir=tmp_path / "run")
    rank = int(fault.split(":")[1])
    assert info.value.rank == rank
    assert str(info.value).startswith(f"rank {rank} failed: ")
    assert ("injected crash" if fault.startswith("crash") else "SIGKILL") in str(info.value)
    assert workers_left(str(tmp_path / "run")) == []


def hang_settled(run_dir: Path, victim: int, ranks: int) -> Callable[[], bool]:
    """Whether each rank's last two reports (its state file, rewritten twice a second) agree with
    a settled hang: ``victim`` in the check run, not waiting; every other rank waiting. What the
    launcher's diagnosis reads, seen twice so that no step in passing is taken for it, and fresh
    (the launcher calls a report older than ``STALE_S`` a rank that stopped responding; a busy
    machine can delay a report, so the test waits for fresh ones instead of assuming them)."""
    seen: dict[int, list[dict]] = {r: [] for r in range(ranks)}

    def settled(r: int, st: dict) -> bool:
        return st["phase"].startswith("check run") and not st["waiting"] if r == victim else bool(st["waiting"])

    def pred() -> bool:
        for r in range(ranks):
            try:
                st = json.loads((run_dir / f"rank{r}.state").read_text())
            except (OSError, ValueError):
                continue
            if not seen[r] or seen[r][-1]["time"] != st["time"]:
                seen[r].append(st)
        fresh = all(seen[r] and time.time() - seen[r][-1]["time"] < comm_launch.STALE_S / 2 for r in range(ranks))
        return fresh and all(len(seen[r]) >= 2 and all(settled(r, st) for st in seen[r][-2:]) for r in range(ranks))

    return pred


def test_hung_rank_fails_the_run_at_the_timeout_naming_it(tmp_path, ring3, monkeypatch):
    """Rank 2 hangs (not in any wait) in the check run; once the ranks report that, the launcher's
    clock passes the run's timeout: the launcher names rank 2, says what the others wait for,
    and acts on its first look at the clock past the deadline."""
    rd = tmp_path / "run"
    timeout = 600.0  # never reached in real time: the test moves the launcher's clock past it
    clock = LaunchClock(timeout, hang_settled(rd, 2, 3))
    monkeypatch.setattr(comm_launch, "time", clock)
    with pytest.raises(CommFailed) as info:
        run_schedule(ring3, repeats=1, warmup=0, timeout_s=timeout, env={FAULT_ENV: "hang:2"}, run_dir=rd)
    assert info.value.rank == 2, str(info.value)
    assert "did not finish within 600 s: rank 2 hung in the check run, not waiting for any peer" in str(info.value)
    assert "waiting: rank 0 (" in str(info.value)  # the others say what they wait for
    assert clock.sleeps_after == 0, "the launcher slept on after its deadline had passed"
    assert workers_left(str(rd)) == []


def test_worker_under_torchrun(tmp_path):
    """The worker as torchrun starts it (rank from the environment); rank 0 prints the report.
    A line of 3 GPUs: the AlltoAll between its ends relays through the middle one."""
    prog = as_program(synthesize(build_topology("mesh", rows=1, cols=3), "alltoall", 64 * KIB, "fast").schedule)
    assert prog.gpus[1].s_chunks  # the relay's scratch slots, issued in strict list order
    save_program(prog, tmp_path / "p.json")
    # torchrun's own module, always there with torch (the console script may not be on PATH)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", "-m", "flowride.comm.worker",
                        "--program", str(tmp_path / "p.json"), "--repeats", "1", "--warmup", "0", "--timeout-s", "300",
                        "--mode", "ordered"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 reports, once
    rep = lines[0]
    assert rep["correct"] is True and rep["collective"] == "alltoall" and rep["ranks"] == 3 and rep["errors"] == []
    assert rep["mode"] == "ordered"  # strict list order: the mode the other tests do not run
    assert workers_left(str(tmp_path / "p.json")) == []
