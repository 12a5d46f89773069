"""A noisy neighbour you can reproduce: processes that take a stated share of the CPU.

Production nodes are noisy (shared hosts, throttling, other jobs): the same iteration takes
longer one time than the next. :class:`Neighbour` makes that noise on purpose, with a stated
duty cycle and period, so that a benchmark can be run quiet and noisy and a test can check a
property under noise (e.g. "the guard never backs off in an A/A run"):

    with Neighbour(duty=0.5, period_s=0.1, cores=1):
        ...  # a neighbour process spins 50 ms of every 100 ms

Each of ``cores`` processes (``python -m flowride.neighbour --worker``) loops: spin on pure
Python arithmetic for ``duty * period_s`` of wall time, then sleep for the rest of the period;
with ``jitter`` each period's duty is drawn from ``duty ± jitter`` (absolute, clipped to [0, 1],
seeded). Periods are laid on a fixed grid from the start, so a period the host delays does not
shift the ones after it. The spin is wall time, not CPU time: the neighbour *asks* for the CPU
that long, as another job would; how much it gets depends on what else runs (alone on an idle
core, ``duty`` of a core).

The processes run at normal priority: they inherit the caller's niceness (a worker above 0 tries
to go back to 0, which only a privileged user can; :meth:`Neighbour.spec` reports the niceness
they run at), and float over every core unless ``cpus`` pins them. They stop when the ``with``
block ends (SIGTERM, then SIGKILL after a grace), and each stops by itself within 50 ms once its
parent is gone (it polls ``os.getppid()``), so none outlives a killed benchmark. A worker that
ends on its own before the block does is reported by ``__exit__`` (RuntimeError): a run
measured "under noise" that had none would be mislabelled.

:func:`iteration_jitter` states how noisy a run was: the median iteration, the coefficient of
variation and the ±% band ``(p90 - p10) / 2 / median``. :func:`parse_noise` reads the
command-line form ``DUTY[:PERIOD_MS[:CORES]]``. By hand:

    python -m flowride.neighbour --duty 0.5 --period-ms 100 --cores 1 [--seconds 10]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from flowride.errors import InputError

DEFAULT_PERIOD_MS = 100.0
POLL_S = 0.05  # how often a worker looks for its parent, spinning or asleep
READY_TIMEOUT_S = 30.0  # a worker that has not said "ready" by then failed to start
STOP_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long
NOISE_FORM = "DUTY[:PERIOD_MS[:CORES]], e.g. 0.5:100:1 (duty in [0, 1], period in ms > 0, cores >= 1), or none"


def _number(value: object, field: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(field, f"{value!r} is not a number", what)
    return float(value)


class Neighbour:
    """``cores`` processes, each busy ``duty`` of every ``period_s`` (a context manager; it can be
    entered again after it has exited, each time with fresh processes)."""

    def __init__(self, duty: float, period_s: float = DEFAULT_PERIOD_MS / 1e3, cores: int = 1, seed: int | None = None,
                 jitter: float = 0.0, cpus: Sequence[int] | None = None) -> None:
        self.duty = _number(duty, "duty", "give a fraction of the period in [0, 1], e.g. 0.5")
        if not 0.0 <= self.duty <= 1.0:
            raise InputError("duty", f"{duty!r} is outside [0, 1]", "give a fraction of the period in [0, 1], e.g. 0.5")
        self.period_s = _number(period_s, "period_s", "give seconds > 0, e.g. 0.1")
        if self.period_s <= 0:
            raise InputError("period_s", f"{period_s!r} is not > 0", "give seconds > 0, e.g. 0.1")
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise InputError("cores", f"{cores!r} is not a whole number >= 1", "give how many neighbour processes to start, e.g. 1")
        self.cores = cores
        self.jitter = _number(jitter, "jitter", "give the ± spread of each period's duty in [0, 1], e.g. 0.1")
        if not 0.0 <= self.jitter <= 1.0:
            raise InputError("jitter", f"{jitter!r} is outside [0, 1]", "give the ± spread of each period's duty in [0, 1], e.g. 0.1")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InputError("seed", f"{seed!r} is not a whole number", "give an integer, or None for a fresh draw")
        self.seed = seed
        self.cpus = None if cpus is None else _check_cpus(cpus)
        self._procs: list[subprocess.Popen] = []
        self._nice: list[int] = []

    def spec(self) -> dict:
        """What the neighbour is, for reports: duty, period_s, cores, jitter; ``nice`` (the
        workers' niceness, once started) and ``cpus`` (when pinned)."""
        out: dict = {"duty": self.duty, "period_s": self.period_s, "cores": self.cores, "jitter": self.jitter}
        out["nice"] = max(self._nice) if self._nice else None
        if self.cpus is not None:
            out["cpus"] = list(self.cpus)
        return out

    def describe(self) -> str:
        """One line: ``duty 0.5 of 100 ms on 1 process (nice 0)``."""
        s = f"duty {self.duty:g} of {self.period_s * 1e3:g} ms on {self.cores} process{'es' if self.cores > 1 else ''}"
        if self.jitter:
            s += f", ±{self.jitter:g} per period"
        if self.cpus is not None:
            s += f", pinned to cpus {','.join(map(str, self.cpus))}"
        if self._nice:
            s += f" (nice {max(self._nice)})"
        return s

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def _command(self, i: int) -> list[str]:
        cmd = [sys.executable, "-m", "flowride.neighbour", "--worker", "--duty", repr(self.duty),
               "--period-ms", repr(self.period_s * 1e3), "--jitter", repr(self.jitter), "--parent", str(os.getpid())]
        if self.seed is not None:
            cmd += ["--seed", str(self.seed + i)]
        if self.cpus is not None:
            cmd += ["--cpus", ",".join(map(str, self.cpus))]
        return cmd

    def start(self) -> Neighbour:
        """Start the workers and wait until each is running (RuntimeError if one fails to)."""
        if self._procs:
            raise RuntimeError("this neighbour is already running")
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[1])  # the workers import flowride from this tree
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._nice = []
        try:
            for i in range(self.cores):
                self._procs.append(subprocess.Popen(self._command(i), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env))
            deadline = time.monotonic() + READY_TIMEOUT_S
            for p in self._procs:
                self._nice.append(_await_ready(p, deadline))
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> list[bool]:
        return [p.poll() is None for p in self._procs]

    def stop(self, grace: float = STOP_GRACE_S) -> list[int | None]:
        """Stop every worker (SIGTERM, SIGKILL after ``grace``) and reap it; returns the exit
        codes each had *before* it was asked to stop (None: it was still running)."""
        before = [p.poll() for p in self._procs]
        for p in self._procs:
            if p.poll() is None:
                _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self._procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(p, signal.SIGKILL)
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        self._procs = []
        return before

    def __enter__(self) -> Neighbour:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        pids = self.pids
        before = self.stop()
        ended = [(pid, rc) for pid, rc in zip(pids, before, strict=True) if rc is not None]
        if ended and exc_type is None:
            raise RuntimeError("neighbour process(es) ended before the run did: "
                               + ", ".join(f"pid {pid} exit code {rc}" for pid, rc in ended)
                               + "; the run was not measured under the stated noise")


