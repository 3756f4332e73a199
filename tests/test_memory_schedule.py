"""Baechi's placers with memory followed over the schedule they build (``_memory.ScheduleMemory``):
every placement they return fits in simulation, and they place where the never-freeing model cannot."""

import dataclasses
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.errors import OutOfMemoryError
from devplace.graph import GraphBuilder
from devplace.placement import Placement
from devplace.placers import _memory
from test_baechi import graph_and_cluster

ALGOS = ["m-topo", "m-etf", "m-sct"]


def one_device_peak(g) -> float:
    return float(dp.simulate(g, uniform_cluster(1, memory_bytes=1e30), [0] * g.n_ops).peak_memory_bytes[0])


def training_chain(layers=8, activation_bytes=1000.0, weight_bytes=100.0):
    """Forward layers keep their activation for their backward op, as a training step does."""
    b = GraphBuilder(["gpu"])
    for k in range(layers):
        b.add_op(f"f{k}", compute_us=100.0, output_bytes=activation_bytes, persistent_bytes=weight_bytes)
        if k:
            b.add_edge(f"f{k - 1}", f"f{k}", bytes=activation_bytes)
    for k in reversed(range(layers)):
        b.add_op(f"b{k}", compute_us=200.0, output_bytes=activation_bytes)
        b.add_edge(f"f{k}", f"b{k}", bytes=activation_bytes)
        if k < layers - 1:
            b.add_edge(f"b{k + 1}", f"b{k}", bytes=activation_bytes)
    return b.build()


@st.composite
def graph_and_tight_cluster(draw):
    """test_baechi's random graphs and links, every device at a drawn fraction of the one-device peak."""
    g, c = draw(graph_and_cluster())
    fraction = draw(st.sampled_from([0.3, 0.45, 0.6, 0.8, 1.0, 1.5]))
    return g, c.with_memory_fraction(max(fraction * one_device_peak(g), 1.0) / float(c.memory_bytes[0]))


@given(graph_and_tight_cluster())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_placement_returned_fits_in_simulation(case):
    g, c = case
    for algo in ALGOS:
        try:
            p = dp.place(g, c, algo=algo, check=False)   # the placer's own word, not place()'s check
        except OutOfMemoryError:
            continue
        assert p.options["memory_model"] in ("schedule", "never-free")
        assert p.colocation_violations(g) == []
        assert dp.simulate(g, c, p).fits, (algo, p.options)


@given(graph_and_tight_cluster(), st.integers(0, 2**31))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_never_freeing_model_fits_in_simulation_when_views_and_weights_cross(case, seed):
    """The sound model alone (no attempt over the schedule, so no simulation check): a view or a
    weight owns no output bytes, but a device it is sent to holds the bytes sent."""
    g, c = case
    viewlike = np.random.default_rng(seed).random(g.n_ops) < 0.5
    g = dataclasses.replace(g, output_bytes=np.where(viewlike, 0.0, g.output_bytes))
    with mock.patch.object(_memory, "SCHEDULE_ATTEMPTS", 0):
        for algo in ALGOS:
            try:
                p = dp.place(g, c, algo=algo, check=False)
            except OutOfMemoryError:
                continue
            assert p.options["memory_model"] == "never-free"
            assert dp.simulate(g, c, p).fits, (algo, dp.simulate(g, c, p).peak_memory_bytes - c.memory_bytes)


@pytest.mark.parametrize("algo", ALGOS)
def test_placers_fit_where_the_never_freeing_model_cannot(algo, monkeypatch):
    g = training_chain()
    c = uniform_cluster(4, memory_bytes=0.6 * one_device_peak(g), bandwidth_bytes_per_us=1e3)
    p = dp.place(g, c, algo=algo)
    assert p.options["memory_model"] == "schedule" and dp.simulate(g, c, p).fits
    assert len(set(p.devices.tolist())) >= 2
    monkeypatch.setattr(_memory, "SCHEDULE_ATTEMPTS", 0)   # main's accounting alone refuses it
    with pytest.raises(OutOfMemoryError):
        dp.place(g, c, algo=algo)


def test_ample_memory_gives_the_same_placement_as_the_never_freeing_model(monkeypatch):
    g = training_chain()
    c = uniform_cluster(4, memory_bytes=1e9, bandwidth_bytes_per_us=1e3)
    tracked = {algo: dp.place(g, c, algo=algo).devices for algo in ALGOS}
    monkeypatch.setattr(_memory, "SCHEDULE_ATTEMPTS", 0)
    for algo in ALGOS:
        assert np.array_equal(tracked[algo], dp.place(g, c, algo=algo).devices), algo


def test_an_overflow_in_simulation_lowers_the_budget_then_falls_back_to_the_sound_model():
    g = training_chain(layers=2)          # 4 ops: f0 f1 b1 b0
    c = uniform_cluster(2, memory_bytes=0.98 * one_device_peak(g))
    overflowing, fitting = [1, 1, 1, 1], [0, 1, 1, 0]
    assert not dp.simulate(g, c, overflowing).fits and dp.simulate(g, c, fitting).fits
    budgets = []

    def run(budget, fits_below):
        """A stand-in placer: it overflows device 1 while its budget is at least ``fits_below``."""
        budgets.append(None if budget is None else budget.copy())
        if budget is not None and budget[1] >= fits_below * c.memory_bytes[1]:
            return Placement(devices=np.array(overflowing))
        return Placement(devices=np.array(fitting))

    p = _memory.place_within_memory(g, c, lambda budget: run(budget, 0.8))
    assert p.devices.tolist() == fitting and p.options["memory_model"] == "schedule"
    assert p.options["memory_attempts"] == len(budgets) >= 2
    assert budgets[0].tolist() == c.memory_bytes.tolist()
    assert budgets[-1][0] == c.memory_bytes[0] and budgets[-1][1] < 0.8 * c.memory_bytes[1]   # device 1 only
    budgets.clear()
    p = _memory.place_within_memory(g, c, lambda budget: run(budget, 0.0))   # never fits over the schedule
    assert p.devices.tolist() == fitting and p.options["memory_model"] == "never-free"
    assert budgets[-1] is None and len(budgets) == _memory.SCHEDULE_ATTEMPTS + 1
