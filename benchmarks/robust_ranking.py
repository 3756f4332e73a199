"""How the ranking of placers changes when the cost model is wrong: the four bundled graphs, N perturbed models.

Each graph is placed on the devices its dnn-partitioning file declares (``cluster_for``) by every
default placer of ``devplace compare``, plus sim-search scoring by its mean over perturbed models
(``sim-search robust``, ``robust_samples``; its models come from another part of the stream, so
it is judged here on models it never saw). Every placement is then simulated under the same N
perturbed cost models (``devplace.robust``, default sigmas, seed 0): per placer its nominal,
median, mean and worst step time and its rank by nominal, median and worst (1: fastest, among the
placements that fit). Writes ``benchmarks/results/robust_ranking.json``:

    .venv/bin/python benchmarks/robust_ranking.py [--models 32] [--robust-samples 8] [--graphs NAME ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import devplace as dp
from devplace.compare import compare, default_algos
from devplace.fileio import write_text_atomic
from devplace.io.dnn_partitioning import cluster_for
from devplace.robust import KIND_SIGMA, LINK_SIGMA, OP_SIGMA, perturbed_models, ranks, robust_step_times

GRAPHS = ("bert_l-3_training", "gnmt_layers_training", "resnet50_inference", "bert_l-3_inference")
RESULTS = Path(__file__).parent / "results" / "robust_ranking.json"
ROBUST_ROW = "sim-search robust"


def run(name: str, n_models: int, robust_samples: int) -> dict:
    graph = dp.load_graph(dp.example_path(f"{name}.json"))
    cluster = cluster_for(graph)
    began = time.perf_counter()
    comparison = compare(graph, cluster, default_algos(), robust=n_models, robust_seed=0)
    models = perturbed_models(graph, cluster, n_models, seed=0)
    rows = []
    for row in comparison.rows:
        entry = {"placer": row.algorithm, "fits": row.error is None and not row.oom}
        if row.algorithm in comparison.placements:
            times = robust_step_times(graph, cluster, comparison.placements[row.algorithm], models)
            assert (times.median_us, times.worst_us) == (row.robust_median_us, row.robust_worst_us)
            entry |= {"nominal_ms": row.step_time_us / 1e3, "median_ms": times.median_us / 1e3,
                      "mean_ms": times.mean_us / 1e3, "worst_ms": times.worst_us / 1e3,
                      "placement_s": round(row.placement_time_s, 2)}
        rows.append(entry)
    robust = dp.place(graph, cluster, "sim-search", robust_samples=robust_samples)
    result = dp.simulate(graph, cluster, robust)
    times = robust_step_times(graph, cluster, robust, models)
    rows.append({"placer": ROBUST_ROW, "fits": result.fits, "nominal_ms": result.step_time_us / 1e3,
                 "median_ms": times.median_us / 1e3, "mean_ms": times.mean_us / 1e3,
                 "worst_ms": times.worst_us / 1e3, "placement_s": round(robust.placement_time_s, 2)})
    for key in ("nominal", "median", "worst"):
        column = ranks([r.get(f"{key}_ms") if r["fits"] else None for r in rows])
        for r, rank in zip(rows, column):
            r[f"rank_{key}"] = rank
    ok = [r for r in rows if r["fits"]]
    summary = {
        "graph": name, "ops": graph.n_ops, "devices": cluster.n_devices, "seconds": round(time.perf_counter() - began, 1),
        "placers_ranked": len(ok),
        "rank_changes_median": sum(r["rank_median"] != r["rank_nominal"] for r in ok),
        "rank_changes_worst": sum(r["rank_worst"] != r["rank_nominal"] for r in ok),
        "best_nominal": [r["placer"] for r in ok if r["rank_nominal"] == 1],
        "best_median": [r["placer"] for r in ok if r["rank_median"] == 1],
        "best_worst": [r["placer"] for r in ok if r["rank_worst"] == 1],
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}), flush=True)
    return summary


def markdown(graphs: list[dict]) -> str:
    """The two tables of BENCHMARKS.md: how ranks move per graph, and sim-search against sim-search robust."""
    lines = ["| graph (devices) | placers that fit | ranks changed: median / worst | fastest: nominal / median / worst "
             "| worst / nominal |", "|---|---|---|---|---|"]
    for g in graphs:
        ratio = [r["worst_ms"] / r["nominal_ms"] for r in g["rows"] if r["fits"]]
        fastest = " / ".join(", ".join(g[f"best_{key}"]) for key in ("nominal", "median", "worst"))
        lines.append(f"| {g['graph']} ({g['devices']}) | {g['placers_ranked']} | {g['rank_changes_median']} / "
                     f"{g['rank_changes_worst']} | {fastest} | {min(ratio):.2f}-{max(ratio):.2f} |")
    lines += ["", "| graph | sim-search: nominal / median / mean / worst (ms), placed in | sim-search robust: same |",
              "|---|---|---|"]
    for g in graphs:
        by_name = {r["placer"]: r for r in g["rows"]}
        cells = [" / ".join(f"{r[f'{key}_ms']:.1f}" for key in ("nominal", "median", "mean", "worst"))
                 + f", {r['placement_s']:.2f} s" for r in (by_name["sim-search"], by_name[ROBUST_ROW])]
        lines.append(f"| {g['graph']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=32, help="perturbed cost models each placement is judged on")
    parser.add_argument("--robust-samples", type=int, default=8, help="models sim-search robust scores with")
    parser.add_argument("--graphs", nargs="*", default=list(GRAPHS), choices=GRAPHS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    graphs = [run(name, args.models, args.robust_samples) for name in args.graphs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps({
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)},
        "models": args.models, "robust_seed": 0, "sigmas": {"op": OP_SIGMA, "kind": KIND_SIGMA, "link": LINK_SIGMA},
        "sim_search_robust_samples": args.robust_samples, "graphs": graphs,
    }, indent=1))
    print(markdown(graphs))


if __name__ == "__main__":
    main()
