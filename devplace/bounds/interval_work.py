"""Energetic reasoning over time windows, and the pair step: two long ops a transfer keeps on one
device run in turn."""

from __future__ import annotations

import numpy as np
from numba import njit

from devplace.bounds.relaxation import Relaxation


def interval_work_us(graph, cluster, rel: Relaxation, max_ends: int = 128, pair_ends: int = 16) -> float:
    """Energetic reasoning (Fernandez & Bussell, "Bounds on the number of processors and time for
    multiprocessor optimal schedules", 1973; the interval checks of Baptiste, Le Pape & Nuijten,
    "Satisfiability tests and time-bound adjustments for cumulative scheduling problems", 1999):
    for a trial step time C, each op has a window it must run in, and in no interval can the work
    that must fall inside it exceed devices x its length. The bound is the largest C found too
    small. It combines the critical path and work / devices: on graphs where the two are close, no
    schedule reaches either.

    Let p_j be op j's fastest time, r_j its least start and q_j its least time from finish to the
    step's end (its *head* and *tail* of ``comm_windows``: longest paths where joins and forks pay
    for running their neighbours side by side). For C, j's window is [r_j, C - q_j]; its
    least overlap with [t1, t2], when it runs p_j inside its window, is
    max(0, min(t2 - t1, p_j, r_j + p_j - t1, t2 - (C - q_j) + p_j)). C *fails* an interval when the
    least overlaps add up to more than m (t2 - t1), m the number of devices. Intervals checked: t1
    an op's earliest start r_j, earliest finish r_j + p_j or latest start C - q_j - p_j with every
    t2 after it, and t2 an op's earliest finish, latest finish C - q_j or latest start with every
    t1 before it (a sweep over the breakpoints of the piecewise-linear total); up to ``max_ends``
    fixed ends of each of these four families, evenly spread over their sorted values. Each family
    fixes its end where C does not move it (r_j and r_j + p_j at their times; C - q_j and
    C - q_j - p_j at their distance from C, with the windows measured from there too), so there
    the windows only widen as C grows and the largest excess over the other end only falls: each
    fixed end's largest failing C is found by bisection, and the bound is the largest over them.

    Proof: the simulator (``docs/simulator.md``) runs one op at a time per device, never preempted;
    there are no separate compute streams and no ops pinned to a device beyond what memory allows;
    message overheads are device time spent between ops, so they only take time from the devices.
    Take a valid placement and priority with step time T <= C. Op j on device d runs from s_j to
    s_j + P_j, P_j its time on d plus the op gap (F1), at least p_j (d is a device its unit may go
    on, F3, F4). s_j >= r_j and the step ends no earlier than s_j + P_j + q_j, so T <= C gives
    s_j + P_j + q_j <= C (``comm_windows`` proves both bounds for every placement and priority).
    So j runs inside [r_j, C - q_j], and its overlap with [t1, t2] is
    min(t2 - t1, P_j, s_j + P_j - t1, t2 - s_j) >= min(t2 - t1, P_j, r_j + P_j - t1, t2 - (C - q_j) + P_j)
    (when positive), every term nondecreasing in P_j >= p_j: at least j's least overlap. Devices run
    one op at a time, so the overlaps add up to at most m (t2 - t1). A C that fails an interval
    therefore has T > C for every valid placement and priority; the bound is such a C (or
    ``comm_path_us``, where the bisection starts). Zero-time ops overlap nothing and are left out.
    Which intervals are checked only decides how high the bound gets, never its validity.

    Then the bound is raised where communication would keep two long ops on one device, so that
    they run one after the other (``_pair_bound_us``, ``pair_ends`` fixed ends per family in each
    branch): a C that fails whichever of the two runs first, and fails each way of paying a transfer
    on a path between them, fails every placement."""
    p = np.ascontiguousarray(rel.fastest_us, dtype=np.float64)
    start_us, after_us = rel.head_us, rel.tail_us
    lo = float((start_us + p + after_us).max(initial=0.0))       # ``comm_path_us``
    m = float(cluster.n_devices)
    bound = _interval_bound_us(start_us, after_us, p, m, lo, max_ends)
    return max(bound, _pair_bound_us(graph, rel, m, bound, pair_ends))


