"""Starts that do not fit are repaired: units moved off the devices over memory until they fit."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from devplace.errors import OutOfMemoryError
from devplace.placers._memory import out_of_memory
from devplace.placers._moves import Units, live_bytes_at_peak, with_colocation
from devplace.portfolio.sim_search.config import GIB, NAME, log

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search


def _unit_devices(units: Units, devices: np.ndarray) -> np.ndarray:
    """Device of each unit's first member (a colocation widening may have moved the others)."""
    return devices[units.flat[units.ptr[:-1]]]


def _repair_move(search: _Search, devices: np.ndarray, result) -> tuple[str, np.ndarray, int] | None:
    """Ops to take off the most-overflowing device and where to put them, or None.

    Either a run of consecutive groups at one edge of that device's share of the step (a pipeline
    stage boundary moves: one activation crosses the new cut), or one group drawn with weight
    live^2 / (live + added transfer bytes): big at the peak and cheap to move."""
    config, rng, units, capacity = search.config, search.rng, search.leaders, search.cluster.memory_bytes
    peak = result.peak_memory_bytes
    worst = int(np.argmax(peak - capacity))
    unit_dev = _unit_devices(units, devices)
    on_worst = np.unique(units.unit_of[devices == worst])     # groups with any op there (starts may split them)
    if not len(on_worst) or search.n_dev < 2:
        return None
    roomiest = np.argsort(peak - capacity, kind="stable")
    roomiest = roomiest[roomiest != worst]
    if rng.random() < config.repair_run_share:
        longest = max(1, int(len(on_worst) * config.repair_run_fraction))
        length = int(np.exp(rng.uniform(0.0, math.log(longest + 1))))
        length = min(max(length, 1), len(on_worst))
        if rng.random() < 0.5:
            chosen, outside = on_worst[:length], on_worst[0] - 1
        else:
            chosen, outside = on_worst[-length:], on_worst[-1] + 1
        neighbour = int(unit_dev[outside]) if 0 <= outside < units.n_units else worst
        target = neighbour if neighbour != worst and rng.random() < 0.5 else int(roomiest[0])
        ops = np.flatnonzero(np.isin(units.unit_of, chosen))
        return "stage-edge run", with_colocation(search.fine, ops), target
    target = int(roomiest[0])
    live = np.bincount(units.unit_of, weights=live_bytes_at_peak(result), minlength=units.n_units)[on_worst]
    g = search.graph
    src_u, dst_u = units.unit_of[g.edge_src], units.unit_of[g.edge_dst]
    outer = src_u != dst_u
    added = np.zeros(units.n_units)       # bytes that would newly cross minus bytes that would stop crossing
    for mine, other in ((src_u, g.edge_dst), (dst_u, g.edge_src)):
        sign = np.where(devices[other] == worst, 1.0, np.where(devices[other] == target, -1.0, 0.0))
        np.add.at(added, mine[outer], (sign * g.edge_bytes)[outer])
    added = np.maximum(added[on_worst], 0.0)
    score = live * live / (live + added + 1.0)
    if not score.sum() > 0:
        return None
    unit = int(on_worst[rng.choice(len(on_worst), p=score / score.sum())])
    return "group", with_colocation(search.fine, units.members(unit)), target


