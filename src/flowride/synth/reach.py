"""Epoch distances on the topology: how soon a chunk can reach a node, how far it is from need.

Used to leave out variables that could never matter (a send before the chunk can be held, or one
that could not reach a GPU that needs it in time) and for epoch lower bounds.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from flowride.collectives.demand import Demand
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming

UNREACHABLE = np.iinfo(np.int32).max // 4


def delay_graph(topo: Topology, timing: EpochTiming, per_hop: float = 1e-6) -> sp.csr_matrix:
    """Sparse graph of hop delays in epochs. ``per_hop`` keeps zero-delay hops (switch -> GPU with
    a = 0) as edges and breaks ties toward fewer hops."""
    n = topo.num_nodes
    src, dst = topo.link_ends
    return sp.csr_matrix((timing.hop_delay.astype(np.float64) + per_hop, (src, dst)), shape=(n, n))


def epoch_distances(topo: Topology, timing: EpochTiming) -> np.ndarray:
    """D[u, v]: fewest epochs from u holding (or forwarding) a chunk to v holding (forwarding) it."""
    n = topo.num_nodes
    d = dijkstra(delay_graph(topo, timing), directed=True)
    out = np.full((n, n), UNREACHABLE, dtype=np.int64)
    fin = np.isfinite(d)
    out[fin] = np.rint(np.floor(d[fin] + 1e-3)).astype(np.int64)
    return out


def dist_to_need(topo: Topology, demand: Demand, D: np.ndarray) -> np.ndarray:
    """R[q, v]: fewest epochs from v to the nearest destination of commodity q (0 at a destination)."""
    nq = len(demand.commodities)
    out = np.empty((nq, topo.num_nodes), dtype=np.int64)
    cache: dict[tuple[int, ...], np.ndarray] = {}
    for qi, q in enumerate(demand.commodities):
        row = cache.get(q.dests)
        if row is None:
            row = D[:, list(q.dests)].min(axis=1)
            cache[q.dests] = row
        out[qi] = row
    return out
