"""Simulating a training step: the entry points around the compiled engine.

``Simulator`` binds a graph to a cluster once (per-device op times, adjacency) so that each further
call pays only for the event loop: learning placers call ``step_time_us`` tens of thousands of times.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> g = chain_graph([10.0, 20.0, 30.0])
>>> simulate(g, uniform_cluster(2), [0, 0, 0]).step_time_us
60.0
"""

from __future__ import annotations

import weakref

import numpy as np

from devplace.cluster import Cluster
from devplace.costing import costed_for
from devplace.graph import OpGraph
from devplace.placement import Placement, as_placement
from devplace.sim import engine
from devplace.sim.result import SimResult


class Simulator:
    """A graph bound to a cluster; ``run`` simulates one placement."""

    def __init__(self, graph: OpGraph, cluster: Cluster):
        self.graph = graph = costed_for(graph, cluster)  # times for this cluster's devices
        self.cluster = cluster
        kind_columns = [graph.kind_index(kind) for kind in cluster.device_kinds]
        self.op_time_us = np.ascontiguousarray(graph.compute_us[:, kind_columns])
        self.in_degree = np.diff(graph.pred_ptr).astype(np.int64)
        self.default_priority = graph.topo_rank.astype(np.float64)
        self.capacity = cluster.memory_bytes

    def _schedule(self, devices: np.ndarray, priority: np.ndarray | None):
        g, c = self.graph, self.cluster
        return engine.simulate_schedule(
            g.succ_ptr, g.succ_edge, g.edge_dst, g.edge_bytes, g.edge_fixed_us, self.in_degree,
            self.op_time_us, devices, self.default_priority if priority is None else priority,
            c.latency_us, c.bandwidth_bytes_per_us, c.comm_model_code, float(c.op_gap_us),
            c.send_overhead_us, c.recv_overhead_us,
        )

    def step_time_us(self, devices: np.ndarray, priority: np.ndarray | None = None) -> float:
        """Step time only, for search loops: no memory accounting, no SimResult.

        The check costs about a microsecond: a bad index would make the compiled loop read out of
        bounds, so it is never skipped."""
        n = self.graph.n_ops
        if not (type(devices) is np.ndarray and devices.dtype == np.int64 and devices.shape == (n,)
                and engine.devices_in_range(devices, self.cluster.n_devices)):
            devices = self._checked(devices)
        if priority is not None and not (type(priority) is np.ndarray and priority.dtype == np.float64
                                         and priority.shape == (n,)):
            priority = Placement(devices=devices, priority=priority).priority
        finish = self._schedule(devices, priority)[1]
        return float(finish.max()) if len(finish) else 0.0

    def _checked(self, devices) -> np.ndarray:
        placement = as_placement(devices, self.graph)
        placement.check(self.graph, self.cluster)
        return placement.devices

    def run(self, placement) -> SimResult:
        g, c = self.graph, self.cluster
        placement = as_placement(placement, g)
        placement.check(g, c)
        devices = placement.devices
        (start, finish, ready, cause, previous, xfer_op, xfer_src, xfer_dst,
         xfer_start, xfer_end, xfer_bytes) = self._schedule(devices, placement.priority)
        ev_time, ev_device, ev_delta, ev_owner = engine.sorted_memory_events(*engine.memory_events(
            g.succ_ptr, g.succ_edge, g.edge_dst, devices, c.n_devices, start, finish,
            g.persistent_bytes, g.output_bytes, g.temp_bytes, xfer_op, xfer_dst, xfer_start, xfer_end,
        ))
        peak, first_overflow = engine.peak_memory(ev_device, ev_delta, ev_owner, c.n_devices, self.capacity)
        return SimResult(
            graph=g, cluster=c, devices=devices,
            start_us=start, finish_us=finish, ready_us=ready, cause=cause, previous_on_device=previous,
            op_time_us=self.op_time_us[np.arange(g.n_ops), devices],
            transfer_op=xfer_op, transfer_src=xfer_src, transfer_dst=xfer_dst,
            transfer_start_us=xfer_start, transfer_end_us=xfer_end, transfer_bytes=xfer_bytes,
            peak_memory_bytes=peak, first_overflow_op=first_overflow,
            memory_event_time_us=ev_time, memory_event_device=ev_device, memory_event_delta=ev_delta,
        )


_cache: "weakref.WeakKeyDictionary[OpGraph, dict[int, Simulator]]" = weakref.WeakKeyDictionary()


def simulator_for(graph: OpGraph, cluster: Cluster) -> Simulator:
    """A cached Simulator for this graph and cluster (kept while both live)."""
    per_graph = _cache.setdefault(graph, {})
    sim = per_graph.get(id(cluster))
    if sim is None or sim.cluster is not cluster:
        sim = Simulator(graph, cluster)
        per_graph[id(cluster)] = sim
    return sim


def simulate(graph: OpGraph, cluster: Cluster, placement: "Placement | np.ndarray | list[int]") -> SimResult:
    """Simulate one training step of ``graph`` on ``cluster`` under ``placement``."""
    return simulator_for(graph, cluster).run(placement)
