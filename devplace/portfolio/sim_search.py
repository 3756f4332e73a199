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
temperature: the first, third, ... from the best so far, the second from the fastest balanced
cheapest-cut start (planned with bytes that do not depend on the memory, so every memory that
fits it anneals it: which basin gets annealed then depends less on which starts the memory
excludes), unless the first began there, and the fourth, sixth, ... (and else the second) from the
fastest start (seed or pipeline) not yet tried whose placement differs from the best, so a wide gap also
buys exploring other basins; after a round it goes on only while the gap is above
``target_gap`` and fewer than ``max_rounds`` rounds ran (on a small graph, up to four times as
many while the simulator calls times the ops stay under ``small_graph_op_evals``: there a round
costs a fraction of a second), and it stops at once when the best comes
within ``closed_gap`` of the bound (nothing much faster can exist). Every limit counts simulator
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

import functools
import logging
import math
import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from devplace.graph import Role
from devplace.errors import DevplaceError, OutOfMemoryError, PlacementError
from devplace.placement import Placement
from devplace import progress
from devplace.placers import register
from devplace.placers.options import option
from devplace.placers._layers import UnitLayers
from devplace.placers._listsched import mean_edge_us
from devplace.placers._memory import out_of_memory
from devplace.placers._moves import (
    Units, critical_crossings, held_bytes, leader_units, live_bytes_at_peak, pipeline_devices, read_later,
    respect_colocation, sources_late_order, upward_rank_us, with_colocation,
)
from devplace.portfolio.variants import place as place_spec
from devplace.robust import SEARCH_FIRST, check_count, perturbed_models
from devplace.sim import Simulator
from devplace.sim.result import usable_memory_bytes

log = logging.getLogger(__name__)

NAME = "sim-search"
GIB = 2**30
# a cheapest-cut plan counts a stage's held bytes, gradients and received copies at once, which
# overstates its simulated peak (ResNet-50 at 30%: by 0.1-0.3 GiB), so plans up to this x capacity are tried
CHEAP_CUT_SLACK = 1.5
# balanced cheapest cuts are planned at these multiples of the least bytes a stage may hold
# (bisected that many times): placements that do not depend on the devices' memory
BALANCED_CUT_PLANS = (1.0, 1.125, 1.25, 1.5)
BALANCED_CUT_BISECTIONS = 24
BALANCED_CUT = "balanced cheapest-cut pipeline"    # how such a start is described, and found again


