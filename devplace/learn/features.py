"""Placement units and what a policy sees of each: op types, output size and adjacency.

Both papers describe an op (or a group of ops) to the policy by three things: its operation type,
its output shape and its adjacency. devplace knows output sizes in bytes rather than shapes, so a
unit's vector is

- the count of each op kind in the unit (the ``MAX_KINDS - 1`` most frequent kinds of the graph,
  the rest counted as one "other" kind), as log(1 + count);
- log(1 + output bytes of its ops) and log(1 + bytes it holds for the whole step), scaled;
- adjacency: log(1 + edges in from other units), log(1 + edges out to other units), its position
  in the step and the mean positions of the units it reads from and writes to (0..1).

>>> from devplace.graph import chain_graph
>>> g = chain_graph([1.0, 2.0, 3.0], edge_bytes=8.0)
>>> unit_features(g, np.array([0, 0, 1])).shape
(2, 39)
"""

from __future__ import annotations

import numpy as np

from devplace.placers._moves import Units

MAX_KINDS = 32
N_FEATURES = MAX_KINDS + 7


def kind_ids(graph) -> np.ndarray:
    """Per op, its kind's rank among the graph's kinds by frequency (ties by name); rare kinds share the last id."""
    names, inverse, counts = np.unique(np.asarray(graph.kinds, dtype=object).astype(str),
                                       return_inverse=True, return_counts=True)
    order = np.lexsort((names, -counts))
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names))
    return np.minimum(rank[inverse], MAX_KINDS - 1)


def unit_kind_counts(graph, unit_of: np.ndarray, n_units: int) -> np.ndarray:
    """(n_units, MAX_KINDS) counts of each kind id in each unit."""
    counts = np.zeros((n_units, MAX_KINDS))
    np.add.at(counts, (unit_of, kind_ids(graph)), 1.0)
    return counts


def cross_unit_edges(graph, unit_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source unit, destination unit) of every edge between two different units."""
    src, dst = unit_of[graph.edge_src], unit_of[graph.edge_dst]
    across = src != dst
    return src[across], dst[across]


def unit_majority(op_devices: np.ndarray, unit_of: np.ndarray, n_devices: int, n_units: int | None = None) -> np.ndarray:
    """Per unit, the device most of its ops are on (the lowest index on a tie): how a per-op placement
    (a warm start, an episode's start) becomes one device per unit."""
    n_units = int(unit_of.max()) + 1 if n_units is None else n_units
    counts = np.bincount(unit_of * n_devices + np.asarray(op_devices), minlength=n_units * n_devices)
    return counts.reshape(n_units, n_devices).argmax(axis=1).astype(np.int64)


def unit_features(graph, unit_of: np.ndarray) -> np.ndarray:
    """(n_units, N_FEATURES) float32 features of units numbered 0..U-1 in step order."""
    unit_of = np.asarray(unit_of, dtype=np.int64)
    n_units = int(unit_of.max()) + 1 if len(unit_of) else 0
    counts = np.log1p(unit_kind_counts(graph, unit_of, n_units))
    output = np.bincount(unit_of, weights=graph.output_bytes, minlength=n_units)
    held = np.bincount(unit_of, weights=graph.persistent_bytes, minlength=n_units)
    src, dst = cross_unit_edges(graph, unit_of)
    position = np.arange(n_units) / max(n_units - 1, 1)
    n_in = np.bincount(dst, minlength=n_units).astype(float)
    n_out = np.bincount(src, minlength=n_units).astype(float)
    from_pos = np.bincount(dst, weights=position[src], minlength=n_units) / np.maximum(n_in, 1.0)
    to_pos = np.bincount(src, weights=position[dst], minlength=n_units) / np.maximum(n_out, 1.0)
    columns = [np.log1p(output) / 20.0, np.log1p(held) / 20.0, np.log1p(n_in), np.log1p(n_out),
               position, from_pos, to_pos]
    return np.concatenate([counts, np.stack(columns, axis=1)], axis=1).astype(np.float32)


def capped_units(graph, labels, max_units: int) -> Units:
    """Units from per-op ``labels``; above ``max_units``, consecutive units (in step order) merge into
    ``max_units`` runs of equal count, so each unit stays a slice of the step."""
    units = Units.from_labels(graph, labels)
    if units.n_units <= max_units:
        return units
    merged = np.arange(units.n_units) * max_units // units.n_units
    return Units.from_labels(graph, merged[units.unit_of])


def capped_units_along(graph, labels, max_units: int, op_devices: np.ndarray) -> Units:
    """As ``capped_units``, but a merge never crosses a change of device of the per-op placement
    ``op_devices`` (a warm start), so that placement stays expressible: each run of consecutive units the
    placement puts on one device gets at least one merged unit, and the rest of ``max_units`` is shared in
    proportion to the runs' lengths. With more such runs than ``max_units`` the runs themselves merge evenly."""
    units = Units.from_labels(graph, labels)
    if units.n_units <= max_units:
        return units
    device = unit_majority(op_devices, units.unit_of, int(np.max(op_devices)) + 1, units.n_units)
    run_of = np.concatenate([[0], np.cumsum(device[1:] != device[:-1])])
    n_runs = int(run_of[-1]) + 1
    if n_runs >= max_units:
        return Units.from_labels(graph, (run_of * max_units // n_runs)[units.unit_of])
    length = np.bincount(run_of)
    share = 1 + (max_units - n_runs) * length // units.n_units
    first = np.cumsum(length) - length
    position = np.arange(units.n_units) - first[run_of]
    merged = (np.cumsum(share) - share)[run_of] + position * share[run_of] // length[run_of]
    return Units.from_labels(graph, merged[units.unit_of])
