"""Harvest the bubbles of a training job: one call for torch.distributed.pipelining, a few for any loop.

::

    schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=loss_fn)   # the user's own
    with flowride.harvest.attach(schedule, run_dir="runs/job", side_tasks=["cnn"]):
        for batch in data:
            schedule.step(...)                                          # unchanged
            optimizer.step()

Every rank of the job calls :func:`attach` (it is collective: the ranks agree on the manager's
address over torch.distributed). On each host, local rank 0 starts a supervised side-task manager
(:class:`flowride.harvest.supervise.ManagerProcess`) for its stages and submits the side tasks;
every rank wraps its own schedule (:mod:`flowride.pipeline.torch_observe`) so that its bubbles
are learned online and announced, with their predicted end, to its host's manager. Training
computes exactly what it computes without ``attach``; the wrappers only read the clock and send
a datagram per bubble.

The learned bubble lengths are saved in the run directory when the job ends and reused by the
next job with the same schedule (class, stages, micro-batches), so its first iteration is
predicted too.

Loops that cannot be wrapped (a hand-written schedule, Megatron-LM, DeepSpeed) use
:func:`connect`, which does the same set-up and hands back the :class:`BubbleReporter` to call
around their waits.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowride.files import write_json_atomic
from flowride.harvest.manager_files import PROFILES_FILE, ManagerOptions, read_profiles
from flowride.harvest.session import HARVEST_MODES, job_params
from flowride.harvest.store import TaskStore
from flowride.harvest.supervise import ManagerProcess
from flowride.pipeline import torch_compat as tc
from flowride.pipeline.events import BubblePublisher
from flowride.pipeline.reporter import BubbleReporter
from flowride.pipeline.torch_observe import TorchObserver, observe


def _signature(schedule: Any) -> dict:
    return {"schedule": type(schedule).__name__, "stages": len(tc.stage_to_rank(schedule)),
            "ranks": tc.group_size(schedule), "microbatches": tc.n_microbatches(schedule)}


class Harvest:
    """What :func:`attach` or :func:`connect` set up on this rank; :meth:`close` (or leaving the
    ``with``) undoes it. ``reporter`` is the rank's :class:`BubbleReporter`."""

    def __init__(self, rank: int, reporter: BubbleReporter, run_dir: Path, manager: ManagerProcess | None) -> None:
        self.rank = rank
        self.reporter = reporter
        self.run_dir = run_dir
        self.manager = manager
        self.observer: TorchObserver | None = None
        self.signature: dict | None = None  # the torch schedule's, for reusing learned lengths
        self.record: dict | None = None
        self.closed = False

    def __enter__(self) -> Harvest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def summary(self) -> dict:
        """This rank's bubbles: waits seen, announced, prediction error, events sent."""
        out = self.reporter.summary()
        if self.observer is not None:
            out["plan_mismatches"] = self.observer.plan_mismatches
            out["gap_types"] = self.observer.gap_types()
        out["lengths"] = self.reporter.profile()
        return out

    def close(self) -> dict | None:
        """Stop observing; on the rank that started the manager, stop it (tasks are saved and stay
        resumable) and return its record. Writes ``attach-rank{r}.json`` with this rank's summary."""
        if self.closed:
            return self.record
        self.closed = True
        if self.observer is not None:
            self.observer.detach()
        self.reporter.close()
        summary = self.summary()
        write_json_atomic(self.run_dir / f"attach-rank{self.rank}.json", summary, indent=1)
        if self.signature is not None:
            write_json_atomic(self.run_dir / f"bubble-lengths-rank{self.rank}.json",
                              {"signature": self.signature, "lengths": summary["lengths"]}, indent=1)
        if self.manager is not None:
            self.record = self.manager.stop()
        return self.record


def _host_ports(port: int | None) -> int | None:
    """Every rank learns the port of the manager on its own host (collective)."""
    import torch.distributed as dist

    me = socket.gethostname()
    if not (dist.is_available() and dist.is_initialized()):
        return port
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (me, port))
    for host, p in gathered:
        if host == me and p is not None:
            return int(p)
    return None


