"""The order descent (sim_search/order_descent.py): single ops moved in the best's schedule order."""

import numpy as np

from devplace.cluster import uniform_cluster
from devplace.graph import GraphBuilder
from devplace.portfolio.sim_search.config import SearchConfig
from devplace.portfolio.sim_search.order_descent import HOW, _order_descent, positions
from devplace.portfolio.sim_search.search import Found, _Search
from devplace.sim import Simulator


def _sender_or_chain():
    """Device 0 may run X (10 us, then X2 10 us there) or Y (1 us, whose output crosses in 5 us to
    Z, 13 us on device 1) first: Y first ends the step at 21 us, X, X2, then Y at 39 us."""
    b = GraphBuilder(["gpu"])
    for name, us in [("X", 10.0), ("X2", 10.0), ("Y", 1.0), ("Z", 13.0)]:
        b.add_op(name, compute_us=us)
    b.add_edge("X", "X2", bytes=4.0)
    b.add_edge("Y", "Z", bytes=4.0, fixed_us=5.0)
    graph = b.build()
    devices = np.array([0 if n != "Z" else 1 for n in graph.names])
    return graph, uniform_cluster(2, comm_model="sequential"), devices


def test_positions_keep_the_order():
    graph, cluster, devices = _sender_or_chain()
    sim = Simulator(graph, cluster)
    rng = np.random.default_rng(0)
    for priority in [None, rng.random(graph.n_ops), np.zeros(graph.n_ops)]:
        assert sim.step_time_us(devices, positions(priority, graph.topo_rank)) == sim.step_time_us(devices, priority)


def _descended(evals: int):
    """The descent from X, X2, then Y on device 0 (39 us; Y first gives 21 us)."""
    graph, cluster, devices = _sender_or_chain()
    search = _Search(graph, cluster, SearchConfig(order_descent_evals=evals), seed=3)
    x_first = np.array([0.0 if n == "X" else 1.0 for n in graph.names])
    search.best = Found(search.sim.step_time_us(devices, x_first), devices, x_first, "start")
    _order_descent(search, bound_us=1.0)
    return search


def test_the_descent_sends_first_and_only_offers():
    search = _descended(50)
    assert search.best.step_us == 21.0 and search.best.how == HOW
    assert search.order_descent_report["before_us"] == 39.0 and search.order_descent_report["evals"] == 50
    assert search.sim.step_time_us(search.best.devices, search.best.priority) == 21.0
    assert _descended(50).best.priority.tolist() == search.best.priority.tolist()       # the seed decides
    assert _descended(0).best.step_us == 39.0 and not _descended(0).order_descent_report
