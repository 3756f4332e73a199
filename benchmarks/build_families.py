"""Capture every graph family into the cache and record what they hold (for Placeto and Mars).

For each family of ``devplace.zoo.families``: its members (train / held-out), op counts
(min / median / max), capture seconds (the capture's own clock, summed), the wall time of this run
(near zero when the cache already holds the graphs) and each member's simulated one-device peak
memory on the family's cluster (what the memory fractions of ``default_cluster`` are set from).

    .venv/bin/python benchmarks/build_families.py                    # all families, default cache
    .venv/bin/python benchmarks/build_families.py --families transformer --cache-dir /tmp/fam

Writes ``benchmarks/results/families.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import devplace as dp
from devplace.fileio import write_text_atomic
from devplace.zoo import families

RESULTS = Path(__file__).parent / "results" / "families.json"


def measure(family: str, seed: int, cache_dir) -> dict:
    train, held_out = families.split(family, seed)
    cluster = families.default_cluster(family)
    ample = cluster.with_memory_fraction(1e3)
    rows, began = [], time.perf_counter()
    for k, member in enumerate(train + held_out, 1):
        start = time.perf_counter()
        graph = families.load(member, cache_dir)
        wall_s = time.perf_counter() - start
        peak = dp.simulate(graph, ample, np.zeros(graph.n_ops, dtype=np.int64)).peak_memory_bytes[0]
        rows.append({"key": member.key, "target": member.target, "held_out": member in held_out,
                     "ops": graph.n_ops, "edges": graph.n_edges,
                     "capture_seconds": graph.meta["capture_seconds"]["total"], "wall_seconds": round(wall_s, 2),
                     "peak_gib_one_device": round(float(peak) / 2**30, 3)})
        print(f"{family} [{k}/{len(train) + len(held_out)}] {member.key}: {graph.n_ops:,} ops, "
              f"capture {rows[-1]['capture_seconds']:.1f} s, peak {rows[-1]['peak_gib_one_device']:.2f} GiB",
              flush=True)
    ops = [r["ops"] for r in rows]
    peaks = [r["peak_gib_one_device"] for r in rows]
    device_gib = cluster.devices[0].memory_bytes / 2**30
    return {
        "members": len(rows), "train": len(train), "held_out": len(held_out),
        "ops": {"min": min(ops), "median": statistics.median(ops), "max": max(ops)},
        "capture_seconds_total": round(sum(r["capture_seconds"] for r in rows), 1),
        "wall_seconds_this_run": round(time.perf_counter() - began, 1),
        "cluster": cluster.name, "device_memory_gib": round(device_gib, 3),
        "peak_gib_one_device": {"min": min(peaks), "median": statistics.median(peaks), "max": max(peaks)},
        "members_not_fitting_one_device": sum(p > device_gib for p in peaks),
        "members_not_fitting_all_devices": sum(p > device_gib * cluster.n_devices for p in peaks),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(families.family_names()), help="comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="default: the families cache ($DEVPLACE_CACHE/families)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"families": {}}
    for family in args.families.split(","):
        results["families"][family] = measure(family, args.seed, args.cache_dir)
        results["families"][family]["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    results.update(seed=args.seed, cache_version=families.CACHE_VERSION, machine=platform.processor() or platform.machine(),
                   threads=1)
    write_text_atomic(RESULTS, json.dumps(results, indent=1) + "\n")
    for family, e in results["families"].items():
        print(f"{family}: {e['members']} members ({e['train']}/{e['held_out']}), ops {e['ops']['min']:,}/"
              f"{e['ops']['median']:,.0f}/{e['ops']['max']:,}, capture {e['capture_seconds_total']:.0f} s, "
              f"peak one device {e['peak_gib_one_device']}, not fitting one device: "
              f"{e['members_not_fitting_one_device']}, all: {e['members_not_fitting_all_devices']}")


if __name__ == "__main__":
    main()
