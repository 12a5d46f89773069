"""Spawn one process per stage on this machine (the torchrun way) and watch them.

Each rank is ``python -m flowride.pipeline.worker run_dir/config.json``, started by
:class:`flowride.ranks.RankGroup` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and the
launcher's rendezvous store; ranks die with the launcher). If any rank fails, the others are
stopped and the run fails with the first failure's error; a rank stopped by a signal is named
as the cause; a hung run fails at the wall timeout. No process is left behind.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from flowride.files import write_text_atomic
from flowride.pipeline.config import RANKS_FILE, TrainConfig
from flowride.ranks import JsonLines, RankGroup


class TrainingFailed(RuntimeError):
    def __init__(self, rank: int | None, message: str) -> None:
        self.rank = rank
        super().__init__(message)


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


def launch(cfg: TrainConfig, on_progress: Callable[[dict], None] | None = None, wall_timeout: float | None = None,
           extra_env: dict[int, dict[str, str]] | None = None) -> list[dict]:
    """Run the training; returns each rank's record, as rank 0 gathered them over torch.distributed
    and wrote them to ``ranks.json`` (the one way records reach rank 0, with flowride's launcher
    or a bare torchrun alike). Raises TrainingFailed."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stale = ("rank*.json", "rank*.pt", "rank*.error", "rank*.log")
    for old in [f for pat in stale for f in run_dir.glob(pat)] + [run_dir / "progress.jsonl", run_dir / RANKS_FILE]:
        old.unlink(missing_ok=True)
    cfg_path = run_dir / "config.json"
    write_text_atomic(cfg_path, cfg.to_json())
    wall = wall_timeout if wall_timeout is not None else cfg.timeout_s + 60 + 30 * cfg.iters
    with RankGroup(run_dir, cfg.stages) as ranks:
        ranks.start(lambda rank: [sys.executable, "-m", "flowride.pipeline.worker", str(cfg_path)],
                    lambda rank: ranks.rank_env(rank, cfg.threads, (extra_env or {}).get(rank)))
        _watch(ranks, run_dir, cfg.timeout_s, wall, on_progress)
    return json.loads((run_dir / RANKS_FILE).read_text())["ranks"]


def _watch(ranks: RankGroup, run_dir: Path, peer_timeout_s: float, wall: float,
           on_progress: Callable[[dict], None] | None) -> None:
    """Follow the ranks until all finish; raise TrainingFailed naming the rank at fault.

    A rank stopped (SIGSTOP) for ``peer_timeout_s`` fails the run at once, named: its peers
    would otherwise time out in their own waits and take the blame."""
    t0 = time.monotonic()
    forward = JsonLines(run_dir / "progress.jsonl", on_progress)

    while True:
        codes = ranks.poll()
        forward()
        stopped = ranks.stopped()
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        # a rank stopped for the peer timeout is the cause; so is one stopped long enough that the
        # peers failing now were waiting for it (a peer may have begun waiting just before the stop)
        cause = [r for r in stopped if ranks.stopped_for(r) >= (0.5 if bad else 1.0) * peer_timeout_s]
        if cause:
            r = cause[0]
            ranks.stop()
            raise TrainingFailed(r, f"rank {r} is stopped (SIGSTOP or a debugger): no progress for "
                                    f"{ranks.stopped_for(r):.1f} s (peer timeout {peer_timeout_s:g} s)")
        if bad:
            # the first rank to fail is the cause; peers fail after it (connection reset)
            ranks.stop()
            first, why = _first_failure(run_dir, bad)
            raise TrainingFailed(first, f"rank {first} failed: {why}\n{ranks.tail(first, 12)}")
        if all(c == 0 for c in codes):
            break
        if time.monotonic() - t0 > wall:
            ranks.stop()
            raise TrainingFailed(None, f"training did not finish within {wall:.0f} s; all ranks stopped")
        time.sleep(0.05)
    forward()
