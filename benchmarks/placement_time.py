"""Placement time of m-TOPO, m-ETF and m-SCT, beside Baechi's own code (REFERENCE.md).

Setting as Baechi's table: random layered DAGs of 1k, 5k and 20k ops on 4 devices with ample memory
(the baechi-4x2080 preset: sequential channels, 134 us + 0.1754 us/KB per transfer). For each run it
also simulates the step time against the best single device. Graph files (e.g. the zoo's GNMT) can be
added with ``--graph PATH``; they are placed on the same cluster unless they carry their own
(dnn-partitioning files). Writes ``benchmarks/results/placement_time.json``.

    .venv/bin/python benchmarks/placement_time.py [--sizes 1000 5000 20000] [--graph FILE ...]
        [--transform coplacement fusion] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

import devplace as dp
from devplace.cluster import load_cluster
from devplace.graph import GraphBuilder, OpGraph

ALGOS = ("m-topo", "m-etf", "m-sct")
RESULTS = Path(__file__).parent / "results" / "placement_time.json"


def random_layered_dag(n_ops: int, *, seed: int = 0, max_inputs: int = 3) -> OpGraph:
    """About sqrt(n) layers of about sqrt(n) ops; each op reads 1-3 ops of the layer before it.

    Compute 10-1000 us, outputs 4 KB-1 MB: transfers cost about as much as an op, as in a real step."""
    rng = np.random.default_rng(seed)
    width = max(1, int(round(np.sqrt(n_ops))))
    b = GraphBuilder(["gpu"])
    layer_of = np.arange(n_ops) // width
    out_bytes = rng.uniform(4e3, 1e6, n_ops)
    for i in range(n_ops):
        b.add_op(f"op{i}", compute_us=float(rng.uniform(10, 1000)), output_bytes=float(out_bytes[i]),
                 persistent_bytes=float(rng.uniform(0, 1e5)))
    for i in range(width, n_ops):
        lo = (layer_of[i] - 1) * width
        for j in sorted(set(rng.integers(lo, lo + width, rng.integers(1, max_inputs + 1)).tolist())):
            b.add_edge(f"op{j}", f"op{i}", bytes=float(out_bytes[j]))
    return b.build()


def bench(name: str, graph: OpGraph, cluster, algos=ALGOS, **transforms) -> dict:
    row = {"graph": name, "transforms": sorted(k for k, on in transforms.items() if on), "ops": graph.n_ops, "edges": graph.n_edges, "devices": cluster.n_devices,
           "comm_model": cluster.comm_model}
    try:
        single = dp.place(graph, cluster, algo="single")
        row["single_step_ms"] = dp.simulate(graph, cluster, single).step_time_us / 1e3
    except dp.DevplaceError as exc:
        row["single_step_ms"] = None
        row["single_error"] = str(exc)
    for algo in algos:
        began = time.perf_counter()
        try:
            placement = dp.place(graph, cluster, algo=algo, **transforms)
        except dp.DevplaceError as exc:
            row[algo] = {"error": str(exc), "placement_s": time.perf_counter() - began}
            continue
        result = dp.simulate(graph, cluster, placement)
        row[algo] = {
            "placement_s": round(placement.placement_time_s, 3),
            "step_ms": result.step_time_us / 1e3,
            "devices_used": int(len(np.unique(placement.devices))),
            "peak_gib": [round(x / 2**30, 3) for x in result.peak_memory_bytes],
        }
    print(json.dumps(row))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 5000, 20000])
    parser.add_argument("--graph", nargs="*", default=[], help="graph files to place as well")
    parser.add_argument("--cluster", default="baechi-4x2080")
    parser.add_argument("--transform", nargs="*", default=[], choices=["coplacement", "fusion", "forward_only"],
                        help="Baechi's graph optimizations to apply before placing")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    cluster = load_cluster(args.cluster).with_memory_fraction(1000.0)   # ample memory
    # compile once outside the timings, as a long-lived process would
    bench("warm-up", random_layered_dag(50, seed=1), cluster)
    transforms = {name: True for name in args.transform}
    rows = [bench(f"random-layered-{n}", random_layered_dag(n), cluster, **transforms) for n in args.sizes]
    for path in args.graph:
        graph = dp.load_graph(path)
        graph_cluster = cluster
        if "dnn_partitioning" in graph.meta:
            from devplace.io.dnn_partitioning import cluster_for
            graph_cluster = cluster_for(graph)
        rows.append(bench(Path(path).name, graph, graph_cluster, **transforms))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
        "cluster": args.cluster + " with 1000x memory (graph files with their own devices keep them)",
        "transforms": args.transform,
        "baechi_code_s": {"1000": [0.04, 0.48, 0.64], "5000": [0.28, 2.2, 3.3], "20000": [1.0, 8.4, 45.0]},
        "rows": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
