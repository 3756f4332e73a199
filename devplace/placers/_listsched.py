"""List scheduling under memory limits: the engine behind m-ETF and m-SCT.

At each step the scheduler evaluates every (ready op, device) pair: the op can start on the device
when the device is free and all its inputs have arrived there. An input on another device arrives
after a transfer costed and booked on the channels of the cluster's communication model by
``devplace.sim.channels`` (as the simulator does; ``pipelined`` is planned as ``duplex``), and a
tensor already sent to a device is reused from there. The pair
with the earliest start wins; ties go to the op with the longer path to the end of the step (its
bottom level), then the lower op index, then the lower device index.

A device the placer's memory model (``_memory``) says cannot take the op's colocation group is
skipped for that op: for good with the never-freeing model (reservations only grow), until the next
op is booked with the model that follows the schedule (booking one may free memory). When an op of a
colocation group is placed, its whole group is pinned to that device, after checking it fits.

With favorite children (m-SCT), a device whose last op has an unscheduled favorite child is kept for
that child: another op may start there only if it is urgent, i.e. every other device that could take
it (memory allows, not kept for another child, not excluded by pinning) would start it strictly
later. If no pair passes that rule, the step falls back to plain ETF, so the scheduler never stalls.

All of it is compiled with numba. Each ready op keeps, per device, when its inputs could be there;
channels only get busier, so that value is a lower bound that is refreshed when its pair would win
(if it grew, the step looks again). Each device files its ready pairs in two heaps (``schedule``
says how), so a step costs O(devices x log ready ops) instead of a scan of every ready pair: a
20k-op layered DAG on 4 devices is scheduled in 0.2 s CPU instead of 1.8 s, to the same schedule
(``tests/test_listsched.py`` holds the former scan as the reference).

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
from devplace.placers._memory import (MemoryModel, ScheduleMemory, check_can_fit, claim, members_of, out_of_memory,
                                      release_inputs, run_claim)
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


SENT = -1.5    # in an arrival slot during ``_inputs_ready``: this producer's transfer is counted


@njit(cache=True)
def _inputs_ready(
    v, d, commit, device, finish, arrival, pred_ptr, pred_edge, edge_src, edge_bytes, edge_fixed_us,
    latency_us, bandwidth, model, free_us, scratch,
):
    """When all of v's inputs are on device d; with ``commit`` the transfers are booked.

    Without ``commit`` they are booked on ``scratch``, a copy of the channel state, so transfers of
    one op queue behind each other exactly as they would when booked. A producer joined to v by
    several edges sends its tensor once, at its first edge, for as long as the longest of them
    (the first of equal ones; as the simulator). To find those in time linear in v's in-edges, the
    arrival slot (producer, d) of a producer not yet sent there (-1) holds, during the call, -2 -
    the position of its longest edge, then ``SENT``; every such slot is -1 again on return, unless
    ``commit`` booked a transfer that takes time, whose arrival it then holds."""
    n_dev = free_us.shape[1]
    channels = free_us
    if not commit:
        scratch[:, :] = free_us
        channels = scratch
    lo, hi = pred_ptr[v], pred_ptr[v + 1]
    for k in range(lo, hi):     # each unsent producer's longest edge
        e = pred_edge[k]
        u = edge_src[e]
        du = device[u]
        slot = u * n_dev + d
        if du == d or arrival[slot] >= 0.0:
            continue
        if arrival[slot] == -1.0:
            arrival[slot] = -2.0 - k
            continue
        f = pred_edge[int(-2.0 - arrival[slot])]
        longest = transfer_us(edge_bytes[f], edge_fixed_us[f], latency_us[du, d], bandwidth[du, d])[0]
        if transfer_us(edge_bytes[e], edge_fixed_us[e], latency_us[du, d], bandwidth[du, d])[0] > longest:
            arrival[slot] = -2.0 - k
    ready = 0.0
    for k in range(lo, hi):
        u = edge_src[pred_edge[k]]
        du = device[u]
        slot = u * n_dev + d
        if du == d:
            t = finish[u]
        elif arrival[slot] >= 0.0:
            t = arrival[slot]
        elif arrival[slot] == SENT:
            continue  # its transfer is booked and counted in ready already
        else:
            f = pred_edge[int(-2.0 - arrival[slot])]
            duration, delay = transfer_us(edge_bytes[f], edge_fixed_us[f], latency_us[du, d], bandwidth[du, d])
            t = book(model, channels, du, d, finish[u], duration, delay) + duration
            arrival[slot] = t if commit and duration > 0.0 else SENT
        if t > ready:
            ready = t
    for k in range(lo, hi):
        slot = edge_src[pred_edge[k]] * n_dev + d
        if arrival[slot] == SENT:
            arrival[slot] = -1.0
    return ready


RIPE, WAITING = 0, 1    # a device's two heaps: heap 2d + RIPE and heap 2d + WAITING


# The heaps live in three (2 x devices, capacity) arrays (start key, rank key, version) and a size
# per heap, passed as separate arrays: numba counts references to every array it unpacks from a
# tuple, and on GNMT those atomic counts took 70% of the scheduler's time.
@njit(cache=True, inline="always")
def _precedes(t, r, t2, r2):
    """Whether key (t, r) comes before (t2, r2)."""
    return t < t2 or (t == t2 and r < r2)


@njit(cache=True)
def _heap_push(heap_t, heap_r, heap_v, heap_n, h, t, r, version):
    """Add the entry (start t, rank r, version) to heap h, which the caller made room in."""
    i = heap_n[h]
    heap_n[h] += 1
    while i > 0:
        parent = (i - 1) >> 1
        if not _precedes(t, r, heap_t[h, parent], heap_r[h, parent]):
            break
        heap_t[h, i], heap_r[h, i], heap_v[h, i] = heap_t[h, parent], heap_r[h, parent], heap_v[h, parent]
        i = parent
    heap_t[h, i], heap_r[h, i], heap_v[h, i] = t, r, version


@njit(cache=True)
def _heap_pop(heap_t, heap_r, heap_v, heap_n, h):
    """Remove the first entry of heap h."""
    heap_n[h] -= 1
    n = heap_n[h]
    t, r, version = heap_t[h, n], heap_r[h, n], heap_v[h, n]
    i = 0
    while 2 * i + 1 < n:
        c = 2 * i + 1
        if c + 1 < n and _precedes(heap_t[h, c + 1], heap_r[h, c + 1], heap_t[h, c], heap_r[h, c]):
            c += 1
        if not _precedes(heap_t[h, c], heap_r[h, c], t, r):
            break
        heap_t[h, i], heap_r[h, i], heap_v[h, i] = heap_t[h, c], heap_r[h, c], heap_v[h, c]
        i = c
    heap_t[h, i], heap_r[h, i], heap_v[h, i] = t, r, version


@njit(cache=True)
def _grown(heap_t, heap_r, heap_v):
    """The heaps' arrays at twice the capacity."""
    rows, capacity = heap_t.shape
    grown_t = np.empty((rows, 2 * capacity))
    grown_r = np.empty((rows, 2 * capacity), np.int64)
    grown_v = np.empty((rows, 2 * capacity), np.int64)
    grown_t[:, :capacity] = heap_t
    grown_r[:, :capacity] = heap_r
    grown_v[:, :capacity] = heap_v
    return grown_t, grown_r, grown_v


