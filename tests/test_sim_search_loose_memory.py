"""sim-search's looser-memory track: under tight memory it searches with more memory, repairs that
best into the real memory and anneals from there; the result fits, is the same for the same seed and
is never slower than without the track. No rounds run from a repaired start far behind the best, and
no track runs inside the canonical caps' searches."""

import numpy as np
import pytest

import devplace as dp
from devplace.cluster import uniform_cluster

# bert_l-3_training (600 ops); target_gap 0 keeps the gap "wide", small_graph_op_evals lets the track run
SMALL = {"max_evals": 60, "max_rounds": 1, "small_graph_op_evals": 2e5, "layer_descent_evals": 0,
         "layer_search_evals": 0, "target_gap": 0.0, "coarse_mip_groups": 0, "grad_block_evals": 0,
         "virtual_caps": (), "loose_memory_factor": 2.0, "loose_memory_rounds": 1, "seeds": ("m-topo",),
         "loose_memory_start_behind": 10.0}     # rounds from any repaired start


@pytest.fixture(scope="module")
def bert():
    g = dp.load_graph(dp.example_path("bert_l-3_training.json"))
    one_device_peak = dp.simulate(g, uniform_cluster(1), [0] * g.n_ops).peak_memory_bytes[0]
    return g, one_device_peak


def test_the_track_searches_with_more_memory_and_anneals_its_repaired_best(bert):
    g, one_device_peak = bert
    c = uniform_cluster(4, memory_bytes=0.4 * one_device_peak)
    runs = [dp.place(g, c, "sim-search", seed=2, **SMALL) for _ in range(2)]
    report = runs[0].options["loose_memory"]
    assert report["rounds"] == 1 and report["start_us"] is not None
    assert min(report["memory_gib"]) * 2**30 > c.memory_bytes.max()     # the inner search had more memory
    assert report["loose_evals"] > 0 and runs[0].options["evals"] > report["loose_evals"]
    assert np.array_equal(runs[0].devices, runs[1].devices) and runs[0].options == runs[1].options
    result = dp.simulate(g, c, runs[0])
    assert result.fits and result.step_time_us == pytest.approx(runs[0].options["step_us"])
    without = dp.place(g, c, "sim-search", seed=2, **{**SMALL, "loose_memory_factor": 1.0})
    assert without.options["loose_memory"] == {}
    assert runs[0].options["step_us"] <= without.options["step_us"]
    # a repaired start further behind the best than loose_memory_start_behind gets no rounds
    behind = dp.place(g, c, "sim-search", seed=2, **{**SMALL, "loose_memory_start_behind": -1.0})
    assert behind.options["loose_memory"]["rounds"] == 0 and "start_behind_us" in behind.options["loose_memory"]


def test_no_track_inside_the_canonical_caps_searches(bert):
    """Above the canonical caps the capped searches' memory (0.7 and 0.9 x the one-device peak) is
    below that peak, so each would run the track, a whole search more per cap: they run without it."""
    g, one_device_peak = bert
    c = uniform_cluster(4, memory_bytes=1.2 * one_device_peak)
    p = dp.place(g, c, "sim-search", seed=2, **SMALL, canonical_caps=(0.7, 0.9), canonical_cap_min_ops=0)
    assert len(p.options["capped_step_us"]) == 2
    assert p.options["loose_memory"] == {}


def test_the_fastest_of_several_repair_proposals_keeps_the_repaired_start_faster(bert):
    """The looser best repaired by the fastest of 24 proposals a step starts faster than by the first
    proposal that lowers (overflow, step time), and still fits (bert at 0.4 x peak: 472.6 against 627.9 ms)."""
    g, one_device_peak = bert
    c = uniform_cluster(4, memory_bytes=0.4 * one_device_peak)
    one, many = (dp.place(g, c, "sim-search", seed=2, **{**SMALL, "loose_memory_repair_candidates": k})
                 for k in (1, 24))
    assert many.options["loose_memory"]["start_us"] < one.options["loose_memory"]["start_us"]
    assert dp.simulate(g, c, many).fits