def _check_cpus(cpus: Sequence[int]) -> tuple[int, ...]:
    out = tuple(cpus)
    if not out or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in out):
        raise InputError("cpus", f"{cpus!r} is not a list of CPU numbers", "give e.g. [0] or [0, 1], or None to float")
    have = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    if not set(out) <= have:
        raise InputError("cpus", f"{sorted(set(out) - have)} not among this process's CPUs {sorted(have)}",
                         "give CPUs this process may run on")
    return out


def _signal(p: subprocess.Popen, sig: int) -> None:
    try:
        p.send_signal(sig)
    except ProcessLookupError:
        pass


def _await_ready(p: subprocess.Popen, deadline: float) -> int:
    """Wait for the worker's ``ready NICE`` line; its niceness."""
    assert p.stdout is not None
    fd = p.stdout.fileno()
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"neighbour process {p.pid} did not start within {READY_TIMEOUT_S:g} s")
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(fd, 256)
            if not chunk:
                rc = p.wait()
                raise RuntimeError(f"neighbour process {p.pid} ended at start (exit code {rc}); its stderr says why")
            buf += chunk
    word, _, nice = buf.decode(errors="replace").partition("\n")[0].partition(" ")
    if word != "ready":
        raise RuntimeError(f"neighbour process {p.pid} said {buf!r} instead of ready")
    return int(nice)


