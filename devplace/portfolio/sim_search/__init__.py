"""devplace's own placer: start from the best of the baselines, then let the simulator guide a local search.

Every list scheduler decides once per op from an estimate; the simulator knows the real step time.
So this placer

1. runs the cheap baselines as *seeds* (one device, m-ETF, HEFT, m-SCT, METIS, m-TOPO, the
   expert rules, the splits users make today (Accelerate, DeepSpeed pipeline, torch.fx size), each
   list scheduler also with Baechi's co-placement + fusion; the costly ones only while the graph is
   small) and keeps the fastest that fits in memory, each tried with its own schedule
   order, the topological order, the upward-rank order and updates first; then *pipeline starts*,
   whatever the memory: forward stages balanced by bytes (weights with the layer that first reads
   them), and the step cut into 2..n stages (each layer with its backward ops) where the least
   transfer time crosses, each stage's estimated peak within its device, and also within a few
   multiples of the least any cut allows (the same cuts whatever the memory);
2. improves it by simulated annealing over *units* that move whole: colocation groups (or lone
   ops) and Baechi's co-placement groups (``devplace.transforms``), so no move can split a
   colocation group. Moves: put a unit on another device; swap two units; put a contiguous run of
   units (a layer) on one device; pull a unit to the device of the op it waits for on the critical
   path (kills a transfer); move a unit off the busiest device; when the step order interleaves
   the layers (a recurrent net), put a whole layer (a module over all its time steps, with its
   backward and update ops) on another device. Half of the picks come from the critical path of
   the current schedule. After it, where layers interleave, a *layer search* lays the starts out
   layer by layer and moves several whole layers at a time at random, keeping what is faster, and
   a *layer descent* from its best, the best start and the expert's placement takes the fastest
   whole-layer move each step until none is faster;
3. every so often re-orders the schedule (upward rank of the current placement, topological, or
   topological with updates first).
4. then, on graphs of a thousand ops or more while the gap is still wide, solves exact's
   mixed-integer program on the step coarsened to ``coarse_mip_groups`` layer groups and anneals
   ``coarse_mip_rounds`` rounds from its placement (``coarse_mip.py``): a start no local move
   reaches (ResNet-50 at 30% memory: 568.9 -> 541.5 ms);
5. then, where weights whose gradients are summed over time steps hold a large share of the step
   (a recurrent net), descends over maps of *gradient blocks* (each such weight with its gradient
   chain, apart from its layer) and anneals from the fastest (``grad_blocks.py``; RNNLM at 30%
   memory: 81.5 -> 79.6 ms);
6. then, where that track ran and a block's weight is recurrent (read once per time step inside
   the recurrence), descends over maps of finer *pieces* (each weight's gradient chain apart from
   the weight and its update, an input weight's readers apart from their layer) and anneals from
   the fastest (``recurrence.py``; RNNLM at 30% memory: 79.6 -> 77.8 ms);
7. then, where many-branch cells (an Inception or NASNet cell) hold a large share of the step,
   descends over maps of *branches* (a branch's forward ops with their backward ops and
   weights, apart from its layer) from the best and anneals from its end (``branches.py``; 30%
   memory, seed 0: NASNet 120.5 -> 114.5 ms, Inception-V3 235.0 -> 233.5 ms);
8. then, where memory is tight (``loose_memory.py``), the looser-memory track: while the gap is a
   little above the target, the search runs with twice the memory, and its best, where it is
   within the target of this memory's bound, is repaired into this memory and annealed; and this
   search's best goes the same way into half the memory, so every memory offers what half of it
   gets from the track (30% memory, seed 0: Transformer 419.0 -> 413.2 ms at 1.76x the
   evaluations);
9. last, while the gap is wide, the order descent: single ops moved in the best's schedule order,
   its devices fixed (``order_descent.py``; RNNLM at 30% memory, main's best at seed 0: 77.77 -> 77.54 ms).

A candidate is judged by ``Simulator.step_time_us`` and, before it is accepted, by the simulator's
peak memory against each device's capacity (skipped when even the worst case fits every device).
The best placement seen is returned, so the result is never slower than the best seed: never worse
than the best single device nor than any seed placer, by construction.

With ``robust_samples`` = N > 0 a candidate is scored by its mean step time over N perturbed cost
models (``devplace.robust``, drawn from the placer's seed: same seed, same models; never the models
``compare --robust`` judges it on) instead of the nominal one, so the search prefers placements that stay fast when the op and link estimates are
off; each eval then simulates N times, so the search is about N times slower. Memory is judged
on the nominal model (no perturbation changes a byte); ``options['step_us']`` is the mean.

Stopping: the budget adapts to how far the best can still be from optimal, judged against the
certified lower bound of ``devplace.bounds`` (``options['lower_bound_us']``, ``options['gap']`` =
best / bound - 1). The annealing runs in rounds of ``max_evals`` simulator calls at the starting
temperature: the first, third, ... from the best so far (the first ``first_start_rounds`` of them from the
best start, each on its own stretch of the random stream), the second from the fastest balanced
cheapest-cut start (planned with bytes that do not depend on the memory, so every memory that
fits it anneals it: which basin gets annealed then depends less on which starts the memory
excludes), unless the first began there, and the fourth, sixth, ... (and else the second) from the
fastest start (seed or pipeline) not yet tried whose placement differs from the best, so a wide gap also
buys exploring other basins; after a round it goes on only while the gap is above ``target_gap`` and
fewer than ``max_rounds`` rounds ran (up to ``small_graph_round_factor`` times as many while the
simulator calls times the ops stay under ``small_graph_op_evals``: on graphs of up to a few thousand
ops a round costs seconds), and it stops at once when the best comes within ``closed_gap`` of the
bound (nothing much faster can exist). When those rounds are done on a graph that affords whole
searches more (``small_graph_op_evals``) and the gap is still wide, one more round runs under each
*virtual memory cap* (``virtual_caps`` x the one-device peak) below the devices' memory: from the
best if it fits the cap, else from a cheapest cut planned for the cap, every candidate judged against the cap. What fits a lower cap
fits the devices, so these rounds need no check after; the cap turns the annealing away from
moves ample memory allows, and coming after the rounds they cannot change them (on the full-size
zoo they take 0-1.6% off; the tracks below start from the best they leave). Where every device holds at
least the lowest rung of the ladder ``canonical_caps`` x the one-device peak (graphs of 1,000 ops up to
the size that affords more searches; larger graphs have the one cap ``large_graph_canonical_cap``),
all of the above runs once per rung every device holds, with the memory cut to it, and the fastest of
those and of the one-device placements that fit is returned (``canonical.py``): more memory holds
every rung less memory holds, so above the lowest rung more memory is never slower. Every limit counts simulator
calls, so the result depends only on the inputs and ``seed``. A user who asks for
``time_budget_s`` also stops it when that much wall clock is spent (then the result depends on the
machine's speed). ``options['stopped_by']`` says what stopped it: ``evals`` (the rounds ran out or
the gap fell below ``target_gap``; ``options['rounds']`` says how many ran), ``bound`` (within
``closed_gap``) or ``time``. With
``robust_samples`` the score is a mean over perturbed models, which the nominal bound does not
bound: one round runs.

It prints nothing: progress (evals done, best step time so far) goes to ``devplace.progress``,
messages to the ``logging`` logger of this module (under ``devplace``).

>>> from devplace.graph import GraphBuilder
>>> from devplace.cluster import uniform_cluster
>>> b = GraphBuilder(["gpu"])
>>> for name in "abcd":
...     _ = b.add_op(name, compute_us=100.0)
>>> p = place(b.build(), uniform_cluster(4), options=SearchConfig(max_evals=50))
>>> sorted(p.devices.tolist())          # four independent ops: one per device
[0, 1, 2, 3]
"""

