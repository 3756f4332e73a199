"""Where the step order interleaves the layers (a recurrent net): whole layers as units, a layer
search that moves several at a time, and a layer descent."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from devplace.graph import Role
from devplace.placers._layers import UnitLayers
from devplace.placers._moves import Units
from devplace.portfolio.sim_search.config import NAME, log

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search


def interleaved_layers(graph, step_rank: np.ndarray, entries_per_layer: float = 2.0) -> Units | None:
    """The layers (``devplace.placers._layers``: modules as users cut them) as units, when the step
    order enters them ``entries_per_layer`` times each or more on average (a recurrent net, whose
    layers take turns by time step: GNMT's 15 enter 250 times), else None. A run of consecutive units
    then never holds a whole layer, so only a layer move can carry one (GNMT at 30% memory, one
    round: 305.6 -> 278.8 ms). Where each layer is entered about once (ResNet-50, Inception-V3,
    NASNet, the Transformer, RNNLM, the bundled graphs) the layer move, tried, moved the results
    both ways (four rounds at 30%: NASNet -3.9%, Transformer -2.5%, ResNet-50 +1.4%, Inception-V3
    +0.7%; one round: -1.4% to +1.2%), so it is not drawn there and they keep their figures."""
    layers = UnitLayers.of(graph)
    layer_of = layers.layer_of_unit()[layers.unit_of]
    forward = np.flatnonzero(graph.role == Role.FORWARD)
    sequence = layer_of[forward[np.argsort(step_rank[forward], kind="stable")]]
    n_layers = len(np.unique(layer_of))
    entries = 1 + np.count_nonzero(np.diff(sequence)) if len(sequence) else 0
    if n_layers < 2 or entries < entries_per_layer * n_layers:
        return None
    return Units.from_labels(graph, layer_of)


def _layer_search_starts(search: _Search) -> list[tuple]:
    """Where layers interleave, every start that fits, taken before the annealing (the layer search
    lays them out layer by layer); else none."""
    if search.layers is None or search.config.layer_search_evals <= 0 or search.n_dev < 2:
        return []
    return list(search.fitting)


def _by_layer(search: _Search, devices: np.ndarray) -> np.ndarray:
    """Each layer's device in ``devices``: the one holding most of its ops."""
    return np.array([np.bincount(devices[ops], minlength=search.n_dev).argmax() for ops in search.layer_ops])


def _layer_placement(search: _Search, base: np.ndarray, layer_devices: np.ndarray) -> np.ndarray:
    """``base`` with every layer (its ops and their colocation groups) whole on its device."""
    devices = base.copy()
    for ops, device in zip(search.layer_ops, layer_devices):
        devices[ops] = device
    return devices


def _fastest_fitting(search: _Search, devices: np.ndarray, order_name: str | None = None):
    """(step us, priority, order name) of ``devices`` in the fastest of ``orders`` that fits (only the one
    named, if ``order_name``), or None when none fits; each simulation is an eval (a full one, to check
    memory, unless memory is ample)."""
    best = None
    for name, order in search.orders(devices):
        if order_name is not None and name != order_name:
            continue
        if search.memory_is_ample:
            step, fits = search.step_us(devices, order), True
        else:
            overflow, step, _ = search.measure(devices, order)
            fits = overflow == 0
        if fits and (best is None or step < best[0]):
            best = (step, order, name)
    return best


def _layer_score(search: _Search, base: np.ndarray, layer_devices: np.ndarray, order_name: str | None):
    """(step us, per-op devices, priority, order name) of ``base`` laid out by layer in the order named
    (None: the fastest of ``orders``), or None when it does not fit."""
    devices = _layer_placement(search, base, layer_devices)
    scored = _fastest_fitting(search, devices, order_name)
    return None if scored is None else (scored[0], devices, scored[1], scored[2])


def _layer_search(search: _Search, starts: list[tuple]) -> None:
    """Where layers interleave, a random local search over whole-layer placements: each start that
    fits is laid out layer by layer (each layer on the device holding most of its ops), the
    ``layer_search_starts`` fastest distinct ones share ``layer_search_evals``, and from each a
    candidate moves one layer, and each other with chance 1.5 / layers, to another device drawn
    evenly; it replaces the centre if faster in the centre's order (then every order is tried).
    Greedy descents stop where no one-layer move is faster: on GNMT-4 with ample memory the
    descent from metis+opt ended at 228.85 ms, and no pair of layer moves from there is faster
    (945 tried), while this search from metis laid out by layer (255.6 ms) reached 216.9 in 640
    candidates. Runs after the annealing, so graphs without interleaved layers are untouched."""
    if search.layers is None or len(starts) < 2:     # only the annealing's best: layers do not interleave
        return
    laid_out = {}
    for _, devices, _, how in starts:
        layer_devices = _by_layer(search, devices)
        key = layer_devices.tobytes()
        if key not in laid_out:
            laid_out[key] = (_layer_score(search, devices, layer_devices, None), layer_devices, how)
    fitting = sorted((v for v in laid_out.values() if v[0] is not None), key=lambda v: v[0][0])
    fitting = fitting[:search.config.layer_search_starts]
    if not fitting:
        return
    share = search.config.layer_search_evals // len(fitting)
    n_layers = len(search.layer_ops)
    search.reporter.begin(f"{NAME}: layer search", total=share * len(fitting))
    search.phase_began = search.evals
    try:
        for (step, devices, priority, order_name), centre, how in fitting:
            search.offer(step, devices, priority, f"{how} laid out by layer")
            budget_end = search.evals + share
            moves = 0
            while search.evals < budget_end and not search.out_of_time() and search.best.step_us > search.closed_us:
                moved = search.rng.random(n_layers) < 1.5 / n_layers
                moved[search.rng.integers(n_layers)] = True
                shift = search.rng.integers(1, search.n_dev, n_layers)
                trial = np.where(moved, (centre + shift) % search.n_dev, centre)
                scored = _layer_score(search, devices, trial, order_name)
                if scored is not None and scored[0] < step:
                    step, devices, priority, order_name = _layer_score(search, devices, trial, None) or scored
                    centre, moves = trial, moves + 1
            if moves:
                log.info("eval %5d  layer search from %s: %d moves, %.3f ms", search.evals, how, moves, step / 1e3)
                search.offer(step, devices, priority, f"layer search ({moves} moves) from {how}")
    finally:
        search.reporter.end()


def _layer_descent_starts(search: _Search) -> list[tuple]:
    """Where layers interleave, the best start and the expert's fastest placement that fits (as
    ``search.best``), taken before the annealing; else none."""
    if search.layers is None or search.config.layer_descent_evals <= 0 or search.n_dev < 2:
        return []
    expert = [start for start in search.fitting if start[3].startswith("seed expert (")]
    return [search.best] + ([min(expert, key=lambda start: start[0])] if expert else [])


def _layer_descents(search: _Search, starts: list[tuple]) -> None:
    """Where layers interleave, greedy descents over whole-layer moves after the annealing, from its
    best, the best start and the expert's placement: each step tries every layer on every other
    device, each candidate in every order of ``orders`` and checked to fit, and takes the fastest;
    it stops when none is faster or ``layer_descent_evals`` (shared by the descents) are spent.
    The annealing's layer move draws one layer and device at random; on GNMT-4 with ample memory a
    descent from the expert (345.8 ms) reached 229.5 ms in 7 moves where the annealing ended at
    244.5. Run after the annealing, they leave its random stream as it was and only offer placements
    (run before it, as starts, GNMT at 30% ended 3.7% slower: 257.2 ms)."""
    if len(starts) < 2:     # only the annealing's best: layers do not interleave
        return
    budget_end = search.evals + search.config.layer_descent_evals
    search.reporter.begin(f"{NAME}: layer descent", total=search.config.layer_descent_evals)
    search.phase_began = search.evals
    try:
        for k, (step, devices, priority, how) in enumerate(starts):
            if k and any(np.array_equal(devices, other[1]) for other in starts[:k]):
                continue        # the same placement as an earlier start
            _layer_descent(search, step, devices, priority, how, budget_end)
    finally:
        search.reporter.end()


def _layer_descent(search: _Search, step: float, devices: np.ndarray, priority, how: str, budget_end: int,
                   layer_ops: list[np.ndarray] | None = None) -> tuple:
    """One greedy descent over whole-layer moves (of ``layer_ops``, else the search's layers) from a
    start (``_layer_descents``); offers its end and returns it as (step us, devices, priority)."""
    moves = 0
    while search.evals < budget_end and not search.out_of_time() and search.best.step_us > search.closed_us:
        fastest = (step, None, None)
        for ops in search.layer_ops if layer_ops is None else layer_ops:
            for target in range(search.n_dev):
                if (devices[ops] == target).all() or search.evals >= budget_end:
                    continue
                trial = devices.copy()
                trial[ops] = target
                scored = _fastest_fitting(search, trial)
                if scored is not None and scored[0] < fastest[0]:
                    fastest = (scored[0], trial, scored[1])
        if fastest[1] is None:
            break
        step, devices, priority = fastest
        moves += 1
    if moves:
        log.info("eval %5d  layer descent from %s: %d moves, %.3f ms", search.evals, how, moves, step / 1e3)
        search.offer(step, devices, priority, f"layer descent ({moves} moves) from {how}")
    return step, devices, priority
