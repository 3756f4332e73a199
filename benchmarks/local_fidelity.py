"""The local backend's simulated figure: which simulation describes the step it measures.

``devplace run`` with the default ``local`` backend runs every placement device in one process; on
CPUs that is one thread running every op in turn, and a value "moved" between CPU devices is not
copied. For the execution fidelity models and placers (benchmarks/execution_fidelity.py), on the
committed 2-CPU calibration, one run measures the local step and simulates three candidates beside
it: the placement on the calibrated cluster (what ``run`` printed before: one process per device,
messages charged), the placement on that cluster without per-message overheads (devices overlap,
no messages), and every op on one device (what ``run`` prints now for CPUs, ``local.as_executed``).

    .venv/bin/python benchmarks/local_fidelity.py     # about a minute here, more when it waits for load

Like execution_fidelity.py it waits (up to a minute per model) for the 1-minute load average to fall
below 1.5 and records it: a local step is wall time, and on a busy machine it is preempted.

Writes benchmarks/results/local_fidelity.json.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np

from execution_fidelity import ALGOS, MODELS, wait_for_quiet

RESULTS = Path(__file__).parent / "results"
CANDIDATES = ("calibrated", "no_overheads", "as_executed")


def main() -> int:
    from devplace.cluster import load_cluster
    from devplace.execute import prepare, run
    from devplace.fileio import write_text_atomic
    from devplace.portfolio import place
    from devplace.sim import simulate

    cluster = load_cluster(RESULTS / "calibrated-2cpu.toml")
    quiet = dataclasses.replace(cluster, send_overhead_us=np.zeros_like(cluster.send_overhead_us),
                                recv_overhead_us=np.zeros_like(cluster.recv_overhead_us))
    rows = []
    for model, target in MODELS.items():
        prepared = prepare(target, cost="executed")
        load, waited_s = wait_for_quiet(1.5, 60.0)
        graph, on = prepared.graph, prepared.simulation_cluster
        for algo in ALGOS:
            placement = place(graph, cluster, algo=algo, seed=0)
            result = run(None, placement, cluster=cluster, prepared=prepared, steps=7, warmup=2)
            simulated = {"calibrated": simulate(graph, on(cluster), placement).step_time_us,
                         "no_overheads": simulate(graph, on(quiet), placement).step_time_us,
                         "as_executed": result.simulated_step_time_us}
            rows.append({"model": model, "algo": algo, "measured_us": result.measured_step_time_us,
                         "load_1min": round(load, 2), "waited_s": round(waited_s), **{f"{k}_us": v for k, v in simulated.items()}})
            print(f"{model:12s} {algo:12s} measured {result.measured_step_time_us:9.0f} us  "
                  + "  ".join(f"{k} {v:9.0f}" for k, v in simulated.items()), flush=True)
    summary = summarise(rows)
    print(json.dumps(summary, indent=1))
    write_text_atomic(RESULTS / "local_fidelity.json", json.dumps({**summary, "rows": rows}, indent=1))
    return 0


def summarise(rows: list[dict]) -> dict:
    """Median absolute relative error of each candidate, and per model the spread (slowest /
    fastest placement) of the measured steps and of each candidate: on a loaded machine the
    absolute error mostly says how much the steps were preempted, the spread says which
    simulation moves with the placement as the measured step does."""
    error = {k: statistics.median(abs(r[f"{k}_us"] - r["measured_us"]) / r["measured_us"] for r in rows)
             for k in CANDIDATES}
    spread = {}
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        spread[model] = {k: round(max(r[f"{k}_us"] for r in mine) / min(r[f"{k}_us"] for r in mine), 2)
                         for k in ("measured", *CANDIDATES)}
    return {"median_abs_error": error, "spread_slowest_over_fastest": spread}


if __name__ == "__main__":
    raise SystemExit(main())
