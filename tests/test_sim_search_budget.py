"""sim-search's budget follows the gap to the certified lower bound: more rounds while it is wide,
none once the bound is met; evaluation counts only, so a seed still fixes the result."""

import pytest

import devplace as dp
from devplace.bounds import lower_bounds
from devplace.cluster import uniform_cluster
from devplace.errors import PlacementError
from devplace.graph import chain_graph
from devplace.io.dnn_partitioning import cluster_for
from devplace.portfolio.sim_search import SearchConfig

# resnet50_inference on its 9 devices of 600 MiB: the best placement is ~40% above the bound
FAST = {"max_evals": 60, "seeds": ("fx-size-partition",), "pipeline_starts": False}


@pytest.fixture(scope="module")
def wide_gap():
    g = dp.load_graph(dp.example_path("resnet50_inference.json"))
    return g, cluster_for(g)


@pytest.mark.parametrize("factor", [2, SearchConfig().small_graph_round_factor])
def test_a_small_graph_gets_up_to_factor_times_the_rounds_while_the_gap_is_wide(wide_gap, factor):
    """604 ops: 60 evals x 604 ops is far under small_graph_op_evals, so rounds go past max_rounds while the gap
    stays above the target, up to small_graph_round_factor times as many; with small_graph_op_evals=0 exactly
    max_rounds run."""
    g, c = wide_gap
    capped = dp.place(g, c, "sim-search", max_rounds=2, small_graph_op_evals=0, **FAST)
    small = dp.place(g, c, "sim-search", max_rounds=2, small_graph_round_factor=factor, **FAST)
    assert capped.options["rounds"] == 2 and capped.options["gap"] > 0.10
    assert 2 < small.options["rounds"] <= 2 * factor and small.options["step_us"] <= capped.options["step_us"]
    assert small.options["rounds"] == 2 * factor or small.options["gap"] <= 0.10


def test_rounds_go_on_while_the_gap_is_above_the_target(wide_gap):
    g, c = wide_gap
    one = dp.place(g, c, "sim-search", max_rounds=1, small_graph_op_evals=0, **FAST)
    three = dp.place(g, c, "sim-search", max_rounds=3, small_graph_op_evals=0, **FAST)
    assert one.options["gap"] > 0.10 and one.options["rounds"] == 1
    assert three.options["rounds"] == 3 and three.options["stopped_by"] == "evals"
    assert three.options["evals"] >= one.options["evals"] + 2 * FAST["max_evals"]
    assert three.options["step_us"] <= one.options["step_us"]       # later rounds start from the best
    bound_us = lower_bounds(g, c)["best_us"]
    assert three.options["lower_bound_us"] == pytest.approx(bound_us)
    assert three.options["gap"] == pytest.approx(three.options["step_us"] / bound_us - 1)


def test_a_gap_under_the_target_ends_after_one_round(wide_gap):
    g, c = wide_gap
    p = dp.place(g, c, "sim-search", max_rounds=3, target_gap=10.0, **FAST)
    assert p.options["rounds"] == 1 and p.options["gap"] < 10.0


def test_rounds_are_reproducible(wide_gap):
    g, c = wide_gap
    runs = [dp.place(g, c, "sim-search", seed=4, max_rounds=2, **FAST) for _ in range(2)]
    assert runs[0].devices.tolist() == runs[1].devices.tolist()
    assert runs[0].options["evals"] == runs[1].options["evals"]


@pytest.mark.parametrize("first_start_rounds", [1, 2, 3])
def test_the_first_rounds_from_the_best_start_begin_there(wide_gap, monkeypatch, first_start_rounds):
    """Rounds 1, 3, 5, ... (counted from 1) begin at the best so far, but the first ``first_start_rounds``
    of them at the best start (the best seed), each on where the random stream left off."""
    from devplace.portfolio.sim_search import anneal

    g, c = wide_gap
    starts, run = [], anneal._anneal

    def recording(search, start):
        starts.append(start)
        return run(search, start)

    monkeypatch.setattr(anneal, "_anneal", recording)
    p = dp.place(g, c, "sim-search", max_rounds=6, small_graph_op_evals=0, first_start_rounds=first_start_rounds,
                 **FAST)
    assert p.options["rounds"] == 6 == len(starts)
    first = starts[0]
    for k in (2, 4):    # the third and fifth rounds
        from_first = starts[k][1] is first[1]
        assert from_first == (k < 2 * first_start_rounds)
        if not from_first:
            assert starts[k][0] < first[0]     # the best so far, better than the start by then


