"""GPU graph-analytics side tasks: ``gpu-pagerank`` and ``gpu-sssp`` on torch sparse tensors.

FreeRide's "graph analytics" kind of side task as it runs on a GPU: memory-bound sweeps over
every edge of a power-law digraph that lives on the device. The graph is generated in ``setup``
with torch on the task's device (the same Chung-Lu recipe as :mod:`flowride.sidetasks.graph`,
drawn with a device generator), never stored in the state: a state is the per-node vector and a
few counters, O(n) not O(edges).

A step runs ``sweeps_per_step`` sweeps back to back (launches only) and ends with one host read
(the residual, or whether the last sweep changed anything), so convergence is checked once per
step, not once per sweep: a sweep or two may run past the fixpoint, which changes nothing for
SSSP and next to nothing for PageRank, and keeps the GPU busy instead of waiting on the host.
The number of sweeps a step runs depends only on the counters, so a resumed run does exactly
the sweeps an uninterrupted one does.

Both kernels are deterministic on CUDA as on the CPU, so resumption is exact on either: PageRank
sums each row's in-edges in a fixed order (no atomics), and SSSP's ``scatter_reduce(amin)`` gives
the same minimum in any order.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import Any

import torch

from flowride.harvest.task import IterativeTask, parse_params
from flowride.sidetasks.gpu_common import (
    StepRng,
    check_device,
    check_dtype,
    check_identity,
    need,
    prepare,
    to_cpu,
)

MAX_NODES = 16_000_000  # torch.multinomial draws from at most 2^24 categories
MAX_EDGES = 200_000_000  # about 5 GB of edge arrays on the device


def power_law_digraph(
    n: int, avg_degree: float, gamma: float, seed: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Directed Chung-Lu graph drawn on ``device``: endpoints have weight ``(i+1)^(-1/(gamma-1))``,
    in- and out-weights under independent permutations; self-loops and duplicates dropped.

    Returns ``(src, dst)`` (int64, on ``device``) sorted by ``(dst, src)``: row ``v`` of the
    in-edge CSR matrix is one contiguous run.
    """
    gen = StepRng(device, seed, "graph").at(0)
    w = (torch.arange(n, dtype=torch.float64, device=device) + 1.0) ** (-1.0 / (gamma - 1.0))
    m = max(1, round(n * avg_degree))
    src = torch.randperm(n, generator=gen, device=device)[
        torch.multinomial(w, m, True, generator=gen)
    ]
    dst = torch.randperm(n, generator=gen, device=device)[
        torch.multinomial(w, m, True, generator=gen)
    ]
    keep = src != dst
    key = torch.unique(dst[keep] * n + src[keep])  # sorted
    return key % n, key // n


