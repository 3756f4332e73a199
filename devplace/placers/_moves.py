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

from devplace.graph import Role
from devplace.placers._listsched import bottom_levels
from devplace.sim.channels import placed_edge_us


@dataclass(eq=False)
class Units:
    unit_of: np.ndarray   # per op: its unit
    ptr: np.ndarray       # members of unit k: flat[ptr[k]:ptr[k + 1]]
    flat: np.ndarray

    @classmethod
    def from_labels(cls, graph, labels, rank: np.ndarray | None = None) -> "Units":
        """Units from any per-op labels, renumbered by the earliest ``rank`` (default: topological
        rank) of each unit."""
        labels = np.asarray(labels, dtype=np.int64)
        _, dense = np.unique(labels, return_inverse=True)
        first = np.full(dense.max() + 1 if len(dense) else 0, np.iinfo(np.int64).max)
        np.minimum.at(first, dense, graph.topo_rank if rank is None else rank)
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
    """Per edge, its transfer time under ``devices`` on an idle link, message overheads included
    (0 inside a device)."""
    devices = np.asarray(devices, dtype=np.int64)
    return placed_edge_us(devices[graph.edge_src], devices[graph.edge_dst], graph.edge_bytes, graph.edge_fixed_us,
                          cluster.message_latency_us, cluster.bandwidth_bytes_per_us)


def upward_rank_us(graph, cluster, devices: np.ndarray, op_time_us: np.ndarray) -> np.ndarray:
    """Longest time from each op's start to the end of the step, if nothing ever waited for a device.

    ``op_time_us`` is the (n_ops, n_devices) table of the simulator; each op counts its time on
    its own device plus the cluster's per-op gap."""
    own = op_time_us[np.arange(graph.n_ops), devices] + float(cluster.op_gap_us)
    return bottom_levels(graph.topo_order.astype(np.int64), graph.succ_ptr, graph.succ_edge, graph.edge_dst,
                         own, edge_transfer_us(graph, cluster, devices))


# ---------------------------------------------------------------- memory repair and pipelines
def leader_units(graph, closed: bool = False, rank: np.ndarray | None = None) -> Units:
    """Each forward op with the backward and update ops that follow it (``forward_leaders``),
    numbered by ``rank`` (default: topological rank; positions in ``sources_late_order`` put each
    weight's unit with the layer that first reads it).

    Moving a forward op without its backward ops frees nothing: the simulator then keeps a copy of
    the activation on the old device until the backward op there has run. With ``closed`` a
    colocation group joins its members' units whole (safe to move as is, but a parameter's update
    ops then drag layers together); else a move must widen the unit with ``with_colocation``."""
    from devplace.transforms import forward_leaders
    from devplace.transforms.coplacement import _colocation_pairs, join_pairs

    leader = _without_hubs(graph, forward_leaders(graph))
    if not closed:
        return Units.from_labels(graph, leader, rank)
    first, member = _colocation_pairs(graph)
    every = np.arange(graph.n_ops, dtype=np.int64)
    return Units.from_labels(graph, join_pairs(graph.n_ops, np.concatenate([first, every]),
                                               np.concatenate([member, leader])), rank)


def _without_hubs(graph, leader: np.ndarray, hub_share: float = 0.01) -> np.ndarray:
    """Re-lead the followers of a *hub*: a leader followed by more than ``hub_share`` of the ops.

    A graph can mirror many unrelated backward ops to one forward op (devplace's captures did so
    with gradient sums until they were mirrored to the op that made the summed tensor; graphs from
    other tools may still), so thousands of backward ops would follow it onto one stage and every
    time step's gradient would cross a device. Such an op follows instead the leader of its input
    that is not a hub follower itself (the largest one), or of its first resolved input."""
    n = graph.n_ops
    counts = np.bincount(leader, minlength=n)
    hub = (counts[leader] > max(64, hub_share * n)) & (leader != np.arange(n))
    if not hub.any():
        return leader
    leader = leader.copy()
    was_hub = hub.copy()
    pred_src = graph.edge_src[graph.pred_edge]
    pred_bytes = graph.edge_bytes[graph.pred_edge]
    for v in graph.topo_order[hub[graph.topo_order]]:
        lo, hi = graph.pred_ptr[v], graph.pred_ptr[v + 1]
        inputs, sizes = pred_src[lo:hi], pred_bytes[lo:hi]
        plain = ~was_hub[inputs]
        if plain.any():
            leader[v] = leader[inputs[plain][int(np.argmax(sizes[plain]))]]
        else:
            resolved = inputs[~hub[inputs]]
            if len(resolved):
                leader[v] = leader[resolved[0]]
        hub[v] = False
    return leader


def read_later(graph) -> np.ndarray:
    """Per edge, whether a backward or update op reads it: what it carries is kept from when it is
    made until then (an activation saved for backward, a weight gradient for its update)."""
    reader_role = graph.role[graph.edge_dst]
    return (reader_role == Role.BACKWARD) | (reader_role == Role.UPDATE)


