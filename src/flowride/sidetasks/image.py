"""Image resize + watermark side tasks: ``image`` (iterative) and ``image-proc`` (imperative).

This stands in for FreeRide's image-processing side task: a batch of images is resized with
``torch.nn.functional.interpolate`` and a generated watermark is alpha-blended on top. The
outputs are quantised to 8-bit (what an image pipeline would store) and folded into a running
SHA-256 chain, so "did a resumed run produce exactly the same images?" is one string compare.

Batch ``b`` is generated from ``numpy.random.default_rng([seed, b])``: the only progress to
keep is the next batch index and the checksum so far.

The two forms do the same work and, for the same params, end with the same checksum:

- ``image``: one batch per ``step``; the harvester checkpoints ``state()``.
- ``image-proc``: :func:`image_proc_main` is a free-form loop run as its own process. The
  harvester pauses it with SIGSTOP / SIGCONT; on SIGTERM it finishes the batch in hand, writes
  its checkpoint and returns (the process exits 0). It also checkpoints every
  ``checkpoint_every`` batches, so a crash or SIGKILL loses at most that much work.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from flowride.files import write_json_atomic
from flowride.harvest.task import ImperativeSpec, IterativeTask, parse_params

_CHECKPOINT_VERSION = 1
_MODES = ("nearest", "bilinear", "bicubic", "area")


@dataclass(frozen=True)
class ImageConfig:
    """Parameters of both image tasks (``checkpoint_every`` matters only to ``image-proc``)."""

    seed: int = 0
    batch_size: int = 16
    in_size: int = 128
    out_size: int = 64
    total_batches: int = 100
    alpha: float = 0.35  # watermark opacity
    mode: str = "bilinear"
    antialias: bool = True
    checkpoint_every: int = 20

    @classmethod
    def from_params(cls, params: dict[str, Any], task: str = "image") -> ImageConfig:
        """Validate submitted params: a typo in a name must fail loudly, not run the default."""
        cfg = parse_params(cls, params, task)
        if cfg.seed < 0 or cfg.batch_size < 1 or cfg.total_batches < 0:
            raise ValueError(f"{task}: need seed >= 0, batch_size >= 1, total_batches >= 0")
        if not (8 <= cfg.in_size <= 4096 and 8 <= cfg.out_size <= 4096) or cfg.batch_size > 1024:
            raise ValueError(f"{task}: in_size and out_size must be in 8..4096, batch_size at most 1024")
        if not 0.0 <= cfg.alpha <= 1.0:
            raise ValueError(f"{task}: alpha must be in [0, 1]")
        if cfg.mode not in _MODES:
            raise ValueError(f"{task}: mode must be one of {_MODES}")
        if cfg.checkpoint_every < 1:
            raise ValueError(f"{task}: checkpoint_every must be >= 1")
        return cfg

    def identity(self) -> dict[str, Any]:
        """The fields that define the images: progress is only valid for the same values."""
        d = asdict(self)
        d.pop("total_batches")
        d.pop("checkpoint_every")
        return d


def initial_checksum(cfg: ImageConfig) -> str:
    """Start of the chain, tied to the identity so different jobs never share a checksum."""
    text = json.dumps(cfg.identity(), sort_keys=True).encode()
    return hashlib.sha256(b"flowride-image\0" + text).hexdigest()


def chain_checksum(checksum: str, out: torch.Tensor) -> str:
    """Fold one batch of uint8 output into the running SHA-256 chain."""
    h = hashlib.sha256(bytes.fromhex(checksum))
    h.update(out.contiguous().numpy().tobytes())
    return h.hexdigest()


def make_watermark(size: int, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A generated watermark: a striped disc with a ring, bottom right. Returns (mask, colour).

    ``mask`` (1, 1, size, size) is the per-pixel opacity (already scaled by ``alpha``) and
    ``colour`` (1, 3, 1, 1) the watermark colour; blending is ``img * (1 - mask) + colour * mask``.
    """
    c = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    v, u = torch.meshgrid(c, c, indexing="ij")
    r = torch.sqrt((u - 0.75) ** 2 + (v - 0.75) ** 2)
    stripes = torch.remainder((u + v) * 12.0, 1.0) < 0.5
    disc = (r < 0.16) & stripes
    ring = (r > 0.18) & (r < 0.21)
    mask = (disc | ring).to(torch.float32) * alpha
    colour = torch.tensor([0.95, 0.95, 0.9]).view(1, 3, 1, 1)
    return mask.view(1, 1, size, size), colour


