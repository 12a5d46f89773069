"""One rank of a schedule run: ``python -m flowride.comm.worker --program p.json [more.json ...]``.

Started the torchrun way (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the
environment), so :func:`flowride.comm.run_schedule` spawns local ranks and
``torchrun --nproc-per-node N -m flowride.comm.worker --program p.json`` runs the same code, on
one machine or several. Each rank fills its input with closed-form data, runs the program once
and checks the output against the closed form and torch.distributed's own collective, then times
warm-up and repeats of both. Several programs (same rank count) run in turn in one process group,
so start-up is paid once. Rank 0 prints each program's report as one JSON line on stdout (and
writes ``report.json`` under ``--out``).

Exit codes: 0 correct, 3 ran to the end but some output is wrong, 2 bad input, 1 failure: on
every rank (each learns the outcome over torch.distributed, so a multi-node run needs no shared
directory). Rank 0's report carries every rank's clock offset to rank 0 (:mod:`flowride.clocks`).
:func:`run_as_rank` is the same run inside a process torchrun started (``flowride run`` there).

With ``--out`` (the launcher's mode) each rank also keeps ``rank{r}.state`` fresh (phase, what it
waits for) so that a hang can be blamed on the rank that stopped, writes ``rank{r}.error`` when
it fails, and rank 0 appends progress events to ``progress.jsonl``.

``FLOWRIDE_COMM_INJECT_FAULT=KIND:RANK`` (KIND: crash, hang, kill) makes RANK raise, sleep
forever, or SIGKILL itself halfway through its first run of the program: for failure tests.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from flowride.clocks import measure_offsets, skewed_clock
from flowride.comm.data import (
    UNWRITTEN,
    compare_output,
    count_wrong,
    elements_per_chunk,
    fill_input,
)
from flowride.comm.execute import ProgramExecutor
from flowride.comm.reference import Reference
from flowride.comm.result import EXIT_FAILED, EXIT_INPUT, EXIT_OK, EXIT_WRONG, MAX_ERRORS, RunResult
from flowride.comm.serialize import check_structure, load_program
from flowride.errors import InputError
from flowride.files import write_json_atomic
from flowride.ranks import check_world, leave_process_group, pick_device, rank_and_world

FAULT_ENV = "FLOWRIDE_COMM_INJECT_FAULT"


class _State:
    """This rank's phase and what it is blocked on, rewritten twice a second by a daemon
    thread (a rank stuck in Python or in a gloo wait still reports; one that is stopped does not)."""

    def __init__(self, out: Path | None, rank: int) -> None:
        self.out, self.rank = out, rank
        self.phase = "start"
        self.executor: ProgramExecutor | None = None
        self.waiting: str | None = None
        self.waiting_peer: int | None = None
        self._stop = threading.Event()
        if out is not None:
            self._write()
            threading.Thread(target=self._loop, daemon=True).start()

    def _write(self) -> None:
        ex = self.executor
        waiting = self.waiting or (ex.waiting if ex else None)
        peer = self.waiting_peer if self.waiting else (ex.waiting_peer if ex else None)
        try:
            write_json_atomic(self.out / f"rank{self.rank}.state",
                              {"time": time.time(), "pid": os.getpid(), "phase": self.phase, "waiting": waiting, "waiting_peer": peer})
        except OSError:
            pass

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self._write()

    def stop(self) -> None:
        self._stop.set()
        if self.out is not None:
            self._write()

    def blocked(self, what: str | None) -> None:
        self.waiting, self.waiting_peer = what, None


def _progress(args: argparse.Namespace, rank: int, event: dict) -> None:
    """Rank 0's progress: appended to ``progress.jsonl`` under ``--out`` (the launcher follows
    it) and handed to ``args.progress`` (a CLI running as rank 0 under torchrun)."""
    if rank != 0:
        return
    if args.out:
        with open(Path(args.out) / "progress.jsonl", "a") as f:
            f.write(json.dumps(event) + "\n")
    sink = getattr(args, "progress", None)
    if sink is not None:
        sink(event)


def _fault_hook(rank: int, nsteps: int):
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None
    kind, _, who = spec.partition(":")
    if kind not in ("crash", "hang", "kill") or not who.strip().isdigit():
        raise InputError(FAULT_ENV, f"{spec!r} is not KIND:RANK", "use crash:R, hang:R or kill:R")
    if int(who) != rank:
        return None
    at = nsteps // 2

    def hook(k: int) -> None:
        if k != at:
            return
        if kind == "crash":
            raise RuntimeError(f"injected crash on rank {rank} at step {k}")
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            time.sleep(3600)

    return hook


def _timed(fn, device: torch.device, state: _State, what: str | None) -> float:
    """Seconds ``fn`` takes on this rank, started right after a barrier. ``what`` is what the
    rank waits for meanwhile (None: the executor says it, step by step)."""
    state.blocked("barrier before a timed run")
    dist.barrier()
    state.blocked(what)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    state.blocked(None)
    return dt


def _device_and_backend(args: argparse.Namespace) -> tuple[torch.device, str]:
    if pick_device(args.device) == "cuda":  # ranks share the node's GPUs by LOCAL_RANK
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = args.backend if args.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    return device, backend


def run_rank(args: argparse.Namespace, state: _State, progs: list | None = None) -> list[RunResult]:
    """This rank's whole run: every program in turn in one process group (start-up, which
    dominates small runs, is paid once). Returns the reports on every rank (times are the
    slowest rank's, errors gathered from all), so each rank knows the run's outcome; rank 0's
    are the ones printed. ``progs``: programs already loaded (else ``args.program``'s files)."""
    rank, world = rank_and_world()
    state.rank = rank
    progs = [load_program(p) for p in args.program] if progs is None else progs
    sizes = args.size_bytes or [None]
    if len(sizes) not in (1, len(progs)):
        raise InputError("--size-bytes", f"gives {len(sizes)} sizes for {len(progs)} programs", "give one size, or one per program")
    if len(sizes) == 1:
        sizes = sizes * len(progs)
    for prog in progs:
        check_structure(prog)
        check_world(world, prog.ngpus, "WORLD_SIZE", f"start {prog.ngpus} processes: the program has {prog.ngpus} ranks")
    device, backend = _device_and_backend(args)
    state.phase = "init"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout_s),
                            **({"device_id": device} if device.type == "cuda" else {}))
    # every rank's clock against rank 0's (flowride.clocks): reported, so a multi-node run says
    # how far apart its hosts' clocks were and how well that is known
    state.phase = "clock offsets"
    state.blocked("clock offset exchange with rank 0")
    offsets = [c.as_dict() for c in measure_offsets(clock=skewed_clock(rank), device=device if device.type == "cuda" else None)]
    state.blocked(None)
    results = []
    for k, (prog, size) in enumerate(zip(progs, sizes, strict=True)):
        res = _run_one(args, state, prog, size, device, backend, rank, world, k, len(progs))
        res.clock_offsets = offsets
        results.append(res)
    state.phase = "done"
    state.blocked("final barrier")
    dist.barrier()
    state.blocked(None)
    # only on success: after a failure, tearing the group down would close the sockets and make
    # the peers fail before this rank's error is on record; exiting closes them anyway
    dist.destroy_process_group()
    return results


