"""The looser-memory track: the search at ``loose_memory_factor`` x the memory, its best repaired into
this memory and annealed; and its mirror, this memory's best repaired into 1 / factor of it, so that
a memory offers whatever its fraction's track offers (more memory never slower by the track).

Where memory is tight, the annealing stays in the basins its first fitting starts lie in: a move
through a placement over memory is refused. With more memory the search walks elsewhere, and its best
is often a few repair moves from fitting (Transformer, zoo, 30% of 8 GiB, seed 0: the search at 60%
ends at 412.3 ms, 0.09 GiB over 30%; the search at 30% at 419.0 ms, 11.1% above its bound).

Both directions go through one *repaired track* (``_repaired_track``): a search object of its own on
the smaller memory, seeded by the placer's seed, measures the placement given, repairs it (the
fastest of ``loose_memory_repair_candidates`` proposals a step) and anneals ``loose_memory_rounds``
rounds from it until it is within ``target_gap`` of that memory's bound. It reads nothing but its
arguments, so the same placement and memory give the same result in any search. It runs only where
that placement is already within ``target_gap`` of the smaller memory's bound (the repair and the
rounds move a best by 0.2-1%: a best further off cannot close the gap there), and it offers its best
to the search, which checks it against its own memory.

- **Up** (the looser-memory track proper): while the gap is above ``target_gap`` but at most
  ``loose_memory_max_gap`` (a search more pays only where a few % close the gap: the looser searches
  end 1.6-7% below the tight ones on the zoo), the whole search (this one without the track) runs on
  the cluster with every device's memory x ``loose_memory_factor``, and its best goes through the
  repaired track into this memory.
- **Down** (the mirror): this search's best goes through the repaired track into the memory / factor,
  whatever the gap.

The up direction runs only where the memory itself is *eligible*: a graph small enough for every
extra round, two devices or more, the one-device peak above some device's memory x factor, and no
canonical caps there (``canonical.py``); the down direction only where the memory / factor is
eligible, whatever its gap. Then, for a cluster C and the same cluster with each device's memory x
factor (exact in floating point for factor 2), the up direction at C starts from the larger
cluster's search without the track, which is the larger search's best when its down direction
begins; the two repaired tracks are the same run, so the larger memory's result is no slower than
anything C's track offers. Not covered: the larger memory against C's search without the track
(measured, as before the track).

Cost: the up direction is a search more (Transformer at 30%: 1.76x the evals); the down direction a
repair (a few hundred evals) and up to ``loose_memory_rounds`` rounds where its gate passes, else
a bound (no evals).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from devplace.portfolio.sim_search.anneal import _lower_bound_us, _track_rounds
from devplace.portfolio.sim_search.canonical import canonical_caps_bytes
from devplace.portfolio.sim_search.config import GIB, log
from devplace.portfolio.sim_search.repair import _repair

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search


def _loose_memory_rounds(search: _Search, bound_us: float | None) -> None:
    """Both directions (module docstring); what they did goes to ``loose_memory_report``."""
    config, graph, cluster = search.config, search.graph, search.cluster
    factor = config.loose_memory_factor
    if (factor <= 1.0 or config.loose_memory_rounds < 1 or search.n_dev < 2 or bound_us is None
            or search.memory_is_ample or not config.affords_more_searches(graph.n_ops)):
        return      # (ample memory holds the one-device peak: neither direction would run)
    memory = cluster.memory_bytes
    start = search.best
    smaller = cluster.with_memory_bytes(memory / factor)
    smaller_bound_us = _lower_bound_us(graph, smaller)
    down_gate = smaller_bound_us is not None and start[0] <= smaller_bound_us * (1.0 + config.target_gap)
    up_gate = bound_us * (1.0 + config.target_gap) < start[0] <= bound_us * (1.0 + config.loose_memory_max_gap)
    if not (down_gate or up_gate):
        return      # neither direction can close a gap: no simulation spent
    one_device_peak = search.one_device_peak_bytes()
    report = search.loose_memory_report
    report.update(before_us=start[0])
    if down_gate and _tight_at_factor(graph, smaller, config, one_device_peak):
        report["down"] = {"memory_gib": [float(m) / GIB for m in smaller.memory_bytes]}
        _offer(search, _repaired_track(graph, smaller, search.seed, config, smaller_bound_us, start,
                                       report["down"]), report["down"], "down")
    if up_gate and search.best.step_us > bound_us * (1.0 + config.target_gap) \
            and _tight_at_factor(graph, cluster, config, one_device_peak):
        from devplace.portfolio.sim_search import place

        looser = cluster.with_memory_bytes(memory * factor)
        report["up"] = up = {"memory_gib": [float(m) / GIB for m in looser.memory_bytes]}
        # no order descent inside: the up track must start from the larger memory's best as it is when
        # that search's down direction begins, which is before its order descent (the guarantee above)
        loose = place(graph, looser, seed=search.seed,
                      options=dataclasses.replace(config, loose_memory_factor=1.0, order_descent_evals=0))
        search.evals += loose.options["evals"]
        up.update(loose_us=loose.options["step_us"], loose_evals=loose.options["evals"])
        if loose.options["step_us"] <= bound_us * (1.0 + config.target_gap):
            begun = (loose.options["step_us"], loose.devices, loose.priority, loose.options["found_by"])
            _offer(search, _repaired_track(graph, cluster, search.seed, config, bound_us, begun, up), up, "up")
    log.info("looser-memory track: %s", report)


def _tight_at_factor(graph, cluster, config, one_device_peak: float) -> bool:
    """Whether ``cluster`` is eligible for the up direction (module docstring): the one-device peak
    above some device's memory x factor, and no canonical caps there (the caller checked the rest)."""
    looser = cluster.with_memory_bytes(cluster.memory_bytes * config.loose_memory_factor)
    return one_device_peak > looser.memory_bytes.min() and not canonical_caps_bytes(graph, looser, config,
                                                                                     one_device_peak)


