"""Topology automorphisms, to solve an AllGather for a few source GPUs and copy it to the rest.

An automorphism maps GPUs to GPUs and switches to switches (copy-capable or not alike) and every
link onto a link of the same bandwidth and latency. The sources of an AllGather fall into orbits:
GPU v is in the orbit of representative r when some automorphism g maps r to v. Then the
schedule of r's chunks, mapped by g, moves v's chunks to every other GPU by the same rules, and
only link capacity couples different sources' chunks. So a model with the representatives'
commodities only, in which every send of r's chunk on link l counts against the capacity of
g(l) for each image g of r, describes valid schedules with a fraction of the columns
(:func:`flowride.synth.milp.build_model` with ``symmetry``). The images of one representative
are chosen so that no two map a link onto the same link (on a torus: the translations): images
that collide would count one send twice on a link and leave the model needlessly tight.

It is a restriction, not a relaxation: a schedule in T epochs may exist while no symmetric one
does. The horizon search therefore uses it only to find schedules; an infeasible probe is
proven on the full model (:func:`flowride.synth.horizon.bisect_horizon`).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import networkx as nx
import numpy as np
from networkx.algorithms.isomorphism import vf2pp_all_isomorphisms

from flowride.topology.model import Topology

MAX_NODES = 64  # automorphism search cost grows fast; the MILP does not go beyond this anyway
MAX_TRIES = 200  # automorphisms tried per GPU for one whose link images are new


@dataclass(frozen=True)
class SourceSymmetry:
    """Orbit representatives and, per GPU, the representative and the link map taking its
    representative's sends to its own."""

    reps: tuple[int, ...]
    rep_of: dict[int, int]  # GPU -> its representative
    link_map: dict[int, np.ndarray]  # GPU v -> array: link l of rep_of[v]'s schedule -> link of v's

    @property
    def reduction(self) -> float:
        """Sources in the full model per source in the reduced one."""
        return len(self.rep_of) / len(self.reps)


class _OutOfTime(Exception):
    pass


class _Label:
    """A node label that checks a clock whenever VF2++ hashes it (it does so throughout its
    search): VF2++ cannot be told a time limit, and on some graphs (MI250's xGMI mesh) it
    searches for minutes before it finds that two pins have no automorphism between them."""

    __slots__ = ("key", "clock")

    def __init__(self, key: tuple, clock: list[float]):
        self.key = key
        self.clock = clock  # [deadline], shared by every label of a search

    def __hash__(self) -> int:
        if time.perf_counter() > self.clock[0]:
            raise _OutOfTime
        return hash(self.key)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Label) and self.key == other.key


def _isomorphisms(g1, g2, deadline: float):
    """VF2++'s isomorphisms of g1 onto g2 until ``deadline`` (then it stops quietly)."""
    clock = [deadline]
    a, b = g1.copy(), g2.copy()
    for g in (a, b):
        for u in g.nodes:
            g.nodes[u]["timed"] = _Label(g.nodes[u]["label"], clock)
    try:
        yield from vf2pp_all_isomorphisms(a, b, node_label="timed")
    except _OutOfTime:
        return


def _graph(topo: Topology, pinned: int):
    """The topology's graph with one label per node that every automorphism fixing the pinned
    GPU must preserve: kind, copy, pinned or not, and the multisets of (bandwidth, latency) of its
    out- and in-links (so that link speeds are matched by the node labels VF2++ prunes with)."""
    g = topo.graph.copy()
    for v in g.nodes:
        outs = sorted((d["bandwidth_GBps"], d["alpha_s"]) for _, _, d in g.out_edges(v, data=True))
        ins = sorted((d["bandwidth_GBps"], d["alpha_s"]) for _, _, d in g.in_edges(v, data=True))
        g.nodes[v]["label"] = (g.nodes[v]["kind"], g.nodes[v]["copy"], v == pinned, tuple(outs), tuple(ins))
    return g


def _links_match(topo: Topology, iso: dict[int, int]) -> np.ndarray | None:
    """The link map of a node isomorphism, or None if some link lands on one of another speed."""
    out = np.empty(len(topo.links), dtype=np.int64)
    for i, lk in enumerate(topo.links):
        j = topo.link_index.get((iso[lk.src], iso[lk.dst]))
        if j is None:
            return None
        other = topo.links[j]
        if (other.bandwidth_GBps, other.alpha_s) != (lk.bandwidth_GBps, lk.alpha_s):
            return None
        out[i] = j
    return out


