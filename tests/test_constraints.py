"""Each MILP constraint family encodes its physical rule.

Technique: solve a small probe to get a feasible x, check it satisfies every row, then mutate x so
that it breaks exactly one physical rule and check that a row of that family (and, where the
mutation touches nothing else, only that family) is violated. The simulator, which knows nothing of
the MILP, must reject the same mutation for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from flowride.collectives import Demand, make_demand
from flowride.schedule import Schedule, simulate
from flowride.synth.bounds import epoch_lower_bound
from flowride.synth.highs import MipModel, SolveOptions, solve
from flowride.synth.milp import FlowIndex, build_model, sends_from_solution
from flowride.synth.reach import dist_to_need, epoch_distances
from flowride.synth.rows import Infeasible
from flowride.topology import Topology, dgx1, ndv2, ring, switch
from flowride.topology.timing import EpochTiming, epoch_timing

TOL = 1e-6
FAMILIES = ("hold_only_what_arrived", "send_only_what_is_held", "switch_forwards_on_arrival", "link_capacity_window")


@dataclass
class Case:
    topo: Topology
    demand: Demand
    timing: EpochTiming
    T: int
    model: MipModel
    idx: FlowIndex
    x: np.ndarray

    # ------------------------------------------------------------------ column lookups
    def holds(self, x: np.ndarray, q: int, g: int, t: int) -> bool:
        if self.demand.commodities[q].source == g:
            return True
        col = self.idx.h_lookup.get((q, g, t))
        return col is not None and x[col] > 0.5

    def load(self, x: np.ndarray, link: int, k: int) -> int:
        on = x[: self.idx.nf] > 0.5
        return int((on & (self.idx.f_l == link) & (self.idx.f_k == k)).sum())

    def has_room(self, x: np.ndarray, link: int, k: int) -> bool:
        """One more chunk may start on ``link`` in epoch ``k`` without breaking any b+1 window."""
        b = int(self.timing.beta_epochs[link])
        cap = int(self.timing.window_cap[link])
        for start in range(k - b, k + 1):
            if sum(self.load(x, link, j) for j in range(start, start + b + 1)) + 1 > cap:
                return False
        return True

    def arrivals(self, x: np.ndarray, q: int, node: int, t: int) -> int:
        n = 0
        for i in np.flatnonzero(x[: self.idx.nf] > 0.5):
            li = int(self.idx.f_l[i])
            if int(self.idx.f_q[i]) == q and self.topo.links[li].dst == node:
                if self.timing.arrival(li, int(self.idx.f_k[i])) == t:
                    n += 1
        return n

    def first_arrival(self, x: np.ndarray, q: int, g: int) -> int | None:
        """Epoch at whose start GPU g first physically holds q under the sends in x."""
        if self.demand.commodities[q].source == g:
            return 0
        ts = [
            self.timing.arrival(int(self.idx.f_l[i]), int(self.idx.f_k[i]))
            for i in np.flatnonzero(x[: self.idx.nf] > 0.5)
            if int(self.idx.f_q[i]) == q and self.topo.links[int(self.idx.f_l[i])].dst == g
        ]
        return min(ts) if ts else None

    def schedule(self, x: np.ndarray) -> Schedule:
        sends = sends_from_solution(self.idx, self.demand, x)
        return Schedule.from_tuples(self.topo, self.demand, self.timing.tau, sends)


def violated_rows(model: MipModel, x: np.ndarray) -> np.ndarray:
    ax = model.A @ x
    return np.flatnonzero((ax > model.row_hi + TOL) | (ax < model.row_lo - TOL))


def violated_families(model: MipModel, x: np.ndarray) -> set[str]:
    bad = violated_rows(model, x)
    return {name for name, (a, b) in model.row_names.items() if ((bad >= a) & (bad < b)).any()}


def solved(
    topo: Topology,
    collective: str,
    size: int,
    epoch,
    extra: int = 0,
    chunks: int = 1,
    first_feasible: bool = False,
    T: int | None = None,
) -> Case:
    """Solve the probe at horizon ``T`` (default: the epoch lower bound plus ``extra``), to
    optimality for the small cases, to a first feasible point (``first_feasible``) for larger ones."""
    demand = make_demand(topo, collective, size, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    if T is None:
        T = max(epoch_lower_bound(topo, demand, timing).values()) + extra
    model, idx = build_model(topo, demand, timing, T)
    res = solve(model, SolveOptions(first_feasible=first_feasible))  # untimed: "optimal" is the solver's, not the machine's
    assert res.status == ("feasible" if first_feasible else "optimal"), res.raw_status
    x = np.round(res.x)
    # the rounded solution is feasible: every row, every column bound, integral F
    assert len(violated_rows(model, x)) == 0
    assert (x >= model.lb - TOL).all() and (x <= model.ub + TOL).all()
    return Case(topo, demand, timing, T, model, idx, x)


# a chain that forces relays: 0 -> 1 -> 2 -> 3 -> 0
URING4 = ring(4, bidirectional=False)


@pytest.fixture(scope="module")
def uring_allgather() -> Case:
    return solved(URING4, "allgather", 4 * 10**6, "fast", extra=2)


@pytest.fixture(scope="module")
def uring_allgather_2chunks() -> Case:
    return solved(URING4, "allgather", 8 * 10**6, "fast", chunks=2, extra=1)


@pytest.fixture(scope="module")
def uring_alltoall() -> Case:
    # every block crosses 1, 2 or 3 of the four links: 24 link-epochs, so 6 epochs at least
    return solved(URING4, "alltoall", 4 * 10**6, "fast", T=7)


@pytest.fixture(scope="module")
def copy_switch() -> Case:
    return solved(switch(3, copy=True), "allgather", 3 * 10**6, "fast", extra=2)


@pytest.fixture(scope="module")
def nocopy_switch() -> Case:
    return solved(switch(3, copy=False), "allgather", 3 * 10**6, "fast", extra=2)


# ------------------------------------------------------------------------------------ rows


def test_row_families_are_named_and_cover_every_row(copy_switch):
    m = copy_switch.model
    assert set(m.row_names) == set(FAMILIES)
    spans = sorted(m.row_names.values())
    assert spans[0][0] == 0 and spans[-1][1] == m.num_rows
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert m.A.shape == (m.num_rows, m.num_cols)
    assert copy_switch.idx.num_cols == m.num_cols
    # F integral, H and P continuous in [0, 1]
    assert m.integer[: copy_switch.idx.nf].all() and not m.integer[copy_switch.idx.nf :].any()
    assert (m.ub == 1).all()


def test_no_switch_rows_without_switches(uring_allgather):
    assert "switch_forwards_on_arrival" not in uring_allgather.model.row_names


# ---------------------------------------------------------------------- send_only_what_is_held


@pytest.mark.parametrize("case_name", ["uring_allgather_2chunks", "uring_alltoall"])
def test_send_only_what_is_held(request, case_name):
    c: Case = request.getfixturevalue(case_name)
    idx, x = c.idx, c.x
    found = 0
    for i in range(idx.nf):
        q, li, k = int(idx.f_q[i]), int(idx.f_l[i]), int(idx.f_k[i])
        g = c.topo.links[li].src
        first = c.first_arrival(x, q, g)
        if x[i] > 0.5 or (first is not None and first <= k):
            continue
        assert not c.holds(x, q, g, k)  # a buffer is never ahead of the arrivals
        y = x.copy()
        y[i] = 1.0  # GPU g sends a chunk it does not hold yet; its buffer column is left as is
        bad = violated_families(c.model, y)
        if c.has_room(x, li, k):
            assert bad == {"send_only_what_is_held"}
        else:  # the link was busy too
            assert bad == {"send_only_what_is_held", "link_capacity_window"}
        sim = simulate(c.schedule(y))
        assert not sim.valid
        s = c.demand.commodities[q]
        assert any(f"GPU {g} sends chunk ({s.source},{s.chunk}) it holds" in v for v in sim.violations)
        found += 1
    assert found > 0


def test_a_relay_sends_only_after_it_holds(uring_allgather):
    """Every F set in the solution from a non-source GPU sits at or after its buffer's first 1."""
    c = uring_allgather
    relays = 0
    for i in np.flatnonzero(c.x[: c.idx.nf] > 0.5):
        q, li, k = int(c.idx.f_q[i]), int(c.idx.f_l[i]), int(c.idx.f_k[i])
        g = c.topo.links[li].src
        assert c.holds(c.x, q, g, k)
        relays += g != c.demand.commodities[q].source
    assert relays > 0  # the one-way ring needs relays