def _interval_bound_us(start_us: np.ndarray, after_us: np.ndarray, p: np.ndarray, m: float, lo: float,
                       max_ends: int) -> float:
    """The largest C, from ``lo`` up, that some checked interval shows too small when op j runs
    inside [start_us_j, C - after_us_j] for at least p_j (``interval_work_us``; ``lo`` must be a
    valid bound for the same windows)."""
    timed = p > 0
    if not timed.any():
        return lo
    p = p[timed]
    r, q = start_us[timed], after_us[timed]
    # a family: its ops' windows as (x + alpha C, C beta - y) and its fixed left ends. Mirrored
    # (time -> -time) a fixed t2 is a fixed t1; reversed (time -> C - time) heads and tails swap.
    families = [(r, q, 0.0, 1.0, np.concatenate([r, r + p])), (q, r, -1.0, 0.0, -(r + p)),
                (q, r, 0.0, 1.0, np.concatenate([q, q + p])), (r, q, -1.0, 0.0, -(q + p))]
    ends = []
    for f, (_, _, _, _, values) in enumerate(families):
        values = np.unique(values)
        if len(values) > max_ends:
            values = values[np.unique(np.linspace(0, len(values) - 1, max_ends).round().astype(np.int64))]
        ends += [(f, float(v)) for v in values]
    tolerance_us = 1e-9 * float(p.sum())       # rounding: an excess this small proves nothing

    def excess_us(end, c_us):
        x, y, alpha, beta, _ = families[end[0]]
        return _interval_excess_us(end[1], c_us, x, y, alpha, beta, p, m)

    first = np.array([excess_us(end, lo) for end in ends])
    for i in np.argsort(-first, kind="stable"):
        if first[i] <= tolerance_us:
            break
        failing = excess_us(ends[i], lo)
        if failing <= tolerance_us:
            continue
        step = max(failing / m, 1e-6 * lo)
        hi = lo + step
        while excess_us(ends[i], hi) > tolerance_us:
            lo, step = hi, 2 * step
            hi = lo + step
        while hi - lo > 1e-7 * lo:
            mid = 0.5 * (lo + hi)
            if excess_us(ends[i], mid) > tolerance_us:
                lo = mid
            else:
                hi = mid
    return lo


PAIR_CANDIDATES = 64     # ``_pair_bound_us`` pairs the longest ops among this many
PAIR_TRIES = 8           # and looks for a link between the ends of this many of its best pairs
PAIR_DEPTH = 2           # pairs branched one inside another: GNMT's classifier GPU runs mm_1, mm_2 and sum_1 in turn
LINK_EDGES = 4           # a link has at most this many edges
LINK_VISITS = 4096       # ops a search for a link may visit


