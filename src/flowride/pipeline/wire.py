"""Activations and gradients between model chunks, point to point over torch.distributed.

One home for the hand-over every stage does, real or stood in (:mod:`flowride.pipeline.rehearsal`):
which rank holds a chunk, the tag that names a tensor (kind, micro-batch, chunk), and the device
tensors travel through. A rehearsal runs on gloo with the real stage on a GPU and the stand-ins
on the CPU, so there the real stage's tensors cross through host memory (``wire`` = cpu), as
in the hybrid loop of benchmarks/gpu_harvest_check.sh; otherwise they travel from the stage's own
device (nccl on CUDA, gloo on CPU).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

ACT, GRAD = 0, 1  # the two kinds of tensor that cross between chunks


class Wire:
    """This rank's ends of the chunk-to-chunk hand-over."""

    def __init__(self, rank: int, owner: dict[int, int], microbatches: int, shape: tuple[int, ...],
                 dev: torch.device, wire: torch.device | None = None) -> None:
        self.rank = rank
        self.owner = owner  # chunk -> rank that holds it
        self.m = microbatches
        self.P = len(owner)
        self.shape = shape
        self.dev = dev
        self.wire = wire or dev
        self.local: dict[tuple, torch.Tensor] = {}  # same-rank hand-over (two chunks on one rank)

    def tag(self, kind: int, mb: int, j: int) -> int:
        return (kind * self.m + mb) * self.P + j

    def send(self, t: torch.Tensor, kind: int, mb: int, j: int, dst_chunk: int, pending: list) -> None:
        """Hand ``t`` (for chunk ``j``'s ``kind`` of micro-batch ``mb``) to the holder of ``dst_chunk``."""
        dst = self.owner[dst_chunk]
        if dst == self.rank:
            self.local[(kind, mb, j)] = t.detach().clone()
        else:
            pending.append(dist.isend(t.detach().to(self.wire).contiguous(), dst, tag=self.tag(kind, mb, j)))

    def recv(self, kind: int, mb: int, j: int, src_chunk: int) -> torch.Tensor:
        """The tensor the holder of ``src_chunk`` sent for chunk ``j``, on this stage's device."""
        src = self.owner[src_chunk]
        if src == self.rank:
            return self.local.pop((kind, mb, j))
        buf = torch.empty(self.shape, device=self.wire)
        dist.recv(buf, src, tag=self.tag(kind, mb, j))
        return buf.to(self.dev)