def parse_noise(text: str | None, field: str = "--noise") -> Neighbour | None:
    """``DUTY[:PERIOD_MS[:CORES]]`` as a (not yet started) :class:`Neighbour`; ``none``, ``off``
    or an empty text: None (quiet). Errors name ``field``."""
    t = "" if text is None else str(text).strip()
    if t.lower() in ("", "none", "off", "quiet"):
        return None
    parts = t.split(":")
    if len(parts) > 3:
        raise InputError(field, f"{text!r} has {len(parts)} fields", f"give {NOISE_FORM}")
    names = ("duty", "period (ms)", "cores")
    vals: list[float] = []
    for name, part in zip(names, parts, strict=False):
        try:
            v = float(part) if name != "cores" else int(part)
        except ValueError:
            raise InputError(field, f"{name} {part!r} is not a {'whole ' if name == 'cores' else ''}number",
                             f"give {NOISE_FORM}") from None
        if not math.isfinite(v):
            raise InputError(field, f"{name} {part!r} is not finite", f"give {NOISE_FORM}")
        vals.append(v)
    duty = vals[0]
    period_ms = vals[1] if len(vals) > 1 else DEFAULT_PERIOD_MS
    cores = int(vals[2]) if len(vals) > 2 else 1
    if not 0.0 <= duty <= 1.0:
        raise InputError(field, f"duty {parts[0]} is outside [0, 1]", f"give {NOISE_FORM}")
    if period_ms <= 0:
        raise InputError(field, f"period {parts[1]} ms is not > 0", f"give {NOISE_FORM}")
    if cores < 1:
        raise InputError(field, f"cores {parts[2]} is not >= 1", f"give {NOISE_FORM}")
    return Neighbour(duty, period_ms / 1e3, cores)


def noise_arg(text: str) -> Neighbour | None:
    """:func:`parse_noise` as an argparse ``type`` (its error becomes argparse's one line)."""
    try:
        return parse_noise(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(e.problem + (f" ({e.fix})" if e.fix else "")) from None


noise_arg.__name__ = "noise"


def _percentile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def iteration_jitter(times: Sequence[float], harvest: Sequence[bool | None] | None = None) -> dict:
    """How much iteration times vary: n, median_s, mean_s, cv (sample standard deviation over
    the mean), p10_s, p90_s and band_pct = (p90 - p10) / 2 / median * 100 (the "±%" a reader
    quotes). ``harvest``: a train report's ``iteration_harvest`` flags; given, only the off
    iterations (False: training alone) count, and a run that was not paired (all None) counts
    whole."""
    xs = [float(t) for t in times]
    if harvest is not None:
        flags = list(harvest)
        if len(flags) != len(xs):
            raise InputError("harvest", f"{len(flags)} flags for {len(xs)} iteration times", "give one flag per iteration")
        if any(f is not None for f in flags):
            xs = [t for t, f in zip(xs, flags, strict=True) if f is False]
    if not xs:
        raise InputError("times", "no iteration times to measure", "give at least one (off) iteration")
    if any(not math.isfinite(t) or t <= 0 for t in xs):
        raise InputError("times", "holds a time that is not a positive number", "give iteration times in seconds > 0")
    s = sorted(xs)
    n = len(s)
    med = _percentile(s, 0.5)
    mean = sum(s) / n
    sd = math.sqrt(sum((t - mean) ** 2 for t in s) / (n - 1)) if n > 1 else 0.0
    p10, p90 = _percentile(s, 0.1), _percentile(s, 0.9)
    return {"n": n, "median_s": med, "mean_s": mean, "cv": sd / mean, "p10_s": p10, "p90_s": p90,
            "band_pct": (p90 - p10) / 2.0 / med * 100.0}


def describe_jitter(j: dict) -> str:
    """``±12.3% (p10-p90), cv 0.081, median 182 ms, n 20``."""
    return f"±{j['band_pct']:.1f}% (p10-p90), cv {j['cv']:.3f}, median {j['median_s'] * 1e3:.0f} ms, n {j['n']}"


# ---- the worker (one neighbour process) ------------------------------------------------------


def _orphaned(parent: int | None) -> bool:
    return parent is not None and os.getppid() != parent


def _spin_until(t_end: float, parent: int | None) -> int:
    """Pure Python arithmetic until ``t_end`` (monotonic); checks the parent every POLL_S."""
    x = 1
    next_check = time.monotonic() + POLL_S
    while True:
        for _ in range(500):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        now = time.monotonic()
        if now >= t_end:
            return x
        if now >= next_check:
            if _orphaned(parent):
                raise SystemExit(0)
            next_check = now + POLL_S


def _sleep_until(t_end: float, parent: int | None) -> None:
    while True:
        if _orphaned(parent):
            raise SystemExit(0)
        left = t_end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, POLL_S))


