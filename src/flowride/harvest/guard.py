"""The budget guard: the training owner's overhead budget held by a closed loop, not judged after.

Harvesting slows training through what it shares with it (caches, memory bandwidth, a core's
turbo budget, a step that overruns its bubble). How much depends on the bubbles: with long ones
the overhead is ~1%, with short ones it can pass 5%. So the manager keeps measuring it all run
long and backs off when it is too high:

- **Measure.** Harvesting is off in one block of iterations in every ``every`` (8): those
  iterations run training alone, so each off block and the on block before it form a pair
  (``mean(on) / mean(off) - 1``), both arms sharing the machine's drift. Any other off
  iterations (a paired benchmark's ``off`` control events) pair the same way. The interval is a
  t-interval over the pairs measured at the current setting (at most ``window``).
- **Back off** when the interval's upper end is above the budget with at least ``min_pairs`` (3)
  pairs and the pairs' median above half the budget (noise alone widens the interval of a few
  pairs past any budget; it rarely moves the median that far), or when the median of two or more
  pairs is above the budget (a short run has few pairs to spend): one rung up :data:`LADDER` — a wider fit margin, a longer shortest
  bubble, skipping the bubble types and tasks whose steps overran, fewer tasks at once, and at
  the top no harvesting at all.
- **Relax** one rung when, with ``relax_pairs`` pairs, the median is under a quarter of the budget
  and the upper end under the budget; from the top rung (nothing runs, so nothing pairs) after
  ``probe_blocks`` blocks, to try again.

The guard is plain arithmetic on (iteration, seconds, harvested) triples; the manager
(:mod:`flowride.harvest.manager`) feeds it the iteration times stage 0's reporter announces and
applies its :class:`Setting`. Tested on synthetic timings (a 5% overhead driven under a 2%
budget) without a process.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

# 97.5% quantiles of Student's t by degrees of freedom (1..30; above: the normal's)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(dof: int) -> float:
    return _T975[dof - 1] if 1 <= dof <= len(_T975) else 1.96


@dataclass(frozen=True)
class Setting:
    """What the manager may do on one rung of the ladder."""

    factor: float  # a step starts only if the bubble still has factor x its median step
    min_bubble_s: float  # bubbles predicted shorter than this are left alone
    max_running: int | None  # side tasks running at once (None: one per stage)
    skip_overrunning: bool  # bubble types and tasks whose steps overran are left alone
    harvest: bool = True  # False: the top rung, nothing runs


LADDER: tuple[Setting, ...] = (
    Setting(1.2, 0.0, None, False),  # FreeRide's rule, everything used
    Setting(1.5, 0.005, None, True),
    Setting(2.0, 0.02, None, True),
    Setting(2.5, 0.05, 1, True),
    Setting(3.0, 0.1, 1, True),
    Setting(3.0, 0.1, 1, True, harvest=False),
)


@dataclass
class Pair:
    iteration: int  # the last off iteration of the pair
    on_s: float
    off_s: float

    @property
    def overhead_pct(self) -> float:
        return (self.on_s / self.off_s - 1.0) * 100.0


@dataclass
class BudgetGuard:
    """Closed-loop control of harvesting's overhead (see the module). ``block``: iterations per
    block; ``every``: one block in this many runs without harvesting."""

    budget_pct: float
    block: int = 1
    every: int = 8
    window: int = 8
    min_pairs: int = 3
    relax_pairs: int = 4
    probe_blocks: int = 32
    skip_first: int = 2  # warm-up iterations (allocation, the first bubbles learned) are not measured
    external: bool = False  # the training switches harvesting on and off itself (a paired benchmark): its blocks pair
    level: int = 0
    pairs: list[Pair] = field(default_factory=list)  # at the current level, oldest first
    all_pairs: list[Pair] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)
    _run: list[tuple[int, float, bool]] = field(default_factory=list)  # the iterations since the last pair
    _idle: int = 0  # iterations seen on a rung that harvests nothing

    def __post_init__(self) -> None:
        if not (math.isfinite(self.budget_pct) and self.budget_pct >= 0):
            raise ValueError("budget_pct must be a finite percentage >= 0")
        if self.block < 1 or self.every < 2:
            raise ValueError("block >= 1 and every >= 2")

    @property
    def setting(self) -> Setting:
        return LADDER[self.level]

    def measuring_off(self, iteration: int) -> bool:
        """Whether ``iteration`` is one of the guard's own off iterations (training alone). False
        once the training runs its own on/off blocks: those pair instead, and an own off block
        inside its on blocks would bias its measurement low."""
        return not self.external and (iteration // self.block) % self.every == self.every - 1

    def interval(self, pairs: list[Pair] | None = None) -> tuple[float, float, float] | None:
        """(mean, low, high) overhead in percent over ``pairs`` (default: this level's last
        ``window``); None with fewer than two."""
        ps = (self.pairs if pairs is None else pairs)[-self.window:]
        if len(ps) < 2:
            return None
        xs = [p.overhead_pct for p in ps]
        m = statistics.fmean(xs)
        half = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
        return m, m - half, m + half

    def observe(self, iteration: int, seconds: float, harvested: bool) -> dict | None:
        """One iteration's time and whether side work could run in it. Returns the action taken
        (a back-off or a relax, also appended to :attr:`actions`), else None."""
        if not (seconds > 0 and math.isfinite(seconds)) or iteration < self.skip_first:
            return None
        if self._run and self._run[-1][0] >= iteration:  # out of order or repeated: start again
            self._run.clear()
        self._run.append((iteration, seconds, harvested))
        if not self.setting.harvest:
            self._idle += 1
            if self._idle >= self.probe_blocks * self.block:
                return self._move(-1, iteration, "probe", self.interval(self.all_pairs[-self.window:]) or (0.0, 0.0, 0.0))
            return None
        if harvested or len(self._run) < 2:
            return None
        # an off run ends when the next iteration harvests; pair it once it is complete here
        offs = []
        for _it, s, h in reversed(self._run):
            if h:
                break
            offs.append(s)
        ons = [s for _, s, h in self._run[: len(self._run) - len(offs)] if h]  # every on iteration since the last pair
        if self.measuring_off(iteration + 1) or len(ons) < len(offs):
            return None  # the off run goes on, or no on run as long precedes it
        pair = Pair(iteration, statistics.fmean(ons), statistics.fmean(offs))
        self._run.clear()
        self.pairs.append(pair)
        self.all_pairs.append(pair)
        return self._decide(iteration)

    def _decide(self, iteration: int) -> dict | None:
        iv = self.interval()
        if iv is None:
            return None
        _, _, hi = iv
        n = min(len(self.pairs), self.window)
        mid = statistics.median(p.overhead_pct for p in self.pairs[-self.window:])  # robust to a pair disturbed from outside
        over = (n >= 2 and mid > self.budget_pct) or (n >= self.min_pairs and hi > self.budget_pct and mid > self.budget_pct / 2)
        if self.level + 1 < len(LADDER) and over:
            return self._move(+1, iteration, "back off", iv)
        if self.level > 0 and n >= self.relax_pairs and mid < self.budget_pct / 4 and hi < self.budget_pct:
            return self._move(-1, iteration, "relax", iv)
        return None

    def _move(self, step: int, iteration: int, what: str, iv: tuple[float, float, float]) -> dict:
        self.level += step
        self.pairs = []
        self._idle = 0
        act = {"iteration": iteration, "action": what, "level": self.level, "overhead_pct": iv[0],
               "ci95_pct": [iv[1], iv[2]], "setting": asdict(self.setting)}
        self.actions.append(act)
        return act

    def report(self) -> dict:
        """What the guard did and where it settled: the overhead over the pairs of the last
        level (the one the run ended on), with its interval, and every action."""
        iv = self.interval()
        return {"budget_pct": self.budget_pct, "block": self.block, "every": self.every, "level": self.level,
                "setting": asdict(self.setting), "pairs": len(self.all_pairs), "pairs_at_level": len(self.pairs),
                "settled_overhead_pct": None if iv is None else iv[0],
                "settled_ci95_pct": None if iv is None else [iv[1], iv[2]],
                "actions": self.actions}
