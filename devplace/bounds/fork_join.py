"""Fork-join windows: the side branches between a fork and its join run in turn on the devices at
its two ends, or cross to another device and back. They raise the heads and tails of
``comm_windows``, which the path and window bounds read (``Relaxation.head_us``, ``tail_us``)."""

from __future__ import annotations

import numpy as np
from numba import njit

MAX_REGION_OPS = 400     # a join whose region holds more ops gets no window (it only costs time)


def fork_join_windows(graph, fastest_us: np.ndarray, cut_us: np.ndarray, forced_cut: np.ndarray, head_us: np.ndarray,
                      tail_us: np.ndarray):
    """Per op v, (H_v, G_v): a least start time and a least time from its finish to the step's
    end, once each join j waits, after its fork f finishes, for a *window* X(f, j) that charges
    the ops between them for running side by side (p: fastest time incl. op gap).

    The fork of a join j (an op with two or more predecessors that have predecessors of their own)
    is the nearest common ancestor of those predecessors in the tree where each op's parent is the
    predecessor that ends the longest path to it (on a tie, one with predecessors of its own: a
    weight feeding many ops would hide the fork). Its *region* R is every op that descends from f
    and leads to j (f, j left out); joins whose region is empty or holds more than
    ``MAX_REGION_OPS`` ops get no window. For u in R: e_u, the longest path from f to u by fastest
    times of the ops strictly between; q_u likewise from u to j; L_u = e_u + p_u + q_u. in_u, what
    f -> u takes when it crosses devices: the larger of e_u + the least cut cost (``cut_us``; inf if
    never cut) of an edge on any path from f to u, and, for one path from f to u (built hop by hop,
    each op extending its predecessor's path that makes the sum largest), the p of its ops strictly
    between + the least cut cost of its own edges; out_u likewise from u to j (a branch that an
    ordering edge of no bytes joins to f still has to cross where its data comes in). key_u = in_u +
    p_u + out_u; lead and trail, the least over u of in_u and of out_u. With W(>T)
    the total p of the ops of R whose key is above T, *together* is the least, over T in 0 and the
    keys, of max(T, W(>T)), and *apart* the least of max(T, split(W(>T))), split(W) = min((W + lead
    + trail) / 2, W + min(lead, trail)) (0 if W = 0), or the largest over u of
    min(in_u + p_u + q_u, e_u + p_u + out_u) if that is more. X(f, j) = min(together, apart).
    H_v is the largest of head_v (``head_us``), H_u + p_u (+ the cut cost if always cut,
    ``forced_cut``) over v's predecessors u, and H_f + p_f + X(f, v) if v has a window. G is the
    same on the reversed graph (tail_v, ``tail_us``, for head_v; successors; each fork f with two
    or more successors gets the window to its join, the nearest common descendant of the
    successors' tree): G_f >= G_j + p_j + X(f, j).

    Proof, for a valid placement and priority; by induction in topological order H_v <= start(v).
    head_v is (given, ``comm_windows``); v starts after each predecessor u finishes, at least p_u
    after u starts (F1, F3), and an always-cut edge adds its transfer (F2). For a window it is enough that
    start(j) - finish(f) >= X(f, j). Every op of R descends from f and leads to j: it runs between
    finish(f) and start(j) (F2). For u in R and any path f -> .. -> u, each op on it starts no
    earlier than its predecessor finishes, plus the transfer, at least the edge's cut cost, where
    the edge joins two devices (F2), and runs at least its fastest time (F1, F3): start(u) >=
    finish(f) + the path's p; if u is not on f's device some edge of that path joins two devices,
    so start(u) >= finish(f) + the path's p + its least cut cost. Taken for a longest path (whose
    least cut is at least the least over all paths) and for the chosen path: start(u) >= finish(f)
    + e_u, and >= finish(f) + in_u if u is off f's device. Likewise start(j) >= finish(u) + q_u,
    and >= finish(u) + out_u if u is off j's device. So the window is at least L_u, at least
    in_u + p_u + q_u if u is off f's device, e_u + p_u + out_u if off j's, key_u if off both. An
    edge never cut (cut cost inf) joins ops on one device, so an infinite key only says where u
    must be. The ops of R on one device run there one at a time (F1), each at
    least its fastest time, all inside the window, so their total p is at most the window.
    f and j on one device d: let T be the largest key of an op of R off d (0 if none), at most
    the window; every op with key above T is on d, so the window is at least max(T, W(>T)), at
    least together. f and j apart: every u is off f's device or off j's, so the window is at least
    min(in_u + p_u + q_u, e_u + p_u + out_u). Let A and B be the ops of R on f's device and on j's. If A is
    not empty, its last op u to finish finishes no earlier than finish(f) + the total p of A (they
    run there one at a time after f), and j starts at least out_u later (u is off j's
    device): the window is at least p(A) + trail. If B is not empty, its first op to start starts
    no earlier than finish(f) + lead (it is off f's device) and the others run after it, one at a
    time, before j: the window is at least lead + p(B). Let T be the largest key of an op on
    neither device (0 if none), at most the window: the ops with key above T are in A or B, so if
    W(>T) > 0 one of them is not empty and the window is at least (W(>T) + lead + trail) / 2 (both)
    or W(>T) + min(lead, trail) (one), at least split(W(>T)): so at least apart. Either case is at
    least X(f, j). Reversed, from tail_v <= step - finish(v), the same gives G_v <= step - finish(v):
    step - finish(f) >= step - finish(j) + p_j + X(f, j)."""
    p = np.ascontiguousarray(fastest_us, dtype=np.float64)
    cut = np.ascontiguousarray(cut_us, dtype=np.float64)
    head = _window_heads(graph.topo_order, graph.pred_ptr, graph.pred_edge, graph.edge_src, graph.succ_ptr,
                         graph.succ_edge, graph.edge_dst, p, cut, forced_cut,
                         np.ascontiguousarray(head_us, dtype=np.float64), MAX_REGION_OPS)
    tail = _window_heads(graph.topo_order[::-1].copy(), graph.succ_ptr, graph.succ_edge, graph.edge_dst,
                         graph.pred_ptr, graph.pred_edge, graph.edge_src, p, cut, forced_cut,
                         np.ascontiguousarray(tail_us, dtype=np.float64), MAX_REGION_OPS)
    return head, tail


