"""The channel rank orders (sim_search/channel_rank.py): the upward rank with transfers charged more."""

import numpy as np

from devplace.cluster import uniform_cluster
from devplace.graph import GraphBuilder
from devplace.placers._moves import upward_rank_us
from devplace.portfolio.sim_search.channel_rank import channel_rank_us
from devplace.portfolio.sim_search.config import SearchConfig
from devplace.portfolio.sim_search.search import _Search
from devplace.sim import Simulator


def _sender_or_chain():
    """Device 0 may run X (10 us, then X2 10 us there) or Y (1 us, whose output crosses in 5 us to
    Z, 13 us on device 1) first. The upward rank puts X first (20 > 1 + 5 + 13): the step ends at
    29 us. Charging the transfer twice puts Y first: 21 us."""
    b = GraphBuilder(["gpu"])
    for name, us in [("X", 10.0), ("X2", 10.0), ("Y", 1.0), ("Z", 13.0)]:
        b.add_op(name, compute_us=us)
    b.add_edge("X", "X2", bytes=4.0)
    b.add_edge("Y", "Z", bytes=4.0, fixed_us=5.0)
    graph = b.build()
    devices = np.array([0 if n != "Z" else 1 for n in graph.names])
    return graph, uniform_cluster(2, comm_model="sequential"), devices


def test_factor_one_is_the_upward_rank():
    graph, cluster, devices = _sender_or_chain()
    op_time_us = Simulator(graph, cluster).op_time_us
    assert np.allclose(channel_rank_us(graph, cluster, devices, op_time_us, 1.0),
                       upward_rank_us(graph, cluster, devices, op_time_us))


def test_a_larger_charge_sends_first():
    graph, cluster, devices = _sender_or_chain()
    sim = Simulator(graph, cluster)
    upward = -upward_rank_us(graph, cluster, devices, sim.op_time_us)
    charged = -channel_rank_us(graph, cluster, devices, sim.op_time_us, 2.0)
    assert sim.step_time_us(devices, upward) == 29.0
    assert sim.step_time_us(devices, charged) == 21.0


def _channel_orders(cluster, devices, graph, **options) -> list[str]:
    orders = _Search(graph, cluster, SearchConfig(**options), 0).orders(devices)
    return [name for name, _ in orders if name.startswith("channel rank")]


def test_the_search_tries_them_on_sequential_channels_only():
    graph, cluster, devices = _sender_or_chain()
    assert _channel_orders(cluster, devices, graph) == ["channel rank x2"]
    assert _channel_orders(cluster, devices, graph, channel_rank_factors=(2.0, 4.0)) == ["channel rank x2",
                                                                                          "channel rank x4"]
    assert _channel_orders(cluster, devices, graph, channel_rank_factors=()) == []
    assert _channel_orders(uniform_cluster(2, comm_model="parallel"), devices, graph) == []