@dataclass(frozen=True)
class SearchConfig:
    """Every knob of the search, in the order the search uses them; each is a place() option."""

    seeds: tuple[str, ...] = option(
        ("single", "expert", "m-topo", "m-etf", "heft", "m-sct", "metis", "round-robin", "random",
         "accelerate-auto", "pipeline-partition", "fx-size-partition",
         "m-topo+opt", "m-etf+opt", "m-sct+opt", "heft+opt", "metis+opt", "metis+fwd"),
        "placers whose placements start the search: ALGO or ALGO+opt / ALGO+fwd")
    max_ops_raw: int = option(6000, "seeds run on the full graph only up to this many ops (else +opt only)")
    max_ops_costly: int = option(3000, "m-SCT runs on the full graph only up to this many ops (HEFT up to max_ops_raw)")
    max_evals: int = option(2000, "simulator calls per annealing round (the budget; makes results reproducible)")
    max_rounds: int = option(4, "annealing rounds at most; a round after the first runs only while the best is "
                                "more than target_gap above the certified lower bound")
    small_graph_op_evals: float = option(2e7, "rounds past max_rounds (up to 4 x max_rounds) while the gap is above "
                                              "target_gap and evals x ops stays under this: a small graph's round "
                                              "costs little (resnet50_inference, 604 ops: 0.3 s), a large one's "
                                              "minutes (GNMT, 24,832 ops: every zoo model stops at max_rounds)")
    target_gap: float = option(0.10, "best / lower bound - 1 under which no further round starts")
    closed_gap: float = option(0.001, "stop as soon as best / lower bound - 1 is below this (0: never stop early)")
    time_budget_s: float | None = option(None, "wall-clock cap on the whole placement in seconds (None: "
                                               "none, max_evals alone decides, so the seed makes it reproducible)")
    temperature_start: float = option(0.01, "annealing: accept a move d% slower with probability "
                                            "exp(-d / temperature%), relative to the best step time, at the start")
    temperature_end: float = option(0.0002, "annealing temperature at the end of the budget")
    restart_after: int = option(250, "evals without a new best of the round before continuing from it")
    move_weights: tuple[tuple[str, float], ...] = option(
        (("move", 3.0), ("swap", 1.0), ("run", 2.0), ("pull", 2.0), ("unload", 1.0), ("layer", 1.0)),
        "relative weights of the moves (move, swap, run, pull, unload, layer)")
    critical_share: float = option(0.6, "chance a move starts from a unit on the critical path")
    coarse_share: float = option(0.5, "chance a move acts on co-placement groups rather than colocation units")
    coarse_units: str = option(
        "coplacement", "coarse units: coplacement groups, leaders (a forward op and its backward ops), or auto "
        "(leaders when one co-placement group holds over half the ops)", choices=("coplacement", "leaders", "auto"))
    run_max_units: int = option(16, "longest run of units a run move shifts")
    reorder_every: int = option(100, "evals between tries of other schedule orders")
    pipeline_starts: bool = option(True, "try consecutive stages as starts: the forward pass balanced by bytes, and "
                                         "the whole step cut where the least transfer time crosses")
    pipeline_rebalance: int = option(3, "cuts per stage count, each re-weighting a stage by its simulated peak")
    pipeline_shifts: int = option(12, "simulator calls shifting the boundaries of the least overflowing cut "
                                      "(per stage count and balance) until it fits")
    layer_descent_evals: int = option(4000, "simulator calls for the layer descents after the annealing (where layers "
                                            "interleave: the fastest whole-layer move each step, from the annealing's "
                                            "best, the best start and the expert; 0: none)")
    layer_search_evals: int = option(2000, "simulator calls for the layer search before the layer descents (where "
                                           "layers interleave: random moves of whole layers from starts laid out "
                                           "layer by layer, each kept if faster; 0: none)")
    layer_search_starts: int = option(4, "how many of the fastest distinct layer-by-layer starts the layer search "
                                         "shares its evals over")
    repair_max_evals: int = option(1000, "simulator calls to remove the overflow when no start fits")
    repair_patience: int = option(150, "evals without less overflow before repairing the next start")
    repair_starts: int = option(3, "how many of the least-overflowing starts the repair may try")
    repair_run_share: float = option(0.5, "chance a repair move shifts a run of groups at a stage's edge")
    repair_run_fraction: float = option(0.25, "longest repair run: this share of the overflowing device's groups")
    robust_samples: int = option(0, "score candidates by the mean step time over this many perturbed cost models "
                                    "(devplace.robust, from the seed) instead of the nominal one; that many times "
                                    "slower (0: nominal)")


