"""Incremental re-simulation (devplace/sim/incremental.py): after any sequence of moves, the kept run
equals a full simulation of the same placement float for float."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_simulator import random_case  # random DAGs, every communication model, gaps, message overheads

from devplace.cluster import uniform_cluster
from devplace.errors import PlacementError
from devplace.graph import chain_graph
from devplace.placement import Placement
from devplace.sim import IncrementalSimulator, Simulator


def assert_same(incremental: IncrementalSimulator, full) -> None:
    got = incremental.result()
    assert incremental.step_time_us == full.step_time_us
    for field in ("start_us", "finish_us", "ready_us", "cause", "previous_on_device", "transfer_op", "transfer_src",
                  "transfer_dst", "transfer_start_us", "transfer_end_us", "transfer_bytes", "peak_memory_bytes",
                  "first_overflow_op"):
        np.testing.assert_array_equal(getattr(got, field), getattr(full, field), err_msg=field)
    assert got.oom_devices == full.oom_devices
    np.testing.assert_array_equal(incremental.peak_memory_bytes, full.peak_memory_bytes)


@st.composite
def moves_case(draw):
    g, c, devices, priority = draw(random_case())
    # memory from ample down to a few bytes: the OOM flag and first overflow must agree too
    c = dataclasses.replace(c, devices=[dataclasses.replace(d, memory_bytes=draw(st.sampled_from([4.0, 30.0, 2e3, 8e9])))
                                        for d in c.devices])
    n, n_dev = g.n_ops, c.n_devices
    moves = draw(st.lists(st.tuples(st.lists(st.integers(0, n - 1), max_size=3), st.integers(0, n_dev - 1)),
                          max_size=8))
    every = draw(st.sampled_from([1, 2, 5, 32]))
    return g, c, devices, priority, moves, every


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(moves_case())
def test_moves_give_the_full_simulation_float_for_float(case):
    g, c, devices, priority, moves, every = case
    sim = Simulator(g, c)
    incremental = IncrementalSimulator(g, c, Placement(devices=devices, priority=priority), checkpoint_every=every)
    assert_same(incremental, sim.run(Placement(devices=devices, priority=priority)))
    devices = devices.copy()
    for ops, device in moves:
        incremental.move(ops, device)
        devices[ops] = device
        assert_same(incremental, sim.run(Placement(devices=devices, priority=priority)))


def test_a_late_move_reruns_only_the_end_and_a_no_op_move_nothing():
    g = chain_graph([10.0] * 100, edge_bytes=100.0)
    incremental = IncrementalSimulator(g, uniform_cluster(2, latency_us=1.0), np.zeros(100, dtype=np.int64),
                                       checkpoint_every=4)
    incremental.move([0], 0)
    assert incremental.resimulated_ops == 0
    incremental.move([97], 1)      # its producer finishes at 970: the checkpoint at dispatch 96 is before it
    assert incremental.resimulated_ops == 100 - 96
    assert incremental.step_time_us == Simulator(g, uniform_cluster(2, latency_us=1.0)).step_time_us(
        np.array([0] * 97 + [1] + [0] * 2))
    incremental.move([0], 1)       # an op without inputs is queued at time 0: everything again
    assert incremental.resimulated_ops == 4 + 100


@pytest.mark.parametrize("ops, device, field", [([5], 0, "op 5"), ([0], 2, "device 2"), ([-1], 0, "op -1")])
def test_bad_moves_name_the_op_or_device(ops, device, field):
    incremental = IncrementalSimulator(chain_graph([1.0] * 3), uniform_cluster(2), [0, 0, 0])
    with pytest.raises(PlacementError, match=field):
        incremental.move(ops, device)
