"""The link book's fast paths against the rule they stand for, and the symmetric placement.

The rule (the simulator's): no b+1 consecutive epochs of a link hold more starts than its window
capacity. ``LinkBook`` answers ``fits``/``next_fit`` by bisection in the sorted starts on links
that take one chunk per window, and by row scans elsewhere; both must agree with counting."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flowride.collectives.demand import make_demand
from flowride.schedule.ir import Schedule
from flowride.schedule.links import LinkBook, OrbitBook, SlotOverflow
from flowride.schedule.simulate import simulate
from flowride.synth.forest import forest_sends
from flowride.synth.trees import packing_for
from flowride.topology.builtins import mi250
from flowride.topology.timing import EpochTiming, epoch_timing

B = [3, 2, 0, 5]  # link 0: one chunk per 4 epochs (bisection); 1: two per 3; 2: two per epoch; 3: one per 6
CAP = [1, 2, 2, 1]


def _timing() -> EpochTiming:
    n = len(B)
    b = np.array(B, dtype=np.int64)
    cap = np.array(CAP, dtype=np.int64)
    zeros = np.zeros(n, dtype=np.int64)
    return EpochTiming(1e-6, 1.0, 1e-6, cap / (b + 1), zeros, b, cap, b + 1, np.zeros(n, bool), np.zeros(n, bool))


def _fits(starts: list[int], b: int, cap: int, k: int) -> bool:
    return all(sum(1 for s in starts if lo <= s <= lo + b) + 1 <= cap for lo in range(k - b, k + 1))


ops = st.lists(st.tuples(st.sampled_from(["take", "release"]), st.integers(0, 3), st.integers(0, 60)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_fits_and_next_fit_agree_with_counting(seq):
    book = LinkBook(_timing())
    starts: list[list[int]] = [[] for _ in B]
    for op, li, k in seq:
        if op == "take":
            e = book.next_fit(li, k)
            assert e >= k and _fits(starts[li], B[li], CAP[li], e)
            assert all(not _fits(starts[li], B[li], CAP[li], j) for j in range(k, e))  # the first fit, none skipped
            book.take(li, e)
            starts[li].append(e)
        elif starts[li]:
            e = starts[li][k % len(starts[li])]
            book.release(li, e)
            starts[li].remove(e)
        for j in range(0, 80, 3):
            assert book.fits(li, j) == _fits(starts[li], B[li], CAP[li], j)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40)), min_size=1, max_size=4), st.integers(0, 30))
def test_place_takes_every_hop_at_the_first_common_fit(hops_in, ready):
    book = LinkBook(_timing())
    for li in range(len(B)):  # some load first
        for k in range(0, 50, 7):
            e = book.next_fit(li, k)
            book.take(li, e)
    hops = list({li: (li, off % 10) for li, off in hops_in}.values())  # one hop per link (a path)
    before = {li: [book.count(li, e) for e in range(200)] for li in range(len(B))}
    k = book.place(hops, ready)
    assert k is not None and k >= ready
    assert all(not all(_fits([e for e in range(200) for _ in range(before[li][e])], B[li], CAP[li], j + off)
                       for li, off in hops) for j in range(ready, k))  # no earlier common fit
    for li in range(len(B)):
        after = [book.count(li, e) for e in range(200)]
        want = before[li][:]
        for hl, off in hops:
            if hl == li:
                want[k + off] += 1
        assert after == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40)), min_size=1, max_size=4), st.integers(0, 30),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60)), max_size=30))
def test_blocked_is_none_exactly_when_a_path_fits_now_else_a_lower_bound(hops_in, ready, load):
    """``blocked`` lets the list schedulers turn a transfer away without a whole placement: it
    must say "fits now" exactly when :meth:`place` would start at ``ready``, and otherwise never
    name a start past the first one :meth:`place` finds (a later one could skip a free slot)."""
    book = LinkBook(_timing())
    for li, k in load:
        book.take(li, book.next_fit(li, k))
    hops = list({li: (li, off % 10) for li, off in hops_in}.values())  # one hop per link (a path)
    later = book.blocked(hops, ready)
    before = [[book.count(li, e) for e in range(200)] for li in range(len(B))]
    k = book.place(hops, ready)
    assert [[book.count(li, e) for e in range(200)] for li in range(len(B))] != before  # place took them
    if later is None:
        assert k == ready
    else:
        assert ready < later <= k


def test_orbit_placement_is_the_full_schedule_of_its_images():
    """MI250 x2 has a shift symmetry of 4 elements that fixes none of its links: the reps'
    transfers placed with all their images verify as a whole AllGather."""
    topo = mi250(2)
    d = make_demand(topo, "allgather", 64 << 20, 4)
    timing = epoch_timing(topo, d.chunk_bytes, "fast")
    packing = packing_for(topo, timing, d.chunk_bytes)
    assert packing.images is not None and len(packing.images.node) == 4
    sends = forest_sends(topo, d, timing, packing)
    sim = simulate(Schedule.from_tuples(topo, d, timing.tau, sends))
    assert sim.valid, sim.first_violation
    # every root's sends are its rep's moved by the symmetry element that carries the rep there
    node, link = packing.images.node, packing.images.link
    mine = {(k, li, c) for k, li, s, c in sends if s == 0}
    for root, (g, rep) in packing.images.of_root.items():
        theirs = {(k, int(link[g][li]), c) for k, li, s, c in sends if s == rep}
        assert theirs == {(k, li, c) for k, li, s, c in sends if s == root}
        assert int(node[g][rep]) == root
    assert mine


def test_orbit_book_counts_each_image():
    timing = _timing()
    # two elements: identity, and one that swaps links 0 and 3 (so each keeps its own window)
    images = np.array([[0, 1, 2, 3], [0, 1, 2, 3]])
    book = OrbitBook(timing, images)
    # every element fixes every link here: a hop stands for 2 chunks, over link 0's window of 1
    try:
        book.place([(0, 0)], 0)
        raise AssertionError("two images of one chunk in one slot of capacity 1 must not fit")
    except ValueError:
        pass
    assert book.place([(2, 0)], 0) == 0  # link 2 takes two per epoch: both images fit
    assert book.place([(2, 0)], 0) == 1  # and the next pair goes one epoch later


def test_a_path_that_could_never_fit_is_refused_not_searched_forever():
    book = LinkBook(_timing())
    try:  # link 0 takes one chunk per 4 epochs: two hops 2 epochs apart never fit
        book.place([(0, 0), (1, 1), (0, 2)], 0)
        raise AssertionError("expected SlotOverflow")
    except SlotOverflow as e:
        assert "link 0 would carry 2 chunks in 4 epochs" in str(e)
    assert book.place([(0, 0), (0, 4)], 0) == 0  # 4 apart: one per window, fits
