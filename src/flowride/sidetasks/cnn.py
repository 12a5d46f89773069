"""``cnn``: train a small ResNet-style CNN on generated images, one SGD batch per step.

This stands in for the ResNet/VGG training side tasks of FreeRide: a compute-bound task whose
step is one optimiser update, so the harvester can fit whole steps into pipeline bubbles.

Everything is generated from ``seed``: the model initialisation (under a forked torch RNG, so the
host process's own random stream is left alone) and every batch. Batch ``i`` is drawn from
``numpy.random.default_rng([seed, i])``, so the data needs no state of its own and a resumed run
sees exactly the batches an uninterrupted run would have seen.

The images are learnable on purpose (each class is a colour and a shape at a random position,
on a random background, with noise), so the loss really falls and a broken optimiser or a bad
resume shows up as a stalled loss rather than passing silently.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from flowride.harvest.task import IterativeTask, parse_params

_N_SHAPES = 4  # square, disc, ring, cross


@dataclass(frozen=True)
class CnnConfig:
    """Parameters of the ``cnn`` task (all JSON-friendly, all with small defaults)."""

    seed: int = 0
    batch_size: int = 32
    total_steps: int = 500
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    num_classes: int = 4
    image_size: int = 32
    width: int = 16
    noise: float = 0.25
    # Stop early once the moving average of the training loss falls below this (None: never).
    target_loss: float | None = None
    device: str = "cpu"

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> CnnConfig:
        """Validate submitted params: a typo in a name must fail loudly, not run the default."""
        cfg = parse_params(cls, params, "cnn")
        if cfg.seed < 0:
            raise ValueError("cnn: seed must be >= 0")
        if cfg.batch_size < 1 or cfg.total_steps < 0:
            raise ValueError("cnn: batch_size must be >= 1 and total_steps >= 0")
        if not 2 <= cfg.num_classes <= 32:
            raise ValueError("cnn: num_classes must be in 2..32")
        if not 8 <= cfg.image_size <= 512 or not 1 <= cfg.width <= 512 or cfg.batch_size > 4096:
            raise ValueError("cnn: image_size must be in 8..512, width in 1..512, batch_size at most 4096")
        if cfg.lr <= 0 or not 0 <= cfg.momentum < 1 or cfg.weight_decay < 0 or cfg.noise < 0:
            raise ValueError("cnn: need lr > 0, 0 <= momentum < 1, weight_decay >= 0, noise >= 0")
        return cfg

    def identity(self) -> dict[str, Any]:
        """The fields that define the model and its data: a state is only valid for these."""
        d = asdict(self)
        for k in ("total_steps", "target_loss", "device"):
            d.pop(k)
        return d


def class_palette(num_classes: int) -> np.ndarray:
    """One colour per class, spread round the hue circle (fixed, independent of the seed)."""
    hue = np.arange(num_classes)[:, None] / num_classes
    phase = np.arange(3)[None, :] / 3.0
    return (0.5 + 0.45 * np.cos(2 * np.pi * (hue + phase))).astype(np.float32)


def make_batch(
    seed: int, index: int, batch_size: int, num_classes: int, image_size: int, noise: float
) -> tuple[np.ndarray, np.ndarray]:
    """Batch ``index`` of the synthetic data set: images (B, 3, S, S) float32 and labels (B,).

    Class ``c`` draws shape ``c % 4`` in colour ``palette[c]`` at a random place and size, so a
    classifier needs both colour and (translation-invariant) shape features.
    """
    rng = np.random.default_rng([seed, index])
    labels = rng.integers(0, num_classes, size=batch_size)
    s = image_size
    coords = (np.arange(s, dtype=np.float32) + 0.5) / s
    yy = coords[None, :, None]
    xx = coords[None, None, :]
    cy = rng.uniform(0.3, 0.7, size=batch_size).astype(np.float32)[:, None, None]
    cx = rng.uniform(0.3, 0.7, size=batch_size).astype(np.float32)[:, None, None]
    r = rng.uniform(0.15, 0.3, size=batch_size).astype(np.float32)[:, None, None]
    dy, dx = np.abs(yy - cy), np.abs(xx - cx)
    dist2 = dy * dy + dx * dx
    masks = np.stack(
        [
            (dy < r) & (dx < r),  # square
            dist2 < r * r,  # disc
            (dist2 < r * r) & (dist2 > (0.55 * r) ** 2),  # ring
            ((dy < r / 3) & (dx < r)) | ((dx < r / 3) & (dy < r)),  # cross
        ]
    )  # (shape, B, S, S)
    mask = masks[labels % _N_SHAPES, np.arange(batch_size)].astype(np.float32)[:, None]
    colour = class_palette(num_classes)[labels]
    colour = colour + rng.normal(0.0, 0.05, size=colour.shape).astype(np.float32)
    background = rng.uniform(0.0, 1.0, size=(batch_size, 3)).astype(np.float32)
    img = background[:, :, None, None] + mask * (colour - background)[:, :, None, None]
    img += rng.normal(0.0, noise, size=img.shape).astype(np.float32)
    return ((img - 0.5) / 0.3).astype(np.float32), labels.astype(np.int64)


MIN_STEPS_FOR_TARGET = 10  # the loss EMA is meaningless before it has seen a few batches


def training_finished(steps_done: int, total_steps: int, target_loss: float | None, ema_loss: float) -> bool:
    """A training side task is done after ``total_steps``, or once its loss EMA is under
    ``target_loss`` (judged only after a few batches). Shared by ``cnn`` and the ``gpu-*`` trainers."""
    if steps_done >= total_steps:
        return True
    return target_loss is not None and steps_done >= MIN_STEPS_FOR_TARGET and ema_loss < target_loss


class _Block(nn.Module):
    """A basic residual block (two 3x3 convs), with a 1x1 projection when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """Stride-2 stem, two residual blocks (the second halves the resolution), pool, linear.

    Sized so one batch of 32 at 32x32 trains in a few milliseconds on one core.
    """

    def __init__(self, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        self.block1 = _Block(width, width, 1)
        self.block2 = _Block(width, 2 * width, 2)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.block1(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class CnnTask(IterativeTask):
    """Train :class:`SmallResNet` with SGD + momentum; a step is one batch.

    ``step`` returns the batch size (unit ``samples``), so throughput is samples per second.
    ``last_loss`` / ``last_accuracy`` describe the latest batch; ``ema_loss`` smooths the loss
    for the optional ``target_loss`` stopping rule.
    """

    name = "cnn"
    unit = "samples"
    _EMA = 0.9

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config = CnnConfig.from_params(params)
        self.steps_done = 0
        self.last_loss = math.nan
        self.last_accuracy = math.nan
        self.ema_loss = math.nan
        self.model: SmallResNet | None = None
        self.optimizer: torch.optim.SGD | None = None

    def setup(self) -> None:
        """Build the model deterministically from the seed; limit torch to one thread.

        A side task must not take every core from the training process, and one thread also
        keeps CPU results bitwise reproducible, which exact resumption relies on.
        """
        if self.model is not None:
            return
        torch.set_num_threads(1)
        cfg = self.config
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"cnn: device {cfg.device!r} requested but CUDA is not available")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            model = SmallResNet(cfg.num_classes, cfg.width)
        self.model = model.to(cfg.device).train()
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=cfg.lr,
            momentum=cfg.momentum,
            weight_decay=cfg.weight_decay,
        )

    def step(self) -> float:
        """Train on batch number ``steps_done``; return the number of samples it held."""
        if self.model is None:
            self.setup()
        assert self.model is not None and self.optimizer is not None
        cfg = self.config
        x_np, y_np = make_batch(
            cfg.seed, self.steps_done, cfg.batch_size, cfg.num_classes, cfg.image_size, cfg.noise
        )
        x = torch.from_numpy(x_np).to(cfg.device)
        y = torch.from_numpy(y_np).to(cfg.device)
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.last_loss = float(loss.detach())
        self.last_accuracy = float((logits.detach().argmax(1) == y).float().mean())
        self.ema_loss = (
            self.last_loss
            if math.isnan(self.ema_loss)
            else self._EMA * self.ema_loss + (1 - self._EMA) * self.last_loss
        )
        self.steps_done += 1
        return float(cfg.batch_size)

    def finished(self) -> bool:
        return training_finished(self.steps_done, self.config.total_steps, self.config.target_loss, self.ema_loss)

    def state(self) -> dict[str, Any]:
        """Deep copies on the CPU: the snapshot must not change as training goes on."""
        if self.model is None:
            self.setup()
        assert self.model is not None and self.optimizer is not None
        return {
            "task": self.name,
            "identity": self.config.identity(),
            "steps_done": self.steps_done,
            "last_loss": self.last_loss,
            "last_accuracy": self.last_accuracy,
            "ema_loss": self.ema_loss,
            "model": {
                k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
            },
            "optimizer": _to_cpu(copy.deepcopy(self.optimizer.state_dict())),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore weights, momentum and counters; refuse a state from a different model/data."""
        if state.get("task") != self.name or state.get("identity") != self.config.identity():
            raise ValueError("cnn: state was saved by a task with a different model or data")
        if self.model is None:
            self.setup()
        assert self.model is not None and self.optimizer is not None
        self.model.load_state_dict(state["model"])
        # The optimiser keeps loaded tensors by reference: copy, so our later in-place momentum
        # updates cannot reach back into the caller's snapshot.
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.steps_done = int(state["steps_done"])
        self.last_loss = float(state["last_loss"])
        self.last_accuracy = float(state["last_accuracy"])
        self.ema_loss = float(state["ema_loss"])


def _to_cpu(obj: Any) -> Any:
    """Move every tensor in a nested optimiser state to the CPU, so it unpickles anywhere."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj
