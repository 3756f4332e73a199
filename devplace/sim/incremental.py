"""Incremental re-simulation: after a move, run the step again only from where it can change.

A placer that moves one unit at a time and asks for the step time after each move (Placeto's
training episodes) would otherwise pay a whole simulation per move. ``IncrementalSimulator`` keeps
the run of its current placement, with a checkpoint of the engine's state
(``engine.EngineState``'s device clocks, ready queues, event heap and channels) every
``checkpoint_every`` dispatches and an undo log of the ops' arrived inputs. The run reads a moved
op's device when its producers finish (what they send, and when it arrives) and when its last input
arrives (the ready queue it joins; time 0 for an op without inputs). ``move`` takes the run back to
the last checkpoint strictly before the earliest of those reads that the move changes beyond the
op's own arrival: the op joining a queue, or a producer that now sends other transfers. A producer
that sends the same transfers has only delivered to another device: that arrival is patched on the
restored state (``_fix_arrivals``). Then the run goes on from there, on the new devices. The result
equals a full simulation float for float (``tests/test_incremental.py``).

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> inc = IncrementalSimulator(chain_graph([10.0, 20.0, 30.0]), uniform_cluster(2), [0, 0, 0])
>>> inc.move([2], 1), inc.result().start_us.tolist()
(60.0, [0.0, 10.0, 30.0])
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from devplace.errors import PlacementError
from devplace.sim import engine
from devplace.sim.engine import N_DISPATCHED, N_EVENTS, N_LOGGED, N_XFER, advance, destinations, queue_layout
from devplace.sim.result import SimResult
from devplace.sim.simulator import Simulator

CHECKPOINT_EVERY = 64   # dispatches between checkpoints: a move re-runs at most this many more than it must (32 and 128
                        # cost more to record on GNMT-8's 36k coarse ops)
HEAP_AT, QUEUE_AT = 5, 6   # Checkpoints.count columns after the engine's counters: where its heap and queues are


class Checkpoints(NamedTuple):
    """Saved engine states, row j taken right after dispatch j x checkpoint_every (row 0: at time 0).
    The event heap and the ready queues are stored packed in growable buffers outside (``Buffers``)."""

    count: np.ndarray        # (rows, 7) the engine's counters, then HEAP_AT and QUEUE_AT
    now: np.ndarray          # (rows,) the time it was taken
    free_us: np.ndarray      # (rows, devices + 2, devices) channel state
    owed_us: np.ndarray      # (rows, 2, devices) send and receive overheads owed
    device: np.ndarray       # (rows, 5, devices) queue size, busy, dispatch pending, last op, paying a receive


@njit(cache=True)
def _grown(buffer, needed):
    """``buffer`` if it holds ``needed`` items, else a copy at least twice as long."""
    if needed <= buffer.shape[0]:
        return buffer
    out = np.empty(max(needed, 2 * buffer.shape[0]), buffer.dtype)
    out[:buffer.shape[0]] = buffer
    return out


@njit(cache=True)
def _save(s, ck, j, heap_time, heap_key, queue_prio, queue_op):
    """Checkpoint ``s`` as row ``j``, its heap and queues after row j - 1's; returns the buffers."""
    heap_at, queue_at = 0, 0
    if j > 0:
        heap_at = ck.count[j - 1, HEAP_AT] + ck.count[j - 1, N_EVENTS]
        queue_at = ck.count[j - 1, QUEUE_AT] + ck.device[j - 1, 0].sum()
    n_events = s.counters[N_EVENTS]
    heap_time = _grown(heap_time, heap_at + n_events)
    heap_key = _grown(heap_key, heap_at + n_events)
    heap_time[heap_at:heap_at + n_events] = s.event_time[:n_events]
    heap_key[heap_at:heap_at + n_events] = s.event_key[:n_events]
    queued = s.queue_size.sum()
    queue_prio = _grown(queue_prio, queue_at + queued)
    queue_op = _grown(queue_op, queue_at + queued)
    q = queue_at
    for d in range(s.queue_size.shape[0]):
        base, size = s.queue_base[d], s.queue_size[d]
        queue_prio[q:q + size] = s.queue_prio[base:base + size]
        queue_op[q:q + size] = s.queue_op[base:base + size]
        q += size
    ck.count[j, :HEAP_AT] = s.counters
    ck.count[j, HEAP_AT] = heap_at
    ck.count[j, QUEUE_AT] = queue_at
    ck.now[j] = s.clock[0]
    ck.free_us[j] = s.free_us
    ck.owed_us[j, 0] = s.send_owed_us
    ck.owed_us[j, 1] = s.recv_owed_us
    ck.device[j, 0] = s.queue_size
    ck.device[j, 1] = s.device_busy
    ck.device[j, 2] = s.dispatch_pending
    ck.device[j, 3] = s.last_on_device
    ck.device[j, 4] = s.paying_recv
    return heap_time, heap_key, queue_prio, queue_op


