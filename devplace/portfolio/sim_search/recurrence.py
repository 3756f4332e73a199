"""A start built for a recurrent step: each weight's readers, gradient chain and own ops as pieces
that can sit on different devices, so a weight's chain can leave its recurrence.

The gradient block track (``grad_blocks.py``) keeps a weight, its optimizer state and update with
its gradient chain, and its readers with their layer. On RNNLM at 30% memory its best block map is
93.95 ms; annealing from it ends at 79.56. The annealed layout has what no block map has: layer 1's
input weight sits apart from its recurrence with its own per-step products. Its first GPU still
waits 3.1 ms at the start for layer 0's input weight (16 MiB), whose update lives with its chain on
the classifier's GPU; no single move fixes that (its 80 readers moved to the weight: 95.2 ms; its
whole block moved to the first GPU: 83.9 ms).

Pieces (``recurrence_pieces``), from the gradient blocks:
- a weight's *gradient chain*: the backward ops whose output feeds its update and nothing else
  (``gradient_owner``);
- a weight's *own ops*: its colocation group (the weight, its optimizer state, its update). Apart
  from the chain, the weight can stay where it is read while the chain runs elsewhere and sends
  its sum once at the end (RNNLM: layer 0's input weight on its recurrence's GPU, 16 MiB sent at the
  end instead of at the start);
- a *non-recurrent* weight's *readers* (the ops that take it as input, directly or through ops that
  take no time, such as a transpose; update ops excepted). A weight is recurrent when each of its
  forward readers, in step order, depends on the one before: a recurrence's hidden weight, read
  once per time step in a chain of steps. Its products are the recurrence, so they stay with their
  layer. An input weight's products depend only on the layer below, so they can run with the weight
  on another device and send the per-step products on (layer 1's input weight in the annealed
  layout);
- every other op stays in its layer's piece (``devplace.placers._layers``).
Weights with no gradient block keep everything in their layer.

The track runs after the gradient block track, where that track runs (``grad_block_share``) and at
least one block's weight is recurrent: a greedy descent over whole-piece moves from the best laid
out by piece and from ``recurrence_starts`` - 1 random piece maps (from the search's seeded rng),
sharing ``recurrence_evals``; then annealing rounds from the fastest end (``piece_track._piece_track``).
RNNLM at 30% memory, seed 0: the descent from the best (79.56 ms) ends at 79.27 ms, and 16 rounds
from there at 77.77 ms. It only offers placements, so the search's best is never slower for
it; the phases after it start from that best. Nothing is read from names: the structure comes from the graph's roles,
colocation groups and edges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from devplace.graph import Role
from devplace.portfolio.sim_search.grad_blocks import gradient_blocks, gradient_owner
from devplace.portfolio.sim_search.piece_track import _piece_track

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search

HOW = "recurrence start"


def _successors(graph, v: int) -> np.ndarray:
    """The ops that read ``v``'s output (once per edge)."""
    return graph.edge_dst[graph.succ_edge[graph.succ_ptr[v]:graph.succ_ptr[v + 1]]]


def weight_readers(graph, weight: int) -> np.ndarray:
    """The ops that read ``weight`` directly or through ops that take no time (a transpose view,
    which joins them), update ops excepted: what computes with the weight."""
    free = graph.compute_us.min(axis=1) <= 0
    readers, frontier = set(), [weight]
    while frontier:
        v = frontier.pop()
        for u in _successors(graph, v).tolist():
            if u not in readers and graph.role[u] != Role.UPDATE:
                readers.add(u)
                if free[u]:
                    frontier.append(u)
    return np.array(sorted(readers), np.int64)


def _depends_on(graph, later: int, earlier: int) -> bool:
    """Whether a path leads from ``earlier`` to ``later`` (searched only among ops ranked before ``later``)."""
    limit = graph.topo_rank[later]
    seen, frontier = {earlier}, [earlier]
    while frontier:
        v = frontier.pop()
        for u in _successors(graph, v).tolist():
            if u == later:
                return True
            if u not in seen and graph.topo_rank[u] < limit:
                seen.add(u)
                frontier.append(u)
    return False


def is_recurrent(graph, readers: np.ndarray) -> bool:
    """Whether a weight's forward readers that take time, in step order, each depend on the one
    before (at least two of them): the weight is read once per time step inside the recurrence."""
    forward = readers[(graph.role[readers] == Role.FORWARD) & (graph.compute_us[readers].min(axis=1) > 0)]
    forward = forward[np.argsort(graph.topo_rank[forward], kind="stable")]
    return len(forward) >= 2 and all(_depends_on(graph, int(b), int(a)) for a, b in zip(forward[:-1], forward[1:]))


def recurrence_pieces(graph, cluster, min_share: float) -> tuple[np.ndarray, int]:
    """Per op, its piece (module docstring), and how many of the gradient blocks' weights are recurrent."""
    return _pieces_of_blocks(graph, gradient_blocks(graph, cluster, min_share)[0])


def _pieces_of_blocks(graph, block: np.ndarray) -> tuple[np.ndarray, int]:
    """``recurrence_pieces`` from the gradient blocks already found."""
    owner = gradient_owner(graph)
    n_blocks = int(block.max()) + 1 if graph.n_ops else 0
    piece = block.copy()
    next_piece, recurrent = n_blocks, 0
    # a weight's block holds its gradient ops and its colocation group, nothing else (a layer's block
    # holds ops of neither kind: its forward ops)
    loose = np.bincount(block, weights=(owner < 0) & (graph.colocation < 0), minlength=n_blocks)
    for b in np.flatnonzero(loose == 0).tolist():
        members = np.flatnonzero(block == b)
        own = members[graph.colocation[members] >= 0]
        chain = members[(owner[members] >= 0) & (graph.colocation[members] < 0)]
        if not len(own) or not len(chain):
            continue
        piece[chain] = next_piece
        next_piece += 1
        weights = own[(graph.pred_ptr[own + 1] == graph.pred_ptr[own]) & (graph.role[own] != Role.UPDATE)]
        readers = np.unique(np.concatenate([weight_readers(graph, int(w)) for w in weights])) if len(weights) \
            else np.zeros(0, np.int64)
        readers = readers[block[readers] != b]
        if not len(readers):
            continue
        if is_recurrent(graph, readers):
            recurrent += 1
        else:
            piece[readers] = next_piece
            next_piece += 1
    _, piece = np.unique(piece, return_inverse=True)
    return piece.astype(np.int64), recurrent


def _recurrence_rounds(search: _Search, bound_us: float | None) -> None:
    """The track (module docstring); what it did goes to ``search.recurrence_report``."""
    config = search.config
    if config.grad_block_evals <= 0 or not search.late_phase_may_run(bound_us, config.recurrence_evals):
        return
    block, share = gradient_blocks(search.graph, search.cluster, config.grad_block_min_share)
    if share < config.grad_block_share:
        return
    piece, recurrent = _pieces_of_blocks(search.graph, block)
    report = search.recurrence_report
    report.update(pieces=int(piece.max()) + 1, recurrent_weights=recurrent)
    if not recurrent:
        return
    _piece_track(search, piece, config.recurrence_starts, config.recurrence_evals, config.recurrence_rounds,
                 "recurrence piece", HOW, report)
