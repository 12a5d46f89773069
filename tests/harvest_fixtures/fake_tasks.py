"""Side tasks for the harvest tests: predictable steps, and ones that misbehave on purpose."""

from __future__ import annotations

import json
import os
import signal
import time

from flowride.harvest.task import ImperativeSpec, IterativeTask


class Counter(IterativeTask):
    """Busy-loops ``step_ms`` per step (default :attr:`STEP_MS`), ``total`` steps."""

    name, unit = "counter", "ticks"
    STEP_MS = 2.0

    def setup(self) -> None:
        self.i = 0
        self.total = int(self.params.get("total", 10**9))
        self.step_s = float(self.params.get("step_ms", self.STEP_MS)) / 1000

    def step(self) -> float:
        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:
            pass
        self.i += 1
        return 1.0

    def finished(self) -> bool:
        return self.i >= self.total

    def state(self) -> dict:
        return {"i": self.i}

    def load_state(self, state: dict) -> None:
        self.i = state["i"]


class Crasher(Counter):
    def step(self) -> float:
        if self.i >= int(self.params.get("after", 3)):
            raise RuntimeError("side task crashed on purpose")
        return super().step()


class Hog(Counter):
    """Allocates far past any sane memory limit."""

    def step(self) -> float:
        self.blob = bytearray(int(self.params.get("mb", 4096)) << 20)
        return super().step()


class Stubborn(Counter):
    """Ignores the request to yield: one step never ends."""

    def step(self) -> float:
        if self.i >= 2:
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            time.sleep(3600)
        return super().step()


def _loop(params: dict, ckpt: str) -> None:
    done = json.load(open(ckpt))["units"] if os.path.exists(ckpt) else 0
    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    total = int(params.get("total", 10**9))
    while done < total and not stop:
        time.sleep(0.002)
        done += 1
        if done % 50 == 0 or stop:
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"units": done}, f)
            os.replace(ckpt + ".tmp", ckpt)
    with open(ckpt + ".tmp", "w") as f:
        json.dump({"units": done}, f)
    os.replace(ckpt + ".tmp", ckpt)


Looper = ImperativeSpec("looper", _loop, "ticks")


class Tick(Counter):
    """A Counter of 0.5 ms steps: it fits the tiny preset's short bubbles (tasks named by
    ``flowride train --side-tasks`` get no parameters)."""

    STEP_MS = 0.5


class Tally(Tick):
    """A Tick under another name: re-run tests name several different tasks."""


class Score(Tick):
    """A Tick under a third name."""
