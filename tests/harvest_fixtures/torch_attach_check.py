"""Run under torchrun: train a torch schedule without flowride, then again with
``flowride.harvest.attach`` (side tasks running in the bubbles), and write what each rank saw.

    torchrun --standalone --nproc-per-node 2 torch_attach_check.py SCHEDULE[,SCHEDULE...] RUN_DIR [STEPS]

Several schedules are checked one after the other in the one launch (one process group, one
torch import per rank). Writes RUN_DIR/SCHEDULE/check-rank{r}.json: the losses of both runs
(last stage), the plan's implied idle per gap, the learned wait lengths, compute times and the
observer's plan mismatches.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from torch_pipeline_attach import batch, build_stages  # noqa: E402

import flowride.harvest  # noqa: E402
from flowride.pipeline import torch_compat as tc  # noqa: E402
from flowride.pipeline.torch_plan import plan  # noqa: E402

WIDTH, LAYERS, BATCH, M = 512, 8, 64, 4


def make(name: str, rank: int, world: int):
    v = 1 if name in ("gpipe", "1f1b") else 2
    if name in tc.V_SHAPED:  # the V: stage r and 2p-1-r on rank r
        torch.manual_seed(0)
        from torch.distributed.pipelining import PipelineStage
        from torch_pipeline_attach import Block

        blocks = [Block(WIDTH) for _ in range(LAYERS)]
        n, size = 2 * world, LAYERS // (2 * world)
        stages = [PipelineStage(nn.Sequential(*blocks[j * size:(j + 1) * size]), j, n, torch.device("cpu"))
                  for j in tc.local_stage_indices(name, world, 2, rank)]
    else:
        stages = build_stages(rank, world, v, LAYERS, WIDTH, torch.device("cpu"))
    cls = tc.schedule_class(name)
    sched = cls(stages, M, loss_fn=nn.MSELoss()) if v > 1 else cls(stages[0], M, loss_fn=nn.MSELoss())
    opt = torch.optim.SGD([p for s in stages for p in s.submod.parameters()], lr=0.05)
    return stages, sched, opt


def train(name: str, rank: int, world: int, steps: int, attach_dir: Path | None):
    stages, sched, opt = make(name, rank, world)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    counter = "harvest_fixtures.fake_tasks:Counter"
    h = flowride.harvest.attach(sched, run_dir=attach_dir, side_tasks=[counter],
                                profiles={counter: {"median_step_s": 0.002}}) if attach_dir else None
    if h is not None:  # let the side task start up (its process, its setup) before training
        if h.manager is not None:
            import time

            from flowride.harvest.store import TaskStore

            store = TaskStore.in_run_dir(attach_dir)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60 and any(str(t.state) in ("SUBMITTED", "CREATED") for t in store.list()):
                time.sleep(0.05)
            store.close()
        dist.barrier()
    losses_out = []
    for step in range(steps):
        x, y = batch(step, BATCH, WIDTH, torch.device("cpu"))
        losses: list = []
        sched.step(*((x,) if first else ()), target=y if last else None, losses=losses if last else None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if last:
            losses_out.append(float(torch.stack([t.detach() for t in losses]).mean()))
    info = {}
    if h is not None:
        computes = [r["end"] - r["compute"] for r in h.observer.records]
        summary = h.summary()
        record = h.close()
        info = {"summary": summary, "compute_median_s": statistics.median(computes),
                "manager_steps": len(record["steps"]) if record else None,
                "implied": (plan(sched, iterations=2) or {}).get(rank).implied,
                "types": summary["gap_types"]}
    return losses_out, info


def main() -> None:
    names, run_dir = sys.argv[1].split(","), Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    for name in names:
        out_dir = run_dir / name
        out_dir.mkdir(parents=True, exist_ok=True)
        plain, _ = train(name, rank, world, steps, None)
        dist.barrier()
        harvested, info = train(name, rank, world, steps, out_dir / "harvest")
        out = {"rank": rank, "plain": plain, "harvested": harvested, **info}
        (out_dir / f"check-rank{rank}.json").write_text(json.dumps(out))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
