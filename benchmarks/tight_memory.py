"""Where sim-search's step time goes at Baechi's 30% memory (BENCHMARKS.md, "Closing the gap at 30% memory").

Each zoo model (roofline costs for ``baechi-4x2080``, as ``reproduce_papers.py`` captures them) is
placed by sim-search with each RTX 2080 at 30% (2.4 GiB), one annealing round (``max_rounds=1``)
and seed 0, as the variant table of BENCHMARKS does; then its placement is broken down: per device
the busy time, the idle time and the peak memory, and along the critical path the compute, the hops
across devices (the tensor, its bytes, how long its consumer waited for it) and the time nothing
ran. The simulator never makes an op wait for memory (memory is checked on the peak), so a path op
waits for one of three things: an input from another device (split into the channel's queue before
the transfer and the transfer itself), or its own device, busy with an op off the path's data chain
(``device_order_ms``: the compute of the path ops whose successor on the path was ready and queued
behind them on their device; these device-order links are what make the path's compute exceed the
critical path of the bound, where every op runs as soon as its inputs are there). With ``--ample`` sim-search also places the
model with each GPU's full memory (same round, same seed), so the cost of the 30% limit shows.

    .venv/bin/python benchmarks/tight_memory.py --label after [--models resnet50 ...] [--option repair_near=1] [--ample]

Rows go to ``benchmarks/results/tight_memory.json`` under ``--label`` (a run with the same label
replaces its rows). Running it with ``PYTHONPATH`` at another checkout measures that code.
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
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.sim import Simulator  # noqa: E402

OUT = RESULTS / "tight_memory.json"
MODELS = ("resnet50", "inception_v3", "gnmt", "rnnlm", "transformer", "nasnet")
MEMORY_FRACTION = 0.3
GIB, MIB = 2**30, 2**20


def breakdown(graph, cluster, placement) -> dict:
    """The step of ``placement``: per device and along the critical path (module docstring)."""
    result = Simulator(graph, cluster).run(placement)
    path = result.critical_path
    hops = [{"tensor": graph.names[a], "from": int(result.devices[a]), "to": int(result.devices[b]),
             "mib": round(float(graph.output_bytes[a]) / MIB, 1),
             "wait_ms": round(float(result.start_us[b] - result.finish_us[a]) / 1e3, 1)}
            for a, b in zip(path[:-1], path[1:]) if result.devices[a] != result.devices[b]]
    compute_us = float(sum(result.op_time_us[v] + cluster.op_gap_us for v in path))
    channel_us = transfer_us = device_us = 0.0
    device_links = 0
    on = result.devices
    for a, b in zip(path[:-1], path[1:]):
        if result.start_us[b] > result.ready_us[b] and result.previous_on_device[b] == a:
            device_us += float(result.op_time_us[a] + cluster.op_gap_us)   # b was ready while its device ran a
            device_links += 1
        elif on[a] != on[b]:
            x = np.flatnonzero((result.transfer_op == a) & (result.transfer_dst == on[b]))
            if len(x):
                channel_us += float(result.transfer_start_us[x[0]] - result.finish_us[a])
                transfer_us += float(result.transfer_end_us[x[0]] - result.transfer_start_us[x[0]])
    path_devices = np.bincount(on[path], minlength=cluster.n_devices)
    return {
        "step_ms": result.step_time_us / 1e3,
        "busy_ms": np.round(result.busy_us / 1e3, 1).tolist(),
        "idle_ms": np.round((result.step_time_us - result.busy_us) / 1e3, 1).tolist(),
        "peak_gib": np.round(result.peak_memory_bytes / GIB, 3).tolist(),
        "memory_gib": round(float(cluster.memory_bytes[0]) / GIB, 3),
        "transfers": len(result.transfer_bytes), "transfer_gib": round(result.bytes_moved / GIB, 3),
        "path_ops": len(path), "path_compute_ms": round(compute_us / 1e3, 1),
        "path_wait_ms": round(sum(h["wait_ms"] for h in hops), 1), "path_hops": hops,
        "path_ops_per_device": path_devices.tolist(),
        "path_channel_queue_ms": round(channel_us / 1e3, 1), "path_transfer_ms": round(transfer_us / 1e3, 1),
        "path_device_links": device_links, "path_device_order_ms": round(device_us / 1e3, 1),
    }


def run(name: str, options: dict, ample: bool) -> dict:
    graph = cached_graph(f"zoo:{name}")
    machine = dp.load_cluster(PRESET)
    cluster = machine.with_memory_fraction(MEMORY_FRACTION)
    began = time.perf_counter()
    placement = dp.place(graph, cluster, algo="sim-search", seed=0, max_rounds=1, **options)
    row = {"model": name, "ops": graph.n_ops, "placement_s": round(time.perf_counter() - began, 1),
           "load_1min": round(os.getloadavg()[0], 2), "found_by": placement.options["found_by"],
           "best_seed": placement.options["best_seed"],
           "best_seed_ms": round(placement.options["best_seed_step_us"] / 1e3, 3),
           "one_device_ample_ms": Simulator(graph, machine).step_time_us(np.zeros(graph.n_ops, np.int64)) / 1e3}
    row |= breakdown(graph, cluster, placement)
    if ample:    # what the 30% limit costs: sim-search again with each GPU's whole memory
        roomy = dp.place(graph, machine, algo="sim-search", seed=0, max_rounds=1, **options)
        row["ample"] = {"found_by": roomy.options["found_by"], "best_seed": roomy.options["best_seed"]}
        row["ample"] |= {k: v for k, v in breakdown(graph, machine, roomy).items() if k != "path_hops"}
    print(json.dumps({k: row[k] for k in ("model", "step_ms", "placement_s", "load_1min", "best_seed")}), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="name of this run's rows in the JSON (e.g. main, after)")
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a sim-search option (a number), e.g. repair_near=1")
    parser.add_argument("--ample", action="store_true", help="also place each model with the GPUs' whole memory")
    args = parser.parse_args()
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--option {item!r}: write KEY=VALUE, e.g. repair_near=1")
        options[key] = float(value)
    rows = [run(name, options, args.ample) for name in args.models]
    runs = json.loads(OUT.read_text()) if OUT.exists() else {}
    runs[args.label] = {"options": options, "memory_fraction": MEMORY_FRACTION, "max_rounds": 1, "seed": 0, "ample": args.ample,
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    write_text_atomic(OUT, json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