def _pair_bound_us(graph, rel: Relaxation, m: float, lo: float, max_ends: int) -> float:
    """``interval_work_us`` once two long ops that communication keeps on one device run in turn.

    Take ops a and b (p > 0) and a *link* between them: a path of edges u -> v from a to b, each
    taken in either direction (a shared producer: a <- f -> b). Branches: "e cut", for each link
    edge e = u -> v that may be cut (finite cut cost c_e): head'_v = max(head_v, head_u + p_u + c_e)
    and tail'_u = max(tail_u, c_e + p_v + tail_v); "a first": head'_b = max(head_b, head_a + p_a)
    and tail'_a = max(tail_a, p_b + tail_b); "b first" likewise. In each, heads are raised along
    the edges to every descendant (head'_w >= head'_u + p_u for each edge u -> w) and tails to
    every ancestor (tail'_u >= p_w + tail'_w); its bound is the interval bound
    (``_interval_bound_us``) with those windows, from max(lo, the largest head' + p + tail'). The
    bound is the least over the branches, for the pair with the longest shorter op among the
    ``PAIR_CANDIDATES`` longest ops, neither of which may start only after the other's earliest
    finish, whose windows at ``lo`` overlap, and which a link of at most ``LINK_EDGES`` edges joins,
    its cheapest cut as dear as ``_link`` finds (which pair and link decide only how high it gets).
    Up to ``PAIR_DEPTH`` levels: inside each branch, the same step on the branch's windows (a pair
    chosen on them, from the branch's bound) splits it again, and the branch's bound is the larger.

    Proof: take a valid placement and priority. If a link edge e = u -> v is cut, v's input from u
    arrives no earlier than u's finish plus the edge's transfer, at least head_u + p_u + c_e (F2),
    and the step ends no earlier than that + p_v + tail_v; an edge that is never cut (c_e inf) has
    no such branch. If no link edge is cut, every op of the link shares one device (an uncut edge's
    ends do): a and b run there one at a time, never preempted (F1). If a runs first, b starts no
    earlier than a's finish, at least head_a + p_a, and the step ends no earlier than a's finish +
    p_b + tail_b. Each op starts no earlier than its producers' finishes (F2) and runs at least p
    (F1, F3), so in each branch the raised heads and tails still bound every op's start and time to
    the end, and the interval argument (``interval_work_us``' proof, with these windows) bounds the
    step by that branch's bound. One branch holds in every placement: the step is at least the
    least of them. Inside a branch, its windows bound every op of every placement in it, so the
    same argument with them in place of the relaxation's splits the branch's placements again; its
    bound is valid for all of them, so the sub-branches may start from it, and the least over the
    sub-branches bounds the branch."""
    return _pair_branches_us(graph, rel, m, lo, max_ends, rel.head_us, rel.tail_us, PAIR_DEPTH)


def _pair_branches_us(graph, rel: Relaxation, m: float, lo: float, max_ends: int, head: np.ndarray,
                      tail: np.ndarray, depth: int) -> float:
    """``_pair_bound_us`` with windows ``head`` and ``tail``, valid bound ``lo``, ``depth`` levels."""
    if not np.isfinite(lo):     # no placement fits (an infinite window): nothing to branch on
        return lo
    p = np.ascontiguousarray(rel.fastest_us, dtype=np.float64)
    candidates = np.argsort(-p, kind="stable")[:PAIR_CANDIDATES]
    candidates = candidates[p[candidates] > 0]
    pairs = []
    for i, a in enumerate(candidates):
        for b in candidates[i + 1:]:
            waits = head[b] >= head[a] + p[a] or head[a] >= head[b] + p[b]     # a path between them, say
            if waits or head[a] >= lo - tail[b] or head[b] >= lo - tail[a]:       # or the windows at lo
                continue        # one already waits for the other: nothing to branch on
            pairs.append((-min(p[a], p[b]), int(a), int(b)))
    for _, a, b in sorted(pairs)[:PAIR_TRIES]:
        link = _link(graph, rel, a, b)
        if link is not None:
            break
    else:
        return lo
    branches = [(a, b, 0.0), (b, a, 0.0)] + [(int(graph.edge_src[e]), int(graph.edge_dst[e]), float(rel.cut_us[e]))
                                             for e in link if np.isfinite(rel.cut_us[e])]
    bound = np.inf
    for before, after, gap_us in branches:       # ``after`` starts >= ``before``'s finish + gap_us
        raised_head, raised_tail = head.copy(), tail.copy()
        raised_head[after] = max(head[after], head[before] + p[before] + gap_us)
        raised_tail[before] = max(tail[before], gap_us + p[after] + tail[after])
        raised_head = _raise_levels(graph.topo_order, graph.pred_ptr, graph.pred_edge, graph.edge_src, raised_head, p)
        raised_tail = _raise_levels(graph.topo_order[::-1].copy(), graph.succ_ptr, graph.succ_edge, graph.edge_dst,
                                    raised_tail, p)
        start = max(lo, float((raised_head + p + raised_tail).max()))
        if start < bound:       # a branch only counts if it can be the least
            branch_us = _interval_bound_us(raised_head, raised_tail, p, m, start, max_ends)
            if depth > 1 and branch_us < bound:
                branch_us = _pair_branches_us(graph, rel, m, branch_us, max_ends, raised_head, raised_tail, depth - 1)
            bound = min(bound, branch_us)
        if bound <= lo:
            return lo
    return float(bound)