from __future__ import annotations

import time

import numpy as np

from devplace.errors import PlacementError
from devplace.placement import Placement
from devplace.placers import register
from devplace.portfolio.sim_search.anneal import _lower_bound_us, _rounds
from devplace.portfolio.sim_search.branches import _branch_rounds
from devplace.portfolio.sim_search.canonical import best_one_device, canonical_caps_bytes, capped_config
from devplace.portfolio.sim_search.coarse_mip import _coarse_mip_rounds
from devplace.portfolio.sim_search.config import GIB, NAME, SearchConfig, log
from devplace.portfolio.sim_search.grad_blocks import _gradient_block_rounds
from devplace.portfolio.sim_search.layers import (
    _layer_descent_starts, _layer_descents, _layer_search, _layer_search_starts, interleaved_layers,
)
from devplace.portfolio.sim_search.loose_memory import _loose_memory_rounds
from devplace.portfolio.sim_search.order_descent import _order_descent
from devplace.portfolio.sim_search.recurrence import _recurrence_rounds
from devplace.portfolio.sim_search.repair import _overflow_error, _repair
from devplace.portfolio.sim_search.search import _Search
from devplace.portfolio.sim_search.seeds import _run_seeds
from devplace.portfolio.sim_search.starts import _cheap_cut_starts, _pipeline_starts


@register(NAME, "devplace's own: best of the baselines, then simulator-guided annealing over groups and order",
          SearchConfig)
