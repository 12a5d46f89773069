"""Models and on-device data generators of the GPU training side tasks (:mod:`gpu_train`).

Kept apart from the tasks so each can be read (and tested) alone: a generator takes a device
:class:`torch.Generator` and returns a batch on that device without any host synchronisation
(no boolean indexing, no ``.item()``), so a training step's only sync is its loss read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_N_SHAPES = 4  # square, disc, ring, cross (as cnn.make_batch)


def cnn_batch(
    gen: torch.Generator, palette: torch.Tensor, coords: torch.Tensor, batch_size: int, noise: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of :func:`flowride.sidetasks.cnn.make_batch`'s images, drawn on ``gen``'s device.

    Class ``c`` draws shape ``c % 4`` in colour ``palette[c]`` at a random place and size, so a
    classifier needs colour and (translation-invariant) shape features. No host sync: shape
    selection is a gather, never a boolean index.
    """
    dev = palette.device
    b, num_classes = batch_size, palette.shape[0]
    labels = torch.randint(0, num_classes, (b,), generator=gen, device=dev)
    u = torch.rand(b, 3, generator=gen, device=dev)
    cy = (0.3 + 0.4 * u[:, 0]).view(b, 1, 1)
    cx = (0.3 + 0.4 * u[:, 1]).view(b, 1, 1)
    r = (0.15 + 0.15 * u[:, 2]).view(b, 1, 1)
    dy = (coords.view(1, -1, 1) - cy).abs()
    dx = (coords.view(1, 1, -1) - cx).abs()
    dist2 = dy * dy + dx * dx
    disc = dist2 < r * r
    masks = torch.stack(
        [
            (dy < r) & (dx < r),  # square
            disc,
            disc & (dist2 > (0.55 * r) ** 2),  # ring
            ((dy < r / 3) & (dx < r)) | ((dx < r / 3) & (dy < r)),  # cross
        ],
        dim=1,
    )  # (B, shape, S, S)
    pick = (labels % _N_SHAPES).view(b, 1, 1, 1).expand(b, 1, *masks.shape[2:])
    mask = masks.gather(1, pick).to(palette.dtype)  # (B, 1, S, S)
    colour = palette[labels] + 0.05 * torch.randn(b, 3, generator=gen, device=dev)
    background = torch.rand(b, 3, generator=gen, device=dev)
    img = background.view(b, 3, 1, 1) + mask * (colour - background).view(b, 3, 1, 1)
    img = img + noise * torch.randn(img.shape, generator=gen, device=dev)
    return (img - 0.5) / 0.3, labels


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention (SDPA) and a 4x GELU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token + learned position embeddings, ``n_layers`` blocks, final norm, tied output head."""

    def __init__(self, vocab: int, seq_len: int, d: int, n_layers: int, heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.pos = nn.Parameter(torch.randn(seq_len, d) * 0.02)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x) @ self.tok.weight.t()


def chain_powers(vocab: int, length: int, seed: int) -> torch.Tensor:
    """``table[k, t] = perm^k(t)`` for the chain's fixed random permutation (CPU, at setup)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(vocab, generator=gen)
    rows = [torch.arange(vocab)]
    for _ in range(length - 1):
        rows.append(perm[rows[-1]])
    return torch.stack(rows)


def markov_batch(
    gen: torch.Generator, table: torch.Tensor, batch_size: int, reset_prob: float
) -> torch.Tensor:
    """``(batch_size, L)`` tokens of the chain, ``L = table.shape[0]``, vectorised over time."""
    dev = table.device
    length, vocab = table.shape
    pos = torch.arange(length, device=dev)
    jump = torch.rand(batch_size, length, generator=gen, device=dev) < reset_prob
    jump[:, 0] = True
    fresh = torch.randint(0, vocab, (batch_size, length), generator=gen, device=dev)
    last = torch.where(jump, pos, 0).cummax(dim=1).values  # position of the latest jump
    return table[pos - last, fresh.gather(1, last)]
