"""The exact placer: its proven bound never exceeds the brute-force optimum, and where the simulator
has nothing the program leaves out (channel queues, message overheads, transient memory) it finds
the optimum."""

from dataclasses import replace

import numpy as np
import pytest

import devplace as dp
from devplace.errors import PlacementError
from devplace.io.dnn_partitioning import cluster_for
from devplace.placers import exact
from test_bounds import brute_force, tiny_instance

TOLERANCE = 1e-6


def _check(graph, cluster, placement):
    """The returned placement is valid and its recorded figures are what simulation says."""
    result = dp.simulate(graph, cluster, placement)
    assert result.fits
    o = placement.options
    assert o["step_us"] == pytest.approx(result.step_time_us)
    assert o["lower_bound_us"] >= o["mip_bound_us"]
    assert o["step_us"] >= o["lower_bound_us"] * (1 - TOLERANCE)
    return o


@pytest.mark.parametrize("seed", range(25))
def test_the_proven_bound_never_exceeds_the_brute_force_optimum(seed):
    graph, cluster = tiny_instance(seed)
    optimum = brute_force(graph, cluster)
    if optimum == np.inf:
        with pytest.raises(PlacementError):
            dp.place(graph, cluster, algo="exact", time_limit_s=10)
        return
    o = _check(graph, cluster, dp.place(graph, cluster, algo="exact", time_limit_s=10))
    assert o["mip_bound_us"] <= optimum * (1 + TOLERANCE)
    assert o["lower_bound_us"] <= optimum * (1 + TOLERANCE)


@pytest.mark.parametrize("seed", range(25))
def test_without_queues_overheads_or_transient_memory_it_finds_the_brute_force_optimum(seed):
    """Persistent memory only (as the bundled graphs), one channel per device pair, no overheads:
    the program is the simulator's problem, so its bound and its placement are both the optimum."""
    graph, cluster = tiny_instance(seed)
    graph = replace(graph, output_bytes=np.zeros(graph.n_ops), temp_bytes=np.zeros(graph.n_ops))
    cluster = replace(cluster, comm_model="parallel", send_overhead_us=None, recv_overhead_us=None)
    optimum = brute_force(graph, cluster)
    if optimum == np.inf:
        return
    o = _check(graph, cluster, dp.place(graph, cluster, algo="exact", time_limit_s=10))
    assert o["mip_status"] == "Optimal" and o["all_pairs"]
    assert o["step_us"] == pytest.approx(optimum, rel=TOLERANCE)
    assert o["mip_bound_us"] == pytest.approx(optimum, rel=TOLERANCE)


def test_without_a_first_incumbent_or_pairs_it_still_bounds():
    """No start placers: HiGHS finds its own incumbent. No disjunctive pairs: a weaker relaxation,
    whose bound must still hold."""
    graph, cluster = tiny_instance(3)
    optimum = brute_force(graph, cluster)
    o = _check(graph, cluster, dp.place(graph, cluster, algo="exact", start=(), time_limit_s=10))
    assert o["first_incumbent_us"] is None and o["mip_bound_us"] <= optimum * (1 + TOLERANCE)
    weak = _check(graph, cluster, dp.place(graph, cluster, algo="exact", max_pairs=0, time_limit_s=10))
    assert weak["disjunctive_pairs"] == 0 and not weak["all_pairs"]
    assert weak["mip_bound_us"] <= optimum * (1 + TOLERANCE)


def test_a_node_limit_stops_the_search_the_same_way_every_time():
    graph, cluster = tiny_instance(1, n_ops=9)     # needs more than 3 nodes to prove optimality
    runs = [dp.place(graph, cluster, algo="exact", max_nodes=3) for _ in range(2)]
    assert runs[0].options["mip_status"] != "Optimal"
    assert runs[0].devices.tolist() == runs[1].devices.tolist()
    assert runs[0].options["mip_bound_us"] == runs[1].options["mip_bound_us"]
    assert runs[0].options["mip_bound_us"] <= brute_force(graph, cluster) * (1 + TOLERANCE)