def _repaired_track(graph, cluster, seed: int, config, bound_us: float, start: tuple, report: dict):
    """``start`` (as ``search.best``) measured on ``cluster``, repaired if over memory and annealed
    until within ``target_gap`` of ``bound_us``, by a search of its own seeded by ``seed``: its best
    (as ``search.best``) or None; its evals go to ``report``. Reads nothing but its arguments."""
    from devplace.portfolio.sim_search.search import _Search

    track = _Search(graph, cluster, config, seed)
    if config.closed_gap > 0:
        track.closed_us = bound_us * (1.0 + config.closed_gap)
    step_us, devices, priority, _ = start
    how = "the best with more memory"       # the same in both directions: the same run
    overflow, start_us, _ = track.measure(devices, priority)
    report.update(from_us=step_us, over_gib=overflow / GIB)
    if overflow > 0:
        report["repair"] = {}
        home = _repair(track, [(overflow, start_us, devices, priority, how)], report["repair"],
                       config.loose_memory_repair_candidates)
    else:
        home = (start_us, devices, priority, how)
        track.offer(*home)
    if home is not None and home[0] > step_us * (1.0 + config.loose_memory_start_behind):
        report["start_behind_us"] = home[0]     # the repair undid what the placement had
        home = None
    rounds, best_us = (0, None) if home is None else _track_rounds(
        track, home, "looser-memory best", config.loose_memory_rounds, 0.0,
        until_us=bound_us * (1.0 + config.target_gap))
    report.update(start_us=None if home is None else home[0], rounds=rounds, best_us=best_us, evals=track.evals)
    return None if home is None or not math.isfinite(track.best.step_us) else track.best


def _offer(search: _Search, found: tuple | None, report: dict, direction: str) -> None:
    """The repaired track's evals counted, its best checked against this search's memory (an eval) and offered."""
    search.evals += report["evals"]
    if found is None:
        return
    _, devices, priority, how = found
    overflow, step_us, _ = search.measure(devices, priority)
    if overflow == 0:
        search.offer(step_us, devices, priority, f"looser-memory track ({direction}): {how}")
