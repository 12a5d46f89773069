"""The ``torch`` engine: flowride's model presets trained by torch.distributed.pipelining.

``flowride train --engine torch --schedule 1f1b|gpipe|interleaved1f1b|loopedbfs|interleavedzb|
zbv|dualpipev`` builds the same GPT pieces as the built-in engine (same split, same seed), wraps
each in a ``PipelineStage``, and lets torch's schedule class run the iteration. The bubble
observer (:mod:`flowride.pipeline.torch_observe`) times every compute action, so the run yields
the same records and the same report contract as the built-in engine, and the two engines can be
compared side by side.

Differences that are torch's, not ours: the loss is averaged by scaling the accumulated
gradients by 1/m after the last backward (``scale_grads``), where the built-in engine scales each
micro-batch's loss by 1/m before its backward; both give the same gradients up to float rounding.
"""

from __future__ import annotations

import torch

from flowride.pipeline import torch_compat as tc
from flowride.pipeline.config import TrainConfig
from flowride.pipeline.data import TokenSource
from flowride.pipeline.model import build_pieces, loss_fn, preset
from flowride.pipeline.reporter import BubbleReporter
from flowride.pipeline.torch_observe import observe


class TorchStageRunner:
    """This rank's stages under a torch schedule; ``iteration`` runs one ``step`` + optimizer."""

    def __init__(self, cfg: TrainConfig, rank: int, world: int, dev: torch.device, reporter: BubbleReporter) -> None:
        from torch.distributed.pipelining import PipelineStage

        self.cfg, self.rank, self.world, self.dev = cfg, rank, world, dev
        self.reporter = reporter
        self.mcfg = preset(cfg.model)
        self.P = cfg.stages * cfg.chunks
        self.mine = tc.local_stage_indices(cfg.schedule, cfg.stages, cfg.chunks, rank)
        self.pieces = {j: piece.to(dev) for j, piece in build_pieces(self.mcfg, self.P, cfg.seed, self.mine).items()}
        self.params = [p for j in self.mine for p in self.pieces[j].parameters()]
        self.opt = torch.optim.Adam(self.params, lr=cfg.lr)
        stages = [PipelineStage(self.pieces[j], j, self.P, dev) for j in self.mine]
        cls = tc.schedule_class(cfg.schedule)
        m = cfg.microbatches
        self.schedule = cls(stages, m, loss_fn=loss_fn) if cfg.chunks > 1 else cls(stages[0], m, loss_fn=loss_fn)
        self.observer = observe(self.schedule, reporter, steady=False, owns_iterations=False)
        self.data = TokenSource(self.mcfg.vocab_size, self.mcfg.seq_len, cfg.seed, cfg.data)
        self.has_first, self.has_last = 0 in self.mine, self.P - 1 in self.mine

    @property
    def gaps(self) -> list[str]:
        return self.observer.gap_types()

    def make_batch(self, it: int) -> torch.Tensor:
        return self.data.batch(it, self.cfg.microbatches, self.cfg.microbatch_size).to(self.dev)

    def iteration(self, it: int, batch: torch.Tensor) -> tuple[float | None, list[dict]]:
        m, mbs = self.cfg.microbatches, self.cfg.microbatch_size
        x = batch[:, :, :-1].reshape(m * mbs, -1)
        y = batch[:, :, 1:].reshape(m * mbs, -1)
        losses: list[torch.Tensor] = []
        args = (x,) if self.has_first else ()
        self.schedule.step(*args, target=y if self.has_last else None, losses=losses if self.has_last else None)
        recs = list(self.observer.records)
        t0 = self.reporter.clock()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t1 = self.reporter.clock()
        recs.append({"kind": "O", "mb": -1, "chunk": -1, "start": t0, "compute": t0, "end": t1})
        loss = float(torch.stack([t.detach() for t in losses]).mean()) if self.has_last else None
        return loss, recs

    def state_dicts(self) -> dict[int, dict]:
        return {j: self.pieces[j].state_dict() for j in self.mine}
