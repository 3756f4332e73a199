"""Pipeline starts, whatever the memory: forward stages balanced by bytes, and the step cut into
consecutive stages where the least transfer time crosses (sized to the memory, and balanced)."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from devplace.graph import Role
from devplace.placers._listsched import mean_edge_us
from devplace.placers._moves import Units, held_bytes, leader_units, pipeline_devices, read_later, respect_colocation

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search


# a cheapest-cut plan counts a stage's held bytes, gradients and received copies at once, which
# overstates its simulated peak (ResNet-50 at 30%: by 0.1-0.3 GiB), so plans up to this x capacity are tried
CHEAP_CUT_SLACK = 1.5

# balanced cheapest cuts are planned at these multiples of the least bytes a stage may hold
# (bisected that many times): placements that do not depend on the devices' memory
BALANCED_CUT_PLANS = (1.0, 1.125, 1.25, 1.5)
BALANCED_CUT_BISECTIONS = 24
BALANCED_CUT = "balanced cheapest-cut pipeline"    # how such a start is described, and found again


def _pipeline_starts(search: _Search) -> None:
    """Consecutive stages of forward ops on 2..n devices (the largest ones), backward and update ops
    with their forward op, colocation groups whole, each weight with its first reader and, as
    before, all weights first in topological order (on the first stage, with their updates: GNMT
    at 30% memory fits its fastest start, 454 ms, only so; ResNet-50 fits none so). Each stage
    count is balanced twice, by persistent + output bytes and by ``held_bytes`` (neither wins on
    every zoo model at 30% memory), and each is cut ``pipeline_rebalance`` times, the next cut
    scaling each stage's weight by its simulated peak over its planned bytes. Each cut is judged in
    topological order and, when the graph has update ops, with updates first (the order that frees
    gradients soonest)."""
    graph, cluster = search.graph, search.cluster
    if not search.config.pipeline_starts or search.n_dev < 2 or not graph.n_ops:
        return
    largest = np.argsort(-cluster.memory_bytes, kind="stable")
    balances = (("bytes", graph.persistent_bytes + graph.output_bytes), ("held bytes", held_bytes(graph)))
    topological = leader_units(graph)
    numberings = [("", search.leaders)]
    if not np.array_equal(topological.unit_of, search.leaders.unit_of):    # graphs with weights
        numberings.append((", weights first", topological))
    for numbering, units in numberings:
        for balance, op_bytes in balances:
            # every group weighs something, so a stage is never empty of work
            weight = np.maximum(np.bincount(units.unit_of, weights=op_bytes, minlength=units.n_units), 1.0)
            for stages in range(2, search.n_dev + 1):
                _pipeline_cuts(search, units, weight, np.sort(largest[:stages]),
                               f"pipeline of {stages} stages by {balance}{numbering}")


def _pipeline_cuts(search: _Search, units: Units, weight: np.ndarray, order: np.ndarray, how: str) -> None:
    """``pipeline_rebalance`` cuts of the leader units into stages on the devices ``order``, each
    re-weighting a stage by its simulated peak (updates first) over its planned bytes; then, if
    none fits, the least overflowing one has its stage boundaries shifted (``_shift_stages``)."""
    cluster = search.cluster
    least = (math.inf, None)
    for attempt in range(search.config.pipeline_rebalance):
        per_unit = pipeline_devices(units, weight, order, cluster.memory_bytes[order])
        devices = respect_colocation(search.fine, per_unit[units.unit_of])
        for name, priority in search.pipeline_orders():
            overflow, _, result = search.consider(devices, priority, f"{how} (cut {attempt + 1}, {name})")
        search.pipeline_cuts += 1
        least = min(least, (overflow, attempt, per_unit), key=lambda x: x[0])
        planned = np.bincount(per_unit, weights=weight, minlength=search.n_dev)
        ratio = np.where(planned > 0, result.peak_memory_bytes / np.maximum(planned, 1.0), 1.0)
        weight = weight * ratio[per_unit]
    if 0 < least[0] < math.inf and len(order) > 1:
        _shift_stages(search, units, np.searchsorted(order, least[2]), weight, order, how)


def _shift_stages(search: _Search, units: Units, stage: np.ndarray, weight: np.ndarray, order: np.ndarray,
                  how: str) -> None:
    """Pass a pipeline's overflow down the line: the most overflowing stage gives the units at its
    edge, about as many bytes as it is over, to its neighbour on the side with more room in all
    (its stages' spare bytes summed), never back to a state already judged, and again (up to
    ``pipeline_shifts`` simulator calls) until it fits. Re-weighting whole stages moves every
    boundary at once and can swing past (ResNet-50 at 30%: 4 stages 0.19-0.30 GiB over after 3-8
    re-weightings, with one stage over and two with room)."""
    capacity = search.memory_bytes()[order]
    stage = stage.copy()
    seen = {_boundaries(stage)}
    for shift in range(search.config.pipeline_shifts):
        devices = respect_colocation(search.fine, order[stage][units.unit_of])
        name, priority = search.pipeline_orders()[-1]
        overflow, _, result = search.consider(devices, priority, f"{how} (boundaries shifted {shift + 1}, {name})")
        if overflow == 0:
            return
        peak = result.peak_memory_bytes[order]
        room = capacity - peak
        worst = int(np.argmin(room))
        if room[worst] >= 0:
            return          # the overflow is on a device outside the pipeline
        spare = np.maximum(room, 0.0)      # towards the side with more room in all (no ping-pong)
        neighbour = worst + 1 if spare[worst + 1:].sum() > spare[:worst].sum() else worst - 1
        if not 0 <= neighbour < len(order):
            return
        mine = np.flatnonzero(stage == worst)
        if len(mine) < 2:
            return
        edge = mine[::-1] if neighbour > worst else mine      # the units next to the neighbour first
        need = -room[worst] / max(peak[worst], 1.0) * weight[mine].sum()
        count = int(np.searchsorted(np.cumsum(weight[edge]), need)) + 1
        while count < len(mine) and _boundaries(stage, edge[:count], neighbour) in seen:
            count += 1          # a state already judged: take one unit more
        if count >= len(mine):
            return
        stage[edge[:count]] = neighbour
        seen.add(_boundaries(stage))


def _boundaries(stage: np.ndarray, moved: np.ndarray | None = None, to: int = 0) -> tuple[int, ...]:
    """Units per stage, once ``moved`` go to stage ``to``: the state of a pipeline's boundaries."""
    stage = stage.copy()
    if moved is not None:
        stage[moved] = to
    return tuple(np.bincount(stage).tolist())


