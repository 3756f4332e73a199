"""Round 33 (issue 15, point 3): NASNet at 30% memory, which side of the 97% gap is weak.

``search MODEL FRACTION SEED OUT``: sim-search (defaults) on zoo:nasnet, ``baechi-4x2080`` at FRACTION of its
memory, the cluster's comm_model replaced by MODEL (``sequential``, ``duplex``, ``parallel``) or ``free``
(sequential with latency 0 and 10^4 x the bandwidth: what the search finds when crossings cost nothing)
or ``no-latency`` (sequential, latency 0, the bandwidth as it is).
Writes the step, the same devices and priority simulated under ``sequential``, evals, UTC and load, devices
and priority to OUT (JSON, atomically). ``--max-evals`` sets sim-search's evals per round (2,000).

``cells START OUT``: the cell greedy at 30% (``sequential``). The cells are the forks of the forward pass
into ``--min-branches`` or more branches (``sim_search.branches``: a fork and its immediate
post-dominator; ``--second`` also takes the part of a region not already taken, which adds each normal
cell's second fork, its h1 input); each branch is a piece with its backward ops, weights and updates.
Walking the cells in step order, every assignment of a cell's branches but the longest to the four GPUs
is simulated (the whole step, memory checked) and the fastest kept, until a sweep gains nothing;
``--rounds`` then anneals from its end as sim-search's tracks do (``anneal._track_rounds``).
START is a ``search`` JSON (the best as it is, in its own priority with ``--own``, else the fastest of
the search's orders), ``layers:JSON`` (that placement laid out by layer, each on the GPU holding most
of it) or ``split:K`` (the layers cut into K contiguous runs of equal compute).

``windows``: the channel charge's ceiling on the bound side. For every forward fork with two or more
region components (fork, its forward post-dominator j), the least over which components leave the
device of f and j of max(work that stays, crossings on that device's one channel) (and the same with
f and j apart), and the same for the backward pass's forks, chained into the relaxation's heads: how far
the longest path (head + time + tail) rises. ``--all-in-turn`` charges each window all its work instead,
the most any charge of these windows could give.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/nasnet_cells.py search duplex 0.3 0 /tmp/duplex.json
    PYTHONPATH=$PWD .venv/bin/python benchmarks/nasnet_cells.py cells /tmp/sequential.json /tmp/c.json --own
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import devplace as dp  # noqa: E402
from devplace.bounds.fork_join import _region  # noqa: E402
from devplace.bounds.relaxation import relaxation  # noqa: E402
from devplace.graph import Role  # noqa: E402
from devplace.placers._layers import UnitLayers  # noqa: E402
from devplace.placers._moves import with_colocation  # noqa: E402
from devplace.portfolio.sim_search import branches  # noqa: E402
from devplace.portfolio.sim_search.anneal import _track_rounds  # noqa: E402
from devplace.portfolio.sim_search.config import SearchConfig  # noqa: E402
from devplace.portfolio.sim_search.layers import _fastest_fitting  # noqa: E402
from devplace.portfolio.sim_search.search import _Search  # noqa: E402
from reproduce_papers import PRESET, cached_graph  # noqa: E402

MAX_OPS = 3000     # the windows' regions (ops of the whole step) are walked up to this many


def _when() -> tuple[str, float]:
    return time.strftime("%H:%M:%S", time.gmtime()), round(os.getloadavg()[0], 2)


def _write(row: dict, out: str) -> None:
    with open(out + ".tmp", "w") as f:
        json.dump(row, f)
    os.replace(out + ".tmp", out)


def _cluster(model: str, fraction: float):
    cluster = dp.load_cluster(PRESET).with_memory_fraction(fraction)
    if model == "free":
        return dataclasses.replace(cluster, latency_us=np.zeros_like(cluster.latency_us),
                                   bandwidth_bytes_per_us=cluster.bandwidth_bytes_per_us * 1e4)
    if model == "no-latency":
        return dataclasses.replace(cluster, latency_us=np.zeros_like(cluster.latency_us))
    return dataclasses.replace(cluster, comm_model=model)


def search(model: str, fraction: float, seed: int, out: str, options: dict) -> None:
    graph, cluster = cached_graph("zoo:nasnet"), _cluster(model, fraction)
    began, t0 = _when(), time.perf_counter()
    p = dp.place(graph, cluster, algo="sim-search", seed=seed, **options)
    result = dp.simulate(graph, cluster, p)
    sequential = dp.simulate(graph, _cluster("sequential", fraction), p)
    row = dict(model=model, fraction=fraction, seed=seed, options=options, step_ms=result.step_time_us / 1e3, fits=bool(result.fits),
               sequential_ms=sequential.step_time_us / 1e3, sequential_fits=bool(sequential.fits),
               evals=p.options["evals"], bound_ms=p.options["lower_bound_us"] / 1e3, found_by=p.options["found_by"],
               s=round(time.perf_counter() - t0, 1), utc_load=[began, _when()], devices=p.devices.tolist(),
               priority=None if p.priority is None else p.priority.tolist())
    print({k: v for k, v in row.items() if k not in ("devices", "priority")}, flush=True)
    _write(row, out)


def cell_regions(graph, min_branches: int, second: bool) -> list[tuple[int, int, list[list[int]]]]:
    """(fork, join, branches) of the forward pass (``branches.fork_branches``'s regions, kept apart);
    with ``second``, a region overlapping one taken keeps its untaken ops."""
    order, succ, pred = branches._forward_dag(graph)
    ipdom = branches._post_dominators(order, succ, graph.n_ops)
    rank = graph.topo_rank
    taken = np.zeros(graph.n_ops, bool)
    found = []
    for f in order.tolist():
        j = int(ipdom[f])
        if len(succ[f]) < 2 or j < 0 or taken[f]:
            continue
        region, frontier, seen = [], [s for s in succ[f] if s != j], set()
        while frontier and len(region) <= branches.MAX_REGION_OPS:
            v = frontier.pop()
            if v in seen or v == j or rank[v] > rank[j]:
                continue
            seen.add(v)
            region.append(v)
            frontier.extend(succ[v])
        if len(region) > branches.MAX_REGION_OPS:
            continue
        if taken[region].any():
            if not second:
                continue
            region = [v for v in region if not taken[v]]
        parts = branches._components(region, succ, pred)
        if len(parts) < min_branches:
            continue
        taken[region] = True
        found.append((f, j, parts))
    branches._with_dead_ends(graph, [part for _, _, parts in found for part in parts])     # in place
    return found


def _start(s: _Search, layers: UnitLayers, start: str, own: bool):
    """(devices, priority, order name or None for its own priority) of START (module docstring)."""
    graph = s.graph
    if start.startswith("split:"):
        k = int(start.split(":")[1])
        layer = layers.layer_of_unit()[layers.unit_of]
        work = np.bincount(layer, weights=graph.compute_us.min(axis=1))
        middle = (np.cumsum(work) - work / 2) / work.sum()
        devices = np.minimum(middle * k, k - 1).astype(np.int64)[layer]
    else:
        row = json.load(open(start.removeprefix("layers:")))
        devices = np.array(row["devices"])
        if own and not start.startswith("layers:"):
            return devices, None if row["priority"] is None else np.array(row["priority"]), None
        if start.startswith("layers:"):
            layer = layers.layer_of_unit()[layers.unit_of]
            best = devices
            devices = np.zeros(graph.n_ops, np.int64)
            for k in range(int(layer.max()) + 1):
                ops = with_colocation(s.fine, np.flatnonzero(layer == k))
                devices[ops] = np.bincount(best[ops], minlength=s.n_dev).argmax()
    scored = _fastest_fitting(s, devices)
    if scored is None:
        raise SystemExit(f"{start}: fits in no order")
    return devices, scored[1], scored[2]


def _score(s: _Search, devices, priority, order_name):
    """(step us, priority) in the start's own priority (order_name None) or the order named; None if it does not fit."""
    if order_name is None:
        overflow, step, _ = s.measure(devices, priority)
        return None if overflow > 0 else (step, priority)
    scored = _fastest_fitting(s, devices, order_name)
    return None if scored is None else scored[:2]


def cells(start: str, out: str, min_branches: int, second: bool, own: bool, sweeps: int, rounds: int) -> None:
    graph, cluster = cached_graph("zoo:nasnet"), _cluster("sequential", 0.3)
    s = _Search(graph, cluster, SearchConfig(), 0)
    s.fitting = None
    layers = UnitLayers.of(graph)
    op_us = graph.compute_us.min(axis=1)
    cell_pieces = []
    for _, _, parts in cell_regions(graph, min_branches, second):
        pieces = [with_colocation(s.fine, np.flatnonzero(np.isin(layers.unit_of, np.unique(layers.unit_of[ops]))))
                  for ops in parts]
        cell_pieces.append(sorted(pieces, key=lambda ops: -op_us[ops].sum()))     # the longest first: it stays
    share = sum(op_us[ops].sum() for pieces in cell_pieces for ops in pieces) / op_us.sum()
    began, evals0 = _when(), s.evals
    devices, priority, order_name = _start(s, layers, start, own)
    step, priority = _score(s, devices, priority, order_name)
    row = dict(start=start, min_branches=min_branches, second=second, own_priority=own, cells=len(cell_pieces),
               pieces=sum(map(len, cell_pieces)), share=round(float(share), 4), start_ms=step / 1e3, sweeps=[])
    print({k: v for k, v in row.items() if k != "sweeps"}, flush=True)
    for _ in range(sweeps):
        gained = 0.0
        for pieces in cell_pieces:
            fastest = (step, None, None)
            for combo in itertools.product(range(s.n_dev), repeat=len(pieces) - 1):
                trial = devices.copy()
                for ops, device in zip(pieces[1:], combo):
                    trial[ops] = device
                if np.array_equal(trial, devices):
                    continue
                scored = _score(s, trial, priority, order_name)
                if scored is not None and scored[0] < fastest[0]:
                    fastest = (scored[0], trial, scored[1])
            if fastest[1] is not None:
                gained += step - fastest[0]
                step, devices, priority = fastest
        row["sweeps"].append(dict(step_ms=round(step / 1e3, 3), gained_ms=round(gained / 1e3, 3), evals=s.evals - evals0,
                                  utc_load=_when()))
        print(row["sweeps"][-1], flush=True)
        if gained <= 0:
            break
    row.update(step_ms=step / 1e3, evals=s.evals - evals0)
    if rounds:
        s.offer(step, devices, priority, "cell greedy")
        row["annealed_rounds"], _ = _track_rounds(s, s.best, "cells", rounds, s.config.track_behind)
        step, devices = s.best[0], s.best[1]
        row.update(annealed_ms=step / 1e3, annealed_evals=s.evals - evals0)
        print({k: row[k] for k in ("annealed_ms", "annealed_rounds", "annealed_evals")}, flush=True)
    row.update(utc_load=[began, _when()], devices=devices.tolist())
    _write(row, out)


def _charge_us(work, into, out) -> float:
    """Least over which components leave (together: f and j on one device; apart: A on f's, B on j's,
    M elsewhere) of max(work that stays on one device, crossings on one device's channel); unsound
    as a bound only in that it is not brute-force tested: a measurement of the ceiling."""
    k, total = len(work), sum(work)
    together = total
    for leave in itertools.product((False, True), repeat=k):
        if any(leave):
            stay = sum(w for w, gone in zip(work, leave) if not gone)
            channel = sum(o for o, gone in zip(out, leave) if gone) + min(i for i, gone in zip(into, leave) if gone)
            together = min(together, max(stay, channel))
    apart = np.inf
    for split in itertools.product((0, 1, 2), repeat=k):
        on_f = sum(w for w, at in zip(work, split) if at == 0)
        on_j = sum(w for w, at in zip(work, split) if at == 1)
        out_a = sum(o for o, at in zip(out, split) if at == 0)
        out_m = sum(o for o, at in zip(out, split) if at == 2)
        in_bm = min([i for i, at in zip(into, split) if at] or [0.0])
        in_b = max([i for i, at in zip(into, split) if at == 1] or [0.0])
        apart = min(apart, max(on_f, on_j, out_a + in_bm, out_a + out_m + in_b))
    return min(together, apart)


def _backward_dag(graph) -> tuple[np.ndarray, list[list[int]]]:
    """The backward ops in topological order and their successors among them."""
    backward = graph.role == Role.BACKWARD
    order = graph.topo_order[backward[graph.topo_order]]
    succ: list[list[int]] = [[] for _ in range(graph.n_ops)]
    keep = backward[graph.edge_src] & backward[graph.edge_dst]
    for u, v in zip(graph.edge_src[keep].tolist(), graph.edge_dst[keep].tolist()):
        if v not in succ[u]:
            succ[u].append(v)
    return order, succ


def windows(out: str, all_in_turn: bool = False) -> None:
    graph, cluster = cached_graph("zoo:nasnet"), _cluster("sequential", 0.3)
    rel = relaxation(graph, cluster)
    p, cut, n = rel.fastest_us, rel.cut_us, graph.n_ops
    src, dst = graph.edge_src, graph.edge_dst
    forks = []
    for order, succ in (branches._forward_dag(graph)[:2], _backward_dag(graph)):
        ipdom = branches._post_dominators(order, succ, n)
        forks += [(f, int(ipdom[f])) for f in order.tolist() if len(succ[f]) >= 2 and ipdom[f] >= 0]
    region, stack = np.empty(MAX_OPS + 1, np.int64), np.empty(MAX_OPS + 2, np.int64)
    extra: dict[int, list[tuple[int, float]]] = {}
    rows = []
    successors = [graph.successors(v).tolist() for v in range(n)]
    predecessors = [graph.predecessors(v).tolist() for v in range(n)]
    for f, j in forks:
        seen, inside = np.full(n, -1), np.full(n, -1)
        m = _region(f, j, graph.topo_rank, graph.pred_ptr, graph.pred_edge, src, graph.succ_ptr, graph.succ_edge, dst,
                    seen, inside, region, stack, MAX_OPS)
        parts = branches._components(region[:m].tolist(), successors, predecessors) if 0 < m <= 400 else []
        if len(parts) < 2 or len(parts) > 8:
            continue
        work, into, outs = [], [], []
        for part in parts:
            mine = np.zeros(n, bool)
            mine[part] = True
            edge_in = mine[dst] & ((src == f) | mine[src])
            edge_out = mine[src] & ((dst == j) | mine[dst])
            into.append(min(cut[edge_in & (dst == u)].max() for u in part if (edge_in & (dst == u)).any()))
            outs.append(min(cut[edge_out & (src == u)].max() for u in part if (edge_out & (src == u)).any()))
            work.append(float(p[part].sum()))
        x = sum(work) if all_in_turn else _charge_us(work, into, outs)
        extra.setdefault(j, []).append((f, x))
        rows.append(dict(fork=graph.names[f], join=graph.names[j], backward=bool(graph.role[f] == Role.BACKWARD),
                         components=len(parts), work_us=round(sum(work), 1), charge_us=round(x, 1)))
    head = rel.head_us.copy()
    before = float((rel.head_us + p + rel.tail_us).max())
    for v in graph.topo_order.tolist():
        best = head[v]
        for k in range(graph.pred_ptr[v], graph.pred_ptr[v + 1]):
            e = graph.pred_edge[k]
            best = max(best, head[src[e]] + p[src[e]] + (cut[e] if rel.forced_cut[e] else 0.0))
        for f, x in extra.get(v, []):
            best = max(best, head[f] + p[f] + x)
        head[v] = best
    after = float((head + p + rel.tail_us).max())
    for name, ops in (("forward", graph.role == Role.FORWARD), ("backward", graph.role == Role.BACKWARD)):
        print(name, "windows", sum(r["backward"] == (name == "backward") for r in rows), "charges",
              round(sum(r["charge_us"] for r in rows if r["backward"] == (name == "backward")) / 1e3, 3), "ms; work",
              round(sum(r["work_us"] for r in rows if r["backward"] == (name == "backward")) / 1e3, 3), "ms; largest head",
              round(float(rel.head_us[ops].max()) / 1e3, 3), "->", round(float(head[ops].max()) / 1e3, 3), flush=True)
    row = dict(all_in_turn=all_in_turn, windows=rows, path_before_ms=before / 1e3, path_after_ms=after / 1e3, utc_load=_when())
    print(f"{len(rows)} windows, charges {sum(r['charge_us'] for r in rows) / 1e3:.3f} ms, work "
          f"{sum(r['work_us'] for r in rows) / 1e3:.3f} ms; path {before / 1e3:.3f} -> {after / 1e3:.3f} ms", flush=True)
    _write(row, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("search")
    one.add_argument("model", choices=("sequential", "duplex", "parallel", "free", "no-latency"))
    one.add_argument("fraction", type=float)
    one.add_argument("seed", type=int)
    one.add_argument("out")
    one.add_argument("--max-evals", type=int, help="sim-search's max_evals (simulator calls per annealing round)")
    two = sub.add_parser("cells")
    two.add_argument("start")
    two.add_argument("out")
    two.add_argument("--min-branches", type=int, default=3)
    two.add_argument("--second", action="store_true")
    two.add_argument("--own", action="store_true", help="measure in the start's own priority")
    two.add_argument("--sweeps", type=int, default=3)
    two.add_argument("--rounds", type=int, default=0, help="annealing rounds from the greedy's end, as a track")
    three = sub.add_parser("windows")
    three.add_argument("out")
    three.add_argument("--all-in-turn", action="store_true", help="charge each window all its work (a ceiling of any charge)")
    args = parser.parse_args()
    if args.what == "search":
        search(args.model, args.fraction, args.seed, args.out,
               {} if args.max_evals is None else {"max_evals": args.max_evals})
    elif args.what == "cells":
        cells(args.start, args.out, args.min_branches, args.second, args.own, args.sweeps, args.rounds)
    else:
        windows(args.out, args.all_in_turn)


if __name__ == "__main__":
    main()