def test_a_placement_at_the_bound_stops_the_search():
    g, c = chain_graph([5.0, 1.0, 3.0, 2.0], edge_bytes=1e6), uniform_cluster(2)
    stopped = dp.place(g, c, "sim-search", max_evals=500, seeds=("single",))
    assert stopped.options["step_us"] == pytest.approx(11.0) and stopped.options["gap"] == pytest.approx(0.0)
    assert stopped.options["stopped_by"] == "bound" and stopped.options["rounds"] == 0
    full = dp.place(g, c, "sim-search", max_evals=500, seeds=("single",), closed_gap=0.0)
    assert full.options["rounds"] == 1 and full.options["evals"] >= 500 > stopped.options["evals"]


@pytest.mark.parametrize("option", [{"max_rounds": 0}, {"small_graph_round_factor": 0}, {"target_gap": -0.1},
                                    {"closed_gap": float("nan")}])
def test_bad_round_options_are_refused_by_name(option):
    with pytest.raises(PlacementError, match=next(iter(option))):
        dp.place(chain_graph([1.0, 2.0]), uniform_cluster(2), "sim-search", max_evals=5, **option)


def test_the_cheapest_cut_start_splits_a_chain_at_its_cheapest_edge():
    """Four 10 us ops in a chain whose persistent bytes need two devices: the cheapest-cut start cuts
    at the 1 us edge, not at the byte-balanced middle (a 50 us edge)."""
    from devplace.graph import GraphBuilder

    b = GraphBuilder(["gpu"])
    for name, mib in (("a", 3), ("b", 3), ("c", 3), ("d", 3)):
        b.add_op(name, compute_us=10.0, persistent_bytes=mib * 2**20)
    for src, dst, us in (("a", "b", 1.0), ("b", "c", 50.0), ("c", "d", 50.0)):
        b.add_edge(src, dst, fixed_us=us)
    g, c = b.build(), uniform_cluster(2, memory_bytes=10 * 2**20)
    p = dp.place(g, c, "sim-search", max_evals=0, seeds=("single",))
    assert p.options["cheapest_cut_starts"] == 1
    assert p.options["found_by"].startswith("cheapest-cut pipeline of 2 stages") and p.options["step_us"] == pytest.approx(41.0)
    assert p.devices[0] != p.devices[1] and len(set(p.devices[1:].tolist())) == 1


def test_the_cheapest_cut_start_cuts_a_training_step_where_little_crosses():
    """A training chain whose saved activations (3 MiB per layer, 12 MiB) need two 10 MiB devices:
    the cheapest-cut start puts the layers with their backward ops in two stages cut where the
    activation and its gradient cost 1 us each (after f3), not at the balanced middle (50 us each
    way); the step is the 8 ops' 80 us plus those two transfers."""
    from devplace.graph import GraphBuilder

    b, mib = GraphBuilder(["gpu"]), 2**20
    for i in range(1, 5):
        b.add_op(f"f{i}", compute_us=10.0, output_bytes=3 * mib)
    for i in range(4, 0, -1):
        b.add_op(f"b{i}", compute_us=10.0, role="backward", mirror=f"f{i}")
    for i, us in ((1, 50.0), (2, 50.0), (3, 1.0)):
        b.add_edge(f"f{i}", f"f{i + 1}", bytes=3 * mib, fixed_us=us)
        b.add_edge(f"b{i + 1}", f"b{i}", fixed_us=us)
    for i in range(1, 5):
        b.add_edge(f"f{i}", f"b{i}", bytes=3 * mib, fixed_us=50.0)
    g, c = b.build(), uniform_cluster(2, memory_bytes=10 * mib)
    p = dp.place(g, c, "sim-search", max_evals=0, seeds=("single",))
    assert p.options["found_by"].startswith("cheapest-cut pipeline of 2 stages")
    assert p.options["step_us"] == pytest.approx(82.0)
    stage = {name: int(p.devices[g.index_of[name]]) for name in ("f1", "f2", "f3", "f4", "b4", "b3")}
    assert stage["f1"] == stage["f2"] == stage["f3"] == stage["b3"] != stage["f4"] == stage["b4"]
