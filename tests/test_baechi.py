"""Baechi's placers (m-TOPO, m-ETF, m-SCT): memory, colocation, schedules worked by hand, the LP."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import devplace as dp
from devplace.cluster import Cluster, Device, uniform_cluster
from devplace.errors import OutOfMemoryError
from devplace.graph import GraphBuilder
from devplace.placers import check_feasible
from devplace.placers._listsched import mean_edge_us, op_times_us, run_list_schedule
from devplace.placers._lp import round_favorites, solve_favorite_lp

ALGOS = ["m-topo", "m-etf", "m-sct"]


def diamond():
    """a -> b, a -> c, b -> d, c -> d; every edge 5 bytes (10 us on a 5 us + 1 B/us link)."""
    b = GraphBuilder(["gpu"])
    for name, t in [("a", 10), ("b", 20), ("c", 30), ("d", 10)]:
        b.add_op(name, compute_us=t, output_bytes=5)
    for s, d in [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]:
        b.add_edge(s, d, bytes=5)
    return b.build()


def test_m_etf_diamond_schedule_worked_by_hand():
    # bottom levels (mean edge 10 us): a 70, c 50, b 40, d 10.
    # step 0: a can start at 0 on both devices -> gpu0 [0, 10]
    # step 1: b and c start at 10 on gpu0, 20 on gpu1 (a's output travels 10 us); tie -> c (level 50)
    # step 2: b: gpu0 free at 40, gpu1 at 20 after the transfer -> gpu1 [20, 40]
    # step 3: d: gpu0: b's output arrives 40 + 10 = 50; gpu1: c's arrives 50 -> tie -> gpu0 [50, 60]
    g = diamond()
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=1, comm_model="parallel")
    devices, order, start, finish = run_list_schedule(g, c, algo="m-etf")
    assert devices.tolist() == [0, 1, 0, 0]
    assert start.tolist() == [0, 20, 10, 50]
    assert finish.tolist() == [10, 40, 40, 60]
    assert order.tolist() == [0, 2, 1, 3]
    p = dp.place(g, c, algo="m-etf")
    assert dp.simulate(g, c, p).step_time_us == 60.0
    assert dp.simulate(g, c, dp.place(g, c, algo="single")).step_time_us == 70.0


@pytest.mark.parametrize("comm_model, expected_us", [("parallel", 30.0), ("sequential", 40.0), ("duplex", 40.0)])
def test_scheduler_queues_transfers_on_the_channels(comm_model, expected_us):
    # three 10 us sources land on three devices; the sink on gpu0 needs two 10 us transfers, which
    # overlap on parallel links but queue on gpu0's one (receive) channel otherwise
    b = GraphBuilder(["gpu"])
    for name in ["s1", "s2", "s3", "t"]:
        b.add_op(name, compute_us=10, output_bytes=5)
    for s in ["s1", "s2", "s3"]:
        b.add_edge(s, "t", bytes=5)
    g = b.build()
    c = uniform_cluster(3, latency_us=5, bandwidth_bytes_per_us=1, comm_model=comm_model)
    devices, _, start, finish = run_list_schedule(g, c, algo="m-etf")
    assert devices.tolist() == [0, 1, 2, 0]
    assert finish.max() == expected_us
    assert dp.simulate(g, c, dp.place(g, c, algo="m-etf")).step_time_us == expected_us


def layered(n_layers=6, width=4, compute_us=100.0, edge_bytes=10.0, seed=0):
    rng = np.random.default_rng(seed)
    b = GraphBuilder(["gpu"])
    for layer in range(n_layers):
        for k in range(width):
            b.add_op(f"l{layer}_{k}", compute_us=float(rng.uniform(0.5, 1.5) * compute_us), output_bytes=edge_bytes)
            if layer:
                for j in rng.choice(width, size=2, replace=False):
                    b.add_edge(f"l{layer - 1}_{j}", f"l{layer}_{k}", bytes=edge_bytes)
    return b.build()


@pytest.mark.parametrize("comm_model", ["parallel", "sequential", "duplex"])
def test_list_schedulers_beat_one_device_when_transfers_are_cheap(comm_model):
    g = layered()
    c = uniform_cluster(4, latency_us=1, bandwidth_bytes_per_us=100, comm_model=comm_model)
    single = dp.simulate(g, c, dp.place(g, c, algo="single")).step_time_us
    for algo in ["m-etf", "m-sct"]:
        step = dp.simulate(g, c, dp.place(g, c, algo=algo)).step_time_us
        assert step < 0.5 * single, (algo, step, single)


def test_same_inputs_same_placement():
    g = layered(seed=3)
    c = uniform_cluster(3, latency_us=20, bandwidth_bytes_per_us=1, comm_model="sequential")
    for algo in ALGOS:
        p, q = dp.place(g, c, algo=algo, seed=1), dp.place(g, c, algo=algo, seed=1)
        assert p.devices.tolist() == q.devices.tolist()
        assert (p.priority is None and q.priority is None) or p.priority.tolist() == q.priority.tolist()


# ------------------------------------------------------------------ the LP and its rounding
@given(st.integers(0, 10_000), st.sampled_from([0.0, 0.1, 0.5]))
@settings(max_examples=40, deadline=None)
def test_rounding_never_gives_two_favorites(seed, low):
    # adversarial x: many edges at or below the threshold, as a loose LP solution could give
    rng = np.random.default_rng(seed)
    n, m = 12, 30
    src = rng.integers(0, n - 1, m)
    dst = src + 1 + rng.integers(0, n - 1 - src)
    x = np.where(rng.random(m) < 0.6, low * rng.random(m), rng.random(m))
    favorite = round_favorites(src, dst, x, n)
    children = favorite[favorite >= 0]
    assert len(children) == len(set(children.tolist())), "a child with two favorite parents"
    pairs = set(zip(src.tolist(), dst.tolist(), (x <= 0.1).tolist()))
    for u, v in enumerate(favorite.tolist()):
        if v >= 0:
            assert (u, v, True) in pairs, "a favorite that is not a low-x edge"


def plain_lp_makespan(g, p, cost):
    """The favorite-child LP exactly as Baechi (Jeon et al., SoCC 2020) states m-SCT's, no presolve: the oracle."""
    from scipy.optimize import linprog

    n, m = g.n_ops, g.n_edges
    rows = []
    for e, (i, j) in enumerate(zip(g.edge_src.tolist(), g.edge_dst.tolist())):
        row = np.zeros(m + n + 1)
        row[m + i], row[m + j], row[e] = 1.0, -1.0, cost[e]
        rows.append((row, -p[i]))
    for ends in (g.edge_src, g.edge_dst):
        for node in range(n):
            edges = np.flatnonzero(ends == node)
            row = np.zeros(m + n + 1)
            row[edges] = -1.0
            rows.append((row, -(len(edges) - 1.0)))
    for i in range(n):
        row = np.zeros(m + n + 1)
        row[m + i], row[-1] = 1.0, -1.0
        rows.append((row, -p[i]))
    objective = np.zeros(m + n + 1)
    objective[-1] = 1.0
    bounds = [(0, 1)] * m + [(0, None)] * (n + 1)
    result = linprog(objective, A_ub=np.array([r for r, _ in rows]), b_ub=np.array([b for _, b in rows]),
                     bounds=bounds, method="highs")
    return result.fun


