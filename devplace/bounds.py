"""Certified lower bounds on the step time: how far from optimal a placement can be.

Each bound is at most the step time the simulator gives *every* valid placement (one that keeps
colocation groups together and fits in memory) under *any* priority, so it is at most the optimum,
the smallest simulated step time over placements and priorities. Each is proven from these facts
about one simulated run (``devplace/sim/engine.py``, ``docs/simulator.md``); the step time is the
latest finish:

- (F1) an op on device ``d`` runs from its start to start + its compute time for ``d``'s kind +
  ``op_gap_us``, and a device runs one op at a time;
- (F2) for an edge u -> v, v starts no earlier than u finishes; if they are on different devices, no
  earlier than u's finish plus the edge's transfer time on that link (the one transfer of u's output
  to v's device begins at u's finish or later and lasts as long as its longest edge there). Channel
  queues and message overheads only add to this, so the bounds leave them out;
- (F3) persistent bytes are allocated at time 0 and never freed, so on a device where the placement
  fits, the persistent bytes of its ops are at most its memory; when an op that takes time there
  starts, its output and temporaries are allocated too (they live until it finishes at least), so
  those persistent bytes plus the op's output and temporary bytes are at most the memory as well;
- (F4) the ops of a colocation group share a device (``devplace.place`` refuses anything else).

A *unit* is a colocation group, or an op in none. An op may only go where its unit's persistent
bytes fit, with room for the output and temporaries of each of its ops that takes time there (F3,
F4), and its *fastest time* is its least time over those devices. An edge's *cut
cost* is its least transfer time over ordered pairs of distinct devices that its producer's and
its consumer's units may use (F2, F3); an edge inside a unit, or between units that may only share
one device, is never cut (F4; cut cost inf).

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> b = lower_bounds(chain_graph([10.0, 20.0, 30.0]), uniform_cluster(2))
>>> b["critical_path_us"], b["work_us"], b["best"]
(60.0, 30.0, 'critical_path_us')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit
from scipy import optimize, sparse
from scipy.sparse import csgraph

from devplace.errors import OutOfMemoryError
from devplace.placers._highs import highs_solver
from devplace.placers._listsched import op_times_us
from devplace.transforms.coplacement import join_pairs

BOUND_NAMES = ("critical_path_us", "comm_path_us", "work_us", "largest_group_us", "interval_work_us", "memory_path_us",
               "cut_threshold_us", "turn_path_us", "cluster_order_us")
MAX_SPAN = 64        # a span (``memory_path_us``) joins path positions at most this far apart


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
    tail_us: np.ndarray        # per op: least time from its finish to the step's end, likewise (``comm_windows``)


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
    head_us, tail_us = comm_windows(graph, fastest_us, cut_us, forced_cut)
    return Relaxation(time_us, unit, unit_bytes, allowed, footprint, fastest_us, cut_us, forced_cut, head_us, tail_us)


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


def critical_path_us(graph, rel: Relaxation) -> float:
    """The longest path, each op at its fastest time and each always-cut edge at its cut cost.

    Proof: along a path, each op starts no earlier than its predecessor's finish, plus the
    transfer when the edge is cut (F2), and runs at least its fastest time (F1, F3); an edge whose
    units fit on no device together is cut in every valid placement (F3, F4)."""
    edge_us = np.where(rel.forced_cut, rel.cut_us, 0.0)
    return float(_longest_paths(graph, rel.fastest_us, edge_us)[0].max(initial=0.0))


def comm_path_us(graph, rel: Relaxation) -> float:
    """The longest path once joins and forks pay for running their neighbours side by side: the
    largest, over ops j, of head_j + p_j + tail_j (``comm_windows``).

    This is the classic bound for scheduling with communication delays on unboundedly many
    processors without duplication (Chrétienne & Picouleau, "Scheduling with communication delays:
    a survey", 1995; Colin & Chrétienne, "C.P.M. scheduling with small communication delays and
    task duplication", 1991), with the one-machine bound of the predecessors kept local.

    Proof: ``comm_windows`` proves head_j <= start(j) and tail_j <= step - finish(j) in every
    valid placement and priority, and j runs at least p_j (F1, F3) in between."""
    start_us, after_us = rel.head_us, rel.tail_us
    return float((start_us + rel.fastest_us + after_us).max(initial=0.0))


def comm_windows(graph, fastest_us: np.ndarray, cut_us: np.ndarray, forced_cut: np.ndarray):
    """Per op j, (head_j, tail_j): a least start time, and a least time from its finish to the
    step's end, where a predecessor (successor) that does not share j's device pays its cheapest
    transfer, and those that share it run one at a time.

    head_j is 0 for a source; otherwise, with each predecessor i's *remote arrival*
    a_i = head_i + p_i + c_i (p: fastest time incl. op gap; c_i: the largest ``cut_us`` of i's edges
    to j; inf when such an edge is never cut, ``Relaxation.cut_us``), and for a set K of predecessors
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
    than its finish, at least head_i + p_i, plus its transfer to d, which lasts as long as its
    longest edge to d on that link, at least c_i (F2; channel queues and message overheads only
    delay). So start(j) >= max(a_i over i not in K, L(K)) >= head_j. For any K, the prefix K' of
    the sweep holding every i with a_i above K's largest remote arrival is inside K, so
    L(K') <= L(K) and the sweep's value there is at most K's; once L(K) reaches the next a, adding
    more only raises L. Tails: reversed, a successor on d starts after finish(j) and runs one at a
    time with j's other successors there; one elsewhere starts at least c later; each runs at least
    p and leaves at least its tail after it finishes."""
    p = np.ascontiguousarray(fastest_us, dtype=np.float64)
    cut = np.ascontiguousarray(cut_us, dtype=np.float64)
    head = _comm_levels_kernel(graph.topo_order, graph.pred_ptr, graph.pred_edge, graph.edge_src, p, cut,
                               forced_cut)
    tail = _comm_levels_kernel(graph.topo_order[::-1].copy(), graph.succ_ptr, graph.succ_edge, graph.edge_dst,
                               p, cut, forced_cut)
    return head, tail


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
    least of them."""
    p = np.ascontiguousarray(rel.fastest_us, dtype=np.float64)
    head, tail = rel.head_us, rel.tail_us
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
            bound = min(bound, _interval_bound_us(raised_head, raised_tail, p, m, start, max_ends))
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


def memory_path_us(graph, cluster, rel: Relaxation, n_paths: int = 12) -> float:
    """Paths whose ops cannot all share a device pay for the cuts memory forces on them, for the
    chords (residual skips) those cuts make cross too, and for side branches they cannot shed.

    For a path P = v_0 .. v_m (edge i joins v_i and v_i+1), take its ops at their fastest times p
    plus the larger of two least cut costs: (a) split P into consecutive *runs*, each holding units
    whose persistent bytes fit the largest device, at the least total cut cost of the edges between
    runs plus the *span charges* below (a dynamic program along P, ``_path_cut_us``); (b) if its
    units' persistent bytes need k devices (the k largest memories are the fewest that hold them),
    the k - 1 cheapest cuttable edges on it. When they fit the largest device no cut is forced,
    but the spans still charge (a side route beside a path that stays on one device runs on it
    too, or leaves and comes back): then (a) is taken stretch by stretch (``_fitting_path_us``).

    A *span* joins x = v_a and w = v_b, b >= a + 2, by a route off P: a *chord*, an edge x -> w with
    a finite cut cost c_xw (the largest over such edges: one transfer carries them), or a *side
    route* x -> q_1 .. q_r -> w through ops off P (``_side_routes``), of time P_Q (the q's fastest
    times), cheapest cut costs c1 <= c2 over its edges, B_Q the persistent bytes of its ops' units
    that hold no path op. Its *cross* cost X is c_xw, or P_Q + c1; I = p_a+1 + .. + p_b-1 is the
    path's time strictly inside (S = p_a + I). Spans whose charges can be positive are taken,
    largest first, skipping any whose edges a .. b - 1 meet a taken one's. With cuts K among its
    edges:
    - K empty: 0 for a chord; for a side route L = max(0, P_Q + c1 + c2 - I), or min(P_Q, L) if
      the bytes of the run's path units plus B_Q fit the largest device;
    - K = {e}: max(0, c_xw - c_a) for a chord with e = a, else max(0, p_a + X + q1 Q_e - S - c_e),
      Q_e = c_e + p_e+1 + .. + p_b-1 if p_a+1 + .. + p_e > 0, else c_e; q1 = 1 for a chord unless
      the model is ``pipelined``, else 0; for a side route X is here the least of P_Q + c1 + c2 and P_Q + c(E_k)
      over its edges E_k such that the bytes of the route's off-path units before E_k fit beside
      the path units of v_a .. v_e, and those after it beside w's run's;
    - first cut f, last cut e > f, when the path does not come back to x's run before w (x and w
      apart): max(0, p_a + X + q2 Q_e - S - sum of K), q2 = 1 for a chord under ``sequential`` and
      ``duplex``; for given f and e the dynamic program takes the cheapest cuts between them whose
      runs fit (the charge only falls as the cuts' sum rises, so that is the least total);
    - when the path leaves x's run at the first cut in the span and returns to it at the last (a
      *hole*: x and w together), nothing, but the run holding x and the one holding w must fit one
      device together.

    Proof: in a valid placement, a run of consecutive path ops on one device holds its units on
    that device (F4), so their persistent bytes fit it (F3): the device changes along the path
    split it into runs as in (a), and each change is a cut edge. The path's units sit on at
    least k devices, so the device changes at least k - 1 times (b). Each cut edge delays its
    consumer by at least its cut cost (F2) and each op runs at least its fastest time (F1): from
    start(v_i) to start(v_i+1) at least p_i, plus c_i if edge i is cut. When x and w are apart, a
    chord gives start(w) >= finish(x) + the transfer of x to w's device (F2); a side route runs its
    ops (F1) and changes device at least once (F2): start(w) >= finish(x) + P_Q + c1; and
    finish(x) >= start(x) + p_a. No cut in the span: x, w and the path between share one device d; if
    the side route's ops are on d too, d runs them and the path's inner ops, one at a time, between
    finish(x) and start(w) (F1; all descend from x and lead to w): start(w) >= finish(x) + I + P_Q,
    and d holds B_Q beside the run (F3, F4); else the route leaves d and comes back, two cut edges:
    start(w) >= finish(x) + P_Q + c1 + c2. One cut, side route: either the route changes device
    once, from x's device to w's, at some E_k (its ops before E_k on x's device with v_a .. v_e,
    those after on w's with w's run: both must fit, F3), so start(w) >= finish(x) + P_Q + c(E_k),
    or it changes at least twice. One cut e = a: x's one transfer to w's device carries the path
    edge and the chord, so it lasts at least max(c_a, c_xw) (F2). One cut e > a: x's device is
    every op's from a to e, w's every op's from e + 1 to b, so x's transfer and v_e's both go from
    x's device to w's and hold the same channel one after the other (``sim/channels.py``: pair channel, the two
    devices' channels, or the sender's channel; under ``pipelined`` a sized transfer holds it only
    for its bytes, so q1 = 0), each at least its cut cost. A transfer is booked when its producer
    finishes, in the order of the finishes, and begins once the channels are free of every transfer
    booked before it (``engine.py``, ``book``: first come, first served, nothing jumps the queue).
    If p_a+1 + .. + p_e > 0, v_e finishes after x, so v_e's transfer begins no earlier than
    finish(x) + c_xw, and v_e+1 .. v_b-1 run after it arrives: start(w) >= finish(x) + c_xw + c_e +
    p_e+1 + .. + p_b-1. Else whichever goes first, the other arrives at least c_xw + c_e after
    finish(x). Either way start(w) >= start(x) + p_a + c_xw + Q_e. Two cuts or more with x and w
    apart, e the last: v_e's transfer and x's both end on w's device and hold its channel
    (``sequential``) or its receive channel (``duplex``), and the same argument gives the same sum,
    whatever the cuts between. With x
    and w together (two cuts or more), x's run and w's run share a device and fit it (F3):
    the dynamic program's hole step (x's run, then the first and last cuts, then w's run, checked
    together) covers such placements; the ops in between are not charged memory, only the two cuts,
    and a span that x's run or w's run holds whole is charged as in any run, with the bytes of
    the runs up to it (a run holds at least those).
    So start(w) - start(x) is at least S plus the cuts in the span plus the charge, spans do not
    share edges, and the last op on P finishes no earlier than the sum of p, the cuts and the
    charges; the dynamic program takes the least over every split a placement can make. Any path
    gives a valid bound; the ones tried are the longest paths for op weights fastest time + lambda x
    persistent bytes over a range of lambda (the critical path first)."""
    if graph.n_edges == 0:
        return float(rel.fastest_us.max(initial=0.0))
    capacity = np.sort(cluster.memory_bytes)[::-1]
    op_bytes = graph.persistent_bytes
    cut_us = rel.cut_us
    scale = max(float(rel.fastest_us.sum()), 1e-9) / max(float(capacity[0]), 1.0)
    best = 0.0
    zero_edges = np.zeros(graph.n_edges)
    pair_queue = cluster.comm_model != "pipelined"         # x -> w's device and the cut share a channel
    end_queue = cluster.comm_model in ("sequential", "duplex")   # two transfers into w's device do
    for k in range(n_paths):
        weight = rel.fastest_us + (0.0 if k == 0 else scale * 2.0 ** (k - n_paths // 2)) * op_bytes
        level, parent = _longest_paths(graph, weight, zero_edges)
        path_ops, path_edges = _trace(graph, level, parent)
        units = rel.unit[path_ops]
        held = rel.unit_bytes[np.unique(units)].sum()
        position = np.full(graph.n_ops, -1, np.int64)
        position[path_ops] = np.arange(len(path_ops))
        side_routes = _side_routes(graph.topo_order, graph.pred_ptr, graph.pred_edge, graph.edge_src, graph.succ_ptr,
                                   graph.succ_edge, graph.edge_dst, position,
                                   np.ascontiguousarray(rel.fastest_us, dtype=np.float64),
                                   np.ascontiguousarray(rel.cut_us, dtype=np.float64), MAX_SPAN)
        spans = _path_spans(graph, rel, path_ops, position, side_routes)
        path_us = float(rel.fastest_us[path_ops].sum())
        if held <= capacity[0]:      # the whole path fits one device: no cut is forced, each span alone
            best = max(best, path_us + _fitting_path_us(graph, rel, path_ops, path_edges, float(capacity[0]),
                                                        pair_queue, end_queue, spans, position, side_routes))
            continue
        cuts = _path_cut_us(units, rel.unit_bytes.astype(np.float64), rel.fastest_us[path_ops], cut_us[path_edges],
                            float(capacity[0]), pair_queue, end_queue, *spans)
        devices_needed = int(np.searchsorted(np.cumsum(capacity), held * (1 - 1e-12))) + 1
        cheapest = np.sort(cut_us[path_edges])[: devices_needed - 1].sum()
        if devices_needed > len(capacity) or not np.isfinite(max(cuts, cheapest)):
            raise OutOfMemoryError(
                f"the ops on the path from {graph.names[path_ops[0]]!r} to {graph.names[path_ops[-1]]!r} "
                f"hold {held / 2**20:.1f} MiB of persistent memory that no split over the cluster's "
                f"{cluster.n_devices} device(s) can hold: no placement fits; use more or larger devices"
            )
        best = max(best, path_us + max(cuts, float(cheapest)))
    return best


def _fitting_path_us(graph, rel: Relaxation, path_ops: np.ndarray, path_edges: np.ndarray, capacity: float,
                     pair_queue: bool, end_queue: bool, spans, position: np.ndarray, side_routes) -> float:
    """What the spans add to a path whose units fit one device (``memory_path_us``), stretch by
    stretch: a *stretch* joins the spans and side routes (``_side_routes``) whose edges overlap.

    Per span, ``_path_cut_us`` on the span's own stretch x .. w with that span alone: the sum over a
    stretch's spans, *alone*, is at most what any split of the path pays there, its cuts and its
    spans' charges (restricted to a span, a split is a split of its stretch, no fuller, its cuts a
    part of the path's; spans share no edges). A split that cuts no edge of the stretch keeps
    every path op of it on one device d, and then its side routes, taken with no op in common,
    each either run on d too, between their x's finish and their w's start (F1: d runs them and the
    path's ops one at a time), or leave d and come back over two cut edges (start(w) >=
    finish(x) + P_Q + c1 + c2, as for one span): the stretch's first path op to its last takes at
    least the path's time plus the least, over which routes stay, of the larger of the staying
    routes' P_Q summed and the largest P_Q + c1 + c2 - I of a leaving one (memory is not asked:
    fewer constraints, a smaller least). A split that cuts one pays at least the stretch's
    cheapest cut. So a stretch adds at least min(max(routes, alone), max(cheapest cut, alone)),
    and stretches share no edges. ``position`` (per op, its place on the path or -1) and
    ``side_routes`` (``_side_routes``) are the ones the spans were taken from."""
    units, time_us, edge_cut_us = rel.unit[path_ops], rel.fastest_us[path_ops], rel.cut_us[path_edges]
    unit_bytes = rel.unit_bytes.astype(np.float64)
    span_of, first, last, cross, chord, side, leave, route_ptr, route_cut, route_pre, route_suf, q_bytes = spans
    alone = np.zeros(len(first))
    for k in range(len(first)):
        a, b = int(first[k]), int(last[k])
        lo, hi = route_ptr[k], route_ptr[k + 1]
        alone[k] = _path_cut_us(units[a:b + 1], unit_bytes, time_us[a:b + 1], edge_cut_us[a:b], capacity, pair_queue,
                                end_queue, np.zeros(b - a, np.int64), np.zeros(1, np.int64), np.array([b - a], np.int64),
                                cross[k:k + 1], chord[k:k + 1], side[k:k + 1], leave[k:k + 1],
                                np.array([0, hi - lo], np.int64), route_cut[lo:hi], route_pre[lo:hi],
                                route_suf[lo:hi], q_bytes[k:k + 1])
    side_a, side_b, side_us, cut1, cut2, side_exit, via = side_routes
    before = np.concatenate([[0.0], np.cumsum(time_us)])
    leaving = side_us + cut1 + cut2 - (before[side_b] - before[side_a + 1])     # what leaving adds
    routes = np.flatnonzero(leaving > 0)
    # stretches: intervals of path edges [a, b) of the spans (index k) and routes (index len(first) + r)
    lo_edge = np.concatenate([first, side_a[routes]])
    hi_edge = np.concatenate([last, side_b[routes]])
    total, k_end, members = 0.0, -1, []
    for i in list(np.argsort(lo_edge, kind="stable")) + [None]:
        if i is not None and lo_edge[i] < k_end:
            members.append(i)
            k_end = max(k_end, int(hi_edge[i]))
            continue
        if members:
            total += _stretch_us(graph, members, len(first), alone, routes, side_us, leaving, side_exit, via,
                                 position, edge_cut_us[min(lo_edge[j] for j in members):k_end])
        if i is not None:
            members, k_end = [i], int(hi_edge[i])
    return total


def _stretch_us(graph, members, n_spans, alone, routes, side_us, leaving, side_exit, via, position,
                stretch_cut_us) -> float:
    """``_fitting_path_us`` of one stretch: min(max(routes, alone), max(cheapest cut, alone)), the
    side routes taken longest first, each with no op in common with those taken before."""
    spans_us = float(sum(alone[j] for j in members if j < n_spans))
    taken, used = [], set()
    for j in sorted((j - n_spans for j in members if j >= n_spans), key=lambda r: -side_us[routes[r]]):
        r = routes[j]
        ops = graph.edge_src[_route_edges(graph, position, side_exit[r], via)[:-1]].tolist()   # its off-path ops
        if used.isdisjoint(ops):
            used.update(ops)
            taken.append((leaving[r], side_us[r]))
    excess = np.array([t[0] for t in taken])
    stay_us = np.array([t[1] for t in taken])
    routes_us = min((max(t, float(stay_us[excess > t].sum())) for t in np.concatenate([[0.0], excess])),
                    default=0.0)
    return min(max(routes_us, spans_us), max(float(stretch_cut_us.min(initial=np.inf)), spans_us))


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


def turn_path_us(graph, cluster, rel: Relaxation, max_nodes: int = 500, time_limit_s: float = 60.0) -> float:
    """The critical path pays the costliest cut it needs so that the activations held at the
    forward/backward turn fit on the devices it visits: ``critical_path_us`` + theta, theta the
    least threshold at which a small program over blocks of the path is not proven infeasible.

    Take P, the critical path of ``critical_path_us``, its units U_P, and a *probe* x on P that takes
    time on every device (the one where the outputs made before x on P and read after it on P weigh
    most). Write anc(x) for x and its ancestors, desc(x) for x and its descendants. An *item* is an
    op f in anc(x), f != x, with output bytes and a reader b in desc(x) whose edge f -> b costs time
    on every link (cut cost > 0; inf inside a unit), the units of f and b both in U_P (one reader per
    item: one in f's unit if there is one). For a threshold t, the *t-blocks* are the units of U_P
    joined by the path edges that are not always cut (``forced_cut``) and cost more than t to cut.
    *fits(t)*: the program, binary z[B, d] puts each t-block on one device its units are all
    allowed on; w[i, d] >= 0 with sum_d w[i, d] = 1 and w[i, d] <= z[block of f, d] + z[block of b, d]
    spreads each item over its two ends' devices; per device, the persistent bytes of its blocks'
    units, x's output and temporaries (with x's block) and sum_i bytes_i w[i, d] are at most its
    memory. Coarser blocks only constrain more, so fits is monotone in t. Let t0 be the least t (0
    or a path edge's cut cost) whose next smaller candidate HiGHS proves infeasible (a binary
    search; a node or time limit counts as "fits": it never raises the bound), k the fewest devices
    whose memories hold the rows' total bytes, f the always-cut path edges, and S(r) the sum of the
    r cheapest cut costs of the other path edges between two units. The bound is the critical path
    plus max(t0 + S(k - 2 - f), S(k - 1 - f)).

    Proof: take a valid placement and let t be the largest cut cost of a path edge it cuts that is
    not always cut (0 if none). Along P each op starts no earlier than its predecessor's finish
    plus, when the edge is cut, its transfer, at least its cut cost (F2), and runs at least its
    fastest time (F1, F3): the last op of P finishes no earlier than the critical path plus t. No
    path edge costing more than t that may be uncut is cut, so each t-block sits on one device (F4)
    and z can be the placement's. Memory at s = start(x), after the simulator's memory events at s
    (``sim/engine.memory_events``; every such total is reached, so the peak is at least it): x's
    output and temporaries are allocated at s and live past it (x takes time, so finish(x) > s);
    persistent bytes live from 0. For an item f -> b: f's output lives on f's device from
    start(f) <= s until its same-device readers have finished and its transfers have ended. If b
    shares f's device, it is there until finish(b) > s (b is x or descends from it). Else the edge
    costs time on that link, so f's one transfer to b's device exists, from s0 to s1 with
    finish(f) <= s0 <= s1, and its copy lives there from s0 until finish(b) > s: at s it is on f's
    device (s < s1) or on b's (s0 <= s1 <= s). Put w there. Items are outputs of distinct ops: blocks
    distinct from each other, from the persistent ones and from x's; each device's row is at most
    what it holds at s, at most its memory (F3). So fits(t) holds, and t >= t0: if t < t0, the
    candidate below t0, proven infeasible, is >= t and its blocks are finer than t's, so the
    placement would satisfy it. Every row's bytes sit on a device P visits (a unit of U_P or an
    item's end), so P visits at least k devices and changes device at least k - 1 times, each a cut
    edge: the f always-cut ones, counted in the critical path, and at least k - 1 - f others, one of
    them (if t > 0) costing t. The last op of P finishes no earlier than the critical path plus the
    cut costs of these, at least the bound; the step time is at least that finish."""
    base_us = critical_path_us(graph, rel)
    if graph.n_ops == 0 or cluster.n_devices == 1:
        return base_us
    edge_us = np.where(rel.forced_cut, rel.cut_us, 0.0)
    path_ops, path_edges = _trace(graph, *_longest_paths(graph, rel.fastest_us, edge_us))
    x = _turn_probe(graph, rel, path_ops)
    if x < 0:
        return base_us
    path_units = np.unique(rel.unit[path_ops])
    column = np.full(rel.allowed.shape[0], -1, np.int64)
    column[path_units] = np.arange(len(path_units))
    items_src, items_dst = _turn_items(graph, rel, column, x)
    fixed = rel.unit_bytes[path_units].astype(np.float64)
    fixed[column[rel.unit[x]]] += graph.output_bytes[x] + graph.temp_bytes[x]
    ends = (column[rel.unit[items_src]], column[rel.unit[items_dst]], graph.output_bytes[items_src])
    src_col = column[rel.unit[graph.edge_src[path_edges]]]
    dst_col = column[rel.unit[graph.edge_dst[path_edges]]]
    joinable = ~rel.forced_cut[path_edges] & (src_col != dst_col)
    cost = rel.cut_us[path_edges]
    cuttable = joinable & np.isfinite(cost)         # inf: its two ends may only share a device
    candidates = np.unique(np.concatenate([[0.0], cost[cuttable]]))
    held = fixed.sum() + ends[2].sum()
    if np.any(rel.allowed[path_units].all(axis=0) & (held <= cluster.memory_bytes)):
        return base_us          # all of it fits one device: no cut is forced (fits(0), k = 1)
    fits = _TurnBlocks(cluster, rel.allowed[path_units], fixed, ends, src_col, dst_col, joinable, cost,
                       max_nodes, time_limit_s)
    if not fits(candidates[-1]):
        raise OutOfMemoryError(
            f"the outputs held when {graph.names[x]!r} starts cannot be spread over the cluster's "
            f"{cluster.n_devices} device(s) beside the critical path's ops: no placement fits; use more "
            f"or larger devices")
    infeasible, fitting = -1, len(candidates) - 1       # indices: proven not to fit / not proven so
    while fitting - infeasible > 1:
        middle = (infeasible + fitting) // 2
        if fits(candidates[middle]):
            fitting = middle
        else:
            infeasible = middle
    visited = int(np.searchsorted(np.cumsum(np.sort(cluster.memory_bytes)[::-1]), held * (1 - 1e-12))) + 1
    others = visited - 1 - int(rel.forced_cut[path_edges].sum())     # joinable cuts the visits need
    cheapest = np.cumsum(np.concatenate([[0.0], np.sort(cost[cuttable])]))
    return base_us + float(max(candidates[fitting] + cheapest[min(max(others - 1, 0), len(cheapest) - 1)],
                               cheapest[min(max(others, 0), len(cheapest) - 1)]))


class _TurnBlocks:
    """``fits(t)`` of ``turn_path_us``: False only when HiGHS proves the program infeasible."""

    def __init__(self, cluster, allowed, fixed, ends, src_col, dst_col, joinable, cost, max_nodes, time_limit_s):
        self.cluster, self.allowed, self.fixed = cluster, allowed, fixed
        self.item_a, self.item_b, self.item_bytes = ends
        self.src_col, self.dst_col, self.joinable, self.cost = src_col, dst_col, joinable, cost
        self.max_nodes, self.time_limit_s = max_nodes, time_limit_s
        self.alike = (len(set(cluster.device_kinds)) == 1
                      and bool(np.all(cluster.memory_bytes == cluster.memory_bytes[0])))

    def __call__(self, threshold_us: float) -> bool:
        import highspy

        joined = self.joinable & (self.cost > threshold_us)
        block = join_pairs(len(self.fixed), self.src_col[joined], self.dst_col[joined])
        n_blocks, n_dev = int(block.max()) + 1, self.cluster.n_devices
        allowed = np.ones((n_blocks, n_dev), bool)
        np.logical_and.at(allowed, block, self.allowed)
        held = np.bincount(block, weights=self.fixed, minlength=n_blocks)
        a, b = block[self.item_a], block[self.item_b]
        np.add.at(held, a[a == b], self.item_bytes[a == b])
        # items between two blocks, summed per (block, block) pair: a fractional spread is a relaxation
        pairs, pair = np.unique(np.stack([np.minimum(a, b), np.maximum(a, b)])[:, a != b], axis=1, return_inverse=True)
        pair_bytes = np.bincount(np.ravel(pair), weights=self.item_bytes[a != b], minlength=pairs.shape[1])
        n_pairs = pairs.shape[1]
        # columns: z[B, d], w[p, d] (bytes of pair p on d, as a fraction of the pair), used[B, d]
        z0, w0 = 0, n_blocks * n_dev
        u0 = w0 + n_pairs * n_dev
        n_col = u0 + (n_blocks * n_dev if self.alike else 0)
        lower, upper = np.zeros(n_col), np.ones(n_col)
        upper[:w0] = allowed.ravel()
        upper[u0:] = np.inf
        rows, cols, vals, row_lo, row_hi = [], [], [], [], []

        def add(cols_, vals_, lo, hi):
            rows.append(np.full(len(cols_), len(row_lo)))
            cols.append(np.asarray(cols_, np.int64))
            vals.append(np.asarray(vals_, np.float64))
            row_lo.append(lo)
            row_hi.append(hi)

        devices = np.arange(n_dev)
        for k in range(n_blocks):
            add(z0 + k * n_dev + devices, np.ones(n_dev), 1.0, 1.0)
        for p in range(n_pairs):
            add(w0 + p * n_dev + devices, np.ones(n_dev), 1.0, 1.0)
            for d in range(n_dev):
                add([w0 + p * n_dev + d, z0 + pairs[0, p] * n_dev + d, z0 + pairs[1, p] * n_dev + d],
                    [1.0, -1.0, -1.0], -np.inf, 0.0)
        capacity = self.cluster.memory_bytes.astype(np.float64)
        for d in range(n_dev):
            add(np.concatenate([z0 + np.arange(n_blocks) * n_dev + d, w0 + np.arange(n_pairs) * n_dev + d]),
                np.concatenate([held, pair_bytes]) / capacity[d], -np.inf, 1.0)
        if self.alike:      # devices renamed in the order the blocks first use them; block 0 on device 0
            lower[z0] = 1.0
            for k in range(n_blocks):
                for d in range(n_dev):
                    used = u0 + k * n_dev + d
                    add([used, z0 + k * n_dev + d] + ([used - n_dev] if k else []),
                        [1.0, -1.0] + ([-1.0] if k else []), 0.0, 0.0)
                    if k and d:
                        add([z0 + k * n_dev + d, used - n_dev - 1], [1.0, -1.0], -np.inf, 0.0)
        matrix = sparse.csc_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                  shape=(len(row_lo), n_col))
        integer = np.zeros(n_col, bool)
        integer[:w0] = True
        solver = highs_solver(matrix, np.zeros(n_col), lower, upper, row_lo, row_hi, integer,
                              time_limit=float(self.time_limit_s), random_seed=0, threads=1,
                              mip_max_nodes=int(self.max_nodes))
        solver.run()
        return solver.getModelStatus() != highspy.HighsModelStatus.kInfeasible


def _turn_probe(graph, rel: Relaxation, path_ops: np.ndarray) -> int:
    """The op x of the path, taking time on every device, where the outputs of earlier path ops
    read (over an edge that costs time) by x or a later path op weigh most; -1 if there are none."""
    position = np.full(graph.n_ops, -1, np.int64)
    position[path_ops] = np.arange(len(path_ops))
    src, dst = graph.edge_src, graph.edge_dst
    on_path = (position[src] >= 0) & (position[dst] > position[src]) & (rel.cut_us > 0) & (graph.output_bytes[src] > 0)
    last_reader = np.full(graph.n_ops, -1, np.int64)
    np.maximum.at(last_reader, src[on_path], position[dst[on_path]])
    producers = np.flatnonzero(last_reader >= 0)
    held = np.zeros(len(path_ops) + 1)
    np.add.at(held, position[producers] + 1, graph.output_bytes[producers])
    np.add.at(held, last_reader[producers] + 1, -graph.output_bytes[producers])
    held = np.cumsum(held)[:-1]
    held[rel.fastest_us[path_ops] <= 0] = 0.0
    return int(path_ops[np.argmax(held)]) if held.max(initial=0.0) > 0 else -1


def _turn_items(graph, rel: Relaxation, column: np.ndarray, x: int):
    """Per item (see ``turn_path_us``), its producer and the reader it is charged with: one reader
    in the producer's unit if there is one, else the first."""
    n = graph.n_ops
    adjacency = sparse.csr_array((np.ones(graph.n_edges), (graph.edge_src, graph.edge_dst)), shape=(n, n))
    anc = np.zeros(n, bool)
    anc[csgraph.breadth_first_order(adjacency.T.tocsr(), x, directed=True, return_predecessors=False)] = True
    desc = np.zeros(n, bool)
    desc[csgraph.breadth_first_order(adjacency, x, directed=True, return_predecessors=False)] = True
    src, dst = graph.edge_src, graph.edge_dst
    ka, kb = column[rel.unit[src]], column[rel.unit[dst]]
    keep = anc[src] & (src != x) & desc[dst] & (graph.output_bytes[src] > 0) & (rel.cut_us > 0) & (ka >= 0) & (kb >= 0)
    edges = np.flatnonzero(keep)
    edges = edges[np.lexsort((ka[edges] != kb[edges], src[edges]))]     # by producer, a same-unit reader first
    first = np.unique(src[edges], return_index=True)[1]
    return src[edges[first]], dst[edges[first]]


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


def _trace(graph, level: np.ndarray, parent: np.ndarray):
    """The ops and edges, first to last, of the longest path (the one ending at the highest level)."""
    v = int(np.argmax(level))
    ops, edges = [v], []
    while parent[v] >= 0:
        e = int(parent[v])
        edges.append(e)
        v = int(graph.edge_src[e])
        ops.append(v)
    return np.array(ops[::-1], dtype=np.int64), np.array(edges[::-1], dtype=np.int64)


def _path_spans(graph, rel: Relaxation, path_ops: np.ndarray, position: np.ndarray, side_routes):
    """The spans ``_path_cut_us`` charges on a path (``memory_path_us``; ``position``: per op its place on
    the path or -1; ``side_routes``: its ``_side_routes``), as arrays: per path edge
    its span (-1: none); per span its first and last path position (x and w), its cross cost X,
    whether it is a chord, a side route's time P_Q and P_Q + c1 + c2; per side route edge (spans'
    runs of ``route_ptr``) its cut cost and the persistent bytes of the route's units (those off
    the path) before and after it; per span those bytes in all.

    Candidates: chords (X = c_xw, the largest over edges x -> w: one transfer carries them) and side
    routes (``_side_routes``). Those whose charge can be positive (X above the path's time strictly
    inside the span, or a positive together charge) are taken, largest first, skipping any whose
    edges meet a taken one's, and numbered along the path."""
    m = len(path_ops)
    a, b = position[graph.edge_src], position[graph.edge_dst]
    chord = (a >= 0) & (b >= a + 2) & (b - a <= MAX_SPAN) & np.isfinite(rel.cut_us)
    pairs, inverse = np.unique(np.stack([a[chord], b[chord]]), axis=1, return_inverse=True)
    n_chords = pairs.shape[1]
    chord_cross = np.zeros(n_chords)
    np.maximum.at(chord_cross, np.ravel(inverse), rel.cut_us[chord])
    side_a, side_b, side_us, cut1, cut2, side_exit, via = side_routes
    first = np.concatenate([pairs[0], side_a]).astype(np.int64)
    last = np.concatenate([pairs[1], side_b]).astype(np.int64)
    before = np.concatenate([[0.0], np.cumsum(rel.fastest_us[path_ops])])
    inner = before[last] - before[first + 1]
    cross = np.concatenate([chord_cross, side_us + cut1])
    leave = np.concatenate([np.zeros(n_chords), side_us + cut1 + cut2])
    together = np.concatenate([np.zeros(n_chords),
                               np.minimum(side_us, np.maximum(0.0, leave[n_chords:] - inner[n_chords:]))])
    gain = np.maximum(cross - inner, together)
    span_of = np.full(max(m - 1, 0), -1, np.int64)
    taken = []
    for k in np.argsort(-gain, kind="mergesort"):
        if gain[k] <= 0:
            break
        if np.any(span_of[first[k]:last[k]] >= 0):
            continue
        span_of[first[k]:last[k]] = len(taken)
        taken.append(k)
    taken = np.array(taken, np.int64)
    order = np.argsort(first[taken], kind="mergesort")          # numbered along the path
    renumber = np.empty(len(order), np.int64)
    renumber[order] = np.arange(len(order))
    span_of[span_of >= 0] = renumber[span_of[span_of >= 0]]
    taken = taken[order]
    path_units = np.zeros(rel.allowed.shape[0], bool)
    path_units[rel.unit[path_ops]] = True
    route_ptr, route_cut, route_pre, route_suf, q_bytes = [0], [], [], [], []
    for k in taken:
        if k < n_chords:
            route_ptr.append(route_ptr[-1])
            q_bytes.append(0.0)
            continue
        edges = _route_edges(graph, position, side_exit[k - n_chords], via)[::-1].tolist()   # x -> q_1, .., q_r -> w
        units = [int(rel.unit[graph.edge_dst[e]]) for e in edges[:-1]]
        for cut_at in range(len(edges)):              # q_1 .. q_cut_at before it, the rest after
            route_cut.append(float(rel.cut_us[edges[cut_at]]))
            route_pre.append(_off_path_bytes(rel, path_units, units[:cut_at]))
            route_suf.append(_off_path_bytes(rel, path_units, units[cut_at:]))
        route_ptr.append(len(route_cut))
        q_bytes.append(_off_path_bytes(rel, path_units, units))
    return (span_of, first[taken], last[taken], np.ascontiguousarray(cross[taken]), taken < n_chords,
            np.ascontiguousarray(np.concatenate([np.zeros(n_chords), side_us])[taken]),
            np.ascontiguousarray(leave[taken]), np.array(route_ptr, np.int64), np.array(route_cut, np.float64),
            np.array(route_pre, np.float64), np.array(route_suf, np.float64), np.array(q_bytes, np.float64))


def _route_edges(graph, position: np.ndarray, exit_edge: int, via: np.ndarray) -> np.ndarray:
    """A side route's edges from its last (``exit_edge``, into the path) back to its first (out of the path),
    following ``via`` (``_side_routes``' per-op edge in) while the edge comes from an off-path op."""
    edges = [int(exit_edge)]
    while position[graph.edge_src[edges[-1]]] < 0:
        edges.append(int(via[graph.edge_src[edges[-1]]]))
    return np.asarray(edges, np.int64)


def _off_path_bytes(rel: Relaxation, path_units: np.ndarray, units: list) -> float:
    """Persistent bytes of these units, each once, leaving out the path's own (already in a run)."""
    kept = [u for u in set(units) if not path_units[u]]
    return float(rel.unit_bytes[kept].sum()) if kept else 0.0


@njit(cache=True)
def _side_routes(topo_order, pred_ptr, pred_edge, edge_src, succ_ptr, succ_edge, edge_dst, position, time_us,
                 cut_us, max_span):
    """Per off-path op, one route to it from the path through off-path ops only (the latest entry,
    then the longest); each that ends on the path two or more positions after its entry is a side
    route: (entry, exit, time of its off-path ops, cheapest cut, next cheapest cut, its last edge) as
    arrays, and per op the edge its route comes in by."""
    n = time_us.shape[0]
    entry = np.full(n, -1, np.int64)
    length = np.zeros(n)
    cheap1 = np.full(n, np.inf)
    cheap2 = np.full(n, np.inf)
    via = np.full(n, -1, np.int64)
    n_edges = edge_dst.shape[0]
    out_a, out_b, out_e = np.empty(n_edges, np.int64), np.empty(n_edges, np.int64), np.empty(n_edges, np.int64)
    out_p, out_c1, out_c2 = np.empty(n_edges), np.empty(n_edges), np.empty(n_edges)
    found = 0
    for v in topo_order:
        if position[v] >= 0:
            continue
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            e = pred_edge[k]
            u = edge_src[e]
            if position[u] >= 0:
                a, p, c1, c2 = position[u], 0.0, np.inf, np.inf
            elif entry[u] >= 0:
                a, p, c1, c2 = entry[u], length[u], cheap1[u], cheap2[u]
            else:
                continue
            c = cut_us[e]
            if c < c1:
                c1, c2 = c, c1
            elif c < c2:
                c2 = c
            if a > entry[v] or (a == entry[v] and p > length[v]):
                entry[v], length[v], cheap1[v], cheap2[v], via[v] = a, p, c1, c2, e
        if entry[v] < 0:
            continue
        length[v] += time_us[v]
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            e = succ_edge[k]
            b = position[edge_dst[e]]
            if b >= entry[v] + 2 and b - entry[v] <= max_span and length[v] > 0:
                c1, c2, c = cheap1[v], cheap2[v], cut_us[e]
                if c < c1:
                    c1, c2 = c, c1
                elif c < c2:
                    c2 = c
                if c1 < np.inf:
                    out_a[found], out_b[found], out_p[found] = entry[v], b, length[v]
                    out_c1[found], out_c2[found], out_e[found] = c1, c2, e
                    found += 1
    return out_a[:found], out_b[:found], out_p[:found], out_c1[:found], out_c2[:found], out_e[:found], via


@njit(cache=True)
def _span_charge_us(e, state, held_after, x_run_bytes, between_us, capacity, time_us, edge_cut_us, before, pair_queue,
                    end_queue, span_of, span_first, span_last, cross_us, is_chord, side_us, leave_us, route_ptr,
                    route_cut, route_pre, route_suf, q_bytes):
    """What a span adds to its cuts when its last cut is edge ``e`` (states of ``_path_cut_us``:
    0 one cut, 2 + k two or more, the first k + 1 edges before ``e`` and the least cuts between,
    ``between_us``), w's run holding ``held_after`` bytes of path units at least and x's run
    ``x_run_bytes[e]``."""
    if e < 0 or span_of[e] < 0:
        return 0.0
    s = span_of[e]
    a, b, cross = span_first[s], span_last[s], cross_us[s]
    inside = before[b] - before[a]          # S: the path from the start of x to the start of w
    if state == 0 and e == a and is_chord[s]:     # x's one transfer to w's device carries both edges
        return max(0.0, cross - edge_cut_us[a])
    cuts = edge_cut_us[e]
    if state >= 2:
        cuts += edge_cut_us[e - (state - 2) - 1] + between_us[e, state - 2]
    queued = 0.0
    if is_chord[s] and (pair_queue if state == 0 else end_queue):     # two transfers take turns
        queued = edge_cut_us[e]
        if before[e + 1] > before[a + 1]:   # x finishes first: its transfer is booked first
            queued += before[b] - before[e + 1]
    if state == 0 and not is_chord[s] and route_ptr[s + 1] > route_ptr[s]:
        cross = leave_us[s]                 # the route changes device once, where both sides fit, or twice
        for k in range(route_ptr[s], route_ptr[s + 1]):
            if x_run_bytes[e] + route_pre[k] <= capacity and held_after + route_suf[k] <= capacity:
                cross = min(cross, side_us[s] + route_cut[k])
    return max(0.0, time_us[a] + cross + queued - inside - cuts)


@njit(cache=True)
def _together_us(s, held, capacity, before, span_first, span_last, is_chord, side_us, leave_us, q_bytes):
    """What span ``s`` adds when no cut falls in it and its run holds ``held`` bytes of path units:
    a side route runs beside the path on the run's device if its bytes fit there, else leaves."""
    if is_chord[s]:
        return 0.0
    leaving = max(0.0, leave_us[s] - (before[span_last[s]] - before[span_first[s] + 1]))
    if held + q_bytes[s] <= capacity:
        return min(side_us[s], leaving)
    return leaving


@njit(cache=True)
def _path_cut_us(units, unit_bytes, time_us, edge_cut_us, capacity, pair_queue, end_queue, span_of, span_first,
                 span_last, cross_us, is_chord, side_us, leave_us, route_ptr, route_cut, route_pre, route_suf, q_bytes):
    """Least cost of the cuts of a path and what its spans add to them, over the ways to split it
    into runs that fit ``capacity`` (``memory_path_us``; edge ``i`` joins path ops ``i`` and ``i + 1``,
    an inf edge cannot be cut). A span's two ends share a device either in one run (no cut in the
    span) or across a *hole*: the path leaves x's run inside the span and comes back before w, and
    x's and w's runs fit together."""
    m = units.shape[0]
    n_spans = span_first.shape[0]
    width = 2
    ends_at = np.full(m, -1, np.int64)       # the span whose w is at this position
    for s in range(n_spans):
        width = max(width, span_last[s] - span_first[s] + 1)
        ends_at[span_last[s]] = s
    before = np.zeros(m + 1)
    for i in range(m):
        before[i + 1] = before[i] + time_us[i]
    seen = np.full(unit_bytes.shape[0], -1, np.int64)
    home = np.full(unit_bytes.shape[0], -1, np.int64)
    stamp = 0
    x_run_bytes = np.zeros(max(m - 1, 1))     # per edge e in a span: path units' bytes of x .. v_e
    for s in range(n_spans):
        stamp += 1
        held = 0.0
        for i in range(span_first[s], span_last[s]):
            if seen[units[i]] != stamp:
                seen[units[i]] = stamp
                held += unit_bytes[units[i]]
            x_run_bytes[i] = held
    # between[e, k]: least cost of the cuts strictly between f = e - k - 1 and e, both cut in one
    # span, every run between them fitting (inf: none does)
    between = np.full((max(m - 1, 1), width), np.inf)
    for s in range(n_spans):
        for f in range(span_first[s], span_last[s]):
            if edge_cut_us[f] == np.inf:
                continue
            to = np.full(span_last[s] - f, np.inf)     # to[e - f]: least cuts after f up to e, e included
            for e in range(f + 1, span_last[s]):
                if edge_cut_us[e] == np.inf:
                    continue
                stamp += 1
                held = 0.0
                for j in range(e - 1, f - 1, -1):       # the run j + 1 .. e, after a cut at j
                    u = units[j + 1]
                    if seen[u] != stamp:
                        seen[u] = stamp
                        held += unit_bytes[u]
                    if held > capacity:
                        break
                    prior = 0.0 if j == f else to[j - f]
                    to[e - f] = min(to[e - f], prior + edge_cut_us[e])
                between[e, e - f - 1] = to[e - f] - edge_cut_us[e]
    # value[e + 1, state]: least cost so far when the last cut is edge e (-1: none yet)
    value = np.full((m, width), np.inf)
    value[0, 0] = 0.0
    best = np.inf
    for e in range(-1, m - 1):
        out = np.inf                       # least cost with e's span closed, w's run not yet known
        inside_from = 0                    # the first span after e
        while inside_from < n_spans and span_first[inside_from] <= e:
            inside_from += 1
        for state in range(width):
            v = value[e + 1, state]
            if v == np.inf:
                continue
            out = min(out, v + _span_charge_us(e, state, 0.0, x_run_bytes, between, capacity, time_us, edge_cut_us,
                                               before, pair_queue, end_queue, span_of, span_first, span_last,
                                               cross_us, is_chord, side_us, leave_us, route_ptr, route_cut,
                                               route_pre, route_suf, q_bytes))
            stamp += 1
            held = 0.0
            inside_to = inside_from        # spans inside_from .. inside_to - 1 lie whole in the run
            for e2 in range(e + 1, m):     # the run e + 1 .. e2, then a cut at e2 (or the path's end)
                u = units[e2]
                if seen[u] != stamp:
                    seen[u] = stamp
                    held += unit_bytes[u]
                if held > capacity:
                    break
                if ends_at[e2] >= 0 and span_first[ends_at[e2]] > e:
                    inside_to = ends_at[e2] + 1
                c = edge_cut_us[e2] if e2 < m - 1 else 0.0
                if c == np.inf:
                    continue
                if e2 < m - 1 and e >= 0 and span_of[e] >= 0 and span_of[e2] == span_of[e]:
                    if state == 0:             # the span's last cut, the least cuts between
                        nxt = 2 + (e2 - e - 1)
                        value[e2 + 1, nxt] = min(value[e2 + 1, nxt], v + between[e2, e2 - e - 1] + c)
                    continue
                total = v + c + _span_charge_us(e, state, held, x_run_bytes, between, capacity, time_us,
                                                edge_cut_us, before, pair_queue, end_queue, span_of, span_first,
                                                span_last, cross_us, is_chord, side_us, leave_us, route_ptr,
                                                route_cut, route_pre, route_suf, q_bytes)
                for s in range(inside_from, inside_to):
                    total += _together_us(s, held, capacity, before, span_first, span_last, is_chord, side_us,
                                          leave_us, q_bytes)
                if e2 == m - 1:
                    best = min(best, total)
                else:
                    value[e2 + 1, 0] = min(value[e2 + 1, 0], total)
        if out == np.inf:
            continue
        # holes: x's run starts at e + 1, leaves at edge h1 in a span, returns at edge h2 before w
        stamp += 1
        home_id = stamp
        held_home = 0.0
        i = e + 1                          # next position to add to x's run
        x_spans_us = 0.0                   # what the spans x's run holds whole, before span s, add
        for s in range(inside_from, n_spans):
            a, b = span_first[s], span_last[s]
            if s > inside_from:            # x's run holds at least the bytes added so far
                x_spans_us += _together_us(s - 1, held_home, capacity, before, span_first, span_last, is_chord,
                                           side_us, leave_us, q_bytes)
            for h1 in range(a, b - 1):
                while i <= h1 and held_home <= capacity:
                    u = units[i]
                    if home[u] != home_id:
                        home[u] = home_id
                        held_home += unit_bytes[u]
                    i += 1
                if held_home > capacity:
                    break
                if edge_cut_us[h1] == np.inf:
                    continue
                for h2 in range(h1 + 1, b):
                    if edge_cut_us[h2] == np.inf:
                        continue
                    cost = out + edge_cut_us[h1] + edge_cut_us[h2] + x_spans_us
                    stamp += 1
                    joint = held_home
                    following = s + 1              # the next span w's run may hold whole
                    for t in range(h2 + 1, m):      # w's run h2 + 1 .. t on x's device
                        u = units[t]
                        if home[u] != home_id and seen[u] != stamp:
                            seen[u] = stamp
                            joint += unit_bytes[u]
                        if joint > capacity:
                            break
                        if following < n_spans and span_last[following] == t:
                            cost += _together_us(following, joint, capacity, before, span_first, span_last, is_chord,
                                                 side_us, leave_us, q_bytes)
                            following += 1
                        if t < b:
                            continue
                        if t == m - 1:
                            best = min(best, cost)
                            break
                        if edge_cut_us[t] < np.inf:
                            value[t + 1, 0] = min(value[t + 1, 0], cost + edge_cut_us[t])
            if held_home > capacity:
                break
    return best


def lower_bounds(graph, cluster) -> dict:
    """Every bound (microseconds), the best (largest) and its name.

    An OutOfMemoryError if memory alone shows that no placement fits."""
    rel = relaxation(graph, cluster)
    bounds = {
        "critical_path_us": critical_path_us(graph, rel),
        "comm_path_us": comm_path_us(graph, rel),
        "work_us": work_us(rel),
        "largest_group_us": largest_group_us(rel),
        "interval_work_us": interval_work_us(graph, cluster, rel),
        "memory_path_us": memory_path_us(graph, cluster, rel),
        "cut_threshold_us": cut_threshold_us(graph, cluster, rel),
        "cluster_order_us": cluster_order_us(graph, rel),
        "turn_path_us": turn_path_us(graph, cluster, rel),
    }
    best = max(bounds, key=bounds.__getitem__)
    return bounds | {"best_us": bounds[best], "best": best}


__all__ = ["lower_bounds", "relaxation", "Relaxation", "BOUND_NAMES"]
