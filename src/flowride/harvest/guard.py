"""The budget guard: the training owner's overhead budget held by a closed loop that acts only on
what its measurements can decide.

Harvesting slows training through what it shares with it (caches, memory bandwidth, a core's
turbo budget, a step that overruns its bubble). How much depends on the bubbles: with long ones
the overhead is ~1%, with short ones it can pass 5%. So the manager keeps measuring it all run
long. On a noisy node (shared hosts, throttling) one pair's noise can be +-20%, far more than
any budget: a guard that acted on a median of a few pairs there stopped all side work for an
"overhead" whose interval was [-116%, +147%]. This guard therefore decides only what the data
decides:

- **Measure in pairs.** Iterations are cut into blocks of ``block``. In every cycle of ``every``
  blocks the last two form a pair: one block harvests, the other runs training alone, in an
  order drawn per cycle (so the machine's drift lines up with neither arm); each pair gives one
  overhead figure ``mean(on) / mean(off) - 1``. When the training runs its own paired blocks
  (``flowride train --paired-block``), those pairs are used instead (``external``; aligned chunks
  of ``2 x ext_block`` iterations from ``ext_offset``, as :mod:`flowride.harvest.stats` reads
  them) and the guard keeps no blocks of its own.
- **A/A pairs, the noise floor.** One pair in ``aa_every`` runs training alone in *both* arms.
  Its "overhead" is pure noise: their mean and spread are the floor under which no overhead can
  be told apart from nothing, reported beside every decision. They never feed a decision.
- **Back off** one rung of :data:`LADDER` only when the interval's *lower* end over at least
  ``min_pairs`` pairs at this rung is above the budget, and the pairs' median is too (robust to
  one pair disturbed from outside). Since the budget is >= 0, an interval that contains zero
  never stops side work. The guard acts only at fixed pair counts (:data:`LOOKS`), on an
  interval widened for those repeated looks (:func:`decision_interval`), so that noise alone
  moves a rung with a chance of at most ``alpha``.
- **Relax** one rung only when the interval's *upper* end is below the budget (``relax_pairs``
  pairs); from the top rung, where nothing runs and nothing pairs, after ``probe_blocks`` blocks.
- **Otherwise hold.** An interval that spans the budget cannot decide: the guard says so
  ("cannot resolve the budget at this noise"), keeps harvesting at the rung the last resolvable
  decision set, and states how many pairs at the measured spread would resolve the difference
  seen (the interval narrows as 1/sqrt(pairs): ``n (h / |mean - budget|)^2``, ``h`` its side
  toward the budget). The pairs it uses grow with the run (up to
  ``window``), so the interval narrows as far as the noise allows: the pairs needed are a
  function of the noise, not a constant.

The guard is plain arithmetic on (iteration, seconds, harvested) triples; the manager
(:mod:`flowride.harvest.manager`) feeds it the iteration times stage 0's reporter announces and
applies its :class:`Setting`. Tested on synthetic timings without a process.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass, field

# 97.5% quantiles of Student's t by degrees of freedom (1..30; above: the normal's)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(dof: int) -> float:
    return _T975[dof - 1] if 1 <= dof <= len(_T975) else 1.96


def t_interval(pcts: list[float]) -> tuple[float, float, float, float] | None:
    """(mean, low, high, sd) in percent of a 95% t-interval over per-pair overheads ``pcts``;
    None with fewer than two.

    The interval is taken on log ratios and mapped back (a geometric mean): the plain mean of
    ``on / off - 1`` is biased upward by about the square of the relative noise (E[1/x] > 1/E[x]),
    which on a node with 10% jitter is ~1 point, half a typical budget, from nothing at all.
    ``sd`` is the spread of one pair in percentage points (log-ratio spread x 100)."""
    if len(pcts) < 2:
        return None
    xs = [math.log1p(p / 100.0) for p in pcts]
    m = statistics.fmean(xs)
    sd = statistics.stdev(xs)
    half = t975(len(xs) - 1) * sd / math.sqrt(len(xs))
    pct = lambda x: math.expm1(x) * 100.0  # noqa: E731
    return pct(m), pct(m - half), pct(m + half), sd * 100.0


LOOKS = (4, 6, 8, 12, 16, 24, 32, 48)  # the pair counts at a rung where the guard may act


def decision_interval(pcts: list[float], alpha: float = 0.05, looks: int = len(LOOKS)) -> tuple[float, float] | None:
    """(low, high) in percent of the interval the guard *acts* on: a t-interval (on log ratios)
    at level ``1 - alpha / looks``. A 95% interval looked at after every new pair crosses any
    budget by chance sooner or later (an A/A stream backed off in about one run in ten). The
    guard therefore acts only at the pair counts :data:`LOOKS` (a group-sequential design), each
    at ``alpha / looks``: by the union bound the chance of any false move on a rung over a whole
    run is at most ``alpha``. It is never narrower than the 95% interval reported."""
    from scipy.stats import t as student_t

    if len(pcts) < 2:
        return None
    xs = [math.log1p(p / 100.0) for p in pcts]
    m, sd = statistics.fmean(xs), statistics.stdev(xs)
    a = min(0.05, alpha / looks)
    half = float(student_t.ppf(1.0 - a / 2.0, len(xs) - 1)) * sd / math.sqrt(len(xs))
    return math.expm1(m - half) * 100.0, math.expm1(m + half) * 100.0


def pairs_to_resolve(n: int, centre: float, low: float, high: float, budget: float) -> int | None:
    """Pairs whose 95% interval would no longer reach the budget: the interval ``[low, high]``
    around ``centre`` over ``n`` pairs narrows as 1/sqrt(pairs), so its side toward the budget
    must shrink to the distance between ``centre`` and the budget. None when the centre sits on
    the budget (no number of pairs resolves it)."""
    gap = abs(centre - budget)
    if gap < 1e-9:
        return None
    half = (high - centre) if budget > centre else (centre - low)
    return max(n + 1, math.ceil(n * (half / gap) ** 2))


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
    iteration: int  # the last iteration of the pair
    on_s: float  # the harvesting arm's mean (A/A pairs: the first arm's)
    off_s: float
    aa: bool = False  # both arms ran training alone: a noise-floor pair

    @property
    def overhead_pct(self) -> float:
        return (self.on_s / self.off_s - 1.0) * 100.0


@dataclass
class BudgetGuard:
    """Closed-loop control of harvesting's overhead (see the module). ``block``: iterations per
    block; ``every``: blocks per cycle, the last two of which are the cycle's pair."""

    budget_pct: float
    block: int = 1
    every: int = 8
    window: int = 48  # pairs at the current rung that the interval uses (the newest)
    min_pairs: int = 4
    relax_pairs: int = 4
    aa_every: int = 4  # one pair in this many is A/A (0: none)
    probe_blocks: int = 32
    skip_first: int = 2  # warm-up iterations (allocation, the first bubbles learned) are not measured
    external: bool = False  # the training switches harvesting on and off itself (a paired run): its blocks pair
    ext_block: int | None = None  # the training's own block length (None: ``block``)
    ext_offset: int = 0  # the first iteration of the training's own first pair (its warm-up)
    seed: int = 0
    level: int = 0
    pairs: list[Pair] = field(default_factory=list)  # harvest-vs-alone pairs at the current level, oldest first
    all_pairs: list[Pair] = field(default_factory=list)
    aa_pairs: list[Pair] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)
    _cur: tuple[int, list[tuple[int, float, bool]]] | None = None  # the pair being filled: (id, [(pos, s, on)])
    _idle: int = 0  # iterations seen on a rung that harvests nothing
    _over_at: dict[int, int] = field(default_factory=dict)  # rung -> the iteration it was judged over the budget
    retry_iters: int = 2048  # a rung judged over is not relaxed into again for this many iterations
    alpha: float = 0.05  # the chance of any false move on one rung within its looks (see decision_interval)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.budget_pct) and self.budget_pct >= 0):
            raise ValueError("budget_pct must be a finite percentage >= 0")
        if self.block < 1 or self.every < 2:
            raise ValueError("block >= 1 and every >= 2")
        if self.min_pairs < 2 or self.relax_pairs < 2 or self.aa_every < 0:
            raise ValueError("min_pairs >= 2, relax_pairs >= 2 and aa_every >= 0")

    @property
    def setting(self) -> Setting:
        return LADDER[self.level]

    # ------------------------------------------------------------------ the measuring plan
    def _is_aa(self, pair_id: int) -> bool:
        return self.aa_every > 0 and pair_id % self.aa_every == self.aa_every - 1

    def _own_slot(self, iteration: int) -> tuple[int, int] | None:
        """(pair id, position in the pair) of one of the guard's own pair iterations, else None."""
        b = iteration // self.block
        pos = b % self.every - (self.every - 2)
        if pos < 0:
            return None
        return b // self.every, pos * self.block + iteration % self.block

    def _slot(self, iteration: int) -> tuple[int, int] | None:
        if not self.external:
            return self._own_slot(iteration)
        blk = self.ext_block or self.block
        if iteration < self.ext_offset:
            return None
        k = iteration - self.ext_offset
        return k // (2 * blk), k % (2 * blk)

    def measuring_off(self, iteration: int) -> bool:
        """Whether ``iteration`` is one of the guard's own off iterations (training alone). False
        once the training runs its own on/off blocks: those pair instead, and an own off block
        inside its on blocks would bias its measurement low."""
        if self.external:
            return False
        slot = self._own_slot(iteration)
        if slot is None:
            return False
        pid, pos = slot
        if self._is_aa(pid):
            return True
        on_first = random.Random(self.seed * 1_000_003 + pid).random() < 0.5
        return (pos < self.block) != on_first

    # ------------------------------------------------------------------ feeding
    def observe(self, iteration: int, seconds: float, harvested: bool) -> dict | None:
        """One iteration's time and whether side work could run in it. Returns the action taken
        (a back-off or a relax, also appended to :attr:`actions`), else None."""
        if not (seconds > 0 and math.isfinite(seconds)) or iteration < self.skip_first:
            return None
        if not self.setting.harvest:
            self._idle += 1
            if self._idle >= self.probe_blocks * self.block:
                iv = self.interval(self.all_pairs[-self.window:])
                return self._move(-1, iteration, "probe", iv[:3] if iv else (0.0, 0.0, 0.0))
            return None
        slot = self._slot(iteration)
        if slot is None:
            return None
        pid, pos = slot
        if self._cur is None or self._cur[0] != pid or any(p >= pos for p, _, _ in self._cur[1]):
            self._cur = (pid, [])  # a new pair (a pair cut short by a missed iteration is dropped)
        self._cur[1].append((pos, seconds, harvested))
        blk = (self.ext_block or self.block) if self.external else self.block
        if len(self._cur[1]) < 2 * blk:
            return None
        got, self._cur = self._cur[1], None
        on = [s for _, s, h in got if h]
        off = [s for _, s, h in got if not h]
        if len(on) == blk and len(off) == blk:
            pair = Pair(iteration, statistics.fmean(on), statistics.fmean(off))
            self.pairs.append(pair)
            self.all_pairs.append(pair)
            return self._decide(iteration)
        if not on:  # training alone in both arms: the noise floor
            self.aa_pairs.append(Pair(iteration, statistics.fmean(off[:blk]), statistics.fmean(off[blk:]), aa=True))
        return None

    # ------------------------------------------------------------------ deciding
    def interval(self, pairs: list[Pair] | None = None) -> tuple[float, float, float, float] | None:
        """(mean, low, high, sd) overhead in percent over ``pairs`` (default: this level's last
        ``window``); None with fewer than two."""
        ps = (self.pairs if pairs is None else pairs)[-self.window:]
        return t_interval([p.overhead_pct for p in ps])

    def verdict(self) -> dict:
        """What the pairs at this rung can say about the budget: ``within``, ``over``,
        ``unresolved`` (the interval spans the budget) or ``learning`` (too few pairs yet), with
        the interval, the spread, and the pairs that would resolve it."""
        ps = self.pairs[-self.window:]
        iv = self.interval()
        n = len(ps)
        per_pair = 2 * (self.ext_block or self.block) if self.external else self.every * self.block
        out: dict = {"pairs": n, "iterations_per_pair": per_pair}
        if iv is None or n < min(self.min_pairs, self.relax_pairs):
            out.update(verdict="learning", text=f"{n} pair(s) at this rung: too few to judge the {self.budget_pct:g}% budget")
            return out
        m, lo, hi, sd = iv
        med = statistics.median(p.overhead_pct for p in ps)
        dlo, dhi = decision_interval([p.overhead_pct for p in ps], self.alpha)
        out.update(mean_pct=m, median_pct=med, ci95_pct=[lo, hi], sd_pct=sd, decision_interval_pct=[dlo, dhi])
        b = self.budget_pct
        if dlo > b and med > b:
            out.update(verdict="over", text=f"over the {b:g}% budget: the interval [{lo:+.2f}, {hi:+.2f}]% lies above it "
                                            f"(and the one the guard acts on, [{dlo:+.2f}, {dhi:+.2f}]%)")
        elif dhi < b:
            out.update(verdict="within", text=f"within the {b:g}% budget: the interval [{lo:+.2f}, {hi:+.2f}]% lies under it "
                                              f"(and the one the guard acts on, [{dlo:+.2f}, {dhi:+.2f}]%)")
        elif lo > b or hi < b:  # the 95% interval decides; the wider one the guard acts on not yet
            side = "above" if lo > b else "under"
            nxt = next((k for k in LOOKS if k > n), None)
            out.update(verdict="unresolved", pairs_needed=nxt, iterations_needed=None if nxt is None else nxt * per_pair,
                       text=f"the interval [{lo:+.2f}, {hi:+.2f}]% lies {side} the {b:g}% budget, but the one the guard acts "
                            f"on ([{dlo:+.2f}, {dhi:+.2f}]%, allowing for its repeated looks) does not yet"
                            + (f"; next look at {nxt} pairs" if nxt else ""))
        else:
            need = pairs_to_resolve(n, m, lo, hi, b)
            more = ("no number of pairs would: the mean sits on the budget" if need is None else
                    f"about {need} pairs ({need * per_pair} iterations) at this spread would resolve a difference of "
                    f"{abs(m - b):.2f} points")
            out.update(verdict="unresolved", pairs_needed=need, iterations_needed=None if need is None else need * per_pair,
                       text=f"cannot resolve the {b:g}% budget at this noise: the interval [{lo:+.2f}, {hi:+.2f}]% "
                            f"spans it (pair spread {sd:.2f} points over {n} pairs); {more}")
        return out

    def _decide(self, iteration: int) -> dict | None:
        n = len(self.pairs)
        if n not in LOOKS and not (n > LOOKS[-1] and n % LOOKS[-1] == 0):
            return None  # acts only at its looks (decision_interval); past the last, every 48 pairs (its window anew)
        v = self.verdict()
        iv = self.interval()
        if v["verdict"] == "over" and v["pairs"] >= self.min_pairs and self.level + 1 < len(LADDER):
            return self._move(+1, iteration, "back off", iv[:3])
        if v["verdict"] == "within" and v["pairs"] >= self.relax_pairs and self.level > 0:
            # not back into a rung judged over the budget a short while ago (that would only
            # swing between the two): after ``retry_iters`` it may be tried again
            over_at = self._over_at.get(self.level - 1)
            if over_at is None or iteration - over_at >= self.retry_iters:
                return self._move(-1, iteration, "relax", iv[:3])
        return None

    def _move(self, step: int, iteration: int, what: str, iv: tuple[float, float, float]) -> dict:
        if what == "back off":
            self._over_at[self.level] = iteration
        self.level += step
        self.pairs = []
        self._cur = None
        self._idle = 0
        act = {"iteration": iteration, "action": what, "level": self.level, "overhead_pct": iv[0],
               "ci95_pct": [iv[1], iv[2]], "setting": asdict(self.setting)}
        self.actions.append(act)
        return act

    def noise_floor(self) -> dict | None:
        """The A/A pairs (training alone in both arms): their mean "overhead" and its interval, the
        spread one pair has when nothing differs. None before two."""
        iv = t_interval([p.overhead_pct for p in self.aa_pairs])
        if iv is None:
            return {"pairs": len(self.aa_pairs)} if self.aa_pairs else None
        m, lo, hi, sd = iv
        return {"pairs": len(self.aa_pairs), "mean_pct": m, "ci95_pct": [lo, hi], "sd_pct": sd}

    def report(self) -> dict:
        """What the guard did and where it settled: the overhead over the pairs of the last
        level (the one the run ended on), with its interval, whether that decides the budget,
        the A/A noise floor, and every action."""
        iv = self.interval()
        v = self.verdict()
        return {"budget_pct": self.budget_pct, "block": self.block, "every": self.every, "level": self.level,
                "setting": asdict(self.setting), "pairs": len(self.all_pairs), "pairs_at_level": len(self.pairs),
                "external": self.external,
                "settled_overhead_pct": None if iv is None else iv[0],
                "settled_ci95_pct": None if iv is None else [iv[1], iv[2]],
                "verdict": v["verdict"], "verdict_text": v["text"], "resolved": v["verdict"] in ("within", "over"),
                "pairs_needed": v.get("pairs_needed"), "iterations_needed": v.get("iterations_needed"),
                "noise_floor": self.noise_floor(),
                "actions": self.actions}
