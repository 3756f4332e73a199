"""The seeds: the cheap baselines run first, each in several schedule orders."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from devplace.errors import DevplaceError
from devplace.portfolio.sim_search.config import NAME, SearchConfig
from devplace.portfolio.variants import place as place_spec

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search

# Seeds run on the full graph at any size: they place in milliseconds (the user-style splits in
# 0.01-0.09 s on 20k ops), and the expert's and the users' splits are the baselines a user compares
# against (GNMT len 40: the expert's 376 ms is below every other seed).
ALWAYS_RAW = ("single", "expert", "accelerate-auto", "pipeline-partition", "fx-size-partition")


def _seed_specs(config: SearchConfig, n_ops: int) -> list[str]:
    specs = []
    for spec in config.seeds:
        name, *variants = spec.split("+")
        if name == NAME:
            continue
        if variants == ["fwd"] and n_ops > 4 * config.max_ops_raw:
            continue
        if not variants and n_ops > config.max_ops_raw and name not in ALWAYS_RAW:
            continue
        if not variants and name == "m-sct" and n_ops > config.max_ops_costly:
            continue
        specs.append(spec)
    return specs


def _run_seeds(search: _Search) -> None:
    specs = _seed_specs(search.config, search.graph.n_ops)
    search.reporter.begin(f"{NAME}: seeds", total=len(specs))
    try:
        for done, spec in enumerate(specs):
            search.report(done)
            search.seed_report[spec] = _run_seed(search, spec)
        search.report(len(specs))
    finally:
        search.reporter.end()


def _run_seed(search: _Search, spec: str) -> float | str:
    """Place with ``spec`` and offer it with each schedule order (or keep it for the repair);
    returns its best step time that fits, or why it has none."""
    graph = search.graph
    if search.out_of_time() and search.best.devices is not None:
        return "skipped: out of time"
    try:
        placement = place_spec(graph, search.cluster, algo=spec, seed=search.seed, check=False)
    except DevplaceError as exc:
        return f"failed: {type(exc).__name__}"
    devices = placement.devices
    if placement.colocation_violations(graph):
        return "failed: split a colocation group"
    tried = [("its own", placement.priority)] if placement.priority is not None else []
    best_here = math.inf
    for order, priority in tried + search.orders(devices):
        how = f"seed {spec} ({order} order)"
        if search.memory_is_ample:
            step = search.step_us(devices, priority)
            if step < best_here:
                best_here = step
                search.offer(step, devices, priority, how)
        else:
            overflow, step, _ = search.consider(devices, priority, how)
            if overflow == 0:
                best_here = min(best_here, step)
    return best_here if math.isfinite(best_here) else "failed: over memory"
