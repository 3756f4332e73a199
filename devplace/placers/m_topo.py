"""m-TOPO (Baechi's strawman): fill devices in topological order, about total/D memory each.

Ops are walked in topological order and put on the current device until it holds about its share
(the step's memory over the number of devices); then the next device is filled. Unlike Baechi, a
device is never filled past its real capacity: the last device fills up to capacity, and an op that
still does not fit goes to the first device with room. A colocation group goes where its first op
goes, and only if the whole group fits there. Memory follows the placer's model (``_memory``).

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> place(chain_graph([1.0] * 4, edge_bytes=100), uniform_cluster(2)).tolist()
[0, 0, 1, 1]
"""

from __future__ import annotations

import numpy as np
from numba import njit

from devplace.placers import NO_OPTIONS, register
from devplace.placers._memory import MemoryModel, check_can_fit, claim, members_of, out_of_memory


@njit(cache=True)
def _fill(
    topo_order, share_bytes, group, group_ptr, group_members,
    device, reserved, temp_max, capacity, copy_counted, static_bytes, output_bytes, temp_bytes,
    succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves,
):
    """Assign every op; returns -1, or the op that fits on no device."""
    n_dev = capacity.shape[0]
    delta = np.zeros(n_dev)
    stamp = np.zeros(device.shape[0] * n_dev, np.int64)
    tick = 0
    limit = capacity.copy()
    current = 0
    for v in topo_order:
        if device[v] >= 0:
            continue
        ops = members_of(v, group, group_ptr, group_members)
        chosen = -1
        while chosen < 0 and current < n_dev:
            limit[current] = min(capacity[current], share_bytes) if current < n_dev - 1 else capacity[current]
            tick += 1
            fits = claim(ops, current, False, delta, stamp, tick, device, reserved, temp_max, limit,
                         copy_counted, static_bytes, output_bytes, temp_bytes,
                         succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves)
            limit[current] = capacity[current]
            if fits:
                chosen = current
            elif current < n_dev - 1:
                current += 1
            else:
                break
        if chosen < 0:
            for d in range(n_dev):
                tick += 1
                if claim(ops, d, False, delta, stamp, tick, device, reserved, temp_max, capacity,
                         copy_counted, static_bytes, output_bytes, temp_bytes,
                         succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves):
                    chosen = d
                    break
        if chosen < 0:
            return v
        tick += 1
        claim(ops, chosen, True, delta, stamp, tick, device, reserved, temp_max, capacity,
              copy_counted, static_bytes, output_bytes, temp_bytes,
              succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves)
    return -1


@register("m-topo", "Baechi's topological-order fill: each device up to about total/D memory")
def place(graph, cluster, *, seed: int = 0, options=NO_OPTIONS) -> np.ndarray:
    # deterministic, so the seed is unused
    check_can_fit(graph, cluster, "m-topo")
    memory = MemoryModel(graph, cluster)
    need = float(memory.static_bytes.sum() + memory.temp_bytes.max(initial=0.0))
    stuck = _fill(graph.topo_order, need / cluster.n_devices, graph.colocation,
                  memory.group_ptr, memory.group_members, *memory.claim_args())
    if stuck >= 0:
        raise out_of_memory(graph, cluster, "m-topo", stuck_op=int(stuck))
    return memory.device.copy()
