"""The memory models Baechi's placers use while placing.

Two models. The one Baechi's placers try first follows the schedule they build and frees a tensor
after its last reader (``ScheduleMemory``, further down); the simulator need not run that schedule
as predicted, so ``place_within_memory`` checks the result by simulation and falls back to the
sound model here, an upper bound on the simulator's peak whatever the schedule.

The sound model does not know when each op will run, so it cannot tell when an activation dies.
It therefore reserves on a device, and never frees:

- the persistent bytes (weights, optimizer state) of every op placed there,
- the output bytes of every op placed there (an activation kept for backward lives that long anyway),
- one received copy of a producer's output per (producer, device) pair, once an edge that really
  moves data (a fixed transfer time > 0, or bytes > 0) joins that producer to a consumer there; a
  copy is charged the most the simulator charges for one, ``received_copy_bytes``,
- the largest temporary of the ops placed there: a device runs one op at a time and the simulator
  frees a temporary when its op finishes, so at most one temporary is alive at once.

Every allocation the simulator makes (``devplace/sim/engine.py``) is counted here and none is ever
released, so a placement that fits this model fits the simulator: ``check_feasible`` cannot refuse
it. Freeing outputs after their last consumer was scheduled is tighter, but the simulator may run
the consumers later than the placer predicted, so that is not sound without the simulation check.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> m = MemoryModel(chain_graph([1.0, 1.0], edge_bytes=100), uniform_cluster(2))
>>> m.try_assign(0, 0), m.try_assign(1, 1), m.reserved_bytes.tolist()
(True, True, [100.0, 200.0])
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit

from devplace.errors import OutOfMemoryError
from devplace.placement import Placement

GIB = 2**30


def edge_moves_data(graph) -> np.ndarray:
    """Whether each edge makes the simulator send a copy when its ends are on two devices."""
    fixed = graph.edge_fixed_us
    return np.where(np.isnan(fixed), graph.edge_bytes > 0, fixed > 0)


def received_copy_bytes(graph) -> np.ndarray:
    """Per producer, the most a received copy of its output can take: its output bytes, or its
    largest edge that moves data if more. The simulator charges a copy the bytes sent to that
    device (and at least the output bytes), and a view or parameter sends bytes it does not own;
    on a graph that models no activation memory (``OpGraph.holds_activations``), nothing more."""
    if not graph.holds_activations:
        return graph.output_bytes
    moved = np.where(edge_moves_data(graph), graph.edge_bytes, 0.0)
    largest_sent = np.zeros(graph.n_ops)
    np.maximum.at(largest_sent, graph.edge_src, moved)
    return np.maximum(graph.output_bytes, largest_sent)


def group_csr(graph) -> tuple[np.ndarray, np.ndarray]:
    """Colocation groups as (pointer, members) arrays, for compiled code."""
    members = graph.colocation_members
    ptr = np.zeros(len(members) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(m) for m in members])
    flat = np.concatenate(members).astype(np.int64) if members else np.zeros(0, np.int64)
    return ptr, flat


@njit(cache=True)
def members_of(v, group, group_ptr, group_members):
    """The ops that must share ``v``'s device: its colocation group, or ``v`` alone."""
    g = group[v]
    if g < 0:
        out = np.empty(1, np.int64)
        out[0] = v
        return out
    return group_members[group_ptr[g] : group_ptr[g + 1]]


@njit(cache=True, inline="always")
def _count_copy(producer, dest, nbytes, n_dev, commit, delta, stamp, tick, copy_counted):
    """Count one received copy of ``producer``'s output on ``dest``, once per (producer, device)."""
    key = producer * n_dev + dest
    if copy_counted[key] or stamp[key] == tick:
        return
    stamp[key] = tick
    delta[dest] += nbytes
    if commit:
        copy_counted[key] = True