@njit(cache=True)
def _restore(s, ck, j, devices, undo_op, undo_ready, undo_cause, finish_logged, first_xfer, heap_time, heap_key,
             queue_prio, queue_op):
    """Take ``s`` back to checkpoint row ``j``, its ready queues laid out for ``devices`` (the moved ops
    are in none yet). Start, finish and transfers after it need no undoing: the run writes them again."""
    for p in range(s.counters[N_LOGGED] - 1, ck.count[j, N_LOGGED] - 1, -1):
        v = undo_op[p]
        s.waiting[v] += 1
        s.ready[v] = undo_ready[p]
        s.cause[v] = undo_cause[p]
    s.counters[:] = ck.count[j, :HEAP_AT]
    s.clock[0] = ck.now[j]
    s.free_us[:] = ck.free_us[j]
    s.send_owed_us[:] = ck.owed_us[j, 0]
    s.recv_owed_us[:] = ck.owed_us[j, 1]
    s.queue_size[:] = ck.device[j, 0]
    s.device_busy[:] = ck.device[j, 1] != 0
    s.dispatch_pending[:] = ck.device[j, 2] != 0
    s.last_on_device[:] = ck.device[j, 3]
    s.paying_recv[:] = ck.device[j, 4] != 0
    n_events, heap_at = ck.count[j, N_EVENTS], ck.count[j, HEAP_AT]
    s.event_time[:n_events] = heap_time[heap_at:heap_at + n_events]
    s.event_key[:n_events] = heap_key[heap_at:heap_at + n_events]
    s.queue_base[:] = queue_layout(devices, s.queue_size.shape[0])
    q = ck.count[j, QUEUE_AT]
    for d in range(s.queue_size.shape[0]):
        base, size = s.queue_base[d], s.queue_size[d]
        s.queue_prio[base:base + size] = queue_prio[q:q + size]
        s.queue_op[base:base + size] = queue_op[q:q + size]
        q += size


@njit(cache=True)
def _run_recorded(succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us, op_time_us, devices, priority,
                  latency_us, bandwidth_bytes_per_us, comm_model, op_gap_us, send_overhead_us, recv_overhead_us,
                  s, ck, n_rows, every, undo_op, undo_ready, undo_cause, finish_logged, first_xfer, heap_time, heap_key,
                  queue_prio, queue_op):
    """Run ``s`` to the end, checkpointing every ``every`` dispatches from row ``n_rows`` on; returns the
    rows now valid and the buffers."""
    while True:
        if s.counters[N_DISPATCHED] == n_rows * every:
            heap_time, heap_key, queue_prio, queue_op = _save(s, ck, n_rows, heap_time, heap_key, queue_prio, queue_op)
            n_rows += 1
        if not advance(succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us, op_time_us, devices, priority,
                       latency_us, bandwidth_bytes_per_us, comm_model, op_gap_us, send_overhead_us, recv_overhead_us,
                       s, n_rows * every, undo_op, undo_ready, undo_cause, finish_logged, first_xfer):
            return n_rows, heap_time, heap_key, queue_prio, queue_op