@njit(cache=True)
def _window_heads(order, pred_ptr, pred_edge, edge_src, succ_ptr, succ_edge, edge_dst, time_us, cut_us, forced_cut,
                  floor_us, max_region):
    """H of ``fork_join_windows`` per op (G on the reversed graph)."""
    n = time_us.shape[0]
    rank = np.empty(n, np.int64)
    for k in range(n):
        rank[order[k]] = k
    # the parent tree: each op's predecessor ending the longest path to it, on a tie one that has
    # predecessors of its own (not a weight)
    level = np.zeros(n)
    parent = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    for v in order:
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            u = edge_src[pred_edge[k]]
            if parent[v] < 0:
                parent[v] = u
                continue
            x = parent[v]
            gain = level[u] + time_us[u] - level[x] - time_us[x]
            if gain > 0 or (gain == 0 and pred_ptr[x + 1] == pred_ptr[x] and pred_ptr[u + 1] > pred_ptr[u]):
                parent[v] = u
        if parent[v] >= 0:
            level[v] = level[parent[v]] + time_us[parent[v]]
            depth[v] = depth[parent[v]] + 1
    head = floor_us.copy()
    seen = np.full(n, -1, np.int64)        # seen[u] == j: u leads to j (found walking back from j)
    inside = np.full(n, -1, np.int64)      # inside[u] == j: u is in j's region
    region = np.empty(max_region + 1, np.int64)
    stack = np.empty(max_region + 2, np.int64)
    e_us, q_us = np.zeros(n), np.zeros(n)
    in_us, out_us = np.zeros(n), np.zeros(n)
    least, path_us, path_cut = np.zeros(n), np.zeros(n), np.zeros(n)     # scratch of ``_from_end``
    for j in order:
        best = head[j]
        fork = -2                          # -2: no parent-tree predecessor yet
        for k in range(pred_ptr[j], pred_ptr[j + 1]):
            e = pred_edge[k]
            u = edge_src[e]
            best = max(best, head[u] + time_us[u] + (cut_us[e] if forced_cut[e] else 0.0))
            if pred_ptr[u + 1] == pred_ptr[u] or fork == -1:
                continue
            if fork == -2:
                fork = u
                continue
            a = u                          # nearest common ancestor of fork and u
            while a != fork and a >= 0 and fork >= 0:
                if depth[a] > depth[fork]:
                    a = parent[a]
                elif depth[fork] > depth[a]:
                    fork = parent[fork]
                else:
                    a, fork = parent[a], parent[fork]
            if a < 0 or fork < 0:
                fork = -1
        if fork >= 0:
            m = _region(fork, j, rank, pred_ptr, pred_edge, edge_src, succ_ptr, succ_edge, edge_dst, seen, inside,
                        region, stack, max_region)
            if m > 0:
                best = max(best, head[fork] + time_us[fork] + _window_us(
                    fork, j, region[:m], inside, pred_ptr, pred_edge, edge_src, succ_ptr, succ_edge, edge_dst,
                    time_us, cut_us, e_us, q_us, in_us, out_us, least, path_us, path_cut))
        head[j] = best
    return head


