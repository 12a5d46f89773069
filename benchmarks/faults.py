"""Process faults, timed: how late a stopped rank's failure fires, and how fast a killed
launcher's ranks and temporary directory go (issue #16).

    python benchmarks/faults.py [--trials 3]

Prints one row per trial: for ``flowride run`` (4 ranks, a 10 s run timeout) and ``flowride
train`` (2 stages, a 5 s peer timeout), rank k is stopped with SIGSTOP mid-run and the row gives
the rank named and how long after the timeout the failure was raised; then a ``flowride run``
launcher is killed with SIGKILL and the row gives the time until no rank and no temp dir is left.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pids_with(marker: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if marker in cmd and state != "Z":
                out.append(int(pid))
    return out


def stopped_run_rank(tmp: Path, trial: int, timeout: float = 10.0) -> list:
    from flowride.api import synthesize
    from flowride.comm.launch import CommFailed, as_program, run_schedule
    from flowride.topology.builtins import build_topology

    prog = as_program(synthesize(build_topology("ring", n=4), "allgather", 64 << 10, "fast").schedule)
    rd, victim, st = tmp / f"run{trial}", 1 + trial % 3, []

    def on(ev: dict) -> None:
        if ev.get("event") == "repeat" and not st:
            os.kill(json.loads((rd / f"rank{victim}.state").read_text())["pid"], signal.SIGSTOP)
            st.append(time.monotonic())

    t0 = time.monotonic()
    try:
        run_schedule(prog, repeats=10**6, warmup=0, timeout_s=timeout, progress=on, run_dir=rd)
    except CommFailed as e:
        return ["run, SIGSTOP", victim, e.rank, f"{time.monotonic() - t0 - timeout:+.3f}"]
    return ["run, SIGSTOP", victim, "none", "did not fail"]


def stopped_train_rank(tmp: Path, trial: int, timeout: float = 5.0) -> list:
    from flowride.pipeline.config import TrainConfig
    from flowride.pipeline.launch import TrainingFailed, launch

    rd, victim, st = tmp / f"train{trial}", trial % 2, []
    cfg = TrainConfig(stages=2, microbatches=4, iters=10**6, run_dir=str(rd), timeout_s=timeout, device="cpu")

    def on(ev: dict) -> None:
        if st or ev.get("iteration", 0) < 1:
            return
        for pid in _pids_with(str(rd / "config.json")):
            env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
            if f"RANK={victim}" in env:
                os.kill(pid, signal.SIGSTOP)
                st.append(time.monotonic())

    try:
        launch(cfg, on)
    except TrainingFailed as e:
        return ["train, SIGSTOP", victim, e.rank, f"{time.monotonic() - st[0] - timeout:+.3f}"]
    return ["train, SIGSTOP", victim, "none", "did not fail"]


def killed_run_launcher(tmp: Path, trial: int) -> list:
    from flowride.api import synthesize
    from flowride.topology.builtins import build_topology

    d = tmp / f"kill{trial}"
    d.mkdir()
    synthesize(build_topology("ring", n=4), "allgather", 64 << 10, "fast").schedule.save(d / "s.json")
    env = dict(os.environ, TMPDIR=str(d), PYTHONPATH=str(ROOT / "src"))
    p = subprocess.Popen([sys.executable, "-m", "flowride.cli", "run", str(d / "s.json"), "--repeats", "1000000"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (rd := next(iter(d.glob("flowride-comm-*")), None)) or len(list(rd.glob("rank*.state"))) < 4:
        time.sleep(0.05)
    time.sleep(1.0)
    p.kill()
    p.wait()
    t0 = time.monotonic()
    while (_pids_with(str(rd)) or rd.exists()) and time.monotonic() - t0 < 30:
        time.sleep(0.01)
    left = len(_pids_with(str(rd)))
    return ["run, launcher SIGKILL", "-", f"{left} ranks left, dir {'kept' if rd.exists() else 'removed'}", f"{time.monotonic() - t0:.3f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    a = ap.parse_args()
    print("| fault | rank stopped | rank named / what is left | seconds after the timeout / until clean |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for trial in range(a.trials):
            for fn in (stopped_run_rank, stopped_train_rank, killed_run_launcher):
                print("| " + " | ".join(map(str, fn(tmp, trial))) + " |", flush=True)


if __name__ == "__main__":
    main()
