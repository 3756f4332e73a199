"""The capped-search cut: where many-branch cells meet tight memory, the search under the largest
canonical cap, its best cut in two at a point every forward path passes (its forward prefix, with
the backward and update ops that mirror it, onto another GPU) so that it fits, then annealed.

With memory to hold most of the step on one GPU, the search keeps the path on that GPU and moves
the middles of the cells' long branches to the others (Inception-V3, seed 0, all of 8 GiB, whose
canonical caps are 0.7 and 0.9 x its one-device peak of 5.47 GiB: 219.5 ms, 210.7 ms busy on the
path's GPU, 15-17 ms on each other; under the 0.7 cap alone the search ends at 240.0 ms).
At 30% of 8 GiB the stash of the stem's wide activations does not fit beside the rest, so the
search splits the path over two GPUs from its first starts and stays in that basin (233.5 ms: the
second GPU busy 156 ms, the two others 7-10 ms); neither annealing from that best with all of the
memory (4 rounds: 233.4 ms) nor moving whole branches, branch interiors or any 2-way split of a
cell's branches from it gains. The capped search's best with its stem moved onto another GPU is
256.3 ms, and 4 annealing rounds take it to 223.6 ms (round 38 notes).

The track (``_capped_cut_rounds``) runs last in the branch track, where every device's memory is
below the smallest ``canonical_caps`` x the one-device peak (so no memory the canonical caps reach
changes), on graphs small enough for every extra round, while the gap is wide:

1. the whole search (this one's options, without canonical caps, looser-memory track or this track,
   as ``_canonical_place`` runs it) on the cluster with every device's memory raised to the largest
   cap: one of the runs that under canonical caps give a larger memory its result;
2. *cut points*: the forward ops every forward path from the step's first forward op to the loss
   passes (the post-dominator chain, ``branches._post_dominators``); for each, the forward ops up
   to it in topological order bring their units (``devplace.placers._layers``: backward and update
   ops, the weights they read first) and their colocation groups; that prefix goes to each other GPU
   than the one holding most of the capped best, each candidate judged in the capped best's own
   order and the search's ``orders``. The start is the capped best itself if it fits this memory,
   else the fastest fitting candidate of the cut whose forward tensors leaving the prefix hold the
   fewest bytes among the cuts with one that fits (the step pays them forward and again as
   gradients; the order is what the rounds anneal). Inception-V3 at 30%, seed 0: the cut after the
   first cell's concat (38.3 MiB, start 256.3 ms) ends at 223.6 ms; the fastest start, cut after
   the stem (86 MiB, 246.7 ms), at 230.6 ms;
3. ``capped_cut_rounds`` annealing rounds from it, by a search of its own seeded by the placer's
   seed (so the main search's random stream is untouched and the result is never slower than
   without the track), each from that search's best; the best is offered.

Cost: a search more (Inception-V3 at 30%: 79,467 evals), one eval per cut candidate and order
(288 there) and the rounds (about 8,000). Where it brings the gap into the looser-memory track's
window (loose_memory.py), that track's search runs too (Inception-V3 at 30%, seed 0: 79,473
evals; 244,694 in all against 77,673 without the track).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import numpy as np

from devplace.graph import Role
from devplace.placers._layers import UnitLayers
from devplace.placers._moves import with_colocation
from devplace.portfolio.sim_search.anneal import _track_rounds
from devplace.portfolio.sim_search.branches import _forward_dag, _post_dominators
from devplace.portfolio.sim_search.config import log
from devplace.portfolio.sim_search.search import one_device_peak_bytes

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search

HOW = "capped-search cut"


def cut_prefixes(graph) -> list[tuple[int, np.ndarray]]:
    """Per cut point (module docstring), in step order: (the op, the forward ops up to it in
    topological order, the dead ends the forward DAG leaves out among them)."""
    order, succ, _ = _forward_dag(graph)
    if not len(order):
        return []
    ipdom = _post_dominators(order, succ, graph.n_ops)
    forward = np.flatnonzero(graph.role == Role.FORWARD)     # with the dead ends the DAG leaves out
    cuts, v = [], int(ipdom[int(order[0])])
    while v >= 0 and v != int(order[-1]):
        cuts.append((v, forward[graph.topo_rank[forward] <= graph.topo_rank[v]]))
        v = int(ipdom[v])
    return cuts


def _capped_cut_rounds(search: _Search, report: dict) -> None:
    """The track (module docstring); what it did goes to ``report``."""
    config, graph, cluster = search.config, search.graph, search.cluster
    if config.capped_cut_rounds < 1 or not config.canonical_caps or not config.gets_every_extra_round(graph.n_ops):
        return
    peak_bytes = one_device_peak_bytes(search.sim)      # not an eval: as canonical.py
    if (cluster.memory_bytes >= min(config.canonical_caps) * peak_bytes).any():
        return
    cap_bytes = max(config.canonical_caps) * peak_bytes
    from devplace.portfolio.sim_search import place
    from devplace.portfolio.sim_search.search import _Search

    left_s = None if config.time_budget_s is None else max(config.time_budget_s - (time.perf_counter() - search.began), 0.0)
    capped_config = dataclasses.replace(config, canonical_caps=(), loose_memory_factor=1.0, capped_cut_rounds=0,
                                        time_budget_s=left_s)
    capped = place(graph, cluster.with_memory_bytes(np.full(cluster.n_devices, cap_bytes)), seed=search.seed,
                   options=capped_config)
    search.evals += capped.options["evals"]
    report.update(capped_us=capped.options["step_us"], capped_evals=capped.options["evals"])
    track = _Search(graph, cluster, config, search.seed)
    track.closed_us = search.closed_us
    start = _cheapest_cut(track, capped.devices, capped.priority, report)
    if start is not None:
        track.offer(*start)
        rounds, best_us = _track_rounds(track, start, "capped-search cut", config.capped_cut_rounds, 1.0)
        report.update(rounds=rounds, best_us=best_us)
        overflow, step_us, _ = search.measure(track.best[1], track.best[2])
        if overflow == 0:
            search.offer(step_us, track.best[1], track.best[2], f"{HOW}: {track.best[3]}")
    search.evals += track.evals
    report.update(track_evals=track.evals)
    log.info("capped-search cut: %s", report)


def _cheapest_cut(track: _Search, devices: np.ndarray, priority, report: dict) -> tuple | None:
    """The capped best as it is if it fits ``track``'s memory, else cut with a prefix
    (``cut_prefixes``) on another GPU: of the cuts with a candidate that fits, the one whose
    forward tensors leaving the prefix hold the fewest bytes (the step pays them forward and
    again as gradients; an order can be annealed, a cut's bytes cannot), its fastest fitting
    candidate (GPU and order); as ``search.best`` (or None), the cut taken going to ``report``."""
    graph = track.graph
    unit_of = UnitLayers.of(graph).unit_of
    forward = graph.role == Role.FORWARD
    home = int(np.bincount(devices, minlength=track.n_dev).argmax())
    candidates = [(0.0, "none", [devices])]
    for op, prefix in cut_prefixes(graph):
        inside = np.zeros(graph.n_ops, bool)
        inside[prefix] = True
        leaving = inside[graph.edge_src] & ~inside[graph.edge_dst] & forward[graph.edge_dst]
        ops = with_colocation(track.fine, np.flatnonzero(np.isin(unit_of, np.unique(unit_of[prefix]))))
        cuts = []
        for target in range(track.n_dev):
            if target != home:
                cuts.append(devices.copy())
                cuts[-1][ops] = target
        crossing_bytes = graph.output_bytes[np.unique(graph.edge_src[leaving])].sum()   # each tensor once
        candidates.append((float(crossing_bytes), graph.names[op], cuts))
    best = None
    for crossing_bytes, name, cuts in sorted(candidates, key=lambda c: c[0]):
        for cut in cuts:
            for order_name, order in [("its own", priority)] + track.orders(cut):
                overflow, step_us, _ = track.measure(cut, order)
                if overflow == 0 and (best is None or step_us < best[0]):
                    best = (step_us, cut, order, f"cut at {name} ({order_name} order)")
        if best is not None:
            report.update(cut_mib=crossing_bytes / 2**20)
            break
    report.update(cut_points=len(candidates) - 1, start=None if best is None else best[3],
                  start_us=None if best is None else best[0])
    return best