def place(graph, cluster, *, seed: int = 0, options: SearchConfig = SearchConfig()) -> Placement:
    config = options
    if (config.max_rounds < 1 or config.small_graph_round_factor < 1 or not config.target_gap >= 0
            or not config.closed_gap >= 0):
        raise PlacementError(f"{NAME}: max_rounds and small_graph_round_factor must be >= 1, target_gap and "
                             f"closed_gap >= 0 (got {config.max_rounds}, {config.small_graph_round_factor}, "
                             f"{config.target_gap}, {config.closed_gap})")
    caps_bytes = canonical_caps_bytes(graph, cluster, config)
    if caps_bytes:
        return _canonical_place(graph, cluster, seed, config, caps_bytes)
    search = _Search(graph, cluster, config, seed)
    bound_us = _lower_bound_us(graph, cluster)
    nominal = not search.robust_sims       # the bound is for the nominal step time, not a mean
    if bound_us is not None and nominal and config.closed_gap > 0:
        search.closed_us = bound_us * (1.0 + config.closed_gap)
    _run_seeds(search)
    _pipeline_starts(search)
    _cheap_cut_starts(search)
    if search.best.devices is None and (search.n_dev < 2 or not _repair(search)):
        raise _overflow_error(search)
    seed_us, _, _, seed_how = search.best
    descent_starts = _layer_descent_starts(search)
    search_starts = _layer_search_starts(search)
    stopped_by, rounds = _rounds(search, bound_us if nominal else None)
    _layer_search(search, [search.best] + search_starts)
    _layer_descents(search, [search.best] + descent_starts)
    _coarse_mip_rounds(search, bound_us if nominal else None)
    _gradient_block_rounds(search, bound_us if nominal else None)
    _recurrence_rounds(search, bound_us if nominal else None)
    _branch_rounds(search, bound_us if nominal else None)
    _loose_memory_rounds(search, bound_us if nominal else None)
    _order_descent(search, bound_us if nominal else None)
    if search.best.step_us <= search.closed_us:
        stopped_by = "bound"
    step_us, devices, priority, how = search.best
    gap = step_us / bound_us - 1.0 if nominal and bound_us else None
    log.info("%d evals in %.1f s: %.3f ms, best seed %.3f ms (%s)", search.evals,
             time.perf_counter() - search.began, step_us / 1e3, seed_us / 1e3, seed_how)
    return Placement(
        devices=devices, priority=priority,
        options={"evals": search.evals, "stopped_by": stopped_by, "best_seed": seed_how,
                 "best_seed_step_us": seed_us, "step_us": step_us, "found_by": how, "rounds": rounds,
                 "pipeline_starts": search.pipeline_cuts, "cheapest_cut_starts": search.cheap_cuts,
                 "balanced_cut_starts": search.balanced_cuts, "virtual_cap_rounds": search.virtual_rounds,
                 "lower_bound_us": bound_us, "gap": gap,
                 "seed_results": search.seed_report, "repair": search.repair_report,
                 "coarse_mip": search.coarse_mip_report, "grad_blocks": search.grad_block_report,
                 "recurrence": search.recurrence_report, "branches": search.branch_report,
                 "loose_memory": search.loose_memory_report, "order_descent": search.order_descent_report,
                 "fine_units": search.fine.n_units,
                 "coarse_units": search.coarse.n_units},
    )


def _canonical_place(graph, cluster, seed: int, config: SearchConfig, caps_bytes: list[float]) -> Placement:
    """The fastest of the searches on the cluster capped at each of ``caps_bytes`` (the first on a
    tie) and the one-device placements that fit the real memory (``canonical.py``); bound, gap and
    ``stopped_by`` for the real memory."""
    began, capped = time.perf_counter(), []
    for cap in caps_bytes:      # time_budget_s caps them all together
        budget_s = config.time_budget_s
        left_s = None if budget_s is None else max(budget_s - (time.perf_counter() - began), 0.0)
        # no looser-memory track inside: it would run a whole search more per cap
        capped.append(place(graph, cluster.with_memory_bytes(np.minimum(cluster.memory_bytes, cap)), seed=seed,
                            options=capped_config(config, left_s)))
    best = min(capped, key=lambda placement: placement.options["step_us"])
    search = _Search(graph, cluster, config, seed)     # the real memory: judges the one-device placements
    one_us, one_devices, one_priority, one_how = best_one_device(search)
    options = dict(best.options)
    devices, priority = best.devices, best.priority
    if one_us < options["step_us"]:
        devices, priority = one_devices, one_priority
        options.update(step_us=one_us, found_by=one_how)
    nominal = not search.robust_sims
    bound_us = _lower_bound_us(graph, cluster) if nominal else None
    closed = bound_us is not None and config.closed_gap > 0 and options["step_us"] <= bound_us * (1 + config.closed_gap)
    if options["stopped_by"] == "bound" and not closed:
        options["stopped_by"] = "capped bound"      # within closed_gap of a capped cluster's bound only
    options.update(evals=sum(p.options["evals"] for p in capped) + search.evals, lower_bound_us=bound_us,
                   gap=options["step_us"] / bound_us - 1.0 if bound_us else None,
                   canonical_caps_gib=[cap / GIB for cap in caps_bytes],
                   capped_step_us=[p.options["step_us"] for p in capped])
    return Placement(devices=devices, priority=priority, options=options)


__all__ = ["place", "SearchConfig", "NAME", "interleaved_layers"]
