"""Baseline: every op (every colocation group, whole) on a uniformly random device.

Seeded, so the same seed gives the same placement. It may not fit memory; ``devplace.place`` then
raises OutOfMemoryError.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> a = place(chain_graph([1.0] * 6), uniform_cluster(3), seed=7)
>>> a.tolist() == place(chain_graph([1.0] * 6), uniform_cluster(3), seed=7).tolist()
True
"""

from __future__ import annotations

import numpy as np

from devplace.placers import NO_OPTIONS, register
from devplace.transforms.coplacement import colocation_units


@register("random", "each op (colocation group) on a uniformly random device; seeded")
def place(graph, cluster, *, seed: int = 0, options=NO_OPTIONS) -> np.ndarray:
    units = colocation_units(graph)
    rng = np.random.default_rng(seed)
    n_units = int(units.max()) + 1 if graph.n_ops else 0
    return rng.integers(0, cluster.n_devices, size=n_units)[units]
