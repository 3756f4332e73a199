"""What every bound knows of a graph on a cluster: the relaxation's arrays, the windows joins and
forks force (here and in ``fork_join``), and the longest paths the path bounds trace."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from devplace.bounds.fork_join import fork_join_windows
from devplace.errors import OutOfMemoryError
from devplace.placers._listsched import op_times_us


@dataclass(frozen=True)
class Relaxation:
    """What every bound (and the exact placer's integer program) knows of a graph on a cluster."""

    op_time_us: np.ndarray     # n_ops x n_devices: compute time + op gap (F1)
    unit: np.ndarray           # per op: its unit, 0..n_units-1
    unit_bytes: np.ndarray     # per unit: persistent bytes of its ops
    allowed: np.ndarray        # n_units x n_devices: the unit fits there on its own (F3)
    footprint: np.ndarray      # n_ops x n_devices: output + temporary bytes while it runs there (F3)
    fastest_us: np.ndarray     # per op: least time over the devices its unit is allowed on
    cut_us: np.ndarray         # per edge: least transfer time across devices its ends may use; inf if never cut
    forced_cut: np.ndarray     # per edge: its two units fit on no device together, so it is always cut
    head_us: np.ndarray        # per op: least start time, joins paying for their neighbours (``comm_windows``)
                               # and for the branches from their forks (``fork_join_windows``)
    tail_us: np.ndarray        # per op: least time from its finish to the step's end, likewise


def relaxation(graph, cluster) -> Relaxation:
    """The facts above as arrays; an OutOfMemoryError if some unit fits on no device at all."""
    time_us = op_times_us(graph, cluster) + cluster.op_gap_us
    group = graph.colocation
    n_groups = len(graph.colocation_names)
    loose = group < 0
    unit = group.copy()
    unit[loose] = n_groups + np.arange(int(loose.sum()))
    _, unit = np.unique(unit, return_inverse=True)     # dense, groups and loose ops interleaved
    n_units = int(unit.max()) + 1 if graph.n_ops else 0
    unit_bytes = np.bincount(unit, weights=graph.persistent_bytes, minlength=n_units)
    capacity = cluster.memory_bytes
    footprint = np.where(time_us > 0, (graph.output_bytes + graph.temp_bytes)[:, None], 0.0)
    largest = np.zeros((n_units, cluster.n_devices))
    np.maximum.at(largest, unit, footprint)
    allowed = unit_bytes[:, None] + largest <= capacity[None, :]
    homeless = np.flatnonzero(~allowed.any(axis=1))
    if len(homeless):
        op = int(np.flatnonzero(unit == homeless[0])[0])
        raise OutOfMemoryError(
            f"op {graph.names[op]!r} (with its colocation group) needs {(unit_bytes + largest.min(axis=1))[homeless[0]] / 2**20:.1f} MiB "
            f"(persistent, plus its largest output and temporaries) but the largest device has {capacity.max() / 2**20:.1f} MiB: "
            f"no placement fits; use larger devices"
        )
    fastest_us = np.where(allowed[unit], time_us, np.inf).min(axis=1)
    src_unit, dst_unit = unit[graph.edge_src], unit[graph.edge_dst]
    cut_us = _cheapest_transfer_us(graph, cluster, allowed[src_unit], allowed[dst_unit])
    cut_us[src_unit == dst_unit] = np.inf
    together = (unit_bytes[src_unit] + unit_bytes[dst_unit])[:, None] <= capacity[None, :]
    together &= allowed[src_unit] & allowed[dst_unit]
    forced_cut = (src_unit != dst_unit) & ~together.any(axis=1)
    head_us, tail_us = windows_us(graph, fastest_us, cut_us, forced_cut)
    return Relaxation(time_us, unit, unit_bytes, allowed, footprint, fastest_us, cut_us, forced_cut, head_us, tail_us)


def windows_us(graph, fastest_us: np.ndarray, cut_us: np.ndarray, forced_cut: np.ndarray) -> tuple:
    """Per op, the head and tail every path bound reads, with the ``forced_cut`` edges always cut:
    ``comm_windows``, raised by ``fork_join_windows``."""
    return fork_join_windows(graph, fastest_us, cut_us, forced_cut, *comm_windows(graph, fastest_us, cut_us, forced_cut))


def _cheapest_transfer_us(graph, cluster, may_src: np.ndarray, may_dst: np.ndarray) -> np.ndarray:
    """Per edge, the least time its transfer takes from a device its producer may use to another
    its consumer may use (F2, F3; ``may_*``: n_edges x n_devices): its fixed time, else the least
    latency + bytes / bandwidth over those links, 0 for a zero-byte edge; inf where no such pair
    exists (a one-device cluster, or both ends allowed on one same device only: never cut)."""
    d = cluster.n_devices
    cost = np.full(graph.n_edges, np.inf)
    off = ~np.eye(d, dtype=bool)
    us_per_byte = 1.0 / cluster.bandwidth_bytes_per_us
    nbytes = graph.edge_bytes
    # edges grouped by which devices their two ends may use: few distinct pairs of rows
    rows, group = np.unique(np.concatenate([may_src, may_dst], axis=1), axis=0, return_inverse=True)
    for g, row in enumerate(rows):
        pairs = row[:d, None] & row[None, d:] & off
        if not pairs.any():
            continue
        edges = np.flatnonzero(np.ravel(group) == g)
        linked = (cluster.latency_us[pairs][None, :] + nbytes[edges, None] * us_per_byte[pairs][None, :]).min(axis=1)
        cost[edges] = np.where(nbytes[edges] > 0, linked, 0.0)
        fixed = graph.edge_fixed_us[edges]
        cost[edges] = np.where(np.isnan(fixed), cost[edges], fixed)
    return cost


def comm_windows(graph, fastest_us: np.ndarray, cut_us: np.ndarray, forced_cut: np.ndarray):
    """Per op j, (head_j, tail_j): a least start time, and a least time from its finish to the
    step's end, where a predecessor (successor) that does not share j's device pays its cheapest
    transfer, and those that share it run one at a time.

    head_j is 0 for a source; otherwise, with each predecessor i's *remote arrival*
    a_i = head_i + p_i + c_i (p: fastest time incl. op gap; c_i: the largest ``crossing_us`` of i's
    edges to j, at least their ``cut_us``; inf when such an edge is never cut, ``Relaxation.cut_us``),
    and for a set K of predecessors
    the one-machine bound L(K) = max over i in K of (head_i + sum of p_k over k in K with
    head_k >= head_i), head_j is the least over K of max(a_i over i not in K, L(K)), at least the
    a_i of every always-cut edge (``forced_cut``; then i is never in K). The least is reached at a
    K made of the predecessors of largest a: a sweep adds them in decreasing a and stops once
    L(K) reaches the next a. tail_j is the same on the reversed graph (successors, tails for heads).

    Proof, by induction in topological order. Take a valid placement and priority, j on device d,
    K its predecessors on d (among them every i whose edge is never cut: of j's unit, F4, or of a
    unit that may only share one device with j's, F3; no always-cut one, F3). Each
    i in K starts no earlier than head_i, runs at least p_i (F1, F3) on d one op at a time, and
    finishes before j starts (j waits for its inputs; on one device an input arrives when its
    producer finishes): as on one machine with release dates, the last of them to finish, among
    those with head_k >= head_i, finishes no earlier than head_i + the sum of their p_k, so
    start(j) >= L(K). Each i not in K is on another device: j's input from it arrives no earlier
    than its finish, at least head_i + p_i, plus c_i: i and j are on different devices, so
    ``crossing_us`` holds for each edge i -> j (F2; channel queues and message overheads only
    delay). So start(j) >= max(a_i over i not in K, L(K)) >= head_j. For any K, the prefix K' of
    the sweep holding every i with a_i above K's largest remote arrival is inside K, so
    L(K') <= L(K) and the sweep's value there is at most K's; once L(K) reaches the next a, adding
    more only raises L. Tails: reversed, a successor on d starts after finish(j) and runs one at a
    time with j's other successors there; one elsewhere starts at least c later; each runs at least
    p and leaves at least its tail after it finishes."""
    p = np.ascontiguousarray(fastest_us, dtype=np.float64)
    cut = crossing_us(graph, p, np.ascontiguousarray(cut_us, dtype=np.float64))
    head = _comm_levels_kernel(graph.topo_order, graph.pred_ptr, graph.pred_edge, graph.edge_src, p, cut,
                               forced_cut)
    tail = _comm_levels_kernel(graph.topo_order[::-1].copy(), graph.succ_ptr, graph.succ_edge, graph.edge_dst,
                               p, cut, forced_cut)
    return head, tail


def crossing_us(graph, fastest_us: np.ndarray, cut_us: np.ndarray) -> np.ndarray:
    """Per edge u -> v, a least time from u's finish to v's start when u and v are on different
    devices: the larger of its cut cost and, over each op w with edges u -> w -> v, p_w + the lesser
    of those two edges' cut costs (an ordering edge of no bytes beside a data path u -> w -> v still
    waits for the data to cross); inf where u and v can only share a device.

    Proof: u off v's device; the edge itself then joins two devices (F2). On a path u -> w -> v one
    of its two edges joins two devices, so w starts no earlier than u's finish, runs at least p_w
    (F1, F3), v starts no earlier than w's finish, and the edge that crosses adds at least its cut
    cost (F2); of parallel edges the transfer lasts as long as the longest."""
    return _crossing_kernel(graph.pred_ptr, graph.pred_edge, graph.edge_src, graph.succ_ptr, graph.succ_edge,
                            graph.edge_dst, np.ascontiguousarray(fastest_us, dtype=np.float64),
                            np.ascontiguousarray(cut_us, dtype=np.float64))


@njit(cache=True)
def _crossing_kernel(pred_ptr, pred_edge, edge_src, succ_ptr, succ_edge, edge_dst, time_us, cut_us):
    n = pred_ptr.shape[0] - 1
    out = cut_us.copy()
    stamp = np.full(n, -1, np.int64)     # stamp[w] == v: w is a predecessor of v, its dearest edge to v is into[w]
    into = np.zeros(n)
    for v in range(n):
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            e = pred_edge[k]
            w = edge_src[e]
            if stamp[w] != v:
                stamp[w], into[w] = v, cut_us[e]
            else:
                into[w] = max(into[w], cut_us[e])
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            e = pred_edge[k]
            u = edge_src[e]
            if out[e] == np.inf:
                continue
            for k2 in range(succ_ptr[u], succ_ptr[u + 1]):
                e2 = succ_edge[k2]
                w = edge_dst[e2]
                if w != v and stamp[w] == v:
                    out[e] = max(out[e], time_us[w] + min(cut_us[e2], into[w]))
    return out


@njit(cache=True)
def _comm_levels_kernel(order, adj_ptr, adj_edge, edge_other, time_us, cut_us, forced_cut):
    """``comm_windows``' heads (neighbours: predecessors, in topological order) or tails
    (successors, in reverse order)."""
    n = time_us.shape[0]
    level = np.zeros(n)
    stamp = np.full(n, -1, np.int64)     # stamp[u] == v: u is already in v's list, at slot[u]
    slot = np.zeros(n, np.int64)
    width = 1
    for v in range(n):
        width = max(width, adj_ptr[v + 1] - adj_ptr[v])
    arrival, release, length = np.empty(width), np.empty(width), np.empty(width)
    forced = np.zeros(width, np.bool_)
    kept_release, kept_length, kept_term = np.empty(width), np.empty(width), np.empty(width)
    for v in order:
        m = 0
        for k in range(adj_ptr[v], adj_ptr[v + 1]):
            e = adj_edge[k]
            u = edge_other[e]
            a = level[u] + time_us[u] + cut_us[e]
            if stamp[u] == v:
                i = slot[u]
                arrival[i] = max(arrival[i], a)
                forced[i] = forced[i] or forced_cut[e]
            else:
                stamp[u] = v
                slot[u] = m
                arrival[m], release[m], length[m], forced[m] = a, level[u], time_us[u], forced_cut[e]
                m += 1
        floor = 0.0
        c = 0
        for i in range(m):
            if forced[i]:
                floor = max(floor, arrival[i])
            else:
                arrival[c], release[c], length[c] = arrival[i], release[i], length[i]
                c += 1
        ranked = np.argsort(-arrival[:c])
        best = np.inf
        kept = 0.0                     # L(K) of the first t of ``ranked``
        for t in range(c + 1):
            following = arrival[ranked[t]] if t < c else 0.0
            best = min(best, max(floor, following, kept))
            if t == c or kept >= following:
                break
            x = ranked[t]
            term = release[x] + length[x]
            for s in range(t):
                if kept_release[s] <= release[x]:
                    kept_term[s] += length[x]
                    kept = max(kept, kept_term[s])
                if kept_release[s] >= release[x]:
                    term += kept_length[s]
            kept_release[t], kept_length[t], kept_term[t] = release[x], length[x], term
            kept = max(kept, term)
        level[v] = best
    return level


@njit(cache=True)
def _longest_paths_kernel(topo_order, pred_ptr, pred_edge, edge_src, node_us, edge_us):
    level = np.zeros(node_us.shape[0])
    parent = np.full(node_us.shape[0], -1, np.int64)    # the in-edge the longest path comes by
    for v in topo_order:
        best = 0.0
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            e = pred_edge[k]
            value = level[edge_src[e]] + edge_us[e]
            if value > best or parent[v] < 0:
                best = value
                parent[v] = e
        level[v] = best + node_us[v]
    return level, parent


def _longest_paths(graph, node_us: np.ndarray, edge_us: np.ndarray):
    """Per op, the longest path ending with it (its own weight included) and the in-edge it comes by."""
    return _longest_paths_kernel(graph.topo_order, graph.pred_ptr, graph.pred_edge, graph.edge_src,
                                 np.ascontiguousarray(node_us, dtype=np.float64),
                                 np.ascontiguousarray(edge_us, dtype=np.float64))


def longest_path(graph, node_us: np.ndarray, edge_us: np.ndarray):
    """The ops and edges, first to last, of a longest path with these op and edge weights (the one
    ending at the highest level)."""
    level, parent = _longest_paths(graph, node_us, edge_us)
    v = int(np.argmax(level))
    ops, edges = [v], []
    while parent[v] >= 0:
        e = int(parent[v])
        edges.append(e)
        v = int(graph.edge_src[e])
        ops.append(v)
    return np.array(ops[::-1], dtype=np.int64), np.array(edges[::-1], dtype=np.int64)
