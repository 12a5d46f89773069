"""The bulk row builder every model of synth/ fills, and the one "infeasible before solving".

Models are built in bulk (numpy arrays of COO triplets per constraint family, handed to HiGHS in
one call), never one coefficient at a time. The MILP (:mod:`flowride.synth.milp`) appends whole
families, each with its own rows and bounds (:meth:`Rows.add`); the LP (:mod:`flowride.synth.lp`)
numbers its conservation rows itself, because sends, holdovers and deliveries all touch them
(:meth:`Rows.entries`), then claims the bounds of each block of rows (:meth:`Rows.bounds`).
Either way the matrix, the row bounds and the names of the families come out the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp


class Infeasible(Exception):
    """The probe is infeasible before any solving: some demand cannot arrive by the horizon."""


def expand_runs(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive integers in bulk: group i gives ``first[i], ..., first[i]+count[i]-1``.
    Returns (group of each value, value)."""
    count = np.maximum(np.asarray(count, dtype=np.int64), 0)
    n = int(count.sum())
    grp = np.repeat(np.arange(len(count)), count)
    shift = np.repeat(np.asarray(first, dtype=np.int64) - (np.cumsum(count) - count), count)
    return grp, shift + np.arange(n, dtype=np.int64)


@dataclass
class Rows:
    """Constraint rows as COO triplets and row bounds, named family by family."""

    r: list[np.ndarray] = field(default_factory=list)
    c: list[np.ndarray] = field(default_factory=list)
    v: list[np.ndarray] = field(default_factory=list)
    lo: list[np.ndarray] = field(default_factory=list)
    hi: list[np.ndarray] = field(default_factory=list)
    n: int = 0  # rows with bounds so far
    families: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add(self, name: str, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray | float, lo: np.ndarray, hi: np.ndarray) -> None:
        """A family of ``len(lo)`` new rows after those so far; ``rows`` count from its first."""
        start = self.bounds(lo, hi)
        self.entries(rows + start, cols, vals)
        self.families[name] = (start, self.n)

    def entries(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray | float) -> None:
        """Coefficients on rows the caller numbers itself (their bounds come with :meth:`bounds`)."""
        if not (rows >= 0).all():  # cannot happen: every column's rows exist by construction of the index
            raise AssertionError("a column without its row")
        self.r.append(rows)
        self.c.append(cols)
        self.v.append(np.broadcast_to(np.asarray(vals, dtype=np.float64), rows.shape))

    def bounds(self, lo: np.ndarray, hi: np.ndarray) -> int:
        """Claim the next ``len(lo)`` rows with these bounds; returns the first of them."""
        start = self.n
        self.lo.append(np.asarray(lo, dtype=np.float64))
        self.hi.append(np.asarray(hi, dtype=np.float64))
        self.n += len(lo)
        return start

    def matrix(self, num_cols: int) -> sp.csc_matrix:
        empty = np.zeros(0, dtype=np.int64)
        return sp.csc_matrix(
            (np.concatenate(self.v or [np.zeros(0)]), (np.concatenate(self.r or [empty]), np.concatenate(self.c or [empty]))),
            shape=(self.n, num_cols),
        )

    @property
    def row_lo(self) -> np.ndarray:
        return np.concatenate(self.lo) if self.lo else np.zeros(0)

    @property
    def row_hi(self) -> np.ndarray:
        return np.concatenate(self.hi) if self.hi else np.zeros(0)
