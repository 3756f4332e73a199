"""A heavy tensor's consumers stay on its device or pay its transfer: interval work in which the ops
a weight's dear edges bind fill the weight's device no more than each interval's length, and those
that leave it start (or end) a transfer later."""

from __future__ import annotations

import numpy as np
from numba import njit
from scipy import sparse
from scipy.sparse import csgraph

from devplace.bounds.relaxation import Relaxation


def home_or_transfer_us(graph, cluster, rel: Relaxation, min_cut_share: float = 0.05, max_ends: int = 24) -> float:
    """Interval work (``interval_work_us``) where each *tensor group* pays the least of keeping its
    ops on its home device and sending them its tensors.

    An edge is *dear* when its cut cost is finite and at least ``min_cut_share`` of the comm path
    (head + p + tail, at most). A tensor group is a connected set of ops joined by dear edges and by
    units (colocation groups), holding at least two units; its *home* is its unit with the most
    persistent bytes (a weight with its optimizer state). An op of a group outside its home unit is
    *away* in a placement when it is not on the home unit's device. Its *away head* is the largest
    of its head and, over each edge u -> v of the group into it, head_u + p_u + the edge's cut cost
    if u is of the home unit, else the least of that and u's away head + p_u; its *away tail* is
    the same reversed. For a trial step C and an interval [t1, t2] of length L, an op's least
    overlap in a window is ``interval_work_us``': max(0, min(L, p, head + p - t1, t2 - (C - tail) + p)),
    h_j in [head_j, C - tail_j], a_j in its away window (inf when the away window is shorter than
    p_j: the op cannot be away). C *fails* the interval when the ops outside groups, plus per group
    the least over its *home sets* H (the home unit's ops and any others, the home unit's and H's
    h_j adding up to at most L) of the sum of h_j over H and a_j over the rest, add up to more than
    m L, m the number of devices. That least is bounded from below by the fractional knapsack
    (moving the ops of the largest (a_j - h_j) / h_j home first, up to L). The bound is the largest
    C found to fail some checked interval, by bisection from the comm path: t1 among the ops'
    heads, earliest finishes and away heads, t2 among their latest finishes, away latest finishes
    and earliest finishes, up to ``max_ends`` of each, evenly spread over their sorted values.

    Proof: take a valid placement and priority with step T <= C, and a group with home device d (its
    home unit's device, F4). An op j runs inside [head_j, C - tail_j] for at least p_j
    (``comm_windows``, F1, F3). An away op v starts no earlier than its away head: for an edge u -> v
    of the group, u finishes no earlier than head_u + p_u; if the edge is cut, v's input arrives no
    earlier than that plus its transfer, at least the cut cost (F2; an edge that is never cut has
    cost inf); if it is not cut, u shares v's device, which is not d, so u is away too (a home-unit
    op is on d: its edge to v is cut) and, by induction in topological order, starts no earlier than
    its away head and runs at least p_u before v starts (F1, F2). Away tails likewise, reversed: an
    away u's output reaches a successor w of the group on d (or on no device of u's when the edge is
    cut) a transfer after u's finish, or w is away and ends no earlier than its away tail after
    running p_w. So an away op runs inside its away window, and overlaps [t1, t2] at least a_j; a
    home op at least h_j (``interval_work_us``' proof: each term grows with the op's time). Device d
    runs the group's home ops one at a time (F1): their overlaps add up to at most L, so the set of
    ops on d is a home set, and the group's overlaps add up to at least the least over home sets,
    at least its fractional relaxation (a relaxation's least is no larger). Groups are disjoint,
    and all devices together run at most m L inside the interval: a C that fails has T > C for every
    valid placement and priority, so the step is at least it (and at least the comm path). Which C
    and intervals are checked only decides how high the bound gets."""
    p = np.ascontiguousarray(rel.fastest_us, dtype=np.float64)
    head, tail = rel.head_us, rel.tail_us
    lo = float((head + p + tail).max(initial=0.0))      # ``comm_path_us``
    group, home = tensor_groups(graph, rel, min_cut_share * lo)
    if not (group >= 0).any() or not (p > 0).any():
        return lo
    cut = np.ascontiguousarray(rel.cut_us, dtype=np.float64)
    away_head = _away_levels(graph.topo_order, graph.pred_ptr, graph.pred_edge, graph.edge_src, group, home, head, p, cut)
    away_tail = _away_levels(graph.topo_order[::-1].copy(), graph.succ_ptr, graph.succ_edge, graph.edge_dst, group, home,
                             tail, p, cut)
    timed = p > 0
    p, head, tail = p[timed], head[timed], tail[timed]
    away_head, away_tail, group, home = away_head[timed], away_tail[timed], group[timed], home[timed]
    n_groups = int(group.max()) + 1 if len(group) else 0
    m = float(cluster.n_devices)
    tolerance_us = 1e-9 * float(p.sum())
    grouped = group >= 0
    first = _spread(np.concatenate([head, head + p, away_head[grouped & np.isfinite(away_head)]]), max_ends)

    def fails(c_us: float) -> bool:
        latest = np.concatenate([c_us - tail, c_us - away_tail[grouped & np.isfinite(away_tail)], head + p])
        return _largest_excess_us(first, _spread(latest, max_ends), c_us, p, head, tail, away_head, away_tail,
                                  group, home, n_groups, m) > tolerance_us

    if not fails(lo):
        return lo
    step = max(1e-6 * lo, 1e-3)
    hi = lo + step
    while fails(hi):
        lo, step = hi, 2 * step
        hi = lo + step
    while hi - lo > 1e-7 * lo:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fails(mid) else (lo, mid)
    return lo


