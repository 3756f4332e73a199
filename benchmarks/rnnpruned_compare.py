"""Round 49 (issue 15, point 3): why RNNLM at 30% memory lands slower on the write-after-read-pruned graph.

`--search GRAPH SEED OUT [--option KEY=JSON ...]`: sim-search on a graph file (main's capture or the
pruned one, both in `benchmarks/.cache/`), `baechi-4x2080` at 30% memory; writes the step, evals, how
the best was found, every capped search's step, its devices (by op name) and priority to OUT.
`--carry FROM GRAPH`: FROM's best carried by op name onto GRAPH: its step in its own order and the
search's orders, its per-GPU peak memory against 2.4 GiB and against the canonical caps of GRAPH.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import devplace as dp  # noqa: E402
from devplace.placement import Placement  # noqa: E402
from devplace.portfolio.sim_search.canonical import canonical_caps_bytes  # noqa: E402
from devplace.portfolio.sim_search.config import GIB, SearchConfig  # noqa: E402
from devplace.portfolio.sim_search.search import _Search, one_device_peak_bytes  # noqa: E402
from devplace.sim import Simulator  # noqa: E402
from duplex_track_by_hand import _when, _write  # noqa: E402
from reproduce_papers import PRESET  # noqa: E402


def _cluster(fraction: float = 0.3):
    return dp.load_cluster(PRESET).with_memory_fraction(fraction)


def search(graph_path: str, seed: int, out: str, options: dict) -> None:
    graph, cluster = dp.load_graph(graph_path), _cluster()
    began, t0 = _when(), time.perf_counter()
    p = dp.place(graph, cluster, algo="sim-search", seed=seed, **options)
    keep = ("evals", "stopped_by", "found_by", "rounds", "gap", "capped_step_us", "canonical_caps_gib",
            "best_seed", "best_seed_step_us", "grad_blocks", "recurrence", "order_descent", "coarse_mip",
            "virtual_cap_rounds", "unpinned")
    _write(dict(graph=graph_path, seed=seed, options=options, step_ms=p.options["step_us"] / 1e3,
                report={k: p.options.get(k) for k in keep}, s=round(time.perf_counter() - t0, 1),
                utc_load=[began, _when()], names=list(graph.names), devices=p.devices.tolist(),
                priority=None if p.priority is None else p.priority.tolist()), out)


def carry(start: str, graph_path: str) -> None:
    data = json.load(open(start))
    graph, cluster = dp.load_graph(graph_path), _cluster()
    index = {name: i for i, name in enumerate(data["names"])}
    missing = [n for n in graph.names if n not in index]
    assert not missing, f"{len(missing)} ops of {graph_path} not in {start}"
    take = np.array([index[n] for n in graph.names])
    devices = np.array(data["devices"])[take]
    priority = None if data["priority"] is None else np.array(data["priority"])[take]
    sim = Simulator(graph, cluster)
    peak = one_device_peak_bytes(sim)
    caps = canonical_caps_bytes(graph, cluster, SearchConfig(), peak)
    s = _Search(graph, cluster, SearchConfig(), data["seed"])
    rows = []
    for order, prio in [("own", priority)] + list(s.orders(devices)):
        r = sim.run(Placement(devices=devices, priority=prio))
        rows.append(dict(order=order, step_ms=r.step_time_us / 1e3,
                         peak_gib=[float(x) / GIB for x in r.peak_memory_bytes]))
    print(json.dumps(dict(start=start, graph=graph_path, found_ms=data["step_ms"],
                          one_device_peak_gib=peak / GIB, caps_gib=[c / GIB for c in caps],
                          memory_gib=float(cluster.memory_bytes.min()) / GIB, runs=rows), indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--search", nargs=3, metavar=("GRAPH", "SEED", "OUT"))
    ap.add_argument("--option", action="append", default=[])
    ap.add_argument("--carry", nargs=2, metavar=("FROM", "GRAPH"))
    a = ap.parse_args()
    if a.search:
        options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in a.option)}
        search(a.search[0], int(a.search[1]), a.search[2], options)
    if a.carry:
        carry(*a.carry)


if __name__ == "__main__":
    main()
