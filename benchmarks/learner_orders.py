"""RNNLM: is sim-search's gain over the learners its schedule order or its moves? (BENCHMARKS.md, "Learning placers",
round 7, issue 12.)

Measured on one model (default RNNLM on HP's 2 GPUs, where both learners returned the expert), every placement
simulated as the learners' environment does:

- ``orders``: the expert's devices and sim-search's (seed 0) each in a list of priority rules: the topological
  order, the placement's own upward rank, the upward rank with transfers counted as free, the other placement's
  upward rank, sim-search's returned priority, forward ops first, the latest start times (ALAP) of the upward-rank
  schedule, and the upward rank with each cut edge costed at the transfer time the previous schedule actually
  gave it (iterated three times from the upward rank, each iteration's order scored);
- ``sim_search_own_orders``: sim-search with every candidate scored in the faster of its topological and upward-rank
  orders, as the learners score theirs, so no order is carried from one placement to the next (its scoring call is
  replaced in this process only);
- ``greedy``: from the expert, a greedy search (a candidate replaces the best when faster) over one kind of move,
  per seed: ``critical`` (``learn.train.CriticalMoves``, option critical_share's move) or ``random`` (a random
  co-placement group to another device), each scored in the faster of the two orders.

    .venv/bin/python benchmarks/learner_orders.py                 # RNNLM, 3 seeds, 3,000 candidates each

Writes ``benchmarks/results/learner_orders.json`` and prints it (ms, simulated).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import devplace as dp
from devplace.fileio import write_text_atomic
from devplace.graph import Role
from devplace.learn.env import PlacementEnv
from devplace.placement import Placement
from devplace.placers._listsched import bottom_levels
from devplace.placers._moves import Units, upward_rank_us

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learned_placers import graph_and_cluster  # noqa: E402
from reproduce_papers import RESULTS  # noqa: E402

ORDERS = ("topological", "upward-rank")


def waited_edge_us(graph, sim, devices: np.ndarray, priority) -> np.ndarray:
    """Per edge, the time from its producer's end to its output's arrival on the consumer's device in the simulated
    schedule (queueing on the link included; 0 inside a device)."""
    result = sim.run(Placement(devices=devices, priority=priority))
    arrive = np.zeros((graph.n_ops, sim.cluster.n_devices))
    arrive[result.transfer_op, result.transfer_dst] = result.transfer_end_us
    src, dst = graph.edge_src, graph.edge_dst
    cut = devices[src] != devices[dst]
    edge_us = np.zeros(len(dst))
    edge_us[cut] = arrive[src[cut], devices[dst[cut]]] - result.finish_us[src[cut]]
    return edge_us


def rank(graph, cluster, sim, devices: np.ndarray, edge_us: np.ndarray) -> np.ndarray:
    """Minus the longest path to the end of the step with the given edge times (a priority: lower runs first)."""
    own = sim.op_time_us[np.arange(graph.n_ops), devices] + float(cluster.op_gap_us)
    return -bottom_levels(graph.topo_order.astype(np.int64), graph.succ_ptr, graph.succ_edge, graph.edge_dst, own,
                          edge_us)


def alap(graph, sim, devices: np.ndarray, priority) -> np.ndarray:
    """Each op's latest start that keeps the schedule's step time, its transfers and each device's op sequence."""
    result = sim.run(Placement(devices=devices, priority=priority))
    edge_us = waited_edge_us(graph, sim, devices, priority)
    took = result.finish_us - result.start_us
    after = np.full(graph.n_ops, -1)
    for device in range(sim.cluster.n_devices):
        ops = np.flatnonzero(devices == device)
        ops = ops[np.argsort(result.start_us[ops], kind="stable")]
        after[ops[:-1]] = ops[1:]
    latest = np.zeros(graph.n_ops)
    for op in np.argsort(-result.start_us, kind="stable"):
        edges = graph.succ_edge[graph.succ_ptr[op]:graph.succ_ptr[op + 1]]
        end = min([result.step_time_us] + (latest[graph.edge_dst[edges]] - edge_us[edges]).tolist()
                  + ([latest[after[op]]] if after[op] >= 0 else []))
        latest[op] = end - took[op]
    return latest


