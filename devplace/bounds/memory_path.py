"""Paths whose ops cannot all share a device pay for the cuts memory forces on them, and for the
chords and side routes those cuts make cross."""

from __future__ import annotations

import numpy as np
from numba import njit

from devplace.bounds.relaxation import Relaxation, crossing_us, longest_path
from devplace.errors import OutOfMemoryError

MAX_SPAN = 64        # a span (``memory_path_us``) joins path positions at most this far apart


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
    times), least *crossing costs* c1 <= c2 over its edges (``crossing_us``: at least the cut cost;
    an ordering edge of no bytes on the route still waits for the data path beside it), B_Q the
    persistent bytes of its ops' units that hold no path op. Its *cross* cost X is c_xw, or
    P_Q + c1; I = p_a+1 + .. + p_b-1 is the path's time strictly inside (S = p_a + I). Spans whose
    charges can be positive are taken,
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
    finish(x) >= start(x) + p_a (an edge of the route whose ends are apart starts its consumer at
    least its crossing cost after its producer finishes, ``crossing_us``). No cut in the span: x,
    w and the path between share one device d; if the side route's ops are on d too, d runs them
    and the path's inner ops, one at a time, between finish(x) and start(w) (F1; all descend from
    x and lead to w): start(w) >= finish(x) + I + P_Q,
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
    route_cut_us = crossing_us(graph, rel.fastest_us, cut_us)      # side routes' edges (not chords, not P's)
    scale = max(float(rel.fastest_us.sum()), 1e-9) / max(float(capacity[0]), 1.0)
    best = 0.0
    zero_edges = np.zeros(graph.n_edges)
    pair_queue = cluster.comm_model != "pipelined"         # x -> w's device and the cut share a channel
    end_queue = cluster.comm_model in ("sequential", "duplex")   # two transfers into w's device do
    for k in range(n_paths):
        weight = rel.fastest_us + (0.0 if k == 0 else scale * 2.0 ** (k - n_paths // 2)) * op_bytes
        path_ops, path_edges = longest_path(graph, weight, zero_edges)
        units = rel.unit[path_ops]
        held = rel.unit_bytes[np.unique(units)].sum()
        position = np.full(graph.n_ops, -1, np.int64)
        position[path_ops] = np.arange(len(path_ops))
        side_routes = _side_routes(graph.topo_order, graph.pred_ptr, graph.pred_edge, graph.edge_src, graph.succ_ptr,
                                   graph.succ_edge, graph.edge_dst, position,
                                   np.ascontiguousarray(rel.fastest_us, dtype=np.float64),
                                   route_cut_us, MAX_SPAN)
        spans = _path_spans(graph, rel, path_ops, position, side_routes, route_cut_us)
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
    part of the path's; spans share no edges). The stretch's side routes, taken with no op in
    common (R), are charged by the cuts K the split makes inside the stretch (``_split_routes_us``):
    K splits the stretch's path ops v_lo .. v_hi into *segments*, each on one device d. A route j
    of R from x_j to w_j inside one segment either runs on d too, between finish(x_j) and
    start(w_j) (F1: d runs it and the segment's path ops one at a time; all of it descends from x_j
    and leads to w_j), or leaves d and comes back over two cut edges of its own (start(w_j) >=
    finish(x_j) + P_j + c1 + c2, as for one span; memory is not asked: fewer constraints, a smaller
    least). So for a segment v_A .. v_B, start(v_B) - start(v_A) is at least the path's time p_A
    .. p_B-1 plus the least, over which of its routes stay, of the larger of the staying routes'
    P_j summed and the largest *excess* P_j + c1 + c2 - I_j of a leaving one (I_j: the path's
    time strictly between x_j and w_j; the path ops before x_j and after w_j in the segment run
    too, in order). The cut edge after v_B delays v_B+1 by its cut cost past v_B's finish (F2).
    Summed over the segments, start(v_hi) - start(v_lo) is at least the path's time p_lo ..
    p_hi-1, the cuts of K and every segment's charge (routes crossing a cut are charged nothing
    here). The least over K of that excess is a lower bound on the same interval as the spans
    alone are, so a stretch adds at least the larger of the two, and stretches share no edges
    (their intervals start(v_lo) .. start(v_hi) share at most an end). ``position`` (per op, its
    place on the path or -1) and ``side_routes`` (``_side_routes``) are the ones the spans were
    taken from."""
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
    side_a, side_b, side_us, cut1, cut2, _, _ = side_routes
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
            start = int(min(lo_edge[j] for j in members))
            total += _stretch_us(graph, members, len(first), alone, routes, side_routes, leaving, position,
                                 start, edge_cut_us[start:k_end])
        if i is not None:
            members, k_end = [i], int(hi_edge[i])
    return total


def _stretch_us(graph, members, n_spans, alone, routes, side_routes, leaving, position, start: int,
                stretch_cut_us) -> float:
    """``_fitting_path_us`` of one stretch starting at path position ``start``: the larger of its spans
    alone and ``_split_routes_us`` over its side routes, taken longest first, each with no op in
    common with those taken before."""
    side_a, side_b, side_us, _, _, side_exit, via = side_routes
    spans_us = float(sum(alone[j] for j in members if j < n_spans))
    taken, used = [], set()
    for j in sorted((j - n_spans for j in members if j >= n_spans), key=lambda r: -side_us[routes[r]]):
        r = routes[j]
        ops = graph.edge_src[_route_edges(graph, position, side_exit[r], via)[:-1]].tolist()   # its off-path ops
        if used.isdisjoint(ops):
            used.update(ops)
            taken.append(r)
    taken = np.array(taken, np.int64)
    routes_us = _split_routes_us(np.ascontiguousarray(stretch_cut_us, dtype=np.float64), side_a[taken] - start,
                                 side_b[taken] - start, np.ascontiguousarray(leaving[taken], dtype=np.float64),
                                 np.ascontiguousarray(side_us[taken], dtype=np.float64))
    return max(routes_us, spans_us)


@njit(cache=True)
def _split_routes_us(edge_cut_us, route_a, route_b, excess_us, stay_us):
    """Least over the cuts of a stretch (``_fitting_path_us``; path positions 0 .. L, edge i joins
    i and i + 1, an inf edge is never cut) of the cuts' sum plus, per segment between cuts, the
    least over which of the routes inside it (positions ``route_a`` .. ``route_b``) stay of the
    larger of their ``stay_us`` summed and the largest ``excess_us`` of a leaving one. The least
    over every set that stays is the least over those that keep the routes of the largest
    excesses (a set's largest leaving excess is that of the first route it leaves, sorted by
    excess): one sweep per segment."""
    n_edges = edge_cut_us.shape[0]
    n_routes = route_a.shape[0]
    ending = np.argsort(route_b, kind="mergesort")
    value = np.full(n_edges + 1, np.inf)     # value[s]: least cost before a segment starting at s
    value[0] = 0.0
    best = np.inf
    excess = np.empty(n_routes)              # the segment's routes, largest excess first
    stay = np.empty(n_routes)
    for s in range(n_edges + 1):
        if value[s] == np.inf:
            continue
        k = 0                                # routes in the segment s .. t
        next_end = 0                         # the next route (by its w) to look at
        charge = 0.0
        for t in range(s, n_edges + 1):
            added = False
            while next_end < n_routes and route_b[ending[next_end]] <= t:
                r = ending[next_end]
                next_end += 1
                if route_a[r] < s:
                    continue
                i = k
                while i > 0 and excess[i - 1] < excess_us[r]:
                    excess[i], stay[i] = excess[i - 1], stay[i - 1]
                    i -= 1
                excess[i], stay[i] = excess_us[r], stay_us[r]
                k += 1
                added = True
            if added:
                charge = excess[0]           # everything leaves
                staying = 0.0
                for i in range(k):
                    staying += stay[i]
                    charge = min(charge, max(staying, excess[i + 1] if i + 1 < k else 0.0))
            if t == n_edges:
                best = min(best, value[s] + charge)
            elif edge_cut_us[t] < np.inf:
                value[t + 1] = min(value[t + 1], value[s] + charge + edge_cut_us[t])
    return best


def _path_spans(graph, rel: Relaxation, path_ops: np.ndarray, position: np.ndarray, side_routes,
                route_cut_us: np.ndarray):
    """The spans ``_path_cut_us`` charges on a path (``memory_path_us``; ``position``: per op its place on
    the path or -1; ``side_routes``: its ``_side_routes``), as arrays: per path edge
    its span (-1: none); per span its first and last path position (x and w), its cross cost X,
    whether it is a chord, a side route's time P_Q and P_Q + c1 + c2; per side route edge (spans'
    runs of ``route_ptr``) its crossing cost (``route_cut_us``) and the persistent bytes of the
    route's units (those off the path) before and after it; per span those bytes in all.

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
            route_cut.append(float(route_cut_us[edges[cut_at]]))
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
