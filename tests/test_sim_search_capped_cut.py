"""sim-search's capped-search cut: where many-branch cells meet memory below the smallest canonical
cap, the search under the largest cap, its best cut in two at a point every forward path passes so that it
fits, and annealed; the track repeats by seed, fits, never makes the result slower and stays off
where the memory holds the cap."""

import numpy as np

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.portfolio.sim_search.capped_cut import _cheapest_cut, cut_prefixes
from devplace.portfolio.sim_search.config import SearchConfig
from devplace.portfolio.sim_search.search import _Search
from devplace.portfolio.sim_search.search import one_device_peak_bytes
from devplace.sim import Simulator
from test_sim_search_branches import BRANCHES, SMALL, _cell_step

# the branch track's small budgets, with canonical caps set (the graph is below canonical_cap_min_ops,
# so no canonical search runs) and a graph small enough for every extra round
CAPPED = SMALL | {"canonical_caps": (0.7, 0.9), "small_graph_op_evals": 2e8, "capped_cut_rounds": 1, "closed_gap": 0.0}


def test_cut_points_are_the_joins_every_forward_path_passes():
    g = _cell_step(cells=3)
    cuts = cut_prefixes(g)
    assert [g.names[op] for op, _ in cuts] == ["c0.concat", "c1.concat", "c2.concat"]
    first = {g.names[v] for v in cuts[0][1]}
    assert first == {"stem", "c0.concat"} | {f"c0.b{k}.{part}" for k in range(BRANCHES)
                                             for part in ("conv0", "stats", "conv1")}


def _tight(g, fraction: float):
    """Two GPUs, each with ``fraction`` x the step's one-device peak."""
    c = uniform_cluster(2)
    return c.with_memory_bytes(fraction * one_device_peak_bytes(Simulator(g, c)))


def test_the_track_runs_below_the_smallest_cap_repeats_by_seed_fits_and_never_slows():
    g = _cell_step()
    c = _tight(g, 0.65)
    runs = [dp.place(g, c, "sim-search", seed=1, **CAPPED) for _ in range(2)]
    report = runs[0].options["branches"]["capped_cut"]
    assert report["capped_evals"] > 0 and report["rounds"] == 1 and report["start"] is not None
    assert report["cut_points"] == 2 and report["track_evals"] > report["cut_points"]
    assert np.array_equal(runs[0].devices, runs[1].devices) and runs[0].options == runs[1].options
    assert dp.simulate(g, c, runs[0]).fits
    without = dp.place(g, c, "sim-search", seed=1, **(CAPPED | {"capped_cut_rounds": 0}))
    assert "capped_cut" not in without.options["branches"]
    assert runs[0].options["step_us"] <= without.options["step_us"]
    assert runs[0].options["evals"] == without.options["evals"] + report["capped_evals"] + report["track_evals"] + 1
    # memory at the smallest cap: the track does not run, and the search is the one without it
    c = _tight(g, 0.7)
    at_cap = dp.place(g, c, "sim-search", seed=1, **CAPPED)
    assert at_cap.options["branches"]["capped_cut"] == {}
    plain = dp.place(g, c, "sim-search", seed=1, **(CAPPED | {"capped_cut_rounds": 0}))
    assert np.array_equal(at_cap.devices, plain.devices) and at_cap.options["evals"] == plain.options["evals"]


def test_a_placement_over_memory_is_cut_where_its_prefix_fits_on_the_other_gpu():
    g = _cell_step()
    c = _tight(g, 0.6)
    track = _Search(g, c, SearchConfig(), 0)
    whole = np.zeros(g.n_ops, np.int64)             # one GPU: over 0.6 x the one-device peak
    assert not dp.simulate(g, c, whole).fits
    report = {}
    step_us, devices, priority, how = _cheapest_cut(track, whole, None, report)
    assert how.startswith("cut at c0.concat") and report["start"] == how and report["cut_points"] == 2
    cell0 = [i for i, name in enumerate(g.names) if name.startswith("c0.") or name.startswith("stem")]
    assert (devices[cell0] == 1).all() and (devices[[g.names.index("c1.concat"), g.names.index("loss")]] == 0).all()
    assert dp.simulate(g, c, dp.Placement(devices=devices, priority=priority)).fits
    assert step_us == dp.simulate(g, c, dp.Placement(devices=devices, priority=priority)).step_time_us