@njit(cache=True)
def _region(f, j, rank, pred_ptr, pred_edge, edge_src, succ_ptr, succ_edge, edge_dst, seen, inside, region, stack,
            max_region):
    """Fills ``region`` with the ops that descend from f and lead to j, in topological order, and
    marks them ``inside[u] = j``; returns how many, or 0 if more than ``max_region``."""
    m = 0
    top = 0
    stack[top] = j
    top += 1
    seen[j] = j
    while top > 0:                         # walk back from j, never past f in topological order
        top -= 1
        v = stack[top]
        for k in range(pred_ptr[v], pred_ptr[v + 1]):
            u = edge_src[pred_edge[k]]
            if u == f or seen[u] == j or rank[u] < rank[f]:
                continue
            seen[u] = j
            if m == max_region:
                return 0
            region[m] = u
            m += 1
            stack[top] = u
            top += 1
    top = 0
    stack[top] = f
    top += 1
    while top > 0:                         # then forward from f through those ops
        top -= 1
        v = stack[top]
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            w = edge_dst[succ_edge[k]]
            if w != j and seen[w] == j and inside[w] != j:
                inside[w] = j
                stack[top] = w
                top += 1
    kept = 0
    for i in range(m):
        if inside[region[i]] == j:
            region[kept] = region[i]
            kept += 1
    ranks = np.empty(kept, np.int64)
    for i in range(kept):
        ranks[i] = rank[region[i]]
    region[:kept] = region[:kept][np.argsort(ranks)]
    return kept


@njit(cache=True)
def _from_end(end, j, ops, inside, adj_ptr, adj_edge, edge_other, time_us, cut_us, length, least, path_us, path_cut,
              crossed):
    """For each op of ``ops`` (each after its neighbours towards ``end``): the longest path from
    ``end`` to it by the times of the ops strictly between (``length``), and a least time between
    ``end`` and it when the two are on different devices (``crossed``): the larger of ``length``
    plus the least cut cost of an edge on any such path (``least``), and, for one path, its own
    length plus its own cheapest cut (``path_us``, ``path_cut``; hop by hop, the neighbour's path
    that makes the sum largest); neighbours: predecessors for f, successors for j."""
    for u in ops:
        length[u], least[u] = 0.0, np.inf
        path_us[u], path_cut[u] = 0.0, -1.0
        for k in range(adj_ptr[u], adj_ptr[u + 1]):
            e = adj_edge[k]
            i = edge_other[e]
            if i == end:
                least[u] = min(least[u], cut_us[e])
                hop_us, hop_cut = 0.0, cut_us[e]
            elif inside[i] == j:
                length[u] = max(length[u], length[i] + time_us[i])
                least[u] = min(least[u], cut_us[e], least[i])
                hop_us, hop_cut = path_us[i] + time_us[i], min(cut_us[e], path_cut[i])
            else:
                continue
            if path_cut[u] < 0 or hop_us + hop_cut > path_us[u] + path_cut[u]:
                path_us[u], path_cut[u] = hop_us, hop_cut
        crossed[u] = max(length[u] + least[u], path_us[u] + path_cut[u])


@njit(cache=True)
def _window_us(f, j, region, inside, pred_ptr, pred_edge, edge_src, succ_ptr, succ_edge, edge_dst, time_us, cut_us,
               e_us, q_us, in_us, out_us, least, path_us, path_cut):
    """X(f, j) of ``fork_join_windows`` over ``region`` (in topological order)."""
    m = region.shape[0]
    _from_end(f, j, region, inside, pred_ptr, pred_edge, edge_src, time_us, cut_us, e_us, least, path_us, path_cut,
              in_us)
    _from_end(j, j, region[::-1], inside, succ_ptr, succ_edge, edge_dst, time_us, cut_us, q_us, least, path_us,
              path_cut, out_us)
    key = np.empty(m)
    work = np.empty(m)
    crossing = 0.0                         # the largest min(in_u + p_u + q_u, e_u + p_u + out_u)
    lead, trail = np.inf, np.inf
    for t in range(m):
        u = region[t]
        key[t] = in_us[u] + time_us[u] + out_us[u]
        work[t] = time_us[u]
        crossing = max(crossing, min(in_us[u] + q_us[u], e_us[u] + out_us[u]) + time_us[u])
        lead = min(lead, in_us[u])
        trail = min(trail, out_us[u])
    ranked = np.argsort(-key)
    together, apart = np.inf, np.inf
    forced = 0.0       # W(> threshold), or more where keys tie: the first of a tie gives the least
    for t in range(m + 1):
        threshold = key[ranked[t]] if t < m else 0.0
        together = min(together, max(threshold, forced))
        split = min((forced + lead + trail) / 2.0, forced + min(lead, trail)) if forced > 0 else 0.0
        apart = min(apart, max(threshold, split))
        if t < m:
            forced += work[ranked[t]]
    return min(together, max(apart, crossing))
