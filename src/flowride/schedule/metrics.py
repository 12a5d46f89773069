"""What a schedule's finish time means to a user: algorithmic bandwidth (and, with the bounds of
:mod:`flowride.synth.bounds`, how far from the floor it is; the report in :mod:`flowride.api`
puts the two together)."""

from __future__ import annotations


def algbw_GBps(size_bytes: float, seconds: float) -> float:
    """Algorithmic bandwidth: the output buffer over the finish time (decimal GB/s)."""
    return size_bytes / seconds / 1e9
