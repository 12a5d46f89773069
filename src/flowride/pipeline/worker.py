"""One pipeline stage: runs its instruction list every iteration over torch.distributed.

Started the torchrun way (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment), so
``flowride train`` can spawn local ranks and ``torchrun -m flowride.pipeline.worker cfg.json``
runs the same code across machines. Two engines run a rank's stages: the built-in one
(:class:`StageRunner`: our instruction lists, point-to-point isend / recv, gloo on CPU, nccl on
CUDA) and torch.distributed.pipelining (:class:`flowride.pipeline.torch_engine.TorchStageRunner`).
Both record every compute action's start, compute start (after its receive) and end on a
monotonic clock, and both tell a :class:`flowride.pipeline.reporter.BubbleReporter` when the
stage waits and when it computes again; the reporter learns each wait's length online and
announces the bubbles without blocking (see :mod:`flowride.pipeline.events`).

Right after ``init_process_group`` each rank's clock offset to rank 0 is measured
(:mod:`flowride.clocks`) and every timestamp of the rank's record is moved onto rank 0's clock
(:func:`shift_record`). Records reach rank 0 one way only: gathered over torch.distributed, so a
run across nodes needs no shared directory. :func:`run_rank` returns every rank's record on rank
0, and rank 0 of ``python -m flowride.pipeline.worker`` (started by flowride's launcher or by a
bare torchrun) writes them all to ``run_dir/ranks.json``, which the launcher reads. Each rank
also leaves its own ``rank{r}.json`` on its node, a local copy for inspection that nothing reads.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from flowride.clocks import injected_skew, measure_offsets, skewed_clock
from flowride.files import write_json_atomic, write_with
from flowride.pipeline.config import RANKS_FILE, TrainConfig, onoff_blocks
from flowride.pipeline.data import TokenSource
from flowride.pipeline.events import BubblePublisher
from flowride.pipeline.model import build_pieces, loss_fn, preset
from flowride.pipeline.reporter import BubbleReporter
from flowride.pipeline.schedules import build_schedule, gap_types
from flowride.pipeline.wire import GRAD, Wire
from flowride.ranks import check_world, pick_device, rank_and_world


def _device(cfg: TrainConfig, rank: int) -> torch.device:
    if cfg.rehearse_stage is not None and rank != cfg.rehearse_stage:
        return torch.device("cpu")  # a stand-in
    if pick_device(cfg.device, field="--device") == "cuda":  # stages share the node's GPUs by LOCAL_RANK
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count()))
    return torch.device("cpu")


def _saved_lengths(cfg: TrainConfig, rank: int) -> dict[str, float]:
    """This stage's learned wait lengths from a saved bubble profile (empty without one)."""
    if not cfg.profile:
        return {}
    prof = json.loads(Path(cfg.profile).read_text())
    for st in prof.get("lengths", []):
        if st["stage"] == rank:
            return {k: float(v) for k, v in st["lengths"].items()}
    return {}