@njit(cache=True)
def _sends_alike(u, old_devices, new_devices, succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us, latency_us,
                 bandwidth_bytes_per_us):
    """Whether op ``u`` (not moved) sends the same transfers under both placements when it finishes."""
    n_dev = latency_us.shape[0]
    before = (np.full(n_dev, -1.0), np.zeros(n_dev), np.zeros(n_dev))
    after = (np.full(n_dev, -1.0), np.zeros(n_dev), np.zeros(n_dev))
    du = old_devices[u]
    destinations(u, du, old_devices, succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us, latency_us,
                 bandwidth_bytes_per_us, before[0], before[1], before[2])
    destinations(u, du, new_devices, succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us, latency_us,
                 bandwidth_bytes_per_us, after[0], after[1], after[2])
    for d in range(n_dev):
        if before[0][d] != after[0][d] or before[1][d] != after[1][d] or before[2][d] != after[2][d]:
            return False
    return True


@njit(cache=True)
def _restart_us(moved, old_devices, new_devices, pred_ptr, pred_edge, edge_src, succ_ptr, succ_edge, edge_dst,
                edge_bytes, edge_fixed_us, latency_us, bandwidth_bytes_per_us, finish, finish_logged):
    """The earliest time the run reads a moved op's device in a way ``_fix_arrivals`` cannot patch: the
    op is queued on its device when its last input arrives (an op without inputs at time 0: -inf), and
    a producer that sends other transfers because of the move does so when it finishes."""
    first = np.inf
    for v in moved:
        if pred_ptr[v] == pred_ptr[v + 1]:
            return -np.inf
        last, last_logged = np.inf, -1
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            u = edge_src[pred_edge[k]]
            if finish_logged[u] > last_logged:
                last, last_logged = finish[u], finish_logged[u]
            if finish[u] < first and (old_devices[u] != new_devices[u] or not _sends_alike(
                    u, old_devices, new_devices, succ_ptr, succ_edge, edge_dst, edge_bytes, edge_fixed_us,
                    latency_us, bandwidth_bytes_per_us)):
                first = finish[u]
        first = min(first, last)
    return first


@njit(cache=True)
def _fix_arrivals(s, moved, logged, devices, pred_ptr, pred_edge, edge_src, finish, finish_logged, first_xfer):
    """After going back to a state with ``logged`` log entries: the arrival (ready, cause) of each moved
    op from the producers that finished before it, on its new device, as the engine would have found
    it. Those producers send the same transfers (``_restart_us``), so each arrival is one of them."""
    for v in moved:
        producers = edge_src[pred_edge[pred_ptr[v]:pred_ptr[v + 1]]]
        producers = producers[finish_logged[producers] < logged]
        ready, cause = 0.0, -1
        for u in producers[np.argsort(finish_logged[producers])]:   # in the order they finished
            arrival = finish[u]
            if devices[u] != devices[v]:
                x = first_xfer[u]
                while x < s.counters[N_XFER] and s.xfer_op[x] == u:
                    if s.xfer_dst[x] == devices[v]:
                        arrival = s.xfer_end[x]
                    x += 1
            if arrival > ready or cause < 0:
                ready, cause = arrival, u
        s.ready[v] = ready
        s.cause[v] = cause


