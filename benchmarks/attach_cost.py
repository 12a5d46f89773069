"""What ``flowride.harvest.attach`` costs training with no side task: per compute action, and per step.

    python benchmarks/attach_cost.py micro [--iters 4000]
    torchrun --standalone --nproc-per-node 2 benchmarks/attach_cost.py step [--schedule 1f1b] [--pairs 40] [--block 4]
    python benchmarks/attach_cost.py all        # both; the step part under torchrun (2 gloo ranks)
    python benchmarks/attach_cost.py instructions [--iters 600]   # instructions per step (valgrind's callgrind)

**micro** times the observer's wrappers in isolation, in one process: rank 0 of torch's own
Schedule1F1B (p = 2, m = 8) built on stand-in stages whose compute methods do nothing, so an
iteration is nothing but the 16 wrapped calls. The same iteration is timed with the wrappers off
and on, interleaved (median of 15 rounds of ``--iters`` iterations each); the difference per call
is the cost per compute action. Three cases: nothing announced (every gap shorter than
``min_bubble_s``), every gap announced (two datagrams per action, to a process that drains
them, as the manager does), and an empty iteration (the per-step part: ``step``'s own wrapper,
the reporter's iteration start).

**step** trains a small MLP in 2 pipeline stages with torch's ScheduleGPipe or Schedule1F1B
(one gloo rank and one torch thread per stage, a step of tens of ms), attached with no side task,
and alternates blocks of ``--block`` steps with the observer on and off (``Harvest.pause`` /
``resume``: off, torch's own methods run, no wrapper is left on the path) in one run. Each pair of
blocks runs in an order drawn from a seed, so the machine's drift falls on both arms; each pair
gives one figure, mean(on) / mean(off) - 1, and the table reports their mean with a 95% t
interval and a 95% percentile-bootstrap interval (10,000 resamples of pairs). Target: at most
0.5% of the step. It also shows how far the off blocks alone wander during the run: that is
what two separate runs (one with attach, one without) on a shared machine compare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

SINK = ("import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('127.0.0.1', 0))\n"
        "print(s.getsockname()[1], flush=True)\nwhile True:\n    s.recv(65536)\n")


# ---------------------------------------------------------------------------------------- micro
def _fake_iteration(n_actions: bool = True):
    """Rank 0 of torch's Schedule1F1B (p=2, m=8) on stand-in stages, with a ``step`` that calls
    the stage's compute methods in the schedule's own order and does nothing else."""
    from flowride.pipeline import torch_compat as tc

    sched = tc.dry_schedule("1f1b", 2, 8, 1, rank=0)
    stage = tc.local_stages(sched)[0]

    def noop(*_a, **_k) -> None:
        return None

    for m in tc.STAGE_METHODS:
        setattr(stage, m, noop)
    calls = []
    for a in (tc.compute_actions(sched)[0] if n_actions else []):
        if a.kind == "F":
            calls.append(("forward_one_chunk", (a.mb, (), {}), {}))
        elif a.kind in "BI":
            calls.append(("backward_one_chunk", (a.mb,), {"loss": None, "full_backward": a.kind == "B"}))
        else:
            calls.append(("backward_weight_one_chunk", (a.mb,), {}))

    def step(*_a, **_k) -> None:
        for name, args, kw in calls:
            getattr(stage, name)(*args, **kw)

    sched.step = step
    return sched, len(calls)


def _timed(sched, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        sched.step()
    return (time.perf_counter() - t0) / iters


def micro(iters: int, rounds: int = 15) -> list[dict]:
    from flowride.pipeline.events import BubblePublisher
    from flowride.pipeline.reporter import BubbleReporter
    from flowride.pipeline.torch_observe import TorchObserver

    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        port = int(sink.stdout.readline())
        rows = []
        for case, min_bubble, with_actions in (("per compute action, nothing announced", float("inf"), True),
                                               ("per compute action, every gap announced (2 datagrams)", 0.0, True),
                                               ("per step (empty iteration: step wrapper, iteration start)", float("inf"), False)):
            sched, n = _fake_iteration(with_actions)
            rep = BubbleReporter(0, BubblePublisher(port), min_bubble_s=min_bubble)
            diffs, offs = [], []
            for _ in range(rounds):
                off = _timed(sched, iters)
                obs = TorchObserver(sched, rep)  # wraps; built outside the timing
                on = _timed(sched, iters)
                obs.detach()
                rep.waits.clear()  # the reporter keeps every wait; do not let the list grow round after round
                diffs.append((on - off) / max(n, 1))
                offs.append(off / max(n, 1))
            rows.append({"case": case, "us": statistics.median(diffs) * 1e6, "spread_us": (max(diffs) - min(diffs)) * 1e6,
                         "bare_us": statistics.median(offs) * 1e6, "calls": n})
            rep.close()
        return rows
    finally:
        sink.kill()
        sink.wait()


# ----------------------------------------------------------------------------------------- step
def _t_interval(x: np.ndarray) -> tuple[float, float]:
    m, se = float(np.mean(x)), float(np.std(x, ddof=1) / np.sqrt(len(x)))
    try:
        from scipy import stats

        q = float(stats.t.ppf(0.975, len(x) - 1))
    except ImportError:  # a normal quantile: slightly narrow for few pairs
        q = 1.96
    return m - q * se, m + q * se


def _bootstrap_mean(x: np.ndarray, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    b = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    lo, hi = np.percentile(b, [2.5, 97.5])
    return float(lo), float(hi)


def step_bench(a: argparse.Namespace) -> None:
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    import flowride.harvest

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    if a.pin and hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= world:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})  # one core per stage: fewer migrations
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(a.width, 4 * a.width), nn.GELU(), nn.Linear(4 * a.width, a.width)) for _ in range(a.layers)]
    per = a.layers // world
    stage = PipelineStage(nn.Sequential(*layers[rank * per:(rank + 1) * per]), rank, world, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[a.schedule]
    sched = cls(stage, a.microbatches, loss_fn=nn.MSELoss())
    opt = torch.optim.SGD(stage.submod.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(a.batch, a.width, generator=g), torch.randn(a.batch, a.width, generator=g)

    def one() -> tuple[float, float]:
        """(wall, CPU time of this thread) of one training step."""
        c0, t0 = time.thread_time(), time.perf_counter()
        sched.step(*((x,) if rank == 0 else ()), target=y if rank == world - 1 else None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, time.thread_time() - c0

    for _ in range(a.warmup):  # torch's own warm-up, before attach
        one()
    run_dir = Path(a.run_dir or tempfile.mkdtemp(prefix="attach-cost-"))
    t_attach = time.perf_counter()
    # --announce: a task whose (declared) step never fits a bubble, so every bubble is announced
    # and none is used: the observer's whole cost, datagrams included, without side work
    never = {"side_tasks": ["pagerank"], "profiles": {"pagerank": {"median_step_s": 1e3}}} if a.announce else {}
    h = flowride.harvest.attach(sched, run_dir=run_dir, min_bubble_s=a.min_bubble_ms / 1e3, **never)
    t_attach = time.perf_counter() - t_attach
    for _ in range(a.warmup):  # the observer learns its lengths (announcing from the second step)
        one()
    order = np.random.default_rng(a.seed).integers(0, 2, size=a.pairs)  # the same on every rank
    on_t, off_t = [], []
    for p in range(a.pairs):
        arms = ("on", "off") if order[p] else ("off", "on")
        blocks = {}
        for arm in arms:
            if arm == "on" and not a.aa:
                h.resume()
            else:
                h.pause()
            blocks[arm] = [one() for _ in range(a.block)]
        on_t.append(blocks["on"])
        off_t.append(blocks["off"])
    h.resume()
    t_exit = time.perf_counter()
    h.close(wait=False)
    t_exit = time.perf_counter() - t_exit
    summary = h.summary()
    h.wait()
    out = {"rank": rank, "on": on_t, "off": off_t, "attach_s": t_attach, "exit_s": t_exit,
           "announced": summary["announced"], "waits": summary["waits"], "events": summary["events"]}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, out)
    if rank == 0:
        report(a, gathered)
        if a.out:
            Path(a.out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def _paired(on: np.ndarray, off: np.ndarray) -> dict:
    """The observer's cost is additive (work per action and per step), so each pair gives one
    difference, mean(on) - mean(off) of its blocks; their mean, with a t and a bootstrap 95%
    interval, is divided by the mean step with the observer off (a mean of per-pair ratios would
    weigh the pairs that happened to run fast more)."""
    d = on.mean(axis=1) - off.mean(axis=1)
    base = float(off.mean())
    t_lo, t_hi = _t_interval(d)
    b_lo, b_hi = _bootstrap_mean(d)
    return {"delta_us": float(d.mean()) * 1e6, "pct": float(d.mean()) / base * 100, "t_pct": (t_lo / base * 100, t_hi / base * 100),
            "boot_pct": (b_lo / base * 100, b_hi / base * 100), "t_us": (t_lo * 1e6, t_hi * 1e6)}


def report(a: argparse.Namespace, ranks: list[dict]) -> None:
    print(f"\nper step, paired on/off in one run: {a.schedule}, p=2, m={a.microbatches}, MLP width {a.width} x {a.layers} "
          f"layers, batch {a.batch}; {a.pairs} pairs of {a.block}-step blocks; min_bubble_s {a.min_bubble_ms} ms; "
          f"CPU, gloo, 1 torch thread per rank{', pinned to a core each' if a.pin else ''}{'; A/A: both arms OFF' if a.aa else ''}"
          f"{'; a never-fitting task queued: bubbles announced' if a.announce else '; no side task: nothing announced'}")
    print("| rank | measure | off (ms) | on (ms) | on - off per step | 95% t interval | as % of the wall step off | "
          "95% t interval | 95% bootstrap | off blocks' range (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in ranks:
        on, off = np.array(r["on"]), np.array(r["off"])  # [pair, step, (wall, cpu)]
        wall_off = float(off[:, :, 0].mean())
        for k, what in ((0, "wall"), (1, "CPU, training thread")):
            st = _paired(on[:, :, k], off[:, :, k])
            scale = float(off[:, :, k].mean()) / wall_off  # CPU differences are expressed against the wall step too
            blocks = off[:, :, k].mean(axis=1) * 1e3
            print(f"| {r['rank']} | {what} | {off[:, :, k].mean() * 1e3:.2f} | {on[:, :, k].mean() * 1e3:.2f} | "
                  f"{st['delta_us']:+.0f} us | [{st['t_us'][0]:+.0f}, {st['t_us'][1]:+.0f}] us | {st['pct'] * scale:+.3f}% | "
                  f"[{st['t_pct'][0] * scale:+.3f}%, {st['t_pct'][1] * scale:+.3f}%] | "
                  f"[{st['boot_pct'][0] * scale:+.3f}%, {st['boot_pct'][1] * scale:+.3f}%] | "
                  f"{blocks.min():.1f}-{blocks.max():.1f} |")
    off0 = np.array(ranks[0]["off"])[:, :, 0].ravel() * 1e3
    win = max(1, min(100, len(off0) // 5))
    means = off0[: len(off0) // win * win].reshape(-1, win).mean(axis=1)
    print(f"the same code, observer off, in windows of {win} steps (each like a separate short run): means "
          f"{means.min():.1f}-{means.max():.1f} ms, the slowest {(means.max() / means.min() - 1) * 100:.0f}% above the fastest")
    print("bubbles announced / waits: " + ", ".join(f"rank {r['rank']}: {r['announced']} / {r['waits']}" for r in ranks))
    print(f"attach() itself: {ranks[0]['attach_s']:.2f} s on rank 0 (starts the manager, once); leaving the with block: "
          f"{max(r['exit_s'] for r in ranks) * 1e3:.1f} ms")


# ------------------------------------------------------------------------------------------ main
def _loop(min_bubble: float, on: bool, steps: int) -> None:
    """The body ``instructions`` counts: ``steps`` fake 1F1B steps, observer on or off."""
    from flowride.pipeline.events import BubblePublisher
    from flowride.pipeline.reporter import BubbleReporter
    from flowride.pipeline.torch_observe import TorchObserver

    sched, _ = _fake_iteration(True)
    rep = BubbleReporter(0, BubblePublisher(None), min_bubble_s=min_bubble)
    if on:
        TorchObserver(sched, rep)
    _timed(sched, steps)


def instructions(steps: int = 600) -> list[dict]:
    """Instructions per step under ``valgrind --tool=callgrind``: a count, not a time, so it is the
    same on a loaded machine and an idle one, and two versions of the observer can be compared
    exactly. Each figure is a difference of two counts of ``_timed``'s loop alone (``steps`` + 1
    steps against 1): callgrind zeroes its counters and dumps them as ``time.perf_counter`` is
    entered, which in ``_loop``'s process happens only where the loop starts and ends. (The
    whole-process counts used before moved by several million between identical runs, torch's
    import being ~9e9 instructions: tens of thousands per step at 300 steps.) Without that symbol
    it falls back to whole-process counts. The observer's figure is that of the observer on less
    that of off. The six counts run side by side, one per CPU."""
    def count(*args: object) -> int:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "callgrind.out"
            p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                                "--zero-before=time_perf_counter", "--dump-before=time_perf_counter", sys.executable,
                                __file__, "_loop", *map(str, args)], capture_output=True, text=True, check=True,
                               env=dict(os.environ, PYTHONHASHSEED="0"))
            loop = Path(f"{out}.2")  # dumped as the loop's second perf_counter() is entered: the loop alone
            if loop.exists():
                return int(re.search(r"^(?:summary|totals): (\d+)", loop.read_text(), re.M).group(1))
            return int(next(line for line in p.stderr.splitlines() if "Collected" in line).split()[-1])

    cases = [(mb, on, n) for mb, on in ((float("inf"), 0), (float("inf"), 1), (0.0, 1)) for n in (steps + 1, 1)]
    with ThreadPoolExecutor(max_workers=max(1, min(len(cases), os.cpu_count() or 1))) as ex:
        counts = dict(zip(cases, ex.map(lambda c: count(*c), cases), strict=True))

    def per_step(mb: float, on: int) -> float:
        return (counts[(mb, on, steps + 1)] - counts[(mb, on, 1)]) / steps

    bare = per_step(float("inf"), 0)
    return [{"case": "bare step (16 no-op compute calls)", "instructions": bare},
            {"case": "observer, nothing announced", "instructions": per_step(float("inf"), 1) - bare},
            {"case": "observer, every gap announced (no socket)", "instructions": per_step(0.0, 1) - bare}]


def print_micro(rows: list[dict], iters: int) -> None:
    print(f"\nper call, wrappers in isolation: torch {torch.__version__}, {platform.machine()}, Python "
          f"{platform.python_version()}; median of 15 interleaved rounds of {iters} iterations")
    print("| case | cost (us) | spread (us) | bare call (us) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['us']:.2f} | {r['spread_us']:.2f} | {r['bare_us']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    if len(sys.argv) == 5 and sys.argv[1] == "_loop":  # the body that ``instructions`` counts
        _loop(float(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4]))
        return
    ap.add_argument("what", choices=("micro", "step", "all", "instructions"))
    ap.add_argument("--iters", type=int, default=4000, help="micro: iterations per round")
    ap.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b"))
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-bubble-ms", type=float, default=2.0, help="step: attach's min_bubble_s in ms (inf: announce nothing)")
    ap.add_argument("--announce", action="store_true", help="step: queue a task that never fits a bubble, so bubbles "
                    "are announced (with no task queued, attach announces nothing)")
    ap.add_argument("--aa", action="store_true", help="step: an A/A run (both arms off): the machine's noise floor")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="step: do not pin rank r to core r")
    ap.add_argument("--run-dir", help="step: where attach keeps its files (default: a temporary directory)")
    ap.add_argument("--out", help="step: write every rank's step times here (JSON)")
    a = ap.parse_args()
    if a.what == "step":
        step_bench(a)
        return
    if a.what == "instructions":
        print(f"instructions per 1F1B step (p=2, m=8, rank 0: 16 compute calls), callgrind, {a.iters} steps; Python "
              f"{platform.python_version()}, torch {torch.__version__}")
        print("| case | instructions per step |\n|---|---|")
        for r in instructions(a.iters):
            print(f"| {r['case']} | {r['instructions']:,.0f} |")
        return
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    print_micro(micro(a.iters), a.iters)
    if a.what == "all":
        args = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                if k not in ("what", "iters", "aa", "pin", "announce") and v is not None]
        args += ["--aa"] * a.aa + ["--no-pin"] * (not a.pin) + ["--announce"] * a.announce
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, "step", *args],
                       check=True, env=env)
    print(f"load average after: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
