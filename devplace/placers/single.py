"""Baseline: every op on one device, the fastest one that holds the whole step."""

from __future__ import annotations

import numpy as np

from devplace.errors import OutOfMemoryError
from devplace.placers import NO_OPTIONS, register
from devplace.sim import Simulator


@register("single", "all ops on the fastest single device that fits in memory")
def place(graph, cluster, *, seed: int = 0, options=NO_OPTIONS) -> np.ndarray:
    sim = Simulator(graph, cluster)
    best_device, best_time = None, np.inf
    needs = []
    for d in range(cluster.n_devices):
        devices = np.full(graph.n_ops, d, dtype=np.int64)
        result = sim.run(devices)
        needs.append(result.peak_memory_bytes[d])
        if result.fits and result.step_time_us < best_time:
            best_device, best_time = d, result.step_time_us
    if best_device is None:
        d = int(np.argmax(cluster.memory_bytes))
        raise OutOfMemoryError(
            f"the step needs {needs[d] / 2**30:.3f} GiB on one device but the largest, "
            f"{cluster.devices[d].name!r}, has {cluster.memory_bytes[d] / 2**30:.3f} GiB: "
            f"place it across devices instead"
        )
    return np.full(graph.n_ops, best_device, dtype=np.int64)
