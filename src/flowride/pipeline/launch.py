"""Spawn one process per stage on this machine (the torchrun way) and watch them.

Each rank is ``python -m flowride.pipeline.worker run_dir/config.json`` with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT. If any rank fails, the others are
terminated (then killed) and the run fails with that rank's error; a hung run fails at the wall
timeout. No process is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from flowride.pipeline.config import TrainConfig


class TrainingFailed(RuntimeError):
    def __init__(self, rank: int | None, message: str) -> None:
        self.rank = rank
        super().__init__(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _first_failure(run_dir: Path, bad: list[tuple[int, int]]) -> tuple[int, str]:
    """The rank that failed first (by its error file's time), and its error line."""
    errs = []
    for rank, _code in bad:
        f = run_dir / f"rank{rank}.error"
        if f.exists():
            e = json.loads(f.read_text())
            errs.append((e["time"], rank, e["error"]))
    if errs:
        _, rank, msg = min(errs)
        return rank, msg
    rank, code = bad[0]
    return rank, f"exit code {code}"


def _stop(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def launch(cfg: TrainConfig, on_progress: Callable[[dict], None] | None = None, wall_timeout: float | None = None,
           extra_env: dict[int, dict[str, str]] | None = None) -> list[dict]:
    """Run the training; returns each rank's record (rank0.json ...). Raises TrainingFailed."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stale = ("rank*.json", "rank*.pt", "rank*.error", "rank*.log")
    for old in [f for pat in stale for f in run_dir.glob(pat)] + [run_dir / "progress.jsonl"]:
        old.unlink(missing_ok=True)
    cfg_path = run_dir / "config.json"
    cfg_path.write_text(cfg.to_json())
    port = free_port()
    procs: list[subprocess.Popen] = []
    logs = []
    src_root = str(Path(__file__).resolve().parents[2])
    for rank in range(cfg.stages):
        env = dict(os.environ)
        env.update({
            "RANK": str(rank), "WORLD_SIZE": str(cfg.stages), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(cfg.stages),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(cfg.threads),
            "PYTHONPATH": src_root + os.pathsep + env.get("PYTHONPATH", ""),
        })
        env.update((extra_env or {}).get(rank, {}))
        log = run_dir / f"rank{rank}.log"
        logs.append(log)
        with open(log, "w") as fh:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "flowride.pipeline.worker", str(cfg_path)],
                env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
            ))
    wall = wall_timeout if wall_timeout is not None else cfg.timeout_s + 60 + 30 * cfg.iters
    t0 = time.monotonic()
    seen = 0
    progress = run_dir / "progress.jsonl"
    try:
        while True:
            codes = [p.poll() for p in procs]
            if on_progress and progress.exists():
                lines = progress.read_text().splitlines()
                for line in lines[seen:]:
                    on_progress(json.loads(line))
                seen = len(lines)
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                # the first rank to fail is the cause; peers fail after it (connection reset)
                _stop(procs)
                first, why = _first_failure(run_dir, bad)
                raise TrainingFailed(first, f"rank {first} failed: {why}\n{_tail(logs[first])}")
            if all(c == 0 for c in codes):
                break
            if time.monotonic() - t0 > wall:
                _stop(procs)
                raise TrainingFailed(None, f"training did not finish within {wall:.0f} s; all ranks stopped")
            time.sleep(0.05)
    except BaseException:
        _stop(procs)
        raise
    if on_progress and progress.exists():
        for line in progress.read_text().splitlines()[seen:]:
            on_progress(json.loads(line))
    return [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(cfg.stages)]
