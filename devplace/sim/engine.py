"""The compiled event loop that simulates one training step.

Semantics (docs/simulator.md says the same for users):

- Each device runs one op at a time, never preempted. When it is idle it starts, among the ops whose
  inputs have all arrived on it, the one with the lowest priority value (ties: lowest op index).
- An op placed on device d with time p starting at s finishes at s + p + op_gap.
- Messages can cost the devices themselves time (``send_overhead_us`` / ``recv_overhead_us``: a
  process that posts and completes transfers on the core it computes on). The sender owes its share
  for each transfer when the producing op finishes, the receiver when the transfer arrives; a device
  pays what it owes before starting its next op (at once when it is idle), so owed time delays its
  next op but never an op already running. Send overheads add up; receive overheads are a wake-up
  of the receiver's transport that takes in everything that has arrived: owed ones are paid once
  (the largest), and a message arriving while the device pays one costs nothing more.
- When op u finishes, its output is sent once to every other device that holds a consumer of u. The
  transfer time is the largest over those edges of ``channels.transfer_us`` (fixed_us if the edge
  has one, else latency + bytes / bandwidth; a zero-byte edge moves nothing and costs nothing).
  Transfers are booked first-come first-served on the channels of the communication model by
  ``channels.book`` (parallel, sequential, duplex or pipelined: see that module).
- Memory per device: persistent bytes from time 0; an op's output from its start until its last
  consumer on that device and its outgoing transfers have finished; a received copy from the start of
  its transfer until its last consumer there has finished; temporaries while the op runs. At equal
  times frees come before allocations; a block that would live for no time (the temporaries of a
  zero-time op) is not counted. An ``order_only`` edge's consumer is no consumer for memory: it keeps
  nothing allocated.

Everything is plain arrays so numba compiles it once (cached on disk) and a call costs microseconds.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from devplace.sim.channels import book, channel_state, transfer_us

EVENT_FINISH = 0
EVENT_ARRIVE = 1
EVENT_RECEIVED = 2  # a transfer reached its device: the receiver owes its overhead
EVENT_FREE = 3      # a device has paid what it owed


@njit(cache=True, inline="always")
def _before(time_a, key_a, time_b, key_b):
    return time_a < time_b or (time_a == time_b and key_a < key_b)


@njit(cache=True)
def _heap_push(heap_time, heap_key, base, size, time, key):
    """Push onto the binary min-heap stored at heap_*[base : base + size]; returns the new size."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if _before(time, key, heap_time[base + parent], heap_key[base + parent]):
            heap_time[base + i] = heap_time[base + parent]
            heap_key[base + i] = heap_key[base + parent]
            i = parent
        else:
            break
    heap_time[base + i] = time
    heap_key[base + i] = key
    return size + 1


