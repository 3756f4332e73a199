"""Baseline: min-cut partitioning with METIS, the papers' "Scotch" / "MinCut" baseline.

Colocation groups are contracted first, so METIS sees one vertex per group (or lone op) with two
weights, compute time (mean over the cluster's devices) and memory (persistent + output + temp
bytes), and balances both across the D parts while cutting as little transfer time as it can
(edge weight: the mean transfer time of the edges between the two vertices).

A vertex is a forward op with the backward and update ops that follow it (``leader_units``), joined
with its colocation groups; an inference graph has one vertex per op or group.

METIS partitions an undirected graph, so data can flow part A -> B -> A, a cycle between devices
that serialises the step. The parts are therefore put in order (by the topological ranks of their
forward ops) and repaired until no edge of the forward pass goes from a later part to an earlier
one: by moving a vertex to the latest part among its predecessors (or pulling it to the earliest
among its successors), or by cutting the step order into balanced contiguous blocks where
METIS's parts change (``repair_candidates``). Forward transfers then go forward in that order and
gradients come back the other way, as in a pipeline. Part k (in that order) goes to device k.
Of the candidates, one that fits memory in simulation wins over one that does not, then one whose
heaviest part is within ``REPAIR_BALANCE_SLACK`` of METIS's heaviest, then the fastest simulated.

The repair used to order every edge, backward ones included: on a training step, where gradients
flow back through the layers, it then pulled all but a few ops onto one device. ``acyclic=False``
keeps METIS's raw parts (the op graph is still a DAG, so the simulator runs either).

>>> from devplace.graph import GraphBuilder
>>> from devplace.cluster import uniform_cluster
>>> b = GraphBuilder(["gpu"])
>>> for chain in "ab":
...     for i in range(20):
...         _ = b.add_op(f"{chain}{i}", compute_us=1.0)
...         if i:
...             b.add_edge(f"{chain}{i - 1}", f"{chain}{i}", bytes=1e6)
>>> devices = place(b.build(), uniform_cluster(2)).devices
>>> sorted(set(devices[:20].tolist())), sorted(set(devices[20:].tolist())), bool(devices[0] != devices[20])
([0], [1], True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pymetis

from devplace.graph import Role
from devplace.placement import Placement
from devplace.placers import register
from devplace.placers.options import option
from devplace.placers._listsched import mean_edge_us, op_times_us
from devplace.placers._moves import leader_units
from devplace.sim import Simulator

_WEIGHT_SCALE = 1_000_000   # METIS wants integers: each weight kind is scaled to this total


def _integer_weights(values: np.ndarray) -> np.ndarray:
    total = values.sum()
    if total <= 0:
        return np.ones(len(values), dtype=np.int64)
    return np.rint(values * (_WEIGHT_SCALE / total)).astype(np.int64)


def metis_parts(graph, cluster, units: np.ndarray, *, seed: int = 0, imbalance: float = 0.05) -> np.ndarray:
    """A METIS part (0..D-1) per unit, balancing compute and memory, cutting transfer time."""
    n_units = int(units.max()) + 1
    d = cluster.n_devices
    if d == 1 or n_units <= 1:
        return np.zeros(n_units, dtype=np.int64)
    compute = np.bincount(units, weights=op_times_us(graph, cluster).mean(axis=1), minlength=n_units)
    memory = np.bincount(units, weights=graph.persistent_bytes + graph.output_bytes + graph.temp_bytes,
                         minlength=n_units)
    a, b = units[graph.edge_src], units[graph.edge_dst]
    cross = a != b
    cost = mean_edge_us(graph, cluster)[cross]
    lo, hi = np.minimum(a[cross], b[cross]), np.maximum(a[cross], b[cross])
    key, inverse = np.unique(lo * n_units + hi, return_inverse=True)
    pair_cost = np.bincount(inverse, weights=cost, minlength=len(key))
    pair_weight = np.maximum(1, _integer_weights(pair_cost))
    ends_a, ends_b = key // n_units, key % n_units
    # symmetric CSR
    rows = np.concatenate([ends_a, ends_b])
    cols = np.concatenate([ends_b, ends_a])
    wts = np.concatenate([pair_weight, pair_weight])
    order = np.argsort(rows, kind="stable")
    xadj = np.zeros(n_units + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_units), out=xadj[1:])
    adjacency = pymetis.CSRAdjacency(xadj.tolist(), cols[order].tolist())
    eweights = wts[order].tolist()
    options = pymetis.Options(seed=int(seed) % (2**31), ufactor=max(1, int(imbalance * 1000)))

    # METIS's two-constraint mode can give up on balance (resnet50 here: one part with 3x the mean
    # of both); also try one constraint of the two shares summed, and keep the most balanced.
    kinds = [k for k in (compute, memory) if k.sum() > 0] or [np.ones(n_units)]
    shares = [k / k.sum() for k in kinds]
    candidates = [np.stack([_integer_weights(k) for k in kinds], axis=1).ravel(), _integer_weights(sum(shares))]
    best = None
    for vweights in candidates:
        result = pymetis.part_graph(d, adjacency, vweights=vweights.tolist(), eweights=eweights, options=options)
        part = np.asarray(result.vertex_part, dtype=np.int64)
        worst = max(np.bincount(part, weights=share, minlength=d).max() for share in shares)
        if best is None or (worst, result.edge_cuts) < best[0]:
            best = ((worst, result.edge_cuts), part)
    return best[1]


def _monotone(graph, unit: list, position: list, ordered: np.ndarray, forward: bool) -> list:
    """Push units later (forward) or pull them earlier until no ``ordered`` edge goes from a later
    part back."""
    position = list(position)
    if forward:
        order, ptr, edges = graph.topo_order.tolist(), graph.pred_ptr.tolist(), graph.pred_edge
        other = graph.edge_src[edges]
    else:
        order, ptr, edges = graph.topo_order[::-1].tolist(), graph.succ_ptr.tolist(), graph.succ_edge
        other = graph.edge_dst[edges]
    other = np.where(ordered[edges], other, -1).tolist()   # -1: an edge the repair leaves alone
    sign = 1 if forward else -1
    changed = True
    while changed:
        changed = False
        for v in order:
            uv = unit[v]
            need = sign * position[uv]
            for k in range(ptr[v], ptr[v + 1]):
                if other[k] < 0:
                    continue
                p = sign * position[unit[other[k]]]
                if p > need:
                    need = p
            if need > sign * position[uv]:
                position[uv] = sign * need
                changed = True
    return position


def forward_ops(graph) -> np.ndarray:
    """Ops of the forward pass (role forward or other): the ones whose edges the repair orders."""
    return (graph.role == Role.FORWARD) | (graph.role == Role.OTHER)


REPAIR_BALANCE_SLACK = 0.5   # a balanced repair's heaviest part is at most this much heavier than METIS's
INTERVAL_SLACK = 0.1         # an interval cut may move this share of the total / D off the balanced one


def _heaviest(position: np.ndarray, n_parts: int, weights: list[np.ndarray]) -> float:
    """The largest share of any of ``weights`` (one value per unit) that one part holds."""
    return max(np.bincount(position, weights=w, minlength=n_parts).max() / max(w.sum(), 1e-300) for w in weights)


def step_order(graph, units: np.ndarray) -> np.ndarray:
    """The units in step order: by the first topological rank of their forward ops that have an
    input (a weight, a source, joins its reader's unit without moving it to the start), then of
    their forward ops, then of any op. A layer's backward and update ops sit with its forward ops."""
    n_units = int(units.max()) + 1
    forward = forward_ops(graph)
    rank = graph.topo_rank.astype(np.int64)
    none = np.iinfo(np.int64).max
    key = np.full(n_units, none)
    for ops in (forward & (np.diff(graph.pred_ptr) > 0), forward, np.ones(graph.n_ops, dtype=bool)):
        found = np.full(n_units, none)
        np.minimum.at(found, units[ops], rank[ops])
        key = np.where(key < none, key, found)
    return np.argsort(key, kind="stable")


def interval_positions(order: np.ndarray, initial: np.ndarray, n_parts: int, weight: np.ndarray,
                       slack: float) -> np.ndarray:
    """Cut the units' ``order`` into ``n_parts`` contiguous intervals of about equal ``weight``.

    Cut k may go wherever the weight before it is within ``slack / (2 n_parts)`` of (k + 1) / n_parts
    of the total (else at the nearest place to that); there it goes where fewest units of METIS's
    positions <= k fall after it plus units of positions > k before it."""
    share = weight[order] / max(weight.sum(), 1e-300)
    before = np.concatenate([[0.0], np.cumsum(share)])          # weight before cut c, c = 0..n
    ranked = initial[order]
    position = np.zeros(len(order), dtype=np.int64)
    for k in range(n_parts - 1):
        late = np.concatenate([[0], np.cumsum(ranked > k)])          # units of positions > k before c
        early = np.count_nonzero(ranked <= k) - np.concatenate([[0], np.cumsum(ranked <= k)])
        target = (k + 1) / n_parts
        window = np.flatnonzero(np.abs(before - target) <= slack / (2 * n_parts))
        if len(window) == 0:
            window = np.array([int(np.argmin(np.abs(before - target)))])
        cost = late[window] + early[window]
        cut = int(window[np.lexsort((np.abs(before[window] - target), cost))[0]])
        position[cut:] = k + 1
    out = np.empty_like(position)
    out[order] = position
    return out


def repair_candidates(graph, units: np.ndarray, part: np.ndarray, n_parts: int,
                      weights: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Orders of the parts, each with a repair under which every forward-pass edge goes forward.

    The parts are ordered by the mean, median, first or last topological rank of their forward
    ops. Each order is repaired three ways: by pushing units later, by pulling them earlier, and by
    cutting the step order into balanced contiguous intervals where METIS's parts change
    (``interval_positions``, balanced by the sum of ``weights``' shares), pushed later where a
    forward edge still goes back. Returns (each unit's position before, after) per candidate."""
    forward = forward_ops(graph)
    ordered = forward[graph.edge_src] & forward[graph.edge_dst]
    op_part = part[units]
    rank = graph.topo_rank.astype(float)
    unit = units.tolist()
    order = step_order(graph, units)
    combined = sum(w / max(w.sum(), 1e-300) for w in weights)
    out = []
    for statistic in (np.mean, np.median, np.min, np.max):
        key = np.full(n_parts, np.inf)
        for k in range(n_parts):
            mine = op_part == k
            if (mine & forward).any():
                key[k] = statistic(rank[mine & forward])
            elif mine.any():
                key[k] = statistic(rank[mine])
        position_of_part = np.empty(n_parts, dtype=np.int64)
        position_of_part[np.argsort(key, kind="stable")] = np.arange(n_parts)
        initial = position_of_part[part]
        intervals = interval_positions(order, initial, n_parts, combined, INTERVAL_SLACK)
        for start, push in ((initial, True), (initial, False), (intervals, True)):
            out.append((initial, np.asarray(_monotone(graph, unit, start.tolist(), ordered, push), dtype=np.int64)))
    return out


@dataclass(frozen=True)
class MetisOptions:
    imbalance: float = option(0.05, "load imbalance METIS may leave between parts (0.05: 5%)")
    acyclic: bool = option(True, "repair the partition so that no forward-pass cycle runs between devices")


@register("metis", "METIS min-cut partition balancing compute and memory, repaired so the forward pass is acyclic", MetisOptions)
def place(graph, cluster, *, seed: int = 0, options: MetisOptions = MetisOptions()) -> Placement:
    imbalance, acyclic = options.imbalance, options.acyclic
    units = leader_units(graph, closed=True).unit_of
    part = metis_parts(graph, cluster, units, seed=seed, imbalance=imbalance)
    if not acyclic:
        return Placement(devices=part[units])
    weights = [np.bincount(units, weights=op_times_us(graph, cluster).mean(axis=1)),
               np.bincount(units, weights=graph.persistent_bytes + graph.output_bytes + graph.temp_bytes)]
    n_parts = cluster.n_devices
    allowed = (1 + REPAIR_BALANCE_SLACK) * max(_heaviest(part, n_parts, weights), 1 / n_parts)
    simulator = Simulator(graph, cluster)
    best, seen = None, set()
    for initial, position in repair_candidates(graph, units, part, n_parts, weights):
        if position.tobytes() in seen:
            continue
        seen.add(position.tobytes())
        result = simulator.run(Placement(devices=position[units]))
        moved = int(np.count_nonzero(position != initial))
        score = (not result.fits, _heaviest(position, n_parts, weights) > allowed, result.step_time_us, moved)
        if best is None or score < best[0]:
            best = (score, position, moved)
    return Placement(devices=best[1][units], options={"units_moved_by_repair": best[2]})
