"""Simulator speed and graph loading: how long one simulated step takes as graphs grow.

Learning placers call the simulator tens of thousands of times, so both the per-op cost (large
graphs) and the fixed cost per call (small graphs) matter. For each size this times, after warm-up:

- ``run``: ``Simulator.run`` (schedule + memory accounting -> SimResult), median of repeats;
- ``step``: ``Simulator.step_time_us`` (schedule only), median of repeats;
- memory: tracemalloc peak of one ``run`` and the process's peak RSS;
- native JSON load of the graph (save once, then ``load_graph``), median of repeats.

Graphs are random layered DAGs (about sqrt(n) layers, 2 inputs per op from the previous 3 layers),
placed uniformly at random on 4 devices of a parallel-link cluster.

``--baseline REV`` also times ``step_time_us`` with the engine of git revision REV (loaded from a
temporary copy of its ``devplace/sim/engine.py``) beside the current one, in the same process,
calls alternating, under every communication model, and checks both give the same finish times:
a change to the engine is judged against its predecessor under the same load.

    .venv/bin/python benchmarks/sim_speed.py            # writes benchmarks/results/sim_speed.json
    .venv/bin/python benchmarks/sim_speed.py --quick    # smaller repeat counts
    .venv/bin/python benchmarks/sim_speed.py --sizes 20000 --baseline main --out FILE
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from devplace.cluster import COMM_MODELS, uniform_cluster
from devplace.fileio import write_text_atomic
from devplace.graph import OpGraph
from devplace.io import load_graph, save_graph
from devplace.sim import Simulator
from devplace.sim import simulator as simulator_module

SIZES = (200, 1_000, 10_000, 20_000, 100_000)
N_DEVICES = 4
RESULTS = Path(__file__).parent / "results" / "sim_speed.json"


def random_layered_dag(n_ops: int, seed: int = 0, fan_in: int = 2) -> OpGraph:
    """Ops in ~sqrt(n) layers; each op reads ``fan_in`` ops from the three layers before it."""
    rng = np.random.default_rng(seed)
    n_layers = max(2, int(np.sqrt(n_ops)))
    layer = np.sort(rng.integers(0, n_layers, n_ops))
    layer_start = np.searchsorted(layer, np.arange(n_layers + 1))
    src, dst = [], []
    for v in range(n_ops):
        lo = layer_start[max(0, layer[v] - 3)]
        hi = layer_start[layer[v]]
        if hi > lo:
            for u in np.unique(rng.integers(lo, hi, fan_in)):
                src.append(int(u))
                dst.append(v)
    m = len(src)
    return OpGraph(
        names=[f"op{i}" for i in range(n_ops)],
        kinds=["random"] * n_ops,
        device_kinds=["gpu"],
        compute_us=rng.uniform(1.0, 100.0, (n_ops, 1)),
        persistent_bytes=rng.uniform(0, 1e6, n_ops).round(),
        output_bytes=rng.uniform(0, 1e6, n_ops).round(),
        temp_bytes=rng.uniform(0, 1e5, n_ops).round(),
        colocation=np.full(n_ops, -1),
        colocation_names=[],
        role=np.zeros(n_ops, dtype=np.int8),
        mirror=np.full(n_ops, -1),
        edge_src=np.asarray(src, dtype=np.int64),
        edge_dst=np.asarray(dst, dtype=np.int64),
        edge_bytes=rng.uniform(0, 1e6, m).round(),
        edge_fixed_us=np.full(m, np.nan),
        meta={"source": f"random layered DAG, seed {seed}"},
    )


def median_seconds(fn, repeats: int) -> tuple[float, float]:
    """Median wall-clock and median CPU seconds of ``fn()``.

    CPU time is what the call costs; wall time also counts waiting while other processes run,
    which on a shared 2-core machine can be twice as much."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(wall), statistics.median(cpu)


