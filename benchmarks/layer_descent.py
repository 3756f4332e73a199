"""sim-search's layer descent (issue 15, point 3): step times before and after, default budget.

Each zoo model (roofline costs for ``baechi-4x2080``, as ``reproduce_papers.py`` captures them) is
placed by sim-search (``--seed``, 0 by default; default options) with each RTX 2080 at 30% of its memory and with its
whole memory (``--memories``: also 60% and 400%); the row records the step time, what found it, the evals, rounds,
the largest peak of the best placement as a share of its device's memory, wall-clock seconds and the load average. Run it once with the code before a change (``PYTHONPATH`` at that tree) and
once after, under two labels:

    PYTHONPATH=/work/main .venv/bin/python benchmarks/layer_descent.py --label before --models gnmt
    PYTHONPATH=$PWD .venv/bin/python benchmarks/layer_descent.py --label after --models gnmt

With ``--bundled`` it places the four bundled dnn-partitioning graphs instead (each file's own devices and
memory), whose layers do not interleave, so before and after must give the same step times and evals.

Writes ``benchmarks/results/layer_descent.json`` (``--out``: another file there; runs keyed by label,
then model and memory). Issue 15 point 4 (more memory never slower) uses it so:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/layer_descent.py --label before --out sim_search_memory_zoo.json \
        --models inception_v3,transformer,rnnlm,nasnet,resnet50,gnmt --memories 30%,60%,ample [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import devplace as dp
from devplace.fileio import write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402

MEMORY_FRACTION = 0.3
MEMORIES = {"30%": MEMORY_FRACTION, "60%": 0.6, "ample": 1.0, "400%": 4.0}   # each RTX 2080's share of its 8 GiB
BUNDLED = ("bert_l-3_training", "gnmt_layers_training", "resnet50_inference", "bert_l-3_inference")


def run(name: str, memories: list[str], seed: int) -> dict:
    graph = cached_graph(f"zoo:{name}")
    machine = dp.load_cluster(PRESET)
    rows = {}
    for memory in memories:
        cluster = machine.with_memory_fraction(MEMORIES[memory])
        load_before = os.getloadavg()[0]
        began = time.perf_counter()
        placement = dp.place(graph, cluster, algo="sim-search", seed=seed)
        seconds = time.perf_counter() - began
        options = placement.options
        peak_bytes = dp.simulate(graph, cluster, placement).peak_memory_bytes
        rows[memory] = {"step_ms": options["step_us"] / 1e3, "found_by": options["found_by"],
                        "best_seed": options["best_seed"], "best_seed_ms": options["best_seed_step_us"] / 1e3,
                        "evals": options["evals"], "rounds": options["rounds"], "stopped_by": options["stopped_by"],
                        "gap": options["gap"], "seconds": round(seconds, 1),
                        "peak_share": round(float((peak_bytes / cluster.memory_bytes).max()), 3),
                        "virtual_cap_rounds": options.get("virtual_cap_rounds"),
                        "canonical_caps_gib": options.get("canonical_caps_gib"),
                        "capped_step_ms": [us / 1e3 for us in options.get("capped_step_us", [])],
                        "load": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
        print(name, memory, json.dumps(rows[memory]), flush=True)
    return rows


def run_bundled(name: str) -> dict:
    from devplace.io.dnn_partitioning import cluster_for

    graph = dp.load_graph(dp.example_path(f"{name}.json"))
    began = time.perf_counter()
    placement = dp.place(graph, cluster_for(graph), algo="sim-search", seed=0)
    row = {"step_ms": placement.options["step_us"] / 1e3, "evals": placement.options["evals"],
           "seconds": round(time.perf_counter() - began, 2), "load": round(os.getloadavg()[0], 2)}
    print(name, json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--models", default="gnmt", help="comma-separated zoo names")
    parser.add_argument("--memories", default="30%,ample", help=f"comma-separated, of {', '.join(MEMORIES)}".replace("%", "%%"))
    parser.add_argument("--bundled", action="store_true", help="the four bundled graphs instead of --models")
    parser.add_argument("--out", default="layer_descent.json", help="file name under benchmarks/results")
    parser.add_argument("--seed", type=int, default=0, help="sim-search's seed for the zoo models")
    args = parser.parse_args(argv)
    path = RESULTS / args.out
    memories = [m.strip() for m in args.memories.split(",") if m.strip()]
    if not set(memories) <= set(MEMORIES):
        parser.error(f"--memories {args.memories!r}: each must be one of {', '.join(MEMORIES)}")
    names = BUNDLED if args.bundled else [n.strip() for n in args.models.split(",") if n.strip()]
    for name in names:
        row = (run_bundled(name) if args.bundled else run(name, memories, args.seed)) | {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        runs = json.loads(path.read_text()) if path.exists() else {}
        runs.setdefault(args.label, {}).setdefault(name, {}).update(row)
        write_text_atomic(path, json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
