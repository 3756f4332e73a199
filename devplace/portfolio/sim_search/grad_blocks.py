"""A start for steps whose weights accumulate their gradients over many time steps (a recurrent net):
each weight's gradient chain as a block of its own, apart from its layer.

An unrolled recurrent layer reads each weight at every time step, so the backward computes one
weight-gradient product per step and sums them in a chain (RNNLM, 20 steps: 20 products and 19
adds of a 2048 x 8192 gradient, 24.77 ms, for each of three weights). Those ops feed nothing but
their weight's update, so they can run on another device than the recurrence, which only sends
them each step's small inputs. The annealing moves units (a forward op with its backward ops) or
runs of them, and the layer moves take a layer with its chains, so neither separates a layer's
recurrence from its weights' chains in one step; on RNNLM at 30% memory seeds 0-2 end at
81.5-81.8 ms without this track, one GPU holding the classifier, half a layer and a chain.

Blocks (``gradient_blocks``): per op, the parameter whose update every path from it reaches
(``gradient_owner``: the op's gradient feeds that parameter and nothing else). A parameter whose
gradient ops and own ops (its colocation group: the weight, its optimizer state and update) hold
at least ``grad_block_min_share`` of the step's compute is a block; every other op stays in its
layer's block (``devplace.placers._layers``). The track runs where such blocks hold at least
``grad_block_share`` of the step's compute (RNNLM 54%; GNMT 7%, the Transformer 6.5%, the CNNs
0%): a greedy descent over whole-block moves (``layers._layer_descent``) from the best laid out by
block and from ``grad_block_starts`` - 1 random block maps (drawn from the search's seeded rng),
sharing ``grad_block_evals``; then annealing rounds from the fastest end, as the coarse MIP track
does (``anneal._track_rounds``). RNNLM at 30%: the descents end at 93.95-94.45 ms (93.95 is the
best of all 11,051 block maps up to relabelling the GPUs), and annealing from the fastest reaches
79.56 / 79.83 / 80.46 ms at seeds 0 / 1 / 2 (``benchmarks/coarse_mip_start.py``). It only offers
placements, so the search's best is never slower for it; the phases after it start from that best.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from devplace.graph import Role
from devplace.placers._layers import UnitLayers
from devplace.portfolio.sim_search.piece_track import _piece_track

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search

HOW = "gradient block start"
NO_OWNER, NOT_YET = -1, -2


def gradient_owner(graph) -> np.ndarray:
    """Per op, the colocation group of the update op every path from it reaches (a backward op whose
    output feeds one parameter's update and nothing else; an update op: its own group), else -1."""
    owner = np.full(graph.n_ops, NOT_YET, np.int64)
    update = (graph.role == Role.UPDATE) & (graph.colocation >= 0)
    backward = graph.role == Role.BACKWARD
    for v in np.argsort(graph.topo_rank)[::-1]:
        if update[v]:
            owner[v] = graph.colocation[v]
            continue
        found = NOT_YET
        for j in range(graph.succ_ptr[v], graph.succ_ptr[v + 1]):
            theirs = owner[graph.edge_dst[graph.succ_edge[j]]]
            if theirs < 0 or found not in (NOT_YET, theirs):
                found = NO_OWNER
                break
            found = theirs
        owner[v] = found if backward[v] and found >= 0 else NO_OWNER
    return owner


def gradient_blocks(graph, cluster, min_share: float) -> tuple[np.ndarray, float]:
    """Per op, its block (module docstring), and the share of the step's compute (fastest times plus
    op gaps) the parameters' blocks hold."""
    op_us = graph.compute_us.min(axis=1) + cluster.op_gap_us
    owner = gradient_owner(graph)
    group = np.where(owner >= 0, owner, graph.colocation)      # a parameter's own ops join its gradient
    # one spare entry: a graph without colocation groups still indexes it (and owns nothing)
    group_us = np.bincount(group[group >= 0], weights=op_us[group >= 0], minlength=len(graph.colocation_names) + 1)
    own = (group >= 0) & (group_us[np.maximum(group, 0)] >= min_share * op_us.sum())
    layers = UnitLayers.of(graph)
    layer = layers.layer_of_unit()[layers.unit_of]
    _, block = np.unique(np.where(own, layer.max() + 1 + group, layer), return_inverse=True)
    return block.astype(np.int64), float(op_us[own].sum() / max(op_us.sum(), 1e-12))


def _gradient_block_rounds(search: _Search, bound_us: float | None) -> None:
    """The track (module docstring); what it did goes to ``search.grad_block_report``."""
    config = search.config
    if not search.late_phase_may_run(bound_us, config.grad_block_evals):
        return
    block, share = gradient_blocks(search.graph, search.cluster, config.grad_block_min_share)
    report = search.grad_block_report
    report.update(blocks=int(block.max()) + 1, share=round(share, 4))
    if share < config.grad_block_share:
        return
    _piece_track(search, block, config.grad_block_starts, config.grad_block_evals, config.grad_block_rounds,
                 "gradient block", HOW, report)
