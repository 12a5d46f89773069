"""Round-by-round (A*) synthesis for AllGather: a window of epochs at a time, stitched.

TE-CCL's A* form (SIGCOMM 2024; docs/synthesis.md): instead of one MILP over the whole horizon,
solve a short window of epochs [t0, t0 + W), carry what every GPU holds and every chunk still in
flight into the next window, and reward chunks that end the window close (in epochs) to the GPUs
that still need them. The windows are stitched into one schedule that the simulator verifies.

The state between windows is exact, not estimated:

- ``hold[q, g]``: the epoch from which GPU g holds commodity q. A chunk sent before t0 that
  arrives in or after the window is already in it (a hold epoch above t0): it counts as an
  arrival at that epoch, may be relayed from then on, and is never sent to g again.
- ``used[l, k]``: chunks started on link l in epoch k by the windows already committed. A link
  with beta b > 0 stays busy: every capacity window of b + 1 epochs that straddles t0 counts
  them, and so do windows of later epochs that hold switch forwards already committed.
- arrivals at switches: a window that sends a chunk into a switch also decides its forwards
  (switch out-sends are allowed up to the latest epoch a chunk sent in the window can reach the
  switch), so no window inherits a switch arrival it must still forward.

The window model (one MIP, built in bulk) has a binary ``F[q, l, k]`` per candidate send and no
buffer variables: since a GPU receives each chunk at most once (``receive_once``), a GPU may relay
q in epoch k when one of its in-sends of q arrives by k (``relay_only_what_arrives``); a switch
forwards in the epoch a chunk arrives (``switch_forwards_on_arrival``); link capacity counts the
sends already committed (``link_capacity_with_history``). Candidates are only sends that could
matter: commodities not yet fully delivered, tails that can hold the chunk in time (epoch
distances from the current holders), heads that neither hold it nor have it in flight, links
with room left; per (link, epoch) only the best few by value are kept.

Objective: each send into a GPU that needs the chunk earns DELIVERY, divided by 1 + the epochs
it lands after the chunk could reach that GPU from its holders (a slow copy across a cut into a
chassis that already has the chunk is nearly worthless), plus a little for landing early in the
window; a send planned for a later epoch of the window loses DEFER per epoch. Chunks that end the
window close to the GPUs that still need them are rewarded twice:

- coverage (``chunks_end_close``): per (chunk q, GPU d lacking q and with no holder of q within
  one cheapest hop) a credit Z in [0, 1] worth COVER, earned only if some chosen send lands q
  within that hop of d. Capped at 1, so a second copy toward the same GPUs earns nothing: the
  model spreads distinct chunks (rarest first, in effect) instead of duplicating one.
- route potential: how many epochs of route (hold epochs aside) the new copy saves the GPUs
  still lacking q, summed, scaled so the largest in the window is POTENTIAL (one delivery always
  outweighs it): chunks with far to go move first.
Each send costs SEND_COST, so nothing useless goes on a link.

Receding horizon: only the window's first ``commit`` epochs (default 1) are kept; the next window
starts there. Spare room left in the kept epochs goes to rarest-first greedy sends.

Several configurations are tried in turn (:func:`default_tries`: window 1 or 2 epochs, with and
without the route potential), each dropped as soon as it can no longer beat the best, all stopped
once one meets the epoch lower bound. No single configuration was best on every topology
measured; the portfolio keeps the best verified schedule.

Every send of a window passes an exact check (held before sent, forwarded on arrival, capacity)
before it is committed, so the stitch is valid by construction; the simulator then verifies it.
When the time limit runs out (or the windows stall), a greedy completion finishes the schedule:
rarest-first list scheduling epoch by epoch over every direct link and every fewest-epoch
GPU -> switch* -> GPU route, so a complete verified schedule always comes back.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from flowride.collectives.demand import Collective, Demand
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.synth.highs import MipModel, SolveOptions, solve
from flowride.synth.horizon import Probe, SearchResult, epoch_lower_bound
from flowride.synth.reach import UNREACHABLE, epoch_distances
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming

Progress = Callable[[dict], None]
NEVER = np.int64(1) << 40  # hold epoch of a chunk a GPU neither holds nor has in flight

DELIVERY = 1.0  # reward of one needed chunk arriving
EARLY = 0.2  # extra reward for landing at the window's first epoch, fading to 0 at its last arrival
POTENTIAL = 0.2  # largest reward for bringing a chunk closer (in route epochs) to GPUs lacking it
DEFER = 0.2  # value lost per epoch a GPU's send is planned after the window's first
COVER = 0.25  # reward for each GPU lacking a chunk that a send brings within one cheapest hop of it
SEND_COST = 0.01  # cost of every send: nothing useless goes on a link
TOP_K = 6  # candidates kept per (link, epoch) per chunk of capacity
WINDOW_SECONDS = 10.0  # cap on one window's solve


# ------------------------------------------------------------------------------------ state


class _State:
    """What the committed windows have done: holds, link use, switch traffic, sends."""

    def __init__(self, topo: Topology, demand: Demand, timing: EpochTiming) -> None:
        self.topo, self.demand, self.timing = topo, demand, timing
        n, nl, nq = topo.num_nodes, len(topo.links), len(demand.commodities)
        self.lsrc, self.ldst = topo.link_ends
        self.is_gpu = np.array([nd.is_gpu for nd in topo.nodes], dtype=bool)
        self.copy = np.array([(not nd.is_gpu) and nd.copy for nd in topo.nodes], dtype=bool)
        self.delay = timing.hop_delay.astype(np.int64)
        self.beta = timing.beta_epochs.astype(np.int64)
        self.wcap = timing.window_cap.astype(np.int64)
        self.src = np.array([q.source for q in demand.commodities], dtype=np.int64)
        self.hold = np.full((nq, n), NEVER, dtype=np.int64)
        self.hold[np.arange(nq), self.src] = 0
        self.need = np.zeros((nq, n), dtype=bool)
        for qi, q in enumerate(demand.commodities):
            self.need[qi, list(q.dests)] = True
        self.used = np.zeros((nl, 256), dtype=np.int32)
        self.sw_in: dict[tuple[int, int, int], int] = defaultdict(int)  # (q, switch, epoch) -> arrivals
        self.sw_out: dict[tuple[int, int, int], int] = defaultdict(int)
        self.sends: list[tuple[int, int, int]] = []  # (epoch, link, q)

    # ---------------------------------------------------------------- link book
    def ensure(self, epoch: int) -> None:
        if epoch >= self.used.shape[1]:
            grow = max(epoch + 1, 2 * self.used.shape[1])
            more = np.zeros((self.used.shape[0], grow - self.used.shape[1]), dtype=np.int32)
            self.used = np.concatenate([self.used, more], axis=1)

    def fits(self, link: int, k: int) -> bool:
        """One more chunk may start on ``link`` in epoch k: every b+1 window through k has room."""
        b, cap = int(self.beta[link]), int(self.wcap[link])
        self.ensure(k + b + 1)
        row = self.used[link]
        if b == 0:
            return int(row[k]) < cap
        seg = row[max(0, k - b) : k + b + 1].astype(np.int64)
        off = k - max(0, k - b)  # position of k in seg
        c = np.concatenate([[0], np.cumsum(seg)])
        for s in range(off - b, off + 1):
            lo = max(0, s)
            if c[min(len(seg), s + b + 1)] - c[lo] + 1 > cap:
                return False
        return True

    def window_use(self, lo: int, hi: int) -> np.ndarray:
        """used[:, lo:hi] with zeros for negative epochs."""
        self.ensure(hi)
        out = np.zeros((self.used.shape[0], hi - lo), dtype=np.int64)
        a = max(lo, 0)
        out[:, a - lo :] = self.used[:, a:hi]
        return out

    # ---------------------------------------------------------------- committing sends
    def can_send(self, k: int, link: int, q: int) -> bool:
        u = int(self.lsrc[link])
        if self.is_gpu[u]:
            if self.hold[q, u] > k:
                return False
        else:
            key = (q, u, k)
            arrived = self.sw_in.get(key, 0)
            if arrived == 0 or (not self.copy[u] and self.sw_out.get(key, 0) >= arrived):
                return False
        return self.fits(link, k)

    def commit(self, k: int, link: int, q: int) -> None:
        u, v = int(self.lsrc[link]), int(self.ldst[link])
        self.ensure(k + 1)
        self.used[link, k] += 1
        if not self.is_gpu[u]:
            self.sw_out[(q, u, k)] += 1
        t = k + int(self.delay[link])
        if self.is_gpu[v]:
            if t < self.hold[q, v]:
                self.hold[q, v] = t
        else:
            self.sw_in[(q, v, t)] += 1
        self.sends.append((k, link, q))

    def try_send(self, k: int, link: int, q: int) -> bool:
        if not self.can_send(k, link, q):
            return False
        self.commit(k, link, q)
        return True

    # ---------------------------------------------------------------- progress
    def missing(self) -> np.ndarray:
        """(Q, N) bool: needed and neither held nor in flight."""
        return self.need & (self.hold >= NEVER)

    def delivered(self) -> int:
        return int((self.need & (self.hold < NEVER)).sum())


# ------------------------------------------------------------------------------------ statics


def _switch_reach(topo: Topology, timing: EpochTiming, st: _State) -> tuple[np.ndarray, np.ndarray]:
    """late[w]: most epochs from a GPU's send to switch w forwarding it, over fewest-epoch
    switch-only routes; reach[w, g]: GPU g is reachable from switch w through switches only."""
    n = topo.num_nodes
    late = np.zeros(n, dtype=np.int64)
    reach = np.zeros((n, n), dtype=bool)
    if not topo.switches:
        return late, reach
    tail_sw = ~st.is_gpu[st.lsrc]
    head_sw = ~st.is_gpu[st.ldst]
    into = head_sw  # GPU -> switch and switch -> switch
    g = sp.csr_matrix((st.delay[into].astype(float) + 1e-6, (st.lsrc[into], st.ldst[into])), shape=(n, n))
    d = dijkstra(g, directed=True, indices=list(topo.gpus))
    for w in topo.switches:
        col = d[:, w]
        fin = np.isfinite(col)
        late[w] = int(np.floor(col[fin].max() + 1e-3)) if fin.any() else 0
    # switch-only reach to GPUs: out of a switch through switches, ending at a GPU
    sw_edges = tail_sw
    g2 = sp.csr_matrix((np.ones(int(sw_edges.sum())), (st.lsrc[sw_edges], st.ldst[sw_edges])), shape=(n, n))
    d2 = dijkstra(g2, directed=True, indices=list(topo.switches), unweighted=True)
    for i, w in enumerate(topo.switches):
        reach[w] = np.isfinite(d2[i]) & st.is_gpu
    return late, reach


class _Context:
    def __init__(self, topo: Topology, demand: Demand, timing: EpochTiming, D: np.ndarray, st: _State) -> None:
        self.topo, self.demand, self.timing, self.D = topo, demand, timing, D.astype(np.int64)
        self.gpus = np.array(topo.gpus, dtype=np.int64)
        self.late, self.reach = _switch_reach(topo, timing, st)
        self.n = topo.num_nodes
        # the cheapest GPU-to-GPU hop, and every GPU's neighbours within it
        Dg = self.D[np.ix_(self.gpus, self.gpus)]
        off = ~np.eye(len(self.gpus), dtype=bool)
        self.radius = max(1, int(Dg[off].min())) if off.any() else 1
        near_g = (Dg <= self.radius) & off  # (G, G)
        self.near_dense = np.zeros((len(self.gpus), self.n), dtype=np.int32)
        self.near_dense[:, self.gpus] = near_g
        self.near = sp.csr_matrix(self.near_dense.astype(bool))
        self.gpu_pos = np.full(self.n, -1, dtype=np.int64)
        self.gpu_pos[self.gpus] = np.arange(len(self.gpus))


# ------------------------------------------------------------------------------------ estimates


def _earliest(hold: np.ndarray, t0: int, D: np.ndarray, gpus: np.ndarray, batch: int = 32) -> np.ndarray:
    """e[q, v]: earliest epoch (>= t0) node v could have q, from the current holders and chunks
    in flight (min over holders h of max(hold, t0) + D[h, v])."""
    nq, n = hold.shape
    out = np.full((nq, n), NEVER, dtype=np.int64)
    Dg = D[gpus]  # (G, N)
    for a in range(0, nq, batch):
        h = hold[a : a + batch][:, gpus]  # (b, G)
        start = np.where(h < NEVER, np.maximum(h, t0), NEVER)
        out[a : a + batch] = (start[:, :, None] + Dg[None, :, :]).min(axis=1)
    return np.minimum(out, NEVER)


def _closer(qs: np.ndarray, heads: np.ndarray, hold: np.ndarray, lack: np.ndarray, D: np.ndarray, gpus: np.ndarray, batch: int = 2048) -> np.ndarray:
    """Route potential of each send (q, head): the sum over GPUs d lacking q of how many epochs
    shorter the route from ``head`` to d is than from the nearest current holder of q (in flight
    included; hold epochs aside)."""
    out = np.zeros(len(qs))
    if len(qs) == 0:
        return out
    Dgg = D[np.ix_(gpus, gpus)]
    held = hold[:, gpus] < NEVER
    dist = np.full(held.shape, NEVER, dtype=np.int64)
    for a in range(0, held.shape[0], 64):
        h = held[a : a + 64]
        dist[a : a + 64] = np.where(h[:, :, None], Dgg[None, :, :], NEVER).min(axis=1)
    lackg = lack[:, gpus]
    pos = np.full(D.shape[0], -1, dtype=np.int64)
    pos[gpus] = np.arange(len(gpus))
    for a in range(0, len(qs), batch):
        q, h = qs[a : a + batch], pos[heads[a : a + batch]]
        drop = dist[q] - Dgg[h]
        out[a : a + batch] = np.where(lackg[q] & (drop > 0), drop, 0).sum(axis=1)
    return out


# ------------------------------------------------------------------------------------ window model


class _Credit:
    """Capped credit per (chunk, GPU lacking it): a variable Z in [0, cap] worth ``cost`` each,
    at most the weighted sum of the chosen sends that earn it (sends[i] earns weight[i] of Z[z[i]]).
    The cap is the largest single weight, so a second send toward the same GPU adds little."""

    def __init__(self, sends, z, weight, cap, cost):
        self.sends, self.z, self.weight, self.cap, self.cost = sends, z, weight, cap, cost


class _Window:
    """Candidate sends of one window (commodity index into ``active``, link, epoch, value) and
    the credits (coverage) they can earn."""

    def __init__(self, q, ln, k, value, credits):
        self.q, self.ln, self.k, self.value = q, ln, k, value
        self.credits = credits


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expand inclusive ranges [lo, hi] to (row index, value) pairs."""
    cnt = np.maximum(hi - lo + 1, 0)
    idx = np.repeat(np.arange(len(lo)), cnt)
    start = np.repeat(lo - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt)
    return idx, start + np.arange(int(cnt.sum()))