@njit(cache=True)
def claim(
    ops, d, commit, delta, stamp, tick,
    device, reserved, temp_max, capacity, copy_counted,
    static_bytes, copy_bytes, temp_bytes,
    succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves,
):
    """Bytes each device gains if the unassigned ``ops`` go to device ``d``; True if all fit.

    With ``commit`` the assignment is made (and the caller must only commit what fits). ``stamp``
    and ``tick`` deduplicate copies within one call without clearing an array each time."""
    n_dev = reserved.shape[0]
    for k in range(n_dev):
        delta[k] = 0.0
    largest_temp = 0.0
    for w in ops:
        delta[d] += static_bytes[w]
        if temp_bytes[w] > largest_temp:
            largest_temp = temp_bytes[w]
        for k in range(pred_ptr[w], pred_ptr[w + 1]):  # inputs from placed ops elsewhere: a copy here
            e = pred_edge[k]
            u = edge_src[e]
            if moves[e] and device[u] >= 0 and device[u] != d:
                _count_copy(u, d, copy_bytes[u], n_dev, commit, delta, stamp, tick, copy_counted)
        for k in range(succ_ptr[w], succ_ptr[w + 1]):  # readers placed elsewhere: a copy there
            e = succ_edge[k]
            dx = device[edge_dst[e]]
            if moves[e] and dx >= 0 and dx != d:
                _count_copy(w, dx, copy_bytes[w], n_dev, commit, delta, stamp, tick, copy_counted)
    if largest_temp > temp_max[d]:
        delta[d] += largest_temp - temp_max[d]
    fits = True
    for k in range(n_dev):
        if delta[k] > 0.0 and reserved[k] + delta[k] > capacity[k]:
            fits = False
    if commit:
        for k in range(n_dev):
            reserved[k] += delta[k]
        if largest_temp > temp_max[d]:
            temp_max[d] = largest_temp
        for w in ops:
            device[w] = d
    return fits


class MemoryModel:
    """The arrays of the model for one graph and cluster; compiled placers take them as arguments."""

    def __init__(self, graph, cluster):
        n, n_dev = graph.n_ops, cluster.n_devices
        self.graph, self.cluster = graph, cluster
        self.static_bytes = graph.persistent_bytes + graph.output_bytes
        self.copy_bytes = received_copy_bytes(graph)
        self.temp_bytes = graph.temp_bytes
        self.moves = edge_moves_data(graph)
        self.group_ptr, self.group_members = group_csr(graph)
        self.device = np.full(n, -1, dtype=np.int64)
        self.reserved_bytes = np.zeros(n_dev)
        self.temp_max = np.zeros(n_dev)
        self.capacity = cluster.memory_bytes
        self.copy_counted = np.zeros(n * n_dev, dtype=np.bool_)
        self.stamp = np.zeros(n * n_dev, dtype=np.int64)
        self.tick = 0
        self.delta = np.zeros(n_dev)

    def claim_args(self) -> tuple:
        g = self.graph
        return (
            self.device, self.reserved_bytes, self.temp_max, self.capacity, self.copy_counted,
            self.static_bytes, self.copy_bytes, self.temp_bytes,
            g.succ_ptr, g.succ_edge, g.pred_ptr, g.pred_edge, g.edge_src, g.edge_dst, self.moves,
        )

    def try_assign(self, op: int, device: int) -> bool:
        """Assign ``op`` (with its colocation group) to ``device`` if it fits; report whether it did."""
        ops = members_of(op, self.graph.colocation, self.group_ptr, self.group_members)
        self.tick += 1
        args = self.claim_args()
        if not claim(ops, device, False, self.delta, self.stamp, self.tick, *args):
            return False
        self.tick += 1
        claim(ops, device, True, self.delta, self.stamp, self.tick, *args)
        return True


# ------------------------------------------------------------------ running out of memory
def _need_figures(graph):
    """What any placement needs, as the simulator counts: every persistent byte somewhere, the
    largest op's output and temporaries beside them, a colocation group's persistent bytes and its
    largest member's on one device. Lower bounds: activations die after their last reader."""
    own = graph.persistent_bytes + graph.output_bytes + graph.temp_bytes
    running = graph.output_bytes + graph.temp_bytes
    total = float(graph.persistent_bytes.sum() + (running.max() if graph.n_ops else 0.0))
    group_need = [
        (float(graph.persistent_bytes[m].sum() + running[m].max()), graph.colocation_names[g])
        for g, m in enumerate(graph.colocation_members) if len(m)
    ]
    largest_group = max(group_need, default=(0.0, ""))
    return own, total, largest_group


