"""Layers as users cut a model by hand: what Accelerate, DeepSpeed and torch.fx partition.

Those tools partition a model's forward pass (its modules, its layer list, its fx nodes); autograd
then runs each backward op where its forward op ran and the optimizer updates a parameter where it
lives. devplace's training graphs hold all three, so the user baselines move *units*: a forward op
with the backward and update ops that follow it, a colocation group whole (``leader_units(closed=True)``).
A unit with no forward op that has an input (a parameter with its optimizer state and updates)
joins the unit of its first reader, as a layer owns its weights. Units are numbered in step order:
by the first forward op with an input they hold.

Module structure comes from the scopes a capture records (``meta["op_scope"]``). A unit's path is
the scope of its first scoped forward op (else first scoped op); a unit without one (glue code: a residual add,
the loss) takes the path of the unit before it, as it runs with its neighbours. A *layer* is what a
user lists as one pipeline stage item or marks ``no_split`` in Transformers: a module path cut
after its first numbered part (``encoder.layers.3`` of ``encoder.layers.3.attn.q``, an element of a
``ModuleList``), else the whole path. A graph without scopes has no module structure: every unit is
its own top-level module and layer, named by its step position, so the baselines fill in op order.

>>> layer_key(("encoder", "layers", "3", "attn")), layer_key(("decoder", "proj"))
('encoder.layers.3', 'decoder.proj')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.graph import Role
from devplace.placers._moves import leader_units
from devplace.placers.expert import recorded_scopes


@dataclass(eq=False)
class UnitLayers:
    """The units of a graph in step order, each with its module path and held bytes."""

    unit_of: np.ndarray            # per op: its unit, numbered in step order
    paths: list[tuple[str, ...]]   # per unit: its module path
    held_bytes: np.ndarray         # per unit: persistent + output bytes of its ops (kept for the whole step)
    param_bytes: np.ndarray        # per unit: persistent bytes (weights and optimizer state)

    @classmethod
    def of(cls, graph) -> "UnitLayers":
        unit_of = _step_ordered_units(graph)
        n_units = int(unit_of.max()) + 1 if graph.n_ops else 0
        return cls(unit_of, _unit_paths(graph, unit_of, n_units),
                   np.bincount(unit_of, weights=graph.persistent_bytes + graph.output_bytes, minlength=n_units),
                   np.bincount(unit_of, weights=graph.persistent_bytes, minlength=n_units))

    @property
    def n_units(self) -> int:
        return len(self.paths)

    def layer_of_unit(self) -> np.ndarray:
        """Per unit, its layer, numbered by first appearance in the step (a layer called at several
        time steps, like a decoder cell, is one layer: its weights live in one place)."""
        return first_appearance([layer_key(p) for p in self.paths])

    def devices(self, unit_device: np.ndarray) -> np.ndarray:
        """Per op, the device of its unit."""
        return np.asarray(unit_device, dtype=np.int64)[self.unit_of]


def layer_key(path: tuple[str, ...]) -> str:
    """The layer a module path belongs to: cut after its first numbered part, else the whole path."""
    for k, part in enumerate(path):
        if part.isdigit():
            return ".".join(path[: k + 1])
    return ".".join(path)


def first_appearance(keys: list) -> np.ndarray:
    """Each key's number, keys numbered in the order they first appear."""
    numbers: dict = {}
    return np.array([numbers.setdefault(k, len(numbers)) for k in keys], dtype=np.int64)


def _step_ordered_units(graph) -> np.ndarray:
    """Per op, its unit (module docstring), numbered by the step position of the unit's anchor."""
    unit_of = leader_units(graph, closed=True).unit_of
    n_units = int(unit_of.max()) + 1 if graph.n_ops else 0
    rank = graph.topo_rank
    anchor = (graph.role == Role.FORWARD) & (np.diff(graph.pred_ptr) > 0)
    key = np.full(n_units, np.iinfo(np.int64).max)
    np.minimum.at(key, unit_of[anchor], rank[anchor])
    anchored = key < np.iinfo(np.int64).max
    if anchored.any() and not anchored.all():
        joined = np.arange(n_units)
        readers = anchored[unit_of[graph.edge_dst]] & ~anchored[unit_of[graph.edge_src]]
        first = np.full(n_units, np.iinfo(np.int64).max)
        np.minimum.at(first, unit_of[graph.edge_src[readers]], rank[graph.edge_dst[readers]])
        found = first < np.iinfo(np.int64).max
        joined[found] = unit_of[graph.topo_order[first[found]]]
        unit_of = joined[unit_of]
        # a unit nothing anchored reads stays alone, at the step position of its first op
        np.minimum.at(key, unit_of[~anchored[unit_of]], rank[~anchored[unit_of]])
    order = np.unique(unit_of)
    step = np.empty(n_units, dtype=np.int64)
    step[order[np.argsort(key[order], kind="stable")]] = np.arange(len(order))
    return step[unit_of]


def _unit_paths(graph, unit_of: np.ndarray, n_units: int) -> list[tuple[str, ...]]:
    scopes = recorded_scopes(graph)
    if not any(scopes):
        return [(str(u),) for u in range(n_units)]
    forward = graph.role == Role.FORWARD
    scoped = np.array([bool(s) for s in scopes])
    best = np.full(n_units, -1, dtype=np.int64)
    for v in graph.topo_order[::-1]:      # the earliest scoped op of each unit, forward ones first
        u = unit_of[v]
        if scoped[v] and (best[u] < 0 or forward[v] or not forward[best[u]]):
            best[u] = v
    paths, previous = [], ()
    for u in range(n_units):
        if best[u] >= 0:
            previous = tuple(scopes[best[u]].split("."))
        paths.append(previous)
    return paths
