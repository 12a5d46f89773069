"""Broadcast trees packed to the throughput optimum: ForestColl's optimum, reached by an LP.

An AllGather at rate x per GPU is a set of broadcast out-trees per root GPU, each carrying a share
of the root's block, whose load fits every link's bandwidth. ForestColl (Zhao et al., arXiv
2402.06787) shows the best common rate x* is the minimum over node sets S holding some but not
all GPUs of ``bandwidth out of S / GPUs in S`` (:func:`flowride.synth.bounds.forest_bound`
computes it) and that trees reach it once switch edges are split into GPU-to-GPU edges. This
module reaches it with the fractional form of the same packing, written from that mathematics:

    max x   s.t.   sum_{T rooted at r} z_T >= x           for every root GPU r
                   sum_T z_T * uses_T(l) <= bandwidth_l    for every link l,   z >= 0

A tree is an arborescence over the *tree nodes*: the GPUs and the switches that copy (NVLS).
One of its edges u -> v is a route from u to v through switches that do not copy (an NVSwitch
of the first generations, a NIC, a leaf or a spine), so a GPU with two children behind the same
forwarding switch sends two copies over its link to that switch, which is what ForestColl's
edge splitting makes explicit. A copying switch is a node of the tree: it receives a chunk once
and passes it to each child.

Column generation solves the LP without listing trees: given the LP's link prices (duals), the
cheapest tree for root r is a minimum-cost arborescence (Chu-Liu/Edmonds, :func:`min_arborescence`)
on the tree nodes, each edge priced at its cheapest route (Dijkstra through the forwarding
switches). A tree cheaper than root r's dual joins the LP; when none is, the LP is optimal. The
loop also stops when x reaches the forest bound (then it is optimal by the bound) or at its time
limit (then x is what it is, a feasible packing). Copying switches that end up as leaves are
pruned from a tree (their in-edge would carry a copy nobody needs); where several copying switches
could serve a tree, spanning them all is a restriction, so there x may stop short of the optimum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from flowride.schedule.links import orbit_reps
from flowride.synth.highs import MipModel, SolveOptions, solve
from flowride.topology.model import Topology

_INF = np.inf


def min_arborescence(C: np.ndarray, root: int) -> np.ndarray:
    """Chu-Liu/Edmonds on a dense cost matrix (``C[u, v]``: edge u -> v, inf where there is none):
    ``parent[v]`` of a minimum-cost spanning arborescence rooted at ``root`` (``parent[root]`` is
    -1). Raises ValueError when some node cannot be reached.

    Each round takes every node's cheapest in-edge; if they form no cycle that is the answer,
    else every cycle is contracted (an edge into a cycle node costs its excess over that node's
    chosen in-edge) and the smaller problem solved; expanding puts each cycle back, broken where
    the chosen edge enters it."""
    levels = []
    cur, r = np.array(C, dtype=np.float64), root
    while True:
        m = cur.shape[0]
        c = cur.copy()
        np.fill_diagonal(c, _INF)
        c[:, r] = _INF
        par = np.argmin(c, axis=0)
        w = c[par, np.arange(m)]
        par[r] = -1
        w[r] = 0.0
        if not np.isfinite(w).all():
            raise ValueError(f"node {int(np.flatnonzero(~np.isfinite(w))[0])} cannot be reached from the root")
        cyc = _cycles(par, r)
        if cyc is None:
            break
        comp = np.full(m, -1, dtype=np.int64)
        in_cycle = np.zeros(m, dtype=bool)
        for k, members in enumerate(cyc):
            comp[members] = k
            in_cycle[members] = True
        rest = np.flatnonzero(comp < 0)
        comp[rest] = len(cyc) + np.arange(len(rest))
        n2 = len(cyc) + len(rest)
        adj = cur - np.where(in_cycle, w, 0.0)[None, :]
        adj[comp[:, None] == comp[None, :]] = _INF
        order = np.argsort(comp, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(comp[order]) != 0])
        red = np.minimum.reduceat(adj[order], starts, axis=0)
        nxt = np.minimum.reduceat(red[:, order], starts, axis=1)
        levels.append((par, comp, in_cycle, adj, n2))
        cur, r = nxt, int(comp[r])
    parent = par
    for par_prev, comp, in_cycle, adj, n2 in reversed(levels):
        m = len(comp)
        out = par_prev.copy()
        members = [np.flatnonzero(comp == k) for k in range(n2)]
        for V in range(n2):
            U = parent[V]
            if U < 0:
                continue
            us, vs = members[U], members[V]
            block = adj[np.ix_(us, vs)]
            i, j = np.unravel_index(np.argmin(block), block.shape)
            out[vs[j]] = us[i]  # the edge that enters V; the rest of a cycle keeps its own parents
        root_comp = int(np.flatnonzero(parent < 0)[0])
        for v in members[root_comp]:
            if not in_cycle[v]:
                out[v] = -1
        parent = out
        assert len(parent) == m
    return parent


def _cycles(par: np.ndarray, root: int) -> list[np.ndarray] | None:
    """The cycles of the parent map (each node has one parent), or None."""
    m = len(par)
    state = np.zeros(m, dtype=np.int8)  # 0 unseen, 1 on the current walk, 2 done
    state[root] = 2
    found: list[np.ndarray] = []
    for s in range(m):
        walk = []
        v = s
        while state[v] == 0:
            state[v] = 1
            walk.append(v)
            v = par[v]
        if state[v] == 1:  # closed a cycle on this walk
            k = walk.index(v)
            found.append(np.array(walk[k:], dtype=np.int64))
        for u in walk:
            state[u] = 2
    return found or None


@dataclass(frozen=True)
class TreeEdge:
    parent: int  # node id (a GPU or a copying switch)
    child: int
    links: tuple[int, ...]  # the physical route, through forwarding switches only


@dataclass(frozen=True)
class PackedTree:
    root: int
    weight: float  # its share of the root's block; a root's shares sum to 1
    edges: tuple[TreeEdge, ...]  # parents before children


@dataclass(frozen=True)
class Images:
    """A symmetry of the topology as lookup tables: ``node[g]`` and ``link[g]`` map every node and
    link id under group element g, and ``of_root[r]`` is (g, rep) with ``node[g][rep] == r``."""

    node: np.ndarray  # (elements, nodes)
    link: np.ndarray  # (elements, links)
    of_root: dict[int, tuple[int, int]]

    @classmethod
    def of(cls, topo: Topology, sym) -> Images:
        node = np.array(sym.perms, dtype=np.int64)
        src, dst = topo.link_ends
        idx = topo.link_index
        link = np.array([[idx[(int(p[a]), int(p[b]))] for a, b in zip(src, dst, strict=True)] for p in node], dtype=np.int64)
        of_root = {int(node[g][r]): (g, int(r)) for g in range(len(node)) for r in sym.reps}
        return cls(node, link, of_root)

    def tree(self, t: PackedTree, root: int) -> PackedTree:
        """Rep tree ``t`` moved to ``root``."""
        g, _ = self.of_root[root]
        n, lk = self.node[g], self.link[g]
        return PackedTree(root, t.weight, tuple(TreeEdge(int(n[e.parent]), int(n[e.child]), tuple(int(lk[x]) for x in e.links))
                                               for e in t.edges))


@dataclass
class Packing:
    trees: dict[int, list[PackedTree]]  # by root GPU (only the reps of a symmetry's orbits when ``images`` is set)
    rate_Bps: float  # x: bytes per second each root's block spreads at
    bound_Bps: float  # the forest bound's x* (the optimum; rate <= bound)
    iterations: int
    columns: int
    seconds: float
    optimal: bool  # x reached x* (to 1e-6) or no tree prices out
    history: list[float] = field(default_factory=list)
    images: Images | None = None  # the symmetry the trees of every other root follow from

    def seconds_for(self, block_bytes: float) -> float:
        return block_bytes / self.rate_Bps

    def roots(self) -> list[int]:
        return sorted(self.images.of_root) if self.images else sorted(self.trees)

    def trees_of(self, root: int) -> list[PackedTree]:
        """Root's trees (moved from its rep's under the symmetry, when there is one)."""
        if self.images is None:
            return self.trees[root]
        g, rep = self.images.of_root[root]
        return self.trees[rep] if g == 0 else [self.images.tree(t, root) for t in self.trees[rep]]


class _Routes:
    """Cheapest routes between tree nodes through forwarding switches, under per-link prices."""

    def __init__(self, topo: Topology) -> None:
        nodes = topo.nodes
        self.topo = topo
        self.tree_nodes = np.array([v for v in range(topo.num_nodes) if nodes[v].is_gpu or nodes[v].copy], dtype=np.int64)
        self.pos = {int(v): i for i, v in enumerate(self.tree_nodes)}
        T = len(self.tree_nodes)
        fwd = [v for v in range(topo.num_nodes) if not nodes[v].is_gpu and not nodes[v].copy]
        self.fwd_pos = {v: 2 * T + i for i, v in enumerate(fwd)}
        self.size = 2 * T + len(fwd)
        src, dst = topo.link_ends
        self.a = np.array([self.pos[int(u)] if int(u) in self.pos else self.fwd_pos[int(u)] for u in src], dtype=np.int64)
        self.b = np.array([T + self.pos[int(v)] if int(v) in self.pos else self.fwd_pos[int(v)] for v in dst], dtype=np.int64)
        self.link_of = {(int(x), int(y)): li for li, (x, y) in enumerate(zip(self.a, self.b, strict=True))}
        self.T = T

    def costs(self, price: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(C, pred): C[i, j] the cheapest route from tree node i to tree node j (inf: none) and the
        predecessor matrix to rebuild it."""
        g = sp.csr_matrix((price + 1e-12, (self.a, self.b)), shape=(self.size, self.size))
        dist, pred = dijkstra(g, directed=True, indices=np.arange(self.T), return_predecessors=True)
        C = dist[:, self.T: 2 * self.T].copy()
        np.fill_diagonal(C, _INF)
        return C, pred

    def route(self, pred: np.ndarray, i: int, j: int) -> tuple[int, ...]:
        out = []
        v = self.T + j
        while v != i:
            p = int(pred[i, v])
            out.append(self.link_of[(p, v)])
            v = p
        return tuple(reversed(out))