# ------------------------------------------------------------------------------------- state
class _Search:
    """The simulator, the units and the incumbent; ``evaluate`` is the only way a placement is judged."""

    def __init__(self, graph, cluster, config: SearchConfig, seed: int):
        from devplace.transforms import colocation_units, coplacement_groups

        self.graph, self.cluster, self.config = graph, cluster, config
        self.sim = Simulator(graph, cluster)
        models = perturbed_models(graph, cluster, check_count("robust_samples", config.robust_samples), seed,
                                  first=SEARCH_FIRST)
        self.robust_sims = [Simulator(m.graph, m.cluster) for m in models]
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.n_dev = cluster.n_devices
        self.began = time.perf_counter()
        self.evals = 0
        self.fine = Units.from_labels(graph, colocation_units(graph))
        self.coarse = Units.from_labels(graph, coplacement_groups(graph))
        # each op's position in the step order: topological, each weight just before its first reader
        self.step_rank = np.argsort(sources_late_order(graph))
        self.leaders = leader_units(graph, rank=self.step_rank)   # forward op + the ops that follow it; widened by colocation
        self.layers = interleaved_layers(graph, self.step_rank)     # None: no layer move
        # per layer, its ops and their colocation groups: what a layer move or a layer descent puts on one device
        self.layer_ops = [] if self.layers is None else [with_colocation(self.fine, self.layers.members(layer))
                                                         for layer in range(self.layers.n_units)]
        moves = [(name, w) for name, w in config.move_weights if name != "layer" or self.layers is not None]
        self.move_names = [name for name, _ in moves]      # the annealing's moves and their chances
        self.move_p = np.array([w for _, w in moves], dtype=float)
        self.move_p /= self.move_p.sum() if moves else 1.0
        degenerate = self.coarse.n_units > 0 and np.bincount(self.coarse.unit_of).max() > graph.n_ops / 2
        if config.coarse_units == "leaders" or (config.coarse_units == "auto" and degenerate):
            self.coarse = leader_units(graph, closed=True, rank=self.step_rank)
        self.memory_is_ample = self._memory_is_ample()
        # topological order, but an update op runs as soon as its inputs are there (``orders``);
        # None without update ops (an inference graph): it would be the topological order again
        update = graph.role == Role.UPDATE
        self.updates_first = np.where(update, -1.0, 0.0) * graph.n_ops + graph.topo_rank if update.any() else None
        self.closed_us = -math.inf      # a best at or under this ends the search (bound x (1 + closed_gap))
        self.best = (math.inf, None, None, "none")  # (step us, devices, priority, how)
        self.starts: list[tuple] = []   # over-memory starts: (overflow bytes, step us, devices, priority, how)
        self.least = None               # smallest overflow seen: (overflow bytes, step us, SimResult)
        self.fitting: list[tuple] | None = []   # starts that fit, as ``best``; None once annealing began
        self.pipeline_cuts = 0          # pipeline starts judged, fitting or not
        self.cheap_cuts = 0             # cheapest-cut starts judged (those whose stages' bytes fit)
        self.balanced_cuts = 0          # balanced cheapest-cut starts judged (whatever the memory)
        self.repair_report: dict = {}
        self.seed_report: dict[str, float | str] = {}
        self.shown_us = math.inf        # the best step time last logged
        self.reporter = progress.current()
        self.phase_began = 0            # evals when the current progress task began

    def _memory_is_ample(self) -> bool:
        """True if every op, every received copy and the largest temporary fit each device at once."""
        g = self.graph
        worst = g.persistent_bytes.sum() + 2 * g.output_bytes.sum() + (g.temp_bytes.max() if g.n_ops else 0.0)
        return bool(worst <= self.cluster.memory_bytes.min())

    def out_of_time(self) -> bool:
        budget = self.config.time_budget_s
        return budget is not None and time.perf_counter() - self.began > budget

    def step_us(self, devices: np.ndarray, priority: np.ndarray | None) -> float:
        """The score of a candidate, counted as an eval: its step time, or its mean over the
        perturbed models when ``robust_samples`` asks for them."""
        self.evals += 1
        if self.evals % 20 == 0:
            self.report()
        return self._score(devices, priority)

    def _score(self, devices: np.ndarray, priority: np.ndarray | None, nominal_us: float | None = None) -> float:
        """The nominal step time (``nominal_us`` when the caller simulated it already) or, with
        ``robust_samples``, the mean over the perturbed models."""
        if self.robust_sims:
            return float(np.mean([sim.step_time_us(devices, priority) for sim in self.robust_sims]))
        return self.sim.step_time_us(devices, priority) if nominal_us is None else nominal_us

    def report(self, done: int | None = None) -> None:
        """Tell the progress hook how far the current task is and the best step time so far."""
        best = self.best[0] if math.isfinite(self.best[0]) else None
        self.reporter.update(self.evals - self.phase_began if done is None else done, best_step_us=best)

    def examine(self, devices: np.ndarray, priority: np.ndarray | None):
        """Full simulation: (fits in memory, SimResult)."""
        result = self.sim.run(Placement(devices=devices, priority=priority))
        return result.fits, result

    def fits(self, devices: np.ndarray, priority: np.ndarray | None) -> bool:
        return self.memory_is_ample or self.examine(devices, priority)[0]

    def measure(self, devices: np.ndarray, priority: np.ndarray | None):
        """Full simulation counted as an eval: (total overflow bytes, score as ``step_us``, SimResult)."""
        self.evals += 1
        result = self.sim.run(Placement(devices=devices.copy(), priority=priority))
        step = self._score(devices, priority, result.step_time_us)
        overflow = float(np.maximum(result.peak_memory_bytes - usable_memory_bytes(self.cluster), 0.0).sum())
        if self.least is None or (overflow, step) < self.least[:2]:
            self.least = (overflow, step, result)
        return overflow, step, result

    def consider(self, devices: np.ndarray, priority, how: str):
        """A start: offered if it fits, else kept for the repair; returns ``measure``'s triple."""
        overflow, step, result = self.measure(devices, priority)
        if overflow > 0:
            self.starts.append((overflow, step, devices.copy(), None if priority is None else priority.copy(), how))
        else:
            self.offer(step, devices, priority, how)
        return overflow, step, result

    def orders(self, devices: np.ndarray) -> list[tuple[str, np.ndarray | None]]:
        """Schedule orders worth trying for ``devices``: topological and longest-remaining-path first;
        and topological with every update op first once its inputs are there (for tight memory),
        since an update that waits for the end of the step keeps its gradient's buffer alive (a
        backward op's output dies only after its last reader, the update, has run)."""
        rank = upward_rank_us(self.graph, self.cluster, devices, self.sim.op_time_us)
        orders = [("topological", None), ("upward rank", -rank)]
        return orders + ([("updates first", self.updates_first)] if self.updates_first is not None else [])

    def pipeline_orders(self) -> list[tuple[str, np.ndarray | None]]:
        """The orders a pipeline start is judged in, the one that frees gradients soonest last."""
        later = [("updates first", self.updates_first)] if self.updates_first is not None else []
        return [("topological order", None)] + later

    def offer(self, step_us: float, devices: np.ndarray, priority, how: str) -> bool:
        """Keep (a copy of) the placement if it beats the best so far (and, before the annealing,
        as a start); report whether it beat the best."""
        if self.fitting is not None:
            self.fitting.append((step_us, devices.copy(), None if priority is None else priority.copy(), how))
        if step_us < self.best[0]:
            self.best = (step_us, devices.copy(), None if priority is None else priority.copy(), how)
            previous = self.shown_us
            if step_us < previous * 0.999:   # log gains of 0.1% or more
                self.shown_us = step_us
                gain = f" ({(1 - step_us / previous) * 100:.2f}% better)" if math.isfinite(previous) else ""
                log.debug("eval %5d  best %10.3f ms  by %s%s", self.evals, step_us / 1e3, how, gain)
            return True
        return False