# ---------------------------------------------------------------------- hold_only_what_arrived


@pytest.mark.parametrize("case_name", ["uring_allgather_2chunks", "uring_alltoall", "copy_switch", "nocopy_switch"])
def test_hold_only_what_arrived_claiming_early(request, case_name):
    """Claim a buffer holds a chunk in an epoch in which nothing arrived and it held nothing."""
    c: Case = request.getfixturevalue(case_name)
    idx, x = c.idx, c.x
    found = 0
    for j in range(idx.nh):
        col = idx.h0 + j
        q, g, t = int(idx.h_q[j]), int(idx.h_g[j]), int(idx.h_t[j])
        first = c.first_arrival(x, q, g)
        if first is not None and first <= t:
            continue
        assert x[col] < 0.5
        prev = idx.h_lookup.get((q, g, t - 1))
        assert prev is None or x[prev] < 0.5
        y = x.copy()
        y[col] = 1.0
        assert violated_families(c.model, y) == {"hold_only_what_arrived"}
        found += 1
    assert found > 0


@pytest.mark.parametrize("case_name", ["uring_allgather", "uring_alltoall", "copy_switch", "nocopy_switch"])
def test_hold_only_what_arrived_dropping_the_delivery(request, case_name):
    """Remove the send that delivered a chunk while keeping the buffer that it filled."""
    c: Case = request.getfixturevalue(case_name)
    idx, x = c.idx, c.x
    found = 0
    for i in np.flatnonzero(x[: idx.nf] > 0.5):
        q, li, k = int(idx.f_q[i]), int(idx.f_l[i]), int(idx.f_k[i])
        v = c.topo.links[li].dst
        if not c.topo.nodes[v].is_gpu:
            continue
        t = c.timing.arrival(li, k)
        col = idx.h_lookup.get((q, v, t))
        prev = idx.h_lookup.get((q, v, t - 1))
        if col is None or x[col] < 0.5 or (prev is not None and x[prev] > 0.5) or c.arrivals(x, q, v, t) != 1:
            continue
        y = x.copy()
        y[i] = 0.0
        assert violated_families(c.model, y) == {"hold_only_what_arrived"}
        found += 1
    assert found > 0


