"""The classic bounds: the critical path, the path with communication delays, work over devices, the
largest colocation group."""

from __future__ import annotations

import numpy as np
from scipy import optimize, sparse

from devplace.bounds.relaxation import Relaxation, _longest_paths


def critical_path_us(graph, rel: Relaxation) -> float:
    """The longest path, each op at its fastest time and each always-cut edge at its cut cost.

    Proof: along a path, each op starts no earlier than its predecessor's finish, plus the
    transfer when the edge is cut (F2), and runs at least its fastest time (F1, F3); an edge whose
    units fit on no device together is cut in every valid placement (F3, F4)."""
    edge_us = np.where(rel.forced_cut, rel.cut_us, 0.0)
    return float(_longest_paths(graph, rel.fastest_us, edge_us)[0].max(initial=0.0))


def comm_path_us(rel: Relaxation) -> float:
    """The longest path once joins and forks pay for running their neighbours side by side, and
    joins for the branches from their forks: the largest, over ops j, of head_j + p_j + tail_j
    (``comm_windows``, raised by ``fork_join_windows``).

    This is the classic bound for scheduling with communication delays on unboundedly many
    processors without duplication (Chrétienne & Picouleau, "Scheduling with communication delays:
    a survey", 1995; Colin & Chrétienne, "C.P.M. scheduling with small communication delays and
    task duplication", 1991), with the one-machine bound of the predecessors kept local.

    Proof: ``comm_windows`` and ``fork_join_windows`` prove head_j <= start(j) and tail_j <= step -
    finish(j) in every valid placement and priority, and j runs at least p_j (F1, F3) in between."""
    start_us, after_us = rel.head_us, rel.tail_us
    return float((start_us + rel.fastest_us + after_us).max(initial=0.0))


def work_us(rel: Relaxation) -> float:
    """The least T such that the units can be spread, fractionally, over the devices they are
    allowed on, with each device's share of compute at most T: the work / devices bound for
    devices of different speeds and memories (with one kind and ample memory, total work / devices).

    Proof: a valid placement is such a spread with whole units; each device's compute time (F1)
    is at most the step time since it runs one op at a time inside the step."""
    n_units, n_dev = rel.allowed.shape
    if n_units == 0:
        return 0.0
    load = np.zeros((n_units, n_dev))
    np.add.at(load, rel.unit, rel.op_time_us)
    # variables: y[u, d] (row-major), then T. Rows: sum_d y[u, d] = 1; sum_u load y[u, d] - T <= 0
    n_var = n_units * n_dev
    units = np.repeat(np.arange(n_units), n_dev)
    a_eq = sparse.csr_array((np.ones(n_var), (units, np.arange(n_var))), shape=(n_units, n_var + 1))
    devices = np.tile(np.arange(n_dev), n_units)
    a_ub = sparse.csr_array(
        (np.concatenate([load.ravel(), -np.ones(n_dev)]),
         (np.concatenate([devices, np.arange(n_dev)]), np.concatenate([np.arange(n_var), np.full(n_dev, n_var)]))),
        shape=(n_dev, n_var + 1))
    upper = np.append(np.where(rel.allowed, 1.0, 0.0).ravel(), np.inf)
    cost = np.zeros(n_var + 1)
    cost[-1] = 1.0
    result = optimize.linprog(cost, A_ub=a_ub, b_ub=np.zeros(n_dev), A_eq=a_eq, b_eq=np.ones(n_units),
                              bounds=np.column_stack([np.zeros(n_var + 1), upper]), method="highs")
    # the LP is feasible (every unit is allowed somewhere) and bounded below by 0
    return float(result.fun)


def largest_group_us(rel: Relaxation) -> float:
    """The largest compute time of one unit on its fastest allowed device.

    Proof: a unit's ops all run on one device (F4), one at a time (F1)."""
    n_units = rel.allowed.shape[0]
    load = np.zeros((n_units, rel.op_time_us.shape[1]))
    np.add.at(load, rel.unit, rel.op_time_us)
    return float(np.where(rel.allowed, load, np.inf).min(axis=1).max(initial=0.0))
