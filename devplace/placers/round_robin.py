"""Baseline: deal ops out to devices in turn, ignoring time, communication and memory.

Op ``i`` goes to device ``i mod D``, except that a colocation group goes, whole, where its first op
(lowest index) would go. It may not fit memory; ``devplace.place`` then raises OutOfMemoryError.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> place(chain_graph([1.0] * 5), uniform_cluster(2)).tolist()
[0, 1, 0, 1, 0]
"""

from __future__ import annotations

import numpy as np

from devplace.placers import NO_OPTIONS, register
from devplace.transforms.coplacement import colocation_units


@register("round-robin", "op i on device i mod D (colocation groups kept whole); a naive baseline")
def place(graph, cluster, *, seed: int = 0, options=NO_OPTIONS) -> np.ndarray:
    units = colocation_units(graph)
    first_op = np.full(units.max() + 1 if graph.n_ops else 0, graph.n_ops, dtype=np.int64)
    np.minimum.at(first_op, units, np.arange(graph.n_ops))
    return first_op[units] % cluster.n_devices
