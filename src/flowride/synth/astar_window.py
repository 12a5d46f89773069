"""One A* window as a MIP: its candidate sends, their values, and the constraints that keep the
stitched schedule valid (see :mod:`flowride.synth.astar` for the objective and the rules, each
constraint family named after the physical rule it encodes in :func:`build_window_model`).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from flowride.synth.astar_state import NEVER, Context, State
from flowride.synth.highs import MipModel
from flowride.synth.rows import expand_runs

DELIVERY = 1.0  # reward of one needed chunk arriving
EARLY = 0.2  # extra reward for landing at the window's first epoch, fading to 0 at its last arrival
POTENTIAL = 0.2  # largest reward for bringing a chunk closer (in route epochs) to GPUs lacking it
DEFER = 0.2  # value lost per epoch a GPU's send is planned after the window's first
COVER = 0.25  # reward for each GPU lacking a chunk that a send brings within one cheapest hop of it
SEND_COST = 0.01  # cost of every send: nothing useless goes on a link
TOP_K = 6  # candidates kept per (link, epoch) per chunk of capacity


class _Credit:
    """Capped credit per (chunk, GPU lacking it): a variable Z in [0, cap] worth ``cost`` each,
    at most the weighted sum of the chosen sends that earn it (sends[i] earns weight[i] of Z[z[i]]).
    The cap is the largest single weight, so a second send toward the same GPU adds little."""

    def __init__(self, sends, z, weight, cap, cost):
        self.sends, self.z, self.weight, self.cap, self.cost = sends, z, weight, cap, cost


class Window:
    """Candidate sends of one window (commodity index into ``active``, link, epoch, value) and
    the credits (coverage) they can earn."""

    def __init__(self, q, ln, k, value, credits):
        self.q, self.ln, self.k, self.value = q, ln, k, value
        self.credits = credits


def _room(st: State, links: np.ndarray, k: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
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
    i, pos = expand_runs(left, right - left)
    return i, order[pos]


def window_candidates(st: State, ctx: Context, t0: int, W: int, active: np.ndarray, potential: float = POTENTIAL) -> Window | None:
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
    vi, k = expand_runs(first[qi, li], last[qi, li] - first[qi, li] + 1)
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
    return Window(q[keep], ln[keep], k[keep], value[keep], credits)


def _coverage(st: State, ctx: Context, hold: np.ndarray, lack: np.ndarray, q: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(send, GPU d) pairs: the send's head g is within ``ctx.radius`` epochs of d, d lacks q and
    no holder of q (in flight included) is that close to d yet."""
    held = (hold < NEVER)[:, ctx.gpus].astype(np.int32)
    near_holder = (held @ ctx.near_dense) > 0  # (Qa, N)
    uncovered = lack & ~near_holder
    ptr, idx = ctx.near.indptr, ctx.near.indices
    s, pos = expand_runs(ptr[ctx.gpu_pos[g]], ptr[ctx.gpu_pos[g] + 1] - ptr[ctx.gpu_pos[g]])
    d = idx[pos].astype(np.int64)
    ok = uncovered[q[s], d]
    return s[ok], d[ok]


def _fed(st: State, hold: np.ndarray, q, ln, k) -> np.ndarray:
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


def build_window_model(st: State, win: Window, hold: np.ndarray) -> MipModel:
    """Rows over the candidate sends, one family per rule (see :mod:`flowride.synth.astar`)."""
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


def commit_window(st: State, active: np.ndarray, win: Window, chosen: np.ndarray, t_commit: int) -> int:
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