# ------------------------------------------------------------------------------------- seeds
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
    if search.out_of_time() and search.best[1] is not None:
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
    capacity = search.cluster.memory_bytes[order]
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
        capacity = float(cluster.memory_bytes[device_order].min())
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
            search.cheap_cuts += least is None     # stage counts judged (a larger memory judges as many)
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
        _balanced_cuts(search, stage_path, most_bytes, lambda path: on_devices(_stages_of(path, cuts, n)), capacity,
                       stages)


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


# ------------------------------------------------------------------------------------ repair
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


def _repair(search: _Search) -> bool:
    """Greedy descent on (total overflow, step time) from the least-overflowing starts; True once a
    placement fits (it is offered, so the annealing continues from it)."""
    config = search.config
    starts = sorted(search.starts, key=lambda s: (s[0], s[1]))[: config.repair_starts]
    budget_end = search.evals + config.repair_max_evals
    report = search.repair_report
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
            proposal = _repair_move(search, devices, result)
            if proposal is None:
                search.evals += 1    # counts, so the loop always ends
                stale += 1
                continue
            move, ops, target = proposal
            trial = devices.copy()
            trial[ops] = target
            t_overflow, t_step, t_result = search.measure(trial, priority)
            if (t_overflow, t_step) >= (overflow, step):
                stale += 1
                continue
            stale = 0 if t_overflow < overflow else stale + 1
            devices, overflow, step, result = trial, t_overflow, t_step, t_result
            if overflow == 0:
                report.update(evals=search.evals - began_evals, repaired=how)
                search.offer(step, devices, priority, f"repair of {how} ({move} move)")
                return True
    report["evals"] = search.evals - began_evals
    return False


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


# ------------------------------------------------------------------------------------- moves
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


def interleaved_layers(graph, step_rank: np.ndarray, entries_per_layer: float = 2.0) -> Units | None:
    """The layers (``devplace.placers._layers``: modules as users cut them) as units, when the step
    order enters them ``entries_per_layer`` times each or more on average (a recurrent net, whose
    layers take turns by time step: GNMT's 15 enter 250 times), else None. A run of consecutive units
    then never holds a whole layer, so only a layer move can carry one (GNMT at 30% memory, one
    round: 305.6 -> 278.8 ms). Where each layer is entered about once (ResNet-50, Inception-V3,
    NASNet, the Transformer, RNNLM, the bundled graphs) the layer move, tried, moved the results
    both ways (four rounds at 30%: NASNet -3.9%, Transformer -2.5%, ResNet-50 +1.4%, Inception-V3
    +0.7%; one round: -1.4% to +1.2%), so it is not drawn there and they keep their figures."""
    layers = UnitLayers.of(graph)
    layer_of = layers.layer_of_unit()[layers.unit_of]
    forward = np.flatnonzero(graph.role == Role.FORWARD)
    sequence = layer_of[forward[np.argsort(step_rank[forward], kind="stable")]]
    n_layers = len(np.unique(layer_of))
    entries = 1 + np.count_nonzero(np.diff(sequence)) if len(sequence) else 0
    if n_layers < 2 or entries < entries_per_layer * n_layers:
        return None
    return Units.from_labels(graph, layer_of)


