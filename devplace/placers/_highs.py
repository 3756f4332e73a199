"""A linear or mixed-integer program handed to HiGHS through its own package (``highspy``), in one
place for m-SCT's LP, the exact placer's MIP and the turn path bound.

scipy's ``linprog`` and ``milp`` run the same solver but spend ~20 ms a call on duals and option
checks that these callers never read, and cannot take a starting incumbent.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse


def highs_solver(matrix, cost, col_lower, col_upper, row_lower, row_upper, integer=None, **options):
    """A ``highspy.Highs`` holding: minimise cost . x subject to row_lower <= matrix x <= row_upper and
    col_lower <= x <= col_upper (numpy's infinities: HiGHS's are the same value), the columns where
    ``integer`` is True integral; silent, with ``options`` set in order. The caller runs it."""
    import highspy

    matrix = sparse.csc_array(matrix)
    n_rows, n_cols = matrix.shape
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_cols, n_rows
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n_cols, n_rows
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = matrix.indptr, matrix.indices, matrix.data
    lp.col_cost_ = np.asarray(cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(col_lower, dtype=np.float64)
    lp.col_upper_ = np.asarray(col_upper, dtype=np.float64)
    lp.row_lower_ = np.asarray(row_lower, dtype=np.float64)
    lp.row_upper_ = np.asarray(row_upper, dtype=np.float64)
    if integer is not None:
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in integer]
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    for name, value in options.items():
        solver.setOptionValue(name, value)
    solver.passModel(lp)
    return solver
