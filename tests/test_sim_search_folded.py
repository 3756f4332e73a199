"""sim-search's folded pipeline start: where the saved activations need every device, the step is cut
with the first device holding the first stage and the last; plans respect each device's memory, the
boundaries are shifted and the units near them moved on the simulator's figures, the start fits and
repeats, and it stays out where the activations leave a device free."""

import numpy as np
import pytest

from devplace.cluster import uniform_cluster
from devplace.graph import GraphBuilder, Role
from devplace.portfolio.sim_search.config import SearchConfig
from devplace.portfolio.sim_search.folded import _folded_start, folded_plans
from devplace.portfolio.sim_search.search import _Search

MB = 1e6
SMALL = SearchConfig(max_evals=100, max_rounds=1, small_graph_op_evals=0, virtual_caps=(), canonical_caps=(),
                     layer_descent_evals=0, layer_search_evals=0, coarse_mip_groups=0)


def test_the_cheapest_plan_folds_where_no_consecutive_cut_fits():
    # two early units hold most bytes; the cheap boundaries are after the first unit and before the last
    held = np.array([3.0, 3.0, 1.0, 1.0, 1.0]) * MB
    crossing_us = np.array([0.0, 1.0, 10.0, 10.0, 1.0, 0.0])
    memory = np.full(2, 5.5 * MB)
    plans = folded_plans(held, np.zeros(5), crossing_us, memory, candidates=8, slack=1.0)
    cost, fullest, cuts, pattern = plans[0]
    assert (cost, cuts, pattern) == (2.0, (1, 4), (0, 1, 0))
    assert fullest == pytest.approx(5.0 / 5.5)          # device 1 holds units 1-3
    # a gradient the last unit of that stage makes on top of its held bytes no longer fits there
    gradient = np.array([0.0, 0.0, 0.0, 1.0, 0.0]) * MB
    assert (1, 4) not in [plan[2] for plan in folded_plans(held, gradient, crossing_us, memory, 8, slack=1.0)]
    # ... unless the plans may overstate the memory by the slack
    assert (1, 4) in [plan[2] for plan in folded_plans(held, gradient, crossing_us, memory, 8, slack=1.2)]


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


def _cluster(devices: int, memory_mb: float):
    return uniform_cluster(devices, memory_bytes=memory_mb * MB, bandwidth_bytes_per_us=1e4, comm_model="sequential")


def _offered(graph, cluster, seed: int = 2):
    search = _Search(graph, cluster, SMALL, seed)
    _folded_start(search)
    return search


def test_the_start_is_a_folded_plan_that_fits_the_same_for_the_same_seed():
    g, c = _conv_like_chain(), _cluster(2, 6.5)  # folded: 6.0 MB a device; consecutive: 6.0 or 7.0 MB at a cut
    first, again = _offered(g, c), _offered(g, c)
    step_us, devices, priority, how = first.best
    assert np.array_equal(devices, again.best[1]) and again.evals == first.evals > 0
    assert "folded pipeline start" in how and "on devices [0, 1, 0]" in how
    assert devices[0] == devices[4] == 0 and set(devices[1:4].tolist()) == {1}     # f0 and f4 on device 0
    overflow, measured_us, _ = first.measure(devices, priority)
    assert overflow == 0 and measured_us == pytest.approx(step_us)
    off = _Search(g, c, SearchConfig(**{**SMALL.__dict__, "folded_plans": 0}), 2)
    _folded_start(off)
    assert off.best[1] is None and off.evals == 0


def test_the_start_stays_out_where_the_saved_activations_leave_a_device_free():
    g = _conv_like_chain()      # 10 MB held: three devices of 6.5 MB leave one free
    search = _offered(g, _cluster(3, 6.5))
    assert search.evals == 0 and search.best[1] is None
