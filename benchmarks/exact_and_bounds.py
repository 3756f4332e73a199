"""How far from optimal: certified lower bounds and the exact placer on the four bundled graphs.

Each graph is placed on the devices its dnn-partitioning file declares (``cluster_for``). Per graph:
every bound of ``devplace.bounds`` and how long they take; sim-search (default budget) as the best
heuristic; then ``exact`` with a time limit, started from the best simulated of m-ETF, HEFT, m-TOPO,
one device and sim-search. Reported: the incumbent's simulated step time, the MIP's proven bound, the
certified bound (the larger of the two) and the gap = incumbent / bound - 1. Writes
``benchmarks/results/exact_and_bounds.json``:

    .venv/bin/python benchmarks/exact_and_bounds.py [--time-limit 120] [--graphs NAME ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import devplace as dp
from devplace.bounds import lower_bounds
from devplace.fileio import write_text_atomic
from devplace.io.dnn_partitioning import cluster_for

GRAPHS = ("bert_l-3_training", "gnmt_layers_training", "resnet50_inference", "bert_l-3_inference")
RESULTS = Path(__file__).parent / "results" / "exact_and_bounds.json"
START = ("m-etf", "heft", "m-topo", "single", "sim-search")


def run(name: str, time_limit_s: float) -> dict:
    graph = dp.load_graph(dp.example_path(f"{name}.json"))
    cluster = cluster_for(graph)
    row: dict = {"graph": name, "ops": graph.n_ops, "edges": graph.n_edges, "devices": cluster.n_devices,
                 "memory_mib": cluster.memory_bytes[0] / 2**20, "comm_model": cluster.comm_model}
    began = time.perf_counter()
    bounds = lower_bounds(graph, cluster)
    row["bounds_s"] = round(time.perf_counter() - began, 3)
    row["bounds_ms"] = {k: (v / 1e3 if isinstance(v, float) else v) for k, v in bounds.items()}
    search = dp.place(graph, cluster, algo="sim-search", quiet=True)
    row["sim_search_ms"] = dp.simulate(graph, cluster, search).step_time_us / 1e3
    row["sim_search_s"] = round(search.placement_time_s, 2)
    exact = dp.place(graph, cluster, algo="exact", time_limit_s=time_limit_s, start=START)
    o = exact.options
    row["exact"] = {"step_ms": o["step_us"] / 1e3, "mip_bound_ms": o["mip_bound_us"] / 1e3,
                    "mip_objective_ms": None if o["mip_objective_us"] is None else o["mip_objective_us"] / 1e3,
                    "first_incumbent_ms": o["first_incumbent_us"] / 1e3, "status": o["mip_status"],
                    "disjunctive_pairs": o["disjunctive_pairs"], "all_pairs": o["all_pairs"],
                    "solve_s": o["solve_s"], "placement_s": round(exact.placement_time_s, 2)}
    best_ms = min(row["sim_search_ms"], o["step_us"] / 1e3)
    bound_ms = o["lower_bound_us"] / 1e3
    row |= {"best_ms": best_ms, "certified_bound_ms": bound_ms, "gap": best_ms / bound_ms - 1}
    print(json.dumps(row), flush=True)
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| graph (devices x MiB) | ops | critical path / work / memory path bound (ms) | sim-search (ms) "
             "| exact: incumbent / MIP bound (ms), status, solve s | certified bound (ms) | best (ms) | gap |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, e = r["bounds_ms"], r["exact"]
        lines.append(
            f"| {r['graph']} ({r['devices']} x {r['memory_mib']:,.0f}) | {r['ops']} "
            f"| {b['critical_path_us']:.1f} / {b['work_us']:.1f} / {b['memory_path_us']:.1f} "
            f"| {r['sim_search_ms']:.1f} | {e['step_ms']:.1f} / {e['mip_bound_ms']:.1f}, {e['status']}, "
            f"{e['solve_s']:.0f} | {r['certified_bound_ms']:.1f} | {r['best_ms']:.1f} | {100 * r['gap']:.1f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds for HiGHS per graph")
    parser.add_argument("--graphs", nargs="*", default=list(GRAPHS), choices=GRAPHS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--table", action="store_true", help="print the markdown table of --out and stop")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(args.out.read_text())["rows"]))
        return
    rows = [run(name, args.time_limit) for name in args.graphs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps({
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)},
        "time_limit_s": args.time_limit, "exact_start": list(START), "rows": rows,
    }, indent=1))
    print(markdown(rows))


if __name__ == "__main__":
    main()
