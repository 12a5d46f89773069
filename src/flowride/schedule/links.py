"""Link occupancy per epoch, checked against each link's capacity window.

Every list scheduler (the baselines, the LP's path placement, the trees, the reversal of an
AllGather into a ReduceScatter) places a send only where its link has room in every b+1 epoch
window around it, the same rule the simulator (:mod:`flowride.schedule.simulate`) checks.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Sequence

import numpy as np

from flowride.topology.timing import EpochTiming


class SlotOverflow(ValueError):
    """A path that asks one (link, epoch) for more chunks than the link's window holds: no start
    can ever place it (a caller building along such paths must split them or give up)."""


class LinkBook:
    """Chunks started per (link, epoch), checked against every b+1 window. One growing numpy row
    per link: the list schedulers ask ``fits`` millions of times on 512-GPU instances, and
    ``next_fit`` lets a search jump straight to the next epoch where a start fits (on a slow link
    every start blocks b epochs around it; probing them one by one cost 2 million ``fits`` calls
    for the direct AlltoAll on dgx2 x4)."""

    def __init__(self, timing: EpochTiming) -> None:
        self.timing = timing
        self._b = timing.beta_epochs.astype(np.int64)
        self._cap = timing.window_cap.astype(np.int64)
        self._bs = self._b.tolist()  # plain ints for the hot checks
        self._caps = self._cap.tolist()
        self._rows: dict[int, np.ndarray] = {}
        self._open: dict[int, int] = {}  # per link: every epoch below this one is full
        # a slow link that takes one chunk per window (most do: b > 0, window cap 1) needs its
        # starts b + 1 apart, so its sorted starts answer fits/next_fit by bisection alone
        self._lone = [b > 0 and c == 1 for b, c in zip(self._bs, self._caps, strict=True)]
        self._starts: dict[int, list[int]] = {}

    def count(self, link: int, k: int) -> int:
        row = self._rows.get(link)
        return int(row[k]) if row is not None and 0 <= k < len(row) else 0

    def fits(self, link: int, k: int) -> bool:
        if self._lone[link]:
            st = self._starts.get(link)
            if not st:
                return True
            i = bisect_left(st, k - self._bs[link])
            return i == len(st) or st[i] > k + self._bs[link]
        cap = self._caps[link]
        row = self._rows.get(link)
        if row is None:
            return cap >= 1
        b = self._bs[link]
        if b == 0:
            return (int(row[k]) if k < len(row) else 0) < cap
        lo, hi = max(0, k - b), min(len(row), k + b + 1)
        if hi <= lo:
            return cap >= 1
        if b <= 32:  # short windows: a sliding sum in plain Python beats numpy's per-call overhead
            w = [0] * (lo - (k - b)) + row[lo:hi].tolist()
            w += [0] * (2 * b + 1 - len(w))
            run = sum(w[: b + 1])
            if run >= cap:
                return False
            for j in range(b):  # windows starting at k-b+1 .. k
                run += w[j + b + 1] - w[j]
                if run >= cap:
                    return False
            return True
        w = np.zeros(2 * b + 1, dtype=np.int64)  # epochs k-b .. k+b
        if hi > lo:
            w[lo - (k - b): hi - (k - b)] = row[lo:hi]
        c = np.concatenate(([0], np.cumsum(w)))
        return int((c[b + 1:] - c[: -b - 1]).max()) + 1 <= cap  # every window start k-b .. k

    def next_fit(self, link: int, k: int) -> int:
        """The first epoch >= k where :meth:`fits` holds: one pass over the link's row instead of
        one :meth:`fits` per epoch (a slow link's windows block b epochs after each start).

        A start at k' fits when every window of b+1 epochs that holds k' (they begin at k'-b .. k')
        has room: with W[j] the starts in the window beginning at j, no j in [k'-b, k'] has
        W[j] >= cap. So k' fits exactly when the last full window at or before k' begins before
        k'-b; past the row's end every window is empty."""
        if self._lone[link]:
            st = self._starts.get(link)
            if not st:
                return k
            b = self._bs[link]
            k = max(k, self._open.get(link, 0))
            i = bisect_left(st, k - b)
            while i < len(st) and st[i] <= k + b:  # a start within b of k: the first fit is past it
                k = st[i] + b + 1
                i += 1
            return k
        row = self._rows.get(link)
        cap = int(self._cap[link])
        k = max(k, self._open.get(link, 0))
        if row is None or cap < 1:
            return k
        b = int(self._b[link])
        n = len(row)
        if k >= n + b:
            return k
        if b == 0:  # one-epoch windows: the first epoch not yet full (a short look first, then numpy)
            for j in range(k, min(n, k + 16)):
                if row[j] < cap:
                    return j
            free = np.flatnonzero(row[k:] < cap)
            return k + int(free[0]) if free.size else n
        # windows are scanned a stretch at a time, so a link whose row has grown long is not read
        # whole for a fit found near k (the list schedulers ask this millions of times)
        stretch = 8 * (b + 1) + 64
        while True:
            end = min(n + b, k + stretch)  # candidates k .. end
            found = self._first_fit(row, n, b, cap, k, end)
            if found is not None or end >= n + b:
                return found if found is not None else n + b
            k = end + 1
            stretch *= 4

    @staticmethod
    def _first_fit(row: np.ndarray, n: int, b: int, cap: int, k: int, end: int) -> int | None:
        """The first start in k .. end that fits (windows of b + 1 epochs), or None."""
        lo = k - b  # window starts from lo (maybe negative: such windows hold epochs 0.. only)
        span = end - lo + 1  # window starts lo .. end
        r = np.zeros(span + b, dtype=np.int64)  # epochs lo .. end + b
        a, z = max(0, lo), min(n, end + b + 1)
        if z > a:
            r[a - lo: z - lo] = row[a:z]
        c = np.concatenate(([0], np.cumsum(r)))
        full = (c[b + 1: b + 1 + span] - c[:span]) >= cap  # the window beginning at lo + j is full
        starts = np.arange(lo, lo + span)
        last_full = np.maximum.accumulate(np.where(full, starts, lo - b - 1))
        cand = starts[b:]  # k .. end
        ok = np.flatnonzero(last_full[b:] < cand - b)
        return int(cand[ok[0]]) if ok.size else None

    def offsets(self, links: Sequence[int]) -> list[tuple[int, int]]:
        """A path's hops as (link, epochs after the first send): a chunk leaves each node the
        epoch it arrives there (a GPU may hold it longer, but a segment is placed as a whole)."""
        out, off = [], 0
        for li in links:
            out.append((li, off))
            off += int(self.timing.hop_delay[li])
        return out

    def place(self, hops: Sequence[tuple[int, int]], ready: int, until: int | None = None,
              blocked: Callable[[int, int, int], bool] | None = None) -> int | None:
        """The earliest start k in [ready, until] where one more chunk fits on every hop
        (link, k + offset), taken in order so a path that crosses a link twice counts twice;
        the hops are taken and k returned (None: no start up to ``until``). ``blocked(i, link,
        epoch)`` vetoes a hop for reasons of the caller's own. Every list scheduler places its
        segments, trees and paths through this one search; a failing hop moves k straight to
        that link's next epoch with room (:meth:`next_fit`), since offsets are fixed."""
        if len(hops) > 1 and len({li for li, _ in hops}) < len(hops):  # a link twice: can it ever fit?
            offs: dict[int, list[int]] = {}
            for li, off in hops:
                offs.setdefault(li, []).append(off)
            for li, o in offs.items():
                b, cap = self._bs[li], self._caps[li]
                # any b+1 consecutive offsets holding more than the window takes never fit
                worst = int(window_loads(np.sort(np.asarray(o, dtype=np.int64)), b)[1].max())
                if worst > cap:
                    where = "one epoch" if b == 0 else f"{b + 1} epochs"
                    raise SlotOverflow(f"link {li} would carry {worst} chunks in {where}, over its capacity window")
        k = ready
        while until is None or k <= until:
            taken: list[tuple[int, int]] = []
            for i, (li, off) in enumerate(hops):
                e = k + off
                if not self.fits(li, e) or (blocked is not None and blocked(i, li, e)):
                    break
                self.take(li, e)
                taken.append((li, e))
            else:
                return k
            for li, e in taken:
                self.release(li, e)
            li, off = hops[len(taken)]
            k += max(1, self.next_fit(li, k + off) - (k + off))
        return None

    def blocked(self, hops: Sequence[tuple[int, int]], k: int) -> int | None:
        """None where one more chunk fits on every hop at start k (nothing is taken; a path that
        crosses a link twice may still not fit: :meth:`place` decides), else a start after k
        before which none fits: the first full hop's next epoch with room. A list scheduler that
        retries a transfer each time its turn comes asks this first: a transfer queued behind a
        busy link is turned away by one look at that link, not by a whole :meth:`place` that
        takes and gives back every hop (on a saturated link most turns are turned away)."""
        for li, off in hops:
            e = k + off
            if not self.fits(li, e):
                return k + max(1, self.next_fit(li, e) - e)
        return None

    def row_of(self, link: int) -> int:
        """The row ``link``'s chunks are counted in (here its own)."""
        return link

    def take(self, link: int, k: int) -> None:
        row = self._rows.get(link)
        if row is None or k >= len(row):
            grown = np.zeros(max(64, 2 * (k + 1)), dtype=np.int32)
            if row is not None:
                grown[: len(row)] = row
            self._rows[link] = row = grown
        row[k] += 1
        o = self._open.get(link, 0)
        if self._lone[link]:  # here every epoch below ``o`` has a start within b of it
            st = self._starts.setdefault(link, [])
            insort(st, k)
            b = self._bs[link]
            if k - b <= o:  # the new start may block o: move past the starts that do
                i = bisect_left(st, o - b)
                while i < len(st) and st[i] <= o + b:
                    o = st[i] + b + 1
                    i += 1
                self._open[link] = o
            return
        if k == o and row[k] >= self._cap[link]:  # lists fill links mostly in epoch order
            cap = self._cap[link]
            while o < len(row) and row[o] >= cap:
                o += 1
            self._open[link] = o

    def release(self, link: int, k: int) -> None:
        if self._lone[link]:
            st = self._starts[link]
            del st[bisect_left(st, k)]
            self._rows[link][k] -= 1
            self._open[link] = max(0, min(self._open.get(link, 0), k - self._bs[link]))
            return
        self._rows[link][k] -= 1
        if k < self._open.get(link, 0):
            self._open[link] = k


def window_loads(epochs: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """For sorted ``epochs`` (one entry per chunk started on a link): each distinct start, and how
    many chunks start in the b+1 epochs from it. The fullest window can always be slid right until
    it starts at a chunk, so these windows hold the most any window holds."""
    starts = np.unique(epochs)
    return starts, np.searchsorted(epochs, starts + b, side="right") - np.searchsorted(epochs, starts, side="left")


def orbit_reps(link_images: np.ndarray) -> np.ndarray:
    """Each link's orbit under a group of link permutations ((elements, links): the link each link
    goes to under each element), named by the orbit's smallest link id: the name the packing LP's
    rows and :class:`OrbitBook`'s rows share."""
    return np.asarray(link_images).min(axis=0)


class OrbitBook:
    """A :class:`LinkBook` for a schedule that is symmetric under a group of link permutations,
    kept for one link per orbit.

    When every transfer goes out together with its images under each group element (the same
    epoch, the permuted links), every link of an orbit carries the same load as the orbit's first
    link, so only that link's row is kept: a hop on link l stands for ``s`` chunks on its orbit's
    row, s being the number of elements that fix l (each of l's images is hit that many times).
    The list schedulers then place one orbit representative's transfers and let the group copy
    them: 1/|G| of the placements for the same schedule. ``link_images``: (elements, links), row g
    the link each link goes to under element g (row 0 may be any element)."""

    def __init__(self, timing: EpochTiming, link_images: np.ndarray) -> None:
        self.book = LinkBook(timing)
        img = np.asarray(link_images, dtype=np.int64)
        ids = np.arange(img.shape[1])
        self._rep = orbit_reps(img).tolist()
        self._mult = (img == ids[None, :]).sum(axis=0).tolist()  # elements fixing each link

    def _map(self, hops: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        rep, mult = self._rep, self._mult
        return [(rep[li], off) for li, off in hops for _ in range(mult[li])]

    def place(self, hops: Sequence[tuple[int, int]], ready: int, until: int | None = None) -> int | None:
        """As :meth:`LinkBook.place`, for ``hops`` and all their images."""
        return self.book.place(self._map(hops), ready, until)

    def blocked(self, hops: Sequence[tuple[int, int]], k: int) -> int | None:
        """As :meth:`LinkBook.blocked`, for ``hops`` and all their images."""
        return self.book.blocked(self._map(hops), k)

    def row_of(self, link: int) -> int:
        """The row ``link``'s chunks are counted in: its orbit's."""
        return self._rep[link]

    def release(self, link: int, k: int) -> None:
        for _ in range(self._mult[link]):
            self.book.release(self._rep[link], k)