@given(st.integers(0, 10_000))
@settings(max_examples=25, deadline=None)
def test_presolved_lp_has_the_plain_lps_optimum(seed):
    # zero-cost edges, chains and transitive edges are what the presolve removes: make many
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 14))
    b = GraphBuilder(["gpu"])
    for i in range(n):
        b.add_op(f"v{i}", compute_us=float(rng.integers(1, 30)))
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < (0.6 if j == i + 1 else 0.25):
                b.add_edge(f"v{i}", f"v{j}", bytes=float(rng.choice([0.0, 0.0, 5.0, 40.0])))
    g = b.build()
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=1)
    p, cost = op_times_us(g, c).mean(axis=1), mean_edge_us(g, c)
    x, s, w, status = solve_favorite_lp(g, p, cost)
    assert status == ("optimal" if g.n_edges else "no edges")   # a draw can leave no edge at all
    assert w == pytest.approx(plain_lp_makespan(g, p, cost), rel=1e-6, abs=1e-6)
    tol = 1e-6 * max(w, 1.0)      # and the full solution satisfies every row, dropped ones too
    assert np.all(s[g.edge_src] + p[g.edge_src] + cost * x <= s[g.edge_dst] + tol)
    assert np.all(s + p <= w + tol)


def test_highs_call_matches_linprog():
    from scipy import sparse
    from scipy.optimize import linprog

    from devplace.placers._lp import _run_highs

    # min -x0 - 2 x1  s.t.  x0 + x1 <= 4,  x1 - x0 <= 1,  0 <= x0 <= 3, x1 >= 0  ->  x = (1.5, 2.5)
    a_ub = sparse.csr_array(np.array([[1.0, 1.0], [-1.0, 1.0]]))
    bounds = np.array([[0.0, 3.0], [0.0, np.inf]])
    cost, b_ub = np.array([-1.0, -2.0]), np.array([4.0, 1.0])
    x = _run_highs(cost, a_ub, b_ub, bounds, 5.0)
    assert x == pytest.approx([1.5, 2.5])
    assert x == pytest.approx(linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs").x)
    infeasible = sparse.csr_array(np.array([[1.0, 0.0]]))      # x0 <= -1 with x0 >= 0
    assert _run_highs(np.zeros(2), infeasible, np.array([-1.0]), bounds, 5.0) is None


def test_a_failed_highs_window_still_gives_a_strict_json_placement_file(tmp_path, monkeypatch):
    import json

    from devplace.placers import _lp

    monkeypatch.setattr(_lp, "_run_highs", lambda *args: None)  # as when HiGHS hits its time limit
    g = layered(n_layers=4, width=2, edge_bytes=50.0)
    placement = dp.place(g, uniform_cluster(2, latency_us=10, bandwidth_bytes_per_us=1), algo="m-sct")
    assert placement.options["lp_status"].startswith("HiGHS failed on 1 of 1 windows")
    placement.save(tmp_path / "p.json", g)

    def refuse(constant):
        raise AssertionError(f"{constant} in the placement file")

    data = json.loads((tmp_path / "p.json").read_text(), parse_constant=refuse)
    assert data["options"]["lp_makespan_us"] is None
    assert dp.Placement.load(tmp_path / "p.json").devices.tolist() == placement.devices.tolist()


def test_a_placement_holding_nan_is_refused_at_save_naming_the_option(tmp_path):
    from devplace.errors import PlacementError

    placement = dp.Placement(devices=[0, 1], algorithm="mine", options={"fine": 1.0, "score": [1.0, float("nan")]})
    with pytest.raises(PlacementError, match=r"'mine': option 'score' is not a finite number"):
        placement.save(tmp_path / "p.json")
    with pytest.raises(PlacementError, match=r"'manual': priority is not a finite number"):
        dp.Placement(devices=[0, 1], priority=[0.0, float("inf")]).save(tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()


def test_implied_rows_are_exactly_the_transitively_redundant_edges():
    import networkx as nx
    from devplace.placers._lp import _implied_free_edges

    rng = np.random.default_rng(3)
    n = 70                                   # more than one 64-bit word of reachability
    pairs = sorted({(int(i), int(j)) for i, j in rng.integers(0, n, (300, 2)) if i < j})
    src, dst = np.array(pairs).T
    implied = _implied_free_edges(n, src, dst, np.ones(len(src), dtype=bool))
    reduced = nx.transitive_reduction(nx.DiGraph(pairs))
    assert implied.tolist() == [not reduced.has_edge(i, j) for i, j in pairs]


def test_m_sct_lp_ignores_transfers_inside_a_colocation_group():
    from devplace.placers.m_sct import lp_edge_us

    b = GraphBuilder(["gpu"])
    for name, group in [("a", "g"), ("b", "g"), ("c", None)]:
        b.add_op(name, compute_us=1.0, colocation=group)
    b.add_edge("a", "b", bytes=100)
    b.add_edge("b", "c", bytes=100)
    g = b.build()
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=1)
    assert lp_edge_us(g, c).tolist() == [0.0, mean_edge_us(g, c)[1]] and mean_edge_us(g, c)[1] > 0


def test_lp_solution_satisfies_its_constraints():
    g = layered(n_layers=5, width=3, edge_bytes=50.0)
    c = uniform_cluster(2, latency_us=10, bandwidth_bytes_per_us=1)
    p, cost = op_times_us(g, c).mean(axis=1), mean_edge_us(g, c)
    x, s, w, status = solve_favorite_lp(g, p, cost)
    assert status == "optimal"
    tol = 1e-6 * w
    assert np.all(s[g.edge_src] + p[g.edge_src] + cost * x <= s[g.edge_dst] + tol)
    assert np.all(s + p <= w + tol)
    for ptr, order in ((g.succ_ptr, g.succ_edge), (g.pred_ptr, g.pred_edge)):
        for i in range(g.n_ops):
            edges = order[ptr[i] : ptr[i + 1]]
            assert x[edges].sum() >= len(edges) - 1 - 1e-6
    # cut into windows along the topological order, edges between windows are never favorites
    xw, _, _, status = solve_favorite_lp(g, p, cost, window_ops=5)
    assert "windows" in status
    window = np.empty(g.n_ops, dtype=np.int64)
    window[g.topo_order] = np.arange(g.n_ops) * 3 // g.n_ops
    assert np.all(xw[window[g.edge_src] != window[g.edge_dst]] == 1.0)
    # the relaxation is a lower bound on a schedule with every transfer paid or avoided
    assert w <= dp.simulate(g, c, dp.place(g, c, algo="single")).step_time_us + tol


# ------------------------------------------------------------------ memory and colocation
@st.composite
def graph_and_cluster(draw):
    n = draw(st.integers(2, 18))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    b = GraphBuilder(["gpu"])
    n_groups = draw(st.integers(0, 3))
    for i in range(n):
        group = int(rng.integers(-1, n_groups)) if n_groups else -1
        b.add_op(f"op{i}", compute_us=float(rng.uniform(1, 50)),
                 persistent_bytes=float(rng.choice([0, rng.uniform(0, 1000)])),
                 output_bytes=float(rng.uniform(0, 500)), temp_bytes=float(rng.choice([0, rng.uniform(0, 300)])),
                 colocation=None if group < 0 else f"g{group}")
    for j in range(1, n):
        for i in rng.choice(j, size=min(j, int(rng.integers(0, 3))), replace=False):
            nbytes = float(rng.choice([0, rng.uniform(1, 500)]))
            b.add_edge(f"op{i}", f"op{j}", bytes=nbytes, order_only=nbytes == 0 and (i + j) % 2 == 0)
    g = b.build()
    n_dev = draw(st.integers(1, 4))
    need = float((g.persistent_bytes + g.output_bytes + g.temp_bytes).sum())
    slack = draw(st.sampled_from([0.6, 1.2, 2.0, 4.0]))
    c = uniform_cluster(n_dev, memory_bytes=max(1.0, slack * need / n_dev), latency_us=float(rng.uniform(0, 20)),
                        bandwidth_bytes_per_us=float(rng.uniform(1, 50)),
                        comm_model=draw(st.sampled_from(["parallel", "sequential", "duplex"])))
    return g, c


@given(graph_and_cluster())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_placements_fit_memory_and_keep_groups_together(case):
    g, c = case
    for algo in ALGOS:
        try:
            p = dp.place(g, c, algo=algo, check=False)
        except OutOfMemoryError as exc:
            assert "GiB" in str(exc) and algo in str(exc)
            continue
        assert p.colocation_violations(g) == []
        result = dp.simulate(g, c, p)
        assert result.fits, (algo, result.peak_memory_bytes - c.memory_bytes)
        check_feasible(g, c, p)


def test_ample_memory_always_places():
    g = layered(seed=5)
    c = uniform_cluster(3, memory_bytes=1e9)
    for algo in ALGOS:
        assert len(dp.place(g, c, algo=algo)) == g.n_ops


def test_group_goes_where_its_whole_footprint_fits():
    # Baechi checks a group against its ops placed so far: 'a' (10 B) fits gpu0, its partner 'z'
    # (500 B) does not. The whole group must go to gpu1, which holds both.
    b = GraphBuilder(["gpu"])
    b.add_op("a", compute_us=1, persistent_bytes=10, colocation="G")
    b.add_op("m", compute_us=1, persistent_bytes=10)
    b.add_op("z", compute_us=1, persistent_bytes=500, colocation="G")
    b.add_edge("a", "m")
    b.add_edge("m", "z")
    g = b.build()
    lat, bw = np.zeros((2, 2)), np.full((2, 2), 1.0)
    c = Cluster("uneven", [Device("small", "gpu", 100.0), Device("big", "gpu", 1000.0)], "parallel", lat, bw)
    for algo in ALGOS:
        p = dp.place(g, c, algo=algo)
        assert p.devices[0] == p.devices[2] == 1, algo


def test_m_topo_fills_devices_in_turn_within_capacity():
    g = layered(n_layers=8, width=2)   # 16 ops, 10 output bytes each
    c = uniform_cluster(4, memory_bytes=1e6)
    devices = dp.place(g, c, algo="m-topo").devices
    ranks = g.topo_rank
    # contiguous runs in topological order, each device used
    by_rank = devices[np.argsort(ranks)]
    assert (np.diff(by_rank) >= 0).all() and set(by_rank.tolist()) == {0, 1, 2, 3}


def test_impossible_memory_names_what_is_needed():
    b = GraphBuilder(["gpu"])
    b.add_op("embedding", compute_us=1, persistent_bytes=3 * 2**30, colocation="emb")
    b.add_op("embedding_grad", compute_us=1, persistent_bytes=2 * 2**30, colocation="emb")
    b.add_op("small", compute_us=1, persistent_bytes=2**20)
    b.add_edge("embedding", "small")
    b.add_edge("small", "embedding_grad")
    g = b.build()
    c = uniform_cluster(4, memory_bytes=4 * 2**30)   # 16 GiB in all, but the group needs 5
    for algo in ALGOS:
        with pytest.raises(OutOfMemoryError) as info:
            dp.place(g, c, algo=algo)
        text = str(info.value)
        assert "largest colocation group 'emb' 5.000 GiB" in text
        assert "'embedding' 3.000 GiB" in text and "4.000 GiB" in text


def test_running_out_while_placing_is_a_clean_error():
    # each op fits alone and the total fits, but received copies make every split too big
    b = GraphBuilder(["gpu"])
    for name in ["a", "b", "c"]:
        b.add_op(name, compute_us=1, output_bytes=60)
    b.add_edge("a", "b", bytes=60)
    b.add_edge("b", "c", bytes=60)
    g = b.build()
    c = uniform_cluster(2, memory_bytes=100)
    for algo in ALGOS:
        with pytest.raises(OutOfMemoryError, match="found no device with room for op"):
            dp.place(g, c, algo=algo)
