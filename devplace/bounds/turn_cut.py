"""The first and last cut the forward/backward turn forces on the critical path: the activations a
run of the path makes (or reads) must be held on its device at the turn, or cross its channels in
the time the step leaves; the cut then pays between the heads and tails of ``relaxation``. The
first cut comes with the last cut before the path's last reader of the first run's outputs: if
both runs share a device it holds those outputs at the turn, else its channel carries them."""

from __future__ import annotations

import numpy as np

from devplace.bounds.relaxation import Relaxation, longest_path, windows_us
from devplace.bounds.turn_path import turn_probe, turn_reads
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
    (``comm_path_us``) recomputed with edge a always cut. *Pairs*: p* is the last position whose op
    reads, over an edge of positive hold time, the output of some o_i with i < q; X(a, c) the
    output bytes of the outputs of o_0..o_a (positions below q) read by an op at a position in
    (c, p*] after q (any edge that reads it: not ``order_only``), H(a, c) the sum over them of their largest hold time over those edges. A
    first-able edge a >= p* is an entry alone, valued v_a; for a < p*, each cuttable c in [a, p*)
    gives an entry (a, c) valued max(v_a, v_c), able from T_a, or from max(T_a, H(a, c)) when c = a
    or X(a, c) > C. Then g(T) = the least value over entries able at T (inf if none), and the bound
    is the largest min(T, g(T)) over T below T_M, where g steps. Likewise the *last* cut at edge a
    (entries alone): last-able when R_{a+1} <= C + K (T - head_x), needed below head_x + (R_0 - C) /
    K. The result is the larger of the two, at least the comm path.

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
    a (F1, F2); so T >= v_a. If a < p*, P changes device at a before p*, so the run holding o_p* on
    a device e starts after a cut edge c with a <= c < p* (the last before p*), and T >= v_c too.
    Each output counted in X(a, c) is made on d by o_i, i <= a, i < q (so o_i finishes by s), and
    read by an op o_j of that run, j in (c, p*], j > q (it starts after x finishes, after s). If e
    = d, the output lives on d from start(o_i) until its readers on d finish, after s: on d at s,
    distinct outputs each at most once, so X(a, c) <= d's memory <= C (F3). If e != d (always when
    c = a: a cut edge joins two devices), each such output has one transfer d -> e (the simulator
    sends once per device, ``sim/engine``), within [finish(o_i), start(o_j)] inside [0, T], lasting
    at least its longest edge to e's readers, at least its hold time over the edges into (c, p*];
    all of them hold one channel of d (its one, its send one, or the pair d -> e: a
    ``pipelined`` pair at least bytes / bandwidth), one at a time: H(a, c) <= T. So the entry (or
    a alone) is able at T and T >= its value >= g(T). Last cut: the last run sits on a device e; a read item f of
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
    position, hold_us = _position_and_hold(graph, path_ops, us_per_byte)
    made, read = _turn_items(graph, path_ops, q, us_per_byte, position, hold_us)
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
    passed = np.zeros(len(cost), bool)

    def refine(a: int) -> float:
        return _comm_path_with_cut_us(graph, rel, int(path_edges[a]))

    first = np.flatnonzero(cuttable & (ablefirst < need_first))
    pair_a, pair_c, pair_able = _first_cut_pairs(graph, path_ops, q, first, ablefirst, cuttable, capacity,
                                                 position, hold_us)
    last = np.flatnonzero(cuttable & (ablelast < need_last))
    best_us = base_us
    for ends_a, ends_c, able, need in ((pair_a, pair_c, pair_able, need_first), (last, last, ablelast[last], need_last)):
        best_us = max(best_us, _settle(ends_a, ends_c, able, need, value, passed, refine, max_passes))
    return best_us


def _settle(ends_a, ends_c, able_us, need_us, value_us, passed, refine, max_passes: int) -> float:
    """The staircase over entries (one path edge, or a pair: valued by the larger of the two values),
    each able from ``able_us`` (those able only from ``need_us`` on are left out); passes (``refine``, at most ``max_passes`` here) go to the least-valued
    edge of an entry that holds the bound down, until no such edge is left unpassed."""
    order = np.flatnonzero(able_us < need_us)
    order = order[np.argsort(able_us[order], kind="stable")]
    ends_a, ends_c, able_us = ends_a[order], ends_c[order], able_us[order]
    spent = 0
    while True:
        entry_us = np.maximum(value_us[ends_a], value_us[ends_c])
        bound = _staircase(able_us, entry_us, need_us)
        low = entry_us <= bound
        edges = np.unique(np.concatenate([ends_a[low], ends_c[low]]))
        edges = edges[~passed[edges]]
        if len(edges) == 0 or spent >= max_passes:
            return bound
        a = int(edges[np.argmin(value_us[edges])])
        passed[a] = True
        value_us[a] = max(value_us[a], refine(a))
        spent += 1


def _staircase(able_us: np.ndarray, value_us: np.ndarray, need_us: float) -> float:
    """The largest min(T, g(T)) below need_us, g(T) the least value among the entries able by T
    (sorted by when they become able; inf before the first)."""
    least = np.concatenate([[np.inf], np.minimum.accumulate(value_us)])
    return float(np.minimum(np.append(able_us, need_us), least).max())


