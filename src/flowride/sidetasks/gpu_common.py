"""Shared plumbing of the GPU side tasks (``gpu-cnn``, ``gpu-transformer``, ``gpu-pagerank``,
``gpu-sssp``, ``gpu-image``): device parsing, per-step random generators, the one sync a step
ends with, and CPU snapshots for ``state()``.

Why these rules. A side task runs in a pipeline bubble of a few milliseconds; on a GPU the host
thread must only launch kernels, not build batches with numpy (the CPU would become the
bottleneck and steal cycles from the training process). So all data is generated *on the
device*, from a :class:`torch.Generator` that lives there and is re-seeded from ``(seed, tag,
step index)`` at the start of each step: the data needs no state of its own, a resumed run sees
exactly the batches an uninterrupted run would have seen, and the host process's global RNG is
never touched. A step ends with exactly one synchronisation of the *current stream* (not the
whole device: in an attached run the training kernels share the device and must not be waited
for), so the time a step reports is the time its kernels took.

The CPU and CUDA generators draw different numbers from the same seed, so the data (and, for the
graph tasks, the graph) depend on the device type: each task puts ``rng`` (``"cpu"`` or
``"cuda"``) into its identity, and a state saved on one kind of device is refused on the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

DEVICE_HELP = '"auto" (cuda if available, else cpu), "cpu", "cuda" or "cuda:N"'


def need(task: str, ok: bool, field: str, value: Any, rule: str) -> None:
    """Refuse a param value, naming the task, the field and the rule it broke."""
    if not ok:
        raise ValueError(f"{task}: param {field}={value!r} {rule}")


def check_dtype(spec: str, task: str) -> torch.dtype:
    """``float32`` or ``float64``, as a torch dtype."""
    need(task, spec in ("float32", "float64"), "dtype", spec, 'must be "float32" or "float64"')
    return torch.float32 if spec == "float32" else torch.float64


def check_device(spec: str, task: str) -> str:
    """The ``device`` param's shape (no CUDA query: constructors only parse their params)."""
    ok = spec in ("auto", "cpu", "cuda") or (
        spec.startswith("cuda:") and spec[5:].isdigit() and len(spec) <= 9
    )
    if not ok:
        raise ValueError(f"{task}: param device={spec!r} is not one of {DEVICE_HELP}")
    return spec


def resolve_device(spec: str, task: str) -> torch.device:
    """``auto``/``cpu``/``cuda``/``cuda:N`` as a device; a CUDA device CUDA cannot give is a
    ValueError naming the task and the field (not a crash deep inside the first kernel)."""
    check_device(spec, task)
    if spec == "auto":
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(
            f'{task}: param device={spec!r} but CUDA is not available here; use "cpu" or "auto"'
        )
    index = int(spec[5:]) if ":" in spec else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"{task}: param device={spec!r} but only {torch.cuda.device_count()} CUDA device(s) exist"
        )
    return torch.device("cuda", index)


def prepare(task: str, spec: str) -> torch.device:
    """Resolve the device and, on the CPU, pin torch to one thread: a side task must leave the
    other cores to training, and one thread keeps CPU results bitwise reproducible (which exact
    resumption relies on). On a GPU the host thread only launches kernels."""
    device = resolve_device(spec, task)
    if device.type == "cpu":
        torch.set_num_threads(1)
    return device


def step_seed(seed: int, tag: str, index: int) -> int:
    """A 63-bit seed for stream ``tag`` at step ``index``: well mixed (neighbouring steps get
    unrelated streams) and the same on every platform (no Python ``hash``)."""
    digest = hashlib.blake2b(f"{tag}\0{seed}\0{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class StepRng:
    """One generator on the task's device, re-seeded per step (no kernel, no allocation)."""

    def __init__(self, device: torch.device, seed: int, tag: str) -> None:
        self.gen = torch.Generator(device=device)
        self.seed, self.tag = seed, tag

    def at(self, index: int) -> torch.Generator:
        self.gen.manual_seed(step_seed(self.seed, self.tag, index))
        return self.gen


def sync(device: torch.device) -> None:
    """Wait for this task's kernels: the current stream only, never the whole device."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


@contextmanager
def deterministic_kernels() -> Iterator[None]:
    """Deterministic cuDNN convolutions for the block (exact resumption on CUDA needs them; the
    default may pick kernels that add in a varying order). Only cuDNN's ``deterministic`` and
    ``benchmark`` flags change, and both are put back on exit: the host keeps its settings."""
    cudnn = torch.backends.cudnn
    saved = cudnn.deterministic, cudnn.benchmark
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = saved


def to_cpu(obj: Any) -> Any:
    """Independent CPU copies of every tensor in a nested structure (a state must unpickle
    anywhere and must not change as the task goes on)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def check_identity(task: str, state: dict[str, Any], identity: dict[str, Any]) -> None:
    """Refuse a state saved by another task or for other model/data params, saying which differ."""
    if state.get("task") != task:
        raise ValueError(f"{task}: state was saved by task {state.get('task')!r}, not {task!r}")
    theirs = state.get("identity")
    if theirs != identity:
        keys = sorted(
            k for k in set(identity) | set(theirs or {}) if (theirs or {}).get(k) != identity.get(k)
        )
        raise ValueError(
            f"{task}: state was saved for different model/data params (differ: {keys})"
        )
