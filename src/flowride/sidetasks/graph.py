"""Graph-analytics side tasks: ``pagerank`` and ``sssp`` on a generated power-law digraph.

These stand in for FreeRide's graph side tasks: memory-bound sparse sweeps whose step is one
pass over every edge. Unit for both is ``sweeps`` (one pass over all edges): a sweep is the
natural resumable unit and its cost is fixed for a given graph, so the profiled step time the
harvester relies on stays stable. (Edges per second = sweeps per second x ``nnz``.)

The graph is rebuilt from ``seed`` in ``setup``, never stored in the state: the state is only
the per-node vector and a few counters, so checkpoints stay small (O(n), not O(edges)).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import scipy.sparse as sp

from flowride.harvest.task import IterativeTask, parse_params


def power_law_digraph(
    n: int, avg_degree: float, gamma: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Directed Chung-Lu style graph: edge endpoints drawn with weight ``(i+1)^(-1/(gamma-1))``.

    In- and out-weights use independent permutations, so the big senders are not the big
    receivers. About ``n * avg_degree`` edges are drawn; self-loops and duplicates are dropped
    (duplicates would be summed by scipy.sparse and double-counted), so the final average
    out-degree is slightly below ``avg_degree``. Returns ``(src, dst)`` sorted by (src, dst).
    Many nodes end up with no out-edges: real graphs have such dangling nodes too, and PageRank
    must handle them.
    """
    rng = np.random.default_rng([seed, 0x6A])
    w = (np.arange(n, dtype=np.float64) + 1.0) ** (-1.0 / (gamma - 1.0))
    p = w / w.sum()
    m = int(round(n * avg_degree))
    src = rng.permutation(n)[rng.choice(n, size=m, p=p)]
    dst = rng.permutation(n)[rng.choice(n, size=m, p=p)]
    keep = src != dst
    key = np.unique(src[keep].astype(np.int64) * n + dst[keep])
    return key // n, key % n


MAX_GRAPH_NODES = 10_000_000
MAX_GRAPH_EDGES = 100_000_000  # about 1.6 GB of edge arrays


@dataclass(frozen=True)
class GraphConfig:
    """The generated graph shared by the graph tasks."""

    seed: int = 0
    n: int = 20_000
    avg_degree: float = 8.0
    gamma: float = 2.5  # power-law exponent of the degree distribution

    def graph_identity(self) -> dict[str, Any]:
        """The fields that define the graph: a saved state only fits a graph with these."""
        return {f.name: getattr(self, f.name) for f in fields(GraphConfig)}

    def check(self, task: str) -> None:
        if self.seed < 0 or not 2 <= self.n <= MAX_GRAPH_NODES or not 0 < self.avg_degree <= 1000 or self.gamma <= 1.0:
            raise ValueError(f"{task}: need seed >= 0, 2 <= n <= {MAX_GRAPH_NODES:,}, 0 < avg_degree <= 1000, gamma > 1")
        if self.n * self.avg_degree > MAX_GRAPH_EDGES:
            raise ValueError(f"{task}: n x avg_degree = {self.n * self.avg_degree:,.0f} edges, over the limit of {MAX_GRAPH_EDGES:,}")


@dataclass(frozen=True)
class PageRankConfig(GraphConfig):
    damping: float = 0.85
    tol: float = 1e-10  # stop once the L1 change of one sweep falls below this (0: run max_sweeps, GAP-style)
    max_sweeps: int = 1000
    # PageRank sweeps on the default graph take well under a millisecond; doing several per step
    # keeps a step long enough (a few ms) that per-step scheduling overhead stays small.
    sweeps_per_step: int = 10


