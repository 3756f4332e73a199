"""m-SCT's favorite-child LP: solved whole (to the plain LP's optimum) while it is small, in windows
sized by its columns when it is large."""

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import sparse
from scipy.optimize import linprog

import devplace as dp
from devplace.cluster import load_cluster
from devplace.placers._listsched import op_times_us
from devplace.placers._lp import WINDOW_COLUMNS, solve_favorite_lp
from devplace.placers.m_sct import lp_edge_us

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from placement_time import random_layered_dag  # noqa: E402


def plain_lp_makespan(graph, p, cost) -> float:
    """The LP as the _lp docstring writes it, every row and column kept, sparse (an independent
    oracle for graphs of hundreds of ops)."""
    n, m = graph.n_ops, graph.n_edges
    src, dst = graph.edge_src, graph.edge_dst
    e = np.arange(m)
    rows = [np.concatenate([e, e, e])]                      # s_i - s_j + c x <= -p_i
    cols = [np.concatenate([m + src, m + dst, e])]
    vals = [np.concatenate([np.ones(m), -np.ones(m), cost])]
    rhs = [-p[src]]
    for offset, ends in ((m, src), (m + n, dst)):           # -sum x <= -(degree - 1)
        rows.append(offset + ends)
        cols.append(e)
        vals.append(-np.ones(m))
        rhs.append(-(np.bincount(ends, minlength=n) - 1.0))
    rows.append(m + 2 * n + np.arange(n))                   # s_i + p_i <= w
    rows.append(m + 2 * n + np.arange(n))
    cols += [m + np.arange(n), np.full(n, m + n)]
    vals += [np.ones(n), -np.ones(n)]
    rhs.append(-p)
    a_ub = sparse.csr_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                            shape=(m + 3 * n, m + n + 1))
    objective = np.zeros(m + n + 1)
    objective[-1] = 1.0
    bounds = [(0, 1)] * m + [(0, None)] * (n + 1)
    return linprog(objective, A_ub=a_ub, b_ub=np.concatenate(rhs), bounds=bounds, method="highs").fun


def _lp_inputs(graph):
    cluster = load_cluster("baechi-4x2080").with_memory_fraction(1000.0)
    return op_times_us(graph, cluster).mean(axis=1), lp_edge_us(graph, cluster)


@pytest.mark.parametrize("n_ops, seed", [(400, 0), (900, 1), (900, 2)])
def test_an_lp_under_the_window_budget_is_solved_whole_to_the_plain_lps_optimum(n_ops, seed):
    graph = random_layered_dag(n_ops, seed=seed)
    p, cost = _lp_inputs(graph)
    assert graph.n_ops + (cost > 0).sum() <= WINDOW_COLUMNS
    x, s, w, status = solve_favorite_lp(graph, p, cost)
    assert status == "optimal"
    assert w == pytest.approx(plain_lp_makespan(graph, p, cost), rel=1e-7)


def test_a_large_lp_is_cut_into_windows_by_its_columns():
    """3,000 ops of a random layered DAG make about 8,800 columns: three windows. The same ops with
    free edges (inside colocation groups, say) make 3,000 columns and fewer windows."""
    graph = random_layered_dag(3000, seed=0)
    p, cost = _lp_inputs(graph)
    columns = graph.n_ops + int((cost > 0).sum())
    expected = -(-columns // WINDOW_COLUMNS)
    x, s, w, status = solve_favorite_lp(graph, p, cost)
    assert status == f"optimal ({expected} windows)" and expected >= 3
    window = np.empty(graph.n_ops, dtype=np.int64)
    window[graph.topo_order] = np.arange(graph.n_ops) * expected // graph.n_ops
    assert np.all(x[window[graph.edge_src] != window[graph.edge_dst]] == 1.0)
    _, _, _, free_status = solve_favorite_lp(graph, p, np.zeros_like(cost))
    assert free_status == "optimal"


def test_m_sct_on_a_large_layered_dag_uses_windows_and_fits():
    graph = random_layered_dag(4000, seed=3)
    cluster = load_cluster("baechi-4x2080").with_memory_fraction(1000.0)
    placement = dp.place(graph, cluster, algo="m-sct")
    assert "windows" in placement.options["lp_status"]
    assert placement.options["favorite_children"] > graph.n_ops // 3
    assert dp.simulate(graph, cluster, placement).fits


def test_a_device_kept_for_a_favorite_child_takes_another_op_only_if_urgent():
    """a (on gpu0) has favorite child f, which also waits for v. At 10 us v can start on either
    device; gpu0 is kept for f and v is not urgent there (gpu1 starts it as early), so v goes to
    gpu1, where plain ETF takes gpu0 (the lower index on a tie). Then f follows a on gpu0 after
    v's 51 us transfer."""
    from devplace.cluster import uniform_cluster
    from devplace.graph import GraphBuilder
    from devplace.placers._listsched import run_list_schedule

    b = GraphBuilder(["gpu"])
    for name in ("a", "r", "v", "f"):
        b.add_op(name, compute_us=10.0)
    for src, dst, nbytes in (("a", "f", 100.0), ("r", "v", 0.0), ("v", "f", 1.0)):
        b.add_edge(src, dst, bytes=nbytes)
    graph = b.build()
    cluster = uniform_cluster(2, latency_us=50.0, bandwidth_bytes_per_us=1.0)
    favorite = np.full(graph.n_ops, -1)
    favorite[graph.index("a")] = graph.index("f")
    kept = run_list_schedule(graph, cluster, algo="m-sct", favorite=favorite)
    plain = run_list_schedule(graph, cluster, algo="m-etf")
    where = lambda schedule: {n: (int(schedule[0][i]), float(schedule[2][i])) for i, n in enumerate(graph.names)}  # noqa: E731
    assert where(kept) == {"a": (0, 0.0), "r": (1, 0.0), "v": (1, 10.0), "f": (0, 71.0)}
    assert where(plain) == {"a": (0, 0.0), "r": (1, 0.0), "v": (0, 10.0), "f": (0, 20.0)}
