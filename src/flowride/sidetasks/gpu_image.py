"""GPU image-processing side task ``gpu-image``: resize, filter and watermark batches on the device.

FreeRide's "image processing" kind of side task as it runs on a GPU. A step generates a batch of
images on the device (smooth random colour fields plus fine noise, from a device generator
re-seeded from ``(seed, batch)``), resizes it with ``F.interpolate``, runs the ``filters``
(depthwise ``conv2d``: Gaussian blur, sharpen, Sobel edge magnitude) in order, alpha-blends a
generated watermark and quantises to 8-bit, as an image pipeline would store it.

Nothing leaves the device during a step: instead of hashing the bytes on the CPU (as the ``image``
task does with SHA-256), each batch is folded into a position-weighted integer checksum on the
device, chained modulo the prime ``2^31 - 1``. Integer sums are exact in any order, so the
checksum is deterministic on CUDA too, and "did a resumed run produce exactly the same images?"
is one integer compare. ``state()`` reads it (the only host copy); a step ends with one sync of
the current stream, so its measured time is the time its kernels took.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from flowride.harvest.task import IterativeTask, parse_params
from flowride.sidetasks.gpu_common import (
    StepRng,
    check_device,
    check_identity,
    deterministic_kernels,
    need,
    prepare,
    sync,
)

MODES = ("nearest", "bilinear", "bicubic", "area")
FILTERS = ("blur", "sharpen", "sobel")
MOD = 2**31 - 1  # the checksum chain's modulus (a prime)
_MUL = 1_000_003  # chain multiplier: MOD x _MUL < 2^63, no int64 overflow
_WEIGHT_PERIOD = 65521  # per-position weights 1..65521: 255 x 65521 fits an int32


@dataclass(frozen=True)
class GpuImageConfig:
    """Parameters of ``gpu-image``. ``batch_size``, ``in_size`` and ``out_size`` size a step."""

    seed: int = 0
    batch_size: int = 4
    in_size: int = 256
    out_size: int = 128
    total_batches: int = 1000
    alpha: float = 0.35  # watermark opacity
    mode: str = "bilinear"
    antialias: bool = True
    filters: str = "blur,sharpen,sobel"  # applied in this order after the resize; "" for none
    device: str = "auto"

    @classmethod
    def from_params(cls, params: dict[str, Any], task: str = "gpu-image") -> GpuImageConfig:
        """Validate submitted params: a typo in a name must fail loudly, not run the default."""
        c = parse_params(cls, params, task)
        need(task, c.seed >= 0, "seed", c.seed, "must be >= 0")
        need(task, 1 <= c.batch_size <= 1024, "batch_size", c.batch_size, "must be in 1..1024")
        need(task, 8 <= c.in_size <= 4096, "in_size", c.in_size, "must be in 8..4096")
        need(task, 8 <= c.out_size <= 4096, "out_size", c.out_size, "must be in 8..4096")
        need(task, c.total_batches >= 0, "total_batches", c.total_batches, "must be >= 0")
        need(task, 0.0 <= c.alpha <= 1.0, "alpha", c.alpha, "must be in [0, 1]")
        need(task, c.mode in MODES, "mode", c.mode, f"must be one of {MODES}")
        bad = [f for f in c.filter_list() if f not in FILTERS]
        need(task, not bad, "filters", c.filters, f"names {bad}; give a comma list of {FILTERS}")
        check_device(c.device, task)
        return c

    def filter_list(self) -> list[str]:
        return [f.strip() for f in self.filters.split(",") if f.strip()]

    def identity(self) -> dict[str, Any]:
        """The fields that define the images: progress is only valid for the same values."""
        d = asdict(self)
        d.pop("total_batches")
        d.pop("device")
        return d


def initial_checksum(identity: dict[str, Any]) -> int:
    """Start of the chain, tied to the identity so different jobs never share a checksum."""
    digest = hashlib.sha256(
        b"flowride-gpu-image\0" + json.dumps(identity, sort_keys=True).encode()
    ).digest()
    return int.from_bytes(digest[:8], "little") % MOD


def _kernels(device: torch.device) -> dict[str, torch.Tensor]:
    """Depthwise 3-channel conv weights: 5x5 Gaussian (sigma 1), 3x3 sharpen, Sobel x and y."""
    g = torch.exp(-((torch.arange(5, dtype=torch.float32) - 2.0) ** 2) / 2.0)
    g = torch.outer(g, g)
    sharpen = torch.tensor([[0.0, -1.0, 0.0], [-1.0, 5.0, -1.0], [0.0, -1.0, 0.0]])
    sx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]) / 4.0
    k = {"blur": g / g.sum(), "sharpen": sharpen, "sobel_x": sx, "sobel_y": sx.t().contiguous()}
    return {name: w.expand(3, 1, *w.shape).contiguous().to(device) for name, w in k.items()}


def make_watermark(
    size: int, alpha: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A striped disc with a ring, bottom right: (opacity mask (1,1,S,S), colour (1,3,1,1))."""
    c = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    v, u = torch.meshgrid(c, c, indexing="ij")
    r = torch.sqrt((u - 0.75) ** 2 + (v - 0.75) ** 2)
    stripes = torch.remainder((u + v) * 12.0, 1.0) < 0.5
    mask = (((r < 0.16) & stripes) | ((r > 0.18) & (r < 0.21))).to(torch.float32) * alpha
    colour = torch.tensor([0.95, 0.95, 0.9]).view(1, 3, 1, 1)
    return mask.view(1, 1, size, size).to(device), colour.to(device)


