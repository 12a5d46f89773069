"""The time-expanded multi-commodity-flow MILP of TE-CCL (SIGCOMM 2024; docs/synthesis.md).

Time is cut into epochs 0..T (T+1 epochs: the last is TE-CCL's spare epoch in which a switch may
still deliver). A probe at horizon T asks: can every GPU hold every chunk it needs at the start
of epoch T? The schedule then finishes at T * tau.

Variables (one column each, built in bulk):
- ``F[q, l, k]`` binary: commodity q (a source's chunk) starts on link l in epoch k. Sends that
  could never matter are left out: before the chunk can be at the link's tail, into the
  commodity's own source, or too late to reach a GPU that needs it by T.
- ``H[q, g, t]`` in [0, 1]: GPU g holds q at the start of epoch t (store-and-forward buffer).
- ``P[q, w, e]`` in [0, 1]: copy-capable switch w has q to forward in epoch e.

Each constraint family is one function below, named after the physical rule it encodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from flowride.collectives.demand import Demand
from flowride.synth.highs import MipModel
from flowride.synth.reach import dist_to_need, epoch_distances
from flowride.synth.rows import Infeasible, Rows
from flowride.synth.symmetry import SourceSymmetry
from flowride.topology.model import Topology
from flowride.topology.timing import EpochTiming


@dataclass
class FlowIndex:
    """Column layout of one probe: which (q, l, k) each F column is, and where H / P live."""

    T: int
    f_q: np.ndarray
    f_l: np.ndarray
    f_k: np.ndarray
    h_q: np.ndarray
    h_g: np.ndarray  # node id
    h_t: np.ndarray
    p_q: np.ndarray
    p_w: np.ndarray
    p_e: np.ndarray
    h_lookup: dict[tuple[int, int, int], int]
    p_lookup: dict[tuple[int, int, int], int]

    @property
    def nf(self) -> int:
        return len(self.f_q)

    @property
    def nh(self) -> int:
        return len(self.h_q)

    @property
    def np_(self) -> int:
        return len(self.p_q)

    @property
    def h0(self) -> int:
        return self.nf

    @property
    def p0(self) -> int:
        return self.nf + self.nh

    @property
    def num_cols(self) -> int:
        return self.nf + self.nh + self.np_


def _lookup_array(keys: tuple[np.ndarray, ...], lookup: dict[tuple[int, int, int], int]) -> np.ndarray:
    """Column of each key triple, -1 where absent."""
    return np.array([lookup.get(k, -1) for k in zip(*(a.tolist() for a in keys), strict=True)], dtype=np.int64)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def build_index(topo: Topology, demand: Demand, timing: EpochTiming, T: int, D: np.ndarray | None = None) -> FlowIndex:
    """Enumerate the variables of the probe at horizon T, leaving out those that cannot matter."""
    if D is None:
        D = epoch_distances(topo, timing)
    R = dist_to_need(topo, demand, D)
    l_src, l_dst = topo.link_ends
    delay = timing.hop_delay
    src_of = np.array([q.source for q in demand.commodities])
    ks = np.arange(T + 1)
    fq, fl, fk = [], [], []
    for qi in range(len(demand.commodities)):
        s = src_of[qi]
        earliest = D[s, l_src]  # first epoch the chunk can be at each link's tail
        latest = T - delay - R[qi, l_dst]  # last epoch a send still reaches a GPU in need by T
        ok_link = (l_dst != s) & (earliest <= latest)
        for li in np.flatnonzero(ok_link):
            k = ks[earliest[li] : latest[li] + 1]
            fq.append(np.full(len(k), qi))
            fl.append(np.full(len(k), li))
            fk.append(k)
    f_q, f_l, f_k = _cat(fq), _cat(fl), _cat(fk)

    # Buffers: a GPU g (not the source) may hold q from its earliest arrival to T, where it sends
    # or where it is a destination.
    hq, hg, ht = [], [], []
    senders = {(int(q), int(l_src[li])) for q, li in zip(f_q.tolist(), f_l.tolist(), strict=True)}
    for qi, q in enumerate(demand.commodities):
        dests = set(q.dests)
        for g in topo.gpus:
            if g == q.source:
                continue
            if g not in dests and (qi, g) not in senders:
                continue
            e = int(D[q.source, g])
            if e > T:
                continue
            t = np.arange(e, T + 1)
            hq.append(np.full(len(t), qi))
            hg.append(np.full(len(t), g))
            ht.append(t)
    h_q, h_g, h_t = _cat(hq), _cat(hg), _cat(ht)

    # Copy switches: one "has it to forward" variable per (q, switch, epoch) that has out-sends.
    copy_sw = np.array([not topo.nodes[v].is_gpu and topo.nodes[v].copy for v in range(topo.num_nodes)])
    out_sw = copy_sw[l_src[f_l]]
    keys = sorted({(int(a), int(b), int(c)) for a, b, c in zip(f_q[out_sw], l_src[f_l[out_sw]], f_k[out_sw], strict=True)})
    p_q = np.array([k[0] for k in keys], dtype=np.int64)
    p_w = np.array([k[1] for k in keys], dtype=np.int64)
    p_e = np.array([k[2] for k in keys], dtype=np.int64)

    nf, nh = len(f_q), len(h_q)
    h_lookup = {(int(a), int(b), int(c)): nf + i for i, (a, b, c) in enumerate(zip(h_q, h_g, h_t, strict=True))}
    p_lookup = {k: nf + nh + i for i, k in enumerate(keys)}
    return FlowIndex(T, f_q, f_l, f_k, h_q, h_g, h_t, p_q, p_w, p_e, h_lookup, p_lookup)


# ---------------------------------------------------------------------------- constraint families


def hold_only_what_arrived(idx: FlowIndex, topo: Topology, timing: EpochTiming, rows: Rows) -> None:
    """Store-and-forward buffers: a GPU holds a chunk at the start of epoch t only if it held it at
    t-1 or a copy arrived at t (sent k = t - delay epochs earlier). Once held, it may stay held.

        H[q,g,t] - H[q,g,t-1] - sum_{l into g, k + delay_l = t} F[q,l,k] <= 0
    """
    nh = idx.nh
    r_self = np.arange(nh)
    c_self = idx.h0 + np.arange(nh)
    prev = _lookup_array((idx.h_q, idx.h_g, idx.h_t - 1), idx.h_lookup)
    has_prev = prev >= 0
    l_dst = topo.link_ends[1]
    dst = l_dst[idx.f_l]
    into_gpu = ~timing.dst_is_switch[idx.f_l]
    arr_t = idx.f_k + timing.hop_delay[idx.f_l]
    fsel = np.flatnonzero(into_gpu)
    hrow = _lookup_array((idx.f_q[fsel], dst[fsel], arr_t[fsel]), idx.h_lookup) - idx.h0
    keep = hrow >= 0
    rows.add(
        "hold_only_what_arrived",
        np.concatenate([r_self, r_self[has_prev], hrow[keep]]),
        np.concatenate([c_self, prev[has_prev], fsel[keep]]),
        np.concatenate([np.ones(nh), -np.ones(has_prev.sum()), -np.ones(keep.sum())]),
        np.full(nh, -np.inf),
        np.zeros(nh),
    )


def send_only_what_is_held(idx: FlowIndex, topo: Topology, demand: Demand, rows: Rows) -> None:
    """A GPU sends only chunks it holds at the start of the epoch; it may copy one held chunk onto
    several out-links in the same epoch (multicast). The source holds its own chunks from epoch 0.

        F[q,(g,v),k] - H[q,g,k] <= 0      for g a GPU other than q's source
    """
    l_src = topo.link_ends[0]
    src_node = l_src[idx.f_l]
    is_gpu = np.array([topo.nodes[v].is_gpu for v in range(topo.num_nodes)])
    q_source = np.array([q.source for q in demand.commodities])
    sel = np.flatnonzero(is_gpu[src_node] & (src_node != q_source[idx.f_q]))
    hcol = _lookup_array((idx.f_q[sel], src_node[sel], idx.f_k[sel]), idx.h_lookup)
    if (hcol < 0).any():  # cannot happen: H spans every epoch a GPU may send in
        raise AssertionError("send without a buffer variable")
    n = len(sel)
    r = np.arange(n)
    rows.add(
        "send_only_what_is_held",
        np.concatenate([r, r]),
        np.concatenate([sel, hcol]),
        np.concatenate([np.ones(n), -np.ones(n)]),
        np.full(n, -np.inf),
        np.zeros(n),
    )


def switch_forwards_on_arrival(idx: FlowIndex, topo: Topology, timing: EpochTiming, rows: Rows) -> None:
    """Switches hold nothing: a switch sends a chunk in epoch e only if it arrives for epoch e.
    A copy-capable switch may replicate it onto several out-links; one that cannot copy sends out
    no more copies than came in.

        copy:    P[q,w,e] - sum_{in, arrives e} F <= 0   and   F[q,(w,v),e] - P[q,w,e] <= 0
        no copy: sum_{v} F[q,(w,v),e] - sum_{in, arrives e} F <= 0
    """
    l_src, l_dst = topo.link_ends
    n_nodes = topo.num_nodes
    copy = np.array([topo.nodes[v].copy for v in range(n_nodes)])
    out_sel = np.flatnonzero(timing.src_is_switch[idx.f_l])
    in_sel = np.flatnonzero(timing.dst_is_switch[idx.f_l])
    if len(out_sel) == 0:
        return
    # group key (q, switch, epoch) for both sides
    T1 = idx.T + 1

    def key(q, w, e):
        return (q * n_nodes + w) * (T1 + 64) + e

    in_arr = idx.f_k[in_sel] + timing.hop_delay[idx.f_l[in_sel]]
    in_key = key(idx.f_q[in_sel], l_dst[idx.f_l[in_sel]], in_arr)
    out_w = l_src[idx.f_l[out_sel]]
    out_key = key(idx.f_q[out_sel], out_w, idx.f_k[out_sel])
    r_list, c_list, v_list = [], [], []
    nrows = 0
    # no-copy switches: one row per (q, w, e) group of out-sends
    nc = ~copy[out_w]
    if nc.any():
        groups, ginv = np.unique(out_key[nc], return_inverse=True)
        r_list.append(ginv)
        c_list.append(out_sel[nc])
        v_list.append(np.ones(nc.sum()))
        pos = np.searchsorted(groups, in_key)
        pos_c = np.minimum(pos, len(groups) - 1)
        hit = groups[pos_c] == in_key
        r_list.append(pos_c[hit])
        c_list.append(in_sel[hit])
        v_list.append(-np.ones(hit.sum()))
        nrows = len(groups)
    # copy switches: P rows, then one row per out-send
    if idx.np_:
        pkey = key(idx.p_q, idx.p_w, idx.p_e)
        order = np.argsort(pkey)
        spk = pkey[order]
        prow = nrows + np.arange(idx.np_)
        r_list.append(prow)
        c_list.append(idx.p0 + np.arange(idx.np_))
        v_list.append(np.ones(idx.np_))
        pos = np.searchsorted(spk, in_key)
        pos_c = np.minimum(pos, len(spk) - 1)
        hit = spk[pos_c] == in_key
        r_list.append(nrows + order[pos_c[hit]])
        c_list.append(in_sel[hit])
        v_list.append(-np.ones(hit.sum()))
        nrows += idx.np_
        cp = copy[out_w]
        osel = out_sel[cp]
        pcol = _lookup_array((idx.f_q[osel], out_w[cp], idx.f_k[osel]), idx.p_lookup)
        n = len(osel)
        r = nrows + np.arange(n)
        r_list += [r, r]
        c_list += [osel, pcol]
        v_list += [np.ones(n), -np.ones(n)]
        nrows += n
    rows.add(
        "switch_forwards_on_arrival",
        np.concatenate(r_list),
        np.concatenate(c_list),
        np.concatenate(v_list),
        np.full(nrows, -np.inf),
        np.zeros(nrows),
    )


def link_capacity_window(idx: FlowIndex, topo: Topology, timing: EpochTiming, rows: Rows,
                         images: list[tuple[np.ndarray, np.ndarray]] | None = None) -> None:
    """Link capacity with beta: in any b+1 consecutive epochs at most floor((b+1) * cap * tau)
    chunks start on a link (b = 0: at most floor(cap * tau) per epoch). A chunk that needs more
    than one epoch keeps its link busy for b extra epochs.

        sum_{q} sum_{k' in [k-b, k]} F[q,l,k'] <= window_cap_l     for every link l and epoch k

    ``images`` (the symmetric model): (send columns, link map) pairs; each of those columns counts
    on the mapped link, once per pair: a representative's send stands for its copies on the
    other GPUs of its orbit.
    """
    T1 = idx.T + 1
    b = timing.beta_epochs
    if images is None:
        images = [(np.arange(idx.nf), np.arange(len(topo.links)))]
    r_list, c_list = [], []
    for cols, lmap in images:
        fl = idx.f_l[cols]
        for shift in range(int(b.max()) + 1):
            sel = np.flatnonzero(b[fl] >= shift)  # beta is kept by the map
            kend = idx.f_k[cols[sel]] + shift
            ok = kend <= idx.T
            r_list.append(lmap[fl[sel[ok]]] * T1 + kend[ok])
            c_list.append(cols[sel[ok]])
    r = np.concatenate(r_list)
    c = np.concatenate(c_list)
    used, r_comp = np.unique(r, return_inverse=True)
    cap = timing.window_cap[used // T1].astype(np.float64)
    # drop windows that cannot bind (fewer candidate sends than the capacity)
    counts = np.bincount(r_comp, minlength=len(used))
    binding = counts > cap
    keep_rows = np.flatnonzero(binding)
    remap = -np.ones(len(used), dtype=np.int64)
    remap[keep_rows] = np.arange(len(keep_rows))
    m = remap[r_comp] >= 0
    rows.add(
        "link_capacity_window",
        remap[r_comp[m]],
        c[m],
        np.ones(m.sum()),
        np.full(len(keep_rows), -np.inf),
        cap[keep_rows],
    )


def demand_met_by_horizon(idx: FlowIndex, demand: Demand, lb: np.ndarray) -> None:
    """Every GPU holds every chunk it needs at the start of epoch T (a bound, not a row):

        H[q,d,T] >= 1     for every destination d of q
    """
    for qi, q in enumerate(demand.commodities):
        for d in q.dests:
            col = idx.h_lookup.get((qi, d, idx.T))
            if col is None:
                raise Infeasible(f"chunk {q.chunk} of GPU {q.source} cannot reach GPU {d} within {idx.T} epochs")
            lb[col] = 1.0


def early_delivery_objective(idx: FlowIndex, demand: Demand) -> np.ndarray:
    """Reward holding needed chunks early: minimise -sum of H over destinations and epochs."""
    cost = np.zeros(idx.num_cols)
    is_dest = np.array(
        [d in demand.commodities[q].dests for q, d in zip(idx.h_q.tolist(), idx.h_g.tolist(), strict=True)],
        dtype=bool,
    )
    cost[idx.h0 : idx.h0 + idx.nh][is_dest] = -1.0
    return cost


def build_model(topo: Topology, demand: Demand, timing: EpochTiming, T: int, D: np.ndarray | None = None,
                symmetry: SourceSymmetry | None = None) -> tuple[MipModel, FlowIndex]:
    """The whole probe at horizon T as one bulk MIP model. With ``symmetry`` (AllGather): the
    model of the orbit representatives' chunks only, their sends counted on every image's links
    (:mod:`flowride.synth.symmetry`); read its solution with :func:`restrict_to_sources` of the demand."""
    images = None
    if symmetry is not None:
        demand = restrict_to_sources(demand, symmetry.reps)
    idx = build_index(topo, demand, timing, T, D)
    if symmetry is not None:
        src = np.array([q.source for q in demand.commodities])[idx.f_q]
        images = []
        for v, r in symmetry.rep_of.items():
            images.append((np.flatnonzero(src == r), symmetry.link_map[v]))
    rows = Rows()
    hold_only_what_arrived(idx, topo, timing, rows)
    send_only_what_is_held(idx, topo, demand, rows)
    switch_forwards_on_arrival(idx, topo, timing, rows)
    link_capacity_window(idx, topo, timing, rows, images)
    n = idx.num_cols
    lb = np.zeros(n)
    ub = np.ones(n)
    demand_met_by_horizon(idx, demand, lb)
    integer = np.zeros(n, dtype=bool)
    integer[: idx.nf] = True
    model = MipModel(
        cost=early_delivery_objective(idx, demand),
        lb=lb,
        ub=ub,
        integer=integer,
        A=rows.matrix(n),
        row_lo=rows.row_lo,
        row_hi=rows.row_hi,
        row_names=rows.families,
    )
    return model, idx


def restrict_to_sources(demand: Demand, sources) -> Demand:
    """The demand of the given source GPUs' chunks only (the symmetric model's commodities)."""
    keep = set(sources)
    return replace(demand, commodities=tuple(q for q in demand.commodities if q.source in keep))


def sends_from_solution(idx: FlowIndex, demand: Demand, x: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(epoch, link, source GPU, chunk) of every F column set in ``x``."""
    on = np.flatnonzero(x[: idx.nf] > 0.5)
    out = []
    for i in on.tolist():
        q = demand.commodities[int(idx.f_q[i])]
        out.append((int(idx.f_k[i]), int(idx.f_l[i]), q.source, q.chunk))
    out.sort()
    return out