def _layer_search_starts(search: _Search) -> list[tuple]:
    """Where layers interleave, every start that fits, taken before the annealing (the layer search
    lays them out layer by layer); else none."""
    if search.layers is None or search.config.layer_search_evals <= 0 or search.n_dev < 2:
        return []
    return list(search.fitting)


def _by_layer(search: _Search, devices: np.ndarray) -> np.ndarray:
    """Each layer's device in ``devices``: the one holding most of its ops."""
    return np.array([np.bincount(devices[ops], minlength=search.n_dev).argmax() for ops in search.layer_ops])


def _layer_placement(search: _Search, base: np.ndarray, layer_devices: np.ndarray) -> np.ndarray:
    """``base`` with every layer (its ops and their colocation groups) whole on its device."""
    devices = base.copy()
    for ops, device in zip(search.layer_ops, layer_devices):
        devices[ops] = device
    return devices


def _fastest_fitting(search: _Search, devices: np.ndarray, order_name: str | None = None):
    """(step us, priority, order name) of ``devices`` in the fastest of ``orders`` that fits (only the one
    named, if ``order_name``), or None when none fits; each simulation is an eval (a full one, to check
    memory, unless memory is ample)."""
    best = None
    for name, order in search.orders(devices):
        if order_name is not None and name != order_name:
            continue
        if search.memory_is_ample:
            step, fits = search.step_us(devices, order), True
        else:
            overflow, step, _ = search.measure(devices, order)
            fits = overflow == 0
        if fits and (best is None or step < best[0]):
            best = (step, order, name)
    return best


def _layer_score(search: _Search, base: np.ndarray, layer_devices: np.ndarray, order_name: str | None):
    """(step us, per-op devices, priority, order name) of ``base`` laid out by layer in the order named
    (None: the fastest of ``orders``), or None when it does not fit."""
    devices = _layer_placement(search, base, layer_devices)
    scored = _fastest_fitting(search, devices, order_name)
    return None if scored is None else (scored[0], devices, scored[1], scored[2])


def _layer_search(search: _Search, starts: list[tuple]) -> None:
    """Where layers interleave, a random local search over whole-layer placements: each start that
    fits is laid out layer by layer (each layer on the device holding most of its ops), the
    ``layer_search_starts`` fastest distinct ones share ``layer_search_evals``, and from each a
    candidate moves one layer, and each other with chance 1.5 / layers, to another device drawn
    evenly; it replaces the centre if faster in the centre's order (then every order is tried).
    Greedy descents stop where no one-layer move is faster: on GNMT-4 with ample memory the
    descent from metis+opt ended at 228.85 ms, and no pair of layer moves from there is faster
    (945 tried), while this search from metis laid out by layer (255.6 ms) reached 216.9 in 640
    candidates. Runs after the annealing, so graphs without interleaved layers are untouched."""
    if search.layers is None or len(starts) < 2:     # only the annealing's best: layers do not interleave
        return
    laid_out = {}
    for _, devices, _, how in starts:
        layer_devices = _by_layer(search, devices)
        key = layer_devices.tobytes()
        if key not in laid_out:
            laid_out[key] = (_layer_score(search, devices, layer_devices, None), layer_devices, how)
    fitting = sorted((v for v in laid_out.values() if v[0] is not None), key=lambda v: v[0][0])
    fitting = fitting[:search.config.layer_search_starts]
    if not fitting:
        return
    share = search.config.layer_search_evals // len(fitting)
    n_layers = len(search.layer_ops)
    search.reporter.begin(f"{NAME}: layer search", total=share * len(fitting))
    search.phase_began = search.evals
    try:
        for (step, devices, priority, order_name), centre, how in fitting:
            search.offer(step, devices, priority, f"{how} laid out by layer")
            budget_end = search.evals + share
            moves = 0
            while search.evals < budget_end and not search.out_of_time() and search.best[0] > search.closed_us:
                moved = search.rng.random(n_layers) < 1.5 / n_layers
                moved[search.rng.integers(n_layers)] = True
                shift = search.rng.integers(1, search.n_dev, n_layers)
                trial = np.where(moved, (centre + shift) % search.n_dev, centre)
                scored = _layer_score(search, devices, trial, order_name)
                if scored is not None and scored[0] < step:
                    step, devices, priority, order_name = _layer_score(search, devices, trial, None) or scored
                    centre, moves = trial, moves + 1
            if moves:
                log.info("eval %5d  layer search from %s: %d moves, %.3f ms", search.evals, how, moves, step / 1e3)
                search.offer(step, devices, priority, f"layer search ({moves} moves) from {how}")
    finally:
        search.reporter.end()


