"""Collectives on shared links: each group's links named on the base topology, what a schedule
puts on each of them, and the group topology with its share of every shared link.

The joint schedule is built by partitioning capacity, the traffic-engineering way: collective
``i`` gets a share ``x[i, l]`` of each base link ``l`` it can use, the shares of a link add up to
at most one, and ``i`` is synthesized on its group topology with every link's bandwidth scaled by
its share. Each schedule is verified on its own shares by the simulator, so together they never
put more on a link than it carries. A group that shares nothing keeps every link whole, and so
its schedule is the one it would get alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx
import numpy as np

from flowride.concurrent.spec import Item
from flowride.schedule.ir import Schedule
from flowride.topology.group import group_topology
from flowride.topology.model import Link, Topology

MIN_SHARE = 0.02  # of a shared link, for a collective that did not use it before: room to reroute


@dataclass(frozen=True)
class Member:
    """One item's group topology and, for each of its links, the base link it is (-1: a relaying
    GPU's internal link, which is no link of the base topology)."""

    item: Item
    topo: Topology
    base_link: np.ndarray  # int, per group link

    def loads(self, schedule: Schedule, n_base: int) -> np.ndarray:
        """Bytes ``schedule`` (on this group's links, any shares) puts on each base link."""
        out = np.zeros(n_base)
        if not schedule.sends:
            return out
        links = np.fromiter((s.link for s in schedule.sends), dtype=np.int64, count=len(schedule.sends))
        base = self.base_link[links]
        np.add.at(out, base[base >= 0], schedule.demand.chunk_bytes)
        return out


def member(base: Topology, item: Item) -> Member:
    """The group topology of ``item`` on ``base`` and its links' names there."""
    topo = group_topology(base, item.ranks, item.relay)
    orig = topo.params["group"]["nodes"]
    index = base.link_index
    mapped = np.array([index.get((orig[lk.src], orig[lk.dst]), -1) if orig[lk.src] != orig[lk.dst] else -1
                       for lk in topo.links], dtype=np.int64)
    return Member(item, topo, mapped)


def users(members: list[Member], n_base: int) -> np.ndarray:
    """Boolean matrix [member, base link]: which groups can use which links."""
    out = np.zeros((len(members), n_base), dtype=bool)
    for i, m in enumerate(members):
        out[i, m.base_link[m.base_link >= 0]] = True
    return out


def shared_links(members: list[Member], n_base: int) -> np.ndarray:
    """Base links two or more groups can use."""
    return users(members, n_base).sum(axis=0) >= 2


def equal_shares(members: list[Member], n_base: int) -> np.ndarray:
    """Every link split evenly among the groups that can use it."""
    u = users(members, n_base).astype(float)
    k = u.sum(axis=0)
    return np.divide(u, k, out=np.zeros_like(u), where=k > 0)


def load_shares(members: list[Member], loads: np.ndarray) -> np.ndarray:
    """Each link split in proportion to what each group put on it (``loads``: [member, base link]
    bytes), so every group's load on a shared link takes as long as the link's whole load.
    A group that did not use a link it could use keeps :data:`MIN_SHARE` of it, room to move
    traffic there; a link nobody used is split evenly."""
    n_base = loads.shape[1]
    u = users(members, n_base)
    even = equal_shares(members, n_base)
    total = loads.sum(axis=0)
    prop = np.divide(loads, total, out=even.copy(), where=total > 0)
    floor = np.where(u, MIN_SHARE / np.maximum(u.sum(axis=0), 1), 0.0)
    prop = np.where(u, np.maximum(prop, floor), 0.0)
    colsum = prop.sum(axis=0)
    return np.divide(prop, colsum, out=np.zeros_like(prop), where=colsum > 0)