def held_bytes(graph) -> np.ndarray:
    """Per op, the bytes a pipeline stage holding it keeps through the step: its persistent bytes,
    plus its output when a backward or update op reads it (an activation saved for backward lives
    from the forward pass to the backward one; other outputs die within a layer).

    Balancing stages by all output bytes counts each backward op's short-lived gradient as much as
    a saved activation; neither weighting fits best everywhere (zoo at 30% memory, least overflow
    of a 4-stage start: ResNet-50 0.19 GiB by all bytes, 0.26 by these; the Transformer's 3-stage
    0.32 by all bytes, 0.08 by these), so sim-search tries both."""
    later = read_later(graph)
    forward = (graph.role == Role.FORWARD) | (graph.role == Role.OTHER)
    saved = np.zeros(graph.n_ops, dtype=bool)
    saved[graph.edge_src[later]] = True
    return graph.persistent_bytes + np.where(saved & forward, graph.output_bytes, 0.0)


def sources_late_order(graph) -> np.ndarray:
    """Topological order with each op that has no inputs moved to just before its first consumer.

    A topological sort puts every weight (and optimizer state) first, so a cut "in step order"
    puts all of them, with their update ops, on the first stage, far from the layers that read them
    (ResNet-50 at 30% memory: the 4-stage pipeline start went from 1,338 ms and 3.9 GiB over memory
    to 604 ms and 2.1 GiB over when its units were numbered in this order)."""
    source = np.diff(graph.pred_ptr) == 0
    order, placed = [], source & (np.diff(graph.succ_ptr) > 0)    # sources with consumers wait
    for v in graph.topo_order:
        if source[v] and placed[v]:
            continue
        for k in range(graph.pred_ptr[v], graph.pred_ptr[v + 1]):
            u = graph.edge_src[graph.pred_edge[k]]
            if source[u] and placed[u]:
                placed[u] = False
                order.append(u)
        order.append(v)
    return np.asarray(order, dtype=np.int64)


def with_colocation(fine: Units, ops: np.ndarray) -> np.ndarray:
    """``ops`` plus every op that must share a device with one of them (``fine``: colocation units)."""
    touched = np.zeros(fine.n_units, dtype=bool)
    touched[fine.unit_of[ops]] = True
    return np.flatnonzero(touched[fine.unit_of])


def respect_colocation(fine: Units, devices: np.ndarray) -> np.ndarray:
    """Put every colocation unit on the device of its member with the lowest op index."""
    return devices[_earliest_member(fine)][fine.unit_of]


def _earliest_member(fine: Units) -> np.ndarray:
    """Per unit, its member op with the lowest op index (stable across calls)."""
    out = np.full(fine.n_units, np.iinfo(np.int64).max)
    np.minimum.at(out, fine.unit_of, np.arange(len(fine.unit_of)))
    return out


def pipeline_devices(units: Units, weight: np.ndarray, device_order: np.ndarray, share: np.ndarray) -> np.ndarray:
    """One device per unit: contiguous runs of units (in step order) whose ``weight`` follows ``share``.

    Training graphs keep a layer's activations until its backward op, so cutting the forward pass
    into consecutive stages (each stage's backward ops following it) splits the activation memory
    with one activation crossing per cut, where a sum-of-bytes cut (m-TOPO) overcounts reuse."""
    total = float(weight.sum())
    if total <= 0 or len(device_order) == 1:
        return np.full(units.n_units, int(device_order[0]), dtype=np.int64)
    bounds = np.cumsum(share / share.sum())[:-1] * total
    middle = np.cumsum(weight) - weight / 2           # a unit goes to the stage holding its middle
    return np.asarray(device_order, dtype=np.int64)[np.searchsorted(bounds, middle, side="right")]


def critical_crossings(result, devices: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]], np.ndarray]:
    """What the schedule-guided moves (sim-search's pull and unload; the learners' option critical_share) read
    off a simulated placement: its critical-path ops, the (waiting op, producer) pairs on that path whose two
    ops sit on different devices, and the busy time per device."""
    path = result.critical_path
    crossing = devices[path[:-1]] != devices[path[1:]]
    pairs = list(zip(path[1:][crossing].tolist(), path[:-1][crossing].tolist()))
    return path, pairs, result.busy_us


def live_bytes_at_peak(result) -> np.ndarray:
    """Per op, the bytes it holds on its device at that device's peak: persistent, plus its output
    if the output is alive then (from its start to its last reader on the same device)."""
    g, devices = result.graph, result.devices
    n_dev = result.cluster.n_devices
    peak_time = np.zeros(n_dev)
    for d in range(n_dev):
        times, used = result.memory_timeline(d)
        if len(used):
            peak_time[d] = times[int(np.argmax(used))]
    same = (devices[g.edge_src] == devices[g.edge_dst]) & ~g.edge_order_only
    free = result.finish_us.copy()
    np.maximum.at(free, g.edge_src[same], result.finish_us[g.edge_dst[same]])
    t = peak_time[devices]
    alive = (result.start_us <= t) & (free > t)
    return g.persistent_bytes + np.where(alive, g.output_bytes, 0.0)