def _repair(search: _Search, starts: list[tuple] | None = None, report: dict | None = None,
            candidates: int = 1) -> tuple | None:
    """Greedy descent on (total overflow, step time) from the least-overflowing of ``starts`` (the
    search's over-memory starts by default); the first placement that fits, as ``search.best`` (it
    is offered, so the annealing continues from it), or None. What it did goes to ``report`` (the
    search's ``repair_report`` by default). With ``candidates`` > 1 each step measures that many
    proposals and takes the fastest that lowers the overflow: a repair that keeps a fast placement
    fast (GNMT's best with 60% memory, 216.9 ms, 0.36 GiB over 30%: one proposal a step gives
    756.4 ms, the fastest of 24 gives 226.8 ms)."""
    config = search.config
    starts = sorted(search.starts if starts is None else starts, key=lambda s: (s[0], s[1]))[: config.repair_starts]
    budget_end = search.evals + config.repair_max_evals
    report = search.repair_report if report is None else report
    report.update(starts_tried=[], evals=0)
    began_evals = search.evals
    for overflow, step, devices, priority, how in starts:
        if search.evals >= budget_end or search.out_of_time():
            break
        report["starts_tried"].append(how)
        devices = devices.copy()
        overflow, step, result = search.measure(devices, priority)
        log.info("eval %5d  repairing %s: %.3f GiB over memory", search.evals, how, overflow / GIB)
        stale = 0
        while search.evals < budget_end and stale < config.repair_patience and not search.out_of_time():
            if candidates > 1:
                measured = _fastest_lowering(search, devices, priority, result, overflow, candidates)
            else:
                measured = _measured_proposal(search, devices, priority, result)
            if measured is None:
                stale += 1
                continue
            move, trial, t_overflow, t_step, t_result = measured
            if (t_overflow, t_step) >= (overflow, step):
                stale += 1
                continue
            stale = 0 if t_overflow < overflow else stale + 1
            devices, overflow, step, result = trial, t_overflow, t_step, t_result
            if overflow == 0:
                report.update(evals=search.evals - began_evals, repaired=how)
                search.offer(step, devices, priority, f"repair of {how} ({move} move)")
                return step, devices, priority, f"repair of {how} ({move} move)"
    report["evals"] = search.evals - began_evals
    return None


def _measured_proposal(search: _Search, devices, priority, result):
    """One repair proposal, measured: (move, devices, overflow, step us, SimResult), or None when
    there is none (it still counts as an eval, so the repair's loop always ends)."""
    proposal = _repair_move(search, devices, result)
    if proposal is None:
        search.evals += 1
        return None
    move, ops, target = proposal
    trial = devices.copy()
    trial[ops] = target
    return (move, trial, *search.measure(trial, priority))


def _fastest_lowering(search: _Search, devices, priority, result, overflow: float, candidates: int):
    """Of ``candidates`` measured repair proposals, the fastest whose overflow is below
    ``overflow``, as ``_measured_proposal`` gives it, or None."""
    fastest = None
    for _ in range(candidates):
        measured = _measured_proposal(search, devices, priority, result)
        if measured is not None and measured[2] < overflow and (
                fastest is None or (measured[3], measured[2]) < (fastest[3], fastest[2])):
            fastest = measured
    return fastest


def _overflow_error(search: _Search) -> OutOfMemoryError:
    """The smallest overflow found, per device, and the largest groups on the worst device."""
    graph, cluster = search.graph, search.cluster
    if search.least is None:
        return out_of_memory(graph, cluster, NAME)
    overflow, _, result = search.least
    peak, capacity = result.peak_memory_bytes, cluster.memory_bytes
    worst = int(np.argmax(peak - capacity))
    per_device = ", ".join(f"{dev.name!r} {p / GIB:.3f} of {m / GIB:.3f} GiB"
                           for dev, p, m in zip(cluster.devices, peak, capacity))
    units = search.leaders
    live = np.bincount(units.unit_of, weights=live_bytes_at_peak(result), minlength=units.n_units)
    mine = np.unique(units.unit_of[result.devices == worst])
    largest = [u for u in mine[np.argsort(-live[mine], kind="stable")[:3]] if live[u] > 0]
    groups = ", ".join(f"{graph.names[units.members(int(u))[0]]!r} (+{len(units.members(int(u))) - 1} ops) "
                       f"{live[u] / GIB:.3f} GiB" for u in largest)
    return OutOfMemoryError(
        f"{NAME} found no placement that fits memory in {search.evals} simulations: the least total "
        f"overflow is {overflow / GIB:.3f} GiB (peak per device: {per_device}); largest groups at the peak "
        f"of {cluster.devices[worst].name!r}: {groups}; give the devices more memory or add devices"
    )