def _run_one(args: argparse.Namespace, state: _State, prog, size: int | None, device: torch.device, backend: str,
             rank: int, world: int, index: int, count: int) -> RunResult:
    n, C = prog.ngpus, prog.chunks
    size = size or round(prog.chunk_bytes * n * C)
    if not size:
        raise InputError("size_bytes", "is not given and the program carries no chunk size", "pass --size-bytes")
    dtype = torch.float32
    itemsize = torch.empty((), dtype=dtype).element_size()
    elems = elements_per_chunk(prog.collective, n, C, size, itemsize)
    tag = {"program": index + 1, "programs": count, "collective": prog.collective.value, "size_bytes": int(size)}
    where = f" of {prog.collective.value} ({index + 1}/{count})" if count > 1 else ""

    ex = ProgramExecutor(prog, rank, elems, dtype, device, args.mode, args.barrier_per_epoch)
    state.executor = ex
    gp = prog.gpus[rank]
    fill_input(ex.bufs["i"], rank, gp.i_chunks, elems)
    ref = Reference(prog.collective, ex.bufs["i"], torch.empty_like(ex.bufs["o"]), rank, world)
    state.blocked("barrier before the check run")
    dist.barrier()
    state.blocked(None)

    # the check run: outputs start as a sentinel no input value takes
    state.phase = "check run" + where
    _progress(args, rank, {"event": "check", **tag})
    ex.bufs["o"].fill_(UNWRITTEN)
    ex.bufs["s"].fill_(UNWRITTEN)
    ex.before_step = _fault_hook(rank, sum(1 for kind, _ in ex.plan if kind == "step")) if index == 0 else None
    if ex.before_step is not None and not gp.steps:
        ex.before_step(0)
    ex.run()
    ex.before_step = None
    state.phase = "reference check" + where
    state.blocked(f"torch.distributed {prog.collective.value}")
    ref.out.fill_(UNWRITTEN)
    ref.run()
    state.blocked(None)
    errors = compare_output(ex.bufs["o"], prog.collective, n, C, rank, elems, reference=ref.out)
    # nccl-tests' #wrong (counted only when something differs: equal outputs have none)
    wrong = [count_wrong(buf, prog.collective, n, C, rank, elems) for buf in (ex.bufs["o"], ref.out)] if errors else [0, 0]

    ours, theirs = [], []
    total = args.warmup + args.repeats
    for i in range(total):
        warm = i < args.warmup
        state.phase = (f"warm-up {i + 1} of {args.warmup}" if warm else f"repeat {i - args.warmup + 1} of {args.repeats}") + where
        _progress(args, rank, {"event": "warmup" if warm else "repeat", "i": (i if warm else i - args.warmup) + 1,
                              "of": args.warmup if warm else args.repeats, **tag})
        a = _timed(ex.run, device, state, None)
        b = _timed(ref.run, device, state, f"torch.distributed {prog.collective.value}")
        if not warm:
            ours.append(a)
            theirs.append(b)
    if not errors and total:
        # repeated runs reuse buffers and staging: check they still give the same answer
        errors = [f"after {total} timed runs: {e}" for e in compare_output(ex.bufs["o"], prog.collective, n, C, rank, elems, reference=ref.out)]
        if errors:
            wrong = [count_wrong(buf, prog.collective, n, C, rank, elems) for buf in (ex.bufs["o"], ref.out)]

    state.phase = "gather results" + where
    state.blocked("gathering results")
    times = torch.tensor([ours, theirs], dtype=torch.float64, device=device).reshape(2, -1)
    if times.numel():
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
    wrong_t = torch.tensor(wrong, dtype=torch.int64, device=device)
    dist.all_reduce(wrong_t)  # summed over ranks, as nccl-tests sums its per-rank counts
    gathered: list = [None] * world
    dist.all_gather_object(gathered, errors)
    state.blocked(None)
    state.executor = None
    all_errors = [e for errs in gathered for e in errs]
    if len(all_errors) > MAX_ERRORS:
        all_errors = all_errors[:MAX_ERRORS] + [f"... and {len(all_errors) - MAX_ERRORS} more"]
    return RunResult(
        collective=prog.collective.value, ranks=n, program=prog.name, size_bytes=int(size),
        actual_bytes=elems * itemsize * n * C, chunk_bytes=elems * itemsize, chunks=C, elements_per_chunk=elems,
        repeats=args.repeats, warmup=args.warmup, ours_s=times[0].cpu().tolist(), torch_s=times[1].cpu().tolist(),
        errors=all_errors, wrong_elements=int(wrong_t[0]), torch_wrong_elements=int(wrong_t[1]), backend=backend, device=device.type, mode=ex.mode, reference=ref.name,
        barrier_per_epoch=args.barrier_per_epoch,
    )


