"""What splitting a graph costs: either a dear edge is cut, or the clusters the dear edges bind run
whole on one device (and their ops one at a time)."""

from __future__ import annotations

import numpy as np
from numba import njit
from scipy import sparse
from scipy.sparse import csgraph

from devplace.bounds.relaxation import Relaxation


def cut_threshold_us(graph, cluster, rel: Relaxation) -> float:
    """Either some costly edge is cut, or the edges cheaper to keep than that bind ops into
    clusters, each run whole on one device: the larger the transfers, the closer to one device.

    An edge u -> v's *through time* is u's least finish, plus the edge's cut cost, plus v's least
    time from its start to the step's end (``comm_windows``: head_u + p_u and p_v + tail_v; inf
    inside a unit). For a threshold t, the *t-clusters*
    are the units joined by the edges of through time above t, and *largest(t)* is the largest,
    over t-clusters, of its least total time on a device that can hold it (its units' persistent
    bytes plus any one op's output and temporaries; inf if none can). The bound is the least, over
    t in the edges' through times and 0, of max(t, largest(t)): a sweep that adds edges in
    decreasing through time to a union-find.

    Proof: take a valid placement and let t be the largest through time of an edge it cuts (0 if
    it cuts none). For a cut edge u -> v, u finishes no earlier than head_u + p_u, v starts no
    earlier than that plus the edge's transfer (F2), and the step ends no earlier than v's start
    plus p_v + tail_v (``comm_windows``): the step is at least t. No edge of through time above t is cut, so each
    t-cluster sits on one device (units already do, F4); that device holds the cluster's
    persistent bytes and, when each op starts, its output and temporaries (F3), and runs its ops
    one at a time (F1): the step is at least largest(t)."""
    if graph.n_ops == 0:
        return 0.0
    start_us, after_us = rel.head_us, rel.tail_us
    finish_us, remaining_us = start_us + rel.fastest_us, rel.fastest_us + after_us
    through = finish_us[graph.edge_src] + rel.cut_us + remaining_us[graph.edge_dst]    # inf inside a unit
    n_units, n_dev = rel.allowed.shape
    unit_time = np.zeros((n_units, n_dev))
    np.add.at(unit_time, rel.unit, rel.op_time_us)
    unit_footprint = np.zeros((n_units, n_dev))
    np.maximum.at(unit_footprint, rel.unit, rel.footprint)
    return float(_cut_threshold_kernel(rel.unit[graph.edge_src], rel.unit[graph.edge_dst], through, unit_time,
                                       rel.unit_bytes.astype(np.float64), unit_footprint,
                                       cluster.memory_bytes.astype(np.float64)))


def cluster_order_us(graph, rel: Relaxation) -> float:
    """The ops that dear transfers keep on one device run there one at a time, each inside its
    window: ``cut_threshold_us``' clusters, charged with their heads and tails.

    For a trial step time C, the *C-clusters* are the units joined by the edges whose through time
    (``cut_threshold_us``: head_u + p_u + cut cost + p_v + tail_v; inf inside a unit) is above C.
    C *fails* a cluster S when, for a threshold R among its ops' heads (or Q among their tails),
    the ops j of S with head_j >= R (tail_j >= Q) have R + their total fastest time + the least
    tail among them > C (least head + total + Q > C). The bound is the largest C found to fail some
    cluster (bisection; failing is monotone, below), or ``comm_path_us``. Where the gradient of a
    weight is summed over many steps through edges too dear to cut, the sum runs on one device
    after the steps' backward has begun, which neither the critical path nor work / devices sees.

    Proof: take a valid placement and priority with step time T <= C. An edge of through time
    above C is not cut: if it were, its consumer would start no earlier than head_u + p_u + its
    transfer (F2) and the step would end no earlier than its through time > C (as in
    ``cut_threshold_us``). So each C-cluster sits on one device (units already do, F4), which
    runs one op at a time, never preempted (F1). Op j starts no earlier than head_j and runs at
    least p_j (F1, F3), and finishes no later than T - tail_j <= C - tail_j (``comm_windows``). The
    ops of S with head_j >= R all run inside [R, C - min tail], one after the other, so their total
    is at most C - R - min tail; likewise with tails. A failing C therefore has T > C for every
    valid placement and priority. Monotone: a smaller C joins more units (every edge above C is
    above a smaller C), each cluster a union of the larger C's, whose subsets keep their sums, and
    the test compares with a smaller C; so the largest failing C is found by bisection."""
    if graph.n_ops == 0:
        return 0.0
    p, head, tail = rel.fastest_us, rel.head_us, rel.tail_us
    lo = float((head + p + tail).max())        # ``comm_path_us``
    through = head[graph.edge_src] + p[graph.edge_src] + rel.cut_us + p[graph.edge_dst] + tail[graph.edge_dst]
    timed = p > 0
    n_units = rel.allowed.shape[0]

    def fails(c_us: float) -> bool:
        keep = through > c_us
        joins = sparse.coo_array((np.ones(int(keep.sum())), (rel.unit[graph.edge_src[keep]],
                                                             rel.unit[graph.edge_dst[keep]])),
                                 shape=(n_units, n_units))
        _, cluster = csgraph.connected_components(joins, directed=False)
        of_op = cluster[rel.unit][timed]
        return max(_sequence_us(of_op, head[timed], p[timed], tail[timed]),
                   _sequence_us(of_op, tail[timed], p[timed], head[timed])) > c_us * (1 + 1e-9)

    if not timed.any() or not fails(lo):      # no op takes time: nothing runs in turn
        return lo
    hi = 2 * lo + float(p.sum())
    while hi - lo > 1e-7 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fails(mid) else (lo, mid)
    return lo


