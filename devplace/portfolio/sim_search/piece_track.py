"""The engine the piece tracks share (gradient blocks, recurrence pieces, whole branches): greedy
descents over whole-piece moves, then annealing rounds from the fastest end.

A piece is a set of ops that should move together but no annealing move carries whole (a weight's
gradient chain, a branch with its weights); each track only says what its pieces are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from devplace.placers._moves import with_colocation
from devplace.portfolio.sim_search.anneal import _track_rounds
from devplace.portfolio.sim_search.config import NAME, log
from devplace.portfolio.sim_search.layers import _fastest_fitting, _layer_descent

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search


def _piece_track(search: _Search, piece: np.ndarray, starts: int, evals: int, max_track_rounds: int, name: str,
                 how: str, report: dict, as_is: bool = False) -> None:
    """A track over whole pieces (per op, its piece; a piece moves with its ops' colocation groups):
    greedy descents over whole-piece moves (``layers._layer_descent``) from the best laid out by
    piece (each on the device holding most of its ops; with ``as_is``, the best as it is, its
    pieces not made whole until a move carries them) and from ``starts`` - 1 random piece maps
    drawn from the search's rng, sharing ``evals``; then up to ``max_track_rounds`` annealing rounds
    from the fastest end (``anneal._track_rounds``, within ``track_behind`` past ``max_rounds``).
    The best before it, the descent ends, rounds and the track's best go to ``report`` (and the log)."""
    config = search.config
    report.update(before_us=search.best.step_us)
    piece_ops = [with_colocation(search.fine, np.flatnonzero(piece == p)) for p in range(int(piece.max()) + 1)]
    maps = [None if as_is else
            np.array([np.bincount(search.best.devices[ops], minlength=search.n_dev).argmax() for ops in piece_ops])]
    maps += [search.rng.integers(0, search.n_dev, len(piece_ops)) for _ in range(starts - 1)]
    budget_end = search.evals + evals
    ends = []
    search.reporter.begin(f"{NAME}: {name} descent", total=evals)
    search.phase_began = search.evals
    try:
        for k, piece_devices in enumerate(maps):
            if piece_devices is None:          # as_is: the best itself
                devices = search.best.devices.copy()
            else:
                devices = np.zeros(search.graph.n_ops, np.int64)
                for ops, device in zip(piece_ops, piece_devices):
                    devices[ops] = device
            scored = _fastest_fitting(search, devices)
            if scored is None or search.evals >= budget_end:
                continue
            start_how = f"{how} {k}"
            ends.append(_layer_descent(search, scored[0], devices, scored[1], start_how, budget_end, piece_ops)
                        + (start_how,))
    finally:
        search.reporter.end()
    report.update(descent_ends_us=sorted(end[0] for end in ends))
    if not ends:
        log.info("%s track: %s", name, report)
        return
    home = min(ends, key=lambda end: end[0])
    search.offer(*home)
    rounds, best_us = _track_rounds(search, home, f"{name}s", max_track_rounds, config.track_behind)
    report.update(rounds=rounds, best_us=best_us)
    log.info("%s track: %s", name, report)
