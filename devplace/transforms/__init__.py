"""Graph transforms that make placement cheaper: Baechi's co-placement, fusion and forward-only view.

Each is a plain function on an ``OpGraph`` (usable alone, like a torch.fx pass); the ones that shrink
the graph return a ``Coarsening`` (coarse graph + map back). ``optimize`` chains them the way
``devplace.place(..., coplacement=, fusion=, forward_only=)`` uses them:

1. ``forward_only``: keep forward ops; backward and update ops follow them;
2. ``coplacement``: group single-consumer chains, forward/backward pairs and colocation groups;
3. ``fusion``: contract each group (or, without co-placement, each colocation group) as far as
   acyclicity allows.

>>> from devplace.graph import chain_graph
>>> optimize(chain_graph([1.0, 2.0, 3.0]), coplacement=True, fusion=True).graph.n_ops
1
"""

from __future__ import annotations

import numpy as np

from devplace.graph import OpGraph
from devplace.transforms.coarsening import Coarsening, identity, quotient
from devplace.transforms.coplacement import colocation_units, coplacement_groups, with_groups_as_colocation
from devplace.transforms.forward_based import forward_leaders, forward_view
from devplace.transforms.fusion import fuse


def optimize(graph: OpGraph, *, coplacement: bool = False, fusion: bool = False,
             forward_only: bool = False) -> Coarsening:
    """Apply the chosen optimizations in Baechi's order; the result maps back to ``graph``."""
    result = forward_view(graph) if forward_only else identity(graph)
    view = result.graph
    groups = coplacement_groups(view) if coplacement else colocation_units(view)
    if fusion:
        result = result.then(fuse(view, groups))
    elif coplacement:
        regrouped = with_groups_as_colocation(view, groups)
        result = result.then(Coarsening(view, regrouped, np.arange(view.n_ops, dtype=np.int64)))
    return result


__all__ = [
    "Coarsening", "colocation_units", "coplacement_groups", "forward_leaders", "forward_view", "fuse",
    "identity", "optimize", "quotient", "with_groups_as_colocation",
]
