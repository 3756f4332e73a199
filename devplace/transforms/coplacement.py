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
from numba import njit

from devplace.graph import OpGraph
from devplace.transforms.coarsening import _distinct, colocation_of_pieces


@njit(cache=True)
def _find(parent, x):
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:
        parent[x], x = root, parent[x]
    return root


@njit(cache=True)
def _union_roots(n, first, second):
    """Root (smallest member) of each op after joining ``first[k]`` with ``second[k]`` for every k."""
    parent = np.arange(n)
    for k in range(first.shape[0]):
        ra, rb = _find(parent, first[k]), _find(parent, second[k])
        if ra < rb:
            parent[rb] = ra
        elif rb < ra:
            parent[ra] = rb
    for i in range(n):
        parent[i] = _find(parent, i)
    return parent


def _numbered_roots(roots: np.ndarray) -> np.ndarray:
    """Group ids 0..G-1 in order of each group's first op, from roots that are each group's smallest op."""
    is_root = roots == np.arange(len(roots))
    return (np.cumsum(is_root) - 1)[roots]


def _colocation_pairs(graph: OpGraph) -> tuple[np.ndarray, np.ndarray]:
    """(first member, member) of every colocation group, as pairs to join."""
    grouped = np.flatnonzero(graph.colocation >= 0)
    members = graph.colocation[grouped]
    first = np.full(len(graph.colocation_names) + 1, -1, dtype=np.int64)
    first[members[::-1]] = grouped[::-1]          # smallest member of each group
    return first[members], grouped


def join_pairs(n: int, first, second) -> np.ndarray:
    """Group ids (numbered by first op) after joining each op ``first[k]`` with ``second[k]``."""
    first = np.ascontiguousarray(first, dtype=np.int64)
    second = np.ascontiguousarray(second, dtype=np.int64)
    return _numbered_roots(_union_roots(n, first, second))


def colocation_units(graph: OpGraph) -> np.ndarray:
    """The smallest legal grouping: one group per colocation group, every other op alone.

    Placers that move whole units (round-robin, random, metis) use it so they never split a group.

    >>> from devplace.graph import chain_graph
    >>> colocation_units(chain_graph([1.0, 2.0])).tolist()
    [0, 1]
    """
    return join_pairs(graph.n_ops, *_colocation_pairs(graph))


def coplacement_groups(graph: OpGraph, *, single_consumer: bool = True, mirror: bool = True) -> np.ndarray:
    """Baechi's co-placement groups (see the module docstring); one group id per op.

    Vectorised: a 30k-op graph takes milliseconds, not the half second of a loop over ops."""
    n = graph.n_ops
    firsts, seconds = [], []
    a, b = _colocation_pairs(graph)
    firsts.append(a)
    seconds.append(b)
    if single_consumer and graph.n_edges:
        pair = _distinct(graph.edge_src * np.int64(n) + graph.edge_dst)   # distinct (producer, consumer)
        producer, consumer = pair // n, pair % n
        only = np.bincount(producer, minlength=n)[producer] == 1
        firsts.append(producer[only])
        seconds.append(consumer[only])
    if mirror:
        backward = np.flatnonzero(graph.mirror >= 0)
        firsts.append(backward)
        seconds.append(graph.mirror[backward])
    return join_pairs(n, np.concatenate(firsts), np.concatenate(seconds))


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
        edge_bytes=graph.edge_bytes, edge_fixed_us=graph.edge_fixed_us, edge_order_only=graph.edge_order_only,
        meta=dict(graph.meta),
    )