@njit(cache=True)
def _heap_pop(heap_time, heap_key, base, size):
    """Remove the smallest entry; returns (time, key, new size)."""
    top_time = heap_time[base]
    top_key = heap_key[base]
    size -= 1
    last_time = heap_time[base + size]
    last_key = heap_key[base + size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _before(
            heap_time[base + child + 1], heap_key[base + child + 1], heap_time[base + child], heap_key[base + child]
        ):
            child += 1
        if _before(heap_time[base + child], heap_key[base + child], last_time, last_key):
            heap_time[base + i] = heap_time[base + child]
            heap_key[base + i] = heap_key[base + child]
            i = child
        else:
            break
    if size > 0:
        heap_time[base + i] = last_time
        heap_key[base + i] = last_key
    return top_time, top_key, size


@njit(cache=True, inline="always")
def _release(d, now, send_owed_us, recv_owed_us, paying_recv, device_busy, dispatch_pending, event_time, event_key,
             n_events, n_pending, free_key):
    """Device ``d`` stops running: it pays what it owes (busy until a FREE event) or becomes idle
    and asks for a dispatch. Returns the new (n_events, n_pending)."""
    owed = send_owed_us[d] + recv_owed_us[d]
    paying_recv[d] = recv_owed_us[d] > 0.0
    if owed > 0.0:
        n_events = _heap_push(event_time, event_key, 0, n_events, now + owed, free_key)
        send_owed_us[d] = 0.0
        recv_owed_us[d] = 0.0
    else:
        device_busy[d] = False
        if not dispatch_pending[d]:
            dispatch_pending[d] = True
            n_pending += 1
    return n_events, n_pending


@njit(cache=True, inline="always")
def destinations(u, du, devices, succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us, latency_us,
                 bandwidth_bytes_per_us, dest_duration, dest_delay, dest_bytes):
    """What op ``u`` on ``du`` sends when it finishes: per other device holding a consumer, the longest
    edge's (duration, delay) and the most bytes, written into ``dest_*`` (duration -1: nothing sent)."""
    for k in range(succ_ptr[u], succ_ptr[u + 1]):
        e = succ_edge[k]
        dv = devices[edge_dst[e]]
        if dv == du:
            continue
        duration, delay = transfer_us(edge_bytes[e], edge_fixed_us[e], latency_us[du, dv],
                                      bandwidth_bytes_per_us[du, dv])
        if duration > dest_duration[dv]:
            dest_duration[dv] = duration
            dest_delay[dv] = delay
        if edge_bytes[e] > dest_bytes[dv]:
            dest_bytes[dv] = edge_bytes[e]


@njit(cache=True)
def devices_in_range(devices, n_dev):
    """True if every device index is in [0, n_dev): the event loop does not check bounds."""
    for i in range(devices.shape[0]):
        if devices[i] < 0 or devices[i] >= n_dev:
            return False
    return True


class EngineState(NamedTuple):
    """Everything the event loop carries between events, so that a run can pause after any dispatch
    and go on later (``advance``), or go back to a saved state (``devplace.sim.incremental``).
    ``counters`` holds events in the heap, devices asking for a dispatch, transfers, dispatches so
    far and undo-log entries; ``clock[0]`` is the time now."""

    start: np.ndarray
    finish: np.ndarray
    ready: np.ndarray
    cause: np.ndarray                 # the input whose arrival made the op ready
    previous_on_device: np.ndarray
    waiting: np.ndarray               # inputs not yet arrived, per op
    xfer_op: np.ndarray               # transfers: at most one per (producer, destination device), so per edge
    xfer_src: np.ndarray
    xfer_dst: np.ndarray
    xfer_start: np.ndarray
    xfer_end: np.ndarray
    xfer_bytes: np.ndarray
    free_us: np.ndarray               # channel state (``channels.channel_state``)
    queue_base: np.ndarray            # per-device ready queues share one storage array, partitioned by op count
    queue_prio: np.ndarray
    queue_op: np.ndarray
    queue_size: np.ndarray
    device_busy: np.ndarray
    dispatch_pending: np.ndarray
    last_on_device: np.ndarray
    send_owed_us: np.ndarray          # message overheads a device must pay before its next op
    recv_owed_us: np.ndarray
    paying_recv: np.ndarray           # whether it is paying a receive
    event_time: np.ndarray
    event_key: np.ndarray
    counters: np.ndarray
    clock: np.ndarray


N_EVENTS, N_PENDING, N_XFER, N_DISPATCHED, N_LOGGED = 0, 1, 2, 3, 4   # EngineState.counters

# event key = kind in the high bits, op below: at equal times finishes come first, then
# arrivals, each by op index. Shifts decode it cheaper than // and %.
STRIDE = np.int64(1) << 40


@njit(cache=True)
def queue_layout(devices, n_dev):
    """Where each device's ready queue starts in the shared storage: ops per device, summed."""
    queue_base = np.zeros(n_dev + 1, np.int64)
    for i in range(devices.shape[0]):
        queue_base[devices[i] + 1] += 1
    for d in range(n_dev):
        queue_base[d + 1] += queue_base[d]
    return queue_base


@njit(cache=True)
def initial_state(in_degree, devices, n_dev, n_edges):
    """The state at time 0: nothing run, the ops without inputs arriving."""
    n = devices.shape[0]
    # pending arrivals (one per op at most) + one finish or free per device + one received per transfer
    capacity = n + n_dev + n_edges + 1
    s = EngineState(
        np.zeros(n), np.zeros(n), np.zeros(n), np.full(n, -1, np.int64), np.full(n, -1, np.int64), in_degree.copy(),
        np.empty(n_edges, np.int64), np.empty(n_edges, np.int64), np.empty(n_edges, np.int64),
        np.empty(n_edges), np.empty(n_edges), np.empty(n_edges),
        channel_state(n_dev), queue_layout(devices, n_dev), np.empty(max(n, 1)), np.empty(max(n, 1), np.int64),
        np.zeros(n_dev, np.int64), np.zeros(n_dev, np.bool_), np.zeros(n_dev, np.bool_), np.full(n_dev, -1, np.int64),
        np.zeros(n_dev), np.zeros(n_dev), np.zeros(n_dev, np.bool_),
        np.empty(capacity), np.empty(capacity, np.int64), np.zeros(5, np.int64), np.zeros(1),
    )
    n_events = 0
    for i in range(n):
        if in_degree[i] == 0:
            n_events = _heap_push(s.event_time, s.event_key, 0, n_events, 0.0, EVENT_ARRIVE * STRIDE + i)
    s.counters[N_EVENTS] = n_events
    return s


@njit(cache=True)
def advance(
    succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us,
    op_time_us, devices, priority, latency_us, bandwidth_bytes_per_us, comm_model, op_gap_us,
    send_overhead_us, recv_overhead_us, s, stop_after, undo_op, undo_ready, undo_cause, finish_logged, first_xfer,
):
    """Run the event loop from state ``s`` until the step ends (returns False) or until the
    ``stop_after``-th dispatch has been made (returns True; -1: never).

    With an undo log (``undo_*``, one entry per edge; None: none, compiled out), each change to an op's arrived
    inputs is logged first, and per op where its finish begins in the log and in the transfers
    (``finish_logged``, ``first_xfer``), so ``devplace.sim.incremental`` can take the run back to an earlier state."""
    start, finish, ready, cause, previous_on_device, waiting = (
        s.start, s.finish, s.ready, s.cause, s.previous_on_device, s.waiting)
    xfer_op, xfer_src, xfer_dst, xfer_start, xfer_end, xfer_bytes = (
        s.xfer_op, s.xfer_src, s.xfer_dst, s.xfer_start, s.xfer_end, s.xfer_bytes)
    free_us, queue_base, queue_prio, queue_op, queue_size = (
        s.free_us, s.queue_base, s.queue_prio, s.queue_op, s.queue_size)
    device_busy, dispatch_pending, last_on_device = s.device_busy, s.dispatch_pending, s.last_on_device
    send_owed_us, recv_owed_us, paying_recv = s.send_owed_us, s.recv_owed_us, s.paying_recv
    event_time, event_key = s.event_time, s.event_key
    n_events, n_pending, n_xfer, n_dispatched, n_logged = (
        s.counters[N_EVENTS], s.counters[N_PENDING], s.counters[N_XFER], s.counters[N_DISPATCHED],
        s.counters[N_LOGGED])
    now = s.clock[0]
    n_dev = latency_us.shape[0]
    stride = STRIDE
    dest_duration = np.full(n_dev, -1.0)
    dest_delay = np.zeros(n_dev)
    dest_bytes = np.zeros(n_dev)
    dest_arrival = np.zeros(n_dev)

    paused = False
    while True:
        if n_pending > 0 and (n_events == 0 or event_time[0] > now):
            # Dispatches at `now` run after every finish and arrival at `now`, lowest device first.
            # They are kept as flags, not heap events: one heap round-trip less per op.
            d = 0
            while not dispatch_pending[d]:
                d += 1
            dispatch_pending[d] = False
            n_pending -= 1
            if device_busy[d] or queue_size[d] == 0:
                continue
            _, v, queue_size[d] = _heap_pop(queue_prio, queue_op, queue_base[d], queue_size[d])
            start[v] = now
            finish[v] = now + op_time_us[v, d] + op_gap_us
            previous_on_device[v] = last_on_device[d]
            last_on_device[d] = v
            device_busy[d] = True
            n_events = _heap_push(event_time, event_key, 0, n_events, finish[v], EVENT_FINISH * stride + v)
            n_dispatched += 1
            if n_dispatched == stop_after:
                paused = True
                break
            continue
        if n_events == 0:
            break
        now, key, n_events = _heap_pop(event_time, event_key, 0, n_events)
        kind = key >> 40
        item = key & (stride - 1)
        if kind == EVENT_FINISH:
            u = item
            du = devices[u]
            if undo_op is not None:
                finish_logged[u] = n_logged
                first_xfer[u] = n_xfer
            destinations(u, du, devices, succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us, latency_us,
                         bandwidth_bytes_per_us, dest_duration, dest_delay, dest_bytes)
            for dv in range(n_dev):
                duration = dest_duration[dv]
                if duration < 0.0:
                    continue
                if duration == 0.0:
                    dest_arrival[dv] = now
                else:
                    begin = book(comm_model, free_us, du, dv, now, duration, dest_delay[dv])
                    dest_arrival[dv] = begin + duration
                    xfer_op[n_xfer] = u
                    xfer_src[n_xfer] = du
                    xfer_dst[n_xfer] = dv
                    xfer_start[n_xfer] = begin
                    xfer_end[n_xfer] = begin + duration
                    xfer_bytes[n_xfer] = dest_bytes[dv]
                    n_xfer += 1
                    send_owed_us[du] += send_overhead_us[du, dv]
                    if recv_overhead_us[du, dv] > 0.0:
                        n_events = _heap_push(event_time, event_key, 0, n_events, begin + duration,
                                              EVENT_RECEIVED * stride + du * n_dev + dv)
            # the device is free once it has paid for posting its sends
            n_events, n_pending = _release(du, now, send_owed_us, recv_owed_us, paying_recv, device_busy,
                                           dispatch_pending, event_time, event_key, n_events, n_pending,
                                           EVENT_FREE * stride + du)
            for k in range(succ_ptr[u], succ_ptr[u + 1]):
                v = edge_dst[succ_edge[k]]
                dv = devices[v]
                arrival = now if dv == du else dest_arrival[dv]
                if undo_op is not None:
                    undo_op[n_logged] = v
                    undo_ready[n_logged] = ready[v]
                    undo_cause[n_logged] = cause[v]
                    n_logged += 1
                if arrival > ready[v] or cause[v] < 0:
                    ready[v] = arrival
                    cause[v] = u
                waiting[v] -= 1
                if waiting[v] == 0:
                    if ready[v] > now:
                        n_events = _heap_push(event_time, event_key, 0, n_events, ready[v], EVENT_ARRIVE * stride + v)
                    else:
                        # ready now: queue it at once. Same outcome as an arrival event at `now`
                        # (those run before any dispatch at `now`), one heap round-trip less.
                        dv = devices[v]
                        queue_size[dv] = _heap_push(queue_prio, queue_op, queue_base[dv], queue_size[dv], priority[v], v)
                        if not device_busy[dv] and not dispatch_pending[dv]:
                            dispatch_pending[dv] = True
                            n_pending += 1
            for k in range(succ_ptr[u], succ_ptr[u + 1]):
                dv = devices[edge_dst[succ_edge[k]]]
                dest_duration[dv] = -1.0
                dest_bytes[dv] = 0.0
        elif kind == EVENT_ARRIVE:
            v = item
            dv = devices[v]
            queue_size[dv] = _heap_push(queue_prio, queue_op, queue_base[dv], queue_size[dv], priority[v], v)
            if not device_busy[dv] and not dispatch_pending[dv]:
                dispatch_pending[dv] = True
                n_pending += 1
        elif kind == EVENT_RECEIVED:
            du = item // n_dev
            dv = item - du * n_dev
            overhead = recv_overhead_us[du, dv]
            if not device_busy[dv]:  # idle: pay now
                device_busy[dv] = True
                paying_recv[dv] = True
                n_events = _heap_push(event_time, event_key, 0, n_events, now + overhead, EVENT_FREE * stride + dv)
            elif not paying_recv[dv]:  # running an op or paying sends: one wake-up after that
                recv_owed_us[dv] = max(recv_owed_us[dv], overhead)
        else:  # EVENT_FREE: paid; it may have received more meanwhile
            n_events, n_pending = _release(item, now, send_owed_us, recv_owed_us, paying_recv, device_busy,
                                           dispatch_pending, event_time, event_key, n_events, n_pending, key)

    s.counters[N_EVENTS] = n_events
    s.counters[N_PENDING] = n_pending
    s.counters[N_XFER] = n_xfer
    s.counters[N_DISPATCHED] = n_dispatched
    s.counters[N_LOGGED] = n_logged
    s.clock[0] = now
    return paused


@njit(cache=True)
def simulate_schedule(
    succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us, in_degree,
    op_time_us, devices, priority, latency_us, bandwidth_bytes_per_us, comm_model, op_gap_us,
    send_overhead_us, recv_overhead_us,
):
    """Run the event loop. Returns per-op start/finish/ready/cause/previous-on-device arrays and
    the transfers (producer op, source device, destination device, start, end, bytes)."""
    s = initial_state(in_degree, devices, latency_us.shape[0], edge_dst.shape[0])
    advance(succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us, op_time_us, devices, priority, latency_us,
            bandwidth_bytes_per_us, comm_model, op_gap_us, send_overhead_us, recv_overhead_us, s, -1,
            None, None, None, None, None)
    return schedule_of(s)


@njit(cache=True)
def schedule_of(s):
    """What ``simulate_schedule`` returns, read from a finished run's state."""
    n_xfer = s.counters[N_XFER]
    return (
        s.start, s.finish, s.ready, s.cause, s.previous_on_device,
        s.xfer_op[:n_xfer], s.xfer_src[:n_xfer], s.xfer_dst[:n_xfer],
        s.xfer_start[:n_xfer], s.xfer_end[:n_xfer], s.xfer_bytes[:n_xfer],
    )


@njit(cache=True, inline="always")
def _put(time, device, delta, owner, k, at, dev, nbytes, op):
    """Write memory event ``k``; returns the next free slot."""
    time[k] = at
    device[k] = dev
    delta[k] = nbytes
    owner[k] = op
    return k + 1


@njit(cache=True)
def memory_events(
    succ_ptr, succ_edge, edge_dst, edge_order_only, devices, n_dev, start, finish,
    persistent_bytes, output_bytes, temp_bytes,
    xfer_op, xfer_dst, xfer_start, xfer_end, xfer_bytes,
):
    """Allocations and frees as (time, device, delta bytes, op) plus the persistent-block length,
    unsorted: ``sorted_memory_events`` orders them by time, frees first.

    Persistent bytes come first at time 0, in op order, so an overflow there names the op that
    tipped the device over. A received copy takes the bytes sent (``xfer_bytes``; zeros for a
    graph that models no activation memory) and at least the producer's output bytes: a view, a
    parameter or an in-place op owns no new bytes where it runs, but the device it is sent to holds
    what arrives."""
    n = devices.shape[0]
    n_xfer = xfer_op.shape[0]
    copy_bytes = np.empty(n_xfer)
    for x in range(n_xfer):
        copy_bytes[x] = max(output_bytes[xfer_op[x]], xfer_bytes[x])
    # received copies: free when the last consumer on the receiving device has finished
    copy_free = np.zeros(n_xfer)
    first_xfer = np.full(n, -1, np.int64)
    for x in range(n_xfer - 1, -1, -1):
        first_xfer[xfer_op[x]] = x
    out_free = finish.copy()
    for u in range(n):
        for k in range(succ_ptr[u], succ_ptr[u + 1]):
            if edge_order_only[succ_edge[k]]:
                continue
            v = edge_dst[succ_edge[k]]
            if devices[v] == devices[u]:
                if finish[v] > out_free[u]:
                    out_free[u] = finish[v]
            else:
                x = first_xfer[u]
                while 0 <= x < n_xfer and xfer_op[x] == u:  # -1: u sent nothing (a zero-byte edge)
                    if xfer_dst[x] == devices[v] and finish[v] > copy_free[x]:
                        copy_free[x] = finish[v]
                    x += 1
    for x in range(n_xfer):
        u = xfer_op[x]
        # the sender keeps its output until the transfer has finished
        if xfer_end[x] > out_free[u]:
            out_free[u] = xfer_end[x]

    # three blocks: persistent (time 0, kept first), frees, allocations. Sorting the last two
    # stably by time puts frees before allocations at equal times. Zero-byte events and
    # allocations that would live for no time (a zero-time op's temporaries) are left out: they
    # change nothing, and freeing such a block before allocating it would dip below zero.
    size = n + 2 * n + n + 2 * n_xfer
    time = np.empty(size)
    device = np.empty(size, np.int64)
    delta = np.empty(size)
    owner = np.empty(size, np.int64)
    k = 0
    for u in range(n):
        if persistent_bytes[u] > 0.0:
            k = _put(time, device, delta, owner, k, 0.0, devices[u], persistent_bytes[u], u)
    n_persistent = k
    for u in range(n):
        keep_out = output_bytes[u] > 0.0 and out_free[u] > start[u]
        keep_temp = temp_bytes[u] > 0.0 and finish[u] > start[u]
        if keep_out and keep_temp and out_free[u] == finish[u]:
            k = _put(time, device, delta, owner, k, finish[u], devices[u], -(output_bytes[u] + temp_bytes[u]), u)
            continue
        if keep_out:
            k = _put(time, device, delta, owner, k, out_free[u], devices[u], -output_bytes[u], u)
        if keep_temp:
            k = _put(time, device, delta, owner, k, finish[u], devices[u], -temp_bytes[u], u)
    for x in range(n_xfer):
        if copy_bytes[x] > 0.0 and copy_free[x] > xfer_start[x]:
            k = _put(time, device, delta, owner, k, copy_free[x], xfer_dst[x], -copy_bytes[x], xfer_op[x])
    for u in range(n):
        allocated = 0.0
        if output_bytes[u] > 0.0 and out_free[u] > start[u]:
            allocated += output_bytes[u]
        if temp_bytes[u] > 0.0 and finish[u] > start[u]:
            allocated += temp_bytes[u]
        if allocated > 0.0:
            k = _put(time, device, delta, owner, k, start[u], devices[u], allocated, u)
    for x in range(n_xfer):
        if copy_bytes[x] > 0.0 and copy_free[x] > xfer_start[x]:
            k = _put(time, device, delta, owner, k, xfer_start[x], xfer_dst[x], copy_bytes[x], xfer_op[x])
    return time[:k], device[:k], delta[:k], owner[:k], n_persistent


@njit(cache=True)
def stable_argsort_nonnegative(values):
    """Stable argsort of finite floats >= 0 by LSD radix sort on their bits (6 passes of 11 bits).

    For such floats the IEEE bit pattern read as an integer orders like the value, so no compare
    is needed: 4x faster than numpy's stable sort on the 100k-event arrays of a large graph."""
    n = values.shape[0]
    radix = 11
    mask = (1 << radix) - 1
    n_pass = 6
    key = (values + 0.0).view(np.int64)  # + 0.0 turns -0.0 into 0.0
    counts = np.zeros((n_pass, mask + 2), np.int64)
    for i in range(n):
        k = key[i]
        for p in range(n_pass):
            counts[p, ((k >> (radix * p)) & mask) + 1] += 1
    order = np.arange(n)
    order_tmp = np.empty(n, np.int64)
    key_tmp = np.empty(n, np.int64)
    for p in range(n_pass):
        c = counts[p]
        if c.max() == n:  # every key has the same digit here: the pass would not move anything
            continue
        for b in range(1, mask + 2):
            c[b] += c[b - 1]
        shift = radix * p
        for i in range(n):
            k = key[i]
            d = (k >> shift) & mask
            j = c[d]
            c[d] = j + 1
            order_tmp[j] = order[i]
            key_tmp[j] = k
        order, order_tmp = order_tmp, order
        key, key_tmp = key_tmp, key
    return order


@njit(cache=True)
def sorted_memory_events(time, device, delta, owner, n_persistent):
    """Order ``memory_events``' output by time, stably, keeping the persistent block first."""
    rest = time[n_persistent:]
    if rest.shape[0] < 2048:  # small: no 6 x 2049 counters to clear
        order = np.argsort(rest, kind="mergesort")
    else:
        order = stable_argsort_nonnegative(rest)
    n = time.shape[0]
    out_time = np.empty(n)
    out_device = np.empty(n, np.int64)
    out_delta = np.empty(n)
    out_owner = np.empty(n, np.int64)
    for k in range(n):
        src = k if k < n_persistent else order[k - n_persistent] + n_persistent
        out_time[k] = time[src]
        out_device[k] = device[src]
        out_delta[k] = delta[src]
        out_owner[k] = owner[src]
    return out_time, out_device, out_delta, out_owner


@njit(cache=True)
def peak_memory(event_device, event_delta, event_owner, n_dev, capacity):
    """Peak bytes per device and, per device, the op whose allocation first exceeded its capacity."""
    current = np.zeros(n_dev)
    peak = np.zeros(n_dev)
    first_overflow = np.full(n_dev, -1, np.int64)
    for k in range(event_device.shape[0]):
        d = event_device[k]
        current[d] += event_delta[k]
        if current[d] > peak[d]:
            peak[d] = current[d]
            if first_overflow[d] < 0 and peak[d] > capacity[d]:
                first_overflow[d] = event_owner[k]
    return peak, first_overflow
