"""Each rank's monotonic clock against rank 0's, measured NTP-style over the process group.

Timestamps a rank records (iteration starts, waits, compute spans) are readings of its host's
``time.monotonic()``. Ranks on one host share that clock; ranks on another node do not (each
host's monotonic clock counts from its own boot). To put every rank's records on one time axis,
rank 0 measures each rank's offset right after ``init_process_group``, the way NTP does:

    rank 0 reads t0, sends a small tensor to rank r;
    rank r reads t1 when it arrives and t2 just before it answers with (t1, t2);
    rank 0 reads t3 when the answer arrives.

    offset = ((t1 - t0) + (t2 - t3)) / 2        (rank r's clock minus rank 0's)
    rtt    = (t3 - t0) - (t2 - t1)               (the time the messages were on the way)

Whatever the two one-way delays are (both at least zero), the true offset lies within ``rtt / 2``
of the measured one, so ``error_s = rtt / 2`` is a bound, not an estimate. Of ``rounds``
exchanges the one with the smallest round trip is kept (its bound is the tightest; the first
exchange, which sets up the connection, is left out). ``time_on_rank0 = t - offset``.

The offset is measured once, at start: two hosts' clocks also run at slightly different rates
(NTP keeps them within a few parts per million), which adds up to about 1 ms over 100 s of run.

``FLOWRIDE_CLOCK_SKEW=RANK:SECONDS[,RANK:SECONDS...]`` is a test hook: that rank's clock reads
SECONDS ahead (workers add it to every timestamp they record and to their clock reads here), so
the measurement and the alignment can be checked on one host, whose ranks share a clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from flowride.errors import InputError

SKEW_ENV = "FLOWRIDE_CLOCK_SKEW"
ROUNDS = 32  # exchanges per rank; the one with the smallest round trip is kept
TAG = 7_340_033  # point-to-point tag of the exchanges (gloo matches on it; kept clear of the workers' own)


@dataclass(frozen=True)
class ClockOffset:
    """Rank ``rank``'s monotonic clock minus rank 0's, within ``error_s`` (half the best round
    trip ``rtt_s``). Rank 0 has 0 and 0."""

    rank: int
    offset_s: float
    error_s: float
    rtt_s: float

    def to_rank0(self, t: float) -> float:
        """A reading of this rank's clock as rank 0's clock would have read at the same instant."""
        return t - self.offset_s

    def as_dict(self) -> dict:
        return asdict(self)


def describe(offsets: Sequence[dict]) -> str:
    """One line for people: how far the ranks' clocks were from rank 0's, and how well known."""
    others = [o for o in offsets if o["rank"] != 0]
    if not others:
        return "clocks: one rank, nothing to align"
    worst = max(others, key=lambda o: abs(o["offset_s"]))
    bound = max(o["error_s"] for o in others)
    return (f"clocks: {len(others)} rank(s) aligned to rank 0's; largest offset {worst['offset_s'] * 1e6:+.1f} us "
            f"(rank {worst['rank']}), each known within {bound * 1e6:.1f} us")


def offset_from_samples(samples: Sequence[tuple[float, float, float, float]]) -> tuple[float, float, float]:
    """(offset, error bound, round trip) from exchanges (t0, t1, t2, t3): the one with the
    smallest round trip. t0, t3 are rank 0's readings; t1, t2 the peer's."""
    if not samples:
        raise ValueError("no clock exchanges to estimate from")
    best = None
    for t0, t1, t2, t3 in samples:
        rtt = max(0.0, (t3 - t0) - (t2 - t1))
        if best is None or rtt < best[0]:
            best = (rtt, ((t1 - t0) + (t2 - t3)) / 2)
    rtt, offset = best
    return offset, rtt / 2, rtt


def injected_skew(rank: int, env: dict[str, str] | None = None) -> float:
    """Seconds the test hook ``FLOWRIDE_CLOCK_SKEW`` puts ``rank``'s clock ahead (0 without it)."""
    spec = (os.environ if env is None else env).get(SKEW_ENV, "").strip()
    if not spec:
        return 0.0
    out = 0.0
    for part in spec.split(","):
        who, sep, secs = part.partition(":")
        try:
            if not sep:
                raise ValueError
            r, s = int(who), float(secs)
        except ValueError:
            raise InputError(SKEW_ENV, f"{part!r} is not RANK:SECONDS", "write e.g. 3:1000 or 1:-0.5,3:2") from None
        if r == rank:
            out += s
    return out


def skewed_clock(rank: int) -> Callable[[], float]:
    """``time.monotonic`` of this rank, with the test hook's skew added."""
    skew = injected_skew(rank)
    if not skew:
        return time.monotonic
    return lambda: time.monotonic() + skew


def measure_offsets(group=None, rounds: int = ROUNDS, clock: Callable[[], float] = time.monotonic,
                    device=None) -> list[ClockOffset]:
    """Every rank's clock offset to rank 0, measured over ``group`` (default: the world process
    group; any ``torch.distributed.ProcessGroup``); every rank takes part and gets the whole list.

    Rank 0 exchanges with one rank at a time (the others wait in the final broadcast), so no
    exchange queues behind another. ``device``: where the small tensors live (a CUDA device
    for NCCL; default CPU). Costs ``(world - 1) * (rounds + 1)`` round trips.
    """
    import torch
    import torch.distributed as dist

    if rounds < 1:
        raise InputError("rounds", f"{rounds} is not a positive number of exchanges", "give 1 or more")
    pg = group if group is not None else dist.group.WORLD
    rank, world = pg.rank(), pg.size()
    dev = torch.device("cpu") if device is None else torch.device(device)
    table = torch.zeros((world, 3), dtype=torch.float64, device=dev)
    if rank == 0:
        for peer in range(1, world):
            table[peer] = torch.tensor(_lead(pg, peer, rounds, clock, dev), dtype=torch.float64)
    elif world > 1:
        _answer(pg, rounds, clock, dev)
    if world > 1:
        pg.broadcast(table, 0).wait()
    rows = table.cpu().tolist()
    return [ClockOffset(r, *rows[r]) for r in range(world)]


def _lead(pg, peer: int, rounds: int, clock: Callable[[], float], dev) -> tuple[float, float, float]:
    """Rank 0's side of the exchanges with ``peer``."""
    import torch

    ping = torch.zeros(1, dtype=torch.float64, device=dev)
    pong = torch.zeros(2, dtype=torch.float64, device=dev)
    samples = []
    for k in range(rounds + 1):
        t0 = clock()
        ping.fill_(t0)
        pg.send([ping], peer, TAG).wait()
        pg.recv([pong], peer, TAG).wait()
        t1, t2 = pong.tolist()  # on CUDA this waits for the receive to land
        t3 = clock()
        if k:  # the first exchange also sets up the connection
            samples.append((t0, t1, t2, t3))
    return offset_from_samples(samples)


def _answer(pg, rounds: int, clock: Callable[[], float], dev) -> None:
    """A peer's side: stamp each ping's arrival (t1) and the answer's departure (t2)."""
    import torch

    ping = torch.zeros(1, dtype=torch.float64, device=dev)
    for _ in range(rounds + 1):
        pg.recv([ping], 0, TAG).wait()
        ping.tolist()  # on CUDA: the data is here, not just queued
        t1 = clock()
        t2 = clock()
        pg.send([torch.tensor([t1, t2], dtype=torch.float64, device=dev)], 0, TAG).wait()