def repeats_for(n_ops: int, quick: bool) -> int:
    budget = 20_000 if quick else 200_000  # ~ops simulated per measurement, floor 5 repeats
    return max(5, min(2_000, budget * 10 // n_ops))


def measure(n_ops: int, quick: bool) -> dict:
    graph = random_layered_dag(n_ops)
    cluster = uniform_cluster(N_DEVICES, latency_us=10.0, bandwidth_bytes_per_us=1e4)
    devices = np.random.default_rng(1).integers(0, N_DEVICES, n_ops).astype(np.int64)
    sim = Simulator(graph, cluster)
    sim.run(devices)  # warm-up: compile or load numba's cache
    sim.step_time_us(devices)
    repeats = repeats_for(n_ops, quick)
    run_s, run_cpu_s = median_seconds(lambda: sim.run(devices), repeats)
    step_s, step_cpu_s = median_seconds(lambda: sim.step_time_us(devices), repeats)

    tracemalloc.start()
    sim.run(devices)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.json"
        save_graph(graph, path)
        file_bytes = path.stat().st_size
        load_s, load_cpu_s = median_seconds(lambda: load_graph(path), 3 if n_ops >= 20_000 else 5)

    return {
        "ops": n_ops,
        "edges": graph.n_edges,
        "devices": N_DEVICES,
        "repeats": repeats,
        "run_ms": run_s * 1e3,
        "run_cpu_ms": run_cpu_s * 1e3,
        "step_time_ms": step_s * 1e3,
        "step_time_cpu_ms": step_cpu_s * 1e3,
        "run_mops_per_s": n_ops / run_s / 1e6,
        "step_time_mops_per_s": n_ops / step_s / 1e6,
        "run_tracemalloc_peak_mib": traced_peak / 2**20,
        "process_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "native_json_bytes": file_bytes,
        "native_json_load_ms": load_s * 1e3,
        "native_json_load_cpu_ms": load_cpu_s * 1e3,
    }


def baseline_engine(rev: str, folder: Path):
    """The engine module of git revision ``rev``, loaded from a copy in ``folder``."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "show", f"{rev}:devplace/sim/engine.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    path = folder / "baseline_engine.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_engine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def engine_swapped(module):
    """``Simulator`` calls ``module``'s compiled functions instead of the current engine's."""
    current = simulator_module.engine
    simulator_module.engine = module
    try:
        yield
    finally:
        simulator_module.engine = current


def versus_baseline(rev: str, n_ops: int, quick: bool) -> list[dict]:
    """``step_time_us`` with the current engine and with REV's, per communication model."""
    graph = random_layered_dag(n_ops)
    devices = np.random.default_rng(1).integers(0, N_DEVICES, n_ops).astype(np.int64)
    repeats = repeats_for(n_ops, quick)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline = baseline_engine(rev, Path(tmp))
        for model in COMM_MODELS:
            sim = Simulator(graph, uniform_cluster(N_DEVICES, latency_us=10.0, bandwidth_bytes_per_us=1e4,
                                                   comm_model=model))
            current_finish = sim.run(devices).finish_us
            with engine_swapped(baseline):
                if not np.array_equal(sim.run(devices).finish_us, current_finish):
                    raise SystemExit(f"the engine of {rev} gives other finish times under {model}")
            times = {"current": ([], []), "baseline": ([], [])}
            for _ in range(repeats):  # alternate, so both see the same load
                for which in times:
                    with engine_swapped(baseline) if which == "baseline" else contextlib.nullcontext():
                        wall, cpu = median_seconds(lambda: sim.step_time_us(devices), 1)
                    times[which][0].append(wall)
                    times[which][1].append(cpu)
            row = {"ops": n_ops, "edges": graph.n_edges, "devices": N_DEVICES, "comm_model": model,
                   "repeats": repeats}
            for which, (wall, cpu) in times.items():
                row[f"{which}_step_time_ms"] = statistics.median(wall) * 1e3
                row[f"{which}_step_time_cpu_ms"] = statistics.median(cpu) * 1e3
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--baseline", metavar="REV", help="also time step_time_us with the engine of git revision REV")
    args = parser.parse_args(argv)

    rows = [measure(n, args.quick) for n in sorted(args.sizes)]
    baseline_rows = [row for n in sorted(args.sizes) for row in versus_baseline(args.baseline, n, args.quick)] \
        if args.baseline else []
    print(f"{'ops':>7} {'edges':>7} | {'run ms':>8} {'(cpu)':>8} | {'step ms':>8} {'(cpu)':>8} | "
          f"{'run Mops/s':>10} | {'traced MiB':>10} {'RSS MiB':>7} | {'load ms':>8} {'(cpu)':>8}")
    for r in rows:
        print(
            f"{r['ops']:>7} {r['edges']:>7} | {r['run_ms']:>8.3f} {r['run_cpu_ms']:>8.3f} | "
            f"{r['step_time_ms']:>8.3f} {r['step_time_cpu_ms']:>8.3f} | {r['run_mops_per_s']:>10.2f} | "
            f"{r['run_tracemalloc_peak_mib']:>10.2f} {r['process_peak_rss_mib']:>7.0f} | "
            f"{r['native_json_load_ms']:>8.1f} {r['native_json_load_cpu_ms']:>8.1f}"
        )
    for r in baseline_rows:
        print(f"{r['ops']:>7} ops, {r['comm_model']:>10}: step {r['baseline_step_time_ms']:.3f} ms ({args.baseline}) "
              f"-> {r['current_step_time_ms']:.3f} ms (cpu {r['baseline_step_time_cpu_ms']:.3f} -> "
              f"{r['current_step_time_cpu_ms']:.3f})")
    report = {
        "benchmark": "sim_speed",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "processor_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "quick": args.quick,
        "load_average_1min": os.getloadavg()[0],  # other work on the machine inflates the times
        "rows": rows,
    }
    if args.baseline:
        report["baseline_rev"] = args.baseline
        report["baseline_commit"] = subprocess.run(["git", "rev-parse", args.baseline], cwd=Path(__file__).parent,
                                                   check=True, capture_output=True, text=True).stdout.strip()
        report["versus_baseline"] = baseline_rows
    write_text_atomic(args.out, json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
