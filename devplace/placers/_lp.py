"""The favorite-child LP of SCT (Hanen & Munier), relaxed as Baechi does, and its rounding.

Variables: ``x_e`` in [0, 1] per edge (0: the edge's consumer is its producer's favorite child and
runs right after it on the same device, so the transfer is not paid), ``s_i`` >= 0 per op, makespan
``w``. Constraints, with p_i the op's mean compute time and c_e the edge's mean transfer time:

- s_i + p_i + c_e x_e <= s_j for each edge e = (i, j)
- sum of x_e over i's out-edges >= out_degree(i) - 1   (at most one favorite child)
- sum of x_e over j's in-edges >= in_degree(j) - 1     (at most one favorite parent)
- s_i + p_i <= w for each op without successors (the others are bounded through their successors)

Minimise w. The matrix is built sparse and solved by HiGHS (the ``highspy`` package).

>>> import numpy as np
>>> round_favorites(np.array([0, 0]), np.array([1, 2]), np.array([0.0, 0.05]), 3).tolist()
[1, -1, -1]
"""

from __future__ import annotations

import numpy as np
from numba import njit
from scipy import sparse

from devplace.placers._highs import highs_solver

FAVORITE_THRESHOLD = 0.1   # Baechi's code: x <= 0.1 means favorite


# LP columns (ops plus edges that move data) per window. Dual simplex time grows much faster than
# the LP: on a 20k-op random layered DAG, windows of 3,000 columns (1,000 ops) take 0.5 s CPU in
# all, windows of 2,500 ops 2.6 s; 5,000 ops take 0.27 s in windows, 1.2 s whole
# (benchmarks/placement_time.py --msct).
WINDOW_COLUMNS = 3000