def out_of_memory(graph, cluster, algo: str, stuck_op: int | None = None) -> OutOfMemoryError:
    """The error naming what the step needs against what the devices offer, and the largest ops."""
    own, total, (group_bytes, group_name) = _need_figures(graph)
    capacity = cluster.memory_bytes
    biggest = np.argsort(-own, kind="stable")[:3]
    ops = ", ".join(f"{graph.names[i]!r} {own[i] / GIB:.3f} GiB" for i in biggest)
    group = f", largest colocation group {group_name!r} {group_bytes / GIB:.3f} GiB" if group_name else ""
    offer = (f"the {cluster.n_devices} devices offer {capacity.sum() / GIB:.3f} GiB "
             f"(largest {capacity.max() / GIB:.3f} GiB)")
    if stuck_op is not None and total <= capacity.sum():
        # the step may fit: the placer's own accounting (which reserves more than the simulator
        # measures) ran out of room, so say that, not that the step is too big
        return OutOfMemoryError(
            f"{algo} found no device with room for op {graph.names[stuck_op]!r} as it fills the devices "
            f"(its accounting reserves memory the simulator may free); the step needs at least "
            f"{total / GIB:.3f} GiB and {offer}, so another placer (sim-search, m-sct) may fit it; "
            f"or give the devices more memory"
        )
    where = f" (stuck placing op {graph.names[stuck_op]!r})" if stuck_op is not None else ""
    return OutOfMemoryError(
        f"{algo} cannot fit the step{where}: it needs at least {total / GIB:.3f} GiB in total (weights, "
        f"optimizer state and the largest op's activations){group}, but {offer}; largest ops: {ops}; "
        f"give the devices more memory or add devices"
    )


def check_can_fit(graph, cluster, algo: str) -> None:
    """Refuse at once a step that no placement can fit: too big in total, or a group too big."""
    own, total, (group_bytes, _) = _need_figures(graph)
    capacity = cluster.memory_bytes
    single = float(own.max()) if graph.n_ops else 0.0
    if total > capacity.sum() or max(group_bytes, single) > capacity.max():
        raise out_of_memory(graph, cluster, algo)


# ------------------------------------------------------------------ memory over the schedule
# The model above never frees, so four devices with 2.4x the one-device peak can still be refused.
# ``ScheduleMemory`` follows the schedule a placer builds instead: an op's output and temporaries are
# allocated when it starts, a received copy from when its producer finished (the simulator sends it
# then; it is charged when its first consumer on the device is booked), the temporaries freed when
# the op finishes, and an output (or a copy) once every consumer of it has
# started and finished (the last finish: it also bounds the end of every transfer it fed). The
# placer's times are predictions that the simulator need not follow, so this is not an upper bound
# of the simulated peak: ``place_within_memory`` simulates what it returns and falls back to the
# sound model above when that does not fit.


@njit(cache=True, inline="always")
def earlier_edge_from(u, lo, k, pred_edge, edge_src):
    """Whether one of the in-edges at positions lo..k-1 comes from op u (a producer counts once)."""
    for j in range(lo, k):
        if edge_src[pred_edge[j]] == u:
            return True
    return False


@njit(cache=True)
def _pending_on(d, start_us, pool_time, pool_bytes, pool_n):
    """Bytes on device ``d`` whose free time is known and at most ``start_us`` (frees come first)."""
    total = 0.0
    for k in range(pool_n[d]):
        if pool_time[d, k] <= start_us:
            total += pool_bytes[d, k]
    return total


@njit(cache=True, inline="always")
def _push_free(at_us, d, nbytes, pool_time, pool_bytes, pool_n):
    """Book a free of ``nbytes`` on device ``d`` at ``at_us``: applied when ``d`` next starts an op."""
    k = pool_n[d]
    pool_time[d, k] = at_us
    pool_bytes[d, k] = nbytes
    pool_n[d] = k + 1


@njit(cache=True)
def _copy_window(d, since_us, hist_time, hist_n):
    """The first history entry of device ``d`` still running at ``since_us`` (entry k holds from its
    time to entry k + 1's): a copy sent at ``since_us`` is alive from that entry on."""
    k = hist_n[d] - 1
    while k > 0 and hist_time[d, k] > since_us:
        k -= 1
    return max(k, 0)


