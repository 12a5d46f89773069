"""A hand-written 1F1B pipeline loop that reports its bubbles to flowride.

    torchrun --nproc-per-node 2 examples/handwritten_1f1b.py [--steps 20] [--side-tasks pagerank] [--no-harvest]
        [--gpu-ranks 1 --side-device cuda]    # rank 1 computes on the GPU (activations cross on the CPU)

Loops that flowride cannot wrap (this one, Megatron-LM's, DeepSpeed's) report their waits
themselves: ``flowride.harvest.connect`` sets up the side-task manager and hands back a
``BubbleReporter``; the loop wraps each blocking receive in ``reporter.waiting(...)`` and marks
iterations with ``begin_iteration`` / ``end_iteration``. The reporter learns how long each wait
lasts and announces it, with its predicted end, to the manager, which runs side tasks inside it.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch
import torch.distributed as dist
import torch.nn as nn

import flowride.harvest


def one_f_one_b(rank: int, p: int, m: int) -> list[tuple[str, int]]:
    """Rank ``rank``'s order: p-rank-1 warm-up forwards, one forward one backward, the drain."""
    warm = min(p - rank - 1, m)
    order = [("F", k) for k in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", k) for k in range(m - warm, m)]


def stage_module(rank: int, p: int, width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
              for _ in range(layers)]
    per = layers // p
    return nn.Sequential(*blocks[rank * per:(rank + 1) * per])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--microbatch-size", type=int, default=32)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--side-tasks", default="pagerank")
    ap.add_argument("--run-dir", default="runs/handwritten-1f1b")
    ap.add_argument("--no-harvest", action="store_true")
    ap.add_argument("--out", help="write the losses (last rank) to this JSON file")
    ap.add_argument("--gpu-ranks", default="", help="comma-separated ranks that compute on CUDA (gloo moves tensors via the CPU)")
    ap.add_argument("--side-device", help="where side tasks compute: cpu or cuda (default: the manager rank's device)")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    m, mbs, w = args.microbatches, args.microbatch_size, args.width
    gpu = str(rank) in args.gpu_ranks.split(",") and torch.cuda.is_available()
    dev = torch.device("cuda", 0) if gpu else torch.device("cpu")
    model = stage_module(rank, p, w, args.layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first, last = rank == 0, rank == p - 1

    tasks = [t for t in args.side_tasks.split(",") if t]
    harvest = contextlib.nullcontext() if args.no_harvest else flowride.harvest.connect(
        rank, p, run_dir=args.run_dir, side_tasks=tasks, device=dev.type, side_device=args.side_device)
    # without flowride, waits are plain waits: a reporter that only measures
    rep = flowride.harvest.BubbleReporter(rank) if args.no_harvest else harvest.reporter

    history = []
    with harvest:
        for step in range(args.steps):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(m, mbs, w, generator=g).to(dev)
            y = torch.tanh(x.flip(-1))
            rep.begin_iteration(step)
            saved, pending, total = {}, [], 0.0
            for kind, mb in one_f_one_b(rank, p, m):
                if kind == "F":
                    if first:
                        inp = x[mb]
                    else:
                        inp = torch.empty(mbs, w)
                        with rep.waiting("recv activation"):  # idle until the previous stage sends
                            dist.recv(inp, rank - 1)
                        inp = inp.to(dev).requires_grad_(True)
                    out = model(inp)
                    if last:
                        out = nn.functional.mse_loss(out, y[mb]) / m
                        total += float(out.detach())
                    else:
                        pending.append(dist.isend(out.detach().cpu(), rank + 1))
                    saved[mb] = (inp, out)
                else:
                    inp, out = saved.pop(mb)
                    if last:
                        out.backward()
                    else:
                        grad = torch.empty(mbs, w)
                        with rep.waiting("recv gradient"):  # idle until the next stage sends back
                            dist.recv(grad, rank + 1)
                        out.backward(grad.to(dev))
                    if not first:
                        pending.append(dist.isend(inp.grad.cpu(), rank - 1))
            with rep.waiting("flush"):
                for work in pending:
                    work.wait()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rep.end_iteration()
            if last:
                history.append(total)

    if last:
        print(f"rank {rank}: loss {history[0]:.5f} -> {history[-1]:.5f}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"losses": history}, f)
    s = rep.summary()
    print(f"rank {rank}: {s['announced']} bubbles announced of {s['waits']} waits, median prediction error "
          f"{s['prediction_error_median']}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
