"""devplace's own placer (``sim-search``) against every other placer (BENCHMARKS.md, "Our placer").

Cases: the 4 bundled dnn-partitioning graphs on their own devices (``cluster_for``), and captured
zoo graphs (roofline costs, ``baechi-4x2080``) with ample memory, with each GPU at 30% of its
memory (Baechi's setting; the small presets still fit one device) and "tight": each GPU holds
60% of the step's one-device peak, so no single device can run it. Each baseline runs through ``devplace.compare`` (so a failing placer keeps its row); then
``sim-search`` with its default, evaluation-count stopping rule and seed 0, so its figures do not
depend on the machine's speed (its placement time does).

    .venv/bin/python benchmarks/own_placer.py            # everything (resumes finished cases)
    .venv/bin/python benchmarks/own_placer.py --force    # recompute
    .venv/bin/python benchmarks/own_placer.py --table    # only print the markdown table
    .venv/bin/python benchmarks/own_placer.py --ours-only  # rerun only sim-search in finished cases

Zoo graphs are captured once into ``benchmarks/.cache/`` (shared with ``reproduce_papers.py``).
Results: ``benchmarks/results/own_placer.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import devplace as dp
from devplace.cluster import load_cluster
from devplace.compare import compare, default_algos
from devplace.fileio import write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import cached_graph  # noqa: E402 - the shared capture cache

RESULTS = Path(__file__).resolve().parent / "results" / "own_placer.json"
OURS = "sim-search"
EXTRA_BASELINES = ["heft+opt", "metis+opt"]
TABLE_COLUMNS = ["single", "expert", "m-topo", "m-etf", "m-sct", "heft", "metis",
                 "m-topo+opt", "m-etf+opt", "m-sct+opt"]
TIGHT_SHARE = 0.6
DNN_GRAPHS = ["bert_l-3_training.json", "gnmt_layers_training.json", "resnet50_inference.json",
              "bert_l-3_inference.json"]
ZOO_TARGETS = ["zoo:gnmt:preset=small", "zoo:rnnlm:preset=small", "zoo:transformer:preset=small",
               "zoo:inception_v3:preset=small"]


def cases() -> list[dict]:
    out = [dict(id=name, target=name, memory_fraction=None) for name in DNN_GRAPHS]
    for fraction in (None, 0.3, "tight"):
        out += [dict(id=f"{t}|{fraction}", target=t, memory_fraction=fraction) for t in ZOO_TARGETS]
    return out


def baselines() -> list[str]:
    return [a for a in default_algos() if a.split("+")[0] != OURS] + EXTRA_BASELINES


def load_case(case: dict):
    if case["target"].endswith(".json"):
        from devplace.io.dnn_partitioning import cluster_for

        graph = dp.load_graph(dp.example_path(case["target"]))
        cluster = cluster_for(graph)
    else:
        graph, cluster = cached_graph(case["target"]), load_cluster("baechi-4x2080")
    fraction = case["memory_fraction"]
    if fraction == "tight":   # each device holds TIGHT_SHARE of the step's one-device peak
        peak = dp.simulate(graph, cluster, [0] * graph.n_ops).peak_memory_bytes[0]
        fraction = TIGHT_SHARE * peak / cluster.memory_bytes.min()
    if fraction is not None:
        cluster = cluster.with_memory_fraction(fraction)
    return graph, cluster


def _progress(row):
    what = f"{row.step_time_us / 1e3:10.3f} ms" if row.step_time_us is not None else "no placement"
    print(f"    {row.algorithm:12s} {what}  ({row.placement_time_s or 0:.1f} s)", flush=True)


def run_ours(graph, cluster) -> list:
    return compare(graph, cluster, [OURS], on_row=_progress).rows


def run_case(case: dict) -> dict:
    graph, cluster = load_case(case)
    rows = compare(graph, cluster, baselines(), on_row=_progress).rows + run_ours(graph, cluster)
    return {"case": case, "cluster": cluster.name, "ops": graph.n_ops,
            "rows": [row.to_dict() for row in rows]}


def summary(entry: dict) -> dict:
    """Step times per algorithm (None: no placement), the best baseline and our speed-up over it."""
    times = {r["algorithm"]: (r["step_time_us"] if r["error"] is None and not r["oom"] else None)
             for r in entry["rows"]}
    ours = times.pop(OURS)
    placed = {a: t for a, t in times.items() if t is not None}
    best = min(placed, key=placed.get) if placed else None
    return {"times": times, "ours": ours, "best_baseline": best,
            "best_baseline_us": placed.get(best), "speedup": placed[best] / ours if best and ours else None}


def table(results: dict) -> str:
    def ms(value):
        return "-" if value is None else f"{value / 1e3:.3f}"

    head = ["case", "ops", *TABLE_COLUMNS, "best baseline", f"**{OURS}**", "speed-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases():
        entry = results.get(case["id"])
        if entry is None:
            continue
        s = summary(entry)
        name = case["target"].removesuffix(".json").removeprefix("zoo:").replace(":preset=small", " small")
        if case["memory_fraction"] == "tight":
            name += f", mem {TIGHT_SHARE:g} x peak"
        elif case["memory_fraction"] is not None:
            name += f", mem x{case['memory_fraction']}"
        best = f"{ms(s['best_baseline_us'])} ({s['best_baseline']})" if s["best_baseline"] else "-"
        speedup = f"{s['speedup']:.3f}x" if s["speedup"] else "-"
        lines.append("| " + " | ".join([name, f"{entry['ops']:,}", *(ms(s["times"].get(a)) for a in TABLE_COLUMNS),
                                        best, f"**{ms(s['ours'])}**", speedup]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="recompute finished cases")
    parser.add_argument("--table", action="store_true", help="only print the table")
    parser.add_argument("--only", nargs="*", help="case ids to run")
    parser.add_argument("--ours-only", action="store_true",
                        help="in finished cases rerun only sim-search (after a change to it), keeping the baselines")
    args = parser.parse_args(argv)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.table:
        for case in cases():
            if args.only and case["id"] not in args.only:
                continue
            if args.ours_only and case["id"] in results:
                print(f"[{case['id']}] {OURS} only", flush=True)
                graph, cluster = load_case(case)
                entry = results[case["id"]]
                if entry["ops"] != graph.n_ops:
                    raise SystemExit(f"{case['id']}: the graph has changed since the baselines ran; use --force")
                entry["rows"] = [r for r in entry["rows"] if r["algorithm"] != OURS] + [
                    row.to_dict() for row in run_ours(graph, cluster)]
                write_text_atomic(RESULTS, json.dumps(results, indent=1))
                continue
            if case["id"] in results and not args.force:
                continue
            print(f"[{case['id']}]", flush=True)
            results[case["id"]] = run_case(case)
            write_text_atomic(RESULTS, json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
