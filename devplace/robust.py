"""Step times under cost models that may be wrong: is a placement fast only because one estimate is?

The simulator's op times are estimates (roofline for hardware that is not here, profiles taken on
another machine) and so are its link costs (calibrated once, or copied from a data sheet). A
placement that wins by a hair because one link is fast, or one op cheap, may lose on the real
machine. So a placement is also judged under ``n`` *perturbed* cost models, each the nominal model
with every estimate scaled by a random factor, and summarised by the median and worst step time.

The distribution (every factor log-normal with median 1: ``exp(sigma * z)``, ``z`` standard normal):

- **ops**: op ``i`` of kind ``k`` takes ``compute_us[i, :] * exp(op_sigma * z_i + kind_sigma * z_k)``;
  ``z_i`` is the op's own error (one factor for all its device-kind columns: the estimate of that
  op is off), ``z_k`` is shared by every op of one kind (all matmuls' efficiency is off together).
- **links**: each unordered device pair gets a latency factor ``exp(link_sigma * z)`` (also applied
  to the pair's send and receive overheads) and a bandwidth factor: its bandwidth is divided by
  ``exp(link_sigma * z')``, so a factor above 1 is a slower link both ways.
- **fixed-time edges** (graphs that give a transfer time per tensor, not bytes) are scaled by their
  own ``exp(link_sigma * z_e)``: such a time is a link estimate for that tensor alone.

With the defaults (0.2 per op, 0.1 per op kind, 0.3 per link) 90% of op factors fall within
about 0.69-1.44 and of link factors within 0.61-1.64. Model ``j`` draws from the generator
seeded ``(seed, j)`` and draws every ``z`` whatever the sigmas, so the first ``m`` of ``n`` models
are the ``m`` models asked for alone, and a sigma of 0 leaves the nominal figure exactly. A search
that optimizes over perturbed models draws them further along the stream (``SEARCH_FIRST``), so an
evaluation with the same seed judges its placement on models it has not seen.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> g, c = chain_graph([10.0, 20.0, 30.0], edge_bytes=1e4), uniform_cluster(2)
>>> times = robust_step_times(g, c, [0, 1, 0], perturbed_models(g, c, 8, seed=0))
>>> times.worst_us >= times.median_us, len(times.all_us)
(True, 8)
>>> nominal = robust_step_times(g, c, [0, 1, 0], perturbed_models(g, c, 2, 0, op_sigma=0, kind_sigma=0, link_sigma=0))
>>> nominal.all_us.tolist()
[62.0, 62.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from devplace.cluster import Cluster
from devplace.costing import costed_for
from devplace.errors import DevplaceError
from devplace.graph import OpGraph
from devplace.placement import as_placement
from devplace.sim.simulator import Simulator

OP_SIGMA = 0.2
KIND_SIGMA = 0.1
LINK_SIGMA = 0.3
MAX_SIGMA = 3.0     # exp(3 z) already spans a factor of 10^4 at z = +-1.5: beyond it a cost model says nothing
MAX_MODELS = 100_000
SEARCH_FIRST = MAX_MODELS  # where a search's models start in the stream: after every model an evaluation draws


@dataclass(frozen=True, eq=False)
class CostModel:
    """One perturbed cost model: the graph with scaled op and fixed edge times, the cluster with
    scaled links (both frozen, derived from the nominal pair)."""

    graph: OpGraph
    cluster: Cluster


@dataclass(frozen=True)
class RobustTimes:
    """A placement's step time under each cost model (``all_us``, in model order) and its summary."""

    median_us: float
    worst_us: float
    all_us: np.ndarray

    @property
    def mean_us(self) -> float:
        return float(self.all_us.mean())


def check_sigma(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and 0 <= value <= MAX_SIGMA):
        raise DevplaceError(f"{name} = {value!r}: a perturbation's sigma must be a number from 0 to {MAX_SIGMA:g} "
                            f"(0: that estimate is exact; 0.2: 90% of factors within 0.72-1.39)")
    return float(value)