def _cheap_cut_starts(search: _Search, candidates: int = 2048) -> None:
    """Consecutive stages of the step, cut where the least transfer time crosses: for 2..n stages
    (on the largest devices), the cuts of least total crossing time whose stages' held bytes fit
    their devices. A step whose ops run one after another (a chain of layers) costs its compute
    plus what crosses the cuts whatever the balance, so where memory forces stages the cheapest
    cut that fits is the fastest pipeline; byte-balanced stages are cut wherever the bytes say,
    often across a costly activation (ResNet-50 at 30% memory: a 196 MiB one, 36 ms each way).

    Stages are runs of leader units (a forward op with its backward and update ops) in step order
    (each weight just before its first reader; on an inference graph a unit is one op); a unit
    holds ``held_bytes`` (persistent bytes plus the activations backward ops read). An output
    crosses every boundary between its unit and its farthest reader's, forward (activations) or
    back (gradients), at its costliest edge's mean transfer time. Only the ``candidates`` cheapest
    boundaries are tried (a dynamic program over them). A stage's plan counts, at its fullest
    (its backward, last unit to first), the held bytes of its units so far, twice the gradient
    being made and the copies received at its ends: an estimate, so the plan's capacity is
    bisected (2 x ``pipeline_rebalance`` cuts) between the device's memory and
    ``CHEAP_CUT_SLACK`` x it for the largest whose cut fits in simulation (on ResNet-50 at 30%
    the estimate overstates the peak by 0.1-0.3 GiB); if none fits, the least overflowing cut
    has its boundaries shifted (``_shift_stages``)."""
    graph, cluster, units = search.graph, search.cluster, search.leaders
    if not search.config.pipeline_starts or search.n_dev < 2 or units.n_units < 2:
        return
    n, fine = units.n_units, search.fine
    # a colocation group sits whole at its earliest member's unit (a weight's optimizer state,
    # first read by its update at the end of the step, goes with the weight)
    earliest = np.full(fine.n_units, n, np.int64)
    np.minimum.at(earliest, fine.unit_of, units.unit_of)
    position = earliest[fine.unit_of]
    edge_us = mean_edge_us(graph, cluster)
    crossing = _crossing(graph, position, edge_us, n) + _crossing(graph, n - 1 - position, edge_us, n)[::-1]
    # bytes a stage receives and holds: at its first boundary the activations a backward op reads
    # (kept until then; those only forward ops read die at once), at its last the gradients
    forward = _crossing(graph, position, np.where(read_later(graph), graph.edge_bytes, 0.0), n)
    back = _crossing(graph, n - 1 - position, graph.edge_bytes, n)[::-1]
    windows = np.array_split(np.arange(1, n), min(candidates, n - 1))
    keep = [int(w[np.argmin(crossing[w])]) for w in windows]     # the cheapest boundary of each window
    cuts = np.concatenate([[0], keep, [n]])
    unit_bytes = np.bincount(position, weights=held_bytes(graph), minlength=n)
    held = np.concatenate([[0.0], np.cumsum(unit_bytes)])[cuts]
    # a stage's backward runs its units last to first, each freeing its activations: at unit u it
    # holds the activations of its units up to u plus the gradient u makes and the one it reads
    gradient = np.zeros(n)
    backward = graph.role == Role.BACKWARD
    np.maximum.at(gradient, position[backward], 2.0 * graph.output_bytes[backward])
    top = np.concatenate([[0.0], np.maximum.reduceat(np.cumsum(unit_bytes) + gradient, cuts[:-1])])
    largest = np.argsort(-cluster.memory_bytes, kind="stable")
    for stages in range(2, search.n_dev + 1):
        device_order = np.sort(largest[:stages])
        capacity = float(search.memory_bytes()[device_order].min())
        how = f"cheapest-cut pipeline of {stages} stages"
        least, low, high, planned = None, capacity, capacity * CHEAP_CUT_SLACK, capacity
        # the cheapest cut into this many stages whose plan holds at most the bytes given, or None
        stage_path = functools.partial(_least_crossing_stages, held, top, forward[cuts], back[cuts], crossing[cuts],
                                       stages)

        def on_devices(stage: np.ndarray) -> np.ndarray:      # each unit's stage -> each op's device
            return respect_colocation(search.fine, device_order[stage][position])

        for attempt in range(search.config.pipeline_rebalance * 2):
            path = stage_path(planned)
            if path is None:        # the estimate allows no cut: plan with more bytes
                low, planned = planned, (planned + high) / 2
                continue
            stage = _stages_of(path, cuts, n)
            devices = on_devices(stage)
            for name, priority in search.pipeline_orders():
                overflow, _, _ = search.consider(devices, priority, f"{how} (cut {attempt + 1}, {name})")
            # stage counts judged for the memory, not a virtual cap (a larger memory judges as many)
            search.cheap_cuts += least is None and not search.virtual
            if least is None or overflow < least[0]:
                least = (overflow, stage)
            if overflow > 0:
                high = planned
            else:                   # it fits: a larger plan may cut where less crosses
                low = planned
            planned = (low + high) / 2
        if least is not None and least[0] > 0:
            _shift_stages(search, units, least[1], np.maximum(unit_bytes, 1.0), device_order, how)
        most_bytes = float(top.max() + forward[cuts].max() + back[cuts].max())   # no stage's plan holds more
        if not search.virtual:      # they do not depend on the memory: planned once
            _balanced_cuts(search, stage_path, most_bytes, lambda path: on_devices(_stages_of(path, cuts, n)),
                           capacity, stages)


