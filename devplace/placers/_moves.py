"""Helpers of the simulator-guided search (``sim_search``): units that move whole, and schedule orders.

A *unit* is a set of ops that must (colocation) or should (co-placement) share a device; the
search only ever moves whole units, so it cannot split a colocation group. ``Units`` keeps them as
CSR arrays, numbered in the order the step runs them (by the earliest topological rank of their
members), so "a contiguous run of units" is a layer-like slice of the step.

``upward_rank_us`` is HEFT's rank with the transfer times of *this* placement: an edge inside a
device costs nothing, one across devices its link time. Running ops in decreasing rank puts the
longest remaining chain first, which is what a list scheduler's order buys.

>>> from devplace.graph import chain_graph
>>> u = Units.from_labels(chain_graph([1.0, 2.0, 3.0]), [0, 0, 1])
>>> u.n_units, u.members(0).tolist(), u.unit_of.tolist()
(2, [0, 1], [0, 0, 1])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.placers._listsched import bottom_levels


@dataclass(eq=False)
class Units:
    unit_of: np.ndarray   # per op: its unit
    ptr: np.ndarray       # members of unit k: flat[ptr[k]:ptr[k + 1]]
    flat: np.ndarray

    @classmethod
    def from_labels(cls, graph, labels) -> "Units":
        """Units from any per-op labels, renumbered by the earliest topological rank of each unit."""
        labels = np.asarray(labels, dtype=np.int64)
        _, dense = np.unique(labels, return_inverse=True)
        first = np.full(dense.max() + 1 if len(dense) else 0, np.iinfo(np.int64).max)
        np.minimum.at(first, dense, graph.topo_rank)
        renumber = np.empty(len(first), dtype=np.int64)
        renumber[np.argsort(first, kind="stable")] = np.arange(len(first))
        unit_of = renumber[dense]
        flat = np.argsort(unit_of, kind="stable").astype(np.int64)
        ptr = np.zeros(len(first) + 1, dtype=np.int64)
        np.cumsum(np.bincount(unit_of, minlength=len(first)), out=ptr[1:])
        return cls(unit_of=unit_of, ptr=ptr, flat=flat)

    @property
    def n_units(self) -> int:
        return len(self.ptr) - 1

    def members(self, unit: int) -> np.ndarray:
        return self.flat[self.ptr[unit] : self.ptr[unit + 1]]

    def run_members(self, first: int, last: int) -> np.ndarray:
        """Ops of units first..last (inclusive): contiguous in ``flat`` by construction."""
        return self.flat[self.ptr[first] : self.ptr[last + 1]]


def edge_transfer_us(graph, cluster, devices: np.ndarray) -> np.ndarray:
    """Per edge, its transfer time under ``devices`` on an idle link (0 inside a device)."""
    src, dst = devices[graph.edge_src], devices[graph.edge_dst]
    cross = src != dst
    cost = np.zeros(graph.n_edges)
    if not cross.any():
        return cost
    s, d = src[cross], dst[cross]
    nbytes = graph.edge_bytes[cross]
    linked = cluster.latency_us[s, d] + nbytes / cluster.bandwidth_bytes_per_us[s, d]
    fixed = graph.edge_fixed_us[cross]
    cost[cross] = np.where(np.isnan(fixed), np.where(nbytes > 0, linked, 0.0), fixed)
    return cost


def upward_rank_us(graph, cluster, devices: np.ndarray, op_time_us: np.ndarray) -> np.ndarray:
    """Longest time from each op's start to the end of the step, if nothing ever waited for a device.

    ``op_time_us`` is the (n_ops, n_devices) table of the simulator; each op counts its time on
    its own device plus the cluster's per-op gap."""
    own = op_time_us[np.arange(graph.n_ops), devices] + float(cluster.op_gap_us)
    return bottom_levels(graph.topo_order.astype(np.int64), graph.succ_ptr, graph.succ_edge, graph.edge_dst,
                         own, edge_transfer_us(graph, cluster, devices))
