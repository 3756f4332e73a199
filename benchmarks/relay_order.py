"""Round 40 (issue 15, point 3): RNNLM at 30% memory, the order of relayed transfers.

`--search MODEL SEED OUT [--option KEY=JSON ...]`: sim-search on zoo:MODEL, baechi-4x2080 at 30%
memory (`sequential` channels, as the zoo rows run), or on a bundled graph (`bundled:NAME`) on its
own cluster; writes the step, evals, seconds, UTC and load, how the best was found, its devices and
priority to OUT (JSON, atomically). Run with `PYTHONPATH=/work/main` for main's code.
`--waits START`: where a placement's step goes: per GPU the channel time it holds and its transfers'
wait (begin minus their producer's finish), by producer kind; the critical path split into op time,
transfer time and channel queueing; its last stretch on one GPU and each GPU's compute after it.
`--order-descent START ... [--order-descent-evals N]`: the search's last phase (order_descent.py)
run by hand from a `--search` file's best with its seed: what the phase adds, without the search.
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
from devplace.io.dnn_partitioning import cluster_for  # noqa: E402
from devplace.placement import Placement  # noqa: E402
from devplace.portfolio.sim_search.config import SearchConfig  # noqa: E402
from devplace.sim import Simulator  # noqa: E402
from duplex_track_by_hand import _when, _write  # noqa: E402
from reproduce_papers import PRESET, cached_graph  # noqa: E402


MEMORY_FRACTION = [0.3]     # --fraction changes it: point 4's runs at 100%


def _cluster():
    return dp.load_cluster(PRESET).with_memory_fraction(MEMORY_FRACTION[0])


def _graph_and_cluster(model: str):
    """A zoo model on baechi-4x2080 at 30% memory, or a bundled graph (``bundled:NAME``) on its own cluster."""
    if model.startswith("bundled:"):
        graph = dp.load_graph(dp.example_path(f"{model.split(':', 1)[1]}.json"))
        return graph, cluster_for(graph)
    return cached_graph(f"zoo:{model}"), _cluster()


def search(model: str, seed: int, out: str, options: dict) -> None:
    (graph, cluster), began, t0 = _graph_and_cluster(model), _when(), time.perf_counter()
    p = dp.place(graph, cluster, algo="sim-search", seed=seed, **options)
    _write(dict(model=model, seed=seed, options=options, memory_fraction=MEMORY_FRACTION[0], step_ms=p.options["step_us"] / 1e3, evals=p.options["evals"],
                how=p.options.get("found_by"), order_descent=p.options.get("order_descent"),
                s=time.perf_counter() - t0, utc_load=[began, _when()],
                devices=p.devices.tolist(), priority=None if p.priority is None else p.priority.tolist()), out)


def _load(path: str):
    data = json.load(open(path))
    return np.array(data["devices"]), None if data.get("priority") is None else np.array(data["priority"])


def waits(start: str) -> None:
    graph, cluster = cached_graph("zoo:rnnlm"), _cluster()
    devices, priority = _load(start)
    r = Simulator(graph, cluster).run(Placement(devices=devices, priority=priority))
    print(f"step {r.step_time_us / 1e3:.3f} ms, {len(r.transfer_op)} transfers")
    src, dst = r.transfer_src, r.transfer_dst
    begin, end = r.transfer_start_us, r.transfer_end_us
    wait = begin - r.finish_us[r.transfer_op]
    for d in range(cluster.n_devices):
        mine = (src == d) | (dst == d)
        print(f"GPU {d}: channel {(end - begin)[mine].sum() / 1e3:.3f} ms, sends {(src == d).sum()} "
              f"wait {wait[src == d].sum() / 1e3:.3f} ms, receives {(dst == d).sum()} wait {wait[dst == d].sum() / 1e3:.3f} ms")
    names = np.array([n.split("_")[0] for n in graph.names])
    kinds = {}
    for x in range(len(wait)):
        k = names[r.transfer_op[x]]
        n, w, t = kinds.get(k, (0, 0.0, 0.0))
        kinds[k] = (n + 1, w + wait[x], t + end[x] - begin[x])
    for k, (n, w, t) in sorted(kinds.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"  {k:16s} {n:4d} transfers, wait {w / 1e3:8.3f} ms, channel {t / 1e3:7.3f} ms")
    print(f"total wait {wait.sum() / 1e3:.3f} ms; max {wait.max() / 1e3:.3f} ms")
    critical_path_split(graph, r, names)


def critical_path_split(graph, r, names) -> None:
    """The step as its critical path spends it: op time, device waits (ready, device busy),
    transfer time, and channel queueing (a transfer begins after its producer finished), the
    queueing per producer kind and per (source, destination) GPU pair."""
    xfer = {(int(u), int(d)): x for x, (u, d) in enumerate(zip(r.transfer_op, r.transfer_dst))}
    path = r.critical_path
    parts = dict(op=0.0, transfer=0.0, queue=0.0, other=r.start_us[path[0]])
    queued: dict = {}
    for u, v in zip(path, path[1:]):
        parts["op"] += r.finish_us[u] - r.start_us[u]
        gap = r.start_us[v] - r.finish_us[u]
        x = xfer.get((u, int(r.devices[v]))) if r.devices[u] != r.devices[v] else None
        if x is None or r.cause[v] != u or r.start_us[v] > r.ready_us[v]:
            parts["other"] += gap       # the device's previous op, or a same-device input
            continue
        q = r.transfer_start_us[x] - r.finish_us[u]
        parts["queue"] += q
        parts["transfer"] += gap - q
        key = (names[u], int(r.devices[u]), int(r.devices[v]))
        queued[key] = queued.get(key, 0.0) + q
    parts["op"] += r.finish_us[path[-1]] - r.start_us[path[-1]]
    print(f"critical path: {len(path)} ops, " + ", ".join(f"{k} {t / 1e3:.3f} ms" for k, t in parts.items()))
    last = len(path) - 1
    while last > 0 and r.devices[path[last - 1]] == r.devices[path[-1]]:
        last -= 1
    t0 = r.start_us[path[last]]
    busy = np.bincount(r.devices, weights=(r.finish_us - r.start_us) * (r.start_us >= t0), minlength=len(r.busy_us))
    print(f"the path's last stretch: GPU {r.devices[path[-1]]} from {t0 / 1e3:.3f} ms ({len(path) - last} ops); "
          "each GPU's compute after it: " + " / ".join(f"{b / 1e3:.3f}" for b in busy) + " ms")
    for (k, a, b), q in sorted(queued.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  queued on the path: {k} GPU {a} -> {b}: {q / 1e3:.3f} ms")


def order_descent_by_hand(start: str, evals: int | None) -> None:
    """The order descent (``sim_search/order_descent.py``) from a ``--search`` file's best, as the
    search's last phase would run it with that file's seed: the same result, without the search."""
    from devplace.portfolio.sim_search.anneal import _lower_bound_us
    from devplace.portfolio.sim_search.order_descent import _order_descent
    from devplace.portfolio.sim_search.search import _Search

    data = json.load(open(start))
    graph, cluster = _graph_and_cluster(data["model"])
    devices, priority = _load(start)
    began, t0 = _when(), time.perf_counter()
    config = SearchConfig() if evals is None else SearchConfig(order_descent_evals=evals)
    s = _Search(graph, cluster, config, data["seed"])
    s.fitting = None
    s.best = (s.sim.step_time_us(devices, priority), devices, priority, data.get("how"))
    bound_us = _lower_bound_us(graph, cluster)
    s.closed_us = bound_us * (1.0 + s.config.closed_gap)
    _order_descent(s, bound_us)
    print(json.dumps(dict(start=start, before_ms=data["step_ms"], after_ms=s.best[0] / 1e3, evals=s.evals,
                          report=s.order_descent_report, s=round(time.perf_counter() - t0, 1),
                          utc_load=[began, _when()])))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--search", nargs=3, metavar=("MODEL", "SEED", "OUT"))
    parser.add_argument("--option", action="append", default=[], metavar="KEY=JSON",
                        help="a sim-search option for --search, e.g. order_descent_evals=0")
    parser.add_argument("--waits", metavar="START")
    parser.add_argument("--order-descent", nargs="+", metavar="START")
    parser.add_argument("--order-descent-evals", type=int, default=None, help="default: the search's")
    parser.add_argument("--fraction", type=float, default=0.3, help="each GPU's share of its memory for zoo rows")
    args = parser.parse_args()
    MEMORY_FRACTION[0] = args.fraction
    for start in args.order_descent or []:
        order_descent_by_hand(start, args.order_descent_evals)
    if args.search:
        options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)}
        search(args.search[0], int(args.search[1]), args.search[2], options)
    if args.waits:
        waits(args.waits)