@pytest.mark.parametrize("seed", range(25))
def test_without_the_floor_at_devplaces_bound_the_bound_still_never_exceeds_the_brute_force_optimum(seed):
    graph, cluster = tiny_instance(seed)
    optimum = brute_force(graph, cluster)
    if optimum == np.inf:
        return
    o = _check(graph, cluster, dp.place(graph, cluster, algo="exact", time_limit_s=10, floor_at_bound=False))
    assert o["mip_bound_us"] <= optimum * (1 + TOLERANCE)


def test_the_floor_ties_what_the_program_tells_apart_without_it(monkeypatch):
    """tiny_instance(18): the program's optimum is 114 us, the simulated one 161 us. With devplace's
    bound as strong as it can be (161), W is held there and every placement the program puts at or
    under it ties; without the floor W is the program's own 114."""
    graph, cluster = tiny_instance(18)
    optimum = brute_force(graph, cluster)
    monkeypatch.setattr(exact, "lower_bounds", lambda graph, cluster: {"best_us": optimum})
    floored, own = (exact.solve_mip(graph, cluster, exact.ExactOptions(time_limit_s=np.inf, floor_at_bound=f), None)
                    for f in (True, False))
    assert floored.objective_us == pytest.approx(optimum)
    assert own.objective_us < optimum * 0.9
    assert own.mip_bound_us <= optimum * (1 + TOLERANCE)


def test_bad_options_are_refused_by_name():
    graph, cluster = tiny_instance(0)
    with pytest.raises(PlacementError, match="time_limit_s"):
        dp.place(graph, cluster, algo="exact", time_limit_s=0)
    with pytest.raises(PlacementError, match="'exact' itself"):
        dp.place(graph, cluster, algo="exact", start=("exact",))
    with pytest.raises(PlacementError, match="5 ops, more than max_ops = 4"):
        dp.place(graph, cluster, algo="exact", max_ops=4)


def test_a_bundled_graph_gets_a_placement_and_a_bound_within_the_time_limit():
    graph = dp.load_graph(dp.example_path("bert_l-3_inference.json"))
    cluster = cluster_for(graph)
    placement = dp.place(graph, cluster, algo="exact", time_limit_s=5)
    o = _check(graph, cluster, placement)
    assert o["step_us"] <= o["first_incumbent_us"]
    assert o["solve_s"] < 60
    # HiGHS starts from sim-search's placement (the default start)
    assert o["first_incumbent_us"] == pytest.approx(dp.place(graph, cluster, algo="sim-search").options["step_us"])


def test_compare_reports_the_bound_exact_proved():
    """Five 10 us ops on two devices: critical path 10, work / devices (and interval work) 25, but
    one device runs three of them, so 30 is optimal; the MIP proves it and compare's gap column
    measures against it. exact+opt proves its bound on the fused graph only, so compare does not
    take it."""
    from devplace.cluster import uniform_cluster
    from devplace.compare import compare
    from devplace.graph import GraphBuilder

    b = GraphBuilder(["gpu"])
    for name in "abcde":
        b.add_op(name, compute_us=10.0)
    graph, cluster = b.build(), uniform_cluster(2)
    assert dp.bounds.lower_bounds(graph, cluster)["best_us"] == pytest.approx(25.0)
    raised = compare(graph, cluster, algos=["single", "exact"]).lower_bound
    assert raised["best"] == "exact_mip_us" and raised["best_us"] == pytest.approx(30.0, rel=TOLERANCE)
    rows = {row.algorithm: row for row in compare(graph, cluster, algos=["single", "exact"]).rows}
    assert rows["exact"].gap_to_bound == pytest.approx(0.0, abs=TOLERANCE)
    assert rows["single"].gap_to_bound == pytest.approx(50.0 / 30.0 - 1.0, rel=TOLERANCE)
    fused = compare(graph, cluster, algos=["exact+opt"]).lower_bound
    assert fused["best_us"] == pytest.approx(25.0) and "exact_mip_us" not in fused


def test_compare_runs_exact_only_when_named():
    from devplace.compare import default_algos
    from devplace.placers import available

    assert "exact" in available() and not available()["exact"].by_default
    assert "exact" not in default_algos() and "m-sct" in default_algos()