@njit(cache=True)
def run_claim(
    v, d, start_us, finish_us, commit, finish,
    group, group_ptr, group_members, device, persist, live, peak, capacity, copy_here,
    pool_time, pool_bytes, pool_n, hist_time, hist_live, hist_n,
    persistent_bytes, output_bytes, temp_bytes, copy_bytes, n_readers, pred_ptr, pred_edge, edge_src, moves,
):
    """Whether op ``v`` fits when it runs on device ``d`` from ``start_us`` to ``finish_us``.

    Starting there pins ``v``'s colocation group to ``d`` (its persistent bytes from then on). An
    input from another device arrives as a copy sent when its producer finished (``finish``), as
    the simulator sends it: the copy is charged to every history entry of ``d`` since then. An op
    pinned already always fits: it has nowhere else to go, and the simulation catches it. With
    ``commit`` the run is booked: frees due by ``start_us`` are applied, then the allocations."""
    n_dev = persist.shape[0]
    add_persist = 0.0
    if device[v] < 0:
        for w in members_of(v, group, group_ptr, group_members):
            add_persist += persistent_bytes[w]
    alloc = output_bytes[v] + temp_bytes[v]
    top = peak[d]
    lo, hi = pred_ptr[v], pred_ptr[v + 1]
    arriving = np.zeros(hi - lo)       # per in-edge: the copy it brings, and the history entry it is
    since = np.zeros(hi - lo, np.int64)   # charged from (the one running when its producer finished)
    first = hist_n[d]
    for k in range(lo, hi):
        e = pred_edge[k]
        u = edge_src[e]
        if moves[e] and device[u] != d and not copy_here[u * n_dev + d] \
                and not earlier_edge_from(u, lo, k, pred_edge, edge_src):
            alloc += copy_bytes[u]
            arriving[k - lo] = copy_bytes[u]
            since[k - lo] = _copy_window(d, finish[u], hist_time, hist_n)
            first = min(first, since[k - lo])
    for j in range(first, hist_n[d]):   # the history since the earliest copy was sent, with the copies
        extra = 0.0
        for k in range(hi - lo):
            if since[k] <= j:
                extra += arriving[k]
        if commit:
            hist_live[d, j] += extra
            top = max(top, hist_live[d, j])
        else:
            top = max(top, hist_live[d, j] + extra)
    now = live[d] - _pending_on(d, start_us, pool_time, pool_bytes, pool_n)
    fits = device[v] >= 0 or persist[d] + add_persist + max(top, now + alloc) <= capacity[d]
    if not commit:
        return fits
    k = 0
    while k < pool_n[d]:   # apply the frees due on d, keep the rest
        if pool_time[d, k] <= start_us:
            last = pool_n[d] - 1
            pool_time[d, k], pool_bytes[d, k] = pool_time[d, last], pool_bytes[d, last]
            pool_n[d] = last
        else:
            k += 1
    if device[v] < 0:
        for w in members_of(v, group, group_ptr, group_members):
            device[w] = d
    persist[d] += add_persist
    for k in range(lo, hi):
        u = edge_src[pred_edge[k]]
        if moves[pred_edge[k]] and device[u] != d:
            copy_here[u * n_dev + d] = True
    live[d] = now + alloc
    peak[d] = max(top, live[d])
    hist_time[d, hist_n[d]] = start_us
    hist_live[d, hist_n[d]] = live[d]
    hist_n[d] += 1
    _push_free(finish_us, d, temp_bytes[v], pool_time, pool_bytes, pool_n)
    if n_readers[v] == 0:   # nobody reads the output: it dies with the op
        _push_free(finish_us, d, output_bytes[v], pool_time, pool_bytes, pool_n)
    return fits


@njit(cache=True)
def release_inputs(
    v, finish, device, left, copy_here, free_at, pool_time, pool_bytes, pool_n,
    output_bytes, copy_bytes, succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, edge_order_only,
):
    """After ``v`` is booked: free each input whose readers have now all been booked (an
    ``order_only`` edge reads nothing, as in the simulator).

    ``finish`` holds every booked op's finish time; ``free_at`` is scratch, one value per device."""
    n_dev = free_at.shape[0]
    for k in range(pred_ptr[v], pred_ptr[v + 1]):
        if edge_order_only[pred_edge[k]]:
            continue
        u = edge_src[pred_edge[k]]
        left[u] -= 1
        if left[u] > 0:
            continue
        for x in range(n_dev):
            free_at[x] = -1.0
        last = finish[u]
        for j in range(succ_ptr[u], succ_ptr[u + 1]):
            if edge_order_only[succ_edge[j]]:
                continue
            w = edge_dst[succ_edge[j]]
            if finish[w] > last:
                last = finish[w]
            if finish[w] > free_at[device[w]]:
                free_at[device[w]] = finish[w]
        _push_free(last, device[u], output_bytes[u], pool_time, pool_bytes, pool_n)
        for x in range(n_dev):
            if x != device[u] and copy_here[u * n_dev + x]:
                _push_free(free_at[x], x, copy_bytes[u], pool_time, pool_bytes, pool_n)