def test_a_held_chunk_may_stay_held(uring_allgather):
    """Buffers only grow: once held, holding on to the end is never a violation."""
    c = uring_allgather
    y = c.x.copy()
    for j in range(c.idx.nh):
        q, g, t = int(c.idx.h_q[j]), int(c.idx.h_g[j]), int(c.idx.h_t[j])
        if any(c.holds(c.x, q, g, u) for u in range(t + 1)):
            y[c.idx.h0 + j] = 1.0
    assert len(violated_rows(c.model, y)) == 0


# ------------------------------------------------------------------ switch_forwards_on_arrival


def _switch_out_sends(c: Case):
    for i in range(c.idx.nf):
        li = int(c.idx.f_l[i])
        w = c.topo.links[li].src
        if not c.topo.nodes[w].is_gpu:
            yield i, int(c.idx.f_q[i]), w, li, int(c.idx.f_k[i])


@pytest.mark.parametrize("case_name", ["copy_switch", "nocopy_switch"])
def test_switch_cannot_forward_what_did_not_arrive(request, case_name):
    c: Case = request.getfixturevalue(case_name)
    x = c.x
    found = 0
    for i, q, w, li, e in _switch_out_sends(c):
        if x[i] > 0.5 or c.arrivals(x, q, w, e):
            continue
        pcol = c.idx.p_lookup.get((q, w, e))
        if pcol is not None and x[pcol] > 0.5:
            continue
        y = x.copy()
        y[i] = 1.0
        if c.has_room(x, li, e):
            assert violated_families(c.model, y) == {"switch_forwards_on_arrival"}
        else:  # the link was busy too (which sends fill it depends on the solver's choice)
            assert violated_families(c.model, y) == {"switch_forwards_on_arrival", "link_capacity_window"}
        sim = simulate(c.schedule(y))
        s = c.demand.commodities[q]
        assert any(
            f"switch {w} forwards chunk ({s.source},{s.chunk}) that does not arrive in epoch {e}" in v
            for v in sim.violations
        )
        found += 1
    assert found > 0