@njit(cache=True, inline="always")
def _allowed(v, d, n_dev, device, blocked, step):
    """Whether v may go to d at this step: not pinned elsewhere by its group, not refused by memory
    there (``blocked``: the last step at which the pair was refused)."""
    return (device[v] < 0 or device[v] == d) and blocked[v * n_dev + d] < step


@njit(cache=True)
def _first(heap_t, heap_r, heap_v, heap_n, d, free_at, op_of_rank, version, scheduled, device, blocked, step):
    """The pair that starts first on device d: (heap, op, start), or (-1, -1, inf); drops the
    entries it passes that no longer count (op scheduled, pair refused, or estimate superseded)."""
    n_dev = heap_n.shape[0] // 2
    for kind in (RIPE, WAITING):
        h = 2 * d + kind
        while heap_n[h] > 0:
            v = op_of_rank[heap_r[h, 0]]
            if scheduled[v] or heap_v[h, 0] != version[v * n_dev + d] or not _allowed(v, d, n_dev, device, blocked, step):
                _heap_pop(heap_t, heap_r, heap_v, heap_n, h)
                continue
            return h, v, free_at if kind == RIPE else heap_t[h, 0]
    return -1, -1, np.inf


@njit(cache=True)
def _enter(heap_t, heap_r, heap_v, heap_n, v, d, free_at, rank, inputs_at, version):
    """(Re)file pair (v, d) under its current estimate; an earlier entry of the pair lapses. The
    caller made room for one entry in both of d's heaps."""
    p = v * (heap_n.shape[0] // 2) + d
    version[p] += 1
    if inputs_at[p] <= free_at:
        _heap_push(heap_t, heap_r, heap_v, heap_n, 2 * d + RIPE, 0.0, rank[v], version[p])
    else:
        _heap_push(heap_t, heap_r, heap_v, heap_n, 2 * d + WAITING, inputs_at[p], rank[v], version[p])


@njit(cache=True)
def _ripen(heap_t, heap_r, heap_v, heap_n, d, free_at):
    """Device d is next free at ``free_at``: the waiting pairs whose inputs are there by then move
    to the ripe heap, where they all start at ``free_at`` and only their rank orders them. The
    caller made room in the ripe heap for all of the waiting one."""
    h = 2 * d + WAITING
    while heap_n[h] > 0 and heap_t[h, 0] <= free_at:
        r, version = heap_r[h, 0], heap_v[h, 0]
        _heap_pop(heap_t, heap_r, heap_v, heap_n, h)
        _heap_push(heap_t, heap_r, heap_v, heap_n, 2 * d + RIPE, 0.0, r, version)


@njit(cache=True)
def _open_start(v, kept_for, device_free, inputs_at, device, blocked, step):
    """v's earliest start on a device open to it (not kept for another favorite child)."""
    n_dev = device_free.shape[0]
    best = np.inf
    for o in range(n_dev):
        if (kept_for[o] < 0 or kept_for[o] == v) and _allowed(v, o, n_dev, device, blocked, step):
            best = min(best, max(device_free[o], inputs_at[v * n_dev + o]))
    return best


@njit(cache=True)
def _claim_run(v, d, start_us, finish_us, finish, schedule_claim):
    """Check ``v`` running on ``d`` in the schedule-following memory model; book it if it fits."""
    if not run_claim(v, d, start_us, finish_us, False, finish, *schedule_claim):
        return False
    run_claim(v, d, start_us, finish_us, True, finish, *schedule_claim)
    return True


@njit(cache=True)
def schedule(
    time_us, op_gap_us, level, favorite, use_favorites, group, group_ptr, group_members,
    succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, edge_bytes, edge_fixed_us,
    latency_us, bandwidth, model,
    device, reserved, temp_max, capacity, copy_counted, static_bytes, copy_bytes, temp_bytes, moves,
    track_schedule, schedule_claim, schedule_release,
):
    """The list scheduler. Returns (status, start, finish, order, stuck op); status 1 = out of memory.

    With ``track_schedule`` memory is checked by ``_memory.run_claim`` over the schedule being built
    (its arrays are ``schedule_claim`` and ``schedule_release``, ``device`` is theirs), else by the
    never-freeing ``_memory.claim``. A pair refused there drops out of the heaps; with the
    schedule-following model it is filed again once the next op is booked (that may free memory).

    A pair's key is (start, rank, device), rank ordering ops by bottom level (longest first), then
    index. Each device keeps its ready pairs in two heaps: ``RIPE`` (inputs there by the time the
    device is free, so all start then; keyed by rank) and ``WAITING`` (keyed by when the inputs
    arrive), so its first pair is at the top of one of them. Entries are dropped lazily when found
    stale. m-SCT's rule needs no full scan either: let B be the best pair on the devices open to its
    op. A pair on a device kept for another child that precedes B and is not urgent has an open
    device starting its op no later, so its op is B's op; past at most that one, the device's next
    pair either is urgent or comes after B. With no pair open in that sense, every pair on a kept
    device is urgent, so the plain ETF fallback never has anything left to find."""
    n, n_dev = time_us.shape
    start = np.zeros(n)
    finish = np.zeros(n)
    order = np.full(n, -1, np.int64)
    arrival = np.full(n * n_dev, -1.0)
    # the last step at which a pair did not fit: for good with the never-freeing model, until the
    # next op is booked when memory follows the schedule (booking an op may free memory anywhere)
    blocked = np.full(n * n_dev, -1, np.int64)
    refused = np.empty(n * n_dev if track_schedule else 0, np.int64)   # pairs blocked at this step
    n_refused = 0
    stamp = np.zeros(n * n_dev, np.int64)
    tick = 0
    delta = np.zeros(n_dev)
    free_us = channel_state(n_dev)
    scratch = channel_state(n_dev)
    device_free = np.zeros(n_dev)
    kept_for = np.full(n_dev, -1, np.int64)     # m-SCT: the favorite child a device waits for
    scheduled = np.zeros(n, np.bool_)
    waiting = np.zeros(n, np.int64)
    op_of_rank = np.argsort(-level, kind="mergesort")
    rank = np.empty(n, np.int64)
    rank[op_of_rank] = np.arange(n)
    # when each ready op's inputs could be on each device: a lower bound kept up to date lazily, as
    # channels only get busier; the winning pair is recomputed exactly before it is committed
    inputs_at = np.zeros(n * n_dev)
    version = np.zeros(n * n_dev, np.int64)
    heap_t = np.empty((2 * n_dev, 64))
    heap_r = np.empty((2 * n_dev, 64), np.int64)
    heap_v = np.empty((2 * n_dev, 64), np.int64)
    heap_n = np.zeros(2 * n_dev, np.int64)
    held_h = np.empty(n, np.int64)
    held_t = np.empty(n)
    held_r = np.empty(n, np.int64)
    held_version = np.empty(n, np.int64)
    ready_ops = np.empty(n, np.int64)           # the ready set, only to name an op when stuck
    slot_of = np.full(n, -1, np.int64)
    n_ready = 0
    for v in range(n):
        waiting[v] = pred_ptr[v + 1] - pred_ptr[v]
        if waiting[v] == 0:
            ready_ops[n_ready] = v
            slot_of[v] = n_ready
            n_ready += 1
            for o in range(n_dev):
                if _allowed(v, o, n_dev, device, blocked, 0):
                    if max(heap_n[2 * o], heap_n[2 * o + 1]) == heap_t.shape[1]:
                        heap_t, heap_r, heap_v = _grown(heap_t, heap_r, heap_v)
                    _enter(heap_t, heap_r, heap_v, heap_n, v, o, device_free[o], rank, inputs_at, version)
    step = 0
    while step < n:
        best_t, best_r, best_d, best_v = np.inf, n, n_dev, -1
        for d in range(n_dev):      # B: the best pair on a device open to its op
            k = kept_for[d] if use_favorites else -1
            if k < 0:
                _, v, t = _first(heap_t, heap_r, heap_v, heap_n, d, device_free[d], op_of_rank, version,
                                 scheduled, device, blocked, step)
            elif waiting[k] == 0 and not scheduled[k] and _allowed(k, d, n_dev, device, blocked, step):
                v, t = k, max(device_free[d], inputs_at[k * n_dev + d])
            else:
                continue
            if v >= 0 and _precedes(t, rank[v], best_t, best_r):
                best_t, best_r, best_d, best_v = t, rank[v], d, v
        for d in range(n_dev if use_favorites else 0):     # urgent pairs on kept devices
            k = kept_for[d]
            if k < 0:
                continue
            n_held = 0
            while True:
                h, v, t = _first(heap_t, heap_r, heap_v, heap_n, d, device_free[d], op_of_rank, version,
                                 scheduled, device, blocked, step)
                if v < 0 or v == k or not (_precedes(t, rank[v], best_t, best_r) or (
                        t == best_t and rank[v] == best_r and d < best_d)):
                    break
                if t < _open_start(v, kept_for, device_free, inputs_at, device, blocked, step):
                    best_t, best_r, best_d, best_v = t, rank[v], d, v
                    break
                held_h[n_held], held_t[n_held], held_r[n_held] = h, heap_t[h, 0], heap_r[h, 0]
                held_version[n_held] = heap_v[h, 0]
                n_held += 1
                _heap_pop(heap_t, heap_r, heap_v, heap_n, h)
            for i in range(n_held):
                _heap_push(heap_t, heap_r, heap_v, heap_n, held_h[i], held_t[i], held_r[i], held_version[i])
        if best_v < 0:
            return 1, start, finish, order, ready_ops[0] if n_ready > 0 else -1
        v, d = best_v, best_d
        exact = _inputs_ready(v, d, False, device, finish, arrival, pred_ptr, pred_edge, edge_src,
                              edge_bytes, edge_fixed_us, latency_us, bandwidth, model, free_us, scratch)
        if exact > inputs_at[v * n_dev + d]:
            inputs_at[v * n_dev + d] = exact     # channels got busier since: look again
            if max(heap_n[2 * d], heap_n[2 * d + 1]) == heap_t.shape[1]:
                heap_t, heap_r, heap_v = _grown(heap_t, heap_r, heap_v)
            _enter(heap_t, heap_r, heap_v, heap_n, v, d, device_free[d], rank, inputs_at, version)
            continue
        inputs_at[v * n_dev + d] = exact
        best_t = max(device_free[d], exact)
        if track_schedule:
            if not _claim_run(v, d, best_t, best_t + time_us[v, d] + op_gap_us, finish, schedule_claim):
                blocked[v * n_dev + d] = step
                refused[n_refused] = v * n_dev + d
                n_refused += 1
                continue
        elif device[v] < 0:
            ops = members_of(v, group, group_ptr, group_members)
            tick += 1
            if not claim(ops, d, False, delta, stamp, tick, device, reserved, temp_max, capacity,
                         copy_counted, static_bytes, copy_bytes, temp_bytes,
                         succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves):
                blocked[v * n_dev + d] = n
                continue
            tick += 1
            claim(ops, d, True, delta, stamp, tick, device, reserved, temp_max, capacity,
                  copy_counted, static_bytes, copy_bytes, temp_bytes,
                  succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves)
        _inputs_ready(v, d, True, device, finish, arrival, pred_ptr, pred_edge, edge_src,
                      edge_bytes, edge_fixed_us, latency_us, bandwidth, model, free_us, scratch)
        start[v] = best_t
        finish[v] = best_t + time_us[v, d] + op_gap_us
        device_free[d] = finish[v]
        if track_schedule:
            release_inputs(v, finish, *schedule_release)
        scheduled[v] = True
        order[v] = step
        step += 1
        n_ready -= 1
        ready_ops[slot_of[v]] = ready_ops[n_ready]
        slot_of[ready_ops[n_ready]] = slot_of[v]
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
                slot_of[w] = n_ready
                n_ready += 1
                for o in range(n_dev):
                    if _allowed(w, o, n_dev, device, blocked, step):
                        inputs_at[w * n_dev + o] = _inputs_ready(
                            w, o, False, device, finish, arrival, pred_ptr, pred_edge, edge_src,
                            edge_bytes, edge_fixed_us, latency_us, bandwidth, model, free_us, scratch)
                        if max(heap_n[2 * o], heap_n[2 * o + 1]) == heap_t.shape[1]:
                            heap_t, heap_r, heap_v = _grown(heap_t, heap_r, heap_v)
                        _enter(heap_t, heap_r, heap_v, heap_n, w, o, device_free[o], rank, inputs_at, version)
        for i in range(n_refused):      # memory may have been freed: refused pairs compete again
            w, o = refused[i] // n_dev, refused[i] % n_dev
            if not scheduled[w] and _allowed(w, o, n_dev, device, blocked, step):
                if max(heap_n[2 * o], heap_n[2 * o + 1]) == heap_t.shape[1]:
                    heap_t, heap_r, heap_v = _grown(heap_t, heap_r, heap_v)
                _enter(heap_t, heap_r, heap_v, heap_n, w, o, device_free[o], rank, inputs_at, version)
        n_refused = 0
        while heap_n[2 * d] + heap_n[2 * d + 1] > heap_t.shape[1]:
            heap_t, heap_r, heap_v = _grown(heap_t, heap_r, heap_v)
        _ripen(heap_t, heap_r, heap_v, heap_n, d, device_free[d])
    return 0, start, finish, order, -1


def schedule_args(graph, cluster, memory: MemoryModel, favorite: np.ndarray | None,
                  timed: ScheduleMemory | None = None) -> tuple:
    """The arguments of ``schedule`` for a graph, cluster, fresh memory models and favorite children.

    Given ``timed``, memory follows the schedule in it; else ``memory``, the never-freeing model,
    decides (``schedule`` still takes the other model's arrays, unused)."""
    time_us = op_times_us(graph, cluster)
    level = bottom_levels(graph.topo_order, graph.succ_ptr, graph.succ_edge, graph.edge_dst,
                          time_us.mean(axis=1), mean_edge_us(graph, cluster))
    use_favorites = favorite is not None
    if favorite is None:
        favorite = np.full(graph.n_ops, -1, dtype=np.int64)
    track = timed is not None
    if timed is None:
        timed = ScheduleMemory(graph, cluster.memory_bytes)
    return (
        time_us, float(cluster.op_gap_us), level, np.asarray(favorite, dtype=np.int64), use_favorites,
        graph.colocation, memory.group_ptr, memory.group_members,
        graph.succ_ptr, graph.succ_edge, graph.pred_ptr, graph.pred_edge, graph.edge_src, graph.edge_dst,
        graph.edge_bytes, graph.edge_fixed_us, cluster.message_latency_us, cluster.bandwidth_bytes_per_us,
        planning_model(cluster.comm_model_code),
        timed.device if track else memory.device, memory.reserved_bytes, memory.temp_max, memory.capacity,
        memory.copy_counted, memory.static_bytes, memory.copy_bytes, memory.temp_bytes, memory.moves,
        track, timed.claim_args(), timed.release_args(),
    )


def run_list_schedule(graph, cluster, *, algo: str, favorite: np.ndarray | None = None,
                      budget_bytes: np.ndarray | None = None):
    """Schedule ``graph`` on ``cluster``: (devices, order, start_us, finish_us) as the scheduler sees them.

    ``favorite[i]`` is op i's favorite child (-1: none); given, the m-SCT keep-idle rule applies.
    ``budget_bytes`` (one per device) switches memory to the model that follows the schedule
    (``_memory.ScheduleMemory``) with those limits; without it, the sound never-freeing model."""
    check_can_fit(graph, cluster, algo)
    memory = MemoryModel(graph, cluster)
    timed = None if budget_bytes is None else ScheduleMemory(graph, budget_bytes)
    status, start, finish, order, stuck = schedule(*schedule_args(graph, cluster, memory, favorite, timed))
    if status != 0:
        raise out_of_memory(graph, cluster, algo, stuck_op=int(stuck) if stuck >= 0 else None)
    return (memory.device if timed is None else timed.device).copy(), order, start, finish


def list_schedule(graph, cluster, *, algo: str, favorite: np.ndarray | None = None,
                  budget_bytes: np.ndarray | None = None) -> Placement:
    """A Placement whose priority is the schedule order, so the simulator follows the scheduler."""
    devices, order, _, finish = run_list_schedule(graph, cluster, algo=algo, favorite=favorite,
                                                  budget_bytes=budget_bytes)
    placement = Placement(devices=devices, priority=order.astype(np.float64))
    placement.options = {"predicted_step_us": float(finish.max()) if graph.n_ops else 0.0}
    return placement