def _link(graph, rel: Relaxation, a: int, b: int):
    """The edges of a path from a to b, each edge taken in either direction, of at most
    ``LINK_EDGES`` edges, whose cheapest cut is as dear as it can be among the cut costs of a's and
    b's own edges (``_link_at`` each, dearest first); None if none is found."""
    own = np.concatenate([graph.succ_edge[graph.succ_ptr[v]:graph.succ_ptr[v + 1]] for v in (a, b)]
                         + [graph.pred_edge[graph.pred_ptr[v]:graph.pred_ptr[v + 1]] for v in (a, b)])
    for least_us in np.unique(rel.cut_us[own])[::-1].tolist():
        path = _link_at(graph, rel, a, b, least_us)
        if path is not None:
            return path
    return None


def _link_at(graph, rel: Relaxation, a: int, b: int, least_us: float):
    """``_link`` over the edges whose cut costs at least ``least_us``: the edges of a fewest-edge
    path from a to b, None if none has at most ``LINK_EDGES`` edges or the search visits more than
    ``LINK_VISITS`` ops."""
    via = {a: -1}
    frontier = [a]
    for _ in range(LINK_EDGES):
        following = []
        for u in frontier:
            edges = np.concatenate([graph.succ_edge[graph.succ_ptr[u]:graph.succ_ptr[u + 1]],
                                    graph.pred_edge[graph.pred_ptr[u]:graph.pred_ptr[u + 1]]])
            for e in edges[rel.cut_us[edges] >= least_us].tolist():
                w = _other_end(graph, e, u)
                if w in via:
                    continue
                via[w] = e
                if w == b:
                    path, v = [], b
                    while v != a:
                        path.append(via[v])
                        v = _other_end(graph, via[v], v)
                    return path[::-1]
                if len(via) > LINK_VISITS:
                    return None
                following.append(w)
        frontier = following
    return None


def _other_end(graph, e: int, v: int) -> int:
    """The end of edge ``e`` that is not ``v`` (``_link_at`` walks edges either way)."""
    src = int(graph.edge_src[e])
    return int(graph.edge_dst[e]) if src == v else src


@njit(cache=True)
def _raise_levels(order, adj_ptr, adj_edge, edge_other, level, time_us):
    """Heads (predecessors, topological order) or tails (successors, reverse order) raised along
    the edges: level_v >= level_u + time_us_u for each neighbour u of v."""
    level = level.copy()
    for v in order:
        for k in range(adj_ptr[v], adj_ptr[v + 1]):
            u = edge_other[adj_edge[k]]
            level[v] = max(level[v], level[u] + time_us[u])
    return level


@njit(cache=True)
def _interval_excess_us(t1, c_us, x, y, alpha, beta, p, m):
    """max over t2 >= t1 of (the ops' least overlaps with [t1, t2]) - m (t2 - t1), each op in the
    window [x + alpha C, beta C - y] (``interval_work_us``); 0 if none is positive. Op j's least
    overlap grows at slope 1 from max(t1, its latest start) for a = min(p, earliest finish - t1)."""
    n = p.shape[0]
    at = np.empty(2 * n)
    slope = np.empty(2 * n)
    k = 0
    for j in range(n):
        earliest = x[j] + alpha * c_us
        a = min(p[j], earliest + p[j] - t1)
        if a <= 0.0:
            continue
        s = max(t1, beta * c_us - y[j] - p[j])
        at[k], slope[k] = s, 1.0
        at[k + 1], slope[k + 1] = s + a, -1.0
        k += 2
    order = np.argsort(at[:k])
    total, rate, last, best = 0.0, 0.0, t1, 0.0
    i = 0
    while i < k:
        t = at[order[i]]
        total += rate * (t - last)
        last = t
        while i < k and at[order[i]] == t:
            rate += slope[order[i]]
            i += 1
        best = max(best, total - m * (t - t1))
    return best
