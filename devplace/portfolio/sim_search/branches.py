"""Whole branches of a many-branch cell as pieces: a branch's forward ops, the backward ops that
mirror them and the weights they read (with optimizer state and update) move to a device together.

An Inception or NASNet cell forks its input into several branches that meet again at a join (a
concat). The annealing moves one unit (a forward op with its backward ops) or a run of them;
neither carries a whole branch with its weights in one step, so a branch that would run beside its siblings on another GPU is never tried whole.

Pieces (``branch_pieces``), from the forward pass alone (ops that have an input, edges among
them; nothing read from names): each forward op's join is its immediate post-dominator (every
path from it to the step's end passes the join). A fork with two or more successors and its join
bound a *region*, the ops that descend from the fork and not from the join. Its *branches* are the
region's weakly connected parts. Regions are taken outermost first (in step order), each op in the
first region holding it; one with more than ``MAX_REGION_OPS`` ops (an auxiliary head that joins at
the loss) is not taken, so its inner cells are. Each forward op of a branch brings its unit
(``devplace.placers._layers``: its backward and update ops and the weights it reads first); every
other op stays in its layer's piece. A graph has such cells when the branches of regions with at
least ``branch_min_branches`` branches hold ``branch_share`` of the step's compute (with 3:
Inception-V3 63%, NASNet 27%; ResNet-50, the Transformer, RNNLM and GNMT 0%).

The track (``_branch_rounds``) runs after the recurrence track, while the gap is wide, where the
graph has such cells: a greedy descent over whole-piece moves from the best as it is (laid out by
piece, Inception-V3's best was 441.5 ms) and from ``branch_starts`` - 1 random piece maps (from
the search's seeded rng), sharing ``branch_evals``; then annealing rounds from the fastest end
(``piece_track._piece_track``). It only offers placements, so the search's best is never slower
for it; the phases after it start from that best. At 30% memory, seed 0: NASNet 120.48 -> 114.54 ms (the descent alone
116.41; the same rounds without the descent 116.90), Inception-V3 234.99 -> 233.47 ms (the
descent alone 233.97; rounds without it 233.08: there the branch moves add nothing measurable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from devplace.bounds.fork_join import MAX_REGION_OPS
from devplace.graph import Role
from devplace.placers._layers import UnitLayers
from devplace.portfolio.sim_search.piece_track import _piece_track

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search

HOW = "branch start"


def _forward_dag(graph) -> tuple[np.ndarray, list[list[int]], list[list[int]]]:
    """The forward ops that have an input and lead to the last of them (the loss), in topological
    order, and their successors and predecessors among them. A forward output read only by the
    backward (a batch norm's saved statistics) is a dead end that would keep every fork from
    having a join, so such ops are left out."""
    forward = (graph.role == Role.FORWARD) & (np.diff(graph.pred_ptr) > 0)
    order = graph.topo_order[forward[graph.topo_order]]
    succ: list[list[int]] = [[] for _ in range(graph.n_ops)]
    pred: list[list[int]] = [[] for _ in range(graph.n_ops)]
    keep = forward[graph.edge_src] & forward[graph.edge_dst]
    for s, d in zip(graph.edge_src[keep].tolist(), graph.edge_dst[keep].tolist()):
        if d not in succ[s]:
            succ[s].append(d)
            pred[d].append(s)
    leads = np.zeros(graph.n_ops, bool)
    if len(order):
        leads[order[-1]] = True
    for v in order[::-1].tolist():
        leads[v] |= any(leads[s] for s in succ[v])
    order = order[leads[order]]
    succ = [[s for s in out if leads[s]] for out in succ]
    pred = [[u for u in into if leads[u]] for into in pred]
    return order, succ, pred


def _post_dominators(order: np.ndarray, succ: list[list[int]], n_ops: int) -> np.ndarray:
    """Per op, its immediate post-dominator in the forward DAG (-1: the virtual end, for ops with no
    forward successor or whose paths meet only there)."""
    ipdom = np.full(n_ops, -1, np.int64)
    depth = np.zeros(n_ops, np.int64)      # depth in the post-dominator tree (the virtual end: 0)
    for v in order[::-1].tolist():
        common = None
        for s in succ[v]:
            if common is None:
                common = s
                continue
            a, b = common, s
            while a != b and a >= 0 and b >= 0:
                if depth[a] >= depth[b]:
                    a = ipdom[a]
                else:
                    b = ipdom[b]
            common = a if a == b else -1
            if common < 0:
                break
        ipdom[v] = -1 if common is None else common
        depth[v] = 1 if ipdom[v] < 0 else depth[ipdom[v]] + 1
    return ipdom


def _components(members: list[int], succ: list[list[int]], pred: list[list[int]]) -> list[list[int]]:
    """The weakly connected parts of ``members``."""
    inside, seen, parts = set(members), set(), []
    for start in members:
        if start in seen:
            continue
        part, frontier = [], [start]
        seen.add(start)
        while frontier:
            v = frontier.pop()
            part.append(v)
            for u in succ[v] + pred[v]:
                if u in inside and u not in seen:
                    seen.add(u)
                    frontier.append(u)
        parts.append(part)
    return parts


def fork_branches(graph, min_branches: int) -> list[list[int]]:
    """The branches (lists of forward ops) of the outermost regions with at least ``min_branches``
    of them (module docstring)."""
    order, succ, pred = _forward_dag(graph)
    ipdom = _post_dominators(order, succ, graph.n_ops)
    rank = graph.topo_rank
    taken = np.zeros(graph.n_ops, bool)
    branches: list[list[int]] = []
    for f in order.tolist():
        j = int(ipdom[f])
        if len(succ[f]) < 2 or j < 0 or taken[f]:
            continue
        region, frontier, seen = [], [s for s in succ[f] if s != j], set()
        while frontier:        # descendants of f that come before j (every path from f passes j)
            v = frontier.pop()
            if v in seen or v == j or rank[v] > rank[j]:
                continue
            seen.add(v)
            region.append(v)
            if len(region) > MAX_REGION_OPS:
                break
            frontier.extend(succ[v])
        if len(region) > MAX_REGION_OPS or taken[region].any():
            continue
        parts = _components(region, succ, pred)
        if len(parts) < min_branches:
            continue
        taken[region] = True
        branches.extend(parts)
    return _with_dead_ends(graph, branches)


def _with_dead_ends(graph, branches: list[list[int]]) -> list[list[int]]:
    """Each branch with the forward ops left out of the forward DAG (dead ends: read only by the
    backward) whose forward inputs all lie in it."""
    of = np.full(graph.n_ops, -1, np.int64)
    for k, ops in enumerate(branches):
        of[ops] = k
    forward = (graph.role == Role.FORWARD) & (np.diff(graph.pred_ptr) > 0)
    for v in graph.topo_order[forward[graph.topo_order]].tolist():
        if of[v] >= 0:
            continue
        inputs = graph.edge_src[graph.pred_edge[graph.pred_ptr[v]:graph.pred_ptr[v + 1]]]
        inputs = np.unique(of[inputs[forward[inputs]]])
        if len(inputs) == 1 and inputs[0] >= 0 and not _leads_on(graph, v, forward):
            of[v] = inputs[0]
            branches[int(inputs[0])].append(v)
    return branches


def _leads_on(graph, v: int, forward: np.ndarray) -> bool:
    """Whether a forward op reads ``v``'s output."""
    readers = graph.edge_dst[graph.succ_edge[graph.succ_ptr[v]:graph.succ_ptr[v + 1]]]
    return bool(forward[readers].any())


def branch_pieces(graph, cluster, min_branches: int) -> tuple[np.ndarray, float]:
    """Per op, its piece (module docstring), and the share of the step's compute (fastest times plus
    op gaps) the branch pieces hold."""
    op_us = graph.compute_us.min(axis=1) + cluster.op_gap_us
    layers = UnitLayers.of(graph)
    layer = layers.layer_of_unit()[layers.unit_of]
    unit_branch = np.full(layers.n_units, -1, np.int64)
    for k, ops in enumerate(fork_branches(graph, min_branches)):
        units = layers.unit_of[ops]
        unit_branch[units[unit_branch[units] < 0]] = k
    branch = unit_branch[layers.unit_of]
    own = branch >= 0
    _, piece = np.unique(np.where(own, layer.max() + 1 + branch, layer), return_inverse=True)
    return piece.astype(np.int64), float(op_us[own].sum() / max(op_us.sum(), 1e-12))


def _branch_rounds(search: _Search, bound_us: float | None) -> None:
    """The track (module docstring); what it did goes to ``search.branch_report``."""
    config = search.config
    if not search.late_phase_may_run(bound_us, config.branch_evals):
        return
    piece, share = branch_pieces(search.graph, search.cluster, config.branch_min_branches)
    report = search.branch_report
    report.update(pieces=int(piece.max()) + 1, share=round(share, 4))
    if share < config.branch_share:
        return
    _piece_track(search, piece, config.branch_starts, config.branch_evals, config.branch_rounds,
                 "branch piece", HOW, report, as_is=True)