def scaled(m: Member, share: np.ndarray) -> Member | None:
    """``m`` on its shares: each link's bandwidth scaled by its share of the base link, a link of
    share zero dropped (another group has it). A relay's internal link and a link only this group
    uses stay whole. None when the group's GPUs no longer reach each other."""
    keep, links = [], []
    for li, (lk, b) in enumerate(zip(m.topo.links, m.base_link.tolist(), strict=True)):
        x = 1.0 if b < 0 else float(share[b])
        if x <= 0.0:
            continue
        keep.append(li)
        links.append(lk if x >= 1.0 else Link(lk.src, lk.dst, lk.bandwidth_GBps * x, lk.alpha_s))
    if len(keep) == len(m.topo.links) and all(a is b for a, b in zip(links, m.topo.links, strict=True)):
        return m
    graph = nx.DiGraph([(lk.src, lk.dst) for lk in links])
    gpus = m.topo.gpus
    if not all(g in graph for g in gpus) or not all(nx.has_path(graph, gpus[0], g) and nx.has_path(graph, g, gpus[0]) for g in gpus):
        return None
    return Member(m.item, replace(m.topo, links=tuple(links)), m.base_link[np.array(keep, dtype=np.int64)])


def problem_key(topo: Topology, item: Item) -> tuple:
    """What a synthesis depends on: two groups with the same key get the same schedule (the DP
    groups of a symmetric fabric, each on its share, are one problem solved once)."""
    nodes = tuple((nd.kind, nd.copy) for nd in topo.nodes)
    links = tuple((lk.src, lk.dst, round(lk.bandwidth_GBps, 9), round(lk.alpha_s, 15)) for lk in topo.links)
    return item.collective.value, item.size_bytes, topo.switching, topo.teccl_compat, nodes, links


def twin_switches(topo: Topology) -> list[list[int]]:
    """Sets of two or more interchangeable network switches (same neighbours both ways: the
    spines of a Clos), each in id order."""
    graph = topo.graph
    by_sides: dict[tuple, list[int]] = {}
    for w in topo.switches:
        if topo.nodes[w].group is None:
            by_sides.setdefault((frozenset(graph.predecessors(w)), frozenset(graph.successors(w))), []).append(w)
    return [ws for ws in by_sides.values() if len(ws) > 1]


def apart_shares(members: list[Member], topo: Topology) -> np.ndarray:
    """Even shares, except that interchangeable switches (spines) are dealt out whole: with ``m``
    spines and ``k`` groups using them, group ``r`` gets spines ``r, r + k, ...`` to itself when
    ``m >= k`` (each group's flows on their own spines, the traffic engineer's answer), and spine
    ``j`` is split among groups ``j, j + m, ...`` otherwise. A chunk then crosses a whole spine
    link, not a sliver of every one (in the epoch model a thin link is a slow link)."""
    n_base = len(topo.links)
    x = equal_shares(members, n_base)
    u = users(members, n_base)
    src, dst = topo.link_ends
    for ws in twin_switches(topo):
        touch = [np.flatnonzero((src == w) | (dst == w)) for w in ws]
        who = [i for i in range(len(members)) if any(u[i, t].any() for t in touch)]
        if len(who) < 2:
            continue
        m, k = len(ws), len(who)
        owners = [[who[r] for r in range(k) if (r % m == j if m < k else j % k == r)] for j in range(m)]
        for j, t in enumerate(touch):
            x[:, t] = 0.0
            for i in owners[j]:
                x[i, t] = np.where(u[i, t], 1.0 / len(owners[j]), 0.0)
    return x


def ecmp_classes(topo: Topology) -> np.ndarray:
    """A class id per base link: links that differ only in which of several interchangeable network
    switches they go to or come from (:func:`twin_switches`) are one class. Schedules made alone
    route as if they had every spine to themselves; run together, a real fabric spreads their
    flows over the spines (ECMP), so the contention model pools each class's capacity, which is
    the most even spreading there is."""
    twin = {w: ws[0] for ws in twin_switches(topo) for w in ws}
    keys: dict[tuple[int, int], int] = {}
    out = np.empty(len(topo.links), dtype=np.int64)
    for i, lk in enumerate(topo.links):
        out[i] = keys.setdefault((twin.get(lk.src, lk.src), twin.get(lk.dst, lk.dst)), len(keys))
    return out


def pooled(values: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """``values`` [..., base link] summed per ECMP class [..., class]."""
    out = np.zeros(values.shape[:-1] + (int(classes.max()) + 1,))
    np.add.at(out, (..., classes), values)
    return out