def run_as_rank(items: list, size_bytes: int | None = None, repeats: int = 5, warmup: int = 1, timeout_s: float = 600.0,
                backend: str | None = None, barrier_per_epoch: bool = False, progress=None, mode: str = "auto",
                device: str = "auto") -> tuple[int, list[RunResult]]:
    """Run schedules with this process as one rank of a run somebody else launched (torchrun, on
    one node or several: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment).

    The counterpart of :func:`flowride.comm.launch.run_schedules` for ``flowride run`` under
    torchrun: the same worker code, but nothing is read from or written to a run directory:
    times (the slowest rank's), wrong-element counts and errors travel over torch.distributed,
    and every rank gets the results, so every rank can exit with the run's code. Returns (this
    rank, results); rank 0's ``progress`` receives the launcher's progress events.
    ``timeout_s`` bounds each single wait (the process group's timeout): no launcher of
    flowride's watches the whole run. A rank that fails raises
    :class:`~flowride.comm.launch.CommFailed` naming itself.
    """
    from flowride.comm.launch import CommFailed, as_program

    rank = int(os.environ.get("RANK", "0"))
    progs = [as_program(x) for x in items]
    if not progs:
        raise InputError("schedules", "none given", "give at least one schedule")
    if repeats < 0 or warmup < 0:
        raise InputError("repeats", "repeats and warm-up runs must not be negative", "give 0 or more")
    if not timeout_s > 0:
        raise InputError("timeout_s", f"{timeout_s} is not positive", "give seconds above zero")
    if size_bytes is not None and (not isinstance(size_bytes, int) or size_bytes < 1):
        raise InputError("size_bytes", f"{size_bytes!r} is not a positive size", "give the per-rank buffer size in bytes")
    if size_bytes is None and any(round(p.chunk_bytes * p.ngpus * p.chunks) < 1 for p in progs):
        raise InputError("size_bytes", "is not given and the schedule carries no size (an MSCCL XML has none)",
                         "give the per-rank buffer size, e.g. 1MB")
    args = argparse.Namespace(program=[], size_bytes=[size_bytes], repeats=repeats, warmup=warmup, timeout_s=timeout_s,
                              backend=backend or "auto", device=device, mode=mode, barrier_per_epoch=barrier_per_epoch,
                              out=None, progress=progress)
    state = _State(None, rank)
    try:
        return rank, run_rank(args, state, progs)
    except InputError:
        leave_process_group()
        raise
    except Exception as e:  # a peer that went away shows here as a broken send or receive
        leave_process_group()
        raise CommFailed(rank, f"rank {rank} of {os.environ.get('WORLD_SIZE', '?')}: {type(e).__name__}: {e}") from None
    finally:
        state.stop()


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m flowride.comm.worker", description="Run one rank of a lowered schedule.")
    ap.add_argument("--program", required=True, nargs="+", help="program JSON(s) (flowride.comm.save_program), run in turn")
    ap.add_argument("--size-bytes", type=int, nargs="+", default=None, help="per-rank size: one, or one per program (default: the program's)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=300.0, help="process-group timeout for any single wait")
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--mode", choices=("auto", "dataflow", "ordered", "grouped"), default="auto")
    ap.add_argument("--barrier-per-epoch", action="store_true")
    ap.add_argument("--out", default=None, help="directory for report.json, per-rank state and errors")
    a = ap.parse_args(argv)
    if a.repeats < 0 or a.warmup < 0:
        ap.error("--repeats and --warmup must not be negative")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    state = _State(out, rank)
    code = EXIT_FAILED
    try:
        results = run_rank(args, state)
        code = EXIT_OK
        if results and rank == 0:
            reps = [r.report() for r in results]
            if out is not None:
                write_json_atomic(out / "report.json", {"results": reps})
            for rep in reps:
                print(json.dumps(rep), flush=True)
        return EXIT_OK if all(r.ok for r in results) else EXIT_WRONG
    except BaseException as e:
        # a timestamped error lets the launcher tell the first failure from its echoes on peers
        code = EXIT_INPUT if isinstance(e, InputError) else EXIT_FAILED
        if out is not None:
            err = {"time": time.time(), "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            write_json_atomic(out / f"rank{rank}.error", err)
        traceback.print_exc()
        return code
    finally:
        state.stop()


if __name__ == "__main__":
    sys.exit(main())
