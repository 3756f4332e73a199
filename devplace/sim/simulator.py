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
from devplace.sim.result import SimResult, usable_memory_bytes


class Simulator:
    """A graph bound to a cluster; ``run`` simulates one placement.

    Cheap to make again for the same graph and cluster: the per-pair arrays come from a small cache
    that holds neither (``_prepared``), so a Simulator never keeps a dropped graph alive."""

    def __init__(self, graph: OpGraph, cluster: Cluster):
        self.graph = graph = costed_for(graph, cluster)  # times for this cluster's devices
        self.cluster = cluster
        self.op_time_us, self.in_degree, self.default_priority, self.capacity = _prepared(graph, cluster)

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

        The checks are those of ``run`` and cost a few microseconds: a bad index would make the
        compiled loop read out of bounds, a NaN priority would order the ops arbitrarily, so they are
        never skipped."""
        n = self.graph.n_ops
        valid = (type(devices) is np.ndarray and devices.dtype == np.int64 and devices.shape == (n,)
                 and engine.devices_in_range(devices, self.cluster.n_devices))
        if priority is not None:
            valid = (valid and type(priority) is np.ndarray and priority.dtype == np.float64
                     and priority.shape == (n,) and bool(np.isfinite(priority).all()))
        if not valid:
            placement = self.checked(devices, priority)
            devices, priority = placement.devices, placement.priority
        finish = self._schedule(devices, priority)[1]
        return float(finish.max()) if len(finish) else 0.0

    def checked(self, placement, priority: np.ndarray | None = None) -> Placement:
        """``placement`` (with ``priority`` instead of its own, if given), refused unless it fits."""
        placement = as_placement(placement, self.graph)
        if priority is not None:
            placement = Placement(devices=placement.devices, priority=priority)
        placement.check(self.graph, self.cluster)
        return placement

    def run(self, placement) -> SimResult:
        placement = self.checked(placement)
        return self.result_of(placement.devices, self._schedule(placement.devices, placement.priority))

    def result_of(self, devices: np.ndarray, schedule: tuple) -> SimResult:
        """The SimResult of a schedule the engine made for ``devices`` (``engine.schedule_of``'s tuple):
        memory accounting added. ``run`` and the incremental simulator both end here."""
        g, c = self.graph, self.cluster
        (start, finish, ready, cause, previous, xfer_op, xfer_src, xfer_dst,
         xfer_start, xfer_end, xfer_bytes) = schedule
        ev_time, ev_device, ev_delta, peak, first_overflow = self.memory_of(devices, schedule)
        return SimResult(
            graph=g, cluster=c, devices=devices,
            start_us=start, finish_us=finish, ready_us=ready, cause=cause, previous_on_device=previous,
            op_time_us=self.op_time_us[np.arange(g.n_ops), devices],
            transfer_op=xfer_op, transfer_src=xfer_src, transfer_dst=xfer_dst,
            transfer_start_us=xfer_start, transfer_end_us=xfer_end, transfer_bytes=xfer_bytes,
            peak_memory_bytes=peak, first_overflow_op=first_overflow,
            memory_event_time_us=ev_time, memory_event_device=ev_device, memory_event_delta=ev_delta,
        )

    def memory_of(self, devices: np.ndarray, schedule: tuple) -> tuple:
        """(event time, device, delta, peak per device, first overflowing op per device) of a schedule."""
        g, c = self.graph, self.cluster
        start, finish, _, _, _, xfer_op, _, xfer_dst, xfer_start, xfer_end, xfer_bytes = schedule  # schedule_of's order
        ev_time, ev_device, ev_delta, ev_owner = engine.sorted_memory_events(*engine.memory_events(
            g.succ_ptr, g.succ_edge, g.edge_dst, g.edge_order_only, devices, c.n_devices, start, finish,
            g.persistent_bytes, g.output_bytes, g.temp_bytes, xfer_op, xfer_dst, xfer_start, xfer_end,
            xfer_bytes if g.holds_activations else np.zeros_like(xfer_bytes),
        ))
        peak, first_overflow = engine.peak_memory(ev_device, ev_delta, ev_owner, c.n_devices, self.capacity)
        return ev_time, ev_device, ev_delta, peak, first_overflow


CACHE_PAIRS = 8  # (graph, cluster) pairs whose arrays are kept: a search uses one, compare a few


# (id(graph), id(cluster)) -> (weak ref to the graph, weak ref to the cluster, prepared arrays); in
# least recently used order. Weak refs, so that the cache never keeps a graph or cluster alive, and
# the entry goes when either dies.
_cache: dict[tuple[int, int], tuple[weakref.ref, weakref.ref, tuple]] = {}


def _prepared(graph: OpGraph, cluster: Cluster) -> tuple:
    """(op_time_us, in_degree, default_priority, capacity) for the pair: computed once per pair
    while both live (neither can change: both are frozen), for at most ``CACHE_PAIRS`` pairs."""
    key = (id(graph), id(cluster))
    entry = _cache.pop(key, None)
    if entry is None or entry[0]() is not graph or entry[1]() is not cluster:
        kind_columns = [graph.kind_index(kind) for kind in cluster.device_kinds]
        arrays = (
            np.ascontiguousarray(graph.compute_us[:, kind_columns]),
            np.diff(graph.pred_ptr).astype(np.int64),
            graph.topo_rank.astype(np.float64),  # writeable as callers' priorities are: one compiled engine
            usable_memory_bytes(cluster),
        )
        for shared in (arrays[0], arrays[1], arrays[3]):
            shared.flags.writeable = False

        def forget(_dead, key=key):
            stale = _cache.get(key)
            if stale is not None and (stale[0]() is None or stale[1]() is None):
                del _cache[key]

        entry = (weakref.ref(graph, forget), weakref.ref(cluster, forget), arrays)
    _cache[key] = entry  # (re)inserted last: the most recently used
    while len(_cache) > CACHE_PAIRS:
        del _cache[next(iter(_cache))]
    return entry[2]


def simulate(graph: OpGraph, cluster: Cluster, placement: "Placement | np.ndarray | list[int]") -> SimResult:
    """Simulate one training step of ``graph`` on ``cluster`` under ``placement``; a placement that
    splits a colocation group is simulated with a ``ColocationWarning``."""
    placement = as_placement(placement, graph)
    result = Simulator(graph, cluster).run(placement)
    placement.warn_if_colocation_split(graph)
    return result