class PageRankTask(IterativeTask):
    """PageRank by power iteration; dangling nodes spread their rank uniformly (as networkx).

    One sweep: ``x' = d * (M x + (sum of dangling x) / n) + (1 - d) / n`` with ``M`` the
    column-stochastic transition matrix (CSR, one row per target node). A step runs up to
    ``sweeps_per_step`` sweeps, stopping at convergence, and returns how many it ran.
    """

    name = "pagerank"
    unit = "sweeps"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config: PageRankConfig = parse_params(PageRankConfig, params, self.name)
        self.config.check(self.name)
        c = self.config
        if not 0 < c.damping < 1 or c.tol < 0 or c.max_sweeps < 0 or c.sweeps_per_step < 1:
            raise ValueError(
                "pagerank: need 0 < damping < 1, tol >= 0, max_sweeps >= 0, sweeps_per_step >= 1"
            )
        self.src: np.ndarray | None = None
        self.dst: np.ndarray | None = None
        self.matrix: sp.csr_matrix | None = None
        self.dangling: np.ndarray | None = None
        self.ranks: np.ndarray | None = None
        self.sweeps = 0
        self.last_delta = float("inf")

    def setup(self) -> None:
        if self.matrix is not None:
            return
        c = self.config
        self.src, self.dst = power_law_digraph(c.n, c.avg_degree, c.gamma, c.seed)
        outdeg = np.bincount(self.src, minlength=c.n).astype(np.float64)
        self.dangling = outdeg == 0
        vals = 1.0 / outdeg[self.src]
        self.matrix = sp.csr_matrix((vals, (self.dst, self.src)), shape=(c.n, c.n))
        self.ranks = np.full(c.n, 1.0 / c.n)

    @property
    def nnz(self) -> int:
        """Edges in the graph (work per sweep)."""
        return 0 if self.matrix is None else int(self.matrix.nnz)

    def step(self) -> float:
        if self.matrix is None:
            self.setup()
        assert self.matrix is not None and self.ranks is not None and self.dangling is not None
        c = self.config
        done = 0
        x = self.ranks
        while done < c.sweeps_per_step and not self.finished():
            new = self.matrix @ x
            new += x[self.dangling].sum() / c.n
            new *= c.damping
            new += (1.0 - c.damping) / c.n
            self.last_delta = float(np.abs(new - x).sum())
            x = new
            self.sweeps += 1
            done += 1
        self.ranks = x
        return float(done)

    def finished(self) -> bool:
        return self.sweeps >= self.config.max_sweeps or self.last_delta < self.config.tol

    def state(self) -> dict[str, Any]:
        if self.ranks is None:
            self.setup()
        assert self.ranks is not None
        return {
            "task": self.name,
            "identity": self.config.graph_identity(),
            "ranks": self.ranks.copy(),
            "sweeps": self.sweeps,
            "last_delta": self.last_delta,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume the iteration; only a state of the same graph is accepted."""
        if state.get("task") != self.name or state.get("identity") != self.config.graph_identity():
            raise ValueError("pagerank: state was saved for a different graph")
        if self.matrix is None:
            self.setup()
        ranks = np.asarray(state["ranks"], dtype=np.float64)
        if ranks.shape != (self.config.n,):
            raise ValueError("pagerank: state rank vector has the wrong length")
        self.ranks = ranks.copy()
        self.sweeps = int(state["sweeps"])
        self.last_delta = float(state["last_delta"])


@dataclass(frozen=True)
class SsspConfig(GraphConfig):
    source: int | None = None  # None: the node with the most out-edges (a hub reaches far)
    min_weight: float = 1.0
    max_weight: float = 10.0


def edge_weights(num_edges: int, seed: int, lo: float, hi: float) -> np.ndarray:
    """Edge weights, uniform in [lo, hi), from their own stream (the topology stays the same)."""
    return np.random.default_rng([seed, 0x55]).uniform(lo, hi, size=num_edges)


class SsspTask(IterativeTask):
    """Single-source shortest paths by synchronous Bellman-Ford sweeps over every edge.

    A sweep relaxes all edges at once: ``d'[v] = min(d[v], min over u->v of d[u] + w(u, v))``,
    vectorised as a gather over the in-edge CSR matrix plus ``np.minimum.reduceat`` per row.
    Every sweep touches every edge (no frontier), so step time is constant, which is what the
    harvester's profiled step time assumes. Weights are positive, so the fixpoint is reached
    after at most ``n - 1`` sweeps (in practice about the hop depth of the shortest-path tree);
    ``finished`` is true once a sweep changed nothing. Unreachable nodes stay at ``inf``.
    """

    name = "sssp"
    unit = "sweeps"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config: SsspConfig = parse_params(SsspConfig, params, self.name)
        self.config.check(self.name)
        c = self.config
        if not 0 < c.min_weight <= c.max_weight:
            raise ValueError("sssp: need 0 < min_weight <= max_weight")
        if c.source is not None and not 0 <= c.source < c.n:
            raise ValueError(f"sssp: source must be in 0..{c.n - 1}")
        self.graph: sp.csr_matrix | None = None  # src -> dst, weighted (for checking)
        self._in: sp.csr_matrix | None = None  # dst -> src: row v lists v's in-edges
        self._rows: np.ndarray | None = None  # nodes with at least one in-edge
        self._starts: np.ndarray | None = None  # where their in-edges begin in _in.data
        self.source = -1
        self.dist: np.ndarray | None = None
        self.sweeps = 0
        self.converged = False

    def setup(self) -> None:
        if self.graph is not None:
            return
        c = self.config
        src, dst = power_law_digraph(c.n, c.avg_degree, c.gamma, c.seed)
        w = edge_weights(len(src), c.seed, c.min_weight, c.max_weight)
        self.graph = sp.csr_matrix((w, (src, dst)), shape=(c.n, c.n))
        self._in = sp.csr_matrix((w, (dst, src)), shape=(c.n, c.n))
        self._in.sort_indices()
        indeg = np.diff(self._in.indptr)
        self._rows = np.flatnonzero(indeg)
        self._starts = self._in.indptr[:-1][self._rows]
        outdeg = np.bincount(src, minlength=c.n)
        self.source = int(np.argmax(outdeg)) if c.source is None else c.source
        self.dist = np.full(c.n, np.inf)
        self.dist[self.source] = 0.0

    @property
    def nnz(self) -> int:
        """Edges in the graph (work per sweep)."""
        return 0 if self.graph is None else int(self.graph.nnz)

    def step(self) -> float:
        if self.graph is None:
            self.setup()
        assert self._in is not None and self.dist is not None
        if self.converged:
            return 0.0
        d = self.dist
        new = d.copy()
        if len(self._rows):
            cand = d[self._in.indices] + self._in.data
            best = np.minimum.reduceat(cand, self._starts)
            new[self._rows] = np.minimum(d[self._rows], best)
        self.sweeps += 1
        self.converged = bool(np.array_equal(new, d))
        self.dist = new
        return 1.0

    def finished(self) -> bool:
        return self.converged

    def state(self) -> dict[str, Any]:
        if self.dist is None:
            self.setup()
        assert self.dist is not None
        return {
            "task": self.name,
            "identity": {
                **self.config.graph_identity(),
                "source": self.source,
                "min_weight": self.config.min_weight,
                "max_weight": self.config.max_weight,
            },
            "dist": self.dist.copy(),
            "sweeps": self.sweeps,
            "converged": self.converged,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume the relaxation; only a state of the same weighted graph and source fits."""
        if self.graph is None:
            self.setup()
        assert self.dist is not None
        ident = {
            **self.config.graph_identity(),
            "source": self.source,
            "min_weight": self.config.min_weight,
            "max_weight": self.config.max_weight,
        }
        if state.get("task") != self.name or state.get("identity") != ident:
            raise ValueError("sssp: state was saved for a different graph or source")
        dist = np.asarray(state["dist"], dtype=np.float64)
        if dist.shape != (self.config.n,):
            raise ValueError("sssp: state distance vector has the wrong length")
        self.dist = dist.copy()
        self.sweeps = int(state["sweeps"])
        self.converged = bool(state["converged"])
