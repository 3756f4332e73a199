"""How far from optimal: certified lower bounds, sim-search and the exact placer.

Bundled graphs: each is placed on the devices its dnn-partitioning file declares (``cluster_for``).
Per graph: every bound of ``devplace.bounds`` and how long they take; sim-search (default budget,
which adapts to the gap) as the best heuristic; then ``exact`` with a time limit, started from
sim-search's placement (its default). Reported: the incumbent's simulated step time, the MIP's proven
bound, the certified bound (the larger of the two) and the gap = best / bound - 1. Writes
``benchmarks/results/exact_and_bounds.json``.

``--zoo``: every zoo model at its default configuration, captured with roofline costs for
``baechi-4x2080`` (cached as ``benchmarks/reproduce_papers.py`` does), on that machine with each GPU
at Baechi's 30% memory: the bounds, sim-search, and ``exact`` on the graphs of at most 1,000 ops.
Writes ``benchmarks/results/exact_and_bounds_zoo.json``.

    .venv/bin/python benchmarks/exact_and_bounds.py [--time-limit 120] [--graphs NAME ...] [--out FILE]
    .venv/bin/python benchmarks/exact_and_bounds.py --zoo [--models NAME ...] [--time-limit 60]

``--bounds-only --out FILE``: the bounds alone (seconds included), the gap measured against the best
placement of the committed results file, so a bound's change is measured in seconds, not minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import devplace as dp
from devplace.bounds import BOUND_NAMES, lower_bounds
from devplace.fileio import write_text_atomic
from devplace.io.dnn_partitioning import cluster_for

GRAPHS = ("bert_l-3_training", "gnmt_layers_training", "resnet50_inference", "bert_l-3_inference")
ZOO = ("mlp", "small_cnn", "transformer", "rnnlm", "resnet50", "inception_v3", "gnmt", "nasnet")
RESULTS = Path(__file__).parent / "results" / "exact_and_bounds.json"
ZOO_RESULTS = Path(__file__).parent / "results" / "exact_and_bounds_zoo.json"
MEMORY_FRACTION = 0.3
EXACT_MAX_OPS = 1000


def run(name: str, graph, cluster, time_limit_s: float, best_ms: float | None = None) -> dict:
    """One graph's row; with ``best_ms`` (the committed best placement) the bounds alone."""
    row: dict = {"graph": name, "ops": graph.n_ops, "edges": graph.n_edges, "devices": cluster.n_devices,
                 "memory_mib": cluster.memory_bytes[0] / 2**20, "comm_model": cluster.comm_model}
    began = time.perf_counter()
    bounds = lower_bounds(graph, cluster)
    row["bounds_s"] = round(time.perf_counter() - began, 3)
    row["bounds_ms"] = {k: (v / 1e3 if isinstance(v, float) else v) for k, v in bounds.items()}
    if best_ms is not None:
        row |= {"best_ms": best_ms, "certified_bound_ms": bounds["best_us"] / 1e3,
                "gap": best_ms / (bounds["best_us"] / 1e3) - 1}
        print(json.dumps(row), flush=True)
        return row
    search = dp.place(graph, cluster, algo="sim-search")
    row["sim_search_ms"] = dp.simulate(graph, cluster, search).step_time_us / 1e3
    row["sim_search_s"] = round(search.placement_time_s, 2)
    row["sim_search_rounds"], row["sim_search_evals"] = search.options["rounds"], search.options["evals"]
    row["sim_search_stopped_by"] = search.options["stopped_by"]
    best_ms, bound_ms = row["sim_search_ms"], bounds["best_us"] / 1e3
    if graph.n_ops <= EXACT_MAX_OPS:
        exact = dp.place(graph, cluster, algo="exact", time_limit_s=time_limit_s)
        o = exact.options
        row["exact"] = {"step_ms": o["step_us"] / 1e3, "mip_bound_ms": o["mip_bound_us"] / 1e3,
                        "mip_objective_ms": None if o["mip_objective_us"] is None else o["mip_objective_us"] / 1e3,
                        "first_incumbent_ms": o["first_incumbent_us"] / 1e3, "status": o["mip_status"],
                        "disjunctive_pairs": o["disjunctive_pairs"], "all_pairs": o["all_pairs"],
                        "solve_s": o["solve_s"], "placement_s": round(exact.placement_time_s, 2)}
        best_ms, bound_ms = min(best_ms, o["step_us"] / 1e3), o["lower_bound_us"] / 1e3
    row |= {"best_ms": best_ms, "certified_bound_ms": bound_ms, "gap": best_ms / bound_ms - 1}
    print(json.dumps(row), flush=True)
    return row


