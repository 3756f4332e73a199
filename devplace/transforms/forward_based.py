"""Forward-operator-based placement: place the forward pass, let the backward pass follow.

A backward op touches the same parameters and activations as the forward op it differentiates, so
Baechi places only forward ops and puts every backward op with its forward op. Here each op gets a
leader: a forward (or ``other``) op leads itself; a backward or update op follows its mirror (the
forward op it differentiates), else the first forward op of its colocation group, else the leader of
its largest input (a partial sum of a weight's gradient over time steps follows that time step's
gradient, so the sums spread over the layers' devices as the steps do), else of its first reader; an
op with none of these leads itself and is placed like a forward op.

The view handed to the placer is the graph induced on the leaders. Followers add to their leader:
their compute time (it will run on the leader's device) and, to stay on the safe side of memory,
their persistent bytes, temporaries and outputs (outputs as persistent: gradients live long). A
leader's output that a follower reads (an activation kept for backward) is counted as persistent
too. Edges touching a follower are dropped: mapping them onto leaders would point backwards in
the forward pass and make cycles. Colocation groups of the original are kept as groups of leaders.

>>> from devplace.graph import GraphBuilder
>>> b = GraphBuilder(["gpu"])
>>> _ = b.add_op("f", compute_us=2.0); _ = b.add_op("g", compute_us=3.0)
>>> _ = b.add_op("g_grad", compute_us=6.0, role="backward", mirror="g")
>>> _ = b.add_op("f_grad", compute_us=4.0, role="backward", mirror="f")
>>> b.add_edge("f", "g"); b.add_edge("g", "g_grad"); b.add_edge("g_grad", "f_grad")
>>> v = forward_view(b.build())
>>> v.graph.names, v.graph.compute_us[:, 0].tolist(), v.coarse_of.tolist()
(('f[+1]', 'g[+1]'), [6.0, 9.0], [0, 1, 1, 0])
"""

from __future__ import annotations

import numpy as np

from devplace.graph import OpGraph, Role
from devplace.transforms.coarsening import Coarsening, colocation_of_pieces, quotient
from devplace.transforms.coplacement import _colocation_pairs, join_pairs


def forward_leaders(graph: OpGraph) -> np.ndarray:
    """For each op, the op it follows (itself for forward ops and ops with nothing to follow)."""
    leader = np.arange(graph.n_ops, dtype=np.int64)
    is_forward = (graph.role == Role.FORWARD) | (graph.role == Role.OTHER)
    group_forward = {}
    for g, members in enumerate(graph.colocation_members):
        forward = members[is_forward[members]]
        if len(forward):
            group_forward[g] = int(forward[0])
    unresolved = []
    for i in np.flatnonzero(~is_forward):
        m = graph.mirror[i]
        if m >= 0 and is_forward[m]:
            leader[i] = m
        elif graph.colocation[i] >= 0 and int(graph.colocation[i]) in group_forward:
            leader[i] = group_forward[int(graph.colocation[i])]
        else:
            unresolved.append(int(i))
    if unresolved:
        # inputs first (in step order, so a chain of partial sums resolves from its start), then readers
        resolved = is_forward | (leader != np.arange(graph.n_ops))
        rank = graph.topo_rank
        for i in sorted(unresolved, key=lambda op: rank[op]):
            inputs = [int(u) for u in graph.predecessors(i) if resolved[u]]
            if inputs:
                leader[i], resolved[i] = leader[max(inputs, key=lambda u: (graph.output_bytes[u], -rank[u]))], True
        for i in sorted(unresolved, key=lambda op: -rank[op]):
            readers = [int(v) for v in graph.successors(i) if resolved[v]]
            if not resolved[i] and readers:
                leader[i], resolved[i] = leader[min(readers, key=lambda v: rank[v])], True
    return leader


def forward_view(graph: OpGraph) -> Coarsening:
    """The placement problem on leaders only; ``coarse_of`` maps every op to its leader's view op."""
    leader = forward_leaders(graph)
    is_leader = leader == np.arange(graph.n_ops)
    view_index = np.cumsum(is_leader) - 1
    coarse_of = view_index[leader]

    follower = ~is_leader
    stashed = np.zeros(graph.n_ops, dtype=bool)   # outputs read by a follower
    stashed[graph.edge_src[follower[graph.edge_dst]]] = True
    persistent = graph.persistent_bytes + np.where(follower | stashed, graph.output_bytes, 0.0)
    output = np.where(follower, 0.0, graph.output_bytes)
    keep_edge = is_leader[graph.edge_src] & is_leader[graph.edge_dst]

    # original colocation groups become groups of their members' leaders
    n_view = int(is_leader.sum())
    first, member = _colocation_pairs(graph)
    colocation, names = colocation_of_pieces(join_pairs(n_view, coarse_of[first], coarse_of[member]),
                                             prefix="follow")
    return quotient(
        graph, coarse_of, colocation=colocation, colocation_names=names, keep_edge=keep_edge,
        persistent_bytes=persistent, output_bytes=output,
    )
