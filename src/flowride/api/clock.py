"""The wall-clock budget of one synthesis: ``--time-limit`` counted from the start, in seconds."""

from __future__ import annotations

import time


class Clock:
    """The time limit of one synthesis, counted from its start (None: no limit)."""

    def __init__(self, time_limit: float | None) -> None:
        self.t0 = time.perf_counter()
        self.limit = time_limit

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float | None:
        """Seconds left (at least a millisecond, so a solver is never handed zero), None without a limit."""
        return None if self.limit is None else max(1e-3, self.limit - self.elapsed())

    def share(self, fraction: float, cap: float | None = None) -> float | None:
        """``fraction`` of what is left (None without a limit, then ``cap`` if given)."""
        left = self.left()
        if left is None:
            return cap
        return max(1e-3, left * fraction if cap is None else min(cap, left * fraction))

    def out(self) -> bool:
        return self.limit is not None and self.left() <= 1e-3