def segment_spmv(
    rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """``M x`` for CSR ``(rows, cols, vals)`` as a gather and a per-row segmented sum, each row
    added in one fixed order. ``unsafe`` skips the offsets check, which would sync the host on
    every call (the offsets are built valid in setup); an empty row sums to 0."""
    return torch.segment_reduce(x[cols] * vals, "sum", offsets=rows, unsafe=True)


@dataclass(frozen=True)
class GpuGraphConfig:
    """The generated graph shared by both tasks, and where and in what precision it runs."""

    seed: int = 0
    n: int = 100_000
    avg_degree: float = 8.0
    gamma: float = 2.5  # power-law exponent of the degree distribution
    sweeps_per_step: int = 2
    dtype: str = "float64"
    device: str = "auto"

    def check(self, task: str) -> None:
        need(task, self.seed >= 0, "seed", self.seed, "must be >= 0")
        need(task, 2 <= self.n <= MAX_NODES, "n", self.n, f"must be in 2..{MAX_NODES:,}")
        need(
            task, 0 < self.avg_degree <= 1000, "avg_degree", self.avg_degree, "must be in (0, 1000]"
        )
        need(
            task,
            self.n * self.avg_degree <= MAX_EDGES,
            "avg_degree",
            self.avg_degree,
            f"gives n x avg_degree = {self.n * self.avg_degree:,.0f} edges, over the limit of {MAX_EDGES:,}",
        )
        need(task, self.gamma > 1, "gamma", self.gamma, "must be > 1")
        need(
            task,
            1 <= self.sweeps_per_step <= 10_000,
            "sweeps_per_step",
            self.sweeps_per_step,
            "must be in 1..10000",
        )
        check_dtype(self.dtype, task)
        check_device(self.device, task)

    def graph_identity(self) -> dict[str, Any]:
        """The fields that define the graph and the precision of the vector a state holds."""
        skip = {"sweeps_per_step", "device"}
        return {f.name: getattr(self, f.name) for f in fields(GpuGraphConfig) if f.name not in skip}


@dataclass(frozen=True)
class GpuPageRankConfig(GpuGraphConfig):
    damping: float = 0.85
    tol: float = 1e-10  # stop once the L1 change of a step's last sweep is below this
    max_sweeps: int = 1000


class _GraphTask(IterativeTask):
    """Device, graph and the state vector's save/restore, shared by both tasks."""

    unit = "sweeps"
    config: Any
    _vector = "x"  # the attribute a state saves

    def _setup_graph(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        self.device = prepare(self.name, c.device)
        self.dtype = check_dtype(c.dtype, self.name)
        src, dst = power_law_digraph(c.n, c.avg_degree, c.gamma, c.seed, self.device)
        self.nnz = int(src.numel())
        return src, dst

    def _identity(self) -> dict[str, Any]:
        return {**self.config.graph_identity(), "rng": self.device.type}

    def state(self) -> dict[str, Any]:
        self.setup()
        return {
            "task": self.name,
            "identity": self._identity(),
            self._vector: to_cpu(getattr(self, self._vector)),
            **self._counters(),
        }

    def _counters(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load_vector(self, state: dict[str, Any]) -> None:
        self.setup()
        check_identity(self.name, state, self._identity())
        v = state[self._vector]
        if not isinstance(v, torch.Tensor) or v.shape != (self.config.n,):
            raise ValueError(
                f"{self.name}: state {self._vector} is not a vector of length n={self.config.n}"
            )
        setattr(self, self._vector, v.to(self.device, self.dtype, copy=True))


class GpuPageRankTask(_GraphTask):
    """PageRank by power iteration; dangling nodes spread their rank uniformly (as networkx).

    One sweep: ``x' = d * (M x + (dangling x) / n) + (1 - d) / n`` with ``M`` the column-
    stochastic transition matrix as CSR (one row per target node). ``step`` returns the sweeps
    it ran; ``last_delta`` is the L1 change of its last sweep (the residual).
    """

    name = "gpu-pagerank"
    _vector = "ranks"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config: GpuPageRankConfig = parse_params(GpuPageRankConfig, params, self.name)
        c = self.config
        c.check(self.name)
        need(self.name, 0 < c.damping < 1, "damping", c.damping, "must be in (0, 1)")
        need(self.name, c.tol >= 0, "tol", c.tol, "must be >= 0")
        need(self.name, c.max_sweeps >= 0, "max_sweeps", c.max_sweeps, "must be >= 0")
        self.matrix: torch.Tensor | None = None
        self.sweeps = 0
        self.last_delta = float("inf")

    def setup(self) -> None:
        if self.matrix is not None:
            return
        c = self.config
        src, dst = self._setup_graph()
        outdeg = torch.bincount(src, minlength=c.n).to(self.dtype)
        self.dangling = (outdeg == 0).to(self.dtype)
        rows = torch.zeros(c.n + 1, dtype=torch.int64, device=self.device)
        rows[1:] = torch.cumsum(torch.bincount(dst, minlength=c.n), 0)
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            self.matrix = torch.sparse_csr_tensor(
                rows, src, 1.0 / outdeg[src], (c.n, c.n), check_invariants=False
            )
        self.ranks = torch.full((c.n,), 1.0 / c.n, dtype=self.dtype, device=self.device)
        self._rows, self._src, self._val = rows, src, self.matrix.values()

    def _spmv(self, x: torch.Tensor) -> torch.Tensor:
        """``M x``. On the CPU the CSR product (one thread: deterministic, and the fastest); on
        CUDA a per-row ``segment_reduce`` of ``x[src] * val`` (a CUB segmented reduction, fixed
        order), because cuSPARSE's default CSR SpMV gave different bits run to run on an H200
        and exact resumption needs them equal."""
        if self.device.type == "cpu":
            return torch.mv(self.matrix, x)
        return segment_spmv(self._rows, self._src, self._val, x)

    def step(self) -> float:
        self.setup()
        c = self.config
        todo = 0 if self.finished() else min(c.sweeps_per_step, c.max_sweeps - self.sweeps)
        if todo == 0:
            return 0.0
        x = self.ranks
        for i in range(todo):
            new = self._spmv(x)
            new.add_(torch.dot(x, self.dangling), alpha=1.0 / c.n).mul_(c.damping).add_(
                (1.0 - c.damping) / c.n
            )
            if i == todo - 1:
                delta = (new - x).abs().sum()
            x = new
        self.ranks = x
        self.last_delta = float(delta)  # the step's one sync
        self.sweeps += todo
        return float(todo)

    def finished(self) -> bool:
        return self.sweeps >= self.config.max_sweeps or self.last_delta < self.config.tol

    def _counters(self) -> dict[str, Any]:
        return {"sweeps": self.sweeps, "last_delta": self.last_delta}

    def _identity(self) -> dict[str, Any]:
        return {**super()._identity(), "damping": self.config.damping}

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume the iteration; only a state of the same graph (and damping) fits."""
        self._load_vector(state)
        self.sweeps = int(state["sweeps"])
        self.last_delta = float(state["last_delta"])


@dataclass(frozen=True)
class GpuSsspConfig(GpuGraphConfig):
    source: int | None = None  # None: the node with the most out-edges (a hub reaches far)
    min_weight: float = 1.0
    max_weight: float = 10.0


class GpuSsspTask(_GraphTask):
    """Single-source shortest paths by synchronous Bellman-Ford sweeps over every edge.

    A sweep relaxes all edges at once, ``d'[v] = min(d[v], min over u->v of d[u] + w(u, v))``:
    a gather ``d[src] + w`` and a ``scatter_reduce(amin)`` into ``dst``. Every sweep touches every
    edge (no frontier), so the step time is constant, as the harvester's profile assumes. Weights
    are uniform in ``[min_weight, max_weight)``, drawn on the device from their own stream.
    ``finished`` once a step's last sweep changed nothing; unreachable nodes stay at ``inf``.
    """

    name = "gpu-sssp"
    _vector = "dist"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.config: GpuSsspConfig = parse_params(GpuSsspConfig, params, self.name)
        c = self.config
        c.check(self.name)
        need(self.name, 0 < c.min_weight, "min_weight", c.min_weight, "must be > 0")
        need(
            self.name,
            c.min_weight <= c.max_weight,
            "max_weight",
            c.max_weight,
            f"must be >= min_weight={c.min_weight}",
        )
        need(
            self.name,
            c.source is None or 0 <= c.source < c.n,
            "source",
            c.source,
            f"must be in 0..{c.n - 1} or null",
        )
        self.src: torch.Tensor | None = None
        self.source = -1
        self.sweeps = 0
        self.converged = False

    def setup(self) -> None:
        if self.src is not None:
            return
        c = self.config
        self.src, self.dst = self._setup_graph()
        gen = StepRng(self.device, c.seed, "weights").at(0)
        u = torch.rand(self.nnz, generator=gen, device=self.device, dtype=self.dtype)
        self.weight = c.min_weight + (c.max_weight - c.min_weight) * u
        outdeg = torch.bincount(self.src, minlength=c.n)
        self.source = int(torch.argmax(outdeg)) if c.source is None else c.source
        self.dist = torch.full((c.n,), float("inf"), dtype=self.dtype, device=self.device)
        self.dist[self.source] = 0.0

    def step(self) -> float:
        self.setup()
        if self.converged:
            return 0.0
        todo = self.config.sweeps_per_step
        d = self.dist
        for i in range(todo):
            new = d.scatter_reduce(
                0, self.dst, d[self.src] + self.weight, "amin", include_self=True
            )
            if i == todo - 1:
                changed = (new != d).any()
            d = new
        self.dist = d
        self.converged = not bool(changed)  # the step's one sync
        self.sweeps += todo
        return float(todo)

    def finished(self) -> bool:
        return self.converged

    def _identity(self) -> dict[str, Any]:
        c = self.config
        return {
            **super()._identity(),
            "source": self.source,
            "min_weight": c.min_weight,
            "max_weight": c.max_weight,
        }

    def _counters(self) -> dict[str, Any]:
        return {"sweeps": self.sweeps, "converged": self.converged}

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume the relaxation; only a state of the same weighted graph and source fits."""
        self._load_vector(state)
        self.sweeps = int(state["sweeps"])
        self.converged = bool(state["converged"])
