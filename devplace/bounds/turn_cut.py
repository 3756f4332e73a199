"""The first and last cut the forward/backward turn forces on the critical path: the activations a
run of the path makes (or reads) must be held on its device at the turn, or cross its channels in
the time the step leaves; the cut then pays between the heads and tails of ``relaxation``."""

from __future__ import annotations

import numpy as np

from devplace.bounds.relaxation import Relaxation, longest_path, windows_us
from devplace.bounds.turn_path import turn_probe, turn_sides
from devplace.sim.channels import COMM_MODEL_CODES, DUPLEX, SEQUENTIAL


def turn_cut_us(graph, cluster, rel: Relaxation, max_passes: int = 128) -> float:
    """The least step at which the critical path's first (or last) cut can fall where the bytes
    before it (after it) fit one device at the turn plus what its channels can carry, with that
    cut paid between the heads and tails (``relaxation``).

    Take P, the critical path of ``critical_path_us``, ops o_0..o_m, and its probe x = o_q
    (``turn_path_us``; s = start(x)). The hold time of an edge is its fixed time if it has one,
    else its bytes times r = 1 / the fastest link's bandwidth (us per byte). k = 1 for
    ``sequential`` (one channel per device, held at both ends) and ``duplex`` (a send and a
    receive channel), else n_devices - 1 (a channel per ordered pair). *Made* at position a: the
    output of o_a (a != q, in anc(x)) if it has readers in desc(x) and its largest hold time over
    the edges to them, h, is at least r times its output bytes. *Read* at position b: the output of
    an op f in anc(x), f != x, whose first reader on P in desc(x) is o_b, if that edge's hold time
    is at least r times f's output bytes. M_a: made bytes at positions <= a; R_b: read bytes at
    positions >= b; C: the largest memory; K = k / r bytes per us.

    A cut at path edge a (o_a -> o_{a+1}) is *first-able* at T if M_a <= C + K (T - p_x - tail_x),
    i.e. from T_a = p_x + tail_x + max(0, M_a - C) / K on; the first cut is *needed* below
    T_M = p_x + tail_x + (M_m - C) / K. Its value v_a: the longest path with edge a cut, at least
    head(o_a) + p + cut cost + p + tail(o_{a+1}), and where a pass is spent (at most ``max_passes``
    per side, on the edges whose value holds the bound down, least first), the comm path
    (``comm_path_us``) recomputed with edge a always cut. Then g(T) = the least v_a over edges first-able at T (inf if none) below T_M, and
    the bound is the largest min(T, g(T)) over T below T_M, where g steps. Likewise the *last* cut
    at edge a: last-able when R_{a+1} <= C + K (T - head_x), needed below head_x + (R_0 - C) / K.
    The result is the larger of the two, at least the comm path.

    Proof: take a valid placement, any priority, its step T, and suppose the first cut is
    needed at T (M_m > C + K (T - p_x - tail_x)). Uncut path edges join ops on one device. The first
    run (o_0 up to the first cut edge a, or all of P) sits on one device d. s <= T - p_x - tail_x
    (``relaxation``'s tails; x runs at least p_x, F1). Each made item f of the run (outputs of
    distinct ops, as in ``turn_path_us`` and ``sim/engine.memory_events``): f lives on d from
    start(f) <= s until its readers on d finish and its transfers end. If a reader in desc(x) is on
    d (it finishes after s), or a transfer of f has not ended by s, f is on d at s. Else every
    reader in desc(x) is off d, the transfer to the one whose edge has the largest hold time exists
    (F2), lies in [0, s], lasts at least that edge's transfer time there, at least h (latency +
    bytes / bandwidth, or its fixed time; a ``pipelined`` pair holds bytes / bandwidth), and holds a
    channel of d (its one, its send one, or the pair's). Those on d at s weigh at most d's memory
    (F3: the peak is at least any instant's total), the others hold d's k channels at least r times
    their bytes within [0, s], at most K s bytes. So the run's made bytes are at most C + K (T -
    p_x - tail_x) < M_m: the run ends at a cut edge a, first-able at T. With a cut, the heads and
    tails of ``relaxation`` recomputed with a among the always-cut edges hold for this placement
    (their proofs take any valid placement that cuts those edges), and so does the path through
    a (F1, F2); so T >= v_a >= g(T). Last cut: the last run sits on a device e; a read item f of
    o_b is on e at start(o_b) (F2). If f was made on e, or a transfer of f to e began by s, its copy
    there lives until finish(o_b) > s: on e at s. Else that transfer begins after s, ends by
    start(o_b) <= T, and holds a channel of e (its one, its receive one, or the pair's) at least its
    hold time: at most K (T - s) <= K (T - head_x) bytes. So T >= g(T) whenever the cut is needed at
    T. For any T' >= T, g(T') <= g(T) (more edges are able), so T >= min(T', g(T')); for T' < T,
    T > T' >= min(T', g(T')): the step is at least the largest min(T', g(T')) over T' below the
    need (and at least the comm path, a bound of its own)."""
    p_all = rel.fastest_us
    base_us = float((rel.head_us + p_all + rel.tail_us).max(initial=0.0))
    if graph.n_ops == 0 or cluster.n_devices == 1:
        return base_us
    path_ops, path_edges = longest_path(graph, p_all, np.where(rel.forced_cut, rel.cut_us, 0.0))
    x = turn_probe(graph, rel, path_ops)
    if x < 0:
        return base_us
    q = int(np.flatnonzero(path_ops == x)[0])
    n_dev = cluster.n_devices
    us_per_byte = 1.0 / float(cluster.bandwidth_bytes_per_us[~np.eye(n_dev, dtype=bool)].max())
    channels = 1 if COMM_MODEL_CODES[cluster.comm_model] in (SEQUENTIAL, DUPLEX) else n_dev - 1
    bytes_per_us = channels / us_per_byte
    capacity = float(cluster.memory_bytes.max())
    made, read = _turn_items(graph, path_ops, q, us_per_byte)
    head, p, tail = rel.head_us[path_ops], p_all[path_ops], rel.tail_us[path_ops]
    cost = rel.cut_us[path_edges]
    # value of a cut at each path edge, first the path through it alone
    value = head[:-1] + p[:-1] + cost + p[1:] + tail[1:]
    ablefirst = p[q] + tail[q] + np.maximum(np.cumsum(made)[:-1] - capacity, 0.0) / bytes_per_us
    need_first = p[q] + tail[q] + (made.sum() - capacity) / bytes_per_us
    after = np.cumsum(read[::-1])[::-1]         # read bytes at positions >= b
    ablelast = head[q] + np.maximum(after[1:] - capacity, 0.0) / bytes_per_us
    need_last = head[q] + (read.sum() - capacity) / bytes_per_us
    cuttable = np.isfinite(cost)
    sides = [(ablefirst, need_first), (ablelast, need_last)]
    best_us = base_us
    for able, need in sides:
        passed = np.zeros(len(cost), bool)
        edges = np.flatnonzero(cuttable & (able < need))
        edges = edges[np.argsort(able[edges], kind="stable")]
        while True:
            bound = _staircase(able[edges], value[edges], need)
            # only an edge whose value is at most the bound holds it down: pass the least of those first
            low = edges[~passed[edges] & (value[edges] <= bound)]
            if len(low) == 0 or passed.sum() >= max_passes:
                break
            a = int(low[np.argmin(value[low])])
            passed[a] = True
            value[a] = max(value[a], _comm_path_with_cut_us(graph, rel, int(path_edges[a])))
        best_us = max(best_us, bound)
    return best_us


