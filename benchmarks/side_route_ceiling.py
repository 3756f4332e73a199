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
from devplace.bounds.relaxation import longest_path  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402

OUT = RESULTS / "side_route_ceiling.json"
MEMORY_FRACTION = 0.3
ZOO = ["transformer", "rnnlm", "resnet50", "inception_v3", "gnmt", "nasnet", "mlp", "small_cnn"]


def in_between(graph, position: np.ndarray) -> np.ndarray:
    """Per op, whether it is off the path, below some path op and above some later one."""
    latest = np.where(position >= 0, position, -1)                # the latest path op above (or the op itself)
    for v in graph.topo_order:
        if position[v] < 0:
            preds = graph.edge_src[graph.pred_edge[graph.pred_ptr[v]:graph.pred_ptr[v + 1]]]
            latest[v] = latest[preds].max(initial=-1)
    below = position >= 0                                         # leads to some path op (or is one)
    for v in graph.topo_order[::-1]:
        if position[v] < 0:
            below[v] = below[graph.edge_dst[graph.succ_edge[graph.succ_ptr[v]:graph.succ_ptr[v + 1]]]].any()
    return (position < 0) & (latest >= 0) & below


def measure(name: str, graph, cluster) -> dict:
    load = os.getloadavg()[0]
    rel = bounds.relaxation(graph, cluster)
    path_ops, _ = longest_path(graph, rel.fastest_us, np.zeros(graph.n_edges))
    position = np.full(graph.n_ops, -1, np.int64)
    position[path_ops] = np.arange(len(path_ops))
    between = in_between(graph, position)
    began = time.perf_counter()
    memory_path_ms = bounds.memory_path_us(graph, cluster, rel) / 1e3
    path_ms, between_ms = rel.fastest_us[path_ops].sum() / 1e3, rel.fastest_us[between].sum() / 1e3
    fits = rel.unit_bytes[np.unique(rel.unit[path_ops])].sum() <= cluster.memory_bytes.max()   # else cuts charge too
    row = {"graph": name, "ops": graph.n_ops, "path_ops": len(path_ops), "path_fits_one_device": bool(fits),
           "in_between_ops": int(between.sum()),
           "path_ms": path_ms, "in_between_ms": between_ms, "staying_work_cap_ms": path_ms + between_ms,
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
