"""sim-search's folded stage track: where the saved activations need every device, the step is cut
into stages where little crosses, one device holding the first stage and the last; the plans
respect each device's memory, the track's start fits, repeats by seed and never makes the result
slower, and the track stays out where the activations leave a device free."""

import numpy as np
import pytest

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.graph import GraphBuilder, Role
from devplace.portfolio.sim_search.stages import device_patterns, stage_plans

SMALL = {"max_evals": 100, "max_rounds": 1, "small_graph_op_evals": 0, "virtual_caps": (), "canonical_caps": (),
         "layer_descent_evals": 0, "layer_search_evals": 0, "coarse_mip_groups": 0, "target_gap": 0.0, "closed_gap": 0.0,
         "stage_plans": 24, "stage_rounds": 1}
MB = 1e6


def test_a_pattern_gives_every_device_a_stage_and_one_device_a_second_one_apart_from_it():
    four = np.full(4, 8.0)
    assert device_patterns(four, 4) == [(0, 1, 2, 3)]
    five = device_patterns(four, 5)     # one device holds two stages that are not neighbours
    assert len(five) == 6 and (0, 1, 2, 3, 0) in five
    assert all(len(set(p)) == 4 and all(a != b for a, b in zip(p[:-1], p[1:])) for p in five)
    assert device_patterns(np.array([1.0, 2.0]), 3) == [(1, 0, 1)]      # the largest first
    assert len(device_patterns(np.full(9, 1.0), 10)) == 36              # few on a large cluster


def test_the_cheapest_plan_folds_where_no_consecutive_cut_fits():
    # two early units hold most bytes; the cheap boundaries are after the first and before the last
    held = np.array([3.0, 3.0, 1.0, 1.0, 1.0]) * MB
    crossing_us = np.array([0.0, 1.0, 10.0, 10.0, 1.0, 0.0])
    memory = np.full(2, 5.5 * MB)
    plans = stage_plans(held, np.zeros(5), crossing_us, memory, candidates=8)
    # no two consecutive stages fit (6 MB on one side at best): only plans of three stages
    assert plans and all(len(pattern) == 3 for _, _, _, pattern in plans)
    cost, fullest, cuts, pattern = plans[0]
    assert (cost, cuts, pattern) == (2.0, (1, 4), (0, 1, 0))
    assert fullest == pytest.approx(5.0 / 5.5)          # device 1 holds units 1-3
    # a gradient the last unit of that stage makes on top of its held bytes no longer fits there
    gradient = np.array([0.0, 0.0, 0.0, 1.0, 0.0]) * MB
    assert (1, 4) not in [plan[2] for plan in stage_plans(held, gradient, crossing_us, memory, candidates=8)]


def _conv_like_chain(held_mb=(3.0, 3.0, 1.0, 1.0, 2.0), edge_mb=(0.001, 3.0, 3.0, 0.001)):
    """A training chain whose first layers save the most bytes (``held_mb``, read by their backward
    op) and pass on ``edge_mb`` (the first and last small, as after a CNN's stem and in its last layers)."""
    b = GraphBuilder(["gpu"])
    n = len(held_mb)
    for k in range(n):
        b.add_op(f"f{k}", compute_us=100.0, output_bytes=held_mb[k] * MB)
        if k:
            b.add_edge(f"f{k - 1}", f"f{k}", bytes=edge_mb[k - 1] * MB)
    for k in reversed(range(n)):
        b.add_op(f"b{k}", compute_us=200.0, output_bytes=1e3, role=Role.BACKWARD, mirror=f"f{k}")
        b.add_edge(f"f{k}", f"b{k}", bytes=held_mb[k] * MB)
        if k < n - 1:
            b.add_edge(f"b{k + 1}", f"b{k}", bytes=edge_mb[k] * MB)
    return b.build()


def _cluster(memory_mb: float):
    return uniform_cluster(2, memory_bytes=memory_mb * MB, bandwidth_bytes_per_us=1e4, comm_model="sequential")


def test_the_track_starts_from_a_folded_plan_that_fits_the_same_for_the_same_seed():
    g, c = _conv_like_chain(), _cluster(6.5)     # folded: 6.0 MB a device; consecutive: 6.0 or 7.0 MB at a cut
    runs = [dp.place(g, c, "sim-search", seed=2, **SMALL) for _ in range(2)]
    report = runs[0].options["stages"]
    assert report["plans"] >= 1 and report["rounds"] == 1
    assert "on devices [0, 1, 0]" in report["start"]
    assert report["best_us"] <= report["start_us"]
    assert np.array_equal(runs[0].devices, runs[1].devices) and runs[0].options["stages"] == report
    result = dp.simulate(g, c, runs[0])
    assert result.fits and result.step_time_us == pytest.approx(runs[0].options["step_us"])
    without = dp.place(g, c, "sim-search", seed=2, **{k: v for k, v in SMALL.items() if k != "stage_plans"})
    assert runs[0].options["step_us"] <= without.options["step_us"]
    assert without.options["stages"] == {}        # off by default


def test_the_track_stays_out_where_the_saved_activations_leave_a_device_free():
    g = _conv_like_chain()      # 10 MB held: three devices of 6.5 MB leave one free (the best is 0.3 us over the bound)
    cluster = uniform_cluster(3, memory_bytes=6.5 * MB, bandwidth_bytes_per_us=1e4, comm_model="sequential")
    report = dp.place(g, cluster, "sim-search", seed=2, **SMALL).options["stages"]
    assert report == {"held_gib": pytest.approx(10.0 * MB / 2**30, abs=1e-4)}