def source_symmetry(topo: Topology, time_limit: float = 5.0) -> SourceSymmetry | None:
    """The orbits of the GPUs under the topology's automorphisms (as found within
    ``time_limit``: a GPU whose mapping is not found in time is its own representative, which is
    always sound). None when every GPU is alone (nothing to gain) or the topology is too large."""
    if topo.num_nodes > MAX_NODES:
        return None
    t0 = time.perf_counter()
    gpus = list(topo.gpus)
    nl = len(topo.links)
    ident = np.arange(nl)
    rep_of: dict[int, int] = {}
    link_map: dict[int, np.ndarray] = {}
    reps: list[int] = []
    for r in gpus:
        if r in rep_of:
            continue
        reps.append(r)
        rep_of[r] = r
        link_map[r] = ident
        g1 = _graph(topo, r)
        taken = np.zeros((nl, nl), dtype=bool)  # taken[l, m]: some image already maps r's link l onto m
        taken[ident, ident] = True
        for v in gpus:
            if v in rep_of or time.perf_counter() - t0 > time_limit:
                continue
            # VF2++ (networkx): node-labelled, with a matching order that finds automorphisms of
            # highly symmetric graphs (a switch's star) at once, where VF2 could search for minutes
            for n_tried, iso in enumerate(_isomorphisms(g1, _graph(topo, v), t0 + time_limit)):
                lm = _links_match(topo, iso)
                if lm is None:
                    if n_tried >= MAX_TRIES or time.perf_counter() - t0 > time_limit:
                        break
                    continue
                # images that never share a link (translations of a torus, rotations of a
                # ring): one send of r's chunk then stands for sends on distinct links
                if not taken[ident, lm].any():
                    taken[ident, lm] = True
                    rep_of[v] = r
                    link_map[v] = lm
                    break
                if n_tried >= MAX_TRIES or time.perf_counter() - t0 > time_limit:
                    break
    if len(reps) == len(gpus):
        return None
    return SourceSymmetry(tuple(reps), rep_of, link_map)


def expand_sends(sym: SourceSymmetry, sends: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """The representatives' sends copied to every GPU of their orbits."""
    out = []
    for v, r in sym.rep_of.items():
        lm = sym.link_map[v]
        out.extend((k, int(lm[li]), v, c) for k, li, s, c in sends if s == r)
    out.sort()
    return out


@dataclass(frozen=True)
class GpuOrbits:
    """GPU orbits under automorphisms, each GPU with one automorphism from its representative:
    its node map and link map. Unlike :class:`SourceSymmetry` the images may share links (the
    static LP counts every image on each link's capacity), so any automorphism will do."""

    reps: tuple[int, ...]
    rep_of: dict[int, int]
    node_map: dict[int, np.ndarray]  # GPU v -> array: node of rep_of[v]'s flow -> node of v's
    link_map: dict[int, np.ndarray]  # GPU v -> array: link of rep_of[v]'s flow -> link of v's


def gpu_orbits(topo: Topology, time_limit: float = 30.0) -> GpuOrbits | None:
    """One automorphism per GPU from a representative (VF2++, ~50 ms per GPU on a 512-GPU
    torus), within ``time_limit``: GPUs not reached by then, or whose search takes over a
    second, are representatives of their own (sound: the symmetric LP then has more columns).
    None when every GPU is its own representative."""
    t0 = time.perf_counter()
    reps: list[int] = []
    rep_of: dict[int, int] = {}
    node_map: dict[int, np.ndarray] = {}
    link_map: dict[int, np.ndarray] = {}
    graphs: dict[int, object] = {}
    hashes: dict[int, str] = {}
    ident_n, ident_l = np.arange(topo.num_nodes), np.arange(len(topo.links))
    for v in topo.gpus:
        if time.perf_counter() - t0 > time_limit:  # out of time: the rest stand alone (sound)
            reps.append(v)
            rep_of[v], node_map[v], link_map[v] = v, ident_n, ident_l
            continue
        gv = _graph(topo, v)
        for u in gv.nodes:
            gv.nodes[u]["wl"] = repr(gv.nodes[u]["label"])
        # Weisfeiler-Lehman hash of the pinned graph: different hashes, no automorphism between
        # the two pins (VF2++ would have to exhaust its search to say so, for minutes on MI250)
        with warnings.catch_warnings():  # networkx 3.5 notes that directed hashes changed: only compared here
            warnings.simplefilter("ignore", UserWarning)
            hashes[v] = nx.weisfeiler_lehman_graph_hash(gv, node_attr="wl", iterations=4)
        for r in reps:
            if hashes[r] != hashes[v]:
                continue
            # each try at most a second (and within the limit): a GPU left alone is sound
            iso = next(_isomorphisms(graphs[r], gv, min(t0 + time_limit, time.perf_counter() + 1.0)), None)
            lm = None if iso is None else _links_match(topo, iso)
            if lm is not None:
                rep_of[v] = r
                node_map[v] = np.array([iso[u] for u in range(topo.num_nodes)], dtype=np.int64)
                link_map[v] = lm
                break
        else:
            reps.append(v)
            graphs[v] = gv
            rep_of[v], node_map[v], link_map[v] = v, ident_n, ident_l
    if len(reps) == len(topo.gpus):
        return None
    return GpuOrbits(tuple(reps), rep_of, node_map, link_map)
