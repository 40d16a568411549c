"""Convex QP/LP front end for the oracles: min c'x + 1/2 x' diag(h) x + offset, rows lo <= A x <= up (HiGHS, Clarabel)."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

TIME_LIMIT_S = 30.0  # per solve, plus 2e-5 s per matrix entry


def _highs(nnz: int = 0):
    """A fresh silent HiGHS instance (its time limit counts from creation; the banner HiGHS prints to the C
    stdout on the first creation in a process is silenced)."""
    import highspy

    with _c_stdout_silenced():
        solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("time_limit", TIME_LIMIT_S + 2e-5 * nnz)
    solver.setOptionValue("primal_feasibility_tolerance", 1e-9)
    return solver


@contextlib.contextmanager
def _c_stdout_silenced():
    try:
        fd = os.dup(1)
    except OSError:  # no file descriptor 1 (embedded interpreters): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(fd, 1)
        os.close(fd)
        os.close(devnull)


@dataclass
class Solution:
    status: str              # "optimal", "infeasible", or HiGHS's own word for anything else
    x: np.ndarray | None     # primal solution
    objective: float | None
    row_dual: np.ndarray | None

    @property
    def ok(self) -> bool:
        return self.status == "optimal"


def solve_qp(c, A, row_lo, row_up, col_lo, col_up, hess_diag=None, offset: float = 0.0) -> Solution:
    """Solve min c'x + 1/2 sum_j h_j x_j^2 + offset (h >= 0), rows lo <= A x <= up, bounds on x.

    Linear problems, and the feasibility question behind every "infeasible", go to HiGHS (simplex).
    Quadratic ones go to Clarabel's interior-point method: HiGHS's active-set QP solver cycled on
    5-unit case14 steps unless rescaled and ran over ten minutes on one day of case118 with binding
    line limits, which Clarabel solves in 1.8 s, agreeing with HiGHS to 2e-10 where both finish
    (measured on the test days of tso-case14 and tso-case118).
    """
    c = np.asarray(c, float)
    quad = np.zeros_like(c) if hess_diag is None else np.asarray(hess_diag, float)
    if np.any(quad < 0):
        raise ValueError("the objective must be convex: negative quadratic cost coefficient")
    col_lo, col_up = np.asarray(col_lo, float), np.asarray(col_up, float)
    row_lo, row_up = np.asarray(row_lo, float), np.asarray(row_up, float)
    if not np.any(quad > 0):
        return _solve_scaled(c, quad, A, row_lo, row_up, col_lo, col_up, offset, 1.0)
    sol = _clarabel(c, quad, sp.csr_matrix(A), row_lo, row_up, col_lo, col_up, offset)
    if sol.ok:
        return sol
    feasible = _solve_scaled(np.zeros_like(c), np.zeros_like(c), A, row_lo, row_up, col_lo, col_up, 0.0, 1.0)
    return Solution("infeasible", None, None, None) if feasible.status == "infeasible" else sol


def _clarabel(c, quad, A, row_lo, row_up, col_lo, col_up, offset) -> Solution:
    import clarabel

    n = c.shape[0]
    eq = np.isfinite(row_lo) & (row_lo == row_up)
    upper, lower = ~eq & np.isfinite(row_up), ~eq & np.isfinite(row_lo)
    eye = sp.identity(n, format="csr")
    ub, lb = np.isfinite(col_up), np.isfinite(col_lo)
    # Clarabel's form: A x + s = b, s in cones (zero cone: equalities; non-negative cone: A x <= b)
    rows = sp.vstack([A[eq], A[upper], -A[lower], eye[ub], -eye[lb]], format="csc")
    b = np.concatenate([row_up[eq], row_up[upper], -row_lo[lower], col_up[ub], -col_lo[lb]])
    n_eq = int(eq.sum())
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.time_limit = TIME_LIMIT_S + 2e-5 * A.nnz
    solver = clarabel.DefaultSolver(sp.diags(quad, format="csc"), c, rows, b,
                                    [clarabel.ZeroConeT(n_eq), clarabel.NonnegativeConeT(rows.shape[0] - n_eq)], settings)
    result = solver.solve()
    status = str(result.status)
    if status not in ("Solved", "AlmostSolved"):
        return Solution("infeasible" if "Infeasible" in status else f"Clarabel: {status}", None, None, None)
    x = np.array(result.x)
    z = np.array(result.z)
    dual = np.zeros(A.shape[0])
    dual[eq] = z[:n_eq]  # duals of the equality rows (the balance: the system price), others left at 0
    return Solution("optimal", x, float(c @ x + 0.5 * np.sum(quad * x * x) + offset), dual)


def _solve_scaled(c, quad, A, row_lo, row_up, col_lo, col_up, offset, sx) -> Solution:
    import highspy

    inf = highspy.kHighsInf
    c, quad, A = c * sx, quad * sx * sx, sp.csc_matrix(A) * sx
    col_lo, col_up = np.asarray(col_lo, float) / sx, np.asarray(col_up, float) / sx
    scale = 10.0 / max(float(np.max(np.abs(c), initial=0.0)), 1e-12)
    c, quad, offset = c * scale, quad * scale, offset * scale
    n_row, n_col = A.shape
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_col, n_row
    lp.col_cost_ = c
    lp.col_lower_ = np.nan_to_num(col_lo, neginf=-inf, posinf=inf)
    lp.col_upper_ = np.nan_to_num(col_up, neginf=-inf, posinf=inf)
    lp.row_lower_ = np.nan_to_num(np.asarray(row_lo, float), neginf=-inf, posinf=inf)
    lp.row_upper_ = np.nan_to_num(np.asarray(row_up, float), neginf=-inf, posinf=inf)
    lp.offset_ = float(offset)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n_col, n_row
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
    model = highspy.HighsModel()
    model.lp_ = lp
    if np.any(quad != 0):
        hess = highspy.HighsHessian()
        hess.dim_, hess.format_ = n_col, highspy.HessianFormat.kTriangular
        hess.start_, hess.index_, hess.value_ = np.arange(n_col + 1), np.arange(n_col), quad
        model.hessian_ = hess
    h = _highs(A.nnz)
    h.passModel(model)
    h.run()
    status = h.modelStatusToString(h.getModelStatus()).lower()
    if status != "optimal":
        return Solution("infeasible" if "infeasible" in status else status, None, None, None)
    sol = h.getSolution()
    return Solution("optimal", np.array(sol.col_value) * sx, h.getInfo().objective_function_value / scale,
                    np.array(sol.row_dual) / scale)
