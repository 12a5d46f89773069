"""A GPT-style decoder (nanoGPT-like) that can be cut into pipeline pieces.

The model is a flat list of layers: the embedding, ``n_layer`` transformer blocks, then the head
(final norm and vocabulary projection). ``split_layers`` cuts that list into consecutive pieces,
one per virtual pipeline stage; the embedding rides with the first piece, the head with the last.
Every rank builds the whole model from the same seed and keeps only its pieces, so the pipelined
and the single-process model start from identical weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from flowride.errors import InputError


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    seq_len: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0  # kept 0: pipelined and reference runs must compute the same thing


PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(vocab_size=256, seq_len=32, n_layer=4, n_head=2, d_model=64),
    "small": GPTConfig(vocab_size=512, seq_len=64, n_layer=8, n_head=4, d_model=192),
    "medium": GPTConfig(vocab_size=1024, seq_len=128, n_layer=12, n_head=8, d_model=384),
    # Bubbles of 0.1-0.5 s per stage on a 2-core CPU at p=2, m=4 (FreeRide measured 0.22-1.04 s on
    # GPUs), so a side task's 10-20 ms step is a realistic fit. Used by the harvest benchmarks.
    "large": GPTConfig(vocab_size=1024, seq_len=256, n_layer=12, n_head=8, d_model=384),
    # FreeRide's smallest model (1.2B parameters): for one GPU stage of a rehearsal
    # (benchmarks/gpu_harvest.py); far too big for a CPU run
    "gpt-1.2b": GPTConfig(vocab_size=8192, seq_len=1024, n_layer=24, n_head=16, d_model=2048),
}


def preset(name: str) -> GPTConfig:
    if name not in PRESETS:
        raise InputError("model", f"unknown model preset {name!r}", f"choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        return self.tok(idx) + self.pos(torch.arange(t, device=idx.device))


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP, each with a residual."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.d_model)
        self.lm = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.ln(x))


def build_layers(cfg: GPTConfig, seed: int) -> list[nn.Module]:
    """The whole model as a flat list of layers, initialised from ``seed``."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [Embedding(cfg)]
    layers += [Block(cfg) for _ in range(cfg.n_layer)]
    layers.append(Head(cfg))
    for layer in layers:
        for name, p in layer.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * cfg.n_layer) if name.endswith(("proj.weight", "out.weight")) else 1))
            elif name.endswith("bias"):
                nn.init.zeros_(p)
    return layers


def split_layers(cfg: GPTConfig, pieces: int) -> list[tuple[int, int]]:
    """[start, end) layer ranges of each piece: blocks split as evenly as possible, the embedding
    joined to the first piece and the head to the last."""
    if pieces < 1:
        raise InputError("stages", f"{pieces} pipeline pieces", "use at least one stage")
    if pieces > cfg.n_layer:
        raise InputError(
            "stages", f"{pieces} pipeline pieces (stages x chunks) for {cfg.n_layer} transformer blocks",
            "use fewer stages or chunks, or a bigger model",
        )
    base, extra = divmod(cfg.n_layer, pieces)
    bounds = []
    start = 1
    for i in range(pieces):
        n = base + (1 if i < extra else 0)
        bounds.append((start, start + n))
        start += n
    bounds[0] = (0, bounds[0][1])
    bounds[-1] = (bounds[-1][0], cfg.n_layer + 2)
    return bounds


class Piece(nn.Module):
    """Consecutive layers of the model run as one pipeline piece (virtual stage)."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build_pieces(cfg: GPTConfig, pieces: int, seed: int, keep: list[int] | None = None) -> dict[int, Piece]:
    """Pieces (by virtual stage index) of the model built from ``seed``; ``keep`` selects some."""
    layers = build_layers(cfg, seed)
    bounds = split_layers(cfg, pieces)
    wanted = range(pieces) if keep is None else keep
    return {j: Piece(layers[bounds[j][0] : bounds[j][1]]) for j in wanted}


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