def _layer_descent_starts(search: _Search) -> list[tuple]:
    """Where layers interleave, the best start and the expert's fastest placement that fits (as
    ``search.best``), taken before the annealing; else none."""
    if search.layers is None or search.config.layer_descent_evals <= 0 or search.n_dev < 2:
        return []
    expert = [start for start in search.fitting if start[3].startswith("seed expert (")]
    return [search.best] + ([min(expert, key=lambda start: start[0])] if expert else [])


def _layer_descents(search: _Search, starts: list[tuple]) -> None:
    """Where layers interleave, greedy descents over whole-layer moves after the annealing, from its
    best, the best start and the expert's placement: each step tries every layer on every other
    device, each candidate in every order of ``orders`` and checked to fit, and takes the fastest;
    it stops when none is faster or ``layer_descent_evals`` (shared by the descents) are spent.
    The annealing's layer move draws one layer and device at random; on GNMT-4 with ample memory a
    descent from the expert (345.8 ms) reached 229.5 ms in 7 moves where the annealing ended at
    244.5. Run after the annealing, they leave its random stream as it was, so the result is never
    slower than without them (run before it, as starts, GNMT at 30% ended 3.7% slower: 257.2 ms)."""
    if len(starts) < 2:     # only the annealing's best: layers do not interleave
        return
    budget_end = search.evals + search.config.layer_descent_evals
    search.reporter.begin(f"{NAME}: layer descent", total=search.config.layer_descent_evals)
    search.phase_began = search.evals
    try:
        for k, (step, devices, priority, how) in enumerate(starts):
            if k and any(np.array_equal(devices, other[1]) for other in starts[:k]):
                continue        # the same placement as an earlier start
            _layer_descent(search, step, devices, priority, how, budget_end)
    finally:
        search.reporter.end()


def _layer_descent(search: _Search, step: float, devices: np.ndarray, priority, how: str, budget_end: int) -> None:
    """One greedy descent over whole-layer moves from a start (``_layer_descents``); offers its end."""
    moves = 0
    while search.evals < budget_end and not search.out_of_time() and search.best[0] > search.closed_us:
        fastest = (step, None, None)
        for ops in search.layer_ops:
            for target in range(search.n_dev):
                if (devices[ops] == target).all() or search.evals >= budget_end:
                    continue
                trial = devices.copy()
                trial[ops] = target
                scored = _fastest_fitting(search, trial)
                if scored is not None and scored[0] < fastest[0]:
                    fastest = (scored[0], trial, scored[1])
        if fastest[1] is None:
            break
        step, devices, priority = fastest
        moves += 1
    if moves:
        log.info("eval %5d  layer descent from %s: %d moves, %.3f ms", search.evals, how, moves, step / 1e3)
        search.offer(step, devices, priority, f"layer descent ({moves} moves) from {how}")


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
    if search.n_dev < 2 or config.max_evals <= 0 or search.best[0] <= 0 or not search.graph.n_ops:
        return "evals", 0      # nothing to move, or nothing beats a zero step time
    starts = sorted(search.fitting, key=lambda start: start[0])
    search.fitting = None
    first = search.best
    rounds = 0
    while rounds < config.max_rounds or (
            rounds < 4 * config.max_rounds
            and (search.evals + config.max_evals) * search.graph.n_ops <= config.small_graph_op_evals):
        if search.best[0] <= search.closed_us:
            return "bound", rounds
        if rounds and (bound_us is None or search.best[0] <= bound_us * (1.0 + config.target_gap)):
            break
        search.reporter.begin(NAME if not rounds else f"{NAME} (round {rounds + 1}, gap "
                              f"{100 * (search.best[0] / bound_us - 1):.1f}%)", total=config.max_evals)
        search.phase_began = search.evals
        try:
            if rounds % 2 == 0:
                start = search.best
            else:
                start = (rounds == 1 and _balanced_start(starts, first)) or _next_start(starts, search.best)
            stopped_by = _anneal(search, start)
            search.report()
        finally:
            search.reporter.end()
        rounds += 1
        if stopped_by != "evals":
            return stopped_by, rounds
    return ("bound" if search.best[0] <= search.closed_us else "evals"), rounds


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


