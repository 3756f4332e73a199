"""The looser-memory track: the search run again with more memory than the devices have, its best
repaired into the real memory, then annealed from there.

Where memory is tight, the annealing at the real memory stays in the basins its first fitting
starts lie in: a move that would pass through a placement over memory is refused. With more memory
the search walks elsewhere, and its best is often a few repair moves from fitting (Transformer,
zoo, 30% of 8 GiB, seed 0: the best at 60% memory, 412.3 ms, repaired into 30% by the fastest of
24 proposals a step fits at 413.2 ms, and one round from there gives 411.3 ms, against 419.0 ms
from the search at 30%). So, last, while the gap is above ``target_gap`` and the one-device peak
does not fit some device, the search's rounds run on the cluster with each device's memory raised
to ``loose_memory_factor`` x its own (capped by the one-device peak: above it memory changes
nothing; its own tracks are left out, since they run only where its gap stays wide), its best is
repaired into the real memory (``repair._repair`` with ``loose_memory_repair_candidates``
proposals a step) and annealed as a track (``anneal._track_rounds``) while the gap stays wide,
unless the repair left it more than ``loose_memory_start_behind`` behind the best (ResNet-50 at
30%: 429.1 ms with twice the memory, 652-1,210 ms repaired). It comes after every other round and
keeps the best, so it can only make the result faster at the same seed. Neither the canonical
caps' searches nor the coarse MIP's search of the pieces run it (each would be a search more).

It is opt-in (``loose_memory_factor`` 1.0 by default): it costs the inner search's evals, about as
many as the search itself (factor 2, 30%, seed 0: Transformer 419.0 -> 411.3 ms at 1.81x the
evals, GNMT 233.5 -> 225.7 ms at 2.7x; Inception-V3 and ResNet-50 gain nothing), and at other
seeds the Transformer's inner search ends at 416.2-416.8 ms, so the floor there is luck.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from devplace.portfolio.sim_search.anneal import _track_rounds
from devplace.portfolio.sim_search.config import GIB, log
from devplace.portfolio.sim_search.repair import _repair

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search


def _loose_memory_rounds(search: _Search, bound_us: float | None) -> None:
    """The looser-memory track (module docstring); what it did goes to ``loose_memory_report``."""
    from devplace.portfolio.sim_search import place

    config, graph = search.config, search.graph
    if (config.loose_memory_factor <= 1.0 or config.loose_memory_rounds < 1 or search.n_dev < 2
            or bound_us is None or search.memory_is_ample or search.best[0] <= bound_us * (1.0 + config.target_gap)):
        return
    one_device_peak = search.one_device_peak_bytes()
    memory = search.cluster.memory_bytes
    if one_device_peak <= memory.min():
        return      # memory is not tight: one device holds the whole step
    looser = np.maximum(memory, np.minimum(config.loose_memory_factor * memory, one_device_peak))
    report = search.loose_memory_report
    report.update(before_us=search.best[0], memory_gib=[float(m) / GIB for m in looser])
    # the inner search's rounds only: its own tracks (virtual caps, coarse MIP, gradient blocks, branches) run
    # only while its gap stays wide, where the track has not paid (ResNet-50, Inception-V3 at 30%)
    inner = dataclasses.replace(config, loose_memory_rounds=0, canonical_caps=(), virtual_caps=(),
                                coarse_mip_groups=0, grad_block_evals=0, branch_evals=0)
    loose = place(graph, search.cluster.with_memory_bytes(looser), seed=search.seed, options=inner)
    search.evals += loose.options["evals"]
    report.update(loose_us=loose.options["step_us"], loose_evals=loose.options["evals"])
    overflow, step_us, _ = search.measure(loose.devices, loose.priority)
    start = (overflow, step_us, loose.devices, loose.priority, "the looser-memory search's best")
    if overflow > 0:
        report["repair"] = {}
        home = _repair(search, [start], report["repair"], config.loose_memory_repair_candidates)
    else:
        search.offer(step_us, loose.devices, loose.priority, start[4])
        home = (step_us, loose.devices, loose.priority, start[4])
    if home is not None and home[0] > search.best[0] * (1.0 + config.loose_memory_start_behind):
        report["start_behind_us"] = home[0]     # the repair undid what the looser memory found
        home = None
    rounds, best_us = (0, None) if home is None else _track_rounds(
        search, home, "looser-memory best", config.loose_memory_rounds, 0.0,
        until_us=bound_us * (1.0 + config.target_gap))
    report.update(start_us=None if home is None else home[0], rounds=rounds, best_us=best_us)
    log.info("looser-memory track: %s", report)