def _room(st: _State, links: np.ndarray, k: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """For each var (link, k): whether every capacity window through k has room; and the remaining
    room per (link, window start) over epochs [lo - bmax, hi] as a dense array (L, E)."""
    bmax = int(st.beta.max()) if len(st.beta) else 0
    base = lo - bmax
    pre = st.window_use(base, hi + bmax + 1)  # (L, E') with E' = hi + 2 bmax + 1 - lo
    c = np.concatenate([np.zeros((pre.shape[0], 1), dtype=np.int64), np.cumsum(pre, axis=1)], axis=1)
    E = pre.shape[1]
    s = np.arange(E)
    end = np.minimum(s[None, :] + st.beta[:, None] + 1, E)
    win = np.take_along_axis(c, end, axis=1) - c[:, :E]  # used in [s, s+b]
    room = st.wcap[:, None] - win  # (L, E) by window start
    ok = np.ones(len(links), dtype=bool)
    b = st.beta[links]
    for shift in range(bmax + 1):
        m = b >= shift
        ok[m] &= room[links[m], k[m] - shift - base] >= 1
    return ok, room


def _group_match(key_a: np.ndarray, key_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (i, j) with key_a[i] == key_b[j]."""
    order = np.argsort(key_b, kind="stable")
    sb = key_b[order]
    left = np.searchsorted(sb, key_a, "left")
    right = np.searchsorted(sb, key_a, "right")
    i, pos = _ranges(left, right - 1)
    return i, order[pos]


def window_candidates(st: _State, ctx: _Context, t0: int, W: int, active: np.ndarray, potential: float = POTENTIAL) -> _Window | None:
    """Enumerate the sends worth a variable in window [t0, t0 + W) and their values."""
    D, gpus = ctx.D, ctx.gpus
    kg = t0 + W - 1
    hold = st.hold[active]
    lack = st.need[active] & (hold >= NEVER)
    est = _earliest(hold, t0, D, gpus)
    lsrc, ldst = st.lsrc, st.ldst
    nl = len(lsrc)
    tail_gpu = st.is_gpu[lsrc]
    head_gpu = st.is_gpu[ldst]
    # head may receive q: a GPU neither holding nor expecting it, or a switch leading to one
    head_ok = np.empty((len(active), nl), dtype=bool)
    head_ok[:, head_gpu] = hold[:, ldst[head_gpu]] >= NEVER
    if (~head_gpu).any():
        lacks_any = (lack.astype(np.int32) @ ctx.reach.T.astype(np.int32)) > 0  # (Qa, N): a switch reaches a GPU lacking q
        head_ok[:, ~head_gpu] = lacks_any[:, ldst[~head_gpu]]
    first = np.maximum(est[:, lsrc], t0)
    last = np.where(tail_gpu, kg, kg + ctx.late[lsrc])[None, :].repeat(len(active), axis=0)
    ok = head_ok & (first <= last)
    qi, li = np.nonzero(ok)
    vi, k = _ranges(first[qi, li], last[qi, li])
    q, ln = qi[vi], li[vi]
    if len(q) == 0:
        return None
    # links with room in every capacity window through k
    room_ok, _ = _room(st, ln, k, t0, int(k.max()))
    q, ln, k = q[room_ok], ln[room_ok], k[room_ok]
    if len(q) == 0:
        return None
    # values
    heads = ldst[ln]
    t_arr = k + st.delay[ln]
    into_gpu = st.is_gpu[heads]
    value = np.zeros(len(q))
    span = max(1, int(t_arr.max()) - t0)
    gi = np.flatnonzero(into_gpu)
    needed = st.need[active[q[gi]], heads[gi]]
    # a delivery that lands well after the chunk could reach the head from its holders (over a
    # faster route) is mostly a wasted copy: it is worth 1 / (1 + epochs late)
    late = np.maximum(0, t_arr[gi] - est[q[gi], heads[gi]])
    value[gi] = needed * (DELIVERY / (1.0 + late) + EARLY * (1.0 - (t_arr[gi] - t0) / span))
    # potential: how many epochs of route the new copy saves the GPUs still lacking q (route
    # length only, hold epochs aside), scaled so the largest is POTENTIAL
    g = np.zeros(len(q))
    if potential > 0:
        g[gi] = _closer(q[gi], heads[gi], hold, lack, D, gpus)
    pot_unit = potential / g.max() if len(g) and g.max() > 0 else 0.0
    value += pot_unit * g
    # a GPU's send planned for a later epoch of the window is worth a little less: only the first
    # epoch is committed, and a plan that keeps deferring a send would never make it
    value -= DEFER * np.where(tail_gpu[ln], k - t0, 0)
    # coverage: which GPUs lacking q, with no holder within a cheapest hop, a send would give one
    cov_s, cov_d = _coverage(st, ctx, hold, lack, q[gi], heads[gi])
    cov_s = gi[cov_s]
    score = value + COVER * np.bincount(cov_s, minlength=len(q))
    # ranking score for sends into switches: how many GPUs beyond it still lack the chunk
    si = np.flatnonzero(~into_gpu)
    if len(si):
        beyond = (lack.astype(np.int32) @ ctx.reach.T.astype(np.int32))[q[si], heads[si]]
        score[si] = DELIVERY + COVER * beyond
    # keep the best few per (link, epoch)
    # (a send into a switch may feed any of its out-links: keep that many times more; forwards
    # out of a switch are kept whole, they only survive when fed)
    fan = np.maximum(1, np.bincount(lsrc, minlength=ctx.n))
    cap_k = np.maximum(1, TOP_K * st.wcap[ln] * np.where(into_gpu, 1, fan[heads]))
    cap_k = np.where(tail_gpu[ln], cap_k, np.iinfo(np.int64).max)
    gkey = ln * (int(k.max()) + 1) + k
    order = np.lexsort((-score, gkey))
    sk = gkey[order]
    starts = np.flatnonzero(np.concatenate([[True], sk[1:] != sk[:-1]]))
    rank = np.arange(len(sk)) - np.repeat(starts, np.diff(np.concatenate([starts, [len(sk)]])))
    keep = order[rank < cap_k[order]]
    keep.sort()
    # leave out relays and forwards that nothing in the window can feed, until none is left
    while True:
        feed = _fed(st, hold, q[keep], ln[keep], k[keep])
        if feed.all():
            break
        keep = keep[feed]
        if len(keep) == 0:
            return None
    remap = -np.ones(len(q), dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    credits = []
    for s_, d_, w_, cost in ((cov_s, cov_d, np.ones(len(cov_s)), COVER),):
        cs = remap[s_]
        m = cs >= 0
        if cost <= 0 or not m.any():
            continue
        zkeys, zidx = np.unique(q[s_[m]] * ctx.n + d_[m], return_inverse=True)
        cap = np.zeros(len(zkeys))
        np.maximum.at(cap, zidx, w_[m])
        credits.append(_Credit(cs[m], zidx, w_[m], cap, cost))
    return _Window(q[keep], ln[keep], k[keep], value[keep], credits)


def _coverage(st: _State, ctx: _Context, hold: np.ndarray, lack: np.ndarray, q: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(send, GPU d) pairs: the send's head g is within ``ctx.radius`` epochs of d, d lacks q and
    no holder of q (in flight included) is that close to d yet."""
    held = (hold < NEVER)[:, ctx.gpus].astype(np.int32)
    near_holder = (held @ ctx.near_dense) > 0  # (Qa, N)
    uncovered = lack & ~near_holder
    ptr, idx = ctx.near.indptr, ctx.near.indices
    s, pos = _ranges(ptr[ctx.gpu_pos[g]], ptr[ctx.gpu_pos[g] + 1] - 1)
    d = idx[pos].astype(np.int64)
    ok = uncovered[q[s], d]
    return s[ok], d[ok]


def _fed(st: _State, hold: np.ndarray, q, ln, k) -> np.ndarray:
    """Which candidate sends could happen: a GPU tail holds q by k or some candidate brings it
    by k; a switch tail has a candidate arriving exactly at k; a send into a switch has a
    candidate forward at its arrival."""
    tail, head = st.lsrc[ln], st.ldst[ln]
    t = k + st.delay[ln]
    n = st.is_gpu.shape[0]
    out = np.ones(len(q), dtype=bool)
    gpu_tail = st.is_gpu[tail]
    relay = np.flatnonzero(gpu_tail & (hold[q, tail] > k))
    ins = np.flatnonzero(st.is_gpu[head])
    if len(relay):
        i, j = _group_match(q[relay] * n + tail[relay], q[ins] * n + head[ins])
        good = t[ins[j]] <= k[relay[i]]
        fed = np.zeros(len(relay), dtype=bool)
        fed[i[good]] = True
        out[relay] = fed
    T1 = int(max(t.max(), k.max())) + 2
    sw_out = np.flatnonzero(~gpu_tail)
    sw_in = np.flatnonzero(~st.is_gpu[head])
    if len(sw_out):
        a = (q[sw_out] * n + tail[sw_out]) * T1 + k[sw_out]
        b = (q[sw_in] * n + head[sw_in]) * T1 + t[sw_in]
        out[sw_out] &= np.isin(a, b)
        out[sw_in] &= np.isin(b, a)
    return out


def build_window_model(st: _State, win: _Window, hold: np.ndarray) -> MipModel:
    """Rows over the candidate sends, one family per rule (see the module notes)."""
    q, ln, k = win.q, win.ln, win.k
    nv = len(q)
    n = st.is_gpu.shape[0]
    tail, head = st.lsrc[ln], st.ldst[ln]
    t = k + st.delay[ln]
    R, C, V, hi = [], [], [], []
    nrows = 0

    def add(rows, cols, vals, rhs):
        nonlocal nrows
        R.append(rows + nrows)
        C.append(cols)
        V.append(vals)
        hi.append(rhs)
        nrows += len(rhs)

    # receive_once: each GPU gets each chunk at most once (duplicates are waste)
    ins = np.flatnonzero(st.is_gpu[head])
    gk = q[ins] * n + head[ins]
    u, inv, cnt = np.unique(gk, return_inverse=True, return_counts=True)
    multi = cnt[inv] > 1
    grp = np.unique(inv[multi], return_inverse=True)[1] if multi.any() else np.zeros(0, dtype=np.int64)
    if multi.any():
        add(grp, ins[multi], np.ones(int(multi.sum())), np.ones(int(grp.max()) + 1))

    # relay_only_what_arrives: F[q,(g,x),k] <= sum of in-sends of q to g arriving by k
    relay = np.flatnonzero(st.is_gpu[tail] & (hold[q, tail] > k))
    if len(relay):
        i, j = _group_match(q[relay] * n + tail[relay], gk)
        good = t[ins[j]] <= k[relay[i]]
        r = np.arange(len(relay))
        add(np.concatenate([r, i[good]]), np.concatenate([relay, ins[j[good]]]),
            np.concatenate([np.ones(len(relay)), -np.ones(int(good.sum()))]), np.zeros(len(relay)))

    # switch_forwards_on_arrival: copy switch: each out <= arrivals; no copy: outs <= arrivals
    sw_out = np.flatnonzero(~st.is_gpu[tail])
    if len(sw_out):
        T1 = int(max(t.max(), k.max())) + 2
        sw_in = np.flatnonzero(~st.is_gpu[head])
        a = (q[sw_out] * n + tail[sw_out]) * T1 + k[sw_out]
        b = (q[sw_in] * n + head[sw_in]) * T1 + t[sw_in]
        cp = st.copy[tail[sw_out]]
        if cp.any():
            o = sw_out[cp]
            i, j = _group_match(a[cp], b)
            r = np.arange(len(o))
            add(np.concatenate([r, i]), np.concatenate([o, sw_in[j]]),
                np.concatenate([np.ones(len(o)), -np.ones(len(i))]), np.zeros(len(o)))
        if (~cp).any():
            o = sw_out[~cp]
            keys, grp = np.unique(a[~cp], return_inverse=True)
            hit = np.isin(b, keys)
            gin = np.searchsorted(keys, b[hit])
            add(np.concatenate([grp, gin]), np.concatenate([o, sw_in[hit]]),
                np.concatenate([np.ones(len(o)), -np.ones(int(hit.sum()))]), np.zeros(len(keys)))

    # link_capacity_with_history: sends in any b+1 window plus those already made <= capacity
    kmin, kmax = int(k.min()), int(k.max())
    _, room = _room(st, ln, k, kmin, kmax)
    bmax = int(st.beta.max())
    base = kmin - bmax
    E = room.shape[1]
    rk, ck = [], []
    b = st.beta[ln]
    for shift in range(bmax + 1):
        m = np.flatnonzero(b >= shift)
        rk.append(ln[m] * E + (k[m] - shift - base))
        ck.append(m)
    rk_all, ck_all = np.concatenate(rk), np.concatenate(ck)
    used_keys, rcomp = np.unique(rk_all, return_inverse=True)
    cap = room[used_keys // E, used_keys % E]
    counts = np.bincount(rcomp, minlength=len(used_keys))
    bind = counts > cap
    remap = -np.ones(len(used_keys), dtype=np.int64)
    remap[bind] = np.arange(int(bind.sum()))
    m = remap[rcomp] >= 0
    if m.any():
        add(remap[rcomp[m]], ck_all[m], np.ones(int(m.sum())), cap[bind].astype(np.float64))

    # chunks_end_close: per (q, d lacking q) credit Z in [0, cap], earned only by chosen sends:
    # Z - sum weight * F <= 0. Coverage (weight 1: d gets a holder within one cheapest hop) and
    # route potential (weight: epochs of route to d the new copy saves).
    nz = 0
    zcost, zcap = [], []
    for cr in win.credits:
        m = len(cr.cap)
        zc = nv + nz + np.arange(m)
        add(np.concatenate([np.arange(m), cr.z]), np.concatenate([zc, cr.sends]),
            np.concatenate([np.ones(m), -cr.weight]), np.zeros(m))
        zcost.append(np.full(m, -cr.cost))
        zcap.append(cr.cap)
        nz += m

    rows = np.concatenate(R) if R else np.zeros(0, dtype=np.int64)
    cols = np.concatenate(C) if C else np.zeros(0, dtype=np.int64)
    vals = np.concatenate(V) if V else np.zeros(0)
    A = sp.csc_matrix((vals, (rows, cols)), shape=(nrows, nv + nz))
    integer = np.zeros(nv + nz, dtype=bool)
    integer[:nv] = True
    return MipModel(
        cost=np.concatenate([-(win.value - SEND_COST)] + zcost),
        lb=np.zeros(nv + nz),
        ub=np.concatenate([np.ones(nv)] + zcap),
        integer=integer,
        A=A,
        row_lo=np.full(nrows, -np.inf),
        row_hi=np.concatenate(hi) if hi else np.zeros(0),
    )


# ------------------------------------------------------------------------------------ committing


def _commit_window(st: _State, active: np.ndarray, win: _Window, chosen: np.ndarray, t_commit: int) -> int:
    """Commit the chosen sends whose GPU tail sends before ``t_commit`` (and the switch forwards
    they feed), in epoch order, each checked exactly; returns how many were committed."""
    q, ln, k = active[win.q[chosen]], win.ln[chosen], win.k[chosen]
    tail_sw = ~st.is_gpu[st.lsrc[ln]]
    keep = tail_sw | (k < t_commit)
    q, ln, k, tail_sw = q[keep], ln[keep], k[keep], tail_sw[keep]
    order = np.lexsort((~tail_sw, k))  # by epoch, switch forwards first (same-epoch delivery)
    done = 0
    for i in order.tolist():
        done += st.try_send(int(k[i]), int(ln[i]), int(q[i]))
    return done


def virtual_links(topo: Topology, st: _State) -> list[tuple[int, int, tuple[int, ...], tuple[int, ...]]]:
    """Every way one GPU can hand a chunk to another in one transfer: a direct GPU -> GPU link, or
    the fewest-epoch GPU -> switch* -> GPU route (switches forward on arrival). Each as
    (tail GPU, head GPU, links, send-epoch offsets)."""
    import heapq

    out_links: dict[int, list[int]] = defaultdict(list)
    for li in range(len(st.lsrc)):
        out_links[int(st.lsrc[li])].append(li)
    vl: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []
    for u in topo.gpus:
        best: dict[int, tuple[int, tuple[int, ...]]] = {}
        heap: list[tuple[int, int, int, tuple[int, ...]]] = []
        for li in out_links[u]:
            v = int(st.ldst[li])
            if st.is_gpu[v]:
                vl.append((u, v, (li,), (0,)))
            else:
                heapq.heappush(heap, (int(st.delay[li]), 1, v, (li,)))
        seen: set[int] = set()
        while heap:
            d, hops, w, path = heapq.heappop(heap)
            if w in seen:
                continue
            seen.add(w)
            for li in out_links[w]:
                x = int(st.ldst[li])
                nd = d + int(st.delay[li])
                if st.is_gpu[x]:
                    if x != u and (x not in best or nd < best[x][0]):
                        best[x] = (nd, path + (li,))
                elif x not in seen:
                    heapq.heappush(heap, (nd, hops + 1, x, path + (li,)))
        for x, (_, path) in sorted(best.items()):
            if any(e[1] == x and len(e[2]) == 1 for e in vl if e[0] == u):
                continue  # a direct link exists
            offs = [0]
            for li in path[:-1]:
                offs.append(offs[-1] + int(st.delay[li]))
            vl.append((u, x, path, tuple(offs)))
    return vl


def greedy_epochs(st: _State, vlinks, k0: int, k1: int | None = None) -> int:
    """Rarest-first list scheduling, epoch by epoch from ``k0`` (to ``k1`` exclusive, or until
    every demand is held or in flight): every transfer with room in that epoch hands its head the
    chunk it lacks, holds no copy of in flight, that the tail holds and that the fewest GPUs have.
    Returns sends added."""
    if not vlinks:
        return 0
    tails = np.array([v[0] for v in vlinks], dtype=np.int64)
    heads = np.array([v[1] for v in vlinks], dtype=np.int64)
    added = 0
    k = k0
    idle = 0
    slack = int(st.delay.max()) + int(st.beta.max()) + 2 if len(st.delay) else 2
    while k1 is None or k < k1:
        miss = st.missing()
        if not miss.any():
            break
        active = np.flatnonzero(miss.any(axis=1))
        hold = st.hold[active]
        holders = (hold < NEVER).sum(axis=1).astype(np.int64)
        cand = (hold[:, tails] <= k) & miss[active][:, heads]  # (Qa, V)
        useful = np.flatnonzero(cand.any(axis=0))
        before = added
        for vi in useful.tolist():
            _, v, links, offs = vlinks[vi]
            cq = np.flatnonzero(cand[:, vi] & (st.hold[active, v] >= NEVER))
            if len(cq) == 0:
                continue
            if not all(st.fits(li, k + o) for li, o in zip(links, offs, strict=True)):
                continue
            pick = int(cq[np.argmin(holders[cq])])
            q = int(active[pick])
            for li, o in zip(links, offs, strict=True):
                if not st.try_send(k + o, li, q):
                    raise AssertionError("greedy transfer rejected after fitting")
            holders[pick] += 1
            added += len(links)
        idle = idle + 1 if added == before else 0
        if k1 is None and idle > slack and not _in_flight_after(st, k):
            raise AssertionError("greedy completion makes no progress")
        k += 1
    return added


def greedy_complete(st: _State, vlinks, k0: int = 0) -> int:
    """Finish the schedule: :func:`greedy_epochs` from ``k0`` until every demand is met."""
    return greedy_epochs(st, vlinks, k0, None)


# ------------------------------------------------------------------------------------ driver


def default_window(timing: EpochTiming, topo: Topology) -> int:
    """Epochs per window. One epoch when every link takes a chunk per epoch (b = 0): each window
    is then an exact assignment of chunks to links, which measured best and fastest (a relay of
    what arrives next epoch is the next window's choice). Two when some link is slower than a
    chunk per epoch, so a window can relay what a fast link brings while the slow one is busy."""
    return 2 if int(timing.beta_epochs.max()) > 0 else 1


@dataclass(frozen=True)
class Try:
    """One way to run the windows: epochs per window, epochs committed, potential weight."""

    window: int
    commit: int
    potential: float


def default_tries(timing: EpochTiming, topo: Topology, window: int | None, commit: int | None) -> list[Try]:
    """The configurations tried in turn (each finished run is kept if it beats the best so far).
    Measured (see tests/test_astar.py and the report): no single choice of window and potential is
    best everywhere; e.g. dgx2 x 2 at 1 GB reaches its lower bound only without the potential,
    ndv2 x 8 only with one-epoch windows, ndv2 x 4 only with two-epoch windows."""
    w0 = int(window) if window is not None else default_window(timing, topo)
    ws = [w0] if window is not None else [w0, 3 - w0]
    out = []
    for w in ws:
        c = int(commit) if commit is not None else 1
        for pot in (POTENTIAL, 0.0):
            out.append(Try(w, min(c, w) if commit is None else c, pot))
    return out


def synthesize_astar(
    topo: Topology,
    demand: Demand,
    timing: EpochTiming,
    window: int | None = None,
    time_limit: float | None = None,
    progress: Progress | None = None,
    D: np.ndarray | None = None,
    commit: int | None = None,
    window_seconds: float | None = None,
    threads: int | None = None,
    mip_gap: float = 0.01,
    fill: bool = True,
    tries: int | None = None,
) -> SearchResult:
    """Stitched window-by-window AllGather schedule (see the module notes).

    ``window``: epochs per window (W; default 1, or 2 where some link is slower than a chunk per
    epoch); ``commit``: epochs of each window kept before the next is solved (default 1: a
    receding horizon, the window's later epochs only inform its first); ``fill``: after each
    window, spare room in its committed epochs goes to rarest-first greedy sends; ``tries``: how
    many configurations of :func:`default_tries` to run at most (each stops early once it cannot
    beat the best so far; all stop once one reaches the epoch lower bound); ``time_limit``:
    seconds for everything: a first try still running is finished by a greedy completion, later
    tries are dropped (``timed_out`` says the limit cut anything short); ``window_seconds``: cap
    on one window's solve.

    Returns a :class:`SearchResult`: ``sends`` (epoch, link, source GPU, chunk) of the best
    stitched schedule, ``T`` its epochs (replayed and verified by the simulator), ``lower`` the
    epoch lower bound, one probe per window solve (``T`` of a probe: the window's end epoch;
    outcome ``greedy`` marks a greedy completion).
    """
    if demand.collective is not Collective.ALLGATHER:
        raise ValueError(f"the round-by-round form handles AllGather (multicast copies), not {demand.collective.value}")
    t_start = time.perf_counter()
    if window is not None and int(window) < 1:
        raise ValueError(f"window {window} must be at least 1 epoch")
    if commit is not None and not 1 <= int(commit) <= (int(window) if window is not None else 1):
        raise ValueError(f"commit {commit} must be in 1..window")
    if D is None:
        D = epoch_distances(topo, timing)
    deadline = None if time_limit is None else t_start + float(time_limit)
    lower = max(epoch_lower_bound(topo, demand, timing, D).values())
    configs = default_tries(timing, topo, window, commit)
    if tries is not None:
        configs = configs[: max(1, int(tries))]
    res = SearchResult(None, 0, lower, False)
    best: tuple[int, list] | None = None
    counter = [0]
    for i, cfg in enumerate(configs):
        if i > 0 and deadline is not None and time.perf_counter() >= deadline:
            res.timed_out = True  # tries left untried
            break
        st, timed_out, done = _run_windows(
            topo, demand, timing, D, cfg, res, lower, deadline, window_seconds, threads, mip_gap, fill,
            progress, t_start, counter, i, bail=None if best is None else best[0], complete=best is None,
        )
        res.timed_out = res.timed_out or timed_out
        if not done:
            continue  # could not beat the best, or ran out of time after the first try
        sends = sorted((k, li, int(st.src[q]), demand.commodities[q].chunk) for k, li, q in st.sends)
        sim = simulate(Schedule.from_tuples(topo, demand, timing.tau, sends, {"method": "astar"}))
        if not sim.valid:
            raise AssertionError(f"stitched schedule failed verification: {sim.first_violation}")
        if best is None or int(sim.epochs) < best[0]:
            best = (int(sim.epochs), sends)
        if best[0] <= lower:
            break
    assert best is not None
    res.T, res.sends = best
    return res


def _run_windows(topo, demand, timing, D, cfg: Try, res: SearchResult, lower, deadline, window_seconds,
                 threads, mip_gap, fill, progress, t_start, counter, try_i, bail, complete):
    """One stitched run. Returns (state, timed_out, done): ``done`` is False when the run was
    dropped (it could no longer finish before epoch ``bail``, or the deadline passed and it is not
    the run to ``complete``)."""
    W, C = cfg.window, cfg.commit
    st = _State(topo, demand, timing)
    ctx = _Context(topo, demand, timing, D, st)
    if (ctx.D[np.ix_(ctx.gpus, ctx.gpus)] >= UNREACHABLE).any():
        raise ValueError("some GPU cannot reach another")
    vlinks = virtual_links(topo, st)
    needed = int(st.need.sum())
    t0 = 0
    stalled = 0
    timed_out = False
    while st.missing().any():
        if bail is not None and t0 + 1 >= bail:
            return st, False, False  # a chunk still missing now lands at t0 + 1 or later
        remaining = None if deadline is None else deadline - time.perf_counter()
        if remaining is not None and remaining <= 0:
            if not complete:
                return st, True, False
            timed_out = True
            break
        active = np.flatnonzero(st.missing().any(axis=1))
        ps = time.perf_counter()
        win = window_candidates(st, ctx, t0, W, active, cfg.potential)
        outcome = "empty"
        cols = rows = 0
        committed = 0
        if win is not None:
            model = build_window_model(st, win, st.hold[active])
            cols, rows = model.num_cols, model.num_rows
            budget = WINDOW_SECONDS if window_seconds is None else float(window_seconds)
            if remaining is not None:
                left_windows = max(2.0, (1.5 * lower - t0) / C)
                budget = min(budget, max(0.05, remaining / left_windows))
            out = solve(model, SolveOptions(time_limit=budget, mip_gap=mip_gap, threads=threads))
            res.solver_seconds += out.seconds
            outcome = "feasible" if out.x is not None else out.status
            if out.x is not None:
                committed = _commit_window(st, active, win, np.flatnonzero(out.x[: len(win.q)] > 0.5), t0 + C)
        if fill:
            committed += greedy_epochs(st, vlinks, t0, t0 + C)
        res.probes.append(Probe(t0 + W, outcome, time.perf_counter() - ps, cols, rows))
        stalled = stalled + 1 if committed == 0 else 0
        if progress:
            progress({"stage": "window", "window": counter[0], "try": try_i, "window_epochs": W,
                      "start_epoch": t0, "delivered": st.delivered(), "needed": needed, "sends": committed,
                      "outcome": outcome, "elapsed": time.perf_counter() - t_start})
        counter[0] += 1
        t0 += C
        if stalled >= 3 and not _in_flight_after(st, t0):
            break  # nothing more the windows can do: the greedy completion takes over
    if st.missing().any():
        greedy_complete(st, vlinks, 0)
        res.probes.append(Probe(t0, "greedy", 0.0, 0, 0))
    return st, timed_out, True


def _in_flight_after(st: _State, t0: int) -> bool:
    h = st.hold[st.hold < NEVER]
    return bool((h >= t0).any())
