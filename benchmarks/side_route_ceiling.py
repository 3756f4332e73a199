"""How much more the memory path could charge for side-route work that stays on the path's device (issue 15, point 3).

``devplace.bounds.memory_path_us`` charges a path that fits one device its ops' fastest times plus, stretch by
stretch, what its side routes add: a route that stays on the path's device runs there between two path ops
(F1). Only an op that descends from a path op and leads to a later one (*in-between*) can be forced there
that way, so the path's time plus its in-between ops' fastest times caps every such staying-work charge,
however routes are grouped or combined. For each graph this records, on the critical path at fastest times
(the memory path's first path), the path's time, the in-between work, that cap, and the memory path itself.

    .venv/bin/python benchmarks/side_route_ceiling.py [--models transformer ...]

Writes ``benchmarks/results/side_route_ceiling.json``. Times are wall clock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace import bounds  # noqa: E402
from devplace.bounds.relaxation import crossing_us, longest_path  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402

OUT = RESULTS / "side_route_ceiling.json"
MEMORY_FRACTION = 0.3
ZOO = ["transformer", "rnnlm", "resnet50", "inception_v3", "gnmt", "nasnet", "mlp", "small_cnn"]


def path_relatives(graph, position: np.ndarray):
    """Per op, the latest path op above it (-1: none; a path op is its own) and whether it leads to a path op."""
    latest = np.where(position >= 0, position, -1)
    for v in graph.topo_order:
        if position[v] < 0:
            latest[v] = latest[graph.edge_src[graph.pred_edge[graph.pred_ptr[v]:graph.pred_ptr[v + 1]]]].max(initial=-1)
    below = position >= 0
    for v in graph.topo_order[::-1]:
        if position[v] < 0:
            below[v] = below[graph.edge_dst[graph.succ_edge[graph.succ_ptr[v]:graph.succ_ptr[v + 1]]]].any()
    return latest, below


def tail_cap_us(graph, time_us, route_cut_us, position, latest, below, after_us) -> float:
    """A cap on what routes from the path to the step's end could add if charged like side routes: an
    off-path op q below the path and above none of it either stays on the path's device (at most p_q more
    there) or its route leaves once, ending at most (longest chain from the path through q to a sink) + (the
    crossing of its last finite edge into q) - (the path's time after q's latest path op above) after that
    op. Summed per op as the lesser of the two: every set of staying ops is charged no more (not a bound)."""
    into, down, cross = np.zeros(graph.n_ops), np.zeros(graph.n_ops), np.full(graph.n_ops, np.inf)
    for v in graph.topo_order:                 # into: the longest chain of off-path ops from the path to v
        if position[v] < 0 and latest[v] >= 0:
            edges = graph.pred_edge[graph.pred_ptr[v]:graph.pred_ptr[v + 1]]
            edges = edges[latest[graph.edge_src[edges]] >= 0]
            srcs = graph.edge_src[edges]
            into[v] = time_us[v] + np.where(position[srcs] >= 0, 0.0, into[srcs]).max()
            finite = route_cut_us[edges][np.isfinite(route_cut_us[edges])]
            off = srcs[position[srcs] < 0]
            cross[v] = finite.max() if len(finite) else (cross[off].max() if len(off) else np.inf)
    for v in graph.topo_order[::-1]:           # down: the longest chain from v to a sink
        down[v] = time_us[v] + down[graph.edge_dst[graph.succ_edge[graph.succ_ptr[v]:graph.succ_ptr[v + 1]]]].max(
            initial=0.0)
    tail = (position < 0) & (latest >= 0) & ~below
    excess = into[tail] + down[tail] - time_us[tail] + cross[tail] - after_us[latest[tail]]
    return float(np.minimum(time_us[tail], np.maximum(excess, 0.0)).sum())


def measure(name: str, graph, cluster) -> dict:
    load = os.getloadavg()[0]
    rel = bounds.relaxation(graph, cluster)
    path_ops, _ = longest_path(graph, rel.fastest_us, np.zeros(graph.n_edges))
    position = np.full(graph.n_ops, -1, np.int64)
    position[path_ops] = np.arange(len(path_ops))
    latest, below = path_relatives(graph, position)
    between = (position < 0) & (latest >= 0) & below
    head = (position < 0) & (latest < 0) & below
    after_us = rel.fastest_us[path_ops][::-1].cumsum()[::-1] - rel.fastest_us[path_ops]   # the path after each op
    tails_ms = tail_cap_us(graph, rel.fastest_us, crossing_us(graph, rel.fastest_us, rel.cut_us), position, latest,
                           below, after_us) / 1e3
    began = time.perf_counter()
    memory_path_ms = bounds.memory_path_us(graph, cluster, rel) / 1e3
    path_ms, between_ms = rel.fastest_us[path_ops].sum() / 1e3, rel.fastest_us[between].sum() / 1e3
    fits = rel.unit_bytes[np.unique(rel.unit[path_ops])].sum() <= cluster.memory_bytes.max()   # else cuts charge too
    row = {"graph": name, "ops": graph.n_ops, "path_ops": len(path_ops), "path_fits_one_device": bool(fits),
           "in_between_ops": int(between.sum()),
           "path_ms": path_ms, "in_between_ms": between_ms, "staying_work_cap_ms": path_ms + between_ms,
           "tail_routes_cap_ms": tails_ms, "head_work_ms": rel.fastest_us[head].sum() / 1e3,
           "route_cap_ms": path_ms + between_ms + tails_ms + rel.fastest_us[head].sum() / 1e3,
           "memory_path_ms": memory_path_ms, "memory_path_s": round(time.perf_counter() - began, 2),
           "load_1min": round(load, 2)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=ZOO, choices=ZOO)
    args = parser.parse_args()
    cluster = dp.load_cluster(PRESET).with_memory_fraction(MEMORY_FRACTION)
    rows = [measure(f"zoo {m}", cached_graph(f"zoo:{m}"), cluster) for m in args.models]
    write_text_atomic(OUT, json.dumps({"memory_fraction": MEMORY_FRACTION, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
