"""Baseline: HEFT, heterogeneous earliest finish time list scheduling (Topcuoglu et al., 2002).

Ops are taken in decreasing upward rank, ``rank(i) = w(i) + max over successors j of (c(i, j) +
rank(j))``, where ``w`` is the op's time averaged over the cluster's devices and ``c`` the edge's
transfer time averaged over device pairs (its fixed time if it has one). Each op goes to the device
where it would finish first, with insertion: it may fill an idle gap between ops already scheduled
there. Transfers follow the simulator's rules: a tensor goes to a device once (later consumers
there reuse it) and, with ``contention=True`` (default), queues on the channels of the cluster's
communication model. Classic HEFT (``contention=False``) lets every transfer start when its
producer ends; on a shared-channel machine (Baechi's 4 x 2080) that estimate is so optimistic that
the placement runs 10x slower than one device on a captured GNMT, against about 1x with contention.
The simulator then runs the placement with the HEFT start times as priorities.

Memory: a device is a candidate only if a conservative reserve still fits: the sum of persistent,
output and temporary bytes of every op placed there plus one copy of every tensor it receives, a
bound on its peak whatever the schedule. A colocation group reserves its whole footprint on the
device its first op takes, and its other ops follow it there. If no device has room under that
bound, the op goes where most room is left and ``options['memory_overcommitted']`` says so (the
simulated check in ``devplace.place`` has the last word).

>>> from devplace.graph import GraphBuilder
>>> from devplace.cluster import uniform_cluster
>>> b = GraphBuilder(["gpu"])
>>> for name in ["a", "b", "c"]:
...     _ = b.add_op(name, compute_us=10.0)
>>> place(b.build(), uniform_cluster(3)).devices.tolist()   # independent ops spread out
[0, 1, 2]
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from devplace.placement import Placement
from devplace.placers import register
from devplace.placers.options import option
from devplace.placers._listsched import mean_edge_us, op_times_us
from devplace.placers._memory import received_copy_bytes
from devplace.sim.channels import book, channel_state, planning_model, transfer_us


def upward_rank(graph, op_time_us: np.ndarray, edge_cost_us: np.ndarray) -> np.ndarray:
    """HEFT's upward rank: mean time of the op plus the costliest way from it to an exit."""
    mean_time = op_time_us.mean(axis=1)
    rank = np.zeros(graph.n_ops)
    for v in graph.topo_order[::-1]:
        out = graph.out_edges(v)
        tail = (edge_cost_us[out] + rank[graph.edge_dst[out]]).max() if len(out) else 0.0
        rank[v] = mean_time[v] + tail
    return rank


def _earliest_slot(starts: list, ends: list, ready: float, duration: float) -> float:
    """Earliest start >= ready of an idle gap of ``duration`` between busy intervals (sorted)."""
    k = bisect_right(ends, ready)
    candidate = ready
    while k < len(starts):
        if candidate + duration <= starts[k]:
            break
        candidate = max(candidate, ends[k])
        k += 1
    return candidate


class _Links:
    """Transfers as the simulator makes them: one copy of a tensor per device, costed and queued by
    ``devplace.sim.channels``.

    With ``contention`` the channels of the cluster's model are booked first come, first served
    (``pipelined`` planned as ``duplex``, as the list scheduler does); without it every transfer
    starts when its producer finishes (classic HEFT). A plan books on a copy of the channel state;
    committing it keeps that copy."""

    def __init__(self, graph, cluster, contention: bool):
        self.graph, self.contention = graph, contention
        self.model = planning_model(cluster.comm_model_code)
        self.latency_us = cluster.message_latency_us
        self.bandwidth = cluster.bandwidth_bytes_per_us
        self.free_us = channel_state(cluster.n_devices)
        self.arrived: dict[tuple[int, int], float] = {}

    def arrivals(self, v: int, k: int, device, finish) -> tuple[float, tuple]:
        """When all of ``v``'s inputs would be on device ``k``, and the transfers that needs."""
        g = self.graph
        by_producer: dict[int, list[int]] = {}
        for e in g.in_edges(v).tolist():
            by_producer.setdefault(int(g.edge_src[e]), []).append(e)
        ready, planned = 0.0, []
        free_us = self.free_us.copy() if self.contention else self.free_us
        for p in sorted(by_producer, key=lambda q: finish[q]):
            src = int(device[p])
            if src == k:
                arrive = finish[p]
            elif (p, k) in self.arrived:
                arrive = self.arrived[(p, k)]
            else:
                duration, delay = max(transfer_us(g.edge_bytes[e], g.edge_fixed_us[e], self.latency_us[src, k],
                                                  self.bandwidth[src, k]) for e in by_producer[p])
                begin = book(self.model, free_us, src, k, finish[p], duration, delay) if self.contention else finish[p]
                arrive = begin + duration
                if duration > 0.0:  # nothing was sent: a later consumer with bytes to receive sends them
                    planned.append((p, arrive))
            ready = max(ready, arrive)
        return ready, (planned, free_us)

    def commit(self, k: int, plan) -> None:
        """Book the transfers ``arrivals`` planned for the device ``k`` that was chosen."""
        planned, self.free_us = plan
        for p, arrive in planned:
            self.arrived[(p, k)] = arrive