def _tree_from_parent(routes: _Routes, pred: np.ndarray, parent: np.ndarray, root_pos: int) -> list[TreeEdge]:
    """The arborescence as edges, parents first, with leaf copying switches pruned."""
    topo = routes.topo
    children: dict[int, list[int]] = {}
    for v, p in enumerate(parent.tolist()):
        if p >= 0:
            children.setdefault(p, []).append(v)
    keep: dict[int, bool] = {}

    def needed(v: int) -> bool:  # a subtree is kept when it holds a GPU
        if v not in keep:
            keep[v] = topo.nodes[int(routes.tree_nodes[v])].is_gpu or any([needed(c) for c in children.get(v, [])])
        return keep[v]

    edges: list[TreeEdge] = []
    stack = [root_pos]
    while stack:
        u = stack.pop()
        for v in children.get(u, []):
            if needed(v):
                edges.append(TreeEdge(int(routes.tree_nodes[u]), int(routes.tree_nodes[v]), routes.route(pred, u, v)))
                stack.append(v)
    return edges


def _uses(edges: list[TreeEdge], nlinks: int) -> np.ndarray:
    use = np.zeros(nlinks)
    for e in edges:
        for li in e.links:
            use[li] += 1
    return use


def link_orbits(images: Images | None, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(orbit of each link, how many group elements map onto each link of its orbit, each orbit's
    capacity): the packing LP's rows are link orbits, one per link without a symmetry."""
    nl = len(cap)
    if images is None:
        orbit, mult = np.arange(nl), np.ones(nl)
    else:
        _, orbit = np.unique(orbit_reps(images.link), return_inverse=True)
        mult = len(images.node) / np.bincount(orbit)[orbit]  # elements mapping onto each link of the orbit
    orbit_cap = np.full(int(orbit.max()) + 1, np.inf)
    np.minimum.at(orbit_cap, orbit, cap)
    return orbit, mult, orbit_cap


def pack_trees(topo: Topology, bound_Bps: float | None = None, time_limit: float | None = 30.0, tol: float = 1e-4,
               max_iterations: int = 500, capacity_GBps: np.ndarray | None = None, symmetry=None) -> Packing:
    """Column generation for the packing LP above. ``bound_Bps`` (the forest bound's x*) lets the
    loop stop as soon as it is reached within ``tol``; ``time_limit`` stops it with the packing it
    has (still feasible). ``capacity_GBps`` replaces the links' bandwidths (e.g. what the epoch model
    lets each carry: whole chunks per capacity window).

    ``symmetry`` (a :class:`flowride.topology.shifts.Symmetry`): only its reps get trees; every
    other root takes its rep's trees moved by the group element that carries the rep there. The
    load the images put on a link is its orbit's load, so the LP has one row per link orbit (the
    sum over the orbit, times how many elements map onto each of its links): a thousand-GPU fabric
    with one orbit of GPUs needs one root's trees."""
    t0 = time.perf_counter()
    nl = len(topo.links)
    cap = np.array([lk.bandwidth_GBps for lk in topo.links]) if capacity_GBps is None else np.asarray(capacity_GBps, dtype=float)
    images = Images.of(topo, symmetry) if symmetry is not None else None
    gpus = list(topo.gpus) if images is None else list(symmetry.reps)
    orbit, mult, orbit_cap = link_orbits(images, cap)
    n_orb = len(orbit_cap)
    routes = _Routes(topo)
    cols: list[tuple[int, list[TreeEdge], np.ndarray]] = []  # (root, edges, uses)
    seen: set[tuple[int, tuple]] = set()

    def add(root: int, parent: np.ndarray) -> bool:
        edges = _tree_from_parent(routes, pred, parent, routes.pos[root])
        key = (root, tuple((e.parent, e.child, e.links) for e in edges))
        if key in seen:
            return False
        seen.add(key)
        cols.append((root, edges, np.bincount(orbit, weights=_uses(edges, nl) * mult, minlength=n_orb)))
        return True

    price = 1.0 / cap  # first trees: cheapest in link time
    C, pred = routes.costs(price)
    for g in gpus:
        add(g, min_arborescence(C, routes.pos[g]))
    x, z, it, optimal = 0.0, None, 0, False
    history: list[float] = []
    root_row = {g: i for i, g in enumerate(gpus)}
    while True:
        it += 1
        x, z, y, pi = _solve_master(cols, root_row, orbit_cap, n_orb)
        history.append(x)
        if bound_Bps and x * 1e9 >= bound_Bps * (1 - tol):
            optimal = True
            break
        if it >= max_iterations or (time_limit is not None and time.perf_counter() - t0 > time_limit):
            break
        C, pred = routes.costs(np.maximum(y, 0.0)[orbit] * mult)
        added = 0
        for g in gpus:
            parent = min_arborescence(C, routes.pos[g])
            edges_cost = float(np.sum(C[parent[parent >= 0], np.flatnonzero(parent >= 0)]))
            if edges_cost < pi[root_row[g]] * (1 - 1e-9) - 1e-12 and add(g, parent):
                added += 1
        if not added:
            optimal = True
            break
    trees: dict[int, list[PackedTree]] = {g: [] for g in gpus}
    for (root, edges, _), zi in zip(cols, z, strict=True):
        if zi > 1e-9 * max(x, 1e-12):
            trees[root].append(PackedTree(root, float(zi), tuple(edges)))
    for g in gpus:  # shares of the root's block: normalise its trees' rates
        tot = sum(t.weight for t in trees[g])
        trees[g] = [PackedTree(t.root, t.weight / tot, t.edges) for t in trees[g]]
    return Packing(trees, x * 1e9, bound_Bps or 0.0, it, len(cols), time.perf_counter() - t0, optimal, history, images)


def _solve_master(cols, root_row: dict[int, int], cap: np.ndarray, nl: int):
    """The restricted LP over the trees found so far: (x, z, link prices, root prices)."""
    R = len(root_row)
    n = len(cols)
    rows, cidx, vals = [], [], []
    for j, (root, _, use) in enumerate(cols):
        rows.append(np.array([root_row[root]]))
        cidx.append(np.array([j]))
        vals.append(np.array([1.0]))
        nz = np.flatnonzero(use)
        rows.append(R + nz)
        cidx.append(np.full(len(nz), j))
        vals.append(use[nz])
    # the rate x is column n: root rows z - x >= 0
    rows.append(np.arange(R))
    cidx.append(np.full(R, n))
    vals.append(-np.ones(R))
    A = sp.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cidx))), shape=(R + nl, n + 1))
    cost = np.zeros(n + 1)
    cost[n] = -1.0
    model = MipModel(cost, np.zeros(n + 1), np.full(n + 1, np.inf), np.zeros(n + 1, dtype=bool), A,
                     np.concatenate([np.zeros(R), np.full(nl, -np.inf)]), np.concatenate([np.full(R, np.inf), cap]))
    res = solve(model, SolveOptions(solver="simplex"))
    if res.x is None or res.row_dual is None:
        raise RuntimeError(f"the tree-packing LP failed: {res.raw_status}")
    dual = np.abs(res.row_dual)
    return float(res.x[n]), res.x[:n], dual[R:], dual[:R]
