"""Test helpers for the synthesis' time logic (no fixtures, no conftest): a wall clock that stands
still until a test moves it, the ``--chunks auto`` sweep driven by scripted outcomes, and the
rule every sweep's rows keep.

Why: the sweep decides from its :class:`~flowride.api.clock.Clock` (shares of what is left, what a
count took). Timed by the real clock, those decisions follow the machine's speed and load; timed
by :class:`StoppedWall`, and with each count's outcome and duration scripted, they follow only
the logic under test, so the verdict is the same on any machine."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from flowride.collectives.demand import Collective


class StoppedWall:
    """The wall clock :mod:`flowride.api.clock` reads, held still until a test moves ``now``. Only
    the Clock reads it: the constructions keep real time for their own (inner) budgets."""

    def __init__(self, monkeypatch) -> None:
        import flowride.api.clock as clock_module

        self.now = 1000.0
        monkeypatch.setattr(clock_module, "time", self)

    def perf_counter(self) -> float:
        return self.now


def scripted_sweep(monkeypatch, topo, size_bytes: int, limit: float | None, finish_us: Callable[[int], float],
                   seconds: Callable[[int, float | None], float] = lambda c, budget: 0.0, bound_us: float = 1.0,
                   method: str = "auto", timed_out: Callable[[int, float | None], bool] = lambda c, budget: False):
    """``--chunks auto`` (:func:`flowride.api.auto.synthesize_auto`) on ``topo`` with each count's
    synthesis replaced by its script: ``finish_us(chunks)`` is what it finds, ``seconds(chunks,
    budget)`` how long the stopped wall moves while it runs, ``timed_out`` whether it was cut
    short. Returns (the outcome, [(chunks, method asked, budget) per call])."""
    import flowride.api.auto as auto
    from flowride.api.clock import Clock
    from flowride.synth.options import SynthOptions

    wall = StoppedWall(monkeypatch)
    calls: list[tuple[int, str, float | None]] = []

    def one(_topo, demand, opts, clock, _progress=None, _incumbent=()):
        c, budget = demand.chunks, opts.time_limit
        calls.append((c, opts.method, budget))
        took = seconds(c, budget)
        wall.now += took
        return SimpleNamespace(
            demand=demand, finish_time_s=finish_us(c) * 1e-6, wall_seconds=took,
            schedule=SimpleNamespace(sends=[], meta={"method": opts.method, "method_requested": opts.method}),
            sim=SimpleNamespace(epochs=1), bounds=SimpleNamespace(best_s=bound_us * 1e-6),
            search=SimpleNamespace(timed_out=timed_out(c, budget)))

    monkeypatch.setattr(auto, "synthesize_one", one)
    opts = SynthOptions(method=method, time_limit=limit)
    out = auto.synthesize_auto(topo, Collective.ALLGATHER, size_bytes, opts, Clock(limit))
    return out, calls


def assert_jumps_follow_two_strong_gains(rows: list[dict]) -> bool:
    """The sweep's rows (phase ``sweep``) double the count, or quadruple it only right after two
    doublings that each gained :data:`~flowride.api.auto.JUMP_GAIN` among the fast constructions
    (the first count ran another method). Holds for any sweep, however the limit cut it; returns
    whether it jumped."""
    from flowride.api import auto

    rows = [r for r in rows if r["phase"] == "sweep"]
    best, gains, jumped = None, [], False
    for prev, row in zip(rows, rows[1:], strict=False):
        if prev["chunks"] > 1:  # gains are judged among the fast constructions, as the sweep does
            gains.append(1.0 if best is None else 1 - prev["finish_us"] / best)
            best = prev["finish_us"] if best is None else min(best, prev["finish_us"])
        if row["chunks"] == 4 * prev["chunks"]:
            jumped = True
            assert len(gains) >= 2 and min(gains[-2:]) >= auto.JUMP_GAIN, rows
        else:
            assert row["chunks"] == 2 * prev["chunks"], rows
    return jumped


def virtual_sweep(wall: StoppedWall, limit: float, given: Callable | None = None, counts: int = 3) -> Callable[[dict], None]:
    """Progress for a ``--chunks auto`` synthesis of ``limit`` seconds on ``wall``: each count the
    sweep starts moves the wall ``1 / counts`` of the limit (so 1, 2, 4, ... chunks run, ``counts``
    of them, each with a real budget of its share) and the search after the sweep moves it to the
    end (it gets nothing).
    Which counts run, and the time each is given, then follow from the outcomes alone, not from
    how fast this machine builds them. ``given``: the caller's own progress, still called."""

    def progress(ev: dict) -> None:
        if ev.get("stage") == "chunks":
            wall.now += limit if ev.get("search") else limit / counts
        if given is not None:
            given(ev)

    return progress


def auto_sweeps_in_virtual_time(monkeypatch, *modules, counts: int = 2) -> StoppedWall:
    """Every ``synthesize`` that ``modules`` call (each module's own name for it) runs with
    :func:`virtual_sweep` progress on one stopped wall (``counts`` chunk counts: 1, 2): its
    ``--chunks auto`` sweep ends on its outcomes instead of waiting for its limit. For callers
    whose assertions hold whatever the limits cut off (joint schedules, plans)."""
    wall = StoppedWall(monkeypatch)
    for module in modules:
        real = module.synthesize

        def synthesize(*args, _real=real, **kw):
            limit = kw.get("time_limit", args[5] if len(args) > 5 else None) or 60.0
            return _real(*args, **{**kw, "progress": virtual_sweep(wall, limit, kw.get("progress"), counts)})

        monkeypatch.setattr(module, "synthesize", synthesize)
    return wall


def refused_here(capsys, args: list, *needles: str, within: float = 20.0) -> str:
    """The CLI's ``main`` in this process (no interpreter start per case; a test keeps one such
    refusal end to end in a subprocess, :func:`clirun.assert_clean_error`): exit 2, one line on
    stderr holding every needle, no traceback, and refused before any work (``within``: CPU
    seconds, a generous bound a busy machine does not change). Returns the line."""
    import time

    from flowride.cli import main

    capsys.readouterr()
    t0 = time.process_time()
    code = main([str(a) for a in args])
    used = time.process_time() - t0
    err = capsys.readouterr().err
    assert code == 2, (code, err[-2000:])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert used < within, f"used {used:.1f} s of CPU"
    return lines[0]
