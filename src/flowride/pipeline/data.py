"""Training data the trainer makes itself (or reads from a small text file the user gives).

The synthetic stream is a seeded sparse Markov chain: each token has a handful of likely
successors, so a model can really learn it and the loss falls from ln(vocab) toward the chain's
entropy. Batches depend only on (seed, iteration), so every rank and the single-process reference
see the same data without talking to each other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from flowride.errors import InputError
from flowride.sizes import MAX_DATA_BYTES


class TokenSource:
    """Batches of shape [microbatches, microbatch_size, seq_len + 1] for each iteration."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int = 0, text_file: str | None = None, branching: int = 4) -> None:
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed
        self.text: np.ndarray | None = None
        if text_file:
            try:
                if Path(text_file).is_dir():
                    raise InputError("--data", f"{text_file} is a directory", "give a text file")
                with open(text_file, "rb") as f:  # at most the limit (a pipe or /dev/zero has no size)
                    raw = f.read(MAX_DATA_BYTES + 1)
            except OSError as e:
                raise InputError("--data", f"cannot read {text_file}: {e.strerror or e}", "give an existing text file") from None
            if len(raw) > MAX_DATA_BYTES:
                raise InputError("--data", f"{text_file} is over the {MAX_DATA_BYTES >> 20} MiB limit", "give a smaller text file")
            if len(raw) < seq_len + 2:
                raise InputError("--data", f"{text_file} has {len(raw)} bytes", f"give at least {seq_len + 2} bytes of text")
            if vocab_size < 256:
                raise InputError("--data", "byte-level text needs a vocabulary of 256", "use the small or medium model")
            self.text = np.frombuffer(raw, dtype=np.uint8)  # bytes; widened per batch
        else:
            rng = np.random.default_rng(seed)
            self.succ = rng.integers(0, vocab_size, size=(vocab_size, branching))
            p = rng.dirichlet(np.ones(branching) * 0.5, size=vocab_size)
            self.cum = np.cumsum(p, axis=1)

    def batch(self, iteration: int, microbatches: int, microbatch_size: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, iteration, 7])
        n = microbatches * microbatch_size
        t1 = self.seq_len + 1
        if self.text is not None:
            starts = rng.integers(0, len(self.text) - t1, size=n)
            out = np.stack([self.text[s : s + t1] for s in starts]).astype(np.int64)
        else:
            out = np.empty((n, t1), dtype=np.int64)
            out[:, 0] = rng.integers(0, self.vocab_size, size=n)
            u = rng.random((n, t1))
            for t in range(1, t1):
                prev = out[:, t - 1]
                choice = (u[:, t, None] > self.cum[prev]).sum(axis=1)
                out[:, t] = self.succ[prev, np.minimum(choice, self.succ.shape[1] - 1)]
        return torch.from_numpy(out.reshape(microbatches, microbatch_size, t1))
