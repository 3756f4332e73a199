"""Execution fidelity: measured vs simulated step time on this machine's 2 CPU devices.

For each model (sizes this 2-core machine runs in seconds) and each placer: capture the training
step with ``measured`` op costs (one thread, as a device runs), calibrate the 2 devices (one-thread
processes joined by gloo), place, simulate on the calibrated cluster, and run the placement for real
with the distributed backend (median of --steps steps after warm-up). Reports per-run relative
error, the median absolute relative error and Spearman's rank correlation of measured vs simulated.

    .venv/bin/python benchmarks/execution_fidelity.py            # ~5 minutes here
    .venv/bin/python benchmarks/execution_fidelity.py --quick    # 2 models, 3 placers, a smoke run

Writes benchmarks/results/execution_fidelity.json (and the calibrated cluster beside it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

MODELS = {
    "mlp": "zoo:mlp:batch=64,in_features=256,hidden_units=512,layers=4,classes=10",
    "small_cnn": "zoo:small_cnn:batch=8,image_size=32,channels=16,classes=10",
    "rnnlm": "zoo:rnnlm:preset=small,hidden_units=128,embedding_units=64,vocab=500,seq_len=6,batch=16",
    "gnmt": "zoo:gnmt:preset=small,layers=2,hidden_units=128,vocab=500,seq_len=4,batch=16",
    "transformer": "zoo:transformer:preset=small,hidden=128,ffn_units=256,seq_len=32,batch=4",
}
ALGOS = ("single", "round-robin", "random", "m-etf", "m-sct", "metis")
RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cluster", help="use this calibrated cluster TOML instead of calibrating now")
    parser.add_argument("--statistic", choices=("min", "median"), default="median",
                        help="measured step time: median of the steps (default, as `devplace run`) or the fastest")
    args = parser.parse_args()

    from scipy.stats import spearmanr

    from devplace.cluster import load_cluster
    from devplace.execute import prepare
    from devplace.execute.calibrate import calibrate, cluster_toml
    from devplace.execute.distributed import run_distributed_many
    from devplace.execute.schedule import check_against_graph, make_plan
    from devplace.fileio import write_text_atomic
    from devplace.placers import place
    from devplace.sim import simulate

    models = dict(list(MODELS.items())[:2]) if args.quick else MODELS
    algos = ALGOS[:3] if args.quick else ALGOS
    started = time.time()
    if args.cluster:
        cluster = load_cluster(args.cluster)
    else:
        cluster = calibrate(2)
        write_text_atomic(RESULTS / "calibrated-2cpu.toml", cluster_toml(cluster))
    print(f"cluster {cluster.name}: op gap {cluster.op_gap_us:.1f} us, link 0-1 "
          f"{cluster.latency_us[0, 1]:.0f} us + bytes / {cluster.bandwidth_bytes_per_us[0, 1]:.0f} B/us", flush=True)

    rows = []
    for model, target in models.items():
        prepared = prepare(target, repeats=5)
        graph = prepared.graph
        jobs, labels = [], []
        for algo in algos:
            try:
                placement = place(graph, cluster, algo=algo, seed=0)
                check_against_graph(prepared.program, graph, placement, cluster)
            except Exception as exc:  # noqa: BLE001 - a placer that cannot place this graph is reported
                print(f"  {model}/{algo}: skipped ({exc})", flush=True)
                continue
            sim = simulate(graph, cluster, placement)
            jobs.append((prepared.program, make_plan(prepared.program, graph, placement, 2), prepared.state))
            labels.append((algo, placement, sim))
        results = run_distributed_many(jobs, 2, steps=args.steps, warmup=args.warmup, timeout_s=300)
        for (algo, placement, sim), (_outputs, times), job in zip(labels, results, jobs):
            measured = min(times) if args.statistic == "min" else statistics.median(times)
            row = {
                "model": model, "target": target, "ops": graph.n_ops, "instructions": len(prepared.program),
                "algorithm": algo,
                "ops_on_device1": int((placement.devices == 1).sum()), "transfers": job[1].n_transfers,
                "measured_step_time_us": measured, "simulated_step_time_us": sim.step_time_us,
                "relative_error": (sim.step_time_us - measured) / measured,
                "measured_min_us": min(times), "measured_median_us": statistics.median(times),
                "measured_max_us": max(times),
                "simulated_compute_us": float(sim.op_time_us.sum()),
            }
            rows.append(row)
            print(f"  {model:11s} {algo:12s} measured {measured / 1e3:8.2f} ms  simulated "
                  f"{sim.step_time_us / 1e3:8.2f} ms  error {100 * row['relative_error']:+6.1f}%  "
                  f"transfers {row['transfers']}", flush=True)

    measured = np.array([r["measured_step_time_us"] for r in rows])
    simulated = np.array([r["simulated_step_time_us"] for r in rows])
    errors = np.abs(simulated - measured) / measured
    rho = float(spearmanr(measured, simulated).statistic) if len(rows) > 2 else float("nan")
    per_model = {}
    for model in models:
        idx = [i for i, r in enumerate(rows) if r["model"] == model]
        if len(idx) > 2:
            per_model[model] = {
                "median_abs_error": float(np.median(errors[idx])),
                "spearman": float(spearmanr(measured[idx], simulated[idx]).statistic),
            }
    summary = {
        "runs": len(rows),
        "median_abs_relative_error": float(np.median(errors)),
        "spearman": rho,
        "per_model": per_model,
        "cluster": cluster.to_dict(),
        "steps": args.steps, "warmup": args.warmup, "statistic": args.statistic,
        "seconds": round(time.time() - started, 1),
        "rows": rows,
    }
    write_text_atomic(RESULTS / "execution_fidelity.json", json.dumps(summary, indent=2, default=float))
    print(f"median |error| {100 * summary['median_abs_relative_error']:.1f}%, Spearman {rho:.3f} over {len(rows)} runs "
          f"({summary['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
