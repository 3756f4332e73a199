"""The last phase: a descent over the schedule order of the best placement, its devices fixed.

Why: the annealing judges a placement in a handful of whole orders (``search.orders``), and keeps the
one it last adopted while it moves ops. The channels of the simulator book a transfer first-come
first-served when its producer finishes (``devplace.sim.engine``), so which transfer holds a channel
first is decided by the order ops run in, one op at a time, which no whole order is built for.
RNNLM at 30% memory, main's best at seed 0 (77.766 ms): no whole order beats the one it carries
(topological 93.770, upward rank 79.772; round 40), but moving single ops in its order does: 77.540 ms
in 2,000 evals (1,000: none yet; 4,000: no more), the path's channel queueing 3.537 -> 2.814 ms.
Where the search runs once per canonical cap, each capped search ends with its own descent.

A move takes an op of the best's critical path (or, one move in two, any op) and puts it just before
or after another op of its device in the order; it is kept if the step is not slower and fits. Its
random stream is its own (from the seed), so no phase before it changes. It only offers, so for the
same seed no result is slower than without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from devplace.portfolio.sim_search.search import _Search

HOW = "order descent"
STREAM = 40     # the descent's random stream: np.random.default_rng((seed, STREAM))


def positions(priority: np.ndarray | None, topo_rank: np.ndarray) -> np.ndarray:
    """Each op's place in the order ``priority`` gives (None: topological), as floats, so that a move
    can put an op between two others with a half step."""
    keys = topo_rank if priority is None else priority
    return np.lexsort((np.arange(len(keys)), keys)).argsort().astype(float)


def _order_descent(search: _Search, bound_us: float | None) -> None:
    """The descent (module docstring); what it did goes to ``search.order_descent_report``."""
    evals = search.config.order_descent_evals
    if not search.late_phase_may_run(bound_us, evals):
        return
    began, before_us = search.evals, search.best.step_us
    step_us, devices, priority, _ = search.best
    order = positions(priority, search.graph.topo_rank)
    rng = np.random.default_rng((search.seed, STREAM))
    path = search.examine(devices, order)[1].critical_path
    kept = 0
    while search.evals - began < evals and not search.out_of_time() and step_us > search.closed_us:
        v = int(rng.choice(path)) if rng.random() < 0.5 else int(rng.integers(search.graph.n_ops))
        w = int(rng.choice(np.flatnonzero(devices == devices[v])))
        trial = order.copy()
        trial[v] = order[w] + (0.5 if rng.random() < 0.5 else -0.5)
        trial_us = search.step_us(devices, trial)
        if trial_us > step_us:
            continue
        fits, result = search.examine(devices, trial)
        if not fits:
            continue
        order, step_us = positions(trial, search.graph.topo_rank), trial_us
        path = result.critical_path
        kept += 1
        search.offer(step_us, devices, order, HOW)
    search.order_descent_report.update(evals=search.evals - began, kept=kept, before_us=before_us,
                                       after_us=search.best.step_us)
