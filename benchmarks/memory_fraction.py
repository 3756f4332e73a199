"""At what memory do Baechi's placers first return a placement? (BENCHMARKS.md, "Memory over the schedule")

For each zoo model of Baechi's table (``reproduce_papers.py``: roofline costs for ``baechi-4x2080``,
4 GPUs), every device gets the same memory, a fraction of the model's one-device peak (all ops on
one GPU, simulated). For each placer the smallest fraction at which it returns a placement is
bisected, once with memory followed over the schedule the placer builds (this branch's default)
and once with the never-freeing model alone (main's accounting: ``_memory.SCHEDULE_ATTEMPTS = 0``).
Every placement counted was checked by ``devplace.place``: it fits in simulation.

    .venv/bin/python benchmarks/memory_fraction.py                   # everything (resumes)
    .venv/bin/python benchmarks/memory_fraction.py --models zoo:gnmt zoo:gnmt:batch=256 --algos m-etf --force

Results go to ``benchmarks/results/memory_fraction.json``, one entry per finished model.
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
from reproduce_papers import PRESET, RESULTS, _baechi_cases, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.errors import OutOfMemoryError  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.placers import _memory  # noqa: E402

OUT = RESULTS / "memory_fraction.json"
ALGOS = ["m-topo", "m-etf", "m-sct", "m-topo+opt", "m-etf+opt", "m-sct+opt"]
LOW, HIGH = 0.25, 4.0   # fractions of the one-device peak bisected between (4 devices: below 1/4 is hopeless)
STEPS = 7               # bisection steps: (HIGH - LOW) / 2**7 = 0.03
ACCOUNTINGS = {"schedule": _memory.SCHEDULE_ATTEMPTS, "never-free": 0}
BAECHI_30_GIB = 0.3 * 8   # Baechi's tight rows: 30% of an RTX 2080's 8 GiB


def models() -> list[str]:
    return list(dict.fromkeys(case["target"] for case in _baechi_cases()))


def attempt(graph, cluster, algo: str, fraction: float, peak_bytes: float) -> dict | None:
    """Place with every device at ``fraction`` of the one-device peak; None when the placer refuses."""
    scaled = cluster.with_memory_fraction(fraction * peak_bytes / float(cluster.memory_bytes[0]))
    try:
        placement = dp.place(graph, scaled, algo=algo)   # checked: it fits in simulation
    except OutOfMemoryError:
        return None
    result = dp.simulate(graph, scaled, placement)
    return {"fraction": round(fraction, 4), "step_us": round(result.step_time_us, 1),
            "memory_model": placement.options.get("memory_model"),
            "memory_attempts": placement.options.get("memory_attempts"),
            "devices_used": int(len(np.unique(placement.devices))),
            "peak_share": [round(float(x) / peak_bytes, 3) for x in result.peak_memory_bytes]}


def smallest_fraction(graph, cluster, algo: str, peak_bytes: float) -> dict:
    """Bisect the smallest fraction in [LOW, HIGH] at which ``algo`` places (assumes more memory never hurts)."""
    best = attempt(graph, cluster, algo, HIGH, peak_bytes)
    if best is None:
        return {"fraction": None, "note": f"no placement at {HIGH}x the one-device peak"}
    lo, hi = LOW, HIGH
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        found = attempt(graph, cluster, algo, mid, peak_bytes)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    return best


def run_model(target: str, algos: list[str]) -> dict:
    graph = cached_graph(target)
    cluster = dp.load_cluster(PRESET)
    ample = cluster.with_memory_fraction(1e3)
    one = dp.simulate(graph, ample, np.zeros(graph.n_ops, dtype=np.int64))
    peak = float(one.peak_memory_bytes[0])
    entry = {"target": target, "ops": graph.n_ops, "one_device_peak_gib": round(peak / 2**30, 3),
             "single_step_us": round(one.step_time_us, 1), "rows": {}}
    for algo in algos:
        row = {}
        for accounting, attempts in ACCOUNTINGS.items():
            _memory.SCHEDULE_ATTEMPTS = attempts
            began = time.perf_counter()
            row[accounting] = smallest_fraction(graph, cluster, algo, peak)
            row[accounting]["bisect_s"] = round(time.perf_counter() - began, 1)
            print(f"  {target} {algo:11s} {accounting:10s} {row[accounting].get('fraction')}", flush=True)
        _memory.SCHEDULE_ATTEMPTS = ACCOUNTINGS["schedule"]
        entry["rows"][algo] = row
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", help="zoo targets (default: Baechi's table)")
    parser.add_argument("--algos", default=",".join(ALGOS))
    parser.add_argument("--force", action="store_true", help="recompute models already in the results")
    parser.add_argument("--table", action="store_true", help="only print the table of the results")
    args = parser.parse_args(argv)
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    algos = args.algos.split(",")
    for target in [] if args.table else args.models or models():
        done = results.get(target, {}).get("rows", {})
        missing = [a for a in algos if args.force or a not in done]
        if not missing:
            continue
        print(f"[{target}] load {os.getloadavg()[0]:.1f}", flush=True)
        began = time.perf_counter()
        entry = run_model(target, missing)
        entry["rows"] = {**done, **entry["rows"]}
        entry["seconds"] = round(time.perf_counter() - began, 1)
        entry["load_average"] = round(os.getloadavg()[0], 1)
        results[target] = entry
        write_text_atomic(OUT, json.dumps(results, indent=1) + "\n")
    print(table(results))
    return 0


def table(results: dict) -> str:
    """Markdown: per model and placer, the smallest fraction placed, never-freeing -> over the schedule;
    and which placers place at Baechi's 30% memory (0.3 x 8 GiB per GPU), before -> after."""
    algos = list(dict.fromkeys(a for entry in results.values() for a in entry["rows"]))
    lines = ["| model (ops, one-device peak; 2.4 GiB as a fraction of it) | " + " | ".join(algos)
             + " | placing at 2.4 GiB |", "|---" * (len(algos) + 2) + "|"]
    for entry in results.values():
        baechi_30 = BAECHI_30_GIB / entry["one_device_peak_gib"]
        cells, placing = [], {"never-free": 0, "schedule": 0}
        for algo in algos:
            row = entry["rows"].get(algo)
            if row is None:
                cells.append("-")
                continue
            before, after = (row[k].get("fraction") for k in ("never-free", "schedule"))
            show = [f"{x:.2f}" if x is not None else f">{HIGH:g}" for x in (before, after)]
            cells.append(f"{show[0]} -> **{show[1]}**")
            for key in placing:
                placing[key] += row[key].get("fraction") is not None and row[key]["fraction"] <= baechi_30
        lines.append(f"| {entry['target']} ({entry['ops']:,}, {entry['one_device_peak_gib']} GiB; {baechi_30:.2f}) | "
                     + " | ".join(cells) + f" | {placing['never-free']} -> **{placing['schedule']}** of {len(algos)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
