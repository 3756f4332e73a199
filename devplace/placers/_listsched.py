"""List scheduling under memory limits: the engine behind m-ETF and m-SCT.

At each step the scheduler evaluates every (ready op, device) pair: the op can start on the device
when the device is free and all its inputs have arrived there. An input on another device arrives
after a transfer costed and booked on the channels of the cluster's communication model by
``devplace.sim.channels`` (as the simulator does; ``pipelined`` is planned as ``duplex``), and a
tensor already sent to a device is reused from there. The pair
with the earliest start wins; ties go to the op with the longer path to the end of the step (its
bottom level), then the lower op index, then the lower device index.

A device the placer's memory model (``_memory``) says cannot take the op's colocation group is
skipped for that op for good (reservations only grow). When an op of a colocation group is placed,
its whole group is pinned to that device, after checking the whole group fits.

With favorite children (m-SCT), a device whose last op has an unscheduled favorite child is kept for
that child: another op may start there only if it is urgent, i.e. every other device that could take
it (memory allows, not kept for another child, not excluded by pinning) would start it strictly
later. If no pair passes that rule, the step falls back to plain ETF, so the scheduler never stalls.

All of it is compiled with numba. Each ready op keeps, per device, when its inputs could be there;
channels only get busier, so that value is a lower bound that is refreshed when its pair would win
(if it grew, the step looks again). A 20k-op graph is scheduled in a few seconds.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> p = list_schedule(chain_graph([1.0, 2.0]), uniform_cluster(2), algo="m-etf")
>>> p.devices.tolist(), p.priority.tolist()
([0, 0], [0.0, 1.0])
"""

from __future__ import annotations

import numpy as np
from numba import njit

from devplace.placement import Placement
from devplace.placers._memory import MemoryModel, check_can_fit, claim, members_of, out_of_memory
from devplace.sim.channels import book, channel_state, planning_model, transfer_us


def op_times_us(graph, cluster) -> np.ndarray:
    """Compute time of each op on each device of the cluster (n_ops x n_devices)."""
    columns = [graph.kind_index(kind) for kind in cluster.device_kinds]
    return np.ascontiguousarray(graph.compute_us[:, columns])


def mean_edge_us(graph, cluster) -> np.ndarray:
    """Per edge: its fixed time, else its transfer time averaged over the cluster's links, message
    overheads included (0 with one device)."""
    d = cluster.n_devices
    if d == 1:
        return np.zeros(graph.n_edges)
    off = ~np.eye(d, dtype=bool)
    latency = float(cluster.message_latency_us[off].mean())
    us_per_byte = float((1.0 / cluster.bandwidth_bytes_per_us[off]).mean())
    cost = np.where(graph.edge_bytes > 0, latency + graph.edge_bytes * us_per_byte, 0.0)
    fixed = graph.edge_fixed_us
    return np.where(np.isnan(fixed), cost, fixed)


@njit(cache=True)
def bottom_levels(topo_order, succ_ptr, succ_edge, edge_dst, time_us, edge_us):
    """Longest path from each op to the end of the step (own time included): the tie-breaker."""
    level = np.zeros(time_us.shape[0])
    for k in range(topo_order.shape[0] - 1, -1, -1):
        u = topo_order[k]
        best = 0.0
        for j in range(succ_ptr[u], succ_ptr[u + 1]):
            e = succ_edge[j]
            value = edge_us[e] + level[edge_dst[e]]
            if value > best:
                best = value
        level[u] = time_us[u] + best
    return level


@njit(cache=True, inline="always")
def _earlier_edge_from(u, lo, k, pred_edge, edge_src):
    """Whether one of the in-edges at positions lo..k-1 comes from op u."""
    for j in range(lo, k):
        if edge_src[pred_edge[j]] == u:
            return True
    return False


