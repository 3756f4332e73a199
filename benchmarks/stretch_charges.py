"""What the side routes beside the bound's path add, stretch by stretch, at Baechi's 30% memory (issue 15, point 3).

``devplace.bounds.memory_path_us`` charges a path that fits one device stretch by stretch
(``_fitting_path_us``): the larger of the spans alone and ``_split_routes_us``, the least over the cuts
inside the stretch of their sum plus, per segment between cuts, what its op-disjoint side routes add
(stay on the segment's device, or leave and come back). Before, a stretch was charged the larger of
its spans alone and min(its routes with no cut inside, its cheapest cut): *unsplit*, the same kernel
with no cut allowed, against the cheapest cut. For each graph this records, on the first path (the
critical path at fastest times, the one that binds on Inception-V3 and NASNet): the side routes and
those whose leaving excess is positive, the stretches, per stretch the op-disjoint routes taken, and
the charges summed over stretches (spans alone, unsplit, split, charged); and every bound of
``lower_bounds`` with and without the split (seconds, load).

    .venv/bin/python benchmarks/stretch_charges.py [--models inception_v3 nasnet ...] [--bundled]

Writes ``benchmarks/results/stretch_charges.json``. Times are wall clock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace import bounds  # noqa: E402
from devplace.bounds import memory_path  # noqa: E402
from devplace.bounds.relaxation import crossing_us, longest_path  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.io.dnn_partitioning import cluster_for  # noqa: E402

OUT = RESULTS / "stretch_charges.json"
MEMORY_FRACTION = 0.3
ZOO = ["mlp", "small_cnn", "transformer", "rnnlm", "resnet50", "inception_v3", "gnmt", "nasnet"]
BUNDLED = ["bert_l-3_training", "gnmt_layers_training", "resnet50_inference", "bert_l-3_inference"]
SPLIT = memory_path._split_routes_us


def unsplit_us(cut_us, a, b, excess_us, stay_us) -> float:
    """A stretch's routes as charged before: no cut inside, or its cheapest cut."""
    return min(SPLIT(np.full_like(cut_us, np.inf), a, b, excess_us, stay_us), float(cut_us.min(initial=np.inf)))


def stretches(graph, cluster, rel) -> dict:
    """The first path's stretches: routes, and the charges summed (ms)."""
    rows = []

    def split(cut_us, a, b, excess_us, stay_us):
        value = SPLIT(cut_us, a, b, excess_us, stay_us)
        rows.append({"edges": len(cut_us), "routes": len(a), "split_us": value,
                     "unsplit_us": unsplit_us(cut_us, a, b, excess_us, stay_us)})
        return value

    charged = []
    stretch = memory_path._stretch_us

    def per_stretch(graph, members, n_spans, alone, *rest):
        value = stretch(graph, members, n_spans, alone, *rest)
        charged.append((float(sum(alone[j] for j in members if j < n_spans)), value))
        return value

    with mock.patch.object(memory_path, "_split_routes_us", split), mock.patch.object(memory_path, "_stretch_us", per_stretch):
        path_bound_us = bounds.memory_path_us(graph, cluster, rel, n_paths=1)
    path_ops, _ = longest_path(graph, rel.fastest_us, np.zeros(graph.n_edges))
    position = np.full(graph.n_ops, -1, np.int64)
    position[path_ops] = np.arange(len(path_ops))
    side_a, side_b, side_us, cut1, cut2, _, _ = memory_path._side_routes(
        graph.topo_order, graph.pred_ptr, graph.pred_edge, graph.edge_src, graph.succ_ptr, graph.succ_edge,
        graph.edge_dst, position, np.ascontiguousarray(rel.fastest_us, dtype=np.float64),
        crossing_us(graph, rel.fastest_us, rel.cut_us), memory_path.MAX_SPAN)     # the routes' costs, as the bound's
    before = np.concatenate([[0.0], np.cumsum(rel.fastest_us[path_ops])])
    excess = side_us + cut1 + cut2 - (before[side_b] - before[side_a + 1])
    taken = [r["routes"] for r in rows]
    return {
        "path_ops": len(path_ops), "path_ms": before[-1] / 1e3, "memory_path_first_ms": path_bound_us / 1e3,
        "side_routes": len(side_a), "side_routes_excess_positive": int((excess > 0).sum()),
        "side_route_ms_excess_positive": float(side_us[excess > 0].sum()) / 1e3,
        "largest_excess_ms": float(excess.max(initial=0.0)) / 1e3,
        "stretches": len(charged), "routes_taken": int(sum(taken)), "most_routes_in_a_stretch": max(taken, default=0),
        "spans_alone_ms": sum(c[0] for c in charged) / 1e3,
        "unsplit_ms": sum(r["unsplit_us"] for r in rows) / 1e3, "split_ms": sum(r["split_us"] for r in rows) / 1e3,
        "charged_before_ms": sum(max(c[0], r["unsplit_us"]) for c, r in zip(charged, rows)) / 1e3,
        "charged_ms": sum(c[1] for c in charged) / 1e3,
        "stretches_raised": sum(c[1] > max(c[0], r["unsplit_us"]) * (1 + 1e-12) for c, r in zip(charged, rows)),
    }


def timed_bounds(graph, cluster) -> dict:
    load = os.getloadavg()[0]
    began = time.perf_counter()
    found = bounds.lower_bounds(graph, cluster)
    return {"seconds": round(time.perf_counter() - began, 2), "load_1min": round(load, 2), "best": found["best"],
            **{k: v / 1e3 for k, v in found.items() if k.endswith("_us")}}


def measure(name: str, graph, cluster) -> dict:
    rel = bounds.relaxation(graph, cluster)
    row = {"graph": name, "ops": graph.n_ops, "stretches": stretches(graph, cluster, rel)}
    row["after"] = timed_bounds(graph, cluster)
    with mock.patch.object(memory_path, "_split_routes_us", unsplit_us):
        row["before"] = timed_bounds(graph, cluster)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=ZOO, choices=ZOO)
    parser.add_argument("--bundled", action="store_true", help="the four bundled graphs too, on their files' devices")
    args = parser.parse_args()
    machine = dp.load_cluster(PRESET)
    rows = [measure(f"zoo {m}", g, machine.with_memory_fraction(MEMORY_FRACTION))
            for m in args.models for g in [cached_graph(f"zoo:{m}")]]
    if args.bundled:
        for name in BUNDLED:
            graph = dp.load_graph(dp.example_path(f"{name}.json"))
            rows.append(measure(name, graph, cluster_for(graph)))
    write_text_atomic(OUT, json.dumps({"memory_fraction": MEMORY_FRACTION, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