def _staircase(able_us: np.ndarray, value_us: np.ndarray, need_us: float) -> float:
    """The largest min(T, g(T)) below need_us, g(T) the least value among the edges able by T
    (sorted by when they become able; inf before the first)."""
    best, least = -np.inf, np.inf
    for i in range(len(able_us) + 1):
        end = able_us[i] if i < len(able_us) else need_us       # g = least on [able_{i-1}, end)
        best = max(best, min(end, least))
        if i < len(able_us):
            least = min(least, value_us[i])
    return best


def _comm_path_with_cut_us(graph, rel: Relaxation, edge: int) -> float:
    """``comm_path_us`` over the placements that cut this edge: the windows with it always cut."""
    forced = rel.forced_cut.copy()
    forced[edge] = True
    head, tail = windows_us(graph, rel.fastest_us, rel.cut_us, forced)
    return float((head + rel.fastest_us + tail).max(initial=0.0))


def _turn_items(graph, path_ops: np.ndarray, q: int, us_per_byte: float):
    """Per path position, the bytes of the items made there and read there (``turn_cut_us``)."""
    n, m = graph.n_ops, len(path_ops)
    x = int(path_ops[q])
    anc, desc = turn_sides(graph, x)
    position = np.full(n, -1, np.int64)
    position[path_ops] = np.arange(m)
    src, dst, out = graph.edge_src, graph.edge_dst, graph.output_bytes
    hold = np.where(np.isnan(graph.edge_fixed_us), graph.edge_bytes * us_per_byte, graph.edge_fixed_us)
    crossing = anc[src] & (src != x) & desc[dst] & (out[src] > 0)
    largest = np.zeros(n)
    np.maximum.at(largest, src[crossing], hold[crossing])
    makers = np.unique(src[crossing])
    makers = makers[(position[makers] >= 0) & (largest[makers] >= us_per_byte * out[makers])]
    made = np.zeros(m)
    made[position[makers]] = out[makers]
    edges = np.flatnonzero(crossing & (position[dst] >= 0))
    edges = edges[np.lexsort((position[dst[edges]], src[edges]))]     # by producer, its first reader on P first
    first = edges[np.unique(src[edges], return_index=True)[1]]
    first = first[hold[first] >= us_per_byte * out[src[first]]]
    read = np.zeros(m)
    np.add.at(read, position[dst[first]], out[src[first]])
    return made, read
