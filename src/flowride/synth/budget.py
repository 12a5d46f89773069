"""How big a MILP probe would be, before it is built: the memory guard and the auto method's size rule.

The count mirrors :func:`flowride.synth.milp.build_index` (a send column per commodity, link and
epoch between the chunk's earliest arrival at the link's tail and the last epoch it can still reach
a GPU in need; a buffer column per commodity, GPU and epoch from its earliest arrival), computed on
numpy arrays without enumerating a single column, so even a 256-GPU torus is sized in milliseconds.

Memory per column was measured on this machine (peak RSS of a build plus a first-feasible HiGHS
solve, see docs/benchmarks.md "Memory guard"); the estimate takes the largest bytes per column seen
and a fixed base for the interpreter, torch-free imports and HiGHS.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowride.collectives.demand import Demand
from flowride.synth.reach import dist_to_need
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming

MEMORY_LIMIT_BYTES = 8 * 2**30  # the solver process must stay under this on any built-in topology
BASE_BYTES = 400 * 2**20  # interpreter, numpy/scipy/networkx/highspy, before any model
BYTES_PER_COLUMN = 6_000  # measured 3.2-3.6 KB per column at peak (build + first-feasible solve), with margin
AUTO_MILP_COLUMNS = 200_000  # above this the auto method does not try the full MILP (it would take minutes)


@dataclass(frozen=True)
class MilpSize:
    T: int
    send_columns: int
    buffer_columns: int

    @property
    def columns(self) -> int:
        return self.send_columns + self.buffer_columns

    @property
    def bytes(self) -> int:
        return BASE_BYTES + BYTES_PER_COLUMN * self.columns

    def fits(self, limit: int = MEMORY_LIMIT_BYTES) -> bool:
        return self.bytes <= limit


def milp_size(topo: Topology, demand: Demand, timing: EpochTiming, T: int, D: np.ndarray) -> MilpSize:
    """Columns of the probe at horizon ``T`` (an upper bound on what build_index creates)."""
    R = dist_to_need(topo, demand, D)  # (commodities, nodes)
    l_src = np.array([lk.src for lk in topo.links])
    l_dst = np.array([lk.dst for lk in topo.links])
    src = np.array([q.source for q in demand.commodities])
    earliest = D[src][:, l_src]  # (q, links)
    latest = T - timing.hop_delay[None, :] - R[:, l_dst]
    span = np.clip(latest - earliest + 1, 0, None)
    span[l_dst[None, :] == src[:, None]] = 0
    sends = int(span.sum())
    gpus = np.array(topo.gpus)
    first = D[src][:, gpus]  # earliest hold epoch per (q, gpu)
    hold = np.clip(T - first + 1, 0, None)
    hold[gpus[None, :] == src[:, None]] = 0
    return MilpSize(int(T), sends, int(hold.sum()))


def describe(size: MilpSize) -> str:
    return f"{size.columns:,} columns at {size.T} epochs, about {size.bytes / 2**30:.1f} GiB"