def _stages_of(path: list[int], cuts: np.ndarray, n: int) -> np.ndarray:
    """Each of the ``n`` units' stage, for the candidate boundaries ``path`` picks from ``cuts``."""
    stage = np.zeros(n, np.int64)
    for k, (lo, hi) in enumerate(zip(path[:-1], path[1:])):
        stage[cuts[lo]:cuts[hi]] = k
    return stage


def _balanced_cuts(search: _Search, stage_path, most_bytes: float, devices_of, capacity: float, stages: int) -> None:
    """Cheapest cuts planned with bytes that do not depend on the devices' memory: the least a
    stage may hold for any cut to exist (bisected on the plan's estimate) times each of
    ``BALANCED_CUT_PLANS``, judged while that is at most ``CHEAP_CUT_SLACK`` x the memory and kept
    if they fit. A cut planned for the memory moves with it (Inception-V3 at 30% of 8 GiB cuts
    the step into a 2-stage pipeline of 264.4 ms, which anneals to 240.4; with the whole 8 GiB it
    cuts off the last units, as fast as one GPU, whose basin ended at 246.9), so these give every
    memory that fits them the same starts, and the second round starts from the fastest (there:
    240.5 with the whole 8 GiB). ``stage_path(bytes)``: the cheapest cut into ``stages`` whose plan holds
    at most ``bytes`` a stage (None if none does); ``most_bytes``: more than any stage's plan holds."""
    low, high = 0.0, most_bytes
    if stage_path(high) is None:
        return      # fewer candidate boundaries than stages
    for _ in range(BALANCED_CUT_BISECTIONS):
        middle = (low + high) / 2
        if stage_path(middle) is None:
            low = middle
        else:
            high = middle
    seen = set()
    for factor in BALANCED_CUT_PLANS:
        planned = high * factor
        if planned > capacity * CHEAP_CUT_SLACK:
            break
        path = stage_path(planned)
        if tuple(path) in seen:
            continue
        seen.add(tuple(path))
        devices = devices_of(path)
        search.balanced_cuts += 1
        for name, priority in search.pipeline_orders():
            overflow, step, _ = search.measure(devices, priority)
            if overflow == 0:
                search.offer(step, devices, priority,
                             f"{BALANCED_CUT} of {stages} stages ({factor:g} x least bytes, {name})")