def test_copy_switch_p_variable_needs_an_arrival(copy_switch):
    c = copy_switch
    found = 0
    for j in range(c.idx.np_):
        q, w, e = int(c.idx.p_q[j]), int(c.idx.p_w[j]), int(c.idx.p_e[j])
        col = c.idx.p0 + j
        if c.x[col] > 0.5 or c.arrivals(c.x, q, w, e):
            continue
        y = c.x.copy()
        y[col] = 1.0  # "the switch has it to forward", though nothing came in
        assert violated_families(c.model, y) == {"switch_forwards_on_arrival"}
        found += 1
    assert found > 0


def _extra_copies(c: Case):
    """(column, q, w, epoch, copies so far) of unused out-sends of a switch in an epoch where it
    already forwards as many copies of q as arrived, on a link with room."""
    x = c.x
    for i, q, w, li, e in _switch_out_sends(c):
        if x[i] > 0.5 or not c.has_room(x, li, e):
            continue
        n_in = c.arrivals(x, q, w, e)
        outs = [j for j, q2, w2, _, e2 in _switch_out_sends(c) if (q2, w2, e2) == (q, w, e) and x[j] > 0.5]
        if n_in >= 1 and len(outs) == n_in:
            yield i, q, w, e, n_in


def _alltoall_on_switch(copy: bool) -> Case:
    # AlltoAll: each block needs one copy; 3 chunks per epoch per link leave room for another
    return solved(switch(3, copy=copy), "alltoall", 3 * 10**6, 6e-5, extra=1)


def test_copy_switch_may_replicate():
    c = _alltoall_on_switch(copy=True)
    cands = list(_extra_copies(c))
    assert cands
    for i, _q, _w, _e, _n in cands:
        y = c.x.copy()
        y[i] = 1.0  # one arrival, one more copy out
        assert violated_families(c.model, y) == set()
        assert simulate(c.schedule(y)).valid


def test_nocopy_switch_cannot_replicate():
    c = _alltoall_on_switch(copy=False)
    cands = list(_extra_copies(c))
    assert cands
    for i, q, w, _e, n in cands:
        y = c.x.copy()
        y[i] = 1.0
        assert violated_families(c.model, y) == {"switch_forwards_on_arrival"}
        sim = simulate(c.schedule(y))
        s = c.demand.commodities[q]
        msg = f"switch {w} cannot copy, yet sends ({s.source},{s.chunk}) {n + 1} times with {n} arrival(s)"
        assert any(msg in v for v in sim.violations)


def test_nocopy_switch_forwards_one_copy_per_arrival():
    """Two copies into a non-copy switch in one epoch may leave it on two links."""
    c = solved(switch(3, copy=False), "allgather", 3 * 10**6, 4e-5, extra=2)  # cap 2 per epoch
    assert (c.timing.window_cap == 2).all()
    per_group: dict[tuple[int, int, int], list[int]] = {}
    for i, q, w, _li, e in _switch_out_sends(c):
        if c.x[i] > 0.5:
            per_group.setdefault((q, w, e), []).append(i)
    # non-copy: every commodity leaves the switch once per arrival, never more
    for (q, w, e), outs in per_group.items():
        assert len(outs) <= c.arrivals(c.x, q, w, e)
    # both other GPUs need each chunk, and it can only come through the switch
    assert sum(len(v) for v in per_group.values()) == 6