class ScheduleMemory:
    """The arrays of the schedule-following model for one graph and per-device budget (bytes)."""

    def __init__(self, graph, budget_bytes: np.ndarray):
        n, n_dev = graph.n_ops, len(budget_bytes)
        self.graph = graph
        self.group_ptr, self.group_members = group_csr(graph)
        self.device = np.full(n, -1, dtype=np.int64)
        self.persist = np.zeros(n_dev)
        self.live = np.zeros(n_dev)
        self.peak = np.zeros(n_dev)
        self.capacity = np.asarray(budget_bytes, dtype=np.float64).copy()
        self.copy_here = np.zeros(n * n_dev, dtype=np.bool_)
        size = 2 * n + graph.n_edges + 1   # a temporary and an output per op, a copy per edge at most
        self.pool_time = np.zeros((n_dev, size))   # per device, the frees booked and not yet applied
        self.pool_bytes = np.zeros((n_dev, size))
        self.pool_n = np.zeros(n_dev, dtype=np.int64)
        self.n_readers = np.bincount(graph.edge_src[~graph.edge_order_only], minlength=n).astype(np.int64)
        self.left = self.n_readers.copy()
        self.free_at = np.zeros(n_dev)
        self.moves = edge_moves_data(graph)
        self.copy_bytes = received_copy_bytes(graph)
        self.hist_time = np.zeros((n_dev, n + 1))   # per device, each booked op's start and the bytes
        self.hist_live = np.zeros((n_dev, n + 1))   # alive from then to the next one's (copies added)
        self.hist_n = np.zeros(n_dev, dtype=np.int64)

    def claim_args(self) -> tuple:
        """The arguments of ``run_claim`` after ``finish``."""
        g = self.graph
        return (g.colocation, self.group_ptr, self.group_members, self.device, self.persist, self.live,
                self.peak, self.capacity, self.copy_here, self.pool_time, self.pool_bytes, self.pool_n,
                self.hist_time, self.hist_live, self.hist_n, g.persistent_bytes, g.output_bytes, g.temp_bytes,
                self.copy_bytes, self.n_readers, g.pred_ptr, g.pred_edge, g.edge_src, self.moves)

    def release_args(self) -> tuple:
        """The arguments of ``release_inputs`` after ``finish``."""
        g = self.graph
        return (self.device, self.left, self.copy_here, self.free_at, self.pool_time,
                self.pool_bytes, self.pool_n, g.output_bytes, self.copy_bytes, g.succ_ptr, g.succ_edge, g.pred_ptr,
                g.pred_edge, g.edge_src, g.edge_dst, g.edge_order_only)


SCHEDULE_ATTEMPTS = 6   # budgets tried over the schedule before the sound model
SCHEDULE_SHRINK = 0.9   # an overflowing device's budget shrinks at least this much per attempt


def place_within_memory(graph, cluster, run: Callable[[np.ndarray | None], Placement]) -> Placement:
    """The placement ``run(budget_bytes)`` makes with memory followed over its schedule, verified by
    simulation; ``run(None)`` (the sound model) if none fits.

    A device that overflows in simulation has its budget scaled by capacity / simulated peak (at
    most ``SCHEDULE_SHRINK``) and the placer runs again, at most ``SCHEDULE_ATTEMPTS`` times. ``options['memory_model']`` says which
    model placed it, so every placement returned fits the simulator."""
    from devplace.sim import Simulator

    simulator = Simulator(graph, cluster)
    capacity = np.asarray(cluster.memory_bytes, dtype=np.float64)
    budget = capacity.copy()
    attempts = 0
    while attempts < SCHEDULE_ATTEMPTS:
        attempts += 1
        try:
            placement = run(budget)
        except OutOfMemoryError:
            break   # stuck over the schedule: lower budgets would not help
        result = simulator.run(placement)
        if result.fits:
            placement.options |= {"memory_model": "schedule", "memory_attempts": attempts}
            return placement
        over = np.asarray(result.oom_devices)
        budget[over] *= np.minimum(capacity[over] / result.peak_memory_bytes[over], SCHEDULE_SHRINK)
    placement = run(None)
    placement.options |= {"memory_model": "never-free", "memory_attempts": attempts}
    return placement