def bundled(name: str, time_limit_s: float, best_ms: float | None = None) -> dict:
    graph = dp.load_graph(dp.example_path(f"{name}.json"))
    return run(name, graph, cluster_for(graph), time_limit_s, best_ms)


def zoo(name: str, time_limit_s: float, best_ms: float | None = None) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    from reproduce_papers import PRESET, cached_graph

    graph = cached_graph(f"zoo:{name}")
    machine = dp.load_cluster(PRESET)
    row = run(name, graph, machine.with_memory_fraction(MEMORY_FRACTION), time_limit_s, best_ms)
    row["one_device_ample_ms"] = dp.simulate(graph, machine, [0] * graph.n_ops).step_time_us / 1e3
    return row


def markdown(rows: list[dict]) -> str:
    names = " / ".join(name.removesuffix("_us").replace("_", " ") for name in BOUND_NAMES)
    lines = [f"| graph (devices x MiB) | ops | {names} bound (ms), s "
             "| sim-search (ms), rounds | exact: incumbent / MIP bound (ms), status, solve s | certified bound (ms) "
             "| best (ms) | gap |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, e = r["bounds_ms"], r.get("exact")
        exact = "-" if e is None else (f"{e['step_ms']:.3f} / {e['mip_bound_ms']:.3f}, {e['status']}, "
                                       f"{e['solve_s']:.0f}")
        # rows written before a bound existed lack it: nan
        bounds = " / ".join(f"{b.get(name, float('nan')):.3f}" for name in BOUND_NAMES)
        search = f"{r['sim_search_ms']:.3f}, {r['sim_search_rounds']}" if "sim_search_ms" in r else "-"
        lines.append(
            f"| {r['graph']} ({r['devices']} x {r['memory_mib']:,.0f}) | {r['ops']:,} "
            f"| {bounds}, {r['bounds_s']:.1f} | {search} | {exact} "
            f"| {r['certified_bound_ms']:.3f} | {r['best_ms']:.3f} | {100 * r['gap']:.1f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds for HiGHS per graph")
    parser.add_argument("--graphs", nargs="*", default=list(GRAPHS), choices=GRAPHS)
    parser.add_argument("--zoo", action="store_true", help="the zoo models at 30%% memory instead")
    parser.add_argument("--models", nargs="*", default=list(ZOO), choices=ZOO)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table", action="store_true", help="print the markdown table of --out and stop")
    parser.add_argument("--bounds-only", action="store_true",
                        help="the bounds alone, gaps against the committed results' best placements (needs --out)")
    args = parser.parse_args()
    committed = ZOO_RESULTS if args.zoo else RESULTS
    if args.bounds_only and args.out is None:
        parser.error("--bounds-only needs --out FILE: it must not overwrite the committed results it reads")
    out = args.out or committed
    if args.table:
        print(markdown(json.loads(out.read_text())["rows"]))
        return
    best = ({r["graph"]: r["best_ms"] for r in json.loads(committed.read_text())["rows"]} if args.bounds_only
            else {})
    if args.zoo:
        rows = [zoo(name, args.time_limit, best.get(name)) for name in args.models]
    else:
        rows = [bundled(name, args.time_limit, best.get(name)) for name in args.graphs]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps({
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)},
        "time_limit_s": args.time_limit, "exact_start": "sim-search (exact's default)",
        "memory_fraction": MEMORY_FRACTION if args.zoo else None, "bounds_only": args.bounds_only, "rows": rows,
    }, indent=1))
    print(markdown(rows))


if __name__ == "__main__":
    main()