def check_count(name: str, n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_MODELS:
        raise DevplaceError(f"{name} = {n!r}: give a whole number of perturbed cost models from 0 to {MAX_MODELS}")
    return int(n)


def perturbed_models(graph: OpGraph, cluster: Cluster, n: int, seed: int = 0, *, op_sigma: float = OP_SIGMA,
                     link_sigma: float = LINK_SIGMA, kind_sigma: float = KIND_SIGMA, first: int = 0) -> list[CostModel]:
    """Models ``first`` to ``first + n - 1`` of the stream the module docstring describes, model ``j``
    from the seed ``(seed, j)``. A search scores with models from ``first=SEARCH_FIRST`` on, so that
    an evaluation with the same seed (``first=0``, at most ``MAX_MODELS``) never sees them."""
    n = check_count("the number of models", n)
    if isinstance(first, bool) or not isinstance(first, (int, np.integer)) or first < 0:
        raise DevplaceError(f"first = {first!r}: the first model's number must be a whole number >= 0")
    op_sigma, link_sigma, kind_sigma = (check_sigma(name, value) for name, value in (
        ("op_sigma", op_sigma), ("link_sigma", link_sigma), ("kind_sigma", kind_sigma)))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise DevplaceError(f"seed = {seed!r}: the perturbation seed must be a whole number from 0 to 2**63-1")
    graph = costed_for(graph, cluster)  # perturb the times this cluster's devices would have
    kinds, kind_of_op = np.unique(np.asarray(graph.kinds, dtype=object), return_inverse=True)
    d = cluster.n_devices
    upper = np.triu_indices(d, 1)
    fixed = ~np.isnan(graph.edge_fixed_us)
    models = []
    for j in range(first, first + n):
        rng = np.random.default_rng([int(seed), j])
        z_op, z_kind = rng.standard_normal(graph.n_ops), rng.standard_normal(len(kinds))
        z_latency, z_bandwidth = rng.standard_normal((2, len(upper[0])))
        z_edge = rng.standard_normal(graph.n_edges)
        op_factor = np.exp(op_sigma * z_op + kind_sigma * z_kind[kind_of_op])
        edge_fixed_us = graph.edge_fixed_us.copy()
        edge_fixed_us[fixed] *= np.exp(link_sigma * z_edge[fixed])
        models.append(CostModel(
            graph=replace(graph, compute_us=graph.compute_us * op_factor[:, None], edge_fixed_us=edge_fixed_us),
            cluster=_scaled_links(cluster, upper, np.exp(link_sigma * z_latency), np.exp(link_sigma * z_bandwidth)),
        ))
    return models


def _scaled_links(cluster: Cluster, upper, latency_factor: np.ndarray, slowdown: np.ndarray) -> Cluster:
    """``cluster`` with each unordered pair's latency and overheads times its latency factor and its
    bandwidth divided by its slowdown (the same both ways)."""
    def symmetric(values: np.ndarray) -> np.ndarray:
        full = np.ones((cluster.n_devices, cluster.n_devices))
        full[upper] = values
        full.T[upper] = values
        return full

    latency = symmetric(latency_factor)
    return replace(cluster, latency_us=cluster.latency_us * latency,
                   bandwidth_bytes_per_us=cluster.bandwidth_bytes_per_us / symmetric(slowdown),
                   send_overhead_us=cluster.send_overhead_us * latency,
                   recv_overhead_us=cluster.recv_overhead_us * latency)


def robust_step_times(graph: OpGraph, cluster: Cluster, placement, models: Sequence[CostModel]) -> RobustTimes:
    """The step time of ``placement`` (a Placement or a device per op) under each of ``models``,
    which ``perturbed_models(graph, cluster, ...)`` made; memory is not re-checked (no model
    changes a byte)."""
    if not models:
        raise DevplaceError("robust step times need at least one perturbed cost model (n >= 1)")
    placement = as_placement(placement, graph)
    placement.check(graph, cluster)
    for model in models:
        if model.graph.n_ops != graph.n_ops or model.cluster.n_devices != cluster.n_devices:
            raise DevplaceError(
                f"a perturbed cost model has {model.graph.n_ops} ops on {model.cluster.n_devices} devices, the "
                f"graph {graph.n_ops} ops on {cluster.n_devices}: draw the models from this graph and cluster")
    times = np.array([Simulator(m.graph, m.cluster).step_time_us(placement.devices, placement.priority)
                      for m in models])
    return RobustTimes(median_us=float(np.median(times)), worst_us=float(times.max()), all_us=times)


def ranks(values: Sequence[float | None]) -> list[int | None]:
    """1 for the smallest value, ties sharing the better rank; None stays None (no placement)."""
    known = sorted(v for v in values if v is not None and math.isfinite(v))
    return [None if v is None or not math.isfinite(v) else known.index(v) + 1 for v in values]
