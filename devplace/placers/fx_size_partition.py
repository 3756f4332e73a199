"""Baseline: torch.fx's size-based partition (``Partitioner`` with ``PartitionMode.size_based``).

torch.fx's experimental accelerator partitioner fills devices greedily by memory: walking the graph's
nodes in order, it opens a partition on a free device that can hold the next node and keeps adding
nodes while the partition's parameters and outputs, plus the inputs it must receive from outside,
fit the device; then it opens the next. Nodes left once every device is taken go, one by one, to a
device with room; if none has room it gives up. Here:

- the nodes are units (``devplace.placers._layers``): a forward op with the backward and update
  ops that follow it, a colocation group whole, in step order (op order: fx partitions the forward
  graph, and autograd runs each backward op where its forward op ran);
- a unit's size is counted by the placing memory model Baechi's placers use (``_memory``):
  persistent and output bytes of its ops, one received copy of every input from another device,
  the largest temporary, never freed, so a split it accepts fits in simulation;
- the devices are opened in the cluster's order, each filled up to its whole memory (fx does not
  balance: the last devices may stay empty).

A step that does not fit raises an OutOfMemoryError naming the unit that found no room.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> place(chain_graph([1.0] * 4, edge_bytes=100), uniform_cluster(3, memory_bytes=250)).tolist()
[0, 0, 1, 2]

(each op keeps 100 bytes; ops 2 and 3 also hold the copy they receive, so each fills a device.)
"""

from __future__ import annotations

import numpy as np

from devplace.placers import NO_OPTIONS, register
from devplace.placers._layers import UnitLayers
from devplace.placers._memory import MemoryModel, check_can_fit, claim, out_of_memory


@register("fx-size-partition", "torch.fx's size-based partition: fill each device by parameter + activation "
                               "size in op order, then the next (a baseline users run today)")
def place(graph, cluster, *, seed: int = 0, options=NO_OPTIONS) -> np.ndarray:
    # deterministic, so the seed is unused
    check_can_fit(graph, cluster, "fx-size-partition")
    layers = UnitLayers.of(graph)
    order = np.argsort(layers.unit_of, kind="stable")
    ptr = np.concatenate([[0], np.cumsum(np.bincount(layers.unit_of, minlength=layers.n_units))])
    memory = MemoryModel(graph, cluster)
    args = memory.claim_args()

    def fits(ops: np.ndarray, device: int, commit: bool) -> bool:
        memory.tick += 1
        return claim(ops, device, commit, memory.delta, memory.stamp, memory.tick, *args)

    device = 0
    for u in range(layers.n_units):
        ops = order[ptr[u]:ptr[u + 1]]
        while device < cluster.n_devices and not fits(ops, device, False):
            device += 1
        target = device if device < cluster.n_devices else \
            next((d for d in range(cluster.n_devices) if fits(ops, d, False)), None)
        if target is None:
            raise out_of_memory(graph, cluster, "fx-size-partition", stuck_op=int(ops[0]))
        fits(ops, target, True)
    return memory.device.copy()
