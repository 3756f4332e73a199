"""The search's state: the graph's units, the best placement so far, how a candidate is scored
and judged against memory, and the starts it keeps."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from devplace import progress
from devplace.graph import Role
from devplace.placement import Placement
from devplace.placers._moves import Units, leader_units, sources_late_order, upward_rank_us, with_colocation
from devplace.portfolio.sim_search.config import GIB, SearchConfig, log
from devplace.portfolio.sim_search.layers import interleaved_layers
from devplace.robust import SEARCH_FIRST, check_count, perturbed_models
from devplace.sim import Simulator
from devplace.sim.result import usable_memory_bytes


class Found(NamedTuple):
    """A placement the search has found, as ``best`` and ``fitting`` keep it."""
    step_us: float                  # its score (the step time, or its mean over perturbed models)
    devices: np.ndarray | None      # per op; None before anything fits
    priority: np.ndarray | None     # None: the topological order
    how: str                        # which start, move or track found it


def one_device_peak_bytes(sim: Simulator) -> float:
    """The peak memory of the whole step on the device with the most memory (topological order):
    what the memory caps are fractions of."""
    devices = np.full(sim.graph.n_ops, int(np.argmax(sim.cluster.memory_bytes)))
    return float(sim.run(Placement(devices=devices)).peak_memory_bytes.max())


class _Search:
    """The simulator, the units and the incumbent; ``step_us``, ``measure`` and ``examine`` are the only ways
    a placement is judged."""

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
        self.worst_bytes = self._worst_bytes()
        # what a candidate must fit: each device's memory, or below it a round's virtual cap (``capped``)
        self.real_cap_bytes = self.cap_bytes = usable_memory_bytes(cluster)
        self.memory_is_ample = bool(self.worst_bytes <= self.cap_bytes.min())
        # topological order, but an update op runs as soon as its inputs are there (``orders``);
        # None without update ops (an inference graph): it would be the topological order again
        update = graph.role == Role.UPDATE
        self.updates_first = np.where(update, -1.0, 0.0) * graph.n_ops + graph.topo_rank if update.any() else None
        self.closed_us = -math.inf      # a best at or under this ends the search (bound x (1 + closed_gap))
        self.best = Found(math.inf, None, None, "none")
        self.starts: list[tuple] = []   # over-memory starts: (overflow bytes, step us, devices, priority, how)
        self.least = None               # smallest overflow seen: (overflow bytes, step us, SimResult)
        self.fitting: list[Found] | None = []   # starts that fit; None once annealing began
        self.pipeline_cuts = 0          # pipeline starts judged, fitting or not
        self.cheap_cuts = 0             # cheapest-cut stage counts judged at the memory, fitting or not
        self.balanced_cuts = 0          # balanced cheapest-cut starts judged (whatever the memory)
        self.repair_report: dict = {}
        self.coarse_mip_report: dict = {}
        self.grad_block_report: dict = {}
        self.recurrence_report: dict = {}
        self.branch_report: dict = {}
        self.loose_memory_report: dict = {}
        self.order_descent_report: dict = {}
        self.virtual_rounds: list[dict] = []   # per round under a virtual cap: the cap, its start, the best after
        self.seed_report: dict[str, float | str] = {}
        self.shown_us = math.inf        # the best step time last logged
        self.reporter = progress.current()
        self.phase_began = 0            # evals when the current progress task began

    def _worst_bytes(self) -> float:
        """Every op, every received copy and the largest temporary at once: memory is ample when
        each device holds this."""
        g = self.graph
        return float(g.persistent_bytes.sum() + 2 * g.output_bytes.sum() + (g.temp_bytes.max() if g.n_ops else 0.0))

    @contextmanager
    def capped(self, cap_bytes: np.ndarray):
        """Judge candidates against ``cap_bytes`` (per device, at most its memory) inside the block:
        a placement that fits them fits the devices, so whatever is offered there stays valid."""
        real = self.cap_bytes
        self.cap_bytes = np.minimum(cap_bytes, real)
        self.memory_is_ample = bool(self.worst_bytes <= self.cap_bytes.min())
        try:
            yield
        finally:
            self.cap_bytes = real
            self.memory_is_ample = bool(self.worst_bytes <= real.min())

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
        best = self.best.step_us if math.isfinite(self.best.step_us) else None
        self.reporter.update(self.evals - self.phase_began if done is None else done, best_step_us=best)

    def memory_bytes(self) -> np.ndarray:
        """Each device's memory, or the virtual cap where that is lower: what starts are planned for."""
        return np.minimum(self.cluster.memory_bytes, self.cap_bytes)

    @property
    def virtual(self) -> bool:
        """True inside ``capped`` with a cap below some device's memory."""
        return bool((self.cap_bytes < self.real_cap_bytes).any())

    def one_device_peak_bytes(self) -> float:
        """``one_device_peak_bytes``, counted as an eval."""
        self.evals += 1
        return one_device_peak_bytes(self.sim)

    def examine(self, devices: np.ndarray, priority: np.ndarray | None):
        """Full simulation: (fits ``cap_bytes``, SimResult)."""
        result = self.sim.run(Placement(devices=devices, priority=priority))
        return bool((result.peak_memory_bytes <= self.cap_bytes).all()), result

    def fits(self, devices: np.ndarray, priority: np.ndarray | None) -> bool:
        return self.memory_is_ample or self.examine(devices, priority)[0]

    def measure(self, devices: np.ndarray, priority: np.ndarray | None):
        """Full simulation counted as an eval: (total bytes over ``cap_bytes``, score as ``step_us``, SimResult)."""
        self.evals += 1
        result = self.sim.run(Placement(devices=devices.copy(), priority=priority))
        step = self._score(devices, priority, result.step_time_us)
        overflow = float(np.maximum(result.peak_memory_bytes - self.cap_bytes, 0.0).sum())
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

    def late_phase_may_run(self, bound_us: float | None, evals: int) -> bool:
        """Whether a phase after the rounds (the coarse MIP, a piece track, the order descent) with
        ``evals`` (or rounds) may run: a budget, two devices or more, a bound (the nominal step time),
        time left and the best still more than ``target_gap`` above the bound."""
        return (evals > 0 and self.n_dev >= 2 and bound_us is not None and self.graph.n_ops > 0
                and not self.out_of_time() and self.best.step_us > bound_us * (1.0 + self.config.target_gap))

    def offer(self, step_us: float, devices: np.ndarray, priority, how: str) -> bool:
        """Keep (a copy of) the placement if it beats the best so far (and, before the annealing,
        as a start); report whether it beat the best."""
        if self.virtual:
            how = f"{how} under a virtual cap of {self.cap_bytes.max() / GIB:.4g} GiB"
        if self.fitting is not None:
            self.fitting.append(Found(step_us, devices.copy(), None if priority is None else priority.copy(), how))
        if step_us < self.best.step_us:
            self.best = Found(step_us, devices.copy(), None if priority is None else priority.copy(), how)
            previous = self.shown_us
            if step_us < previous * 0.999:   # log gains of 0.1% or more
                self.shown_us = step_us
                gain = f" ({(1 - step_us / previous) * 100:.2f}% better)" if math.isfinite(previous) else ""
                log.debug("eval %5d  best %10.3f ms  by %s%s", self.evals, step_us / 1e3, how, gain)
            return True
        return False
