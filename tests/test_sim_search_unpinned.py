"""sim-search's unpinned capped start: a large output that a parameter's update pins (a zero-byte
edge keeps it alive until the update) is found with the update's group, moving that group off the
output's device frees it, and below the one canonical cap the start offers the capped search's
best so moved, no slower than without it and the same by seed."""

import numpy as np
import pytest

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.graph import GraphBuilder, Role
from devplace.portfolio.sim_search.config import SearchConfig
from devplace.portfolio.sim_search.search import _Search, one_device_peak_bytes
from devplace.portfolio.sim_search.unpinned import pinning_groups, unpinned
from devplace.sim import Simulator

MB = 1e6
# a graph this small counts as too large for every extra round (the one canonical cap) with these
SMALL = {"max_evals": 150, "max_rounds": 1, "small_graph_op_evals": 0, "canonical_cap_min_ops": 0,
         "virtual_caps": (), "layer_descent_evals": 0, "layer_search_evals": 0, "order_descent_evals": 0}


def _classifier(side_ops: int = 4):
    """A classifier: its product's 600 MB logits, a softmax and its gradient (600 MB each), the input
    and weight gradients, and the weight's update, which reads the logits over a zero-byte edge (an
    in-place write after every reader); beside it a chain of ``side_ops`` ops (300 MB each, all read
    at the end: on one device they sit beside the classifier) that another device can run."""
    sides = [f"side{k}" for k in range(side_ops)]
    ops = [  # name, us, inputs, output MB, role; "w" is the weight (60 MB held, colocated with its update)
        ("x", 1.0, [], 10, Role.FORWARD),
        *[(name, 40.0, [prev], 300, Role.FORWARD) for prev, name in zip(["x"] + sides, sides)],
        ("logits", 100.0, ["x", "w"], 600, Role.FORWARD),
        ("softmax", 20.0, ["logits"], 600, Role.FORWARD),
        ("softmax_grad", 30.0, ["softmax"], 600, Role.BACKWARD),
        ("x_grad", 100.0, ["softmax_grad", "w"], 10, Role.BACKWARD),
        ("side_sum", 10.0, sides + ["x_grad"], 0, Role.FORWARD),     # keeps every side output alive to the end
        ("w_grad", 100.0, ["softmax_grad", "x"], 60, Role.BACKWARD),
    ]
    b = GraphBuilder(["gpu"])
    b.add_op("w", compute_us=0.0, persistent_bytes=60 * MB, colocation="w", role=Role.OTHER)
    for name, us, inputs, output_mb, role in ops:
        b.add_op(name, compute_us=us, output_bytes=output_mb * MB, role=role)
        for src in inputs:
            b.add_edge(src, name, bytes=1e3)
    b.add_op("w_update", compute_us=5.0, colocation="w", role=Role.UPDATE)
    b.add_edge("w", "w_update", bytes=1e3)
    b.add_edge("w_grad", "w_update", bytes=1e3)
    b.add_edge("logits", "w_update", bytes=0.0)
    return b.build()


def test_a_large_output_is_pinned_by_the_update_that_reads_it_over_a_zero_byte_edge():
    g = _classifier()
    (output, ops), = pinning_groups(g, 100 * MB)
    assert g.names[output] == "logits"
    assert sorted(g.names[v] for v in ops) == ["w", "w_update"]
    assert pinning_groups(g, 700 * MB) == []


def test_moving_the_pinning_group_off_frees_the_output():
    g = _classifier()
    cluster = uniform_cluster(2, memory_bytes=1850 * MB, latency_us=1.0, bandwidth_bytes_per_us=1e4)
    search = _Search(g, cluster, SearchConfig(), 0)
    side = [v for v, name in enumerate(g.names) if name.startswith("side")]
    devices = np.zeros(g.n_ops, dtype=np.int64)
    devices[side] = 1
    # the classifier with its weight: the logits live until the update, beside the softmax and its gradient
    overflow, _, _ = search.measure(devices, None)
    assert overflow > 0
    sets = pinning_groups(g, search.config.unpin_min_share * float(cluster.memory_bytes.min()))
    overflow, step_us, moved, _ = unpinned(search, devices, None, sets)
    assert overflow == 0 and step_us < np.inf
    w = [g.names.index(n) for n in ("w", "w_update")]
    assert (moved[w] == 1).all() and moved[g.names.index("logits")] == 0
    assert (moved[[v for v in range(g.n_ops) if v not in w]] == devices[[v for v in range(g.n_ops) if v not in w]]).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_below_the_cap_the_start_runs_the_capped_search_and_never_slows(seed):
    g = _classifier()
    cluster = uniform_cluster(2, memory_bytes=1850 * MB, latency_us=1.0, bandwidth_bytes_per_us=1e4)
    assert cluster.memory_bytes.max() < 0.63 * one_device_peak_bytes(Simulator(g, cluster))   # below the cap
    with_start = dp.place(g, cluster, algo="sim-search", seed=seed, **SMALL)
    without = dp.place(g, cluster, algo="sim-search", seed=seed, unpinned_start=False, **SMALL)
    again = dp.place(g, cluster, algo="sim-search", seed=seed, **SMALL)
    assert "canonical_caps_gib" not in with_start.options       # below the cap: the search itself ran
    # the start ran the capped search: more evals, and a result no slower than without it
    assert with_start.options["evals"] > without.options["evals"]
    assert with_start.options["step_us"] <= without.options["step_us"]
    assert (again.devices == with_start.devices).all() and again.options["step_us"] == with_start.options["step_us"]
    result = dp.simulate(g, cluster, with_start)
    assert (result.peak_memory_bytes <= cluster.memory_bytes).all()
    # above the cap every memory gets the capped search and the same unpinned placement judged there
    ample = dp.place(g, cluster.with_memory_bytes(8 * 2**30), algo="sim-search", seed=seed, **SMALL)
    assert "canonical_caps_gib" in ample.options
    assert ample.options["step_us"] <= with_start.options["step_us"]
