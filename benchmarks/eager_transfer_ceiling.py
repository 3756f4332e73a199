"""Round 43: what a bound built on lemma E (``devplace.bounds``: transfers booked eagerly) could reach on a
zoo row at 30% memory, measured before building it (ceilings, not bounds: each drops the lemma's exception,
a transfer kept waiting by earlier bookings).

P is the critical path ``turn_cut_us`` reads, x = o_q its turn probe (``forced_crossing_ceiling.CriticalPath``).

- *turn cut, eager*: ``turn_cut_us`` with the first cut's pairs able only when the outputs of the first run
  read by the last reader's run fit one device, whichever device that run is on (eager: the copies sit on the
  reader's device from the forward on), and also with every turn item charged its whole output bytes (made
  and read items, and their crossing, as if no item could cross for less than its size).
- *backward runs, eager*: split P from the probe into runs, each on one device. At the start of a run's op
  o_b, every output finished by then and read by an op of the run at b or later sits, whole, on the run's
  device (eager, no exception), so those bytes plus o_b's least footprint fit the memory. The least cut
  cost D over such splits, and P valued plain (its critical path with those cuts) and windowed (the comm
  path with them always cut); and the least over such splits of their largest single-cut value (the comm
  path with that one edge always cut), the form ``turn_cut_us``'s staircase could take.

    PYTHONPATH=$PWD python benchmarks/eager_transfer_ceiling.py --models resnet50 inception_v3 \
        --out benchmarks/results/eager_transfer_ceiling.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forced_crossing_ceiling import CriticalPath, run_items  # noqa: E402
from reproduce_papers import PRESET, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
import devplace.bounds.turn_cut as turn_cut  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402

GiB = 2**30


def eager_runs(reader_run_items, capacity: float):
    """``turn_cut._reader_run_items`` with lemma E taken as exact: the outputs of o_0..o_a read in (c, p*]
    sit on that run's device from the forward on, so a pair (a, c) whose outputs exceed the memory is never
    able (its crossing set to inf), whichever device the run is on."""
    def charged(graph, path_ops, q, rows, position, hold_us):
        last_reader, held, crossing = reader_run_items(graph, path_ops, q, rows, position, hold_us)
        if held is None:
            return last_reader, held, crossing
        return last_reader, held, np.where(held <= capacity, crossing, np.inf)
    return charged


def whole_items(items):
    """``turn_cut._turn_items`` with every edge from a producer holding a channel as long as its whole output."""
    def charged(graph, path_ops, q, us_per_byte, position, hold_us):
        whole = graph.output_bytes[graph.edge_src] * us_per_byte
        return items(graph, path_ops, q, us_per_byte, position, np.maximum(hold_us, whole))
    return charged


def turn_cut_variants(graph, cluster, rel) -> dict:
    """``turn_cut_us`` (ms, seconds) as built and under the eager ceilings; the module is restored after."""
    runs, items = turn_cut._reader_run_items, turn_cut._turn_items
    eager = eager_runs(runs, float(cluster.memory_bytes.max()))
    out = {}
    try:
        for label, new_runs, new_items in (("built", runs, items), ("eager pairs", eager, items),
                                           ("whole items", runs, whole_items(items)),
                                           ("eager pairs and whole items", eager, whole_items(items))):
            turn_cut._reader_run_items, turn_cut._turn_items = new_runs, new_items
            began = time.perf_counter()
            out[label] = {"ms": turn_cut.turn_cut_us(graph, cluster, rel) / 1e3,
                          "s": round(time.perf_counter() - began, 2)}
    finally:
        turn_cut._reader_run_items, turn_cut._turn_items = runs, items
    return out


def eager_backward_runs(path: CriticalPath) -> dict:
    """The least cut cost of P after the probe into runs whose read outputs (whole) fit at each op's start,
    and the least over such splits of their largest single-cut value (``bottleneck_ms``)."""
    graph, cluster, rel, ops, q = path.graph, path.cluster, path.rel, path.ops, path.q
    m = len(ops)
    held = run_items(path, q, lambda edges: graph.output_bytes[graph.edge_src[edges]])[0]
    room = float(cluster.memory_bytes.max()) - rel.footprint[ops].min(axis=1)
    run_start = np.full(m, m)       # the earliest start of a run that ends at c and fits
    for c in range(q, m):
        over = np.flatnonzero(held[q:c + 1, c] > room[q:c + 1])
        run_start[c] = q + (int(over.max()) + 1 if len(over) else 0)
    least = np.full(m + 1, np.inf)
    cut_from = np.full(m + 1, -1)
    least[q] = 0.0
    for c in range(q, m):
        lo = run_start[c]
        if lo <= c:
            i = lo + int(np.argmin(least[lo:c + 1]))
            least[c + 1] = least[i] + (path.cut[c] if c < m - 1 else 0.0)
            cut_from[c + 1] = i
    cuts, j = [], m
    while np.isfinite(least[m]) and j > q:
        j = int(cut_from[j])
        if j > q:
            cuts.append(j - 1)
    cuts = sorted(cuts)
    return {"least_cut_ms": float(least[m]) / 1e3, "cuts": cuts,
            "cut_names": [graph.names[ops[c]] for c in cuts],
            "cut_ms": [float(path.cut[c]) / 1e3 for c in cuts],
            "plain_ms": path.plain_us(cuts) / 1e3 if np.isfinite(least[m]) else None,
            "windowed_ms": path.windowed_us(cuts) / 1e3 if np.isfinite(least[m]) else None,
            "critical_path_ms": path.plain_us([]) / 1e3, "comm_path_ms": path.windowed_us([]) / 1e3,
            "items_at_probe_gib": float(held[q, m - 1]) / GiB,
            "bottleneck_ms": bottleneck_us(path, run_start) / 1e3}


def bottleneck_us(path: CriticalPath, run_start: np.ndarray) -> float:
    """The least, over splits of P after the probe into runs that fit (``run_start``), of the largest value
    of one of their cuts alone (the comm path with that edge always cut, as ``turn_cut_us`` values a cut):
    what a staircase over single cuts could reach with the eager charge."""
    q, m = path.q, len(path.ops)
    value = np.full(m - 1, np.inf)
    for a in range(q, m - 1):
        if np.isfinite(path.cut[a]):
            value[a] = path.windowed_us([a])

    def splits(threshold: float) -> bool:
        reach = np.zeros(m + 1, bool)      # reach[i]: some split of positions q..i-1 lets a run start at i
        reach[q] = True
        for c in range(q, m):
            lo = run_start[c]
            reach[c + 1] = lo <= c and reach[lo:c + 1].any() and (c == m - 1 or value[c] <= threshold)
        return bool(reach[m])

    for threshold in np.unique(np.concatenate([[-np.inf], value[np.isfinite(value)]])):
        if splits(threshold):
            return max(float(threshold), path.windowed_us([]))
    return np.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["resnet50", "inception_v3"])
    parser.add_argument("--memory-fraction", type=float, default=0.3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = {}
    for model in args.models:
        graph = cached_graph(f"zoo:{model}")
        cluster = dp.load_cluster(PRESET).with_memory_fraction(args.memory_fraction)
        began = time.perf_counter()
        path = CriticalPath(graph, cluster)
        rows[model] = {"turn_cut": turn_cut_variants(graph, cluster, path.rel),
                       "backward_runs": eager_backward_runs(path),
                       "probe": graph.names[path.ops[path.q]], "path_ops": len(path.ops), "probe_position": path.q,
                       "seconds": round(time.perf_counter() - began, 1)}
        print(model, json.dumps(rows[model]), flush=True)
    write_text_atomic(args.out, json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
