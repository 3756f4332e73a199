"""A start for steps whose saved activations need every device: the step cut into a *folded*
pipeline (the first device also holds the last stage), its boundaries shifted and the units near
them moved on the simulator's figures.

A convolutional net saves most of its activation bytes in its first layers and few in its last.
When every device must hold saved activations (the step's held bytes exceed what all devices but
the largest hold), a pipeline of consecutive stages cuts the heavy early layers more often than a
folded one, whose first device holds the light stem and the light last layers together. A
boundary at a block's output crosses the block's residual tensor both ways; one between a
convolution and its batch norm, with single units (a batch norm's backward, a convolution's
backward) then moved across it, lets the backward cross a block's inner gradient while the
residual one goes ahead on the channel. ResNet-50 at 30% memory (2.4 GiB GPUs): the start simulates at
532.1 ms (125.0 ms of transfers on its critical path, in 3,186 evals), where no other start fits
before the repair (round 44's notes).

Plans (``folded_plans`` of them simulated in the search's orders): the boundaries between leader
units in step order (a forward op with its backward and update ops, as the cheapest-cut starts),
thinned to the cheapest of each of ``folded_candidates`` windows of equal held bytes; n boundaries
make n + 1 stages on the devices largest memory first, the first device again last. A device is at
its fullest during one of its stages' backward: the held bytes of its earlier stages, plus that
stage's held bytes up to the unit running and twice the gradient that unit makes. Plans are taken
cheapest crossing first among those whose fullest device needs at most ``folded_slack`` x its
memory (the estimate overstates some stages and understates received copies). From the
``folded_descents`` of least (overflow, step): each boundary shifted by up to ``folded_window``
units while the step falls and no more overflows (``shift_boundaries``), then the units near the
boundaries moved (``boundary_descent``). The fastest that fits is offered as a start.
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING

import numpy as np

from devplace.graph import Role
from devplace.placers._listsched import mean_edge_us
from devplace.placers._moves import held_bytes, respect_colocation
from devplace.portfolio.sim_search.config import GIB, log
from devplace.portfolio.sim_search.starts import _crossing

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search

HOW = "folded pipeline start"


def folded_plans(unit_bytes: np.ndarray, gradient_bytes: np.ndarray, crossing_us: np.ndarray,
                 memory_bytes: np.ndarray, candidates: int, slack: float) -> list[tuple]:
    """Folded plans of the units in step order (per unit its held bytes and the gradient bytes its
    backward holds at once; per boundary k, between units k - 1 and k, the crossing time), as
    (crossing us, fullest device's need / its memory, boundaries, device per stage), cheapest
    first, only those whose every device needs at most ``slack`` x its memory."""
    n, n_dev = len(unit_bytes), len(memory_bytes)
    if n_dev < 2 or n < n_dev + 1:
        return []
    held = np.concatenate([[0.0], np.cumsum(unit_bytes)])
    inner = np.arange(1, n)
    window = np.minimum((held[inner] / max(held[-1], 1.0) * candidates).astype(np.int64), candidates - 1)
    cuts = [int(inner[window == w][np.argmin(crossing_us[inner[window == w]])]) for w in np.unique(window)]
    ends = np.array([0] + cuts + [n])
    # the most a stage between ends a and b holds at once past the units before it
    fullest_at = np.maximum.reduceat(held[1:] + gradient_bytes, ends[:-1])
    top = np.zeros((len(ends), len(ends)))
    for a in range(len(ends) - 1):
        top[a, a + 1:] = np.maximum.accumulate(fullest_at[a:]) - held[ends[a]]
    by_memory = [int(d) for d in np.argsort(-np.asarray(memory_bytes), kind="stable")]
    pattern = tuple(by_memory + by_memory[:1])
    plans = []
    for picked in itertools.combinations(range(1, len(ends) - 1), n_dev):
        marks = (0, *picked, len(ends) - 1)
        before, need = np.zeros(n_dev), np.zeros(n_dev)
        for stage, device in enumerate(pattern):
            a, b = marks[stage], marks[stage + 1]
            need[device] = max(need[device], before[device] + top[a, b])
            before[device] += held[ends[b]] - held[ends[a]]
        fullest = float((need / memory_bytes).max())
        if fullest <= slack:
            chosen = tuple(int(ends[k]) for k in picked)
            plans.append((float(crossing_us[list(chosen)].sum()), fullest, chosen, pattern))
    plans.sort(key=lambda plan: (round(plan[0], 3), plan[1], plan[2]))
    return plans


def shift_boundaries(search: _Search, devices_of, cuts: tuple[int, ...], priority, window: int):
    """Each boundary moved by 1 to ``window`` leader units either way, the first such plan that is
    faster and overflows no more taken, until none is: returns (overflow bytes, step us, cuts)."""
    overflow, step, _ = search.measure(devices_of(cuts), priority)
    moved = True
    while moved:
        moved = False
        for k, by in itertools.product(range(len(cuts)), [*range(1, window + 1), *range(-1, -window - 1, -1)]):
            shifted = cuts[:k] + (cuts[k] + by,) + cuts[k + 1:]
            if shifted != tuple(sorted(set(shifted))) or shifted[0] < 1:
                continue
            o, s, _ = search.measure(devices_of(shifted), priority)
            if o <= overflow and s < step - 1e-6:
                overflow, step, cuts, moved = o, s, shifted, True
                break
    return overflow, step, cuts


def boundary_descent(search: _Search, devices: np.ndarray, priority, position: np.ndarray,
                     cuts: tuple[int, ...], pattern: tuple[int, ...], window: int, evals: int):
    """Each unit within ``window`` leader units of a boundary put on the other side's device (a
    backward op apart from its forward op) while that lowers the overflow, or once it fits the
    step, until a pass moves nothing or ``evals`` simulator calls are spent; returns
    (overflow bytes, step us, devices)."""
    overflow, step, _ = search.measure(devices, priority)
    spent, moves = 1, []
    for k, cut in enumerate(cuts):
        near = np.flatnonzero((position >= cut - window) & (position < cut + window))
        moves += [(u, (pattern[k], pattern[k + 1])) for u in np.unique(search.fine.unit_of[near]).tolist()]
    members = {u: np.flatnonzero(search.fine.unit_of == u) for u, _ in moves}
    moved = True
    while moved and spent < evals:
        moved = False
        for u, sides in moves:
            for d in sides:
                if d == devices[members[u][0]] or spent >= evals:
                    continue
                trial = devices.copy()
                trial[members[u]] = d
                o, s, _ = search.measure(trial, priority)
                spent += 1
                if o < overflow or (o == 0 and overflow == 0 and s < step - 1e-6):
                    devices, overflow, step, moved = trial, o, s, True
                    break
    return overflow, step, devices


def _folded_start(search: _Search) -> None:
    """The start (module docstring), where memory is tight and the step's held bytes need every device."""
    graph, config = search.graph, search.config
    units = search.leaders
    if (config.folded_plans < 1 or search.memory_is_ample or search.virtual or search.n_dev < 2
            or units.n_units < search.n_dev + 1):
        return
    memory = search.memory_bytes()
    op_held = held_bytes(graph)
    if op_held.sum() <= memory.sum() - memory.max():
        return      # a device may hold no saved activations: consecutive stages do
    n, fine = units.n_units, search.fine
    earliest = np.full(fine.n_units, n, np.int64)
    np.minimum.at(earliest, fine.unit_of, units.unit_of)
    position = earliest[fine.unit_of]
    edge_us = mean_edge_us(graph, search.cluster)
    crossing = _crossing(graph, position, edge_us, n) + _crossing(graph, n - 1 - position, edge_us, n)[::-1]
    gradient = np.zeros(n)
    backward = graph.role == Role.BACKWARD
    np.maximum.at(gradient, position[backward], 2.0 * graph.output_bytes[backward])
    unit_bytes = np.bincount(position, weights=op_held, minlength=n)
    plans = folded_plans(unit_bytes, gradient, crossing, memory, config.folded_candidates, config.folded_slack)
    def devices_of(cuts: tuple[int, ...], pattern: tuple[int, ...]) -> np.ndarray:
        stage = np.searchsorted(np.asarray(cuts), position, side="right")
        return respect_colocation(fine, np.asarray(pattern)[stage])

    judged = []
    for _, _, cuts, pattern in plans[:config.folded_plans]:
        for name, priority in search.orders(devices_of(cuts, pattern)):
            overflow, step, _ = search.measure(devices_of(cuts, pattern), priority)
            judged.append((overflow, step, len(judged), cuts, pattern, priority, name))
    best, seen = None, set()
    for _, _, _, cuts, pattern, priority, name in sorted(judged, key=lambda j: j[:3])[:config.folded_descents]:
        _, _, cuts = shift_boundaries(search, functools.partial(devices_of, pattern=pattern), cuts, priority,
                                      config.folded_window)
        if (cuts, pattern, name) in seen:
            continue        # two plans shifted to the same one
        seen.add((cuts, pattern, name))
        overflow, step, devices = boundary_descent(search, devices_of(cuts, pattern), priority, position, cuts,
                                                   pattern, config.folded_window, config.folded_descent_evals)
        log.info("folded start: cuts %s on %s (%s): %.3f ms, %.3f GiB over", cuts, pattern, name, step / 1e3,
                 overflow / GIB)
        if overflow == 0 and (best is None or step < best[0]):
            best = (step, devices, priority, f"{HOW} (cuts {list(cuts)} on devices {list(pattern)}, {name})")
    if best is not None:
        search.offer(*best)
