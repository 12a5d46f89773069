"""The process that hosts one side task, driven by its stage's worker over stdin/stdout.

Iterative tasks: the worker sends ``{"cmd": "run", "until": T, "need_s": s}``; the host runs
steps while the time left before T exceeds ``need_s`` (the profiled step time x 1.2), reporting
each step, then yields (``"max_steps": n`` stops after n steps: the manager's probe of an
unprofiled task). SIGUSR1 means "the stage needs its core back": the host yields after the
step in progress. A task on a GPU is synchronised after each step, so a step's end is when
the GPU is free again (what a bubble's end must wait for), and its device time between two CUDA
events is reported beside it. The run command carries ``"pauses"``, how many SIGUSR1 the worker had sent
before it: a pause that arrives before the host has read its run command (the bubble ended early)
counts above that number and still stops the run, while a late pause meant for an earlier run
does not. ``{"cmd": "checkpoint"}`` pickles ``task.state()`` to the checkpoint file.

Imperative tasks: the host calls ``main(params, checkpoint_path)`` and the worker pauses and
resumes the whole process with SIGSTOP / SIGCONT; SIGTERM asks it to save and exit.
"""

from __future__ import annotations

import json
import pickle
import signal
import sys
import time
from pathlib import Path

from flowride.files import write_with

_pauses_seen = 0  # SIGUSR1 received so far (a count, not a flag: see the module's docstring)


def _on_usr1(signum, frame) -> None:
    global _pauses_seen
    _pauses_seen += 1


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _save(path: Path, state: dict) -> None:
    write_with(path, lambda f: pickle.dump(state, f))


def host_iterative(name: str, params: dict, ckpt: Path) -> int:
    from flowride.harvest.limits import apply_cuda_memory_cap
    from flowride.harvest.task import make_task

    frac = apply_cuda_memory_cap()
    if frac is not None:
        sys.stderr.write(f"flowride: CUDA memory fraction {frac:.4f} applied\n")
    signal.signal(signal.SIGUSR1, _on_usr1)
    task = make_task(name, params)
    task.setup()
    if ckpt.exists():
        with open(ckpt, "rb") as f:
            task.load_state(pickle.load(f))
    torch = sys.modules.get("torch")  # a task that put work on a GPU has initialised CUDA by now
    gpu = torch.cuda if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None
    _emit({"ev": "ready", "finished": task.finished(), "unit": task.unit})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "run":
            before = int(cmd.get("pauses", _pauses_seen))  # pauses sent before this run
            until, need = float(cmd["until"]), float(cmd["need_s"])
            left = int(cmd.get("max_steps", -1))  # a probe runs a few steps whatever the time
            while not task.finished() and _pauses_seen <= before and left != 0:
                t0 = time.monotonic()  # one reading: a step's recorded start is the one the fit was judged at
                if until - t0 <= need:
                    break
                left -= 1
                if gpu is None:
                    units = float(task.step())
                    _emit({"ev": "step", "t0": t0, "t1": time.monotonic(), "units": units})
                    continue
                # a GPU step ends when its kernels have, not when the launches return: t1 is
                # when the GPU is free again, gpu_s the device time between the step's events
                e0, e1 = gpu.Event(enable_timing=True), gpu.Event(enable_timing=True)
                e0.record()
                units = float(task.step())
                e1.record()
                e1.synchronize()
                _emit({"ev": "step", "t0": t0, "t1": time.monotonic(), "units": units, "gpu_s": e0.elapsed_time(e1) / 1e3})
            _emit({"ev": "yield", "finished": task.finished()})
        elif cmd["cmd"] == "checkpoint":
            _save(ckpt, task.state())
            _emit({"ev": "saved"})
        elif cmd["cmd"] == "stop":
            _save(ckpt, task.state())
            _emit({"ev": "saved"})
            return 0
    return 0


def host_imperative(name: str, params: dict, ckpt: Path) -> int:
    from flowride.harvest.limits import apply_cuda_memory_cap
    from flowride.harvest.task import ImperativeSpec, resolve

    apply_cuda_memory_cap()
    spec = resolve(name)
    assert isinstance(spec, ImperativeSpec)
    _emit({"ev": "ready", "finished": False, "unit": spec.unit})  # imports done: pausable from here
    spec.main(params, str(ckpt))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kind, name, params, ckpt = argv[0], argv[1], json.loads(argv[2]), Path(argv[3])
    try:
        if kind == "iterative":
            return host_iterative(name, params, ckpt)
        return host_imperative(name, params, ckpt)
    except MemoryError:
        sys.stderr.write("MemoryError: side task ran out of memory (over its memory limit)\n")
        return 3


if __name__ == "__main__":
    sys.exit(main())