def connect(stage: int, stages: int, run_dir: str | Path = "runs/harvest", side_tasks: Sequence[str] = (),
            mode: str = "freeride", *, min_bubble_s: float = 0.002, device: str = "cpu",
            side_device: str | None = None, start_manager: bool | None = None,
            profiles: dict[str, dict] | None = None, saved_lengths: dict[str, float] | None = None) -> Harvest:
    """A :class:`Harvest` whose ``reporter`` is pipeline rank ``stage``'s (of ``stages``)
    :class:`BubbleReporter`, connected to its host's side-task manager, which the rank that
    starts it (default: local rank 0) also holds.

    For training loops that :func:`attach` cannot wrap (hand-written, Megatron-LM, DeepSpeed):
    call it on every rank after ``init_process_group`` (it is collective when torch.distributed
    is initialized), then report waits with ``reporter.waiting(...)`` or ``idle()``/``busy()``.
    ``device`` is this rank's training device type ("cpu" or "cuda"); side tasks compute on
    ``side_device`` (default: ``device`` of the rank that starts the manager).
    """
    from flowride.errors import InputError
    from flowride.harvest.task import resolve

    if mode not in HARVEST_MODES or mode == "none":
        raise InputError("mode", f"unknown harvest mode {mode!r}", "use freeride, naive or priority")
    side_device = side_device or device
    if side_device not in ("cpu", "cuda"):
        raise InputError("side_device", f"unknown device {side_device!r}", "use cpu or cuda")
    for name in side_tasks:
        resolve(name)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    owner = start_manager if start_manager is not None else int(os.environ.get("LOCAL_RANK", stage)) == 0
    manager: ManagerProcess | None = None
    port: int | None = None
    if owner:
        if profiles is None and (run_dir / PROFILES_FILE).exists():
            profiles = read_profiles(run_dir)
        store = TaskStore.in_run_dir(run_dir)
        try:
            if side_tasks and not store.unfinished():
                for name in side_tasks:
                    store.submit(name, job_params(name, side_device))
        finally:
            store.close()
        manager = ManagerProcess(run_dir, ManagerOptions(stages=stages, mode=mode, device=side_device), profiles)
        port = manager.start()
        manager.watch()
    port = _host_ports(port)
    reporter = BubbleReporter(stage, BubblePublisher(port), min_bubble_s=min_bubble_s, device=device,
                              profile=saved_lengths, warmup_iters=0 if saved_lengths else 1)
    return Harvest(stage, reporter, run_dir, manager)


def attach(schedule: Any, run_dir: str | Path = "runs/harvest", side_tasks: Sequence[str] = (),
           mode: str = "freeride", *, min_bubble_s: float = 0.002, device: str | None = None,
           start_manager: bool | None = None, profiles: dict[str, dict] | None = None,
           reuse_profile: bool = True) -> Harvest:
    """Harvest ``schedule``'s bubbles on this rank; returns a :class:`Harvest` (a context manager).

    ``side_tasks``: registered task names or ``module:Class``, submitted once by the rank that
    starts the manager (the store in ``run_dir`` is durable: a re-run resumes unfinished tasks
    instead). ``mode``: freeride (only in bubbles), naive or priority (continuous baselines).
    ``device``: where side tasks compute (default: cuda if this rank trains on CUDA, else cpu).
    ``start_manager``: default, local rank 0 of each host does. ``profiles``: task profiles
    (median step time etc.; default: ``run_dir/task-profiles.json`` if present, else each task
    learns its step time from its first steps). ``reuse_profile``: start from the bubble lengths
    a previous job with the same schedule saved in ``run_dir``.
    """
    tc.check()
    run_dir = Path(run_dir)
    stages = tc.local_stages(schedule)
    rank, world = tc.group_rank(schedule), tc.group_size(schedule)
    dev = getattr(stages[0], "device", None)
    dev_type = getattr(dev, "type", "cpu") or "cpu"
    saved: dict[str, float] = {}
    lengths_f = run_dir / f"bubble-lengths-rank{rank}.json"
    if reuse_profile and lengths_f.exists():
        data = json.loads(lengths_f.read_text())
        if data.get("signature") == _signature(schedule):
            saved = {k: float(v) for k, v in data.get("lengths", {}).items()}
    h = connect(rank, world, run_dir, side_tasks, mode, min_bubble_s=min_bubble_s, device=dev_type,
                side_device=device, start_manager=start_manager, profiles=profiles, saved_lengths=saved)
    h.observer = observe(schedule, h.reporter, steady=True)
    h.signature = _signature(schedule)
    return h