def solve_favorite_lp(graph, time_us: np.ndarray, edge_us: np.ndarray, *, time_limit_s: float = 120.0,
                      window_ops: int | None = None):
    """Solve the LP; returns (x per edge, s per op, w, status). ``x`` is 1 where HiGHS failed, and
    ``w`` is None if it failed on any window (there is then no makespan to report, and a NaN would
    make the placement file invalid JSON).

    An LP of more than ``WINDOW_COLUMNS`` columns (ops plus edges with a transfer time; edges that
    cost nothing get no column) is cut along the topological order into windows of equal op counts
    (or of ``window_ops`` ops if given), solved one by one: an edge between two windows is never a
    favorite (x = 1), ``s`` is per window and ``w`` is the largest window's makespan. Solver time
    then grows linearly with the graph; a smaller LP is solved whole, to its exact optimum."""
    n, m = graph.n_ops, graph.n_edges
    x = np.ones(m)
    s = np.zeros(n)
    if m == 0:
        return x, s, float(time_us.max(initial=0.0)), "no edges"
    if window_ops is None:
        n_windows = max(1, -(-(n + int((edge_us > 0).sum())) // WINDOW_COLUMNS))
    else:
        n_windows = max(1, -(-n // window_ops))
    window = np.empty(n, dtype=np.int64)
    window[graph.topo_order] = np.arange(n) * n_windows // n
    bounds = np.searchsorted(window[graph.topo_order], np.arange(n_windows + 1))
    local = np.empty(n, dtype=np.int64)        # position in its window, in topological order
    local[graph.topo_order] = np.arange(n) - bounds[window[graph.topo_order]]
    inside = window[graph.edge_src] == window[graph.edge_dst]
    by_window = np.argsort(window[graph.edge_src[inside]], kind="stable")
    inside_edges = np.flatnonzero(inside)[by_window]
    edge_bounds = np.searchsorted(window[graph.edge_src[inside_edges]], np.arange(n_windows + 1))
    makespan, failed = 0.0, 0
    for k in range(n_windows):
        ops = graph.topo_order[bounds[k] : bounds[k + 1]]
        edges = inside_edges[edge_bounds[k] : edge_bounds[k + 1]]
        result = _solve(len(ops), local[graph.edge_src[edges]], local[graph.edge_dst[edges]],
                        time_us[ops], edge_us[edges], time_limit_s / n_windows)
        if result is None:
            failed += 1
            continue
        x[edges], s[ops], w = result
        makespan = max(makespan, w)
    status = "optimal" if not failed else f"HiGHS failed on {failed} of {n_windows} windows"
    if n_windows > 1:
        status += f" ({n_windows} windows)"
    return x, s, makespan if not failed else None, status


def _solve(n, src, dst, time_us, edge_us, time_limit_s):
    """One LP over ops 0..n-1 (numbered in topological order) and the given edges; (x, s, w), or
    None if HiGHS did not finish.

    Presolved by hand before HiGHS sees it (same optimum, about half the time on GNMT): an edge
    that moves no data (c_e = 0) has x_e = 1, as raising it loosens the degree rows and costs
    nothing; counting only the other edges, an edge that is its producer's only out-edge and its
    consumer's only in-edge has x_e = 0. Either way its row is s_j >= s_i + p_i with no variable,
    and it is dropped when another path from i to j implies it."""
    m = len(src)
    if m == 0:
        return np.ones(0), np.zeros(n), float(time_us.max(initial=0.0))
    x = np.ones(m)
    costly = edge_us > 0
    out_degree = np.bincount(src[costly], minlength=n)    # degrees count costly edges only
    in_degree = np.bincount(dst[costly], minlength=n)
    free = costly & (out_degree[src] == 1) & (in_degree[dst] == 1)
    x[free] = 0.0
    var = costly & ~free                    # edges that keep a variable
    row_edges = np.flatnonzero(~_implied_free_edges(n, src, dst, ~var))
    n_var = int(var.sum())
    x_col = np.full(m, -1, dtype=np.int64)
    x_col[var] = np.arange(n_var)
    s_col = n_var + np.arange(n)
    w_col = n_var + n
    rows, cols, vals, rhs = [], [], [], []
    # s_i - s_j + c_e x_e <= -p_i  (a fixed x_e is 0 or multiplies c_e = 0)
    e, r = row_edges, np.arange(len(row_edges))
    with_x = var[e]
    rows += [r, r, r[with_x]]
    cols += [s_col[src[e]], s_col[dst[e]], x_col[e[with_x]]]
    vals += [np.ones(len(e)), -np.ones(len(e)), edge_us[e[with_x]]]
    rhs.append(-time_us[src[e]])
    next_row = len(e)
    for ends in (src, dst):   # at most one favorite child, at most one favorite parent
        degree = np.bincount(ends[var], minlength=n)    # a node with a free edge has degree 1
        nodes = np.flatnonzero(degree >= 2)
        row_of = np.full(n, -1)
        row_of[nodes] = next_row + np.arange(len(nodes))
        chosen = var & (degree[ends] >= 2)
        rows.append(row_of[ends[chosen]])
        cols.append(x_col[chosen])
        vals.append(-np.ones(int(chosen.sum())))
        rhs.append(-(degree[nodes] - 1.0))
        next_row += len(nodes)
    sinks = np.flatnonzero(np.bincount(src, minlength=n) == 0)
    sink_rows = next_row + np.arange(len(sinks))
    rows += [sink_rows, sink_rows]
    cols += [s_col[sinks], np.full(len(sinks), w_col)]
    vals += [np.ones(len(sinks)), -np.ones(len(sinks))]
    rhs.append(-time_us[sinks])
    next_row += len(sinks)
    a_ub = sparse.csr_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(next_row, n_var + n + 1)
    )
    cost = np.zeros(n_var + n + 1)
    cost[w_col] = 1.0
    bounds = np.zeros((n_var + n + 1, 2))
    bounds[:n_var, 1] = 1.0
    bounds[n_var:, 1] = np.inf
    solution = _run_highs(cost, a_ub, np.concatenate(rhs), bounds, max(1.0, time_limit_s))
    if solution is None:
        return None
    x[var] = solution[:n_var]
    return x, solution[n_var : n_var + n], float(solution[w_col])


def _run_highs(cost, a_ub, b_ub, bounds, time_limit_s):
    """min cost.x subject to a_ub x <= b_ub and bounds: x, or None unless HiGHS proved it optimal.

    A dual simplex with devex pricing (fastest here)."""
    import highspy

    solver = highs_solver(a_ub, cost, bounds[:, 0], bounds[:, 1], np.full(a_ub.shape[0], -np.inf), b_ub,
                          time_limit=float(time_limit_s), solver="simplex",
                          simplex_strategy=1,                     # dual simplex
                          simplex_dual_edge_weight_strategy=1)    # devex pricing
    solver.run()
    if solver.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return np.asarray(solver.getSolution().col_value)


@njit(cache=True)
def _implied_free_edges(n, src, dst, free):
    """Which ``free`` edges i -> j have another path from i to j (ops numbered in topological order;
    ``free`` marks the edges whose row has no variable).

    Such a path gives s_j >= s_i + p_i on its own (every step adds p >= 0 and c x >= 0), and the
    transitively redundant edges of a DAG can all go at once without losing a path."""
    words = (n + 63) // 64
    reach = np.zeros((n, words), np.uint64)      # bit v of row u: v is reachable from u
    order = np.argsort(src)
    ptr = np.zeros(n + 1, np.int64)
    for e in range(src.shape[0]):
        ptr[src[e] + 1] += 1
    for u in range(n):
        ptr[u + 1] += ptr[u]
    for u in range(n - 1, -1, -1):
        for k in range(ptr[u], ptr[u + 1]):
            v = dst[order[k]]
            reach[u, v >> 6] |= np.uint64(1) << np.uint64(v & 63)
            for w in range(words):
                reach[u, w] |= reach[v, w]
    implied = np.zeros(src.shape[0], np.bool_)
    for e in range(src.shape[0]):
        if not free[e]:
            continue
        u, v = src[e], dst[e]
        for k in range(ptr[u], ptr[u + 1]):
            w = dst[order[k]]
            if w != v and (reach[w, v >> 6] >> np.uint64(v & 63)) & np.uint64(1):
                implied[e] = True
                break
    return implied


def round_favorites(edge_src, edge_dst, x, n_ops: int, threshold: float = FAVORITE_THRESHOLD) -> np.ndarray:
    """Favorite child of each op (-1: none) from the LP's x.

    Edges with x <= threshold are taken smallest x first (then edge index), skipping any that would
    give an op a second favorite child or a child a second favorite parent: the LP's degree
    constraints already forbid that up to solver tolerance, the rounding guarantees it."""
    favorite = np.full(n_ops, -1, dtype=np.int64)
    has_parent = np.zeros(n_ops, dtype=bool)
    candidates = np.flatnonzero(x <= threshold)
    for e in candidates[np.argsort(x[candidates], kind="stable")]:
        u, v = int(edge_src[e]), int(edge_dst[e])
        if favorite[u] < 0 and not has_parent[v]:
            favorite[u] = v
            has_parent[v] = True
    return favorite