@njit(cache=True)
def _inputs_ready(
    v, d, commit, device, finish, arrival, pred_ptr, pred_edge, edge_src, edge_bytes, edge_fixed_us,
    latency_us, bandwidth, model, free_us, scratch,
):
    """When all of v's inputs are on device d; with ``commit`` the transfers are booked.

    Without ``commit`` they are booked on ``scratch``, a copy of the channel state, so transfers of
    one op queue behind each other exactly as they would when booked. A producer joined to v by
    several edges sends its tensor once, for as long as the longest of them (as the simulator)."""
    n_dev = free_us.shape[1]
    channels = free_us
    if not commit:
        scratch[:, :] = free_us
        channels = scratch
    lo, hi = pred_ptr[v], pred_ptr[v + 1]
    ready = 0.0
    for k in range(lo, hi):
        e = pred_edge[k]
        u = edge_src[e]
        du = device[u]
        if du == d:
            t = finish[u]
        elif arrival[u * n_dev + d] >= 0.0:
            t = arrival[u * n_dev + d]
        elif _earlier_edge_from(u, lo, k, pred_edge, edge_src):
            continue  # its transfer is booked and counted in ready already
        else:
            duration, delay = transfer_us(edge_bytes[e], edge_fixed_us[e], latency_us[du, d], bandwidth[du, d])
            for j in range(k + 1, hi):
                f = pred_edge[j]
                if edge_src[f] == u:
                    longer, longer_delay = transfer_us(edge_bytes[f], edge_fixed_us[f], latency_us[du, d], bandwidth[du, d])
                    if longer > duration:
                        duration, delay = longer, longer_delay
            t = book(model, channels, du, d, finish[u], duration, delay) + duration
            if commit and duration > 0.0:
                arrival[u * n_dev + d] = t
        if t > ready:
            ready = t
    return ready


@njit(cache=True)
def schedule(
    time_us, op_gap_us, level, favorite, use_favorites, group, group_ptr, group_members,
    succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, edge_bytes, edge_fixed_us,
    latency_us, bandwidth, model,
    device, reserved, temp_max, capacity, copy_counted, static_bytes, output_bytes, temp_bytes, moves,
):
    """The list scheduler. Returns (status, start, finish, order, stuck op); status 1 = out of memory."""
    n, n_dev = time_us.shape
    start = np.zeros(n)
    finish = np.zeros(n)
    order = np.full(n, -1, np.int64)
    arrival = np.full(n * n_dev, -1.0)
    infeasible = np.zeros(n * n_dev, np.bool_)
    stamp = np.zeros(n * n_dev, np.int64)
    tick = 0
    delta = np.zeros(n_dev)
    free_us = channel_state(n_dev)
    scratch = channel_state(n_dev)
    device_free = np.zeros(n_dev)
    kept_for = np.full(n_dev, -1, np.int64)     # m-SCT: the favorite child a device waits for
    scheduled = np.zeros(n, np.bool_)
    waiting = np.zeros(n, np.int64)
    for v in range(n):
        waiting[v] = pred_ptr[v + 1] - pred_ptr[v]
    ready_ops = np.empty(n, np.int64)
    n_ready = 0
    for v in range(n):
        if waiting[v] == 0:
            ready_ops[n_ready] = v
            n_ready += 1
    # when each ready op's inputs could be on each device: a lower bound kept up to date lazily, as
    # channels only get busier; the winning pair is recomputed exactly before it is committed
    inputs_at = np.zeros(n * n_dev)
    est = np.zeros(n_dev)
    allowed = np.zeros(n_dev, np.bool_)
    step = 0
    while step < n:
        best_slot, best_d = -1, -1
        best_t, best_level, best_v = np.inf, 0.0, -1
        for relax in range(2):
            for slot in range(n_ready):
                v = ready_ops[slot]
                open_est = np.inf     # earliest start on a device open to v (not kept for another child)
                for d in range(n_dev):
                    allowed[d] = (device[v] < 0 or device[v] == d) and not infeasible[v * n_dev + d]
                    est[d] = max(device_free[d], inputs_at[v * n_dev + d])
                    if allowed[d] and (kept_for[d] < 0 or kept_for[d] == v) and est[d] < open_est:
                        open_est = est[d]
                for d in range(n_dev):
                    if not allowed[d]:
                        continue
                    if use_favorites and relax == 0 and kept_for[d] >= 0 and kept_for[d] != v:
                        # urgent: every other device open to v would start it strictly later
                        # (d, kept for another child, is not one of them)
                        if open_est <= est[d]:
                            continue
                    t = est[d]
                    if t < best_t or (t == best_t and (level[v] > best_level or (
                            level[v] == best_level and v < best_v))):
                        best_t, best_level, best_v, best_slot, best_d = t, level[v], v, slot, d
            if best_slot >= 0 or not use_favorites:
                break
        if best_slot < 0:
            return 1, start, finish, order, ready_ops[0] if n_ready > 0 else -1
        v, d = best_v, best_d
        exact = _inputs_ready(v, d, False, device, finish, arrival, pred_ptr, pred_edge, edge_src,
                              edge_bytes, edge_fixed_us, latency_us, bandwidth, model, free_us, scratch)
        if exact > inputs_at[v * n_dev + d]:
            inputs_at[v * n_dev + d] = exact     # channels got busier since: look again
            continue
        inputs_at[v * n_dev + d] = exact
        best_t = max(device_free[d], exact)
        if device[v] < 0:
            ops = members_of(v, group, group_ptr, group_members)
            tick += 1
            if not claim(ops, d, False, delta, stamp, tick, device, reserved, temp_max, capacity,
                         copy_counted, static_bytes, output_bytes, temp_bytes,
                         succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves):
                infeasible[v * n_dev + d] = True
                continue
            tick += 1
            claim(ops, d, True, delta, stamp, tick, device, reserved, temp_max, capacity,
                  copy_counted, static_bytes, output_bytes, temp_bytes,
                  succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves)
        _inputs_ready(v, d, True, device, finish, arrival, pred_ptr, pred_edge, edge_src,
                      edge_bytes, edge_fixed_us, latency_us, bandwidth, model, free_us, scratch)
        start[v] = best_t
        finish[v] = best_t + time_us[v, d] + op_gap_us
        device_free[d] = finish[v]
        scheduled[v] = True
        order[v] = step
        step += 1
        n_ready -= 1
        ready_ops[best_slot] = ready_ops[n_ready]
        if use_favorites:
            for o in range(n_dev):
                if kept_for[o] == v:
                    kept_for[o] = -1
            f = favorite[v]
            if kept_for[d] < 0 and f >= 0 and not scheduled[f] and (device[f] < 0 or device[f] == d):
                kept_for[d] = f
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            w = edge_dst[succ_edge[k]]
            waiting[w] -= 1
            if waiting[w] == 0:
                ready_ops[n_ready] = w
                n_ready += 1
                for o in range(n_dev):
                    inputs_at[w * n_dev + o] = _inputs_ready(
                        w, o, False, device, finish, arrival, pred_ptr, pred_edge, edge_src,
                        edge_bytes, edge_fixed_us, latency_us, bandwidth, model, free_us, scratch)
    return 0, start, finish, order, -1