class StageRunner:
    """Holds this rank's model pieces, optimizer and schedule; ``iteration`` runs one step."""

    def __init__(self, cfg: TrainConfig, rank: int, world: int, dev: torch.device, reporter: BubbleReporter) -> None:
        self.cfg, self.rank, self.world = cfg, rank, world
        self.dev = dev
        self.reporter = reporter
        self.mcfg = preset(cfg.model)
        self.P = cfg.stages * cfg.chunks
        if cfg.rehearse_stage is not None:  # torch's schedules too, through their action orders
            from flowride.pipeline.rehearsal import rehearsal_schedule

            lists, owner = rehearsal_schedule(cfg)
        else:
            lists = build_schedule(cfg.schedule, cfg.stages, cfg.microbatches, cfg.chunks)
            owner = {j: j % cfg.stages for j in range(self.P)}
        self.mine = [j for j in range(self.P) if owner[j] == rank]
        self.pieces = {j: piece.to(self.dev) for j, piece in build_pieces(self.mcfg, self.P, cfg.seed, self.mine).items()}
        self.params = [p for j in self.mine for p in self.pieces[j].parameters()]
        self.opt = torch.optim.Adam(self.params, lr=cfg.lr)
        self.instrs = lists[rank]
        self.has_w = any(i.kind == "W" for i in self.instrs)
        self.gaps = gap_types(self.instrs)
        self.data = TokenSource(self.mcfg.vocab_size, self.mcfg.seq_len, cfg.seed, cfg.data)
        self.act_shape = (cfg.microbatch_size, self.mcfg.seq_len, self.mcfg.d_model)
        # a rehearsal runs on gloo: the real stage's tensors cross through host memory
        self.wire = Wire(rank, owner, cfg.microbatches, self.act_shape, dev,
                         torch.device("cpu") if cfg.rehearse_stage is not None else dev)
        self._send, self._recv = self.wire.send, self.wire.recv
        # rehearsing a stage whose last chunk feeds a stand-in: the gradient that comes back is
        # the stand-in's fixed one, and <output, that gradient> is the objective this stage
        # descends, reported as its loss (identical with and without harvesting)
        self.probe = None
        if cfg.rehearse_stage is not None and self.P - 1 not in self.mine:
            from flowride.pipeline.rehearsal import stand_in_tensor

            self.probe = stand_in_tensor(self.act_shape, cfg.seed, GRAD).to(dev)

    # ------------------------------------------------------------------ one iteration
    def make_batch(self, it: int) -> torch.Tensor:
        return self.data.batch(it, self.cfg.microbatches, self.cfg.microbatch_size).to(self.dev)

    def state_dicts(self) -> dict[int, dict]:
        return {j: self.pieces[j].state_dict() for j in self.mine}

    def _clock(self) -> float:
        """Now, with the GPU caught up on CUDA: a NCCL receive or a kernel only queues work, so
        without the synchronization the host clock would time the queueing, not the bubble."""
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        return time.monotonic()

    def iteration(self, it: int, batch: torch.Tensor) -> tuple[float | None, list[dict]]:
        cfg = self.cfg
        rep = self.reporter
        m = cfg.microbatches
        inputs: dict[tuple[int, int], torch.Tensor] = {}
        outputs: dict[tuple[int, int], torch.Tensor] = {}
        grads: dict[tuple[int, int], torch.Tensor | None] = {}
        pending: list = []
        loss_sum = 0.0
        recs: list[dict] = []
        for i, ins in enumerate(self.instrs):
            t0 = time.monotonic()
            rep.idle(i, self.gaps[i])  # gap i: from here until the input arrives
            mb, j = ins.mb, ins.chunk
            if ins.kind == "F":
                if j == 0:
                    x = batch[mb, :, :-1]
                else:
                    x = self._recv(0, mb, j, j - 1).requires_grad_(True)
                tc = self._clock()
                rep.busy(tc)
                y = self.pieces[j](x)
                if j == self.P - 1:
                    y = loss_fn(y, batch[mb, :, 1:]) / m
                    loss_sum += float(y.detach())
                else:
                    self._send(y, 0, mb, j + 1, j + 1, pending)
                    if self.probe is not None:
                        loss_sum += float((y.detach() * self.probe).sum()) / m
                inputs[(mb, j)], outputs[(mb, j)] = x, y
            elif ins.kind == "B":
                g = None if j == self.P - 1 else self._recv(1, mb, j, j + 1)
                tc = self._clock()
                rep.busy(tc)
                x, y = inputs[(mb, j)], outputs[(mb, j)]
                if self.has_w:  # input gradient now, weight gradient in W
                    if j > 0:
                        (dx,) = torch.autograd.grad(y, x, g, retain_graph=True)
                        self._send(dx, 1, mb, j - 1, j - 1, pending)
                    grads[(mb, j)] = g
                else:
                    torch.autograd.backward(y, g)
                    if j > 0:
                        self._send(x.grad, 1, mb, j - 1, j - 1, pending)
                    del inputs[(mb, j)], outputs[(mb, j)]
            else:  # W
                tc = self._clock()
                rep.busy(tc)
                y = outputs.pop((mb, j))
                torch.autograd.backward(y, grads.pop((mb, j)), inputs=list(self.pieces[j].parameters()))
                inputs.pop((mb, j))
            t1 = self._clock()
            recs.append({"kind": ins.kind, "mb": mb, "chunk": j, "start": t0, "compute": tc, "end": t1})
        for w in pending:
            w.wait()
        t0 = time.monotonic()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t1 = time.monotonic()
        recs.append({"kind": "O", "mb": -1, "chunk": -1, "start": t0, "compute": t0, "end": t1})
        return (loss_sum if self.P - 1 in self.mine or self.probe is not None else None), recs