def run_worker(duty: float, period_s: float, jitter: float = 0.0, seed: int | None = None,
               parent: int | None = None, seconds: float | None = None) -> None:
    """The loop of one neighbour process (until killed, orphaned, or ``seconds`` pass)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    t_next = t0
    while seconds is None or time.monotonic() - t0 < seconds:
        d = duty if not jitter else min(1.0, max(0.0, duty + rng.uniform(-jitter, jitter)))
        start = t_next
        t_next = start + period_s
        if d > 0:
            _spin_until(start + d * period_s, parent)
        _sleep_until(t_next, parent)
        if time.monotonic() > t_next + period_s:  # the host held us back over a period: restart the grid
            t_next = time.monotonic()


def _worker_main(a: argparse.Namespace) -> None:
    if _orphaned(a.parent):
        return
    if a.cpus:
        os.sched_setaffinity(0, [int(c) for c in a.cpus.split(",")])
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)  # normal priority, where this user may
        except OSError:
            pass
        nice = os.getpriority(os.PRIO_PROCESS, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # stop at once when told (an ignored SIGTERM is inherited)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops us
    os.write(1, f"ready {nice}\n".encode())
    run_worker(a.duty, a.period_ms / 1e3, a.jitter, a.seed, a.parent, a.seconds)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m flowride.neighbour", description=__doc__.splitlines()[0])
    ap.add_argument("--duty", type=float, required=True, help="busy fraction of each period, in [0, 1]")
    ap.add_argument("--period-ms", type=float, default=DEFAULT_PERIOD_MS)
    ap.add_argument("--cores", type=int, default=1, help="neighbour processes (each up to one core)")
    ap.add_argument("--jitter", type=float, default=0.0, help="each period's duty drawn from duty ± this")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--cpus", default=None, help="pin to these CPUs, e.g. 0 or 0,1 (default: float)")
    ap.add_argument("--seconds", type=float, default=None, help="stop after this long (default: until Ctrl-C)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        _worker_main(a)
        return
    try:
        cpus = [int(c) for c in a.cpus.split(",")] if a.cpus else None
        nb = Neighbour(a.duty, a.period_ms / 1e3, a.cores, seed=a.seed, jitter=a.jitter, cpus=cpus)
    except (InputError, ValueError) as e:
        ap.error(str(e))
    with nb:
        print(f"neighbour: {nb.describe()}, pids {' '.join(map(str, nb.pids))}"
              + (f", for {a.seconds:g} s" if a.seconds else ", Ctrl-C to stop"), flush=True)
        try:
            if a.seconds:
                time.sleep(a.seconds)
            else:
                while True:
                    time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