# ------------------------------------------------------------------------ link_capacity_window


def test_link_capacity_single_epoch():
    c = solved(ring(3), "allgather", 6 * 10**6, "fast", extra=2, chunks=2)  # b = 0, cap 1
    assert (c.timing.beta_epochs == 0).all() and (c.timing.window_cap == 1).all()
    found = 0
    for i in range(c.idx.nf):
        q, li, k = int(c.idx.f_q[i]), int(c.idx.f_l[i]), int(c.idx.f_k[i])
        g = c.topo.links[li].src
        if c.x[i] > 0.5 or c.load(c.x, li, k) != 1 or not c.holds(c.x, q, g, k):
            continue
        y = c.x.copy()
        y[i] = 1.0  # a second chunk on a saturated link in the same epoch
        assert violated_families(c.model, y) == {"link_capacity_window"}
        sim = simulate(c.schedule(y))
        lk = c.topo.links[li]
        assert f"link {li} ({lk.src}->{lk.dst}) carries 2 chunks in epoch {k}, capacity 1" in sim.violations
        found += 1
    assert found > 0


def test_link_capacity_beta_window():
    c = solved(ring(3), "allgather", 3 * 10**6, 1e-5, extra=3)  # 20 us chunk, 10 us epoch: b = 1
    assert (c.timing.beta_epochs == 1).all() and (c.timing.window_cap == 1).all()
    found = 0
    for i in range(c.idx.nf):
        q, li, k = int(c.idx.f_q[i]), int(c.idx.f_l[i]), int(c.idx.f_k[i])
        g = c.topo.links[li].src
        if c.x[i] > 0.5 or c.load(c.x, li, k) != 0 or not c.holds(c.x, q, g, k):
            continue
        if c.load(c.x, li, k - 1) == 0 and c.load(c.x, li, k + 1) == 0:
            continue
        y = c.x.copy()
        y[i] = 1.0  # one chunk per epoch, but two in a window of b + 1 = 2 epochs
        assert max(c.load(y, li, j) for j in range(c.T + 1)) == 1
        assert violated_families(c.model, y) == {"link_capacity_window"}
        sim = simulate(c.schedule(y))
        assert any(f"link {li} " in v and "carries 2 chunks in epochs" in v for v in sim.violations)
        found += 1
    assert found > 0


def test_link_capacity_allows_a_send_after_the_window():
    """With b = 1 a link may start a chunk every second epoch."""
    c = solved(ring(3), "allgather", 3 * 10**6, 1e-5, extra=3)
    found = 0
    for i in range(c.idx.nf):
        q, li, k = int(c.idx.f_q[i]), int(c.idx.f_l[i]), int(c.idx.f_k[i])
        g = c.topo.links[li].src
        if c.x[i] > 0.5 or not c.holds(c.x, q, g, k):
            continue
        if any(c.load(c.x, li, j) for j in (k - 1, k, k + 1)):
            continue
        y = c.x.copy()
        y[i] = 1.0
        assert "link_capacity_window" not in violated_families(c.model, y)
        found += 1
    assert found > 0