def tensor_groups(graph, rel: Relaxation, dear_us: float):
    """Per op, its tensor group (-1 if none) and whether it is of the group's home unit
    (``home_or_transfer_us``): components over the edges of finite cut cost >= ``dear_us`` and
    units, of at least two units; home, the unit of most persistent bytes (lowest index on ties)."""
    n = graph.n_ops
    dear = np.isfinite(rel.cut_us) & (rel.cut_us >= dear_us)
    rows = np.concatenate([graph.edge_src[dear], np.arange(n)])
    cols = np.concatenate([graph.edge_dst[dear], n + rel.unit])       # op -> its unit's node
    joins = sparse.coo_array((np.ones(len(rows)), (rows, cols)), shape=(2 * n, 2 * n))
    _, component = csgraph.connected_components(joins, directed=False)
    component = component[:n]
    group = np.full(n, -1, np.int64)
    home = np.zeros(n, bool)
    n_groups = 0
    for members in np.split(np.argsort(component, kind="stable"), np.flatnonzero(np.diff(np.sort(component))) + 1):
        units = np.unique(rel.unit[members])
        if len(units) < 2:
            continue
        home_unit = units[np.argmax(rel.unit_bytes[units])]
        group[members] = n_groups
        home[members] = rel.unit[members] == home_unit
        n_groups += 1
    return group, home


def _spread(values: np.ndarray, count: int) -> np.ndarray:
    """Up to ``count`` of the distinct values, evenly spread over them in sorted order."""
    values = np.unique(values)
    if len(values) > count:
        values = values[np.unique(np.linspace(0, len(values) - 1, count).round().astype(np.int64))]
    return values


@njit(cache=True)
def _away_levels(order, adj_ptr, adj_edge, edge_other, group, home, level, time_us, cut_us):
    """Away heads (predecessors, topological order) or away tails (successors, reverse order) of
    ``home_or_transfer_us``; inf where an op cannot be away."""
    away = level.copy()
    for v in order:
        if group[v] < 0 or home[v]:
            continue
        for k in range(adj_ptr[v], adj_ptr[v + 1]):
            e = adj_edge[k]
            u = edge_other[e]
            if group[u] != group[v]:
                continue
            remote = level[u] + time_us[u] + cut_us[e]
            away[v] = max(away[v], remote if home[u] else min(remote, away[u] + time_us[u]))
    return away


@njit(cache=True)
def _least_overlap_us(t1, t2, c_us, head, tail, p):
    return max(0.0, min(t2 - t1, p, head + p - t1, t2 - (c_us - tail) + p))


@njit(cache=True)
def _largest_excess_us(first, latest, c_us, p, head, tail, away_head, away_tail, group, home, n_groups, m):
    """The largest, over the intervals [t1, t2] with t1 in ``first`` and t2 in ``latest``, of the
    least overlaps of ``home_or_transfer_us`` minus m (t2 - t1); inf if some group's home unit
    alone overfills an interval."""
    n = p.shape[0]
    best = -np.inf
    gain = np.empty(n)
    weight = np.empty(n)
    of = np.empty(n, np.int64)
    held = np.empty(n_groups)
    for t1 in first:
        for t2 in latest:
            if t2 <= t1:
                continue
            length = t2 - t1
            total = 0.0
            k = 0
            held[:] = 0.0
            for j in range(n):
                h = _least_overlap_us(t1, t2, c_us, head[j], tail[j], p[j])
                g = group[j]
                if g < 0:
                    total += h
                elif home[j] or away_head[j] + p[j] > c_us - away_tail[j]:
                    held[g] += h
                    total += h
                else:
                    a = _least_overlap_us(t1, t2, c_us, away_head[j], away_tail[j], p[j])
                    total += a
                    if a > h:
                        gain[k], weight[k], of[k] = a - h, h, g
                        k += 1
            room = length - held
            if (room < 0.0).any():
                return np.inf
            ratio = np.empty(k)
            for i in range(k):
                ratio[i] = gain[i] / weight[i] if weight[i] > 0.0 else np.inf
            for i in np.argsort(-ratio):
                g = of[i]
                share = 1.0 if weight[i] <= room[g] else room[g] / weight[i]
                total -= share * gain[i]
                room[g] -= share * weight[i]
            best = max(best, total - m * length)
    return best
