"""Baseline: Hugging Face Accelerate's ``device_map="auto"`` (``infer_auto_device_map``), on a training step.

What a Transformers user gets from ``from_pretrained(..., device_map="auto")``: the model's modules
in order, each put on the current device while it fits under that device's cap, else split into its
children if it may be split, else the next device takes it. Here (units and layers as
``devplace.placers._layers`` defines them):

1. a module is a module path of the capture's scopes; its size is what its ops keep on a device for
   the whole step (persistent bytes: weights and optimizer state; output bytes: the activations kept
   for backward), since Accelerate counts parameters for inference and a training step also holds
   these. Modules come in the order the step first uses them (Accelerate walks ``named_children``,
   the order a model defines them, which is usually the order it calls them);
2. a module too big for what is left on the current device is split into its children (its own ops
   first), as Accelerate does, except a *layer* (a numbered element of a ``ModuleList``: what
   Transformers' ``_no_split_modules`` names, e.g. ``GPT2Block``) and a leaf module, which are never
   split: they go to the next device whole;
3. each device's cap is ``max_memory_fraction`` of its memory (Accelerate, ``max_memory`` unset:
   all the memory each GPU has free, so 1.0), and, as "auto" means "balanced" (Accelerate's *Big
   Model Inference* guide: "auto" and "balanced" evenly split the model on all available GPUs;
   ``get_balanced_memory``), every device but the last is capped lower, at the total size over the
   number of devices plus a buffer of 1.25 times the larger of the largest layer and the mean leaf
   module. Accelerate's reserve of the largest layer on GPU 0 serves CPU offload, which devplace has
   not, so it is left out.

Backward and update ops follow their forward op; colocation groups move whole. A graph without
scopes is filled in op order. Modules left over when the last device is full raise an
OutOfMemoryError; the cap ignores received copies and temporaries, so ``devplace.place`` may still
refuse a placement that overflows in simulation.

>>> from devplace.graph import GraphBuilder
>>> from devplace.cluster import uniform_cluster
>>> b = GraphBuilder(["gpu"])
>>> _ = b.add_op("input", compute_us=1.0)
>>> for before, name in zip(["input", "a", "b", "c"], ["a", "b", "c", "d"]):
...     _ = b.add_op(name, compute_us=1.0, persistent_bytes=100.0)
...     b.add_edge(before, name)
>>> place(b.build(), uniform_cluster(2, memory_bytes=1000.0)).tolist()   # caps 400/2 + 1.25 * 100, 1000
[0, 0, 0, 0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.errors import PlacementError
from devplace.placers import register
from devplace.placers._layers import UnitLayers, first_appearance
from devplace.placers._memory import out_of_memory
from devplace.placers.options import option

BUFFER_FACTOR = 1.25   # get_balanced_memory's margin over the largest no-split block or mean leaf


@dataclass(frozen=True)
class AccelerateAutoOptions:
    max_memory_fraction: float = option(
        1.0, "share of each device's memory the map may fill (Accelerate's max_memory; unset it is all free "
             "memory, 1.0); every device but the last is further capped at an even share plus a buffer")


def _caps(layers: UnitLayers, cluster, fraction: float) -> np.ndarray:
    """Each device's cap: get_balanced_memory's even share plus buffer, the last device uncapped."""
    caps = fraction * cluster.memory_bytes.astype(float)
    layer_bytes = np.bincount(layers.layer_of_unit(), weights=layers.held_bytes)
    leaf_bytes = np.bincount(first_appearance(layers.paths), weights=layers.held_bytes)
    buffer = BUFFER_FACTOR * max(layer_bytes.max(initial=0.0), leaf_bytes.mean() if len(leaf_bytes) else 0.0)
    share = layers.held_bytes.sum() / cluster.n_devices + buffer
    caps[:-1] = np.minimum(caps[:-1], share)
    return caps


def _children(paths: list[tuple[str, ...]], units: np.ndarray, depth: int) -> list[np.ndarray]:
    """The items a module (units sharing a path of length ``depth``) splits into: its own ops and
    each child module, in the order the step first uses them."""
    number = first_appearance([paths[u][: depth + 1] for u in units])
    grouped = units[np.argsort(number, kind="stable")]
    return np.split(grouped, np.cumsum(np.bincount(number))[:-1])


@register("accelerate-auto", "Accelerate's device_map=\"auto\": modules in order, each device filled up to its "
                             "balanced memory cap, layers never split (a baseline users run today)",
          AccelerateAutoOptions)
def place(graph, cluster, *, seed: int = 0, options=AccelerateAutoOptions()) -> np.ndarray:
    # deterministic, so the seed is unused
    if not 0.0 < options.max_memory_fraction <= 1.0:
        raise PlacementError(f"option 'max_memory_fraction' of placer 'accelerate-auto' is "
                             f"{options.max_memory_fraction}: use a fraction in (0, 1]")
    layers = UnitLayers.of(graph)
    paths, held = layers.paths, layers.held_bytes
    caps = _caps(layers, cluster, options.max_memory_fraction)
    unit_device = np.zeros(layers.n_units, dtype=np.int64)
    queue = [(units, 1) for units in _children(paths, np.arange(layers.n_units), 0)]
    device, used = 0, 0.0
    while queue:
        units, depth = queue.pop(0)
        size = float(held[units].sum())
        if used + size <= caps[device]:
            unit_device[units], used = device, used + size
            continue
        path = paths[units[0]][:depth]
        if path and not any(part.isdigit() for part in path) and any(len(paths[u]) > depth for u in units):
            queue[:0] = [(part, depth + 1) for part in _children(paths, units, depth)]
            continue
        if device == cluster.n_devices - 1:
            raise out_of_memory(graph, cluster, "accelerate-auto", stuck_op=int(np.flatnonzero(
                np.isin(layers.unit_of, units))[0]))
        device, used = device + 1, 0.0
        queue.insert(0, (units, depth))
    return layers.devices(unit_device)
