"""A fork-join window's channel charge: a branch that leaves the device of its fork or join crosses
back and forth on that device's one channel, and those crossings take turns.

NASNet's cell branches run 0.1-0.7 ms of forward work each, while a 4.4 MB activation takes
0.9 ms to cross (134 us + bytes / 5.70 GB/s). ``fork_join`` charges a leaving branch its crossing
once, as delay; under ``sequential`` (and ``duplex``) the crossings of all leaving branches also
queue on the one channel of the device they leave and come back to, which is what this charges.

Facts beyond F1-F4 (``devplace/sim``): (F5) under ``sequential`` a transfer of duration D > 0 from
device a to b holds a's channel and b's channel from its begin to begin + D, and two transfers
that share a device never overlap (``channels.book`` sets begin = max(ready, free[a], free[b]) and
then both to begin + D, so each channel's free time only grows and is the end of its latest
transfer); under ``duplex`` it holds a's send channel and b's receive channel, with the same
consequence for two transfers from one device or into one device. (F6) When an op u finishes, the
engine books one transfer per other device holding a consumer of u, lasting as long as u's
longest edge to that device (``engine.destinations``): two transfers with different producers
are different transfers.

Definitions, for a window (f, j) of ``fork_join`` with region R: a *component* C is a weakly
connected part of R (over the edges with both ends in R); p(C) its ops' fastest times; key_C the
least key_u (``fork_join``) over u in C. in_C: the least, over u in C, of the largest cut cost of
an edge into u from f or from C; out_C: the least, over u in C, of the largest cut cost of an edge
from u to j or into C (cut costs of the relaxation, at most the edge's transfer time on any link
its ends may use).

Claim: with f and j on one device d and S the components with an op off d, start(j) - finish(f)
>= max(key_S, p(not S), chan_d(S)), key_S the largest key_C over S, p(not S) the total p of the
other components, and chan_d(S) = sum over S of out_C + min over S of in_C (``sequential``; under
``duplex`` the larger of the two; 0 for an empty S). With f on d1 and j on d2 != d1, A the
components wholly on d1, B those wholly on d2 and M the rest: start(j) - finish(f) >= max(p(A),
p(B), sum over A of out_C + [B or M not empty] min over B and M of in_C, sum over A and M of out_C +
[B not empty] max over B of in_C). ``together_us`` and ``apart_us`` are the least of these over
every S, and over every split into A, B and M.

Proof. Every u in R descends from f and leads to j, so finish(f) <= start(u) and finish(u) <=
start(j) (F2). The ops of a component on one device run one at a time (F1) inside the window:
p(not S) (together), p(A) and p(B) (apart). key_S: ``fork_join``'s proof (an op off both ends'
device waits at least its key). Channel, together case: take C in S and u its last op off d in
topological order; u leads to j through C, so it has a successor in C or j, and every such
successor is on d (a later op of C, or j): each such edge crosses from u's device to d, so u's one
transfer to d (F6) begins at or after finish(u) >= finish(f), ends before its consumer starts, at
or before start(j), and lasts at least the edge's cut cost (F2), hence at least out_C. These
transfers have different producers, so they are different transfers (F6), and each holds d's
channel (its receive channel under ``duplex``). Take u' the first op of some C in S off d in
topological order: u' has a predecessor in C or f (it descends from f through R), all on d, so a
transfer from d to u''s device lasts at least in_C and lies in the window as well; its producer is
on d, so it is none of the transfers above (their producers are off d), and it holds d's channel
(its send channel under ``duplex``). By F5 transfers that hold one channel never overlap, so the
window holds their total (under ``duplex`` the receive and the send channel separately, so the
larger of the two). Apart case: each C in A or M has an op off d2; its last one u sends to d2 (its
successors in C and j are on d2) one transfer of at least out_C inside the window, held on d2's
channel (receive channel), and for C in A also on d1's (send channel: u is on d1). Each C in B or
M has an op off d1; its first one u' receives from a producer on d1 a transfer of at least in_C,
held on d1's channel (send channel). For C in B, u' and all of C are on d2, so u''s only
predecessor in C or f is f: f's one transfer to d2 lasts at least in_C for every C in B (F6),
held on d2's channel (receive channel) too. Producers differ (ops of distinct components, or f),
so on d1 these are at least sum over A of out_C plus one in-transfer, and on d2 sum over A and M
of out_C plus f's transfer; F5 gives both sums as lower bounds. Every placement falls in one case
with one S or one split, so the window is at least the least over them. Above ``MAX_TOGETHER`` /
``MAX_APART`` components the charge is not computed (0): it costs 2^k and 3^k."""

from __future__ import annotations

from numba import njit
import numpy as np

MAX_TOGETHER = 12      # components: 2^k subsets
MAX_APART = 8          # components: 3^k splits
SEQUENTIAL, DUPLEX = 1, 2       # ``devplace.sim.channels`` codes; other models get no channel charge


