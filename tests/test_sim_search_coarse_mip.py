"""sim-search's coarse MIP start: the step coarsened to layer groups keeps every op and colocation
group, the program's placement expands to a valid one that the track anneals, the same seed gives the
same placement, and the track never makes the result slower."""

import numpy as np
import pytest

import devplace as dp
from devplace.graph import Role
from devplace.io.dnn_partitioning import cluster_for
from devplace.placers._moves import sources_late_order
from devplace.portfolio.sim_search.coarse_mip import coarse_step

# bert_l-3_training (600 ops) is ~5% above its bound: target_gap 0 keeps the gap "wide"
SMALL = {"max_evals": 60, "max_rounds": 1, "small_graph_op_evals": 0, "layer_descent_evals": 0,
         "layer_search_evals": 0, "target_gap": 0.0, "coarse_mip_min_ops": 0, "coarse_mip_groups": 6,
         "coarse_mip_nodes": 20, "coarse_mip_rounds": 1}


@pytest.fixture(scope="module")
def bert():
    g = dp.load_graph(dp.example_path("bert_l-3_training.json"))
    return g, cluster_for(g)


def test_the_coarse_step_keeps_every_op_its_time_and_what_it_holds(bert):
    g, c = bert
    coarse = coarse_step(g, c, np.argsort(sources_late_order(g)), 6)
    cg = coarse.graph
    assert len(coarse.coarse_of) == g.n_ops and cg.n_ops < g.n_ops / 10
    members = np.bincount(coarse.coarse_of, minlength=cg.n_ops)
    assert members.min() >= 1
    # time: the members' plus the gaps between them; bytes: persistent plus the saved activations
    assert cg.compute_us.sum() == pytest.approx(g.compute_us.sum() + (g.n_ops - cg.n_ops) * c.op_gap_us)
    saved = np.zeros(g.n_ops, bool)
    read_back = (g.role[g.edge_src] == Role.FORWARD) & (g.role[g.edge_dst] == Role.BACKWARD)
    saved[g.edge_src[read_back]] = True
    assert cg.persistent_bytes.sum() == pytest.approx(g.persistent_bytes.sum() + g.output_bytes[saved].sum())
    assert not cg.output_bytes.any() and not cg.temp_bytes.any()
    # six layer groups, each one colocation group of its pieces; an original colocation group stays in one
    group = np.where(cg.colocation >= 0, cg.colocation, cg.n_ops + np.arange(cg.n_ops))
    assert len(np.unique(group)) == 6
    op_group = group[coarse.coarse_of]
    for k in np.unique(g.colocation[g.colocation >= 0]):
        assert len(np.unique(op_group[g.colocation == k])) == 1


def test_the_track_anneals_a_valid_expanded_placement_the_same_for_the_same_seed(bert):
    g, c = bert
    runs = [dp.place(g, c, "sim-search", seed=3, **SMALL) for _ in range(2)]
    report = runs[0].options["coarse_mip"]
    assert report["rounds"] == 1 and report["expanded_us"] is not None and report["nodes"] <= 20
    assert np.array_equal(runs[0].devices, runs[1].devices)
    assert np.array_equal(runs[0].priority, runs[1].priority)
    assert runs[0].options["coarse_mip"] == runs[1].options["coarse_mip"]
    result = dp.simulate(g, c, runs[0])
    assert result.fits and result.step_time_us == pytest.approx(runs[0].options["step_us"])
    devices = runs[0].devices
    for k in np.unique(g.colocation[g.colocation >= 0]):
        assert len(np.unique(devices[g.colocation == k])) == 1


def test_the_track_never_makes_the_result_slower_and_runs_only_where_asked(bert):
    g, c = bert
    with_track = dp.place(g, c, "sim-search", seed=1, **SMALL)
    without = dp.place(g, c, "sim-search", seed=1, **(SMALL | {"coarse_mip_groups": 0}))
    assert with_track.options["step_us"] <= without.options["step_us"]
    assert without.options["coarse_mip"] == {}
    small = dp.place(g, c, "sim-search", seed=1, **(SMALL | {"coarse_mip_min_ops": g.n_ops + 1}))
    assert small.options["coarse_mip"] == {}
    assert np.array_equal(small.devices, without.devices)