def test_capacity_rows_bound_every_window():
    """Row by row: a capacity row sums F over one link and b + 1 consecutive epochs."""
    topo = ndv2(2, teccl_compat=True)
    demand = make_demand(topo, "allgather", 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")  # b = 0, 1 and 3 on 50 / 25 / 12.5 GB/s
    model, idx = build_model(topo, demand, timing, 40)
    lo, hi = model.row_names["link_capacity_window"]
    A = model.A.tocsr()
    assert hi > lo
    spans = set()
    for r in range(lo, hi):
        cols = A.indices[A.indptr[r] : A.indptr[r + 1]]
        assert (cols < idx.nf).all()
        assert (A.data[A.indptr[r] : A.indptr[r + 1]] == 1).all()
        links = set(idx.f_l[cols].tolist())
        assert len(links) == 1
        li = links.pop()
        ks = idx.f_k[cols]
        assert ks.max() - ks.min() <= timing.beta_epochs[li]
        spans.add(int(timing.beta_epochs[li]))
        assert model.row_hi[r] == timing.window_cap[li]
        assert len(cols) > timing.window_cap[li]  # rows that cannot bind are left out
    assert spans == {0, 1, 3}


# ------------------------------------------------------------------------ demand_met_by_horizon


def test_demand_met_by_horizon_is_a_lower_bound(copy_switch):
    c = copy_switch
    lb = c.model.lb
    want = set()
    for qi, q in enumerate(c.demand.commodities):
        for d in q.dests:
            col = c.idx.h_lookup[(qi, d, c.T)]
            want.add(col)
            assert lb[col] == 1.0
            y = c.x.copy()
            y[col] = 0.0  # d does not hold it at T
            assert y[col] < lb[col] - TOL
    assert set(np.flatnonzero(lb > 0).tolist()) == want


def test_demand_unreachable_in_time_is_infeasible_before_solving():
    topo = URING4
    demand = make_demand(topo, "allgather", 4 * 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    with pytest.raises(Infeasible):
        build_model(topo, demand, timing, 2)  # 0 -> 3 takes three hops
    build_model(topo, demand, timing, 3)


def test_demand_beyond_capacity_is_infeasible():
    topo = switch(3, copy=True)
    demand = make_demand(topo, "allgather", 3 * 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    model, _ = build_model(topo, demand, timing, 1)  # reachable in one epoch, but two chunks per GPU
    assert solve(model, SolveOptions()).status == "infeasible"
    model, _ = build_model(topo, demand, timing, 2)
    assert solve(model, SolveOptions()).status == "optimal"


# ------------------------------------------------------------------------------ build_index


def test_build_index_by_hand_on_a_one_way_ring():
    topo = URING4
    demand = make_demand(topo, "allgather", 4 * 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")  # every hop 1 epoch
    _, idx = build_model(topo, demand, timing, 3)
    li = topo.link_index
    q0 = [i for i, q in enumerate(demand.commodities) if q.source == 0]
    assert len(q0) == 1
    sel = idx.f_q == q0[0]
    got = sorted(zip(idx.f_l[sel].tolist(), idx.f_k[sel].tolist(), strict=True))
    assert got == sorted([(li[(0, 1)], 0), (li[(0, 1)], 1), (li[(0, 1)], 2), (li[(1, 2)], 1), (li[(1, 2)], 2), (li[(2, 3)], 2)])
    hsel = idx.h_q == q0[0]
    hold = sorted(zip(idx.h_g[hsel].tolist(), idx.h_t[hsel].tolist(), strict=True))
    assert hold == [(1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (3, 3)]


@pytest.mark.parametrize(
    "topo,collective,epoch,extra",
    [
        (URING4, "allgather", "fast", 2),
        (switch(3, copy=True), "allgather", "fast", 2),
        (switch(4, copy=False, alpha_us=30.0), "alltoall", "fast", 1),
        (ndv2(2, teccl_compat=True), "allgather", "fast", 0),
        (dgx1(), "alltoall", "slow", 0),
    ],
    ids=["uring", "copy-switch", "nocopy-switch-alpha", "ndv2-compat", "dgx1-alltoall"],
)
def test_build_index_prunes(topo, collective, epoch, extra):
    demand = make_demand(topo, collective, 10**6)
    timing = epoch_timing(topo, demand.chunk_bytes, epoch)
    D = epoch_distances(topo, timing)
    R = dist_to_need(topo, demand, D)
    T = max(epoch_lower_bound(topo, demand, timing, D).values()) + extra
    _, idx = build_model(topo, demand, timing, T, D)
    src = np.array([q.source for q in demand.commodities])[idx.f_q]
    tail = np.array([lk.src for lk in topo.links])[idx.f_l]
    head = np.array([lk.dst for lk in topo.links])[idx.f_l]
    assert idx.nf > 0
    # no send before the chunk can be at the link's tail
    assert (idx.f_k >= D[src, tail]).all()
    # none into the commodity's own source
    assert (head != src).all()
    # none too late to reach a GPU that needs it by T
    assert (idx.f_k + timing.hop_delay[idx.f_l] + R[idx.f_q, head] <= T).all()
    # and nothing left out that the rules allow, for one commodity: the full window per link
    for li in range(len(topo.links)):
        s = demand.commodities[0].source
        if topo.links[li].dst == s:
            continue
        lo_k = D[s, topo.links[li].src]
        hi_k = T - timing.hop_delay[li] - R[0, topo.links[li].dst]
        ks = sorted(idx.f_k[(idx.f_q == 0) & (idx.f_l == li)].tolist())
        assert ks == list(range(lo_k, hi_k + 1))
    # buffers: never for the source, never before the chunk can arrive
    hs = np.array([q.source for q in demand.commodities])[idx.h_q]
    assert (idx.h_g != hs).all()
    assert (idx.h_t >= D[hs, idx.h_g]).all() and (idx.h_t <= T).all()
    assert all(topo.nodes[g].is_gpu for g in set(idx.h_g.tolist()))
    # forwarding variables only at copy switches
    assert all(not topo.nodes[w].is_gpu and topo.nodes[w].copy for w in set(idx.p_w.tolist()))


# ------------------------------------------------------------------- solution -> schedule


@pytest.mark.parametrize(
    "topo,collective,size,epoch,extra,chunks",
    [
        (URING4, "allgather", 4 * 10**6, "fast", 0, 1),
        (URING4, "alltoall", 4 * 10**6, "fast", 3, 1),
        (ring(3), "allgather", 6 * 10**6, 1e-5, 1, 2),
        (switch(3, copy=True), "allgather", 3 * 10**6, "fast", 0, 1),
        (switch(3, copy=False), "allgather", 3 * 10**6, "fast", 0, 1),
        (switch(3, copy=False, alpha_us=30.0), "alltoall", 3 * 10**6, "fast", 1, 1),
        (dgx1(), "allgather", 10**6, "fast", 0, 1),
        (dgx1(), "alltoall", 10**6, "slow", 0, 1),
        (ndv2(2, teccl_compat=True), "allgather", 10**9, "slow", 0, 1),
        (ndv2(2, teccl_compat=True), "allgather", 10**6, "fast", 0, 1),
    ],
    ids=["uring-ag", "uring-a2a", "ring-beta", "copy-switch", "nocopy-switch", "switch-alpha-a2a", "dgx1-ag", "dgx1-a2a", "ndv2-compat-1gb-slow", "ndv2-compat-1mb-fast"],
)
def test_solution_replays_as_a_valid_schedule(topo, collective, size, epoch, extra, chunks):
    big = len(topo.gpus) > 8
    c = solved(topo, collective, size, epoch, extra=extra, chunks=chunks, first_feasible=big)
    sched = c.schedule(c.x)
    sim = simulate(sched)
    assert sim.valid, sim.first_violation
    assert sim.epochs <= c.T
    assert sim.finish_time_s == pytest.approx(sim.epochs * c.timing.tau)
    # every buffer the solver fills is filled in the replay no later
    for j in np.flatnonzero(c.x[c.idx.h0 : c.idx.h0 + c.idx.nh] > 0.5):
        q = c.demand.commodities[int(c.idx.h_q[j])]
        got = sim.holds.get((q.source, q.chunk, int(c.idx.h_g[j])))
        assert got is not None and got <= int(c.idx.h_t[j])
