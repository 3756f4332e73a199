"""Placer specs ``ALGO[+VARIANT...]``: which placer, and which of Baechi's graph optimizations first.

One syntax names a way of placing everywhere (``devplace.place``, ``compare --algos``, sim-search's
seeds). A variant switches on graph optimizations (``devplace.transforms``) before placing:

- ``+opt``: co-placement and operator fusion, as Baechi ran its placers (``m-sct+opt``);
- ``+fwd``: forward-operator-based placement (place forward ops, backward ops follow).

``m-sct+opt+fwd`` combines them. The placer sees the smaller graph; its placement (and schedule
priorities) are expanded back to every op, and the check runs on the original graph.

>>> parse_algo("m-sct+opt")
('m-sct', {'coplacement': True, 'fusion': True})
>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> place(chain_graph([1.0, 2.0]), uniform_cluster(2), algo="single").devices.tolist()
[0, 0]
"""

from __future__ import annotations

import time
from dataclasses import asdict


from devplace.costing import costed_for
from devplace.errors import PlacementError
from devplace.placement import Placement, graph_fingerprint
from devplace.placers import check_feasible, placer
from devplace.placers.options import parse_options

VARIANTS = {"opt": {"coplacement": True, "fusion": True}, "fwd": {"forward_only": True}}


def parse_algo(spec: str) -> tuple[str, dict]:
    """``"m-sct+opt"`` -> ``("m-sct", {"coplacement": True, "fusion": True})``; refuses unknown names."""
    name, *variants = [part.strip() for part in spec.strip().split("+")]
    placer(name)   # a misspelt name fails here, naming the placers there are
    flags: dict = {}
    for variant in variants:
        if variant not in VARIANTS:
            raise PlacementError(
                f"unknown variant {variant!r} in {spec!r}: use ALGO+opt (co-placement + fusion) or ALGO+fwd"
            )
        flags |= VARIANTS[variant]
    return name, flags


def place(graph, cluster, algo: str = "m-sct", seed: int = 0, check: bool = True, **options) -> Placement:
    """Place ``graph`` on ``cluster`` as the spec ``algo`` (``ALGO[+opt][+fwd]``) says.

    ``options`` are the placer's declared options: a misspelt or mistyped one is a PlacementError
    naming the valid ones, before anything runs. With ``check`` (the default) a result that splits
    a colocation group or overflows a device's memory in simulation is refused, so every caller
    can trust it. ``options['coarse_ops']`` of the result records the size of the graph the placer saw.
    """
    graph = costed_for(graph, cluster)  # times for this cluster's devices (re-costed, or refused when measured)
    name, flags = parse_algo(algo)
    info = placer(name)
    config = parse_options(info.options, options, name)
    began = time.perf_counter()
    if flags:
        from devplace.transforms import optimize

        coarsening = optimize(graph, **flags)
        result = coarsening.expand_placement(info.run(coarsening.graph, cluster, seed=seed, options=config))
    else:
        result = info.run(graph, cluster, seed=seed, options=config)
    elapsed = time.perf_counter() - began
    result.algorithm = name
    result.options = {"seed": seed, **asdict(config)} | result.options
    if flags:
        result.options |= {
            "coplacement": False, "fusion": False, "forward_only": False, **flags,
            "original_ops": graph.n_ops, "coarse_ops": coarsening.graph.n_ops,
        }
    result.placement_time_s = elapsed
    result.device_names = cluster.device_names
    result.graph_fingerprint = graph_fingerprint(graph.names)
    if check:
        check_feasible(graph, cluster, result)
    return result


__all__ = ["VARIANTS", "parse_algo", "place"]