class IncrementalSimulator:
    """One placement's simulated run, kept so that ``move`` re-simulates only what a move can change.

    ``resimulated_ops`` counts the dispatches re-run by moves so far (``moves`` of them), so
    ``resimulated_ops / (moves x n_ops)`` is the mean share of a full simulation a move cost."""

    def __init__(self, graph, cluster, placement, checkpoint_every: int = CHECKPOINT_EVERY):
        if checkpoint_every < 1:
            raise PlacementError(f"checkpoint_every is {checkpoint_every}: use 1 or more dispatches")
        self.sim = sim = Simulator(graph, cluster)
        placement = sim.checked(placement)
        g, c = sim.graph, cluster
        self.devices = placement.devices.copy()
        self.priority = sim.default_priority if placement.priority is None else placement.priority
        self.every = checkpoint_every
        n, n_dev = g.n_ops, c.n_devices
        self._state = engine.initial_state(sim.in_degree, self.devices, n_dev, g.n_edges)
        self._undo = (np.empty(g.n_edges, np.int64), np.empty(g.n_edges), np.empty(g.n_edges, np.int64),
                      np.zeros(n, np.int64), np.zeros(n, np.int64))
        rows = n // checkpoint_every + 2
        self._checkpoints = Checkpoints(np.zeros((rows, 7), np.int64), np.zeros(rows),
                                        np.zeros((rows, n_dev + 2, n_dev)), np.zeros((rows, 2, n_dev)),
                                        np.zeros((rows, 5, n_dev), np.int64))
        self._buffers = (np.empty(256), np.empty(256, np.int64), np.empty(256), np.empty(256, np.int64))
        self._rows = 0
        self.moves = 0
        self.resimulated_ops = 0
        self._run()

    def _run(self) -> None:
        g, c, sim = self.sim.graph, self.sim.cluster, self.sim
        self._rows, *buffers = _run_recorded(
            g.succ_ptr, g.succ_edge, g.edge_dst, g.edge_bytes, g.edge_fixed_us, sim.op_time_us, self.devices,
            self.priority, c.latency_us, c.bandwidth_bytes_per_us, c.comm_model_code, float(c.op_gap_us),
            c.send_overhead_us, c.recv_overhead_us, self._state, self._checkpoints, self._rows, self.every,
            *self._undo, *self._buffers)
        self._buffers = tuple(buffers)

    def move(self, ops, device: int) -> float:
        """Put ``ops`` (indices into the graph) on ``device`` and re-simulate; returns the step time."""
        ops = np.asarray(ops, dtype=np.int64)
        n, n_dev = self.sim.graph.n_ops, self.sim.cluster.n_devices
        if not 0 <= device < n_dev:
            raise PlacementError(f"move to device {device}: the cluster has devices 0..{n_dev - 1}")
        if len(ops) and (ops.min() < 0 or ops.max() >= n):
            raise PlacementError(f"move of op {int(ops.min() if ops.min() < 0 else ops.max())}: the graph has ops 0..{n - 1}")
        self.moves += 1
        moved = ops[self.devices[ops] != device]
        if not len(moved):
            return self.step_time_us
        g, c = self.sim.graph, self.sim.cluster
        new_devices = self.devices.copy()
        new_devices[moved] = device
        first_us = _restart_us(moved, self.devices, new_devices, g.pred_ptr, g.pred_edge, g.edge_src, g.succ_ptr,
                               g.succ_edge, g.edge_dst, g.edge_bytes, g.edge_fixed_us, c.latency_us,
                               c.bandwidth_bytes_per_us, self._state.finish, self._undo[3])
        # the last checkpoint taken strictly before that time (row 0, at time 0, always qualifies)
        row = max(int(np.searchsorted(self._checkpoints.now[:self._rows], first_us, side="left")) - 1, 0)
        self.devices = new_devices
        _restore(self._state, self._checkpoints, row, self.devices, *self._undo, *self._buffers)
        _fix_arrivals(self._state, moved, self._checkpoints.count[row, N_LOGGED], self.devices, g.pred_ptr,
                      g.pred_edge, g.edge_src, self._state.finish, self._undo[3], self._undo[4])
        self._rows = row + 1
        self.resimulated_ops += n - row * self.every
        self._run()
        return self.step_time_us

    @property
    def step_time_us(self) -> float:
        finish = self._state.finish
        return float(finish.max()) if len(finish) else 0.0

    @property
    def start_us(self) -> np.ndarray:
        """Per op, its start in the current run (a view: the next move changes it)."""
        return self._state.start

    @property
    def peak_memory_bytes(self) -> np.ndarray:
        """Per device, the current run's peak memory: ``result().peak_memory_bytes`` without copying the run."""
        return self.sim.memory_of(self.devices, engine.schedule_of(self._state))[3]

    def result(self) -> SimResult:
        """The current placement's full result (memory included), as ``Simulator.run`` gives it."""
        schedule = tuple(array.copy() for array in engine.schedule_of(self._state))
        return self.sim.result_of(self.devices.copy(), schedule)