class ImageKernel:
    """The per-batch work shared by both task forms (so their checksums agree)."""

    def __init__(self, cfg: ImageConfig) -> None:
        self.cfg = cfg
        self.mask, self.colour = make_watermark(cfg.out_size, cfg.alpha)

    def source(self, index: int) -> torch.Tensor:
        """Generated input batch ``index``: smooth random colour fields plus fine noise, in [0, 1]."""
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, index])
        coarse = max(2, cfg.in_size // 8)
        low = torch.from_numpy(rng.random((cfg.batch_size, 3, coarse, coarse), dtype=np.float32))
        img = F.interpolate(
            low, size=(cfg.in_size, cfg.in_size), mode="bilinear", align_corners=False
        )
        noise = rng.standard_normal(img.shape, dtype=np.float32)
        return (img + 0.05 * torch.from_numpy(noise)).clamp_(0.0, 1.0)

    def process(self, index: int) -> torch.Tensor:
        """Resize and watermark batch ``index``; return it as uint8 (B, 3, out, out)."""
        cfg = self.cfg
        img = self.source(index)
        kw: dict[str, Any] = {"size": (cfg.out_size, cfg.out_size), "mode": cfg.mode}
        if cfg.mode in ("bilinear", "bicubic"):
            kw["align_corners"] = False
            kw["antialias"] = cfg.antialias
        small = F.interpolate(img, **kw)
        out = small * (1.0 - self.mask) + self.colour * self.mask
        return (out.clamp_(0.0, 1.0) * 255.0).round_().to(torch.uint8)


class ImageTask(IterativeTask):
    """Iterative form: one batch per step, returns the number of images (unit ``images``)."""

    name = "image"
    unit = "images"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config = ImageConfig.from_params(params, self.name)
        self.kernel: ImageKernel | None = None
        self.next_batch = 0
        self.checksum = initial_checksum(self.config)

    def setup(self) -> None:
        """One torch thread: a side task must leave the other cores to training."""
        if self.kernel is None:
            torch.set_num_threads(1)
            self.kernel = ImageKernel(self.config)

    def step(self) -> float:
        if self.kernel is None:
            self.setup()
        assert self.kernel is not None
        if self.finished():
            return 0.0
        out = self.kernel.process(self.next_batch)
        self.checksum = chain_checksum(self.checksum, out)
        self.next_batch += 1
        return float(out.shape[0])

    def finished(self) -> bool:
        return self.next_batch >= self.config.total_batches

    def state(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "identity": self.config.identity(),
            "next_batch": self.next_batch,
            "checksum": self.checksum,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume at the saved batch; refuse progress made on different images."""
        if state.get("task") != self.name or state.get("identity") != self.config.identity():
            raise ValueError("image: state was saved by a task with different image params")
        self.next_batch = int(state["next_batch"])
        self.checksum = str(state["checksum"])


def write_checkpoint_atomic(path: str, payload: dict[str, Any]) -> None:
    """Write JSON via a temp file in the same directory + ``os.replace``.

    A reader (or a restart after a kill mid-write) sees the old checkpoint or the new one,
    never a torn file. fsync first, so the rename cannot land before the data on a crash.
    """
    write_json_atomic(path, payload, sort_keys=True)


def read_checkpoint(path: str) -> dict[str, Any] | None:
    """The ``image-proc`` checkpoint at ``path``, or None when there is none yet."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def image_proc_main(params: dict[str, Any], checkpoint_path: str) -> None:
    """Imperative ``image-proc``: process batches until ``total_batches`` or SIGTERM.

    Resumes from ``checkpoint_path`` when it exists. The SIGTERM handler only sets a flag: the
    loop finishes the batch in hand (milliseconds), writes the checkpoint and returns, so the
    hosting process exits 0 with consistent progress on disk (writing from inside the handler
    could record a checksum that already includes a batch whose index was not yet advanced).
    A SIGTERM sent while the process is SIGSTOPped is handled as soon as it gets SIGCONT.
    The handler is only installed from the main thread (Python allows no other) and the
    previous one is restored on return.

    The checkpoint (JSON) holds ``next_batch``, ``checksum``, ``done``, ``starts`` (how many
    times ``main`` has run on it) and ``batches_this_start``.
    """
    cfg = ImageConfig.from_params(params, "image-proc")
    torch.set_num_threads(1)
    saved = read_checkpoint(checkpoint_path)
    if saved is not None:
        if saved.get("task") != "image-proc" or saved.get("identity") != cfg.identity():
            raise ValueError(f"image-proc: checkpoint {checkpoint_path} belongs to a different job")
        next_batch, checksum = int(saved["next_batch"]), str(saved["checksum"])
        starts = int(saved.get("starts", 0)) + 1
    else:
        next_batch, checksum, starts = 0, initial_checksum(cfg), 1
    done_here = 0
    stop = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def save() -> None:
        write_checkpoint_atomic(
            checkpoint_path,
            {
                "version": _CHECKPOINT_VERSION,
                "task": "image-proc",
                "identity": cfg.identity(),
                "next_batch": next_batch,
                "units": next_batch * cfg.batch_size,  # images processed so far (for the harvester)
                "checksum": checksum,
                "done": next_batch >= cfg.total_batches,
                "starts": starts,
                "batches_this_start": done_here,
            },
        )

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main_thread else None
    try:
        kernel = ImageKernel(cfg)
        while next_batch < cfg.total_batches and not stop.is_set():
            out = kernel.process(next_batch)
            checksum = chain_checksum(checksum, out)
            next_batch += 1
            done_here += 1
            if next_batch % cfg.checkpoint_every == 0:
                save()
        save()
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


# the ``image-proc`` entry point (pyproject.toml): an ImperativeSpec is an object, not a class
IMAGE_PROC = ImperativeSpec("image-proc", image_proc_main, unit="images")
