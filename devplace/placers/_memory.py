"""The memory model Baechi's placers use while placing: an upper bound on the simulator's peak.

While a placer assigns ops it does not yet know when each op will run, so it cannot tell when an
activation dies. It therefore reserves on a device, and never frees:

- the persistent bytes (weights, optimizer state) of every op placed there,
- the output bytes of every op placed there (an activation kept for backward lives that long anyway),
- one received copy of a producer's output per (producer, device) pair, once an edge that really
  moves data (a fixed transfer time > 0, or bytes > 0) joins that producer to a consumer there,
- the largest temporary of the ops placed there: a device runs one op at a time and the simulator
  frees a temporary when its op finishes, so at most one temporary is alive at once.

Every allocation the simulator makes (``devplace/sim/engine.py``) is counted here and none is ever
released, so a placement that fits this model fits the simulator: ``check_feasible`` cannot refuse
it. Freeing outputs after their last consumer was scheduled would be tighter, but the simulator may
run the consumers later than the placer predicted, so it would not be sound.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> m = MemoryModel(chain_graph([1.0, 1.0], edge_bytes=100), uniform_cluster(2))
>>> m.try_assign(0, 0), m.try_assign(1, 1), m.reserved_bytes.tolist()
(True, True, [100.0, 200.0])
"""

from __future__ import annotations

import numpy as np
from numba import njit

from devplace.errors import OutOfMemoryError

GIB = 2**30


def edge_moves_data(graph) -> np.ndarray:
    """Whether each edge makes the simulator send a copy when its ends are on two devices."""
    fixed = graph.edge_fixed_us
    return np.where(np.isnan(fixed), graph.edge_bytes > 0, fixed > 0)


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
    static_bytes, output_bytes, temp_bytes,
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
                _count_copy(u, d, output_bytes[u], n_dev, commit, delta, stamp, tick, copy_counted)
        for k in range(succ_ptr[w], succ_ptr[w + 1]):  # readers placed elsewhere: a copy there
            e = succ_edge[k]
            dx = device[edge_dst[e]]
            if moves[e] and dx >= 0 and dx != d:
                _count_copy(w, dx, output_bytes[w], n_dev, commit, delta, stamp, tick, copy_counted)
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
        self.output_bytes = graph.output_bytes
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
            self.static_bytes, self.output_bytes, self.temp_bytes,
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
    static = graph.persistent_bytes + graph.output_bytes
    total = float(static.sum() + (graph.temp_bytes.max() if graph.n_ops else 0.0))
    group_need = [
        (float(static[m].sum() + graph.temp_bytes[m].max()), graph.colocation_names[g])
        for g, m in enumerate(graph.colocation_members) if len(m)
    ]
    largest_group = max(group_need, default=(0.0, ""))
    return static, total, largest_group


def out_of_memory(graph, cluster, algo: str, stuck_op: int | None = None) -> OutOfMemoryError:
    """The error naming what the step needs against what the devices offer, and the largest ops."""
    static, total, (group_bytes, group_name) = _need_figures(graph)
    capacity = cluster.memory_bytes
    own = static + graph.temp_bytes
    biggest = np.argsort(-own, kind="stable")[:3]
    ops = ", ".join(f"{graph.names[i]!r} {own[i] / GIB:.3f} GiB" for i in biggest)
    group = f", largest colocation group {group_name!r} {group_bytes / GIB:.3f} GiB" if group_name else ""
    where = f" (stuck placing op {graph.names[stuck_op]!r})" if stuck_op is not None else ""
    return OutOfMemoryError(
        f"{algo} cannot fit the step{where}: it needs {total / GIB:.3f} GiB in total{group}, without "
        f"the received copies, but the {cluster.n_devices} devices offer {capacity.sum() / GIB:.3f} GiB "
        f"(largest {capacity.max() / GIB:.3f} GiB); largest ops: {ops}; "
        f"give the devices more memory or add devices"
    )


def check_can_fit(graph, cluster, algo: str) -> None:
    """Refuse at once a step that no placement can fit: too big in total, or a group too big."""
    static, total, (group_bytes, _) = _need_figures(graph)
    capacity = cluster.memory_bytes
    single = float((static + graph.temp_bytes).max()) if graph.n_ops else 0.0
    if total > capacity.sum() or max(group_bytes, single) > capacity.max():
        raise out_of_memory(graph, cluster, algo)