def _runner(cfg: TrainConfig, rank: int, world: int, dev: torch.device, reporter: BubbleReporter):
    if cfg.rehearse_stage is not None and rank != cfg.rehearse_stage:
        from flowride.pipeline.rehearsal import StandInRunner, parse_stand_in

        m = preset(cfg.model)
        times = parse_stand_in(cfg.stand_in, cfg.stages)
        return StandInRunner(cfg, rank, (cfg.microbatch_size, m.seq_len, m.d_model), None if times is None else times[rank], reporter)
    if cfg.engine == "torch" and cfg.rehearse_stage is None:
        from flowride.pipeline.torch_engine import TorchStageRunner

        return TorchStageRunner(cfg, rank, world, dev, reporter)
    return StageRunner(cfg, rank, world, dev, reporter)


# the time fields of a rank's record, each a reading of the rank's time.monotonic()
ITERATION_TIMES = ("start", "end")
ACTION_TIMES = ("start", "compute", "end")  # iterations[].records[]
WAIT_TIMES = ("start", "end")  # waits[]


def shift_record(rec: dict, by: float) -> dict:
    """Subtract ``by`` seconds from every timestamp of a rank's record, in place: with ``by`` the
    rank's clock offset, its times become rank 0's clock's. Durations (bubble lengths, the
    publisher's seconds) and counts stay as they are; published events carry no times here."""
    for it in rec["iterations"]:
        for k in ITERATION_TIMES:
            it[k] -= by
        for r in it["records"]:
            for k in ACTION_TIMES:
                r[k] -= by
    for w in rec["waits"]:
        for k in WAIT_TIMES:
            w[k] -= by
    return rec


def run_rank(cfg: TrainConfig, on_iteration: Callable[[dict], None] | None = None) -> list[dict] | None:
    """This rank's training; returns every rank's record (on rank 0's clock) on rank 0, None on
    the others. ``on_iteration`` gets ``{"iteration", "loss" (None where this rank holds no last
    stage), "seconds"}`` after each iteration."""
    rank, world = rank_and_world()
    check_world(world, cfg.stages, "--stages", f"start {cfg.stages} in all (nodes x processes per node), or give --stages {world}")
    torch.set_num_threads(cfg.threads)
    if cfg.pin_cores:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(os.environ.get("LOCAL_RANK", rank)) % len(cpus)]})
    dev = _device(cfg, rank)
    rehearsal = cfg.rehearse_stage is not None
    stand_in = rehearsal and rank != cfg.rehearse_stage  # announces nothing: side work goes to the real stage
    saved = _saved_lengths(cfg, rank)
    reporter = BubbleReporter(rank, BubblePublisher(cfg.bubble_port), min_bubble_s=math.inf if stand_in else cfg.min_bubble_s,
                              warmup_iters=0 if saved else 1, profile=saved, device=dev.type)
    backend = "nccl" if dev.type == "cuda" and not rehearsal else "gloo"  # a rehearsal mixes devices
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=cfg.timeout_s))
    clock = measure_offsets(clock=skewed_clock(rank), device=dev if backend == "nccl" else None)[rank]
    runner = _runner(cfg, rank, world, dev, reporter)
    run_dir = Path(cfg.run_dir)
    progress = run_dir / "progress.jsonl"
    blocks = onoff_blocks(cfg)  # None, or harvesting on/off per iteration (paired overhead runs)
    iters = []
    try:
        fault = os.environ.get("FLOWRIDE_INJECT_FAULT", "")  # "crash:ITER" / "hang:ITER", for failure tests
        for it in range(cfg.iters):
            if fault and int(fault.split(":")[1]) == it:
                if fault.startswith("crash"):
                    raise RuntimeError(f"injected crash on rank {rank} at iteration {it}")
                time.sleep(10**6)
            # data, the memory reading and the harvest switch are ready before the iteration's clock starts
            batch = runner.make_batch(it)
            if blocks is not None and (it == 0 or blocks[it] != blocks[it - 1]):
                reporter.enabled = blocks[it]
                if rank == 0:
                    reporter.control("on" if blocks[it] else "off")
            dist.barrier()
            t_start = time.monotonic()
            reporter.begin_iteration(it)  # closes the wait at the barrier
            loss, recs = runner.iteration(it, batch)
            reporter.idle("end", "C")  # until every stage is done: the next barrier's exit
            if rehearsal and cfg.stand_in == "same" and it < cfg.warmup_iters:
                # the stand-ins mirror the warm-up iterations' times (the first, cold one only
                # until there are others), frozen after the warm-up
                from flowride.pipeline.rehearsal import exchange_times, measured_times

                warm = [r for x in (iters[1:] or iters) for r in x["records"]]
                times = exchange_times(None if stand_in else measured_times(warm), cfg.rehearse_stage)
                if stand_in:
                    runner.times = times
            iters.append({"iteration": it, "start": t_start, "loss": loss, "records": recs,
                          "free_memory": reporter.free_memory, "harvest": None if blocks is None else blocks[it]})
            ev = {"iteration": it, "loss": loss, "seconds": time.monotonic() - t_start}
            if loss is not None:
                with open(progress, "a") as f:
                    f.write(json.dumps(ev) + "\n")
            if on_iteration is not None:
                on_iteration(ev)
        dist.barrier()
        t_last = time.monotonic()
        reporter.busy(t_last)
    finally:
        reporter.close()
    # the iteration ends when every stage is done: the next iteration's barrier exit
    for k, rec in enumerate(iters):
        rec["end"] = iters[k + 1]["start"] if k + 1 < len(iters) else t_last
    peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else None
    out = {
        "rank": rank,
        "host": socket.gethostname(),
        "clock": clock.as_dict(),  # this rank's clock minus rank 0's, and the bound on it
        "engine": cfg.engine,
        "device": str(dev),
        "chunks": runner.mine,
        "gap_types": runner.gaps,
        "iterations": iters,
        "published": reporter.summary()["events"],
        "reporter": reporter.summary(),
        "waits": reporter.records(),
        "lengths": reporter.profile(),
        "peak_cuda_bytes": peak,
    }
    if hasattr(runner, "observer"):
        out["plan_mismatches"] = runner.observer.plan_mismatches
    shift_record(out, -injected_skew(rank))  # the test hook: as if this host's clock read ahead
    shift_record(out, clock.offset_s)  # onto rank 0's clock
    write_json_atomic(run_dir / f"rank{rank}.json", out)
    if cfg.save_params:
        state = runner.state_dicts()
        write_with(run_dir / f"rank{rank}.pt", lambda f: torch.save(state, f))
    gathered = gather_to_rank0(out, rank, world, torch.device("cpu") if backend == "gloo" else dev)
    dist.barrier()  # every rank past the gather before any tears its connections down
    dist.destroy_process_group()
    return gathered


