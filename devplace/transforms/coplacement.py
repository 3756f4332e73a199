"""Co-placement: group ops that should share a device, before any placer runs (Baechi, SoCC 2020).

Three rules, each joining two ops into one group (union-find, so groups are their closure):

- an op whose output is used by exactly one op joins that op: sending the tensor elsewhere could
  only add a transfer, never parallelism;
- a backward op joins the forward op it differentiates (``graph.mirror``): they share the
  activations and the parameters;
- the graph's own colocation groups are kept.

The result is one group id per op (0..G-1, numbered by first op), the input of ``fuse`` and of
``with_groups_as_colocation``.

>>> from devplace.graph import chain_graph
>>> coplacement_groups(chain_graph([1.0, 2.0, 3.0])).tolist()
[0, 0, 0]
"""

from __future__ import annotations

import numpy as np

from devplace.graph import OpGraph
from devplace.transforms.coarsening import colocation_of_pieces


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if ra < rb:
                self.parent[rb] = ra
            else:
                self.parent[ra] = rb


def _numbered(uf: _UnionFind, n: int) -> np.ndarray:
    """Group ids 0..G-1 in order of each group's first op."""
    roots = np.fromiter((uf.find(i) for i in range(n)), dtype=np.int64, count=n)
    _, first, inverse = np.unique(roots, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse]


def colocation_units(graph: OpGraph) -> np.ndarray:
    """The smallest legal grouping: one group per colocation group, every other op alone.

    Placers that move whole units (round-robin, random, metis) use it so they never split a group.

    >>> from devplace.graph import chain_graph
    >>> colocation_units(chain_graph([1.0, 2.0])).tolist()
    [0, 1]
    """
    uf = _UnionFind(graph.n_ops)
    for members in graph.colocation_members:
        for m in members[1:]:
            uf.union(int(members[0]), int(m))
    return _numbered(uf, graph.n_ops)


def coplacement_groups(graph: OpGraph, *, single_consumer: bool = True, mirror: bool = True) -> np.ndarray:
    """Baechi's co-placement groups (see the module docstring); one group id per op."""
    n = graph.n_ops
    uf = _UnionFind(n)
    for members in graph.colocation_members:
        for m in members[1:]:
            uf.union(int(members[0]), int(m))
    if single_consumer:
        for u in range(n):
            consumers = np.unique(graph.successors(u))
            if len(consumers) == 1:
                uf.union(u, int(consumers[0]))
    if mirror:
        for b in np.flatnonzero(graph.mirror >= 0):
            uf.union(int(b), int(graph.mirror[b]))
    return _numbered(uf, n)


def with_groups_as_colocation(graph: OpGraph, groups: np.ndarray, prefix: str = "coplace") -> OpGraph:
    """The same graph whose colocation groups are ``groups`` (groups of one op get none).

    ``groups`` must contain the graph's own colocation groups (``coplacement_groups`` does), so a
    placement that keeps the new groups together keeps the old ones too.
    """
    colocation, names = colocation_of_pieces(groups, prefix=prefix)
    return OpGraph(
        names=list(graph.names), kinds=list(graph.kinds), device_kinds=list(graph.device_kinds),
        compute_us=graph.compute_us, persistent_bytes=graph.persistent_bytes,
        output_bytes=graph.output_bytes, temp_bytes=graph.temp_bytes,
        colocation=colocation, colocation_names=names,
        role=graph.role, mirror=graph.mirror, edge_src=graph.edge_src, edge_dst=graph.edge_dst,
        edge_bytes=graph.edge_bytes, edge_fixed_us=graph.edge_fixed_us, meta=dict(graph.meta),
    )
