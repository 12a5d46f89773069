"""How big a model would be, before it is built: the memory guard, the auto method's size rule,
and the refusal of work that cannot end within the time limit (:func:`check_work`).

The count mirrors :func:`flowride.synth.milp.build_index` (a send column per commodity, link and
epoch between the chunk's earliest arrival at the link's tail and the last epoch it can still reach
a GPU in need; a buffer column per commodity, GPU and epoch from its earliest arrival), computed on
numpy arrays without enumerating a single column, so even a 256-GPU torus is sized in milliseconds.

Memory per column was measured on this machine (peak RSS of a build plus a first-feasible HiGHS
solve, see docs/benchmarks.md "Memory guard"); the estimate takes the largest bytes per column seen
and a fixed base for the interpreter, torch-free imports and HiGHS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flowride.collectives.demand import Demand
from flowride.errors import InputError
from flowride.synth.reach import dist_to_need
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming

MEMORY_LIMIT_BYTES = 8 * 2**30  # the solver process must stay under this on any built-in topology
BASE_BYTES = 400 * 2**20  # interpreter, numpy/scipy/networkx/highspy, before any model
BYTES_PER_COLUMN = 10_000  # measured up to 8.4 KB per column above base at peak (build + solve), with margin
AUTO_MILP_COLUMNS = 400_000  # above this the auto method does not try the full MILP (memory and minutes per probe)
LP_MAX_COLUMNS = 1_000_000  # above this the time-expanded LP gives way to the static LP (flowride.synth.lp)
STATIC_BYTES_PER_COLUMN = 4_000  # the static LP (interior point, then crossover), with margin


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
    l_src, l_dst = topo.link_ends
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


def lp_size(topo: Topology, demand: Demand, timing: EpochTiming, T: int, D: np.ndarray) -> int:
    """Columns of the LP form at horizon ``T`` (one commodity per source, see
    :func:`flowride.synth.lp.build_lp_index`): sends per (source, link, epoch) in the window the
    data can use, holdovers and deliveries per (source, GPU, epoch)."""
    src = np.array(sorted({q.source for q in demand.commodities}), dtype=np.int64)
    l_src, l_dst = topo.link_ends
    start = D[src].astype(np.int64)  # (S, N)
    start[np.arange(len(src)), src] = 0
    dests: dict[int, set[int]] = {}
    for q in demand.commodities:
        dests.setdefault(q.source, set()).update(q.dests)
    Rs = np.stack([D[:, sorted(dests[int(s)])].min(axis=1) for s in src])  # (S, N) epochs to need
    span = np.clip(T - timing.hop_delay[None, :] - Rs[:, l_dst] - start[:, l_src] + 1, 0, None)
    span[l_dst[None, :] == src[:, None]] = 0
    gpus = np.array(topo.gpus)
    hold = np.clip(T - start[:, gpus] + 1, 0, None)
    return int(span.sum()) + 2 * int(hold.sum())


def static_lp_bytes(topo: Topology) -> int:
    """Memory the static LP of the uniform AlltoAll needs: a flow column per (source GPU, link)."""
    return BASE_BYTES + STATIC_BYTES_PER_COLUMN * len(topo.gpus) * len(topo.links)


UNTIMED_MAX_DELIVERIES = 500_000  # more, without a time limit, is refused (the search would have no end in sight)


MAX_BETA_EPOCHS = 10_000  # a chunk over more epochs than this: the epoch is far too short


OVERRUN_SECONDS = 5.0  # what a solve may take beyond --time-limit to finish and verify its best


SECONDS_PER_SEND = 20e-6  # building and verifying the baseline, per send (measured: 8-16 us here)


def check_work(topo: Topology, demand: Demand, timing, time_limit: float | None) -> None:
    """Refuse, before anything is built, work that cannot end within ``time_limit``: an epoch so
    short that one chunk spans more than MAX_BETA_EPOCHS of them (every model and check grows
    with it), or so many sends that even the baseline schedule cannot be built and verified in
    time (a ring or direct schedule is what every method falls back on)."""
    b = int(timing.beta_epochs.max()) if len(timing.beta_epochs) else 0
    if b > MAX_BETA_EPOCHS:
        longest = float(timing.tau) * b / MAX_BETA_EPOCHS
        raise InputError("epoch", f"{timing.tau:.3g} s makes one chunk span {b:,} epochs (at most {MAX_BETA_EPOCHS:,})",
                         f"use --epoch fast or slow, or an epoch of at least {longest:.3g} s")
    if demand.collective.multicast:
        hops = 2.0 if topo.switches else 1.0  # a tree edge; through a switch, two sends
    else:
        hops = _mean_hops(topo)  # a direct route is a send per link it crosses
    sends = demand.num_deliveries * hops
    est = sends * SECONDS_PER_SEND
    if time_limit is None and demand.num_deliveries > UNTIMED_MAX_DELIVERIES:
        raise InputError("time_limit", f"is needed for {demand.num_deliveries:,} deliveries ({demand.chunks:,} chunk(s) per block; "
                         f"the baseline alone takes about {est:.0f} s here): without a limit the search is unbounded "
                         f"(refused above {UNTIMED_MAX_DELIVERIES:,} deliveries)",
                         f"give --time-limit, e.g. {max(600, math.ceil(est * 4))}, or use fewer --chunks")
    if time_limit is not None and est > time_limit + OVERRUN_SECONDS:
        raise InputError("time_limit", f"{demand.num_deliveries:,} deliveries ({demand.chunks:,} chunks per block): even the "
                         f"baseline schedule takes about {est:.0f} s to build and verify here, over {time_limit:g} s",
                         f"give --time-limit {math.ceil(est * 2)} or more, or fewer --chunks")


def _mean_hops(topo: Topology, samples: int = 8) -> float:
    """Links on a fewest-hop route from a GPU to another, averaged over up to ``samples`` GPUs
    spread over the topology (breadth-first; milliseconds on a thousand GPUs)."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import shortest_path

    gpus = np.asarray(topo.gpus)
    src, dst = topo.link_ends
    n = topo.num_nodes
    graph = sp.csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    picks = gpus[np.linspace(0, len(gpus) - 1, min(samples, len(gpus))).astype(int)]
    d = shortest_path(graph, unweighted=True, indices=picks)[:, gpus]
    ok = np.isfinite(d) & (d > 0)
    return float(d[ok].mean()) if ok.any() else 1.0