GATHER_TAG = 2**30  # clear of the stages' own tags, (kind * m + mb) * P + chunk


def gather_to_rank0(obj, rank: int, world: int, dev: torch.device) -> list | None:
    """Every rank's ``obj`` on rank 0 (in rank order; None elsewhere), pickled and sent point to
    point. Not ``dist.gather_object``: on gloo, a rank that had sent its part that way aborted
    at exit (SIGABRT, "terminate called without an active exception") in 3 of 40 runs on a
    loaded 2-core machine, and in none of 16 with ``all_gather_object`` or of 24 with this."""
    import pickle

    if rank != 0:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(dev)
        dist.send(torch.tensor([payload.numel()], dtype=torch.int64, device=dev), 0, tag=GATHER_TAG)
        dist.send(payload, 0, tag=GATHER_TAG)
        return None
    out = [obj]
    size = torch.zeros(1, dtype=torch.int64, device=dev)
    for r in range(1, world):
        dist.recv(size, r, tag=GATHER_TAG)
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=dev)
        dist.recv(buf, r, tag=GATHER_TAG)
        out.append(pickle.loads(buf.cpu().numpy().tobytes()))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m flowride.pipeline.worker CONFIG.json", file=sys.stderr)
        return 2
    cfg = TrainConfig.from_file(argv[0])
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    try:
        records = run_rank(cfg)
        if records is not None:  # rank 0: every rank's record, whichever node it ran on
            write_json_atomic(Path(cfg.run_dir) / RANKS_FILE, {"config": json.loads(cfg.to_json()), "ranks": records})
    except BaseException as e:
        # leave a timestamped error so the launcher can tell the first failure from its echoes
        import traceback

        rank = os.environ.get("RANK", "?")
        err = {"time": time.time(), "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        write_json_atomic(Path(cfg.run_dir) / f"rank{rank}.error", err)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
