"""m-TOPO (Baechi's strawman): fill devices in topological order, about total/D memory each.

Ops are walked in topological order and put on the current device until it holds about its share
(the persistent and output bytes of the step over the number of devices); then the next device is
filled. Unlike Baechi, a device is never filled past its real capacity: the last device fills up to
capacity, and an op that still does not fit goes to the first device with room. A colocation group
goes where its first op goes, and only if it fits there. Whether an op fits is decided by memory
followed over the topological order (op k runs from time k to k + 1, ``_memory.ScheduleMemory``),
verified by simulation, else by the sound never-freeing model (``_memory.place_within_memory``).

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> place(chain_graph([1.0] * 4, edge_bytes=100), uniform_cluster(2)).devices.tolist()
[0, 0, 1, 1]
"""

from __future__ import annotations

import numpy as np
from numba import njit

from devplace.placers import NO_OPTIONS, register
from devplace.placement import Placement
from devplace.placers._memory import (MemoryModel, ScheduleMemory, check_can_fit, claim, members_of, out_of_memory,
                                      place_within_memory, release_inputs, run_claim)


@njit(cache=True, inline="always")
def _fits(v, ops, d, position, commit, track, finish, delta, stamp, tick, sound, timed_claim):
    """Whether ``v`` (its group ``ops``) fits on ``d``; ``commit`` books it. Over the schedule
    (``track``) the op at topological position k is taken to run from time k to k + 1."""
    if track:
        return run_claim(v, d, float(position), float(position + 1), commit, finish, *timed_claim)
    return claim(ops, d, commit, delta, stamp, tick, *sound)


@njit(cache=True)
def _fill(topo_order, share_bytes, n_dev, static_bytes, track, group, group_ptr, group_members, device,
          sound, timed_claim, timed_release):
    """Assign every op; returns -1, or the op that fits on no device.

    The current device takes ops while their persistent and output bytes stay within
    ``share_bytes`` (the last device takes any); whether an op fits is the memory model's call."""
    held = np.zeros(n_dev)
    delta = np.zeros(n_dev)
    stamp = np.zeros(device.shape[0] * n_dev, np.int64)
    finish = np.zeros(device.shape[0])
    tick = 0
    current = 0
    for k in range(topo_order.shape[0]):
        v = topo_order[k]
        if device[v] >= 0 and not track:
            continue
        ops = members_of(v, group, group_ptr, group_members)
        chosen = device[v]   # pinned (over the schedule only): it runs there, and fits by definition
        own = 0.0
        if chosen < 0:
            for w in ops:
                own += static_bytes[w]
        while chosen < 0 and current < n_dev:
            tick += 1
            if (current == n_dev - 1 or held[current] + own <= share_bytes) and \
                    _fits(v, ops, current, k, False, track, finish, delta, stamp, tick, sound, timed_claim):
                chosen = current
            elif current < n_dev - 1:
                current += 1
            else:
                break
        if chosen < 0:
            for d in range(n_dev):
                tick += 1
                if _fits(v, ops, d, k, False, track, finish, delta, stamp, tick, sound, timed_claim):
                    chosen = d
                    break
        if chosen < 0:
            return v
        held[chosen] += own
        tick += 1
        _fits(v, ops, chosen, k, True, track, finish, delta, stamp, tick, sound, timed_claim)
        if track:
            finish[v] = k + 1.0
            release_inputs(v, finish, *timed_release)
    return -1


def fill(graph, cluster, budget_bytes: np.ndarray | None) -> np.ndarray:
    """m-TOPO's devices: memory over the topological order within ``budget_bytes`` (per device),
    or by the sound never-freeing model when it is None."""
    memory = MemoryModel(graph, cluster)
    timed = ScheduleMemory(graph, cluster.memory_bytes if budget_bytes is None else budget_bytes)
    track = budget_bytes is not None
    need = float(memory.static_bytes.sum() + memory.temp_bytes.max(initial=0.0))
    device = timed.device if track else memory.device
    stuck = _fill(graph.topo_order, need / cluster.n_devices, cluster.n_devices, memory.static_bytes, track,
                  graph.colocation, memory.group_ptr, memory.group_members, device,
                  memory.claim_args(), timed.claim_args(), timed.release_args())
    if stuck >= 0:
        raise out_of_memory(graph, cluster, "m-topo", stuck_op=int(stuck))
    return device.copy()


@register("m-topo", "Baechi's topological-order fill: each device up to about total/D memory")
def place(graph, cluster, *, seed: int = 0, options=NO_OPTIONS) -> Placement:
    # deterministic, so the seed is unused
    check_can_fit(graph, cluster, "m-topo")
    return place_within_memory(graph, cluster, lambda budget: Placement(devices=fill(graph, cluster, budget)))