def _anneal(search: _Search, start: tuple) -> str:
    """One round of simulated annealing from ``start`` (as ``search.best``); returns what stopped
    it ("evals", "time", or "bound": the best came within ``closed_gap`` of the lower bound)."""
    config, rng = search.config, search.rng
    current_us, devices, priority, _ = start
    devices = devices.copy()
    home = (current_us, devices.copy(), priority)    # the round's best: where it restarts from
    info = _critical_info(search, devices, priority)
    since_best = 0
    cooling = (config.temperature_end / config.temperature_start) ** (1.0 / max(config.max_evals, 1))
    temperature = config.temperature_start
    budget_end = search.evals + config.max_evals
    next_reorder = search.evals + config.reorder_every
    while search.evals < budget_end:
        if search.out_of_time():
            return "time"
        if search.best[0] <= search.closed_us:
            return "bound"
        temperature *= cooling
        move, changes = _propose(search, devices, info)
        undo = [(ops, devices[ops].copy()) for ops, _ in changes]
        for ops, d in changes:
            devices[ops] = d
        if not changes or all((devices[ops] == old).all() for ops, old in undo):
            search.evals += 1   # a no-op move still counts, so the loop always ends
            continue
        step = search.step_us(devices, priority)
        worse = (step - current_us) / search.best[0]
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
                home, since_best = (step, devices.copy(), priority), -1
        since_best += 1
        if search.evals >= next_reorder:
            next_reorder = search.evals + config.reorder_every
            for order, candidate in search.orders(devices):
                step = search.step_us(devices, candidate)
                if step < current_us and search.fits(devices, candidate):
                    current_us, priority = step, candidate
                    search.offer(step, devices, priority, f"{order} order")
                    if step < home[0]:
                        home = (step, devices.copy(), priority)
        if since_best >= config.restart_after:
            current_us, home_devices, priority = home
            devices = home_devices.copy()
            info = _critical_info(search, devices, priority)
            since_best = 0
    return "evals"


@register(NAME, "devplace's own: best of the baselines, then simulator-guided annealing over groups and order",
          SearchConfig)
def place(graph, cluster, *, seed: int = 0, options: SearchConfig = SearchConfig()) -> Placement:
    config = options
    if config.max_rounds < 1 or not config.target_gap >= 0 or not config.closed_gap >= 0:
        raise PlacementError(f"{NAME}: max_rounds must be >= 1, target_gap and closed_gap >= 0 (got "
                             f"{config.max_rounds}, {config.target_gap}, {config.closed_gap})")
    search = _Search(graph, cluster, config, seed)
    bound_us = _lower_bound_us(graph, cluster)
    nominal = not search.robust_sims       # the bound is for the nominal step time, not a mean
    if bound_us is not None and nominal and config.closed_gap > 0:
        search.closed_us = bound_us * (1.0 + config.closed_gap)
    _run_seeds(search)
    _pipeline_starts(search)
    _cheap_cut_starts(search)
    if search.best[1] is None and (search.n_dev < 2 or not _repair(search)):
        raise _overflow_error(search)
    seed_us, _, _, seed_how = search.best
    descent_starts = _layer_descent_starts(search)
    search_starts = _layer_search_starts(search)
    stopped_by, rounds = _rounds(search, bound_us if nominal else None)
    _layer_search(search, [search.best] + search_starts)
    _layer_descents(search, [search.best] + descent_starts)
    if search.best[0] <= search.closed_us:
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
                 "balanced_cut_starts": search.balanced_cuts,
                 "lower_bound_us": bound_us, "gap": gap,
                 "seed_results": search.seed_report, "repair": search.repair_report, "fine_units": search.fine.n_units,
                 "coarse_units": search.coarse.n_units},
    )
