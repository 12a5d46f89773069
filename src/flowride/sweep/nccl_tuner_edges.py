"""Where a tuner file's ranges left to NCCL's default end: at NCCL's own switch points.

By default the tuner file writes NCCL's own pick as a row wherever flowride has no override (the
stock example plugin runs an unmatched call on one channel; :mod:`flowride.sweep.nccl_tuner`).
A row holds one (algorithm, protocol) over its whole byte range, while NCCL's cost model changes
its pick at sizes between the swept ones: ending the range at the next swept size would force
the smaller size's pick past NCCL's own switch (on 2 x dgx-a100 LL to 786 KB where NCCL takes
LL128 from about 600 KB, 3x slower by the calibrated model). So each boundary between two such
ranges is moved, by bisection on NCCL's own model (a closed form, a few dozen evaluations), to
the first size at which NCCL's pick is the next range's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flowride.collectives.demand import Collective
from flowride.runtime.nccl_tuning import Machine, estimates


def nccl_pick(collective: str, m: Machine, size: int) -> tuple[str, str]:
    """NCCL's own (algorithm, protocol) at ``size`` by its cost model, spelled as the plugin parses them."""
    e = min(estimates(Collective.parse(collective), m, size), key=lambda e: e.time_us)
    return e.algorithm, e.protocol.lower()


def follow_nccl(ranges: Sequence, pick: Callable[[int], tuple[str, str]]) -> int:
    """Move each boundary between two consecutive ranges of one collective that both leave the call
    to NCCL (``not written``) to where ``pick(size)`` (NCCL's own (algorithm, protocol) at a size)
    turns from the first range's pair to the second's. A range's swept sizes stay inside it.
    Returns how many boundaries moved."""
    moved = 0
    for a, b in zip(ranges, ranges[1:], strict=False):
        if a.written or b.written:
            continue
        lo, hi = a.sizes[-1].size, b.sizes[0].size
        if pick(lo) != a.nccl.pair or pick(hi) != b.nccl.pair:
            continue  # NCCL's model does not say these pairs at the two ends: keep the swept boundary
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if pick(mid) == a.nccl.pair:
                lo = mid
            else:
                hi = mid
        if b.min_bytes != hi:
            a.max_bytes, b.min_bytes = hi - 1, hi
            moved += 1
    return moved
