"""A lower bound on when the last of several collectives can finish on shared links.

Two kinds, the larger holds:

- each collective alone: its start plus its own lower bound on its group topology with every
  link whole (sharing links can only slow it);
- cuts with every collective's bytes together: for a set ``S`` of nodes, the bytes that must
  cross into (or out of) ``S`` are counted per collective, and the links into ``S`` carry at most
  their bandwidth. Work released at time ``s`` cannot cross before ``s``, so for each start ``s``
  the bytes of the collectives that start at ``s`` or later must fit after ``s``.

The bytes a collective must move across a cut, with ``a`` of its ``n`` members inside and ``b``
its block (``size / n``): an AllGather sends every block inside out once and every block outside
in once (``a b`` out, ``(n - a) b`` in; copies are made on the far side); a ReduceScatter is that
backwards (a partial sum per block combines everything on one side first); an AllReduce must move
each of the ``n`` blocks across both ways (each side ends with a sum that depends on the other's
inputs); an AlltoAll moves every pair's block (``a (n - a) b`` each way).

The sets: each GPU, each server (locality group), and each network switch's subtree (the switch
with the servers that hang from it, a Clos leaf), with their complements. Latency is not counted
in the cuts (the per-collective bounds count it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flowride.collectives.demand import Collective
from flowride.concurrent.spec import Item
from flowride.topology.model import Topology


@dataclass(frozen=True)
class JointBound:
    seconds: float  # on the last finish (from the first start)
    own_s: tuple[float, ...]  # each collective's start plus its own bound
    cut_s: float  # the best cut, counted with every collective's bytes
    cut: str  # which set gave it

    @property
    def binding(self) -> str:
        return "cut (all collectives together)" if self.cut_s > max(self.own_s, default=0.0) else "one collective alone"


def cut_bytes(coll: Collective, size: int, n: int, a: int) -> tuple[float, float]:
    """Bytes (into the set, out of it) a collective of ``n`` members, ``a`` inside, must move."""
    if a == 0 or a == n:
        return 0.0, 0.0
    b = size / n
    if coll is Collective.ALLGATHER:
        return (n - a) * b, a * b
    if coll is Collective.REDUCESCATTER:
        return a * b, (n - a) * b
    if coll is Collective.ALLREDUCE:
        return float(size), float(size)
    return a * (n - a) * b, a * (n - a) * b


def candidate_sets(topo: Topology) -> list[tuple[str, frozenset[int]]]:
    """Node sets whose boundary may be a bottleneck (see the module docstring)."""
    everything = frozenset(range(topo.num_nodes))
    out: list[tuple[str, frozenset[int]]] = [(f"GPU {topo.nodes[g].label or g}", frozenset([g])) for g in topo.gpus]
    groups = topo.group_nodes
    out += [(f"server {k}", s) for k, s in groups.items()]
    graph = topo.graph
    for w in topo.switches:
        if topo.nodes[w].group is not None:
            continue
        hang = {topo.nodes[v].group for v in set(graph.predecessors(w)) | set(graph.successors(w))} - {None}
        if not hang:
            continue  # a spine: its neighbours are other network switches
        s = frozenset([w]).union(*(groups[k] for k in hang))
        if s != everything:
            out.append((f"switch {topo.nodes[w].label or w} and its servers", s))
    seen: set[frozenset[int]] = set()
    uniq = []
    for name, s in out + [(f"all but {name}", everything - s) for name, s in out]:
        if s and s != everything and s not in seen:
            seen.add(s)
            uniq.append((name, s))
    return uniq


def joint_bound(topo: Topology, items: list[Item], own_bounds_s: list[float]) -> JointBound:
    """The bound on ``items`` run on ``topo`` (``own_bounds_s``: each one's own lower bound)."""
    gpus = topo.gpus
    own = tuple(it.start_s + b for it, b in zip(items, own_bounds_s, strict=True))
    src, dst = topo.link_ends
    bw = np.array([lk.bytes_per_s for lk in topo.links])
    starts = np.array([it.start_s for it in items])
    best, where = 0.0, ""
    for name, s in candidate_sets(topo):
        inside = np.zeros(topo.num_nodes, dtype=bool)
        inside[list(s)] = True
        cap_in = float(bw[inside[dst] & ~inside[src]].sum())
        cap_out = float(bw[inside[src] & ~inside[dst]].sum())
        moves = np.array([cut_bytes(it.collective, it.size_bytes, len(it.ranks), sum(1 for r in it.ranks if inside[gpus[r]]))
                          for it in items])
        for col, cap in ((0, cap_in), (1, cap_out)):
            if cap <= 0 or not moves[:, col].any():
                continue
            for s0 in np.unique(starts):
                t = float(s0) + float(moves[starts >= s0, col].sum()) / cap
                if t > best:
                    best, where = t, f"{'into' if col == 0 else 'out of'} {name}"
    return JointBound(max(best, max(own, default=0.0)), own, best, where)