def orders(graph, cluster, sim, devices: np.ndarray, other: np.ndarray, sim_search_priority) -> dict:
    """``devices``' step time (ms) in each priority rule of the module docstring."""
    own = -upward_rank_us(graph, cluster, devices, sim.op_time_us)
    rules = {"topological": None, "upward rank": own,
             "upward rank, transfers free": rank(graph, cluster, sim, devices, np.zeros(len(graph.edge_dst))),
             "the other placement's upward rank": -upward_rank_us(graph, cluster, other, sim.op_time_us),
             "sim-search's priority": sim_search_priority,
             "forward ops first, then upward rank": np.where(graph.role == Role.FORWARD, -1e12, 0.0) + own,
             "latest start (ALAP) of the upward-rank schedule": alap(graph, sim, devices, own)}
    priority = own
    for k in range(3):
        priority = rank(graph, cluster, sim, devices, waited_edge_us(graph, sim, devices, priority))
        rules[f"upward rank with the transfers' waited times, iteration {k + 1}"] = priority
    return {name: sim.step_time_us(devices, p) / 1e3 for name, p in rules.items()}


def sim_search_own_orders(graph, cluster) -> dict:
    """sim-search (seed 0) with every candidate scored as the learners score theirs (the faster of ``ORDERS``)."""
    from devplace.portfolio.sim_search.search import _Search

    env = PlacementEnv(graph, cluster, np.arange(graph.n_ops), ORDERS)

    def learners_score(search, devices, priority):
        search.evals += 1
        return float(env.evaluate(devices[None]).step_us[0])

    original = _Search.step_us
    _Search.step_us = learners_score
    try:
        began = time.perf_counter()
        placed = dp.place(graph, cluster, algo="sim-search", seed=0)
    finally:
        _Search.step_us = original
    devices = np.asarray(placed.devices, dtype=np.int64)
    return {"step_us_in_own_orders": float(env.evaluate(devices[None]).step_us[0]), "evals": placed.options["evals"],
            "seconds": round(time.perf_counter() - began, 1)}


def greedy(graph, cluster, start: np.ndarray, kind: str, candidates: int, seed: int) -> dict:
    """A greedy search from ``start`` over ``kind`` moves; the best (ms) and the candidates it took to get there."""
    import torch

    from devplace.learn.train import CriticalMoves
    from devplace.transforms import coplacement_groups

    env = PlacementEnv(graph, cluster, np.arange(graph.n_ops), ORDERS)
    moves = CriticalMoves(graph, cluster, np.arange(graph.n_ops), ORDERS)
    groups = Units.from_labels(graph, coplacement_groups(graph))
    generator, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    best, best_us, curve = start.copy(), float(env.evaluate(start[None]).step_us[0]), []
    for k in range(candidates):
        if kind == "critical":
            trial = moves.draw(best, None, 1, generator)[0]
        else:
            trial = best.copy()
            ops = groups.members(int(rng.integers(groups.n_units)))
            trial[ops] = (trial[ops[0]] + 1 + rng.integers(cluster.n_devices - 1)) % cluster.n_devices
        step_us = float(env.evaluate(trial[None]).step_us[0])
        if step_us < best_us:
            best, best_us = trial, step_us
            curve.append((k + 1, round(step_us / 1e3, 3)))
    return {"best_ms": best_us / 1e3, "curve": curve}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="rnnlm")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=3000)
    args = parser.parse_args(argv)
    from devplace.sim import Simulator

    graph, cluster = graph_and_cluster(args.model)
    sim = Simulator(graph, cluster)
    expert = np.asarray(dp.place(graph, cluster, algo="expert", seed=0).devices, dtype=np.int64)
    searched = dp.place(graph, cluster, algo="sim-search", seed=0)
    found = np.asarray(searched.devices, dtype=np.int64)
    out = {"model": args.model, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_average": os.getloadavg(), "sim_search_ms": searched.options["step_us"] / 1e3,
           "ops_on_other_devices": int((expert != found).sum()),
           "orders": {"expert": orders(graph, cluster, sim, expert, found, searched.priority),
                      "sim-search": orders(graph, cluster, sim, found, expert, searched.priority)},
           "sim_search_own_orders": sim_search_own_orders(graph, cluster),
           "greedy": {kind: {seed: greedy(graph, cluster, expert, kind, args.candidates, seed)
                             for seed in range(args.seeds)} for kind in ("critical", "random")}}
    write_text_atomic(RESULTS / "learner_orders.json", json.dumps(out, indent=1, default=float) + "\n")
    print(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
