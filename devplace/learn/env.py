"""The environment of every learning placer: a batch of unit placements in, simulated outcomes out.

A policy places *units* (groups of ops that move whole, so a colocation group is never split);
``PlacementEnv.evaluate`` expands each row of unit devices to one device per op and simulates it:
the step time, the peak memory of each device and whether any device overflows. When even the
whole step fits on every device, memory cannot overflow and only the step time is simulated (the
simulator's fast path); otherwise each placement is simulated with its memory timeline.

``Reward`` turns outcomes into the papers' signal. ColocRL ("Device Placement Optimization with
Reinforcement Learning", ICML 2017) and the Hierarchical Planner ("A Hierarchical Model for Device
Placement", ICLR 2018) learn from the square root of the step time in seconds, and score a
placement that does not fit as a failing one: 100 s in the Hierarchical Planner's public code. With
``oom_penalty_s_per_gib`` > 0 an overflowing placement instead costs its step time plus that many
seconds per GiB over, a graded signal that still points towards fitting.

``orders`` are the schedule orders a placement is simulated in: ``topological`` (the simulator's
default, the only one by default: the papers leave the order to the framework's runtime) and
``upward-rank`` (longest remaining path of the placement itself first, as HEFT and sim-search order
ops); with both, each placement scores the faster (a fitting one before one that overflows), and
``order_of`` gives that order's priority so the returned placement carries it. devplace's choice:
sim-search searches the order too, and on GNMT-4 its devices alone, in the topological order, are
20% slower than with its order (benchmarks/rounds/learning-placers.md, round 4).

``carried`` (option carry_order, devplace's variant; the papers have no such thing): a priority
each placement of a batch is also simulated in, the order of the best placement so far, as
sim-search keeps its current order for every move and replaces it only when a placement's own
order is faster. An order found for one placement often suits its neighbours better than their
own upward-rank order (RNNLM: sim-search's devices are 116.35 ms in their own orders, 108.10 in
the order its search carried to them).

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> env = PlacementEnv(chain_graph([10.0, 20.0]), uniform_cluster(2), np.array([0, 1]))
>>> env.evaluate(np.array([[0, 0], [0, 1]])).step_us.tolist()
[30.0, 30.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.errors import DevplaceError
from devplace.placement import Placement
from devplace.placers._moves import upward_rank_us
from devplace.sim import IncrementalSimulator, Simulator

GIB = 2**30
ORDERS = ("topological", "upward-rank")


@dataclass
class Outcomes:
    """What the simulator says of a batch of K placements."""

    step_us: np.ndarray             # (K,) simulated step time
    peak_memory_bytes: np.ndarray   # (K, devices) simulated peak; the sum of what its ops hold when memory is ample
    oom: np.ndarray                 # (K,) some device overflows
    over_bytes: np.ndarray          # (K,) bytes over capacity, summed over devices

    @classmethod
    def concatenate(cls, parts: "list[Outcomes]") -> "Outcomes":
        return cls(*(np.concatenate([getattr(p, name) for p in parts])
                     for name in ("step_us", "peak_memory_bytes", "oom", "over_bytes")))


class PlacementEnv:
    """A graph, a cluster and the units a policy places (``unit_of``: per op, its unit 0..U-1)."""

    def __init__(self, graph, cluster, unit_of: np.ndarray, orders: tuple[str, ...] = ("topological",)):
        unknown = [o for o in orders if o not in ORDERS]
        if unknown or not orders:
            raise DevplaceError(f"schedule orders {', '.join(unknown) or '(none)'}: use one or more of "
                                f"{', '.join(ORDERS)}")
        self.graph, self.cluster, self.orders = graph, cluster, tuple(orders)
        self.unit_of = np.ascontiguousarray(unit_of, dtype=np.int64)
        self.n_units = int(self.unit_of.max()) + 1 if len(self.unit_of) else 0
        self.sim = Simulator(graph, cluster)
        self._need_bytes = graph.persistent_bytes + graph.output_bytes + graph.temp_bytes
        self.memory_is_ample = float(self._need_bytes.sum()) <= float(cluster.memory_bytes.min())
        self._unit_ops = np.argsort(self.unit_of, kind="stable")   # unit i's ops: _unit_ops[ptr[i]:ptr[i + 1]]
        self._unit_ptr = np.searchsorted(self.unit_of[self._unit_ops], np.arange(self.n_units + 1))

    def expand(self, unit_devices: np.ndarray) -> np.ndarray:
        """(K, U) devices per unit -> (K, ops) devices per op."""
        return np.ascontiguousarray(np.asarray(unit_devices, dtype=np.int64)[:, self.unit_of])

    def evaluate(self, unit_devices: np.ndarray, carried: np.ndarray | None = None) -> Outcomes:
        """Each row scored in the fastest of ``orders`` and, if given, the ``carried`` priority (per op)."""
        devices = self.expand(unit_devices)
        k, n_dev = len(devices), self.cluster.n_devices
        step = np.empty(k)
        peak = np.empty((k, n_dev))
        for i, row in enumerate(devices):
            step[i], peak[i], _ = self._fastest_order(row, carried)
        return self._outcomes(step, peak)

    def order_of(self, devices: np.ndarray, carried: np.ndarray | None = None) -> np.ndarray | None:
        """The priority (None: topological) of the order ``evaluate`` scores this per-op placement in (with
        ``carried``: that priority when it is the fastest, so a carried order stays until one beats it)."""
        return self._fastest_order(np.ascontiguousarray(devices, dtype=np.int64), carried)[2]

    def _fastest_order(self, devices: np.ndarray, carried: np.ndarray | None) -> tuple[float, np.ndarray,
                                                                                          np.ndarray | None]:
        """(step time, peak per device, priority) in the fastest of ``orders`` and ``carried``, one that fits
        first (a tie keeps the placement's own order)."""
        priorities = [None if order == "topological" else -upward_rank_us(self.graph, self.cluster, devices,
                                                                          self.sim.op_time_us)
                      for order in self.orders] + ([] if carried is None else [carried])
        best = None
        for priority in priorities:
            if self.memory_is_ample:
                step, peak = self.sim.step_time_us(devices, priority), self._ample_peak(devices)
            else:
                result = self.sim.run(devices if priority is None else Placement(devices=devices, priority=priority))
                step, peak = result.step_time_us, result.peak_memory_bytes
            key = (bool((peak > self.cluster.memory_bytes).any()), step)
            if best is None or key < best[0]:
                best = (key, step, peak, priority)
        return best[1], best[2], best[3]

    def incremental(self, unit_devices: np.ndarray) -> IncrementalSimulator:
        """A run of one placement (U devices per unit) that ``move_unit`` changes a unit at a time."""
        return IncrementalSimulator(self.graph, self.cluster, self.expand(np.asarray(unit_devices)[None])[0])

    def move_unit(self, incremental: IncrementalSimulator, unit: int, device: int) -> Outcomes:
        """Move ``unit`` to ``device`` in ``incremental`` and give what ``evaluate`` gives of its placement
        (the same floats), re-simulating only from where the move can change the step."""
        lo, hi = self._unit_ptr[unit], self._unit_ptr[unit + 1]
        step = incremental.move(self._unit_ops[lo:hi], device)
        if self.memory_is_ample:
            peak = self._ample_peak(incremental.devices)
        else:
            peak = incremental.peak_memory_bytes
        return self._outcomes(np.array([step]), peak[None])

    def _ample_peak(self, devices: np.ndarray) -> np.ndarray:
        return np.bincount(devices, weights=self._need_bytes, minlength=self.cluster.n_devices)

    def _outcomes(self, step: np.ndarray, peak: np.ndarray) -> Outcomes:
        over = np.maximum(peak - self.cluster.memory_bytes, 0.0).sum(axis=1)
        return Outcomes(step_us=step, peak_memory_bytes=peak, oom=over > 0, over_bytes=over)


@dataclass(frozen=True)
class Reward:
    """The papers' reward: minus the square root of the step time in seconds (failing placements get
    ``failing_step_s``, or with ``oom_penalty_s_per_gib`` > 0 their step time plus that per GiB over)."""

    failing_step_s: float = 100.0
    oom_penalty_s_per_gib: float = 0.0

    def cost_s(self, outcomes: Outcomes) -> np.ndarray:
        step_s = outcomes.step_us / 1e6
        if self.oom_penalty_s_per_gib > 0:
            failing = step_s + self.oom_penalty_s_per_gib * outcomes.over_bytes / GIB
        else:
            failing = np.full_like(step_s, self.failing_step_s)
        return np.where(outcomes.oom, failing, step_s)

    def __call__(self, outcomes: Outcomes) -> np.ndarray:
        return -np.sqrt(self.cost_s(outcomes))