class GpuImageKernel:
    """The per-batch pipeline, all on one device (reusable outside the task, e.g. in a test)."""

    def __init__(self, cfg: GpuImageConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.rng = StepRng(device, cfg.seed, "gpu-image")
        self.kernels = _kernels(device)
        self.mask, self.colour = make_watermark(cfg.out_size, cfg.alpha, device)
        numel = 3 * cfg.out_size**2
        weights = torch.arange(numel, dtype=torch.int32) % _WEIGHT_PERIOD + 1
        self.weights = weights.view(1, 3, cfg.out_size, cfg.out_size).to(device)
        self.image_weights = torch.arange(1, cfg.batch_size + 1, dtype=torch.int64, device=device)

    def source(self, index: int) -> torch.Tensor:
        """Generated input batch ``index`` (B, 3, in, in) in [0, 1], drawn on the device."""
        cfg, gen = self.cfg, self.rng.at(index)
        coarse = max(2, cfg.in_size // 8)
        low = torch.rand(cfg.batch_size, 3, coarse, coarse, generator=gen, device=self.device)
        img = F.interpolate(
            low, size=(cfg.in_size, cfg.in_size), mode="bilinear", align_corners=False
        )
        noise = torch.randn(img.shape, generator=gen, device=self.device)
        return img.add_(noise, alpha=0.05).clamp_(0.0, 1.0)

    def _filter(self, x: torch.Tensor, name: str) -> torch.Tensor:
        k = self.kernels
        if name == "sobel":
            gx = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), k["sobel_x"], groups=3)
            gy = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), k["sobel_y"], groups=3)
            return torch.sqrt(gx * gx + gy * gy)
        w = k[name]
        pad = w.shape[-1] // 2
        return F.conv2d(F.pad(x, (pad,) * 4, mode="replicate"), w, groups=3)

    def process(self, index: int) -> torch.Tensor:
        """Resize, filter and watermark batch ``index``; uint8 (B, 3, out, out) on the device."""
        cfg = self.cfg
        kw: dict[str, Any] = {"size": (cfg.out_size, cfg.out_size), "mode": cfg.mode}
        if cfg.mode in ("bilinear", "bicubic"):
            kw.update(align_corners=False, antialias=cfg.antialias)
        x = F.interpolate(self.source(index), **kw)
        for name in cfg.filter_list():
            x = self._filter(x, name)
        x = x * (1.0 - self.mask) + self.colour * self.mask
        return (x.clamp_(0.0, 1.0) * 255.0).round_().to(torch.uint8)

    def fold(self, checksum: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The chain after one more batch: ``(c * 1000003 + weighted sum) mod (2^31 - 1)``.

        Each pixel is weighted by its position in the image, each image by its place in the
        batch, so moved pixels or swapped images change the sum. No intermediate reaches 2^63.
        """
        per_image = (out.to(torch.int32) * self.weights).sum(dim=(1, 2, 3), dtype=torch.int64) % MOD
        batch = (per_image * self.image_weights).sum() % MOD
        return (checksum * _MUL + batch) % MOD


class GpuImageTask(IterativeTask):
    """One batch per step; returns the number of images (unit ``images``).

    ``checksum`` (the chain over every batch so far) and ``last_mean`` are kept on the
    device and copied to the host only by ``state()``.
    """

    name = "gpu-image"
    unit = "images"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config = GpuImageConfig.from_params(params, self.name)
        self.kernel: GpuImageKernel | None = None
        self.next_batch = 0

    def _identity(self) -> dict[str, Any]:
        return {**self.config.identity(), "rng": self.device.type}

    def setup(self) -> None:
        if self.kernel is not None:
            return
        self.device = prepare(self.name, self.config.device)
        self.kernel = GpuImageKernel(self.config, self.device)
        self.checksum = torch.tensor(
            initial_checksum(self._identity()), dtype=torch.int64, device=self.device
        )
        self.last_mean = torch.zeros((), device=self.device)

    def step(self) -> float:
        self.setup()
        assert self.kernel is not None
        if self.finished():
            return 0.0
        with deterministic_kernels():
            out = self.kernel.process(self.next_batch)
        self.checksum = self.kernel.fold(self.checksum, out)
        self.last_mean = out.float().mean()
        self.next_batch += 1
        sync(self.device)  # the step's one sync: its kernels are done when it returns
        return float(out.shape[0])

    def finished(self) -> bool:
        return self.next_batch >= self.config.total_batches

    def state(self) -> dict[str, Any]:
        self.setup()
        return {
            "task": self.name,
            "identity": self._identity(),
            "next_batch": self.next_batch,
            "checksum": int(self.checksum),
            "last_mean": float(self.last_mean),  # mean 8-bit value of the latest batch
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume at the saved batch; refuse progress made on different images."""
        self.setup()
        check_identity(self.name, state, self._identity())
        self.next_batch = int(state["next_batch"])
        self.checksum = torch.tensor(int(state["checksum"]), dtype=torch.int64, device=self.device)
        self.last_mean = torch.tensor(float(state["last_mean"]), device=self.device)
