"""m-SCT (Baechi): small-communication-time scheduling under per-device memory limits.

An LP relaxation (``_lp``) picks each op's favorite child, the successor that should follow it on
the same device so their transfer is never paid. The list scheduler (``_listsched``) then runs as
m-ETF, except that a device whose last op has an unscheduled favorite child is kept idle for it
unless an urgent op (one that every other open device would start strictly later) is waiting.
SCT is within a constant factor of optimal when transfers are small against compute (Hanen & Munier).
Memory is handled as in m-ETF (``_memory.place_within_memory``); the LP is solved once.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> place(chain_graph([1.0, 2.0], edge_bytes=8), uniform_cluster(2)).devices.tolist()
[0, 0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.placement import Placement
from devplace.placers import register
from devplace.placers.options import option
from devplace.placers._listsched import list_schedule, mean_edge_us, op_times_us
from devplace.placers._lp import FAVORITE_THRESHOLD, round_favorites, solve_favorite_lp
from devplace.placers._memory import check_can_fit, place_within_memory


def lp_edge_us(graph, cluster) -> np.ndarray:
    """Each edge's transfer time for the LP: the mean over links, and 0 inside a colocation group.

    Both ends of such an edge always share a device, so its transfer is never paid whatever the
    favorites are. On a fused graph most edges are of this kind (GNMT: 20k of 26k), and the LP's
    presolve then drops them, which makes it several times faster."""
    edge_us = mean_edge_us(graph, cluster)
    group = graph.colocation
    return np.where((group[graph.edge_src] >= 0) & (group[graph.edge_src] == group[graph.edge_dst]), 0.0, edge_us)


@dataclass(frozen=True)
class MSCTOptions:
    threshold: float = option(FAVORITE_THRESHOLD, "an edge whose LP value is at most this makes its child a favorite (Baechi's code: 0.1)")
    lp_time_limit_s: float = option(120.0, "seconds HiGHS may spend on each window of the favorite-child LP")


@register("m-sct", "Baechi's memory-constrained small-communication-time scheduler (favorite-child LP)", MSCTOptions)
def place(graph, cluster, *, seed: int = 0, options: MSCTOptions = MSCTOptions()) -> Placement:
    threshold, lp_time_limit_s = options.threshold, options.lp_time_limit_s
    # deterministic (HiGHS is run single-threaded by default), so the seed is unused
    check_can_fit(graph, cluster, "m-sct")
    time_us = op_times_us(graph, cluster).mean(axis=1)
    x, _, lp_makespan_us, status = solve_favorite_lp(
        graph, time_us, lp_edge_us(graph, cluster), time_limit_s=lp_time_limit_s
    )
    favorite = round_favorites(graph.edge_src, graph.edge_dst, x, graph.n_ops, threshold)
    placement = place_within_memory(graph, cluster, lambda budget: list_schedule(
        graph, cluster, algo="m-sct", favorite=favorite, budget_bytes=budget))
    placement.options |= {"lp_status": status, "lp_makespan_us": lp_makespan_us,
                          "favorite_children": int((favorite >= 0).sum())}
    return placement
