"""Profile a side task alone: step time, throughput and peak memory.

The manager uses the median step time for the fits-the-bubble rule and the peak memory for
admission. The cost report uses the throughput as the task's dedicated-device throughput X.
Each profile runs in a fresh process, so the peak RSS is the task's own.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time

from flowride.errors import InputError


def _cuda_device(task: object, params: dict):
    """The CUDA device ``task`` computes on, or None: its ``device`` attribute after setup (the
    GPU side tasks resolve ``"auto"`` there), else a ``device`` param naming cuda, else CUDA
    in use at all (a task that picked its device itself)."""
    import torch

    dev = getattr(task, "device", None)
    if isinstance(dev, torch.device | str) and str(dev) not in ("", "auto"):
        dev = torch.device(dev)
        return dev if dev.type == "cuda" else None
    want = str(params.get("device", ""))
    if want.startswith("cuda"):
        return torch.device(want)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return None


WARM_STEPS = 3  # steps run before the timed ones (and outside every figure)


def _measure(name: str, params: dict, steps: int, seconds: float) -> dict:
    """Time ``steps`` steps (at most ``seconds``). On a CUDA task each step is also timed by
    CUDA events on the current stream (``median_gpu_step_s``: the device time of its kernels)
    and waited for before the wall clock stops, so ``median_step_s`` is the step's time to
    completion even for a task that does not synchronise. ``median_cpu_step_s`` is the process
    CPU time per step: what the step takes from the host's cores."""
    import torch

    from flowride.harvest.task import ImperativeSpec, make_task

    torch.set_num_threads(1)
    task = make_task(name, params)
    if isinstance(task, ImperativeSpec):
        raise InputError("task", f"{name} is imperative", "profile its iterative form instead")
    t0 = time.perf_counter()
    task.setup()
    setup_s = time.perf_counter() - t0
    cuda = _cuda_device(task, params)  # a fresh process: its CUDA peak counts setup and steps
    times, cpu_times, gpu_times, units = [], [], [], []
    start = time.perf_counter()
    while not task.finished() and len(times) < steps + WARM_STEPS and time.perf_counter() - start < seconds:
        if cuda is None:
            a, c = time.perf_counter(), time.process_time()
            units.append(float(task.step()))
            times.append(time.perf_counter() - a)
            cpu_times.append(time.process_time() - c)
            continue
        stream = torch.cuda.current_stream(cuda)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a, c = time.perf_counter(), time.process_time()
        e0.record(stream)
        units.append(float(task.step()))
        e1.record(stream)
        e1.synchronize()
        times.append(time.perf_counter() - a)
        cpu_times.append(time.process_time() - c)
        gpu_times.append(e0.elapsed_time(e1) / 1000.0)
    # the first steps load kernels and warm caches (on an H200 one cold step outweighed 40 warm
    # ones of 0.25 ms): left out of every figure below when enough steps remain
    warm = WARM_STEPS if len(times) > 2 * WARM_STEPS else 0
    warmup_s = sum(times[:warm])
    times, cpu_times, gpu_times, units = times[warm:], cpu_times[warm:], gpu_times[warm:], units[warm:]
    busy = sum(times)
    return {
        "task": name,
        "unit": task.unit,
        "steps": len(times),
        "setup_s": setup_s,
        "warmup_steps": warm,
        "warmup_s": warmup_s,
        "units_per_step": statistics.median(units) if units else 0.0,
        "median_step_s": statistics.median(times) if times else 0.0,
        "p90_step_s": sorted(times)[int(0.9 * (len(times) - 1))] if times else 0.0,
        "throughput": sum(units) / busy if busy > 0 else 0.0,  # units per second on one dedicated core
        # admission compares this with the stage's free memory: device memory for a GPU task
        "peak_memory_bytes": (torch.cuda.max_memory_allocated(cuda) if cuda is not None
                              else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        "device": str(params.get("device", "cpu")),
        "resolved_device": str(cuda) if cuda is not None else "cpu",
        "median_gpu_step_s": statistics.median(gpu_times) if gpu_times else None,
        "median_cpu_step_s": statistics.median(cpu_times) if cpu_times else 0.0,
    }


def profile_task(name: str, params: dict | None = None, steps: int = 30, seconds: float = 5.0) -> dict:
    """Run ``name`` alone in a fresh process (one core, one thread) and return its profile."""
    from flowride.harvest.task import resolve

    resolve(name)  # a clear error for an unknown task, before any process starts
    code = (
        "import json,sys; from flowride.harvest.profile import _measure; "
        f"print(json.dumps(_measure({name!r}, json.loads(sys.argv[1]), {steps}, {seconds})))"
    )
    p = subprocess.run([sys.executable, "-c", code, json.dumps(params or {})], capture_output=True, text=True, timeout=seconds + 120)
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-1:] or ["no output"]
        raise InputError("task", f"profiling {name} failed: {tail[0]}", "check the task's parameters")
    return json.loads(p.stdout.strip().splitlines()[-1])
