"""The activations held at the forward/backward turn must fit on the devices the critical path
visits: the cuts that forces on it."""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.sparse import csgraph

from devplace.bounds.classic import critical_path_us
from devplace.bounds.relaxation import Relaxation, longest_path
from devplace.errors import OutOfMemoryError
from devplace.placers._highs import highs_solver
from devplace.transforms.coplacement import join_pairs


def turn_path_us(graph, cluster, rel: Relaxation, max_nodes: int = 500) -> float:
    """The critical path pays the costliest cut it needs so that the activations held at the
    forward/backward turn fit on the devices it visits: ``critical_path_us`` + theta, theta the
    least threshold at which a small program over blocks of the path is not proven infeasible.

    Take P, the critical path of ``critical_path_us``, its units U_P, and a *probe* x on P that takes
    time on every device (the one where the outputs made before x on P and read after it on P weigh
    most). Write anc(x) for x and its ancestors, desc(x) for x and its descendants. An *item* is an
    op f in anc(x), f != x, with output bytes and a reader b in desc(x) whose edge f -> b (not
    ``order_only``: such a consumer keeps nothing) costs time
    on every link (cut cost > 0; inf inside a unit), the units of f and b both in U_P (one reader per
    item: one in f's unit if there is one). For a threshold t, the *t-blocks* are the units of U_P
    joined by the path edges that are not always cut (``forced_cut``) and cost more than t to cut.
    *fits(t)*: the program, binary z[B, d] puts each t-block on one device its units are all
    allowed on; w[i, d] >= 0 with sum_d w[i, d] = 1 and w[i, d] <= z[block of f, d] + z[block of b, d]
    spreads each item over its two ends' devices; per device, the persistent bytes of its blocks'
    units, x's output and temporaries (with x's block) and sum_i bytes_i w[i, d] are at most its
    memory. Coarser blocks only constrain more, so fits is monotone in t. Let t0 be the least t (0
    or a path edge's cut cost) whose next smaller candidate HiGHS proves infeasible (a binary
    search; a node limit counts as "fits": it never raises the bound, and with no time limit the
    bound depends only on its inputs), k the fewest devices whose memories hold the rows' total
    bytes, f the always-cut path edges, and S(r) the sum of the
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
    path_ops, path_edges = longest_path(graph, rel.fastest_us, edge_us)
    x = turn_probe(graph, rel, path_ops)
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
                       max_nodes)
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

    def __init__(self, cluster, allowed, fixed, ends, src_col, dst_col, joinable, cost, max_nodes):
        self.cluster, self.allowed, self.fixed = cluster, allowed, fixed
        self.item_a, self.item_b, self.item_bytes = ends
        self.src_col, self.dst_col, self.joinable, self.cost = src_col, dst_col, joinable, cost
        self.max_nodes = max_nodes
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
                              random_seed=0, threads=1,
                              mip_max_nodes=int(self.max_nodes))
        solver.run()
        return solver.getModelStatus() != highspy.HighsModelStatus.kInfeasible


def turn_probe(graph, rel: Relaxation, path_ops: np.ndarray) -> int:
    """The op x of the path (the *turn*; ``turn_cut`` probes it too), taking time on every device,
    where the outputs of earlier path ops read (over an edge that costs time) by x or a later path
    op weigh most; -1 if there are none."""
    position = np.full(graph.n_ops, -1, np.int64)
    position[path_ops] = np.arange(len(path_ops))
    src, dst = graph.edge_src, graph.edge_dst
    on_path = ((position[src] >= 0) & (position[dst] > position[src]) & (rel.cut_us > 0) & (graph.output_bytes[src] > 0)
               & ~graph.edge_order_only)
    last_reader = np.full(graph.n_ops, -1, np.int64)
    np.maximum.at(last_reader, src[on_path], position[dst[on_path]])
    producers = np.flatnonzero(last_reader >= 0)
    held = np.zeros(len(path_ops) + 1)
    np.add.at(held, position[producers] + 1, graph.output_bytes[producers])
    np.add.at(held, last_reader[producers] + 1, -graph.output_bytes[producers])
    held = np.cumsum(held)[:-1]
    held[rel.fastest_us[path_ops] <= 0] = 0.0
    return int(path_ops[np.argmax(held)]) if held.max(initial=0.0) > 0 else -1


def turn_sides(graph, x: int):
    """anc(x) and desc(x), each with x, as masks over the ops: what is made before the turn and what
    reads after it (``turn_path_us``, ``turn_cut_us``)."""
    n = graph.n_ops
    adjacency = sparse.csr_array((np.ones(graph.n_edges), (graph.edge_src, graph.edge_dst)), shape=(n, n))
    anc = np.zeros(n, bool)
    anc[csgraph.breadth_first_order(adjacency.T.tocsr(), x, directed=True, return_predecessors=False)] = True
    desc = np.zeros(n, bool)
    desc[csgraph.breadth_first_order(adjacency, x, directed=True, return_predecessors=False)] = True
    return anc, desc


def turn_reads(graph, x: int) -> np.ndarray:
    """Per edge, whether it reads across the turn x: an output made before it (by an op other than x,
    with output bytes) read at or after it, over an edge that is not ``order_only`` (such a consumer
    keeps nothing): the edges every turn argument charges (``turn_path_us``, ``turn_cut_us``)."""
    anc, desc = turn_sides(graph, x)
    src = graph.edge_src
    return anc[src] & (src != x) & desc[graph.edge_dst] & (graph.output_bytes[src] > 0) & ~graph.edge_order_only


def _turn_items(graph, rel: Relaxation, column: np.ndarray, x: int):
    """Per item (see ``turn_path_us``), its producer and the reader it is charged with: one reader
    in the producer's unit if there is one, else the first."""
    src, dst = graph.edge_src, graph.edge_dst
    ka, kb = column[rel.unit[src]], column[rel.unit[dst]]
    keep = turn_reads(graph, x) & (rel.cut_us > 0) & (ka >= 0) & (kb >= 0)
    edges = np.flatnonzero(keep)
    edges = edges[np.lexsort((ka[edges] != kb[edges], src[edges]))]     # by producer, a same-unit reader first
    first = np.unique(src[edges], return_index=True)[1]
    return src[edges[first]], dst[edges[first]]