@njit(cache=True)
def _components(region, inside, j, pred_ptr, pred_edge, edge_src, label):
    """Labels the region's ops (``label[u]``) by weakly connected part; returns how many parts."""
    m = region.shape[0]
    parent = np.arange(m)
    for t in range(m):                     # ``label`` holds each op's index in ``region`` first
        label[region[t]] = t
    for t in range(m):
        u = region[t]
        for k in range(pred_ptr[u], pred_ptr[u + 1]):
            w = edge_src[pred_edge[k]]
            if inside[w] != j:
                continue
            a, b = label[w], t
            while parent[a] != a:
                a = parent[a]
            while parent[b] != b:
                b = parent[b]
            if a != b:
                parent[max(a, b)] = min(a, b)
    roots = np.full(m, -1, np.int64)
    n_parts = 0
    for t in range(m):
        r = t
        while parent[r] != r:
            r = parent[r]
        if roots[r] < 0:
            roots[r] = n_parts
            n_parts += 1
    for t in range(m):
        r = t
        while parent[r] != r:
            r = parent[r]
        label[region[t]] = roots[r]
    return n_parts


@njit(cache=True)
def _crossing_us(f, j, region, inside, label, adj_ptr, adj_edge, edge_other, cut_us, n_parts):
    """Per component, the least over its ops of the largest cut cost of an edge from ``f`` or from
    its own component (the neighbours ``adj`` gives: predecessors for in_C, successors for out_C)."""
    best = np.full(n_parts, np.inf)
    for u in region:
        largest = -1.0
        for k in range(adj_ptr[u], adj_ptr[u + 1]):
            e = adj_edge[k]
            w = edge_other[e]
            if w == f or (inside[w] == j and label[w] == label[u]):
                largest = max(largest, cut_us[e])
        if largest >= 0.0:
            best[label[u]] = min(best[label[u]], largest)
    return best


@njit(cache=True)
def channel_window_us(f, j, region, inside, key, pred_ptr, pred_edge, edge_src, succ_ptr, succ_edge, edge_dst,
                      time_us, cut_us, comm_model, reverse, label):
    """(together, apart): the module docstring's least charges for the window (f, j) over ``region``
    (``key`` per op of the region, in its order); (0, 0) when the model has no per-device channel or
    the region has more components than the limits. ``reverse``: the graph is walked backwards (the
    tails), so f is the join and the crossings change direction."""
    if comm_model != SEQUENTIAL and comm_model != DUPLEX:
        return 0.0, 0.0
    m = region.shape[0]
    k = _components(region, inside, j, pred_ptr, pred_edge, edge_src, label)
    if k < 2 or k > MAX_TOGETHER:
        return 0.0, 0.0
    from_f = _crossing_us(f, j, region, inside, label, pred_ptr, pred_edge, edge_src, cut_us, k)
    to_j = _crossing_us(j, j, region, inside, label, succ_ptr, succ_edge, edge_dst, cut_us, k)
    into, out = (to_j, from_f) if reverse else (from_f, to_j)     # in_C and out_C in the step's direction
    work = np.zeros(k)
    least_key = np.full(k, np.inf)
    for t in range(m):
        c = label[region[t]]
        work[c] += time_us[region[t]]
        least_key[c] = min(least_key[c], key[t])
    total = work.sum()
    together = total                       # S empty: every component on d
    for s in range(1, 1 << k):
        stay, sent, took, threshold = total, 0.0, np.inf, 0.0
        for c in range(k):
            if s >> c & 1:
                stay -= work[c]
                sent += out[c]
                took = min(took, into[c])
                threshold = max(threshold, least_key[c])
        channel = sent + took if comm_model == SEQUENTIAL else max(sent, took)
        together = min(together, max(threshold, stay, channel))
    if k > MAX_APART:
        return together, 0.0
    apart = np.inf
    split = np.zeros(k, np.int64)          # 0: wholly on f's device (A), 1: wholly on j's (B), 2: elsewhere (M)
    for _ in range(3 ** k):
        on_f, on_j, out_a, out_m, in_bm, in_b = 0.0, 0.0, 0.0, 0.0, np.inf, -1.0
        for c in range(k):
            if split[c] == 0:
                on_f += work[c]
                out_a += out[c]
            elif split[c] == 1:
                on_j += work[c]
                in_bm = min(in_bm, into[c])
                in_b = max(in_b, into[c])
            else:
                out_m += out[c]
                in_bm = min(in_bm, into[c])
        # A is on the step's fork's device: a walk backwards calls the join f, which swaps A and B,
        # a labelling this loop also takes, so the least is the same
        f_channel = out_a + (in_bm if in_bm < np.inf else 0.0)
        j_channel = out_a + out_m + max(in_b, 0.0)
        apart = min(apart, max(max(on_f, on_j), max(f_channel, j_channel)))
        for c in range(k):                 # next split, counting in base 3
            split[c] += 1
            if split[c] < 3:
                break
            split[c] = 0
    return together, apart
