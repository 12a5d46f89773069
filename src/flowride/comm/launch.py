"""Run a schedule on real processes on this machine, the torchrun way, and watch them.

One process per GPU of the program: ``python -m flowride.comm.worker --program p.json --out dir``
with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, each in its
own session so its whole process group can be stopped. A rank that exits with an error stops the
run at once (the first failure, by its error file's time or a signal, is the one named); a run
that is still going at ``timeout_s`` is stopped and the rank that stalled is named from the state
files the ranks keep fresh (the ranks blocked in a receive name who they wait for). No process is
left behind in either case.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from flowride.comm.result import EXIT_OK, EXIT_WRONG, RunResult
from flowride.comm.serialize import check_structure, save_program
from flowride.errors import InputError
from flowride.program import Program, lower
from flowride.ranks import JsonLines, RankGroup, pick_device
from flowride.schedule.ir import Schedule

STALE_S = 3.0  # a state file older than this belongs to a rank that stopped running


class CommFailed(RuntimeError):
    """A rank crashed or the run hung; ``rank`` is the one to blame (None if unknown)."""

    def __init__(self, rank: int | None, message: str, details: str = "") -> None:
        self.rank, self.details = rank, details
        super().__init__(message)


def as_program(schedule_or_program: Schedule | Program) -> Program:
    """A Program as is; a Schedule lowered (and verified by the simulator on the way)."""
    if isinstance(schedule_or_program, Program):
        return schedule_or_program
    if isinstance(schedule_or_program, Schedule):
        return lower(schedule_or_program)
    raise InputError("schedule", f"a {type(schedule_or_program).__name__} is neither a Schedule nor a Program", "pass a schedule or lower() it first")


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


EXTERNAL_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


ECHO_SETTLE_S = 3.0


def _is_echo(run_dir: Path, rank: int, code: int) -> bool:
    """A failure caused by a peer: a broken send/receive (CommError), or an abort with no error."""
    e = _read(run_dir / f"rank{rank}.error")
    if e is None:
        return code == -signal.SIGABRT
    return str(e.get("error", "")).startswith("CommError")


def _has_cause(run_dir: Path, bad: list[tuple[int, int]]) -> bool:
    return any((code < 0 and -code in EXTERNAL_SIGNALS) or not _is_echo(run_dir, rank, code) for rank, code in bad)


def _first_failure(run_dir: Path, bad: list[tuple[int, int]], exited_at: dict[int, float]) -> tuple[int, str]:
    """The rank that failed first. A rank killed from outside (SIGKILL, SIGTERM: the OOM killer,
    a user) is the cause, never an echo. Then a rank with its own error beats one whose send or
    receive broke because a peer went away. Otherwise the earliest failure wins: an error file's time,
    or, for a rank that left none (it aborted), when its exit was seen. Peers that fail because
    the first one closed its connections fail after it."""
    for rank, code in bad:
        if code < 0 and -code in EXTERNAL_SIGNALS:
            return rank, f"killed by signal {signal.Signals(-code).name}"
    cands = []
    for rank, code in bad:
        echo = _is_echo(run_dir, rank, code)
        e = _read(run_dir / f"rank{rank}.error")
        if e:
            cands.append((echo, e["time"], rank, e["error"]))
        else:
            try:
                why = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            except ValueError:
                why = f"exit code {code}"
            cands.append((echo, exited_at.get(rank, time.time()), rank, why))
    _, _, rank, msg = min(cands)
    return rank, msg


def _diagnose_hang(run_dir: Path, ranks: RankGroup, timeout_s: float) -> tuple[int | None, str]:
    """Blame the ranks that are not waiting for a peer (stopped or busy) for a run that timed out.
    A rank the kernel reports stopped comes first: its state file may still look fresh."""
    now = time.time()
    stopped = ranks.stopped()
    suspects: list[tuple[int, str]] = [(r, "is stopped (SIGSTOP or a debugger)") for r in stopped]
    waiting: list[str] = []
    for r, p in enumerate(ranks.procs):
        if p.poll() is not None or r in stopped:
            continue
        st = _read(run_dir / f"rank{r}.state")
        if st is None:
            suspects.append((r, "never reported (stuck starting up)"))
        elif now - st["time"] > STALE_S:
            suspects.append((r, f"stopped responding {now - st['time']:.0f} s ago, in the {st['phase']}"))
        elif not st.get("waiting"):
            suspects.append((r, f"hung in the {st['phase']}, not waiting for any peer"))
        else:
            waiting.append(f"rank {r} ({st['waiting']})")
    head = f"run did not finish within {timeout_s:g} s"
    tail = f"; waiting: {', '.join(waiting)}" if waiting else ""
    if suspects:
        desc = "; ".join(f"rank {r} {why}" for r, why in suspects)
        return suspects[0][0], f"{head}: {desc}{tail}"
    return None, f"{head}: every rank is waiting for another (a deadlock){tail}"


RUN_COPIES = 4  # buffers per rank of the run's size: input, output, scratch, torch's reference


def _memory_bytes() -> int:
    """Physical memory of this machine (0 if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def run_schedule(schedule_or_program: Schedule | Program, size_bytes: int | None = None, repeats: int = 5,
                 warmup: int = 1, timeout_s: float = 600.0, backend: str | None = None, barrier_per_epoch: bool = False,
                 progress: Callable[[dict], None] | None = None, mode: str = "auto", device: str = "auto",
                 env: dict[str, str] | None = None, run_dir: str | Path | None = None) -> RunResult:
    """Execute the schedule on one local process per GPU and compare with torch.distributed.

    ``size_bytes`` is the per-rank size in the schedule's convention (default: the schedule's
    own): the AllGather output, the AlltoAll buffer, the ReduceScatter input, the AllReduce
    buffer; the report gives the bytes that actually ran (whole float32 elements, at least one
    per chunk). ``timeout_s`` bounds the whole run, start-up included. ``progress`` receives
    dicts: ``{"event": "spawned", "ranks": N}``, ``{"event": "check", ...}``, ``{"event":
    "warmup"|"repeat", "i": i, "of": n, ...}``, ``{"event": "done"}``. ``env`` adds environment
    variables for every rank (e.g. ``FLOWRIDE_COMM_INJECT_FAULT``). ``mode``: see
    :mod:`flowride.comm.execute`. Wrong outputs come back in ``RunResult.errors``; a rank that
    crashes or hangs raises :class:`CommFailed` naming it. ``run_dir`` keeps the per-rank logs
    there (default: a temporary directory, removed afterwards)."""
    return run_schedules([schedule_or_program], size_bytes, repeats, warmup, timeout_s, backend, barrier_per_epoch,
                         progress, mode, device, env, run_dir)[0]


def run_schedules(items: list[Schedule | Program], size_bytes: int | list[int | None] | None = None, repeats: int = 5,
                  warmup: int = 1, timeout_s: float = 600.0, backend: str | None = None, barrier_per_epoch: bool = False,
                  progress: Callable[[dict], None] | None = None, mode: str = "auto", device: str = "auto",
                  env: dict[str, str] | None = None, run_dir: str | Path | None = None) -> list[RunResult]:
    """:func:`run_schedule` for several schedules with the same number of GPUs, run in turn by
    one set of processes (start-up, seconds per rank on a CPU, is paid once). ``size_bytes``: one
    size for all, or one per schedule (None: that schedule's own)."""
    progs = [as_program(x) for x in items]
    if not progs:
        raise InputError("schedules", "none given", "give at least one schedule")
    for prog in progs:
        check_structure(prog)
    n = progs[0].ngpus
    if any(p.ngpus != n for p in progs):
        raise InputError("schedules", f"have different GPU counts ({sorted({p.ngpus for p in progs})})", "run schedules for one GPU count together")
    if repeats < 0 or warmup < 0:
        raise InputError("repeats", "repeats and warm-up runs must not be negative", "give 0 or more")
    if not timeout_s > 0:
        raise InputError("timeout_s", f"{timeout_s} is not positive", "give seconds above zero")
    sizes = list(size_bytes) if isinstance(size_bytes, list | tuple) else [size_bytes] * len(progs)
    if len(sizes) != len(progs):
        raise InputError("size_bytes", f"gives {len(sizes)} sizes for {len(progs)} schedules", "give one size, or one per schedule")
    sizes = [round(p.chunk_bytes * n * p.chunks) if s is None else s for p, s in zip(progs, sizes, strict=True)]
    for s in sizes:
        if not isinstance(s, int) or s < 1:
            raise InputError("size_bytes", f"{s!r} is not a positive size", "give the per-rank buffer size in bytes")
    dev = pick_device(device, n)
    need = n * max(sizes) * RUN_COPIES
    have = _memory_bytes()
    if dev == "cpu" and have and need > 0.8 * have:  # on CUDA the buffers live on the GPUs
        raise InputError("size_bytes", f"{max(sizes):,} bytes per rank need about {need / 2**30:.1f} GiB on {n} ranks "
                         f"(input, output, scratch and torch's reference), over 80% of this machine's {have / 2**30:.1f} GiB",
                         "give a smaller size")
    backend = backend or ("nccl" if dev == "cuda" else "gloo")
    if backend not in ("gloo", "nccl"):
        raise InputError("backend", f"{backend!r} is unknown", "use gloo or nccl")
    own_dir = run_dir is None
    rd = Path(tempfile.mkdtemp(prefix="flowride-comm-")) if own_dir else Path(run_dir)
    t0 = time.monotonic()
    try:
        ranks = RankGroup(rd, n, remove_dir=own_dir)
    except BaseException:
        if own_dir:
            shutil.rmtree(rd, ignore_errors=True)
        raise
    with ranks:  # from here on the dir goes, whatever happens
        rd.mkdir(parents=True, exist_ok=True)
        for old in [*rd.glob("rank*.*"), rd / "progress.jsonl", rd / "report.json"]:
            old.unlink(missing_ok=True)
        paths = []
        for k, prog in enumerate(progs):
            paths.append(str(rd / f"program{k}.json"))
            save_program(prog, paths[-1])

        def command(rank: int) -> list[str]:
            cmd = [sys.executable, "-m", "flowride.comm.worker", "--program", *paths, "--out", str(rd),
                   "--size-bytes", *map(str, sizes), "--repeats", str(repeats), "--warmup", str(warmup),
                   # a single wait gives up later than the whole run does, so the launcher, which
                   # can tell who stalled, is the one to report a hang
                   "--timeout-s", str(timeout_s + 30), "--backend", backend, "--device", dev, "--mode", mode]
            return [*cmd, "--barrier-per-epoch"] if barrier_per_epoch else cmd

        ranks.start(command, lambda rank: ranks.rank_env(rank, 1, env))
        return _watch(ranks, rd, n, timeout_s, t0, progress)


def _watch(ranks: RankGroup, rd: Path, n: int, timeout_s: float, t0: float,
           progress: Callable[[dict], None] | None) -> list[RunResult]:
    """Follow the ranks until they all finish, one fails, or the run passes ``timeout_s``."""
    procs = ranks.procs
    if progress:
        progress({"event": "spawned", "ranks": n})
    forward = JsonLines(rd / "progress.jsonl", progress)

    exited_at: dict[int, float] = {}
    while True:
        codes = [p.poll() for p in procs]
        now = time.time()
        for r, c in enumerate(codes):
            if c is not None:
                exited_at.setdefault(r, now)
        forward()
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, EXIT_OK, EXIT_WRONG)]
        if bad:
            # the first rank to exit may only be echoing a peer's failure (its receive broke
            # when the peer's connection closed): give the cause a moment to report itself
            settle = time.monotonic() + ECHO_SETTLE_S
            while time.monotonic() < settle and not _has_cause(rd, bad):
                time.sleep(0.05)
                codes = [p.poll() for p in procs]
                now = time.time()
                for r, c in enumerate(codes):
                    if c is not None:
                        exited_at.setdefault(r, now)
                bad = [(r, c) for r, c in enumerate(codes) if c not in (None, EXIT_OK, EXIT_WRONG)]
            bad += [(r, 1) for r in range(len(procs)) if codes[r] is None and (rd / f"rank{r}.error").exists()]
            ranks.stop()
            rank, why = _first_failure(rd, bad, exited_at)
            raise CommFailed(rank, f"rank {rank} failed: {why}", ranks.tail(rank))
        if all(c is not None for c in codes):
            break
        if time.monotonic() - t0 > timeout_s:
            rank, why = _diagnose_hang(rd, ranks, timeout_s)
            ranks.stop()
            raise CommFailed(rank, why, "" if rank is None else ranks.tail(rank))
        time.sleep(0.05)
    forward()
    rep = _read(rd / "report.json")
    if rep is None:
        raise CommFailed(0, "rank 0 finished without writing a report", ranks.tail(0))
    results = [RunResult.from_report(r) for r in rep["results"]]
    for r in results:
        r.wall_s = time.monotonic() - t0
    if progress:
        progress({"event": "done"})
    return results
