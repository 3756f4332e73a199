"""Round 31 (issue 15, point 3), by hand: does a placement sim-search finds under comm_model `duplex`
lead, under the real `sequential` model, below the `sequential` search's own best on RNNLM at 30%?

`--search MODEL SEED OUT`: sim-search on zoo:rnnlm, baechi-4x2080 at 30% memory with its comm_model
replaced by MODEL; writes the step, evals, devices and priority to OUT (JSON, atomically).
`--hand START SEED OUT`: under `sequential`, the START placement (a `--search` JSON, or round 30's
channel_ceiling_rnnlm.json for its duplex row) is judged in its own priority, the search's orders and
the order of its own `duplex` schedule (each op's start there), then annealed from the fastest as a
track (`anneal._track_rounds`, 4 rounds) and given the gradient-block and recurrence tracks, as the
search's last phases would; each phase's best and evals go to OUT.
`--overlap START MODEL`: prints, per GPU of START simulated under MODEL, the time its channel is busy
sending, receiving, both at once and either (ms): what `sequential` would have to serialize.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import devplace as dp  # noqa: E402
from devplace.placement import Placement  # noqa: E402
from devplace.portfolio.sim_search.anneal import _lower_bound_us, _track_rounds  # noqa: E402
from devplace.portfolio.sim_search.config import SearchConfig  # noqa: E402
from devplace.portfolio.sim_search.grad_blocks import _gradient_block_rounds  # noqa: E402
from devplace.portfolio.sim_search.recurrence import _recurrence_rounds  # noqa: E402
from devplace.portfolio.sim_search.search import _Search  # noqa: E402
from devplace.sim import Simulator  # noqa: E402
from reproduce_papers import PRESET, cached_graph  # noqa: E402


def _cluster(model: str):
    return dataclasses.replace(dp.load_cluster(PRESET).with_memory_fraction(0.3), comm_model=model)


def _write(row: dict, out: str) -> None:
    with open(out + ".tmp", "w") as f:
        json.dump(row, f, indent=1)
    os.replace(out + ".tmp", out)


def _when() -> tuple[str, float]:
    return time.strftime("%H:%M:%S", time.gmtime()), os.getloadavg()[0]


def search(model: str, seed: int, out: str) -> None:
    graph, began, t0 = cached_graph("zoo:rnnlm"), _when(), time.perf_counter()
    p = dp.place(graph, _cluster(model), algo="sim-search", seed=seed)
    _write(dict(model=model, seed=seed, step_ms=p.options["step_us"] / 1e3, evals=p.options["evals"],
                s=time.perf_counter() - t0, utc_load=[began, _when()], devices=p.devices.tolist(),
                priority=None if p.priority is None else p.priority.tolist()), out)


def _start(path: str):
    data = json.load(open(path))
    if "rows" in data:      # round 30's file: its duplex row, devices only (default priority)
        row = next(r for r in data["rows"] if r["placement"] == "cq_place_duplex.npy")
        return np.array(row["devices"]), None
    return np.array(data["devices"]), None if data["priority"] is None else np.array(data["priority"])


def hand(start: str, seed: int, out: str) -> None:
    graph, cluster = cached_graph("zoo:rnnlm"), _cluster("sequential")
    devices, priority = _start(start)
    began, t0 = _when(), time.perf_counter()
    duplex = Simulator(graph, _cluster("duplex")).run(Placement(devices=devices, priority=priority))
    s = _Search(graph, cluster, SearchConfig(), seed)
    s.fitting = None
    bound_us = _lower_bound_us(graph, cluster)
    orders, best = {}, None
    for name, order in [("its own priority", priority), ("its duplex schedule", duplex.start_us)] + s.orders(devices):
        overflow, step_us, _ = s.measure(devices, order)
        orders[name] = step_us / 1e3
        if overflow == 0 and (best is None or step_us < best[0]):
            best = (step_us, devices.copy(), order, name)
    s.offer(*best)
    phases = {}
    rounds, _ = _track_rounds(s, best, "duplex best", 4, 0.0, until_us=bound_us * 1.1)
    phases["track"] = dict(ms=s.best[0] / 1e3, evals=s.evals, rounds=rounds)
    _gradient_block_rounds(s, bound_us)
    phases["gradient blocks"] = dict(ms=s.best[0] / 1e3, evals=s.evals)
    _recurrence_rounds(s, bound_us)
    phases["recurrence"] = dict(ms=s.best[0] / 1e3, evals=s.evals)
    _write(dict(start=start, seed=seed, duplex_ms=duplex.step_time_us / 1e3, bound_ms=bound_us / 1e3,
                sequential_ms_by_order=orders, phases=phases, s=time.perf_counter() - t0,
                utc_load=[began, _when()]), out)


def _union(intervals) -> list[list[float]]:
    merged: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def _common_us(u: list[list[float]], v: list[list[float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(u) and j < len(v):
        total += max(0.0, min(u[i][1], v[j][1]) - max(u[i][0], v[j][0]))
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(start: str, model: str) -> None:
    graph, cluster = cached_graph("zoo:rnnlm"), _cluster(model)
    devices, priority = _start(start)
    r = Simulator(graph, cluster).run(Placement(devices=devices, priority=priority))
    print(f"{start} under {model}: {r.step_time_us / 1e3:.3f} ms; per GPU send, receive, both at once, either (ms)")
    for k in range(cluster.n_devices):
        send = _union(zip(r.transfer_start_us[r.transfer_src == k], r.transfer_end_us[r.transfer_src == k]))
        receive = _union(zip(r.transfer_start_us[r.transfer_dst == k], r.transfer_end_us[r.transfer_dst == k]))
        busy = [sum(b - a for a, b in u) / 1e3 for u in (send, receive, _union(send + receive))]
        print(f"  GPU {k}: {busy[0]:.3f} {busy[1]:.3f} {_common_us(send, receive) / 1e3:.3f} {busy[2]:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--search", nargs=3, metavar=("MODEL", "SEED", "OUT"))
    parser.add_argument("--hand", nargs=3, metavar=("START", "SEED", "OUT"))
    parser.add_argument("--overlap", nargs=2, metavar=("START", "MODEL"))
    args = parser.parse_args()
    if args.search:
        search(args.search[0], int(args.search[1]), args.search[2])
    if args.hand:
        hand(args.hand[0], int(args.hand[1]), args.hand[2])
    if args.overlap:
        overlap(*args.overlap)
