"""Operator fusion: contract each co-placement group into as few ops as keep the graph acyclic.

Fusing ops that will share a device anyway shrinks the graph a placer has to search (Baechi: GNMT
22,340 ops -> 706). Contracting a whole group can create a cycle (a -> c -> b with a, b fused and c
outside), so groups are contracted edge by edge: the edge u -> v between two pieces of one group is
contracted only if u's piece has no other successor or v's piece no other predecessor. Then no other
path u -> ... -> v exists, so the contraction cannot close a cycle; by induction the coarse graph
stays a DAG. Edges refused at first are retried after their neighbours merged, until nothing
changes. A group left in several pieces becomes a colocation group of the coarse graph, so a coarse
placement still keeps the group (and with it any original colocation group) on one device.

Figures of a fused op (time, memory, merged edges): see ``devplace.transforms.coarsening``.

>>> from devplace.graph import GraphBuilder
>>> b = GraphBuilder(["gpu"])
>>> for name in "abc":
...     _ = b.add_op(name, compute_us=1.0)
>>> b.add_edge("a", "b"); b.add_edge("a", "c"); b.add_edge("c", "b")
>>> f = fuse(b.build(), [0, 0, 1])        # fusing a and b would make the cycle ab -> c -> ab
>>> f.graph.n_ops, f.graph.colocation_names
(3, ['fused0'])
"""

from __future__ import annotations

import numpy as np

from devplace.graph import OpGraph
from devplace.transforms.coarsening import Coarsening, colocation_of_pieces, quotient
from devplace.transforms.coplacement import _numbered, _UnionFind


def fuse(graph: OpGraph, groups) -> Coarsening:
    """Contract edges inside ``groups`` (one id per op) while the quotient stays acyclic."""
    groups = np.asarray(groups, dtype=np.int64)
    n = graph.n_ops
    uf = _UnionFind(n)
    parent, find = uf.parent, uf.find

    src, dst = graph.edge_src.tolist(), graph.edge_dst.tolist()
    succ: list[set[int]] = [set() for _ in range(n)]
    pred: list[set[int]] = [set() for _ in range(n)]
    for u, v in zip(src, dst):
        succ[u].add(v)
        pred[v].add(u)

    def merge(a: int, b: int) -> None:
        """Absorb piece b into piece a (both roots, edge between them)."""
        if len(succ[b]) + len(pred[b]) > len(succ[a]) + len(pred[a]):
            a, b = b, a
        parent[b] = a
        for x in succ[b]:
            pred[x].discard(b)
            if x != a:
                pred[x].add(a)
                succ[a].add(x)
        for x in pred[b]:
            succ[x].discard(b)
            if x != a:
                succ[x].add(a)
                pred[a].add(x)
        succ[a].discard(b)
        pred[a].discard(b)
        succ[b] = set()
        pred[b] = set()

    same = groups[graph.edge_src] == groups[graph.edge_dst]
    candidates = sorted(set(zip(graph.edge_src[same].tolist(), graph.edge_dst[same].tolist())),
                        key=lambda e: (graph.topo_rank[e[0]], graph.topo_rank[e[1]]))
    while candidates:
        refused = []
        for u, v in candidates:
            ru, rv = find(u), find(v)
            if ru == rv:
                continue
            if len(succ[ru]) == 1 or len(pred[rv]) == 1:
                merge(ru, rv)
            else:
                refused.append((u, v))
        if len(refused) == len(candidates):
            break
        candidates = refused

    coarse_of = _numbered(uf, n)
    group_of_piece = np.empty(int(coarse_of.max()) + 1 if n else 0, dtype=np.int64)
    group_of_piece[coarse_of] = groups
    colocation, names = colocation_of_pieces(group_of_piece, prefix="fused")
    return quotient(graph, coarse_of, colocation=colocation, colocation_names=names)