def _sequence_us(cluster: np.ndarray, first_us: np.ndarray, p: np.ndarray, last_us: np.ndarray) -> float:
    """max over clusters and their ops k of first_k + the total p of the cluster's ops j with
    first_j >= first_k + the least last_j among them: the one-device bound of ``cluster_order_us``."""
    order = np.lexsort((-first_us, cluster))      # per cluster, latest first
    c, f, w, l = cluster[order], first_us[order], p[order], last_us[order]
    new = np.ones(len(c), dtype=bool)
    new[1:] = c[1:] != c[:-1]
    starts = np.flatnonzero(new)
    total = np.cumsum(w)
    total -= np.repeat(total[starts] - w[starts], np.diff(np.append(starts, len(c))))
    least = _group_running_min(l, new)
    # ops with equal first: the last of them in this order counts them all
    same = np.append((f[1:] == f[:-1]) & ~new[1:], False)
    return float((f + total + least)[~same].max())


@njit(cache=True)
def _group_running_min(values, new):
    out = np.empty_like(values)
    for i in range(values.shape[0]):
        out[i] = values[i] if new[i] else min(out[i - 1], values[i])
    return out


@njit(cache=True)
def _cluster_us(time_us, held, footprint, capacity):
    """Least time of a cluster over the devices that can hold it (inf if none)."""
    best = np.inf
    for d in range(time_us.shape[0]):
        if held + footprint[d] <= capacity[d] and time_us[d] < best:
            best = time_us[d]
    return best


@njit(cache=True)
def _cut_threshold_kernel(src_unit, dst_unit, through, time_us, held, footprint, capacity):
    n = time_us.shape[0]
    time_us, held, footprint = time_us.copy(), held.copy(), footprint.copy()   # per root, merged
    parent = np.arange(n)
    largest = 0.0
    for u in range(n):
        largest = max(largest, _cluster_us(time_us[u], held[u], footprint[u], capacity))
    best = np.inf
    order = np.argsort(-through, kind="mergesort")
    i = 0
    while i < order.shape[0]:
        t = through[order[i]]
        if np.isfinite(t):
            best = min(best, max(t, largest))     # placements whose costliest cut edge has through time t
        while i < order.shape[0] and through[order[i]] == t:   # for the larger t still to come, kept
            e = order[i]
            i += 1
            a, b = src_unit[e], dst_unit[e]
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            while parent[b] != b:
                parent[b] = parent[parent[b]]
                b = parent[b]
            if a == b:
                continue
            parent[a] = b
            time_us[b] += time_us[a]
            held[b] += held[a]
            footprint[b] = np.maximum(footprint[b], footprint[a])
            largest = max(largest, _cluster_us(time_us[b], held[b], footprint[b], capacity))
    return min(best, largest)     # placements that cut no edge
