"""Which side holds the gap at Baechi's 30% memory: sim-search's step against the certified bound (issue 15, point 3).

For a zoo model (roofline costs for ``baechi-4x2080``, each GPU at 30%), sim-search places it at its
default budget (as ``exact_and_bounds.py --zoo`` does) and the simulated critical path of that
placement (``SimResult.critical_path``: each op's last-arriving input, or the op that held its
device) is split, link by link, into: compute of ops on the bound's path P (the longest path at
fastest times, the one ``memory_path_us`` starts from), compute of ops off P, and for each hop
across devices the channel queue before the transfer, the transfer, and what is left (message
overheads). Beside it: per device busy time, persistent and peak bytes, the *saved activations*
(outputs made before the loss and read after it, which the forward/backward turn holds), and what
the bound charges (P's time, the memory path's charge on it). The same for sim-search with each
GPU's full memory. At 30%, a hand probe: the largest *off-P runs* of the critical path (consecutive
off-P ops, with their colocation groups) each moved whole to every GPU, the step's change read
off (sim-search's priority kept), and those moves plus single-op moves applied greedily while the
step falls and the placement fits.

    .venv/bin/python benchmarks/gap_sides.py [--models inception_v3 resnet50]

Writes ``benchmarks/results/gap_sides.json``. Times are wall clock on a shared machine.
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
from devplace import bounds  # noqa: E402
from devplace.bounds.relaxation import longest_path  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.sim import Simulator  # noqa: E402

OUT = RESULTS / "gap_sides.json"
MEMORY_FRACTION = 0.3
GIB = 2**30


def bound_path(graph, rel) -> np.ndarray:
    """P: the longest path at fastest times (``memory_path_us``'s first path)."""
    return longest_path(graph, rel.fastest_us, np.zeros(graph.n_edges))[0]


def decompose(graph, cluster, placement, path_ops: np.ndarray) -> dict:
    """The simulated critical path of ``placement`` split into compute on / off P and the waits between."""
    result = Simulator(graph, cluster).run(placement)
    path = result.critical_path
    on = result.devices
    on_bound = np.zeros(graph.n_ops, bool)
    on_bound[path_ops] = True
    compute = result.op_time_us[path] + cluster.op_gap_us
    queue_us = transfer_us = other_wait_us = device_order_us = 0.0
    hops = 0
    for a, b in zip(path[:-1], path[1:]):
        gap = float(result.start_us[b] - result.finish_us[a])
        if result.start_us[b] > result.ready_us[b] and result.previous_on_device[b] == a:
            device_order_us += float(result.op_time_us[a] + cluster.op_gap_us)
            other_wait_us += gap
        elif on[a] != on[b]:
            hops += 1
            x = np.flatnonzero((result.transfer_op == a) & (result.transfer_dst == on[b]))
            q = float(result.transfer_start_us[x[0]] - result.finish_us[a])
            t = float(result.transfer_end_us[x[0]] - result.transfer_start_us[x[0]])
            queue_us, transfer_us, other_wait_us = queue_us + q, transfer_us + t, other_wait_us + gap - q - t
        else:
            other_wait_us += gap
    mask = on_bound[path]
    persistent = np.bincount(on, weights=graph.persistent_bytes, minlength=cluster.n_devices)
    return {
        "step_ms": round(result.step_time_us / 1e3, 3),
        "path_ops": len(path), "path_ops_on_P": int(mask.sum()),
        "compute_on_P_ms": round(float(compute[mask].sum()) / 1e3, 3),
        "compute_off_P_ms": round(float(compute[~mask].sum()) / 1e3, 3),
        "channel_queue_ms": round(queue_us / 1e3, 3), "transfer_ms": round(transfer_us / 1e3, 3),
        "other_wait_ms": round(other_wait_us / 1e3, 3), "first_start_ms": round(float(result.start_us[path[0]]) / 1e3, 3),
        "hops": hops, "device_order_links_ms": round(device_order_us / 1e3, 3),
        "P_devices": np.bincount(on[on_bound], minlength=cluster.n_devices).tolist(),
        "P_cuts": int((on[path_ops][:-1] != on[path_ops][1:]).sum()),
        "busy_ms": np.round(result.busy_us / 1e3, 1).tolist(),
        "persistent_gib": np.round(persistent / GIB, 3).tolist(),
        "peak_gib": np.round(result.peak_memory_bytes / GIB, 3).tolist(),
        "transfer_gib": round(result.bytes_moved / GIB, 3), "transfers": len(result.transfer_bytes),
    }


def off_path_runs(result, on_bound: np.ndarray) -> list[list[int]]:
    """Maximal stretches of the simulated critical path whose ops are off P, largest compute first."""
    runs, current = [], []
    for v in result.critical_path:
        if on_bound[v]:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(v)
    return sorted(runs + ([current] if current else []), key=lambda run: -float(result.op_time_us[run].sum()))


def with_groups(graph, ops) -> np.ndarray:
    """``ops`` and every op that shares a colocation group with one of them (they move together)."""
    groups = np.unique(graph.colocation[ops])
    return np.union1d(ops, np.flatnonzero(np.isin(graph.colocation, groups[groups >= 0])))


def hand_moves(graph, cluster, placement, on_bound: np.ndarray, n_runs: int = 8) -> dict:
    """The step's change when each of the largest off-P runs moves whole to each GPU, then greedy moves."""
    sim = Simulator(graph, cluster)
    devices, priority = placement.devices.copy(), placement.priority
    base_us = sim.step_time_us(devices, priority)
    result = sim.run(placement)
    rows = []
    for run in off_path_runs(result, on_bound)[:n_runs]:
        unit = with_groups(graph, run)
        row = {"first": graph.names[run[0]], "last": graph.names[run[-1]], "ops": len(unit), "device": int(devices[run[0]]),
               "compute_ms": round(float(result.op_time_us[run].sum() + cluster.op_gap_us * len(run)) / 1e3, 2)}
        for d in range(cluster.n_devices):
            trial = devices.copy()
            trial[unit] = d
            row[f"to_{d}_ms"] = round((sim.step_time_us(trial, priority) - base_us) / 1e3, 2)
        rows.append(row)
    best_us, moves = base_us, 0
    for _ in range(3):
        runs = off_path_runs(sim.run(dp.Placement(devices, priority=priority)), on_bound)
        improved = False
        for unit in [with_groups(graph, run) for run in runs] + [with_groups(graph, [v]) for run in runs for v in run]:
            for d in range(cluster.n_devices):
                if (devices[unit] == d).all():
                    continue
                trial = devices.copy()
                trial[unit] = d
                step_us = sim.step_time_us(trial, priority)
                if step_us < best_us - 1e-6 and sim.run(dp.Placement(trial, priority=priority)).fits:
                    best_us, devices, improved, moves = step_us, trial, True, moves + 1
        if not improved:
            break
    return {"largest_runs_moved": rows, "greedy_ms": round(best_us / 1e3, 3), "greedy_moves": moves}


def saved_activation_gib(graph, on_bound: np.ndarray) -> float:
    """Bytes of the outputs made before P's loss op (``nll_loss``) and read after it."""
    loss = next(v for v in np.flatnonzero(on_bound) if "nll_loss_forward" in graph.names[v])
    after = np.zeros(graph.n_ops, bool)
    after[loss] = True
    for v in graph.topo_order:
        preds = graph.edge_src[graph.pred_edge[graph.pred_ptr[v]:graph.pred_ptr[v + 1]]]
        after[v] |= bool(after[preds].any())
    saved = np.unique(graph.edge_src[~after[graph.edge_src] & after[graph.edge_dst]])
    return round(float(graph.output_bytes[saved[saved != loss]].sum()) / GIB, 3)


def run(name: str) -> dict:
    graph = cached_graph(f"zoo:{name}")
    machine = dp.load_cluster(PRESET)
    cluster = machine.with_memory_fraction(MEMORY_FRACTION)
    rel = bounds.relaxation(graph, cluster)
    bound = bounds.lower_bounds(graph, cluster)
    path_ops = bound_path(graph, rel)
    on_bound = np.zeros(graph.n_ops, bool)
    on_bound[path_ops] = True
    row = {"model": name, "ops": graph.n_ops, "load_1min": round(os.getloadavg()[0], 2),
           "bound_ms": round(bound[bound["best"]] / 1e3, 3), "bound": bound["best"],
           "P_ops": len(path_ops), "P_fastest_ms": round(float(rel.fastest_us[path_ops].sum()) / 1e3, 3),
           "memory_path_on_P_ms": round(bounds.memory_path_us(graph, cluster, rel, n_paths=1) / 1e3, 3),
           "persistent_total_gib": round(float(graph.persistent_bytes.sum()) / GIB, 3),
           "saved_activation_gib": saved_activation_gib(graph, on_bound),
           "memory_gib": round(float(cluster.memory_bytes[0]) / GIB, 3)}
    for label, where in (("tight", cluster), ("ample", machine)):
        began = time.perf_counter()
        placement = dp.place(graph, where, algo="sim-search")
        row[label] = {"placement_s": round(time.perf_counter() - began, 1), "found_by": placement.options["found_by"],
                      "devices": placement.devices.tolist()} | decompose(graph, where, placement, path_ops)
        if label == "tight":
            row[label]["hand"] = hand_moves(graph, where, placement, on_bound)
        print(json.dumps({k: v for k, v in row[label].items() if k != "devices"}), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["inception_v3", "resnet50"])
    args = parser.parse_args()
    rows = {}
    for name in args.models:
        rows[name] = run(name)
        runs = json.loads(OUT.read_text()) if OUT.exists() else {}
        runs[name] = rows[name] | {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        write_text_atomic(OUT, json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
