"""Simulated annealing in rounds while the gap to the certified bound is wide: the moves, what
starts each round, the rounds under virtual memory caps, and one round."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from devplace.errors import OutOfMemoryError
from devplace.placers._moves import critical_crossings
from devplace.portfolio.sim_search.config import GIB, NAME
from devplace.portfolio.sim_search.starts import BALANCED_CUT, _cheap_cut_starts

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search


def _critical_info(search: _Search, devices, priority, result=None):
    """Critical-path ops, the (waiting op, producer) pairs across devices on it, and the busy time per device."""
    if result is None:
        _, result = search.examine(devices, priority)
    return critical_crossings(result, devices)


def _propose(search: _Search, devices: np.ndarray, info) -> tuple[str, list[tuple[np.ndarray, int]]]:
    """One random move: (name, [(ops, new device), ...]); an empty list if it found nothing to do."""
    config, rng, n_dev = search.config, search.rng, search.n_dev
    path, pairs, busy_us = info
    units = search.coarse if rng.random() < config.coarse_share else search.fine
    if not search.move_names:
        return "layer", []      # only layer moves asked for, and no layer to move
    move = search.move_names[rng.choice(len(search.move_names), p=search.move_p)]

    def pick_unit() -> int:
        if len(path) and rng.random() < config.critical_share:
            return int(units.unit_of[path[rng.integers(len(path))]])
        return int(rng.integers(units.n_units))

    def other_device(d: int) -> int:
        return int((d + 1 + rng.integers(n_dev - 1)) % n_dev)

    if move == "pull" and pairs:
        waiting, producer = pairs[rng.integers(len(pairs))]
        if rng.random() < 0.5:
            return move, [(units.members(int(units.unit_of[waiting])), int(devices[producer]))]
        return move, [(units.members(int(units.unit_of[producer])), int(devices[waiting]))]
    if move == "layer":
        layers = search.layers
        layer = int(layers.unit_of[path[rng.integers(len(path))]]) if len(path) and rng.random() < \
            config.critical_share else int(rng.integers(layers.n_units))
        ops = search.layer_ops[layer]
        here = int(np.argmax(np.bincount(devices[ops], minlength=n_dev)))
        others = np.flatnonzero(np.arange(n_dev) != here)
        target = int(others[np.argmin(busy_us[others])]) if rng.random() < 0.5 else other_device(here)
        return move, [(ops, target)]
    if move == "unload":
        hot, cold = int(np.argmax(busy_us)), int(np.argmin(busy_us))
        on_hot = path[devices[path] == hot] if len(path) else path
        candidates = on_hot if len(on_hot) else np.flatnonzero(devices == hot)
        if hot == cold or not len(candidates):
            return move, []
        return move, [(units.members(int(units.unit_of[candidates[rng.integers(len(candidates))]])), cold)]
    if move == "swap":
        a, b = pick_unit(), int(rng.integers(units.n_units))
        da, db = int(devices[units.members(a)[0]]), int(devices[units.members(b)[0]])
        if da == db:
            return move, []
        return move, [(units.members(a), db), (units.members(b), da)]
    if move == "run":
        center = pick_unit()
        length = int(rng.integers(2, config.run_max_units + 1))
        first = max(0, center - int(rng.integers(length)))
        last = min(units.n_units - 1, first + length - 1)
        return move, [(units.run_members(first, last), other_device(int(devices[units.members(center)[0]])))]
    unit = pick_unit()
    return "move", [(units.members(unit), other_device(int(devices[units.members(unit)[0]])))]


def _lower_bound_us(graph, cluster) -> float | None:
    """The certified lower bound on the step time, or None when memory alone shows nothing fits
    (then the search fails on its own, with its overflow report)."""
    from devplace.bounds import lower_bounds

    try:
        return lower_bounds(graph, cluster)["best_us"]
    except OutOfMemoryError:
        return None


def _rounds(search: _Search, bound_us: float | None) -> tuple[str, int]:
    """Annealing rounds while the gap to the bound is wide (the rule in the module docstring);
    returns what stopped them and how many ran."""
    config = search.config
    if search.n_dev < 2 or config.max_evals <= 0 or search.best.step_us <= 0 or not search.graph.n_ops:
        search.fitting = None
        return "evals", 0      # nothing to move, or nothing beats a zero step time
    starts = sorted(search.fitting, key=lambda start: start[0])
    search.fitting = None
    first = search.best
    rounds = 0
    while rounds < config.max_rounds or (
            rounds < config.small_graph_round_factor * config.max_rounds
            and (search.evals + config.max_evals) * search.graph.n_ops <= config.small_graph_op_evals):
        if search.best.step_us <= search.closed_us:
            return "bound", rounds
        if rounds and (bound_us is None or search.best.step_us <= bound_us * (1.0 + config.target_gap)):
            break
        if rounds % 2 == 0:
            start = first if rounds < 2 * config.first_start_rounds else search.best
        else:
            start = (rounds == 1 and _balanced_start(starts, first)) or _next_start(starts, search.best)
        title = NAME if not rounds else f"{NAME} (round {rounds + 1}, gap {100 * (search.best.step_us / bound_us - 1):.1f}%)"
        stopped_by = _reported(search, title, lambda s, begin: _anneal(s, begin)[0], start)
        rounds += 1
        if stopped_by != "evals":
            return stopped_by, rounds
    if rounds >= config.max_rounds and config.affords_more_searches(search.graph.n_ops):   # the gap still wide
        stopped_by, rounds = _virtual_cap_rounds(search, bound_us, rounds)
        if stopped_by != "evals":
            return stopped_by, rounds
    return ("bound" if search.best.step_us <= search.closed_us else "evals"), rounds


def _virtual_cap_rounds(search: _Search, bound_us: float | None, rounds: int) -> tuple[str, int]:
    """One round under each of ``virtual_caps`` x the one-device peak (an eval) that is below some
    device's memory, while the gap stays above ``target_gap``: from the best if it fits the cap, else
    from the fastest cheapest cut planned for the cap that fits it, annealed under the cap. Whatever
    they offer fits the cap, hence the devices. They come after the other rounds, so those run as
    without them; the tracks after them start from the best they leave."""
    config = search.config
    if not config.virtual_caps or bound_us is None:
        return "evals", rounds
    one_device_peak = search.one_device_peak_bytes()
    for fraction in config.virtual_caps:
        if search.best.step_us <= bound_us * (1.0 + config.target_gap):
            break
        cap = np.minimum(search.cap_bytes, fraction * one_device_peak)
        if not (cap < search.cap_bytes).any():
            continue
        title = f"{NAME} (round {rounds + 1}, under {fraction:g} x the one-device peak)"
        stopped_by = _reported(search, title, _capped_round, cap)
        rounds += 1
        if stopped_by != "evals":
            return stopped_by, rounds
    return "evals", rounds


def _reported(search: _Search, title: str, run, arg):
    """One round, ``run(search, arg)``, shown to the progress hook as ``title``; returns what ``run`` returns."""
    search.reporter.begin(title, total=search.config.max_evals)
    search.phase_began = search.evals
    try:
        stopped_by = run(search, arg)
        search.report()
    finally:
        search.reporter.end()
    return stopped_by


def _capped_round(search: _Search, cap: np.ndarray) -> str:
    """One round under ``cap``: from the best if it fits (an eval), else from ``_capped_start``."""
    with search.capped(cap):
        search.evals += 1
        start = search.best if search.examine(*search.best[1:3])[0] else _capped_start(search)
        stopped_by = "evals" if start is None else _anneal(search, start)[0]
    search.virtual_rounds.append({"cap_gib": float(cap.max()) / GIB, "start": None if start is None else start[3],
                                  "best_after_us": search.best.step_us})
    return stopped_by


def _capped_start(search: _Search) -> tuple | None:
    """The fastest cheapest cut planned for the current cap that fits it (None if none does)."""
    search.fitting = []
    try:
        _cheap_cut_starts(search)
        return min(search.fitting, key=lambda start: start[0], default=None)
    finally:
        search.fitting = None


def _balanced_start(starts: list[tuple], first: tuple) -> tuple | None:
    """The fastest balanced cheapest-cut start (taken off the list) unless the first round began
    from its placement: a second round whose start does not depend on the memory."""
    for k, start in enumerate(starts):
        if start[3].startswith(BALANCED_CUT):
            return None if np.array_equal(start[1], first[1]) else starts.pop(k)
    return None


def _next_start(starts: list[tuple], best: tuple) -> tuple:
    """The fastest start whose devices differ from the best's (taken off the list), else the best:
    an odd round explores from another start than the one the best came from."""
    while starts:
        start = starts.pop(0)
        if not np.array_equal(start[1], best[1]):
            return start
    return best


def _anneal(search: _Search, start: tuple) -> tuple[str, tuple]:
    """One round of simulated annealing from ``start`` (as ``search.best``); returns what stopped
    it ("evals", "time", or "bound": the best came within ``closed_gap`` of the lower bound) and
    the round's best (as ``start``)."""
    config, rng = search.config, search.rng
    current_us, devices, priority, _ = start
    devices = devices.copy()
    home = (current_us, devices.copy(), priority, start[3])    # the round's best: where it restarts from
    info = _critical_info(search, devices, priority)
    since_best = 0
    cooling = (config.temperature_end / config.temperature_start) ** (1.0 / max(config.max_evals, 1))
    temperature = config.temperature_start
    budget_end = search.evals + config.max_evals
    next_reorder = search.evals + config.reorder_every
    while search.evals < budget_end:
        if search.out_of_time():
            return "time", home
        if search.best.step_us <= search.closed_us:
            return "bound", home
        temperature *= cooling
        move, changes = _propose(search, devices, info)
        undo = [(ops, devices[ops].copy()) for ops, _ in changes]
        for ops, d in changes:
            devices[ops] = d
        if not changes or all((devices[ops] == old).all() for ops, old in undo):
            search.evals += 1   # a no-op move still counts, so the loop always ends
            continue
        step = search.step_us(devices, priority)
        worse = (step - current_us) / search.best.step_us
        accept = worse <= 0 or rng.random() < math.exp(-worse / max(temperature, 1e-12))
        result = None
        if accept and not search.memory_is_ample:
            accept, result = search.examine(devices, priority)
        if not accept:
            for ops, old in undo:
                devices[ops] = old
        else:
            current_us = step
            info = _critical_info(search, devices, priority, result)
            search.offer(step, devices, priority, f"{move} move")
            if step < home[0]:
                home, since_best = (step, devices.copy(), priority, f"{move} move"), -1
        since_best += 1
        if search.evals >= next_reorder:
            next_reorder = search.evals + config.reorder_every
            for order, candidate in search.orders(devices):
                step = search.step_us(devices, candidate)
                if step < current_us and search.fits(devices, candidate):
                    current_us, priority = step, candidate
                    search.offer(step, devices, priority, f"{order} order")
                    if step < home[0]:
                        home = (step, devices.copy(), priority, f"{order} order")
        if since_best >= config.restart_after:
            current_us, home_devices, priority, _ = home
            devices = home_devices.copy()
            info = _critical_info(search, devices, priority)
            since_best = 0
    return "evals", home


def _track_rounds(search: _Search, home: tuple, name: str, max_track_rounds: int, behind: float,
                  until_us: float = -math.inf) -> tuple[int, float]:
    """Annealing rounds from a start no other round reached (a track: the coarse MIP start, the
    gradient blocks), each from the track's best: ``max_rounds``, then up to ``max_track_rounds``
    while that best is within ``behind`` of the best found; returns the rounds and the track's best."""
    config = search.config
    rounds = 0
    while rounds < max_track_rounds:
        if search.best.step_us <= max(search.closed_us, until_us) or search.out_of_time():
            break
        if rounds >= config.max_rounds and home[0] > search.best.step_us * (1.0 + behind):
            break
        home = _reported(search, f"{NAME} ({name}, round {rounds + 1})", lambda s, start: _anneal(s, start)[1], home)
        rounds += 1
    return rounds, home[0]
