"""GPU training side tasks: ``gpu-cnn`` (a small ResNet, SGD) and ``gpu-transformer`` (a small
decoder-only language model, AdamW).

These are FreeRide's "model training" kind of side task as they run on a real GPU: every batch is
generated on the device by a device :class:`torch.Generator` re-seeded from ``(seed, step)``
(see :mod:`flowride.sidetasks.gpu_common`), so a step's host work is kernel launches and one
read of the loss (the step's only synchronisation). The built-in ``cnn`` task, by contrast, builds
each batch with numpy on the CPU even when its model is on CUDA.

Both data sets are learnable on purpose, so the loss really falls and a broken optimiser or a bad
resume shows up as a stalled loss rather than passing silently:

- ``gpu-cnn``: the images of :func:`flowride.sidetasks.cnn.make_batch` (a class is a colour and
  a shape at a random place on a random background, plus noise), drawn with torch instead.
- ``gpu-transformer``: a Markov chain on ``vocab`` tokens that follows a fixed random
  permutation and, with probability ``reset_prob``, jumps to a uniformly random token. Generated
  without a sequential loop: a token is ``perm^k(t0)`` where ``t0`` is the token drawn at the
  last jump ``k`` positions back (a ``cummax`` finds it). The loss falls from ``ln(vocab)``
  towards the chain's entropy rate (about 0.7 nats for the defaults).

The models and batch generators live in :mod:`flowride.sidetasks.gpu_models`. The model is
initialised on the CPU under a forked torch RNG (the host process's random stream
is left alone, and the initial weights do not depend on the device) and then moved.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flowride.harvest.task import IterativeTask, parse_params
from flowride.sidetasks.cnn import SmallResNet, class_palette, training_finished
from flowride.sidetasks.gpu_common import (
    StepRng,
    check_device,
    check_identity,
    deterministic_kernels,
    need,
    prepare,
    to_cpu,
)
from flowride.sidetasks.gpu_models import TinyGPT, chain_powers, cnn_batch, markov_batch


@dataclass(frozen=True)
class GpuCnnConfig:
    """Parameters of ``gpu-cnn``. ``batch_size``, ``image_size`` and ``width`` size a step."""

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
    target_loss: float | None = None  # stop once the loss EMA falls below this (None: never)
    device: str = "auto"

    @classmethod
    def from_params(cls, params: dict[str, Any], task: str = "gpu-cnn") -> GpuCnnConfig:
        """Validate submitted params: a typo in a name must fail loudly, not run the default."""
        c = parse_params(cls, params, task)
        need(task, c.seed >= 0, "seed", c.seed, "must be >= 0")
        need(task, 1 <= c.batch_size <= 4096, "batch_size", c.batch_size, "must be in 1..4096")
        need(task, c.total_steps >= 0, "total_steps", c.total_steps, "must be >= 0")
        need(task, c.lr > 0, "lr", c.lr, "must be > 0")
        need(task, 0 <= c.momentum < 1, "momentum", c.momentum, "must be in [0, 1)")
        need(task, c.weight_decay >= 0, "weight_decay", c.weight_decay, "must be >= 0")
        need(task, 2 <= c.num_classes <= 32, "num_classes", c.num_classes, "must be in 2..32")
        need(task, 8 <= c.image_size <= 512, "image_size", c.image_size, "must be in 8..512")
        need(task, 1 <= c.width <= 512, "width", c.width, "must be in 1..512")
        need(task, c.noise >= 0, "noise", c.noise, "must be >= 0")
        check_device(c.device, task)
        return c

    def identity(self) -> dict[str, Any]:
        """The fields that define the model and its data: a state is only valid for these."""
        d = asdict(self)
        for k in ("total_steps", "target_loss", "device"):
            d.pop(k)
        return d


@dataclass(frozen=True)
class GpuTransformerConfig:
    """Parameters of ``gpu-transformer``. ``batch_size``, ``seq_len``, ``d_model`` and
    ``n_layers`` size a step (tokens per step = batch_size x seq_len)."""

    seed: int = 0
    batch_size: int = 16
    seq_len: int = 64
    vocab: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    reset_prob: float = 0.1  # chance per token that the chain jumps to a random token
    lr: float = 3e-3
    weight_decay: float = 0.01
    total_steps: int = 1000
    target_loss: float | None = None
    device: str = "auto"

    @classmethod
    def from_params(
        cls, params: dict[str, Any], task: str = "gpu-transformer"
    ) -> GpuTransformerConfig:
        c = parse_params(cls, params, task)
        need(task, c.seed >= 0, "seed", c.seed, "must be >= 0")
        need(task, 1 <= c.batch_size <= 4096, "batch_size", c.batch_size, "must be in 1..4096")
        need(task, 2 <= c.seq_len <= 4096, "seq_len", c.seq_len, "must be in 2..4096")
        need(task, 2 <= c.vocab <= 65536, "vocab", c.vocab, "must be in 2..65536")
        need(task, 1 <= c.n_heads <= 64, "n_heads", c.n_heads, "must be in 1..64")
        need(
            task,
            1 <= c.d_model <= 4096 and c.d_model % c.n_heads == 0,
            "d_model",
            c.d_model,
            f"must be in 1..4096 and a multiple of n_heads={c.n_heads}",
        )
        need(task, 1 <= c.n_layers <= 48, "n_layers", c.n_layers, "must be in 1..48")
        need(task, 0 <= c.reset_prob <= 1, "reset_prob", c.reset_prob, "must be in [0, 1]")
        need(task, c.lr > 0, "lr", c.lr, "must be > 0")
        need(task, c.weight_decay >= 0, "weight_decay", c.weight_decay, "must be >= 0")
        need(task, c.total_steps >= 0, "total_steps", c.total_steps, "must be >= 0")
        check_device(c.device, task)
        return c

    def identity(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("total_steps", "target_loss", "device"):
            d.pop(k)
        return d


class _TrainTask(IterativeTask):
    """What both training tasks share: setup, the loss EMA, ``finished``, state and resume.

    A subclass provides ``_build`` (model and optimiser, on the CPU), ``_prepare_data`` (device
    tensors the batches are made from) and ``_loss`` (loss and accuracy tensors of a batch).
    """

    _EMA = 0.9
    config: Any

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.steps_done = 0
        self.last_loss = math.nan
        self.last_accuracy = math.nan
        self.ema_loss = math.nan
        self.device: torch.device | None = None
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.rng: StepRng | None = None

    def _identity(self) -> dict[str, Any]:
        assert self.device is not None
        return {**self.config.identity(), "rng": self.device.type}

    def setup(self) -> None:
        if self.model is not None:
            return
        self.device = prepare(self.name, self.config.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            model = self._build_model()
        self.model = model.to(self.device).train()
        self.optimizer = self._build_optimizer(self.model)
        self.rng = StepRng(self.device, self.config.seed, self.name)
        self._prepare_data()

    def _build_model(self) -> nn.Module:
        raise NotImplementedError

    def _build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        raise NotImplementedError

    def _prepare_data(self) -> None:
        raise NotImplementedError

    def _loss(self, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Loss and accuracy (0-d device tensors) of the batch ``gen`` draws, and its units."""
        raise NotImplementedError

    def step(self) -> float:
        """One optimiser update on batch ``steps_done``; the loss read is the only sync."""
        if self.model is None:
            self.setup()
        assert self.optimizer is not None and self.rng is not None
        with deterministic_kernels():  # bitwise-exact resumption on CUDA too
            loss, acc, units = self._loss(self.rng.at(self.steps_done))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self.last_loss, self.last_accuracy = torch.stack([loss.detach(), acc]).tolist()
        self.ema_loss = (
            self.last_loss
            if math.isnan(self.ema_loss)
            else self._EMA * self.ema_loss + (1 - self._EMA) * self.last_loss
        )
        self.steps_done += 1
        return float(units)

    def finished(self) -> bool:
        c = self.config
        return training_finished(self.steps_done, c.total_steps, c.target_loss, self.ema_loss)

    def state(self) -> dict[str, Any]:
        """CPU copies of weights and optimiser state: the snapshot never changes afterwards."""
        if self.model is None:
            self.setup()
        assert self.model is not None and self.optimizer is not None
        return {
            "task": self.name,
            "identity": self._identity(),
            "steps_done": self.steps_done,
            "last_loss": self.last_loss,
            "last_accuracy": self.last_accuracy,
            "ema_loss": self.ema_loss,
            "model": to_cpu(self.model.state_dict()),
            "optimizer": to_cpu(self.optimizer.state_dict()),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore weights, optimiser and counters; refuse a state of another model or data."""
        if self.model is None:
            self.setup()
        assert self.model is not None and self.optimizer is not None
        check_identity(self.name, state, self._identity())
        self.model.load_state_dict(state["model"])
        # the optimiser keeps loaded tensors by reference on the CPU: copy, so our in-place
        # updates never reach back into the caller's snapshot
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.steps_done = int(state["steps_done"])
        self.last_loss = float(state["last_loss"])
        self.last_accuracy = float(state["last_accuracy"])
        self.ema_loss = float(state["ema_loss"])


class GpuCnnTask(_TrainTask):
    """Train :class:`~flowride.sidetasks.cnn.SmallResNet` with SGD + momentum on device-made
    images; a step is one batch (unit ``samples``)."""

    name = "gpu-cnn"
    unit = "samples"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config: GpuCnnConfig = GpuCnnConfig.from_params(params, self.name)

    def _build_model(self) -> nn.Module:
        return SmallResNet(self.config.num_classes, self.config.width)

    def _build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        c = self.config
        return torch.optim.SGD(
            model.parameters(), lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay
        )

    def _prepare_data(self) -> None:
        c = self.config
        self.palette = torch.from_numpy(class_palette(c.num_classes)).to(self.device)
        self.coords = ((torch.arange(c.image_size, dtype=torch.float32) + 0.5) / c.image_size).to(
            self.device
        )

    def _loss(self, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
        assert self.model is not None
        x, y = cnn_batch(gen, self.palette, self.coords, self.config.batch_size, self.config.noise)
        logits = self.model(x)
        acc = (logits.detach().argmax(1) == y).float().mean()
        return F.cross_entropy(logits, y), acc, self.config.batch_size


class GpuTransformerTask(_TrainTask):
    """Train :class:`TinyGPT` with AdamW on the generated token stream; one batch per step
    (unit ``tokens``: batch_size x seq_len predictions)."""

    name = "gpu-transformer"
    unit = "tokens"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config: GpuTransformerConfig = GpuTransformerConfig.from_params(params, self.name)

    def _build_model(self) -> nn.Module:
        c = self.config
        return TinyGPT(c.vocab, c.seq_len, c.d_model, c.n_layers, c.n_heads)

    def _build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        c = self.config
        return torch.optim.AdamW(
            model.parameters(), lr=c.lr, weight_decay=c.weight_decay, betas=(0.9, 0.95)
        )

    def _prepare_data(self) -> None:
        c = self.config
        self.table = chain_powers(c.vocab, c.seq_len + 1, c.seed).to(self.device)

    def _loss(self, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
        assert self.model is not None
        c = self.config
        tokens = markov_batch(gen, self.table, c.batch_size, c.reset_prob)
        logits = self.model(tokens[:, :-1])
        target = tokens[:, 1:]
        acc = (logits.detach().argmax(-1) == target).float().mean()
        return (
            F.cross_entropy(logits.reshape(-1, c.vocab), target.reshape(-1)),
            acc,
            c.batch_size * c.seq_len,
        )
