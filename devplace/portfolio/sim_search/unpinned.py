"""The unpinned capped start: below the canonical cap, the search every memory above the cap runs,
its best with each *pinning* parameter group moved off the device whose memory it pins.

A parameter's update reads forward outputs over zero-byte edges (an in-place write, ordered after
every reader of the old value). The simulator frees an output after its last reader on its own
device, so such an edge keeps the output alive until the update, near the step's end: the output is
*pinned*. A reader on another device holds nothing (a zero-byte edge sends nothing). GNMT's
classifier product (``addmm``: 586 MiB of logits over all 40 steps) is pinned by the classifier
weight's and bias's Adam updates, so the classifier with its weights peaks at 2.47 GiB, over Baechi's
30% of 8 GiB (2.4 GiB). The search at 30% keeps a layer's weights with it in its layer moves and ends
at 230.548 ms (seed 0); the capped search (2.9 GiB, what 8 GiB runs) ends at 214.551 ms with the
weights beside the classifier; moving the two groups (the 58.6 MiB weight sent once forward, its
gradient once back) to another GPU frees the 586 MiB: 218.558 ms, within 2.4 GiB (round 41).

Where it runs: graphs too large for every extra round (the one canonical cap, ``canonical.py``) at a
memory below that cap (where the search runs as before the caps), when some output of at least
``unpin_min_share`` of the smallest device's memory is pinned. It runs the capped search (the same
run, same seed, as every memory above the cap: ``canonical.capped_config``), moves each output's pinning groups
(largest output first) to the device where the step is fastest, least over memory first (judged in
the placement's own order and the search's orders), and offers the result as a start. Above the cap
``_canonical_place`` judges the same unpinned placement against its memory, so what this start gives
a memory below the cap is offered to every memory above it (more memory never slower by this start).
Cost: one search more (GNMT at 30%: the capped search's evals, about 13,500).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from devplace.graph import Role
from devplace.portfolio.sim_search.canonical import capped_config

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search


def pinning_groups(graph, min_bytes: float) -> list[tuple[int, np.ndarray]]:
    """Per output of at least ``min_bytes`` pinned by parameter updates, largest first: (the op, the
    ops of the parameter groups whose updates pin it)."""
    src, dst = graph.edge_src, graph.edge_dst
    pin = ((graph.edge_bytes == 0) & (graph.role[dst] == Role.UPDATE) & (graph.colocation[dst] >= 0)
           & (graph.output_bytes[src] >= min_bytes))
    outputs = np.unique(src[pin])
    outputs = outputs[np.argsort(-graph.output_bytes[outputs], kind="stable")]
    return [(int(u), np.flatnonzero(np.isin(graph.colocation, graph.colocation[dst[pin & (src == u)]])))
            for u in outputs]


def unpinned(search: _Search, devices: np.ndarray, priority: np.ndarray | None, sets: list):
    """``devices`` with each pinning group set (``_gated_sets``) moved off its output's device, to the
    device with the least overflow of ``search``'s memory, then the fastest step; as
    ``search.measure``: (overflow bytes, step us, devices, priority), or None with nothing pinned."""
    best = None
    for output, ops in sets:
        base, base_priority = (devices, priority) if best is None else best[2:]
        candidates = []
        for device in range(search.n_dev):
            if device == base[output]:
                continue
            moved = base.copy()
            moved[ops] = device
            for order in [base_priority] + [p for _, p in search.orders(moved)]:
                overflow, step_us, _ = search.measure(moved, order)
                candidates.append((overflow, step_us, moved, order))
        if candidates:
            best = min(candidates, key=lambda c: (c[0], c[1]))
    return best


def _gated_sets(search: _Search) -> list:
    """The pinning group sets where the start applies, else []: the start on, a graph too large for
    every extra round (the one canonical cap), two devices or more (module docstring)."""
    config, graph = search.config, search.graph
    if not (config.unpinned_start and config.large_graph_canonical_cap > 0 and search.n_dev >= 2
            and not config.gets_every_extra_round(graph.n_ops) and graph.n_ops >= config.canonical_cap_min_ops):
        return []
    return pinning_groups(graph, config.unpin_min_share * float(search.cluster.memory_bytes.min()))


def _unpinned_capped_start(search: _Search) -> None:
    """The start (module docstring): offered if it fits, else kept for the repair."""
    from devplace.portfolio.sim_search import place     # the capped search, as ``_canonical_place`` runs it

    sets = _gated_sets(search)
    if not sets or search.out_of_time():
        return
    config, graph, cluster = search.config, search.graph, search.cluster
    cap_bytes = config.large_graph_canonical_cap * search.one_device_peak_bytes()
    if (cluster.memory_bytes >= cap_bytes).all():
        return      # the canonical path runs there (place() never gets here)
    budget_s = config.time_budget_s
    left_s = None if budget_s is None else max(budget_s - (time.perf_counter() - search.began), 0.0)
    capped = place(graph, cluster.with_memory_bytes(np.full(search.n_dev, cap_bytes)), seed=search.seed,
                   options=capped_config(config, left_s))
    search.evals += capped.options["evals"]
    found = unpinned(search, capped.devices, capped.priority, sets)
    if found is not None:
        search.consider(found[2], found[3], f"unpinned capped search ({capped.options['step_us'] / 1e3:.3f} ms "
                                            f"under {cap_bytes / 2**30:.3g} GiB)")


def _unpinned_if_faster(search: _Search, devices: np.ndarray, priority: np.ndarray | None, options: dict):
    """Above the cap (``_canonical_place``, ``search`` on the real memory): the capped best unpinned where
    the start runs below the cap, taken if it fits and is faster (``options`` updated); (devices, priority)."""
    found = unpinned(search, devices, priority, _gated_sets(search))
    if found is None or found[0] > 0 or found[1] >= options["step_us"]:
        return devices, priority
    options.update(step_us=found[1], found_by=f"{options['found_by']}, unpinned")
    return found[2], found[3]
