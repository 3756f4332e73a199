"""The favorite-child LP of SCT (Hanen & Munier), relaxed as Baechi does, and its rounding.

Variables: ``x_e`` in [0, 1] per edge (0: the edge's consumer is its producer's favorite child and
runs right after it on the same device, so the transfer is not paid), ``s_i`` >= 0 per op, makespan
``w``. Constraints, with p_i the op's mean compute time and c_e the edge's mean transfer time:

- s_i + p_i + c_e x_e <= s_j for each edge e = (i, j)
- sum of x_e over i's out-edges >= out_degree(i) - 1   (at most one favorite child)
- sum of x_e over j's in-edges >= in_degree(j) - 1     (at most one favorite parent)
- s_i + p_i <= w for each op without successors (the others are bounded through their successors)

Minimise w. The matrix is built sparse and solved by HiGHS through ``scipy.optimize.linprog``.

>>> import numpy as np
>>> round_favorites(np.array([0, 0]), np.array([1, 2]), np.array([0.0, 0.05]), 3).tolist()
[1, -1, -1]
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

FAVORITE_THRESHOLD = 0.1   # Baechi's code: x <= 0.1 means favorite


WINDOW_OPS = 2500   # HiGHS solves this many ops in about a second; a 20k-op LP takes minutes


def solve_favorite_lp(graph, time_us: np.ndarray, edge_us: np.ndarray, *, time_limit_s: float = 120.0,
                      window_ops: int = WINDOW_OPS):
    """Solve the LP; returns (x per edge, s per op, w, status). ``x`` is 1 where HiGHS failed.

    A graph larger than ``window_ops`` is cut along its topological order into windows solved one
    by one: an edge between two windows is never a favorite (x = 1), ``s`` is per window and ``w``
    is the largest window's makespan. Solver time then grows linearly with the graph."""
    n, m = graph.n_ops, graph.n_edges
    x = np.ones(m)
    s = np.zeros(n)
    if m == 0:
        return x, s, float(time_us.max(initial=0.0)), "no edges"
    n_windows = max(1, -(-n // window_ops))
    window = np.empty(n, dtype=np.int64)
    window[graph.topo_order] = np.arange(n) * n_windows // n
    makespan, failed = 0.0, 0
    for k in range(n_windows):
        ops = np.flatnonzero(window == k)
        local = np.full(n, -1, dtype=np.int64)
        local[ops] = np.arange(len(ops))
        edges = np.flatnonzero((window[graph.edge_src] == k) & (window[graph.edge_dst] == k))
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
    return x, s, makespan if not failed else float("nan"), status


def _solve(n, src, dst, time_us, edge_us, time_limit_s):
    """One LP over ops 0..n-1 and the given edges; (x, s, w), or None if HiGHS did not finish."""
    m = len(src)
    if m == 0:
        return np.ones(0), np.zeros(n), float(time_us.max(initial=0.0))
    x_col = np.arange(m)
    s_col = m + np.arange(n)
    w_col = m + n
    rows, cols, vals, rhs = [], [], [], []
    edge_row = np.arange(m)
    # s_i - s_j + c_e x_e <= -p_i
    rows += [edge_row, edge_row, edge_row]
    cols += [s_col[src], s_col[dst], x_col]
    vals += [np.ones(m), -np.ones(m), edge_us]
    rhs.append(-time_us[src])
    next_row = m
    for ends in (src, dst):   # at most one favorite child, at most one favorite parent
        degree = np.bincount(ends, minlength=n)
        nodes = np.flatnonzero(degree >= 2)
        row_of = np.full(n, -1)
        row_of[nodes] = next_row + np.arange(len(nodes))
        chosen = degree[ends] >= 2
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
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(next_row, m + n + 1)
    )
    cost = np.zeros(m + n + 1)
    cost[w_col] = 1.0
    bounds = np.zeros((m + n + 1, 2))
    bounds[:m, 1] = 1.0
    bounds[m:, 1] = np.inf
    result = linprog(cost, A_ub=a_ub, b_ub=np.concatenate(rhs), bounds=bounds, method="highs",
                     options={"time_limit": max(1.0, time_limit_s)})
    if result.x is None or result.status != 0:
        return None
    return result.x[:m], result.x[m : m + n], float(result.x[w_col])


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
