"""A GPU topology as plain data: nodes (GPUs and switches) and directed links.

Each link has a bandwidth in GB/s (decimal, 1e9 bytes/s) and a latency alpha in seconds. Node ids
are the integers 0..N-1; a GPU's rank is its position among the GPUs in id order. A switch holds
nothing: it forwards (and, when ``copy`` is set, replicates) a chunk in the epoch it arrives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import networkx as nx
import numpy as np

from flowride.errors import InputError
from flowride.sizes import (
    MAX_ALPHA_US,
    MAX_BANDWIDTH_GBPS,
    MAX_GPUS,
    MAX_LINKS,
    MAX_NODES,
    MIN_BANDWIDTH_GBPS,
)

NodeKind = Literal["gpu", "switch"]


@dataclass(frozen=True)
class Node:
    id: int
    kind: NodeKind = "gpu"
    copy: bool = True  # switches only: may replicate a chunk onto several out-links
    group: int | None = None  # chassis (or any locality group) for cut bounds and drawings
    label: str = ""

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"


@dataclass(frozen=True)
class Link:
    src: int
    dst: int
    bandwidth_GBps: float
    alpha_s: float = 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_GBps * 1e9


@dataclass(frozen=True)
class Topology:
    """Nodes and directed links; validated on construction so every later stage can trust it."""

    name: str
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    # Number of ranks the collective's buffer is divided among. Defaults to the GPU count; the
    # TE-CCL compat NDv2 variant keeps 16 although one GPU is modelled as a switch.
    nominal_gpus: int | None = None
    description: str = ""
    # Reproduce the published TE-CCL model's quirk: a switch -> GPU hop costs only its alpha.
    teccl_compat: bool = False
    # How switches pass a chunk on (topology.timing.link_hop_delay): "cut-through" (NVSwitch,
    # InfiniBand, Ethernet: a path pays its transmission once) or "store-and-forward".
    switching: str = "cut-through"
    params: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "links", tuple(self.links))
        self._validate()

    # ---------------------------------------------------------------- validation
    def _validate(self) -> None:
        n = len(self.nodes)
        if self.switching not in ("cut-through", "store-and-forward"):
            raise InputError("switching", f"{self.switching!r} is not a switching model", "use cut-through or store-and-forward")
        if n == 0:
            raise InputError("nodes", "the topology has no nodes", "add at least two GPUs")
        if n > MAX_NODES:
            raise InputError("nodes", f"{n:,} nodes, over the limit of {MAX_NODES:,}", "flowride's largest tested topology has 1,024 GPUs")
        if len(self.links) > MAX_LINKS:
            raise InputError("links", f"{len(self.links):,} links, over the limit of {MAX_LINKS:,}", "give a smaller topology")
        for pos, node in enumerate(self.nodes):
            if node.id != pos:
                raise InputError(
                    f"nodes[{pos}].id", f"is {node.id}, expected {pos}", "number nodes 0..N-1 in order"
                )
            if node.kind not in ("gpu", "switch"):
                raise InputError(f"nodes[{pos}].kind", f"unknown kind {node.kind!r}", "use 'gpu' or 'switch'")
        seen: set[tuple[int, int]] = set()
        for li, link in enumerate(self.links):
            where = f"links[{li}] ({link.src}->{link.dst})"
            for end, v in (("src", link.src), ("dst", link.dst)):
                if not isinstance(v, int) or not 0 <= v < n:
                    raise InputError(f"{where}.{end}", f"unknown node {v!r}", f"use a node id in 0..{n - 1}")
            if link.src == link.dst:
                raise InputError(where, "is a self-loop", "remove it: a node needs no link to itself")
            bw = link.bandwidth_GBps
            if not (math.isfinite(bw) and MIN_BANDWIDTH_GBPS <= bw <= MAX_BANDWIDTH_GBPS):
                raise InputError(f"{where}.bandwidth_GBps", f"{bw:g} is outside {MIN_BANDWIDTH_GBPS:g}..{MAX_BANDWIDTH_GBPS:g} GB/s",
                                 "give the link's bandwidth in GB/s (decimal), e.g. 50")
            a_us = link.alpha_s * 1e6
            if not (math.isfinite(a_us) and 0 <= a_us <= MAX_ALPHA_US):
                raise InputError(f"{where}.alpha_us", f"{a_us:g} is outside 0..{MAX_ALPHA_US:g} microseconds",
                                 "give the link's latency in microseconds, e.g. 0.7")
            if (link.src, link.dst) in seen:
                raise InputError(where, "duplicates an earlier link", "merge them into one link with the summed bandwidth")
            seen.add((link.src, link.dst))
        gpus = self.gpus
        if len(gpus) < 2:
            raise InputError("nodes", f"{len(gpus)} GPU(s)", "a collective needs at least two GPUs")
        if len(gpus) > MAX_GPUS:
            raise InputError("nodes", f"{len(gpus):,} GPUs, over the limit of {MAX_GPUS:,}", "flowride's largest tested topology has 1,024 GPUs")
        # every GPU reaches every other <=> all GPUs lie in one strongly connected component
        comp = {v: i for i, c in enumerate(nx.strongly_connected_components(self.graph)) for v in c}
        s = gpus[0]
        for d in gpus[1:]:
            if comp[d] != comp[s]:
                reach = nx.has_path(self.graph, s, d)
                a, b = (s, d) if not reach else (d, s)
                raise InputError("links", f"GPU {b} cannot be reached from GPU {a}", "add links so every GPU reaches every other")
        if self.nominal_gpus is not None and self.nominal_gpus < len(gpus):
            raise InputError("nominal_gpus", f"{self.nominal_gpus} is below the {len(gpus)} GPUs", "leave it unset")

    # ---------------------------------------------------------------- views
    @cached_property
    def gpus(self) -> tuple[int, ...]:
        return tuple(nd.id for nd in self.nodes if nd.is_gpu)

    @cached_property
    def switches(self) -> tuple[int, ...]:
        return tuple(nd.id for nd in self.nodes if not nd.is_gpu)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def buffer_ranks(self) -> int:
        """How many ranks share the collective's buffer (chunk = size / this / chunks)."""
        return self.nominal_gpus or len(self.gpus)

    @cached_property
    def graph(self) -> nx.DiGraph:
        g = nx.DiGraph(name=self.name)
        for nd in self.nodes:
            g.add_node(nd.id, kind=nd.kind, copy=nd.copy, group=nd.group)
        for li, lk in enumerate(self.links):
            g.add_edge(lk.src, lk.dst, index=li, bandwidth_GBps=lk.bandwidth_GBps, alpha_s=lk.alpha_s)
        return g

    @cached_property
    def link_index(self) -> dict[tuple[int, int], int]:
        return {(lk.src, lk.dst): i for i, lk in enumerate(self.links)}

    @cached_property
    def link_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """(tail, head) node of every link as read-only int64 arrays, in link order: the
        vectorised view the solver forms index by."""
        ends = np.array([(lk.src, lk.dst) for lk in self.links], dtype=np.int64).reshape(-1, 2)
        src, dst = ends[:, 0].copy(), ends[:, 1].copy()
        src.setflags(write=False)
        dst.setflags(write=False)
        return src, dst

    def in_links(self, node: int) -> list[int]:
        return [i for i, lk in enumerate(self.links) if lk.dst == node]

    def out_links(self, node: int) -> list[int]:
        return [i for i, lk in enumerate(self.links) if lk.src == node]

    @cached_property
    def groups(self) -> dict[int, tuple[int, ...]]:
        """GPU ids per locality group (chassis); empty when the topology declares none."""
        out: dict[int, list[int]] = {}
        for nd in self.nodes:
            if nd.is_gpu and nd.group is not None:
                out.setdefault(nd.group, []).append(nd.id)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def group_nodes(self) -> dict[int, frozenset[int]]:
        """All nodes (GPUs and switches) per locality group, for cuts between chassis."""
        out: dict[int, set[int]] = {}
        for nd in self.nodes:
            if nd.group is not None:
                out.setdefault(nd.group, set()).add(nd.id)
        return {k: frozenset(v) for k, v in out.items()}

    def cut_sets(self) -> list[frozenset[int]]:
        """Every group and its complement, when there are at least two groups."""
        groups = self.group_nodes
        if len(groups) < 2:
            return []
        everything = frozenset(range(self.num_nodes))
        return [s for members in groups.values() for s in (members, everything - members)]

    def symmetric(self) -> bool:
        """Every link has a way back with the same bandwidth and latency (then the reversed
        topology is this one, its links listed in another order)."""
        idx = self.link_index
        for lk in self.links:
            back = idx.get((lk.dst, lk.src))
            if back is None or (self.links[back].bandwidth_GBps, self.links[back].alpha_s) != (lk.bandwidth_GBps, lk.alpha_s):
                return False
        return True

    def reversed(self) -> Topology:
        """Every link turned around (same bandwidth and latency). A ReduceScatter on this topology
        is an AllGather on its reverse run backwards in time, so reductions are synthesized there."""
        from dataclasses import replace

        return replace(self, links=tuple(Link(lk.dst, lk.src, lk.bandwidth_GBps, lk.alpha_s) for lk in self.links))

    def with_switch_copy(self, copy: bool) -> Topology:
        """The same topology with every switch able (``copy=True``) or unable to replicate a chunk
        onto several out-links in the epoch it arrives (the CLI's ``--switch-copy on|off``)."""
        from dataclasses import replace

        nodes = tuple(nd if nd.is_gpu else replace(nd, copy=copy) for nd in self.nodes)
        params = {**self.params, "switch_copy": copy}
        return replace(self, nodes=nodes, params=params)

    def with_switching(self, switching: str) -> Topology:
        """The same topology with its switches cutting through or storing and forwarding (the
        CLI's ``--switching``; :func:`flowride.topology.timing.link_hop_delay`)."""
        from dataclasses import replace

        return replace(self, switching=switching, params={**self.params, "switching": switching})

    def summary(self) -> str:
        return f"{self.name}: {len(self.gpus)} GPUs, {len(self.switches)} switches, {len(self.links)} links"
