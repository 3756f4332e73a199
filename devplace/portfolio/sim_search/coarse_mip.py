"""A start no local move reaches: exact's MIP solved on the step coarsened to a few dozen layer groups.

The annealing moves a unit, two, or a run of units at a time, so it stays near the basin of its
start. The program sees the whole step at once and places every group together. On ResNet-50 at
30% memory the other rounds end at 568.6-569.3 ms for seeds 0-3, and 16 rounds from this start
reach 516.4-540.4 ms (in the whole search, seed 0: 541.5 ms; ``benchmarks/coarse_mip_start.py``).

Coarsening (``coarse_step``): the leader units (a forward op with its backward and update ops,
colocation groups whole), numbered in step order, are merged into ``coarse_mip_groups``
consecutive groups of equal compute. A group becomes pieces: its forward ops (with the weights
they read), and its backward and update ops, each cut only where one topological order (the
forward by group, then the backward by group in reverse) has to leave it; every edge goes
forward in that order, so the coarse graph is acyclic. A group's pieces are one colocation
group. A piece's time is its members' (they run in turn). It holds, for the whole step, its
members' persistent bytes and the forward outputs the backward reads (saved activations, all
alive at the turn), and nothing else: transient outputs and temporaries are left to the
simulator, and the program gets ``coarse_mip_memory`` of each device's memory for what it
counts (ResNet-50 at 30%: with all of it the expanded placement is 0.5 GiB over; with 0.85 of it,
it fits).

Solving: exact's program (``devplace.placers.exact.solve_mip``) with sim-search's placement of
the coarse graph as its first incumbent, stopped by HiGHS's node limit ``coarse_mip_nodes`` alone
(no time limit): single-threaded HiGHS with a fixed seed gives the same solution for the same
graph on every machine. Its incumbent is expanded to the ops and judged in the fastest fitting of
its own start order and the search's orders. If it fits, annealing rounds run from it, each
from the best this track found (a start slower than the best would be left by a round from the
best): ``max_rounds``, then up to ``coarse_mip_rounds`` while the track's best is within
``track_behind`` of the best found (ResNet-50: seeds 0-3 gain 0.3-9.7 ms in rounds 9-16;
Transformer, Inception-V3, NASNet: the track stays 5-6% behind after 8). The track runs after
the other rounds, only while the gap is above ``target_gap``, on graphs of at least
``coarse_mip_min_ops`` ops whose groups do not interleave (``MAX_PIECES_PER_GROUP``); it only
offers placements, and the phases after it start from the best it leaves.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

from devplace.errors import OutOfMemoryError
from devplace.graph import Role
from devplace.placers._moves import leader_units
from devplace.placers.exact import ExactOptions, solve_mip
from devplace.portfolio.sim_search.anneal import _track_rounds
from devplace.portfolio.sim_search.config import log
from devplace.transforms.coarsening import Coarsening, colocation_of_pieces, quotient

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search

HOW = "coarse MIP start"
# a group is its forward and its backward piece, a few more where an order must leave it; far more
# means the layers interleave (a recurrent net: RNNLM's 36 groups make 345 pieces, whose program
# HiGHS did not solve in 60 s, and whose start annealed to 81.9 ms against sim-search's 81.5)
MAX_PIECES_PER_GROUP = 4


def coarse_step(graph, cluster, step_rank: np.ndarray, n_groups: int) -> Coarsening:
    """The step as pieces of ``n_groups`` layer groups (module docstring), mapped back to its ops."""
    units = leader_units(graph, closed=True, rank=step_rank)
    op_us = graph.compute_us.min(axis=1) + cluster.op_gap_us
    unit_us = np.bincount(units.unit_of, weights=op_us, minlength=units.n_units)
    done = np.cumsum(unit_us)
    share = (done - unit_us / 2) / max(done[-1], 1e-12)
    _, group_of_unit = np.unique(np.minimum((share * n_groups).astype(np.int64), n_groups - 1), return_inverse=True)
    group = group_of_unit[units.unit_of]
    groups = int(group.max()) + 1
    source = np.diff(graph.pred_ptr) == 0
    backward = ~((graph.role == Role.FORWARD) | source)
    key = np.where(backward, 2 * groups - 1 - group, group)
    order = _keyed_topological_order(graph, key)
    new_piece = np.r_[True, key[order][1:] != key[order][:-1]]
    coarse_of = np.empty(graph.n_ops, np.int64)
    coarse_of[order] = np.cumsum(new_piece) - 1
    group_of_piece = np.empty(int(coarse_of[order[-1]]) + 1, np.int64)
    group_of_piece[coarse_of] = group
    colocation, names = colocation_of_pieces(group_of_piece, prefix="layer group")
    saved = np.zeros(graph.n_ops, bool)
    read_back = (graph.role[graph.edge_src] == Role.FORWARD) & (graph.role[graph.edge_dst] == Role.BACKWARD)
    saved[graph.edge_src[read_back]] = True
    held = graph.persistent_bytes + np.where(saved, graph.output_bytes, 0.0)
    pieces = quotient(graph, coarse_of, colocation=colocation, colocation_names=names, persistent_bytes=held)
    members = np.bincount(coarse_of, minlength=pieces.graph.n_ops)
    nothing = np.zeros(pieces.graph.n_ops)
    coarse = dataclasses.replace(pieces.graph, temp_bytes=nothing, output_bytes=nothing,
                                 compute_us=pieces.graph.compute_us + ((members - 1) * cluster.op_gap_us)[:, None])
    return Coarsening(graph, coarse, coarse_of)


def _keyed_topological_order(graph, key: np.ndarray) -> np.ndarray:
    """A topological order that takes, among the ops ready, the least (key, topological rank)."""
    waiting = np.diff(graph.pred_ptr).copy()
    ready = [(int(key[v]), int(graph.topo_rank[v]), int(v)) for v in np.flatnonzero(waiting == 0)]
    heapq.heapify(ready)
    order = []
    while ready:
        v = heapq.heappop(ready)[2]
        order.append(v)
        for j in range(graph.succ_ptr[v], graph.succ_ptr[v + 1]):
            w = int(graph.edge_dst[graph.succ_edge[j]])
            waiting[w] -= 1
            if not waiting[w]:
                heapq.heappush(ready, (int(key[w]), int(graph.topo_rank[w]), w))
    return np.asarray(order, np.int64)


def _coarse_mip_start(search: _Search) -> tuple | None:
    """The program's placement expanded, as (step us, devices, priority, how) if it fits, else None."""
    # here, not at the top: the package's front door imports this module
    from devplace.portfolio.sim_search import place

    config, report = search.config, search.coarse_mip_report
    coarse = coarse_step(search.graph, search.cluster, search.step_rank, config.coarse_mip_groups)
    cluster = search.cluster.with_memory_fraction(config.coarse_mip_memory)
    report.update(coarse_ops=coarse.graph.n_ops)
    if coarse.graph.n_ops > MAX_PIECES_PER_GROUP * config.coarse_mip_groups:
        report.update(status="interleaved")
        return None
    try:
        # the first incumbent: sim-search's own placement of the pieces (without a coarse start or a
        # recurrence track or looser-memory track of its own: the pieces of a layer group are no recurrence;
        # nor an order descent: the MIP gets its own order)
        nested = dataclasses.replace(config, coarse_mip_groups=0, recurrence_evals=0, loose_memory_factor=1.0,
                                     order_descent_evals=0)
        first = place(coarse.graph, cluster, options=nested)
        limits = ExactOptions(time_limit_s=math.inf, max_nodes=config.coarse_mip_nodes)
        solve = solve_mip(coarse.graph, cluster, limits, first)
    except OutOfMemoryError:         # the pieces' saved activations fit no split of the devices
        report.update(status="no fit")
        return None
    report.update(status=solve.status, nodes=solve.nodes, objective_us=solve.objective_us)
    if not solve.solutions:
        return None
    devices = coarse.expand(solve.solutions[0].devices)
    orders = [("start", coarse.expand_priority(solve.solutions[0].priority))] + search.orders(devices)
    best = None
    for _, priority in orders:
        overflow, step, _ = search.measure(devices, priority)
        if overflow == 0 and (best is None or step < best[0]):
            best = (step, devices, priority, HOW)
    report.update(expanded_us=None if best is None else best[0])
    if best is not None:
        search.offer(*best)
    return best


def _coarse_mip_rounds(search: _Search, bound_us: float | None) -> None:
    """The track from the coarse MIP start (module docstring); what it did goes to ``coarse_mip_report``."""
    config = search.config
    if (config.coarse_mip_groups < 1 or search.graph.n_ops < config.coarse_mip_min_ops
            or not search.late_phase_may_run(bound_us, config.coarse_mip_rounds)):
        return
    search.coarse_mip_report.update(before_us=search.best.step_us)
    home = _coarse_mip_start(search)
    rounds, best_us = (0, None) if home is None else _track_rounds(
        search, home, "coarse MIP start", config.coarse_mip_rounds, config.track_behind)
    search.coarse_mip_report.update(rounds=rounds, best_us=best_us)
    log.info("coarse MIP start: %s", search.coarse_mip_report)