def schedule_args(graph, cluster, memory: MemoryModel, favorite: np.ndarray | None) -> tuple:
    """The arguments of ``schedule`` for a graph, cluster, fresh memory model and favorite children."""
    time_us = op_times_us(graph, cluster)
    level = bottom_levels(graph.topo_order, graph.succ_ptr, graph.succ_edge, graph.edge_dst,
                          time_us.mean(axis=1), mean_edge_us(graph, cluster))
    use_favorites = favorite is not None
    if favorite is None:
        favorite = np.full(graph.n_ops, -1, dtype=np.int64)
    return (
        time_us, float(cluster.op_gap_us), level, np.asarray(favorite, dtype=np.int64), use_favorites,
        graph.colocation, memory.group_ptr, memory.group_members,
        graph.succ_ptr, graph.succ_edge, graph.pred_ptr, graph.pred_edge, graph.edge_src, graph.edge_dst,
        graph.edge_bytes, graph.edge_fixed_us, cluster.message_latency_us, cluster.bandwidth_bytes_per_us,
        planning_model(cluster.comm_model_code),
        memory.device, memory.reserved_bytes, memory.temp_max, memory.capacity, memory.copy_counted,
        memory.static_bytes, memory.output_bytes, memory.temp_bytes, memory.moves,
    )


def run_list_schedule(graph, cluster, *, algo: str, favorite: np.ndarray | None = None):
    """Schedule ``graph`` on ``cluster``: (devices, order, start_us, finish_us) as the scheduler sees them.

    ``favorite[i]`` is op i's favorite child (-1: none); given, the m-SCT keep-idle rule applies."""
    check_can_fit(graph, cluster, algo)
    memory = MemoryModel(graph, cluster)
    status, start, finish, order, stuck = schedule(*schedule_args(graph, cluster, memory, favorite))
    if status != 0:
        raise out_of_memory(graph, cluster, algo, stuck_op=int(stuck) if stuck >= 0 else None)
    return memory.device.copy(), order, start, finish


def list_schedule(graph, cluster, *, algo: str, favorite: np.ndarray | None = None) -> Placement:
    """A Placement whose priority is the schedule order, so the simulator follows the scheduler."""
    devices, order, _, finish = run_list_schedule(graph, cluster, algo=algo, favorite=favorite)
    placement = Placement(devices=devices, priority=order.astype(np.float64))
    placement.options = {"predicted_step_us": float(finish.max()) if graph.n_ops else 0.0}
    return placement