def _crossing(graph, position: np.ndarray, edge_cost: np.ndarray, n_positions: int) -> np.ndarray:
    """Per boundary k (between positions k - 1 and k, of ``n_positions``): what the outputs sent
    forward across it cost (transfer time, bytes), each producer's at the costliest of its edges
    (``edge_cost``) to consumers beyond it."""
    crossing = np.zeros(n_positions + 2)
    dst_position = position[graph.edge_dst]
    for u in range(graph.n_ops):
        out = graph.succ_edge[graph.succ_ptr[u]:graph.succ_ptr[u + 1]]
        if not len(out):
            continue
        out = out[np.argsort(dst_position[out], kind="stable")]
        beyond_us = np.maximum.accumulate(edge_cost[out][::-1])[::-1]   # costliest edge from here on
        lo = position[u] + 1
        for e, us in zip(out.tolist(), beyond_us.tolist()):
            hi = dst_position[e] + 1          # boundaries lo..hi - 1 ... up to this consumer
            if hi > lo:
                crossing[lo] += us
                crossing[hi] -= us
                lo = hi
    return np.cumsum(crossing)[: n_positions + 1]


@njit(cache=True)
def _least_crossing_kernel(held, top, first_in, last_in, enter_us, stages, capacity):
    """cost[s, j]: least crossing time splitting candidates 0..j into s runs that each hold at
    most ``capacity`` bytes at their fullest (the largest ``top`` among their candidates, less the
    ``held`` bytes before them) plus the copies received at their ends (a run from i to j receives
    ``first_in[i] + last_in[j]`` and enters at i, paying ``enter_us[i]``); and the argmin i."""
    n = held.shape[0]
    cost = np.full((stages + 1, n), np.inf)
    parent = np.zeros((stages + 1, n), np.int64)
    cost[0, 0] = 0.0
    for s in range(1, stages + 1):
        for j in range(1, n):
            most = 0.0
            for i in range(j - 1, -1, -1):
                if held[j] - held[i] > capacity:
                    break
                most = max(most, top[i + 1])
                if most - held[i] + first_in[i] + last_in[j] > capacity:
                    continue
                value = cost[s - 1, i] + enter_us[i]
                if value < cost[s, j]:
                    cost[s, j], parent[s, j] = value, i
    return cost, parent


def _least_crossing_stages(held: np.ndarray, top: np.ndarray, first_in: np.ndarray, last_in: np.ndarray,
                           crossing_us: np.ndarray, stages: int, capacity: float):
    """Indices into the candidate boundaries (first 0, last the end) splitting them into ``stages``
    runs each holding at most ``capacity`` bytes (``held`` cumulative; at its fullest the largest
    ``top`` of its candidates (``top[k]``: held bytes up to a unit between candidates k - 1 and k
    plus what that unit needs) less ``held`` before it, plus ``first_in`` at its first boundary and
    ``last_in`` at its last) with the least total crossing time; None if none fits."""
    enter = crossing_us.copy()
    enter[0] = 0.0
    cost, parent = _least_crossing_kernel(held, top, first_in, last_in, enter, stages, capacity)
    n = len(held)
    if not np.isfinite(cost[stages, n - 1]):
        return None
    path, j = [n - 1], n - 1
    for s in range(stages, 0, -1):
        j = int(parent[s, j])
        path.append(j)
    return path[::-1]
