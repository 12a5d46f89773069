"""HiGHS through highspy: one bulk model (a CSC matrix), solved with a time limit.

The model is handed over whole (``passModel``), never one coefficient per Python call.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field

import highspy
import numpy as np
import scipy.sparse as sp


@dataclass
class MipModel:
    """min c.x  s.t.  row_lo <= A x <= row_hi,  lb <= x <= ub,  x[integer] integral."""

    cost: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    integer: np.ndarray  # bool per column
    A: sp.csc_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    row_names: dict[str, tuple[int, int]] = field(default_factory=dict)  # family -> row range

    @property
    def num_cols(self) -> int:
        return len(self.cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lo)


@dataclass
class SolveOptions:
    time_limit: float | None = None  # seconds
    mip_gap: float | None = None  # relative gap at which to stop
    threads: int | None = None
    first_feasible: bool = False  # stop at the first feasible solution (feasibility probes)
    log: bool = False
    start: np.ndarray | None = None  # a feasible starting solution, if known
    solver: str | None = None  # HiGHS's "solver" option (simplex, ipm, ...); None: its choice


@dataclass
class SolveResult:
    status: str  # optimal | feasible | infeasible | timeout | error
    x: np.ndarray | None
    objective: float | None
    gap: float | None
    seconds: float
    raw_status: str
    row_dual: np.ndarray | None = None  # LPs only: HiGHS's row duals (for column generation)


_INF = highspy.kHighsInf
_scheduler_threads: int | None = None  # thread count of HiGHS's process-wide pool, once set
_banner_lock = threading.Lock()
_banner_done = False


def _new_highs() -> highspy.Highs:
    """A HiGHS instance. The first one of a process prints HiGHS's banner to file descriptor 1
    before any option can turn output off (highspy 1.16); library code prints nothing, so that
    one is made with the descriptor pointed at /dev/null."""
    global _banner_done
    with _banner_lock:
        if not _banner_done:
            sys.stdout.flush()
            saved = os.dup(1)
            try:
                with open(os.devnull, "w") as devnull:
                    os.dup2(devnull.fileno(), 1)
                    highspy.Highs()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            _banner_done = True
    return highspy.Highs()


def solve(model: MipModel, opts: SolveOptions) -> SolveResult:
    h = _new_highs()
    h.setOptionValue("output_flag", bool(opts.log))
    if opts.time_limit is not None:
        h.setOptionValue("time_limit", float(max(opts.time_limit, 0.01)))
    if opts.mip_gap is not None:
        h.setOptionValue("mip_rel_gap", float(opts.mip_gap))
    if opts.threads is not None:
        global _scheduler_threads
        if _scheduler_threads not in (None, int(opts.threads)):
            # HiGHS keeps one thread pool per process; a new size needs a fresh pool.
            highspy.Highs.resetGlobalScheduler(True)
        _scheduler_threads = int(opts.threads)
        h.setOptionValue("threads", int(opts.threads))
    if opts.first_feasible:
        h.setOptionValue("mip_max_improving_sols", 1)
    if opts.solver is not None:
        h.setOptionValue("solver", opts.solver)

    lp = highspy.HighsLp()
    lp.num_col_ = model.num_cols
    lp.num_row_ = model.num_rows
    lp.col_cost_ = np.asarray(model.cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(model.lb, dtype=np.float64)
    lp.col_upper_ = np.asarray(model.ub, dtype=np.float64)
    lp.row_lower_ = np.where(np.isfinite(model.row_lo), model.row_lo, -_INF).astype(np.float64)
    lp.row_upper_ = np.where(np.isfinite(model.row_hi), model.row_hi, _INF).astype(np.float64)
    A = model.A.tocsc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = A.data.astype(np.float64)
    lp.a_matrix_.num_col_ = model.num_cols
    lp.a_matrix_.num_row_ = model.num_rows
    if model.integer.any():
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if f else highspy.HighsVarType.kContinuous for f in model.integer
        ]
    h.passModel(lp)
    if opts.start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(np.asarray(opts.start, dtype=np.float64))
        sol.value_valid = True
        h.setSolution(sol)

    t0 = time.perf_counter()
    h.run()
    seconds = time.perf_counter() - t0
    ms = h.getModelStatus()
    raw = h.modelStatusToString(ms)
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value) if has_sol else None
    gap = float(info.mip_gap) if has_sol and model.integer.any() else (0.0 if has_sol else None)
    if ms == highspy.HighsModelStatus.kOptimal:
        status = "optimal"
    elif ms == highspy.HighsModelStatus.kInfeasible:
        status = "infeasible"
    elif ms in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kInterrupt):
        status = "timeout" if not has_sol else "feasible-timeout"
    elif has_sol:
        status = "feasible"  # e.g. stopped at the first improving solution
    else:
        status = "error"
    obj = float(info.objective_function_value) if has_sol else None
    dual = None
    if has_sol and not model.integer.any() and info.dual_solution_status == 2:
        dual = np.array(h.getSolution().row_dual)
    return SolveResult(status, x, obj, gap, seconds, raw, dual)