def _reader_run_items(graph, path_ops: np.ndarray, q: int, rows: int, position: np.ndarray, hold_us: np.ndarray):
    """For the first cut's pairs (``turn_cut_us``): p*, the last path position reading an output of
    o_0..o_(q-1) over an edge that holds a channel (-1 if none), and per pair of path positions
    (a < ``rows``, c < p*) the output bytes of the outputs of o_0..o_a read by a path op in (c, p*],
    and the sum over them of the hold time of their longest edge into (c, p*]."""
    src, dst, out, hold = graph.edge_src, graph.edge_dst, graph.output_bytes, hold_us
    edges = np.flatnonzero((position[src] >= 0) & (position[src] < q) & (position[dst] > q) & (out[src] > 0)
                           & ~graph.edge_order_only)
    if not np.any(hold[edges] > 0):
        return -1, None, None
    last_reader = int(position[dst[edges[hold[edges] > 0]]].max())
    edges = edges[(position[dst[edges]] <= last_reader) & (position[src[edges]] < rows)]
    made, reader, hold = position[src[edges]], position[dst[edges]], hold[edges]
    held, crossing = np.zeros((rows, last_reader)), np.zeros((rows, last_reader))
    if len(edges) == 0:
        return last_reader, held, crossing
    # per producer, its readers latest first: the longest hold into (c, p*] grows as c falls
    order = np.lexsort((-reader, made))
    made, reader, hold = made[order], reader[order], hold[order]
    starts = np.flatnonzero(np.r_[True, made[1:] != made[:-1]])
    longest = np.empty_like(hold)
    for begin, end in zip(starts, np.r_[starts[1:], len(made)]):
        longest[begin:end] = np.maximum.accumulate(hold[begin:end])
    rise = longest - np.where(np.r_[True, made[1:] != made[:-1]], 0.0, np.r_[0.0, longest[:-1]])
    np.add.at(crossing, (made, reader - 1), rise)
    np.add.at(held, (made[starts], reader[starts] - 1), out[path_ops[made[starts]]])
    # sum over producers at positions <= a with a reader (or a rise) above c
    held = np.cumsum(np.cumsum(held[:, ::-1], axis=1)[:, ::-1], axis=0)
    crossing = np.cumsum(np.cumsum(crossing[:, ::-1], axis=1)[:, ::-1], axis=0)
    return last_reader, held, crossing


def _first_cut_pairs(graph, path_ops, q: int, first: np.ndarray, ablefirst: np.ndarray, cuttable: np.ndarray,
                     capacity: float, position: np.ndarray, hold_us: np.ndarray):
    """Entries for the first cut (``turn_cut_us``): a first-able edge a at or after p* alone, else a
    pair (a, c), c the last cut before p* (a <= c < p*), able once a is first-able and, when c = a or
    the outputs of the first run read in (c, p*] exceed the memory, once T reaches their hold."""
    rows = int(first.max()) + 1 if len(first) else 0
    last_reader, held, crossing = _reader_run_items(graph, path_ops, q, rows, position, hold_us)
    if held is None:
        return first, first, ablefirst[first]
    alone = first[first >= last_reader]
    a, c = np.meshgrid(first[first < last_reader], np.flatnonzero(cuttable[:max(last_reader, 0)]), indexing="ij")
    keep = c >= a
    a, c = a[keep], c[keep]
    shared = (c > a) & (held[a, c] <= capacity)
    able = np.maximum(ablefirst[a], np.where(shared, -np.inf, crossing[a, c]))
    return (np.concatenate([alone, a]), np.concatenate([alone, c]),
            np.concatenate([ablefirst[alone], able]))


def _comm_path_with_cut_us(graph, rel: Relaxation, edge: int) -> float:
    """``comm_path_us`` over the placements that cut this edge: the windows with it always cut."""
    forced = rel.forced_cut.copy()
    forced[edge] = True
    head, tail = windows_us(graph, rel.fastest_us, rel.cut_us, forced)
    return float((head + rel.fastest_us + tail).max(initial=0.0))


def _position_and_hold(graph, path_ops: np.ndarray, us_per_byte: float) -> tuple[np.ndarray, np.ndarray]:
    """Each op's place on the path (-1 off it), and how long each edge holds a channel when its
    ends are apart (its fixed time, else its bytes at the fastest link)."""
    position = np.full(graph.n_ops, -1, np.int64)
    position[path_ops] = np.arange(len(path_ops))
    hold_us = np.where(np.isnan(graph.edge_fixed_us), graph.edge_bytes * us_per_byte, graph.edge_fixed_us)
    return position, hold_us


def _turn_items(graph, path_ops: np.ndarray, q: int, us_per_byte: float, position: np.ndarray, hold_us: np.ndarray):
    """Per path position, the bytes of the items made there and read there (``turn_cut_us``;
    ``position`` and ``hold_us`` from ``_position_and_hold``)."""
    m = len(path_ops)
    x = int(path_ops[q])
    src, dst, out, hold = graph.edge_src, graph.edge_dst, graph.output_bytes, hold_us
    crossing = turn_reads(graph, x)
    largest = np.zeros(graph.n_ops)
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