@dataclass(frozen=True)
class HeftOptions:
    insertion: bool = option(True, "start an op in an idle gap before a device's last op when it fits (insertion-based HEFT)")
    contention: bool = option(True, "queue transfers on the cluster's channels (False: classic HEFT, links never busy)")


@register("heft", "HEFT list scheduling: upward rank, insertion-based earliest finish, memory-aware", HeftOptions)
def place(graph, cluster, *, seed: int = 0, options: HeftOptions = HeftOptions()) -> Placement:
    insertion, contention = options.insertion, options.contention
    n, d = graph.n_ops, cluster.n_devices
    op_time = op_times_us(graph, cluster) + cluster.op_gap_us
    rank = upward_rank(graph, op_time, mean_edge_us(graph, cluster))
    order = np.lexsort((graph.topo_rank, -rank))

    links = _Links(graph, cluster, contention)
    footprint = graph.persistent_bytes + graph.output_bytes + graph.temp_bytes
    copy_bytes = received_copy_bytes(graph)
    capacity = cluster.memory_bytes
    used = np.zeros(d)
    received = [set() for _ in range(d)]
    group_device: dict[int, int] = {}
    group_bytes = {g: float(footprint[m].sum()) for g, m in enumerate(graph.colocation_members)}
    starts = [[] for _ in range(d)]
    ends = [[] for _ in range(d)]
    device = np.full(n, -1, dtype=np.int64)
    start = np.zeros(n)
    finish = np.zeros(n)
    overcommitted = False

    for v in order.tolist():
        group = int(graph.colocation[v])
        in_edges = graph.in_edges(v)
        producers = graph.edge_src[in_edges]

        def incoming_bytes(dev: int) -> float:
            remote = {int(p) for p in producers if device[p] != dev and int(p) not in received[dev]}
            return float(copy_bytes[list(remote)].sum()) if remote else 0.0

        if group >= 0 and group in group_device:
            candidates = [group_device[group]]
            own = 0.0
        else:
            candidates = list(range(d))
            own = group_bytes[group] if group >= 0 else float(footprint[v])
        room = [capacity[k] - used[k] - own - incoming_bytes(k) for k in candidates]
        fitting = [k for k, r in zip(candidates, room) if r >= 0]
        if not fitting:
            overcommitted = True
            fitting = [candidates[int(np.argmax(room))]]

        best = None
        for k in fitting:
            ready, planned = links.arrivals(v, k, device, finish)
            if insertion:
                begin = _earliest_slot(starts[k], ends[k], ready, op_time[v, k])
            else:
                begin = max(ready, ends[k][-1] if ends[k] else 0.0)
            if best is None or begin + op_time[v, k] < best[0]:
                best = (begin + op_time[v, k], begin, k, planned)
        _, begin, k, planned = best
        used[k] += own + incoming_bytes(k)
        received[k].update(int(p) for p in producers if device[p] != k)
        links.commit(k, planned)
        if group >= 0:
            group_device.setdefault(group, k)
        device[v], start[v], finish[v] = k, begin, begin + op_time[v, k]
        position = bisect_right(starts[k], begin)
        starts[k].insert(position, begin)
        ends[k].insert(position, finish[v])

    priority = np.empty(n)
    priority[np.lexsort((graph.topo_rank, start))] = np.arange(n)
    return Placement(devices=device, priority=priority,
                     options={"memory_overcommitted": True} if overcommitted else {})
