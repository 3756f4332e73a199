"""A coarse graph and the map back to the original ops: what every graph-shrinking transform returns.

``coarse_of[i]`` is the coarse op that stands for original op ``i``. A placement of the coarse graph
expands to the original by indexing (``devices[coarse_of]``); a coarse priority expands so that ops
sharing a coarse op keep their topological order among themselves.

``quotient`` builds the coarse graph of any grouping whose quotient is acyclic. Its figures:

- compute time per device kind: the sum over members (they run one after another on one device);
- persistent bytes: the sum; output bytes: the sum over members whose output leaves the coarse op
  (it stays alive until a consumer elsewhere has finished, and it is what a transfer copies);
  temp bytes: the members' temps plus the outputs used only inside. Every member's memory is
  thus held for the whole run of the coarse op, which is never less than in the original graph
  when the ops run in the same order: a coarse placement that fits is meant to fit expanded (the
  feasibility check on the original graph still has the last word, since the expanded schedule
  may interleave other ops);
- edges between two coarse ops are merged into one: bytes (and fixed_us) are summed over the
  distinct producers, taking for each producer the largest of its edges into that coarse op, as a
  tensor is sent once per device. fixed_us is NaN only if every merged edge had none.

>>> from devplace.graph import chain_graph
>>> c = quotient(chain_graph([1.0, 2.0, 3.0]), [0, 0, 1])
>>> c.graph.n_ops, c.graph.compute_us[:, 0].tolist(), c.expand([1, 0]).tolist()
(2, [3.0, 3.0], [1, 1, 0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.errors import PlacementError
from devplace.graph import OpGraph, Role
from devplace.placement import Placement


@dataclass(eq=False)
class Coarsening:
    original: OpGraph
    graph: OpGraph
    coarse_of: np.ndarray

    @property
    def n_coarse(self) -> int:
        return self.graph.n_ops

    def members(self, coarse_op: int) -> np.ndarray:
        """The original ops a coarse op stands for (ascending)."""
        return np.flatnonzero(self.coarse_of == coarse_op)

    def expand(self, devices) -> np.ndarray:
        """Coarse device indices -> one device per original op."""
        devices = np.asarray(devices, dtype=np.int64)
        if len(devices) != self.graph.n_ops:
            raise PlacementError(
                f"the coarse placement has {len(devices)} entries for {self.graph.n_ops} coarse ops: "
                f"it was made for another coarse graph"
            )
        return devices[self.coarse_of]

    def expand_priority(self, priority) -> np.ndarray:
        """Coarse priorities -> ranks 0..n-1 ordered by (coarse priority, original topological rank)."""
        priority = np.asarray(priority, dtype=np.float64)[self.coarse_of]
        order = np.lexsort((self.original.topo_rank, priority))
        ranks = np.empty(len(order), dtype=np.float64)
        ranks[order] = np.arange(len(order), dtype=np.float64)
        return ranks

    def expand_placement(self, placement) -> Placement:
        if not isinstance(placement, Placement):
            placement = Placement(devices=np.asarray(placement, dtype=np.int64))
        return Placement(
            devices=self.expand(placement.devices),
            algorithm=placement.algorithm,
            options=dict(placement.options),
            priority=None if placement.priority is None else self.expand_priority(placement.priority),
        )

    def then(self, further: "Coarsening") -> "Coarsening":
        """This coarsening followed by one of its coarse graph."""
        if further.original is not self.graph:
            raise ValueError("the further coarsening must start from this coarsening's coarse graph")
        return Coarsening(self.original, further.graph, further.coarse_of[self.coarse_of])


def _distinct(keys: np.ndarray, return_inverse: bool = False):
    """np.unique of int keys by sorting (numpy 2's hashing unique is several times slower here)."""
    order = np.argsort(keys, kind="stable") if return_inverse else None
    ordered = keys[order] if return_inverse else np.sort(keys)
    new = np.ones(len(ordered), dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    if not return_inverse:
        return ordered[new]
    inverse = np.empty(len(keys), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


def identity(graph: OpGraph) -> Coarsening:
    return Coarsening(graph, graph, np.arange(graph.n_ops, dtype=np.int64))


def quotient(
    graph: OpGraph,
    coarse_of,
    *,
    colocation=None,
    colocation_names: list[str] | None = None,
    keep_edge: np.ndarray | None = None,
    persistent_bytes: np.ndarray | None = None,
    output_bytes: np.ndarray | None = None,
    temp_bytes: np.ndarray | None = None,
) -> Coarsening:
    """Contract each set of ops sharing a ``coarse_of`` id into one op (ids must be 0..C-1).

    ``colocation`` (one entry per coarse op, -1 for none) names the coarse graph's colocation
    groups; ``keep_edge`` drops edges; the byte arrays override the graph's per-op figures. Raises
    GraphError, naming the cycle, if the grouping's quotient is cyclic.
    """
    coarse_of = np.ascontiguousarray(coarse_of, dtype=np.int64)
    n_coarse = int(coarse_of.max()) + 1 if len(coarse_of) else 0
    if np.count_nonzero(np.bincount(coarse_of, minlength=n_coarse)) != n_coarse:
        raise ValueError("coarse ids must be 0..C-1 with none unused")
    persistent = graph.persistent_bytes if persistent_bytes is None else np.asarray(persistent_bytes, float)
    output = graph.output_bytes if output_bytes is None else np.asarray(output_bytes, float)
    temp = graph.temp_bytes if temp_bytes is None else np.asarray(temp_bytes, float)

    src, dst = graph.edge_src, graph.edge_dst
    kept = np.ones(graph.n_edges, dtype=bool) if keep_edge is None else np.asarray(keep_edge, dtype=bool)
    cs, cd = coarse_of[src], coarse_of[dst]
    external = kept & (cs != cd)

    # memory: outputs read outside the coarse op stay outputs, the rest is held as a temporary
    leaves = np.zeros(graph.n_ops, dtype=bool)
    leaves[src[external & ~graph.edge_order_only]] = True
    out_c = np.bincount(coarse_of, weights=np.where(leaves, output, 0.0), minlength=n_coarse)
    temp_c = np.bincount(coarse_of, weights=temp + np.where(leaves, 0.0, output), minlength=n_coarse)
    pers_c = np.bincount(coarse_of, weights=persistent, minlength=n_coarse)
    compute_c = np.zeros((n_coarse, len(graph.device_kinds)))
    np.add.at(compute_c, coarse_of, graph.compute_us)

    # edges: per (producer op, coarse consumer) the largest edge, then summed per coarse pair
    e = np.flatnonzero(external)
    edge_src = edge_dst = np.zeros(0, dtype=np.int64)
    edge_bytes = edge_fixed = np.zeros(0)
    edge_order_only = np.zeros(0, dtype=bool)
    if len(e):
        prod, cons = src[e], cd[e]
        order = np.lexsort((cons, prod))
        prod, cons, eo = prod[order], cons[order], e[order]
        new = np.ones(len(eo), dtype=bool)
        new[1:] = (prod[1:] != prod[:-1]) | (cons[1:] != cons[:-1])
        starts = np.flatnonzero(new)
        byte_max = np.maximum.reduceat(graph.edge_bytes[eo], starts)
        fixed = graph.edge_fixed_us[eo]
        has_fixed = np.logical_or.reduceat(~np.isnan(fixed), starts)
        fixed_max = np.maximum.reduceat(np.nan_to_num(fixed, nan=0.0), starts)
        pair_src, pair_dst = coarse_of[prod[starts]], cons[starts]
        key = pair_src * n_coarse + pair_dst
        ukey, inverse = _distinct(key, return_inverse=True)
        edge_src, edge_dst = ukey // n_coarse, ukey % n_coarse
        edge_bytes = np.bincount(inverse, weights=byte_max, minlength=len(ukey))
        any_fixed = np.bincount(inverse, weights=has_fixed.astype(float), minlength=len(ukey)) > 0
        edge_fixed = np.where(any_fixed, np.bincount(inverse, weights=fixed_max, minlength=len(ukey)), np.nan)
        reads = ~np.logical_and.reduceat(graph.edge_order_only[eo], starts)   # a coarse edge only orders if all do
        edge_order_only = np.bincount(inverse, weights=reads.astype(float), minlength=len(ukey)) == 0

    # names, kinds, roles, mirrors: vectorised over coarse ops, only fused ones get a new name
    order = np.argsort(coarse_of, kind="stable")
    bounds = np.searchsorted(coarse_of[order], np.arange(n_coarse + 1))
    count = np.diff(bounds)
    first = order[bounds[:-1]]
    names = [graph.names[i] for i in first.tolist()]
    kinds = [graph.kinds[i] for i in first.tolist()]
    fused = np.flatnonzero(count > 1)
    if len(fused):
        used = set(graph.names)
        for c, i, k in zip(fused.tolist(), first[fused].tolist(), count[fused].tolist()):
            name = f"{graph.names[i]}[+{k - 1}]"
            while name in used:
                name += "'"
            used.add(name)
            names[c] = name
            kinds[c] = "fused"
    # all members alike: their role; mixed: forward if any member is forward, else the smallest code;
    # with FORWARD = 0 both are the smallest role of the members
    role = np.minimum.reduceat(graph.role[order].astype(np.int8), bounds[:-1]) if n_coarse else \
        np.empty(0, dtype=np.int8)
    # a backward coarse op mirrors the coarse op of its first member (by index) that mirrors an op,
    # unless that op is inside it
    mirror = np.full(n_coarse, -1, dtype=np.int64)
    if n_coarse:
        has_mirror = graph.mirror[order] >= 0
        position = np.where(has_mirror, np.arange(len(order)), len(order))
        first_mirroring = np.minimum.reduceat(position, bounds[:-1])
        found = (first_mirroring < bounds[1:]) & (role == Role.BACKWARD)
        c = np.flatnonzero(found)
        target = coarse_of[graph.mirror[order[first_mirroring[c]]]]
        keep = target != c
        mirror[c[keep]] = target[keep]

    if colocation is None:
        colocation = np.full(n_coarse, -1, dtype=np.int64)
        colocation_names = []
    coarse = OpGraph(
        names=names, kinds=kinds, device_kinds=list(graph.device_kinds), compute_us=compute_c,
        persistent_bytes=pers_c, output_bytes=out_c, temp_bytes=temp_c,
        colocation=np.asarray(colocation, dtype=np.int64), colocation_names=list(colocation_names or []),
        role=role, mirror=mirror, edge_src=edge_src, edge_dst=edge_dst, edge_bytes=edge_bytes,
        edge_fixed_us=edge_fixed, edge_order_only=edge_order_only,
        meta=dict(graph.meta) | {"coarsened_from_ops": graph.n_ops},
    )
    return Coarsening(graph, coarse, coarse_of)


def colocation_of_pieces(group_of_piece: np.ndarray, prefix: str = "group") -> tuple[np.ndarray, list[str]]:
    """Coarse colocation for pieces: pieces sharing a group id are colocated if there are several."""
    group_of_piece = np.asarray(group_of_piece, dtype=np.int64)
    if not len(group_of_piece):
        return np.zeros(0, dtype=np.int64), []
    sizes = np.bincount(group_of_piece)
    multi = np.flatnonzero(sizes > 1)
    new_id = np.full(len(sizes), -1, dtype=np.int64)
    new_id[multi] = np.arange(len(multi))
    return new_id[group_of_piece], [f"{prefix}{g}" for g in multi]
