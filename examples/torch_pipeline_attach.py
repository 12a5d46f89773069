"""Harvest the pipeline bubbles of your own torch.distributed.pipelining training script.

    torchrun --nproc-per-node 2 examples/torch_pipeline_attach.py \
        [--schedule gpipe|1f1b|interleaved1f1b] [--steps 30] [--side-tasks cnn] [--no-harvest]

This is an ordinary pipeline-parallel training script (a residual MLP regressing a fixed teacher,
cut into one stage per rank, or two for the interleaved schedule). The only flowride lines are
the import and the ``with flowride.harvest.attach(...)`` block: the schedule, the model, the
loss and the optimizer are the user's and stay as they are. Side tasks run in the bubbles while
training goes on; ``flowride tasks list --run-dir runs/attach-example`` shows them. Leaving the
``with`` returns at once (the manager stops in the background); ``harvest.wait()`` waits for its
record when the script wants it, as here, to print the side work done.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

import flowride.harvest

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved1f1b": ScheduleInterleaved1F1B}


class Block(nn.Module):
    """A pre-norm residual MLP block."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def build_stages(rank: int, world: int, per_rank: int, layers: int, width: int, device: torch.device) -> list[PipelineStage]:
    """Every rank builds the whole model from the same seed and keeps its own pieces: piece j
    (of ``world * per_rank``) runs on rank ``j % world``."""
    torch.manual_seed(0)
    blocks = [Block(width) for _ in range(layers)]
    n = world * per_rank
    size = layers // n
    mine = [rank + k * world for k in range(per_rank)]
    return [PipelineStage(nn.Sequential(*blocks[j * size:(j + 1) * size]).to(device), j, n, device) for j in mine]


def batch(step: int, size: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of one step: a fixed random teacher applied to seeded inputs."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, width, generator=g)
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(width, width, generator=teacher) / width**0.5
    return x.to(device), torch.tanh(x @ w).to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="1f1b", choices=sorted(SCHEDULES))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--side-tasks", default="cnn", help="comma-separated; '' for none")
    ap.add_argument("--run-dir", default="runs/attach-example")
    ap.add_argument("--no-harvest", action="store_true", help="train without attach (to compare losses)")
    ap.add_argument("--out", help="write the losses (last rank) to this JSON file")
    args = ap.parse_args()

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    per_rank = 2 if args.schedule == "interleaved1f1b" else 1
    stages = build_stages(rank, world, per_rank, args.layers, args.width, device)
    loss_fn = nn.MSELoss()
    if per_rank == 1:
        schedule = SCHEDULES[args.schedule](stages[0], args.microbatches, loss_fn=loss_fn)
    else:
        schedule = SCHEDULES[args.schedule](stages, args.microbatches, loss_fn=loss_fn)
    params = [p for s in stages for p in s.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.05)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)

    tasks = [t for t in args.side_tasks.split(",") if t]
    harvest = contextlib.nullcontext() if args.no_harvest else flowride.harvest.attach(
        schedule, run_dir=args.run_dir, side_tasks=tasks)
    history = []
    with harvest:
        for step in range(args.steps):
            x, y = batch(step, args.batch, args.width, device)
            losses: list[torch.Tensor] = []
            schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses if last else None)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if last:
                history.append(float(torch.stack([t.detach() for t in losses]).mean()))

    if last:
        print(f"rank {rank}: loss {history[0]:.5f} -> {history[-1]:.5f} over {args.steps} steps", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"losses": history}, f)
    if not args.no_harvest:
        harvest.wait()  # leaving the with did not wait for the manager to stop; its record is wanted now
        s = harvest.summary()
        print(f"rank {rank}: {s['announced']} bubbles announced of {s['waits']} waits, prediction error "
              f"{s['prediction_error_median']}", flush=True)
        if "side_work" in s:  # the rank that ran this host's manager
            work = s["side_work"]
            print(f"rank {rank}: side tasks ({s['side_tasks']['origin']}) took {work['steps']} steps in the bubbles"
                  + (f"; none because {work['why_none']}" if "why_none" in work else ""), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
