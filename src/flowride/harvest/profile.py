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


def _measure(name: str, params: dict, steps: int, seconds: float) -> dict:
    import torch

    from flowride.harvest.task import ImperativeSpec, make_task

    torch.set_num_threads(1)
    task = make_task(name, params)
    if isinstance(task, ImperativeSpec):
        raise InputError("task", f"{name} is imperative", "profile its iterative form instead")
    t0 = time.perf_counter()
    task.setup()
    setup_s = time.perf_counter() - t0
    times, units = [], 0.0
    start = time.perf_counter()
    while not task.finished() and len(times) < steps and time.perf_counter() - start < seconds:
        a = time.perf_counter()
        units += float(task.step())
        times.append(time.perf_counter() - a)
    busy = sum(times)
    return {
        "task": name,
        "unit": task.unit,
        "steps": len(times),
        "setup_s": setup_s,
        "median_step_s": statistics.median(times) if times else 0.0,
        "p90_step_s": sorted(times)[int(0.9 * (len(times) - 1))] if times else 0.0,
        "throughput": units / busy if busy > 0 else 0.0,  # units per second on one dedicated core
        # admission compares this with the stage's free memory: device memory for a GPU task
        "peak_memory_bytes": (torch.cuda.max_memory_allocated() if str(params.get("device", "cpu")).startswith("cuda")
                              else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        "device": str(params.get("device", "cpu")),
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
