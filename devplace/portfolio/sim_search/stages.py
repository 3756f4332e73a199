"""A start for steps whose saved activations need every device: the step cut into stages where
little crosses, one device holding two stages that are not neighbours (a folded pipeline).

A convolutional net saves most of its activation bytes in its first layers (ResNet-50 at batch
64: the stem 0.75 GiB, the 56x56 layers 2.78 GiB of the step's 8.06) and few in its last (the 7x7
layers: 0.36 GiB). On four GPUs of 2.4 GiB every GPU must hold a stage, and a pipeline of
consecutive stages must then cut inside the 56x56 layers twice, where the residual tensor is 196
MiB (36 ms each way at 5.70 GB/s). Putting the stem on the GPU of the last, light stage needs one
such cut and a cheap one near the stem's max pool (49 MiB tensors) instead. sim-search's other starts are
consecutive stages, and its moves take a unit or a run of units, so none reaches this layout.

Plans (``stage_plans``): the boundaries between the leader units in step order (a forward op
with its backward and update ops, as the cheapest-cut starts), each costing the transfer time of
what crosses it both ways (``starts.step_cuts``), thinned to the cheapest boundary of each of
``stage_candidates`` windows of equal held bytes. A plan picks n - 1 or n of them (n devices) and
a device per stage, neighbours on different devices and every device used (``device_patterns``).
A device is at its fullest during one of its stages' backward: the held bytes (persistent bytes
and saved activations) of its earlier stages, of that stage's units up to the one running and
twice the largest gradient that unit makes (``starts.step_cuts``). Plans whose devices need at
most their memory are taken cheapest first (then the one whose fullest device is least full),
and the first ``stage_plans`` are simulated in the search's orders. From the fastest that fits,
annealing rounds run as for the coarse MIP start (``anneal._track_rounds``).

On ResNet-50 at 30% memory, counting saved activations alone, four consecutive stages could cut
the 56x56 layers once (145.7 ms of crossing, but two GPUs end 0.17-0.21 GiB over: gradients and
received copies). With the backward's gradients in the estimate the cheapest consecutive plan
cuts them twice (208.9 ms, and is still 0.17-0.19 GiB over in simulation); the folded plans cut
them once (155.0-178.1 ms). The fastest folded plan that fits simulates at 542.8 ms, and the
track ends at 528.1 ms against 531.2 without it at seed 0 (16 rounds, 1.5x the evaluations;
``benchmarks/folded_stages.py``); at seeds 1 and 2 it ends 0.9% and 0.6% behind the best found
before it, and with 4 rounds at seed 0 too. So it is opt-in (``stage_plans``, 0 by default; 24
gives these figures).

When asked, the track runs after the branch track, where memory is tight, the gap still wide and
the step's held bytes exceed what all devices but one hold (so every device must hold saved
activations; of the zoo at 30% memory only ResNet-50: 8.06 GiB against 3 x 2.4; the Transformer
5.73, Inception-V3 4.32). It only offers placements faster than the best, so it never makes the
result slower.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import numpy as np

from devplace.placers._moves import respect_colocation
from devplace.portfolio.sim_search.anneal import _track_rounds
from devplace.portfolio.sim_search.config import GIB, log
from devplace.portfolio.sim_search.grad_blocks import _track_may_run
from devplace.portfolio.sim_search.starts import step_cuts

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search

HOW = "folded stage start"


def device_patterns(memory_bytes: np.ndarray, stages: int) -> list[tuple[int, ...]]:
    """Each stage's device, for ``stages`` = n (one stage a device) or n + 1 (one device holds two
    stages that are not neighbours), n devices: devices take stages in order of their memory,
    largest first, the repeated one on a stage of its own choosing; so the plans stay few on any
    cluster (n (n - 1) / 2 patterns of n + 1 stages), and devices of equal memory need no other order."""
    n_dev = len(memory_bytes)
    by_memory = [int(d) for d in np.argsort(-np.asarray(memory_bytes), kind="stable")]
    if stages == n_dev:
        return [tuple(by_memory)]
    if stages != n_dev + 1:
        raise ValueError(f"plans have {n_dev} or {n_dev + 1} stages on {n_dev} devices, not {stages}")
    patterns = []
    for again in range(2, stages):          # the stage that goes back to an earlier stage's device
        rest = by_memory[:again] + [None] + by_memory[again:]
        for earlier in range(again - 1):    # not its neighbour
            pattern = list(rest)
            pattern[again] = by_memory[earlier]
            patterns.append(tuple(pattern))
    return patterns


def stage_plans(held_bytes: np.ndarray, gradient_bytes: np.ndarray, crossing_us: np.ndarray,
                memory_bytes: np.ndarray, candidates: int, max_combinations: int = 4_000_000) -> list[tuple]:
    """Plans for the units in step order (per unit: ``held_bytes``, ``gradient_bytes`` the gradient bytes
    its backward holds at once; per boundary k between units k - 1 and k: ``crossing_us``), as (crossing us, fullest
    device's need / its memory, boundaries, device per stage), cheapest first; only plans whose
    every device needs at most its memory (module docstring). Fewer candidate boundaries are kept
    while the plans to weigh would pass ``max_combinations``."""
    n, n_dev = len(held_bytes), len(memory_bytes)
    if n < n_dev or n_dev < 2:
        return []
    held = np.concatenate([[0.0], np.cumsum(held_bytes)])
    plans = []
    for stages in (n_dev, n_dev + 1):
        patterns = device_patterns(memory_bytes, stages)
        count = candidates
        while count > stages - 1 and math.comb(count, stages - 1) * len(patterns) > max_combinations:
            count -= 1
        cuts = _candidate_boundaries(held, crossing_us, count)
        if len(cuts) < stages - 1:
            continue
        # per pair of boundaries (0, the candidates, n): the most a stage between them holds at once
        # past what the units before it hold (its backward runs its units last to first, each
        # freeing its activations: at unit u, the held bytes up to u and u's gradients)
        ends = np.array([0] + cuts + [n])
        fullest_at = np.maximum.reduceat(held[1:] + gradient_bytes, ends[:-1])
        top = np.zeros((len(ends), len(ends)))
        for a in range(len(ends) - 1):
            top[a, a + 1:] = np.maximum.accumulate(fullest_at[a:]) - held[ends[a]]
        picked = np.array(list(itertools.combinations(range(1, len(ends) - 1), stages - 1)), dtype=np.int64)
        picked = np.concatenate([np.zeros((len(picked), 1), np.int64), picked,
                                 np.full((len(picked), 1), len(ends) - 1)], axis=1)
        chosen = ends[picked[:, 1:-1]]
        stage_held = held[ends[picked[:, 1:]]] - held[ends[picked[:, :-1]]]
        stage_top = top[picked[:, :-1], picked[:, 1:]]
        cost = crossing_us[chosen].sum(axis=1)
        for pattern in patterns:
            # a device at its fullest: during one of its stages' backward, with its earlier stages
            # whole (the backward reaches them later) and its later ones freed
            before = np.zeros((len(chosen), n_dev))
            need = np.zeros((len(chosen), n_dev))
            for stage, device in enumerate(pattern):
                need[:, device] = np.maximum(need[:, device], before[:, device] + stage_top[:, stage])
                before[:, device] += stage_held[:, stage]
            fullest = (need / memory_bytes).max(axis=1)
            for k in np.flatnonzero(fullest <= 1.0):
                plans.append((float(cost[k]), float(fullest[k]), tuple(chosen[k].tolist()), pattern))
    plans.sort(key=lambda plan: (round(plan[0], 3), plan[1], plan[2], plan[3]))
    return plans


def _candidate_boundaries(held: np.ndarray, crossing_us: np.ndarray, count: int) -> list[int]:
    """The cheapest boundary (1..n-1) of each of ``count`` windows of equal held bytes."""
    n = len(held) - 1
    if n < 2 or count < 1:
        return []
    inner = np.arange(1, n)
    window = np.minimum((held[inner] / max(held[-1], 1.0) * count).astype(np.int64), count - 1)
    cuts = []
    for w in np.unique(window):
        mine = inner[window == w]
        cuts.append(int(mine[np.argmin(crossing_us[mine])]))
    return cuts


def _stage_rounds(search: _Search, bound_us: float | None) -> None:
    """The track (module docstring); what it did goes to ``search.stage_report``."""
    config = search.config
    if search.memory_is_ample or not _track_may_run(search, bound_us, config.stage_plans):
        return
    memory = search.memory_bytes()
    position, crossing, unit_bytes, gradient = step_cuts(search)
    report = search.stage_report
    report.update(held_gib=round(float(unit_bytes.sum()) / GIB, 4))
    if unit_bytes.sum() <= memory.sum() - memory.max():
        return          # the saved activations leave a device free: consecutive stages do
    plans = stage_plans(unit_bytes, gradient, crossing, memory, config.stage_candidates)
    report.update(before_us=search.best[0], plans=len(plans))
    best = None
    for _, _, cuts, pattern in plans[:config.stage_plans]:
        stage = np.searchsorted(np.asarray(cuts), np.arange(len(unit_bytes)), side="right")
        devices = respect_colocation(search.fine, np.asarray(pattern)[stage][position])
        for name, priority in search.orders(devices):
            overflow, step, _ = search.measure(devices, priority)
            how = f"{HOW} (cuts {list(cuts)} on devices {list(pattern)}, {name})"
            if overflow == 0 and (best is None or step < best[0]):
                best = (step, devices.copy(), priority, how)
    if best is None:
        log.info("stage track: %s", report)
        return
    report.update(start_us=best[0], start=best[3])
    search.offer(*best)
    rounds, best_us = _track_rounds(search, best, "folded stages", config.stage_rounds, config.grad_block_behind)
    report.update(rounds=rounds, best_us=best_us)
    log.info("stage track: %s", report)
