"""Baseline: DeepSpeed's ``PipelineModule`` stages, by ``partition_method`` "parameters" or "uniform".

A DeepSpeed user writes the model as a list of layers and lets ``PipelineModule`` cut it into one
contiguous run of layers per pipeline stage: "parameters" (DeepSpeed's default) balances the
trainable parameters per stage, "uniform" the number of layers. Here the layers are the capture's
(``devplace.placers._layers``: a numbered ``ModuleList`` element such as ``encoder.layers.3``, else a
module; in the order the step first uses them; op order without scopes), stage ``k`` is device ``k``,
a layer's parameters are its persistent bytes (weights and optimizer state, in proportion to the
parameter count when every parameter has one dtype and optimizer), and backward and update ops
follow their forward op, as a pipeline runs them; colocation groups move whole.

"parameters" finds, as DeepSpeed's ``partition_balanced`` does, the contiguous cut whose heaviest
stage is lightest; "uniform" gives each stage ``layers // stages`` layers and the first
``layers % stages`` stages one more (``partition_uniform``). DeepSpeed's ``type:REGEX`` method
(balancing the layers whose class matches) needs class names, which a graph does not record.

DeepSpeed does not look at memory when it cuts; neither does this placer. A step too big for the
devices together is refused at once; a cut that overflows one device is refused by
``devplace.place``'s simulation with an OutOfMemoryError naming the device.

>>> partition_balanced(np.array([4.0, 1.0, 1.0, 1.0, 1.0]), 2).tolist()
[0, 1, 5]
>>> partition_uniform(5, 2).tolist()
[0, 3, 5]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.placers import register
from devplace.placers._layers import UnitLayers
from devplace.placers._memory import check_can_fit
from devplace.placers.options import option

METHODS = ("parameters", "uniform")


@dataclass(frozen=True)
class PipelinePartitionOptions:
    method: str = option("parameters", "what the stages balance: parameters per stage (DeepSpeed's default) "
                                       "or layers per stage (uniform)", choices=METHODS)


def partition_uniform(n_layers: int, n_stages: int) -> np.ndarray:
    """Stage boundaries (``n_stages + 1`` layer indices): equal layer counts, the first stages one more."""
    base, extra = divmod(n_layers, n_stages)
    sizes = np.full(n_stages, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def partition_balanced(weights: np.ndarray, n_stages: int, rel_tol: float = 1e-9) -> np.ndarray:
    """Stage boundaries of the contiguous cut whose heaviest stage is lightest (to ``rel_tol``):
    bisect on the bottleneck, each probe filling stages greedily, as DeepSpeed does."""
    n = len(weights)
    if n <= n_stages:
        return partition_uniform(n, n_stages)
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    lo, hi = max(prefix[-1] / n_stages, float(np.max(weights))), prefix[-1]
    best = _greedy(prefix, n_stages, hi)
    while hi - lo > rel_tol * max(hi, 1.0):
        mid = (lo + hi) / 2
        probe = _greedy(prefix, n_stages, mid)
        if probe is None:
            lo = mid
        else:
            hi, best = mid, probe
    return best


def _greedy(prefix: np.ndarray, n_stages: int, bottleneck: float) -> np.ndarray | None:
    """Boundaries filling each stage with as many layers as fit under ``bottleneck``, or None."""
    n = len(prefix) - 1
    bounds = [0]
    for _ in range(n_stages):
        bounds.append(int(np.searchsorted(prefix, prefix[bounds[-1]] + bottleneck, side="right")) - 1)
    return np.array(bounds, dtype=np.int64) if bounds[-1] == n else None


@register("pipeline-partition", "DeepSpeed PipelineModule stages: contiguous layers per device, balanced by "
                                "parameters or uniform by layer count (a baseline users run today)",
          PipelinePartitionOptions)
def place(graph, cluster, *, seed: int = 0, options=PipelinePartitionOptions()) -> np.ndarray:
    # deterministic, so the seed is unused
    check_can_fit(graph, cluster, "pipeline-partition")
    layers = UnitLayers.of(graph)
    layer_of = layers.layer_of_unit()
    n_layers = int(layer_of.max()) + 1 if len(layer_of) else 0
    if options.method == "uniform":
        bounds = partition_uniform(n_layers, cluster.n_devices)
    else:
        bounds = partition_balanced(np.bincount(layer_of, weights=layers.param_bytes, minlength=n_layers),
                                    cluster.n_devices)
    stage_of_layer = np.searchsorted(bounds, np.arange(n_layers), side="right") - 1
    return layers.devices(stage_of_layer[layer_of])
