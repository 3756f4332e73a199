import numpy as np

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.graph import chain_graph


def test_chain_on_one_device_is_sum_of_times():
    g = chain_graph([10.0, 20.0, 30.0], edge_bytes=1000)
    assert dp.simulate(g, uniform_cluster(2), [0, 0, 0]).step_time_us == 60.0


def test_split_chain_pays_latency_and_bandwidth():
    g = chain_graph([10.0, 20.0, 30.0], edge_bytes=1000)
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100)
    # 10 + (5 + 1000/100) + 20 + 15 + 30
    assert dp.simulate(g, c, np.array([0, 1, 0])).step_time_us == 90.0
