"""Round 42 (issue 15, point 3): RNNLM at 30% memory, where layer 0's backward runs.

Round 40 found main's best ends with 38.6 ms of unbroken compute on one GPU (layer 0's backward and a
recurrent weight's gradient chain, interleaved), while the classifier's GPU computes 9.6 ms over that
time. This script moves, by hand, the gradient-accumulation chain that holds most of that stretch's
compute (found by structure: `grad_blocks.gradient_owner`, not by name) to the GPUs that compute
least after the stretch begins, and variants of it (its adds only, all but its last product, with
its sibling chain, with its weight and update, split by step). It simulates each in the placement's
own order and the search's whole orders (with the peaks), and with `parallel` channels (the layout
without the sequential channels' queueing); measures what single-op moves of the chain cost (what
the annealing sees); then runs the order descent and `--rounds` annealing rounds with the file's
seed from the fastest variant, or from `--variant NAME` ("as found": the control). The descent and
rounds judge memory against the real memory, not a canonical cap, so they are if anything optimistic.

`START`: a `relay_order.py --search` file (its model, seed, devices and priority).
Writes OUT (JSON, atomically): every variant's steps, the single-op moves, what the descent and
rounds reach, and the final best's devices and priority (for `relay_order.py --waits OUT`).
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

from devplace.graph import Role  # noqa: E402
from devplace.placement import Placement  # noqa: E402
from devplace.sim import Simulator  # noqa: E402
from devplace.portfolio.sim_search.anneal import _anneal, _lower_bound_us  # noqa: E402
from devplace.portfolio.sim_search.config import GIB, SearchConfig  # noqa: E402
from devplace.portfolio.sim_search.grad_blocks import gradient_owner  # noqa: E402
from devplace.portfolio.sim_search.order_descent import _order_descent  # noqa: E402
from devplace.portfolio.sim_search.search import Found, _Search  # noqa: E402
from duplex_track_by_hand import _when, _write  # noqa: E402
from relay_order import _graph_and_cluster, _load  # noqa: E402


def last_stretch(result) -> tuple[int, float, np.ndarray]:
    """The critical path's last run on one device: (device, its start in us, each device's compute after it)."""
    path = result.critical_path
    last = len(path) - 1
    while last > 0 and result.devices[path[last - 1]] == result.devices[path[-1]]:
        last -= 1
    t0 = float(result.start_us[path[last]])
    busy = np.bincount(result.devices, weights=(result.finish_us - result.start_us) * (result.start_us >= t0),
                       minlength=len(result.busy_us))
    return int(result.devices[path[-1]]), t0, busy


def stretch_chains(graph, result, device: int, t0: float) -> list[tuple[int, np.ndarray, float]]:
    """The gradient-accumulation chains in the stretch, most compute first: (owner group, the chain's
    ops: owned backward ops outside the owner's colocation group, their compute after t0 on device)."""
    owner = gradient_owner(graph)
    chain = (owner >= 0) & (graph.colocation != owner)
    spent = (result.finish_us - result.start_us) * (result.start_us >= t0) * (result.devices == device)
    chains = []
    for group in np.unique(owner[chain]):
        ops = np.flatnonzero(chain & (owner == group))
        chains.append((int(group), ops, float(spent[ops].sum())))
    return sorted(chains, key=lambda c: -c[2])


def sibling_chain(graph, chains: list) -> np.ndarray:
    """The largest other chain that reads a backward input of the first (RNNLM: ``weight_ih`` 0's chain
    reads the gate gradients ``weight_hh`` 0's reads), by compute."""
    first = chains[0][1]
    inputs = {int(u) for v in first for u in graph.predecessors(v) if graph.role[u] == Role.BACKWARD} - set(first.tolist())
    op_us = graph.compute_us.min(axis=1)
    readers = [ops for _, ops, _ in chains[1:]
               if inputs & set(np.concatenate([graph.predecessors(v) for v in ops]).tolist())]
    return max(readers, key=lambda ops: op_us[ops].sum()) if readers else np.zeros(0, np.int64)


def accumulators(graph, ops: np.ndarray) -> np.ndarray:
    """The ops of a chain that read another op of it that takes time (the adds; a product reads the
    step's inputs, through views of the chain that take none)."""
    timed = np.zeros(graph.n_ops, bool)
    timed[ops] = graph.compute_us[ops].min(axis=1) > 0
    return np.array([v for v in ops if timed[graph.predecessors(v)].any()], np.int64)


def last_product(graph, ops: np.ndarray, group: int) -> np.ndarray:
    """The chain's ops that feed the weight's own ops (its colocation ``group``: the last add, which
    sums the chain with the last step's product) and are no add, with their ancestors in the chain
    that are no add: what stays beside the last add so that only the partial sum crosses."""
    inside, adds = np.zeros(graph.n_ops, bool), np.zeros(graph.n_ops, bool)
    inside[ops], adds[accumulators(graph, ops)] = True, True
    front = [int(v) for v in ops if not adds[v] and (graph.colocation[graph.successors(v)] == group).any()]
    tail = set()
    while front:
        v = front.pop()
        tail.add(v)
        front += [int(u) for u in graph.predecessors(v) if inside[u] and not adds[u] and int(u) not in tail]
    return np.array(sorted(tail), np.int64)


def judge(search: _Search, devices: np.ndarray, priority, parallel: Simulator) -> dict:
    """The step in the placement's own order and in each of the search's whole orders, and the peaks;
    and the least of those steps with every GPU pair on a channel of its own (``parallel``: what the
    layout costs without the sequential channels' queueing)."""
    out = {}
    orders = [("own", priority)] + search.orders(devices)
    for name, order in orders:
        result = search.sim.run(Placement(devices=devices, priority=order))
        out[name] = dict(step_ms=round(result.step_time_us / 1e3, 3),
                         peak_gib=round(float(result.peak_memory_bytes.max()) / GIB, 3))
    out["parallel channels"] = dict(step_ms=round(min(parallel.step_time_us(devices, o) for _, o in orders) / 1e3, 3))
    return out


def one_at_a_time(search: _Search, devices: np.ndarray, priority, ops: np.ndarray, target: int) -> dict:
    """What the annealing sees: each op of the chain moved alone to ``target`` (the least and the
    median step), and the step as the chain moves there op by op in step order (every tenth)."""
    alone, as_found_ms = [], search.sim.step_time_us(devices, priority) / 1e3
    for v in ops:
        moved = devices.copy()
        moved[v] = target
        alone.append(search.sim.step_time_us(moved, priority) / 1e3)
    moved, path = devices.copy(), []
    for k, v in enumerate(ops):
        moved[v] = target
        if k % 10 == 9 or k == len(ops) - 1:
            path.append((k + 1, round(search.sim.step_time_us(moved, priority) / 1e3, 3)))
    return dict(target=target, alone_least_ms=round(min(alone), 3), alone_median_ms=round(float(np.median(alone)), 3),
                alone_not_slower=int(sum(a <= as_found_ms for a in alone)),
                cumulative_ms=path)


def main(start: str, out: str, rounds: int, descent_evals: int, chosen: str | None) -> None:
    data = json.load(open(start))
    graph, cluster = _graph_and_cluster(data["model"])
    devices, priority = _load(start)
    began, t0_wall = _when(), time.perf_counter()
    search = _Search(graph, cluster, SearchConfig(order_descent_evals=descent_evals), data["seed"])
    result = search.sim.run(Placement(devices=devices, priority=priority))
    device, t0, busy = last_stretch(result)
    chains = stretch_chains(graph, result, device, t0)
    idle = [int(d) for d in np.argsort(busy) if d != device]
    report = dict(start=start, step_ms=result.step_time_us / 1e3, stretch_device=device, stretch_from_ms=t0 / 1e3,
                  busy_after_ms=(busy / 1e3).round(3).tolist(), idle_order=idle, memory_gib=float(cluster.memory_bytes.min()) / GIB,
                  chains=[dict(group=graph.colocation_names[g], ops=len(ops), stretch_ms=round(s / 1e3, 3),
                               devices=np.bincount(devices[ops], minlength=cluster.n_devices).tolist())
                          for g, ops, s in chains[:4]])
    first = chains[0][1]
    second = sibling_chain(graph, chains)
    whole = np.union1d(first, np.flatnonzero(graph.colocation == chains[0][0]))   # with the weight and its update
    adds = accumulators(graph, first)
    but_last = np.setdiff1d(first, last_product(graph, first, chains[0][0]))
    by_step = first[np.argsort(graph.topo_rank[first])]
    variants = {}
    parallel = Simulator(graph, dataclasses.replace(cluster, comm_model="parallel"))

    def variant(name: str, moves: list[tuple[np.ndarray, int]]) -> None:
        moved = devices.copy()
        for ops, d in moves:
            moved[ops] = d
        variants[name] = dict(devices=moved, judged=judge(search, moved, priority, parallel))

    variant("as found", [])
    for d in idle:
        variant(f"chain to GPU {d}", [(first, d)])
        variant(f"adds only to GPU {d}", [(adds, d)])
        variant(f"chain but its last product to GPU {d}", [(but_last, d)])
        variant(f"chain and its sibling chain to GPU {d}", [(first, d), (second, d)])
        variant(f"chain with its weight and update to GPU {d}", [(whole, d)])
    a, b = idle[0], idle[1]
    for k in (len(by_step) // 4, len(by_step) // 2, 3 * len(by_step) // 4):
        variant(f"chain by step: first {k} ops to GPU {a}, rest to GPU {b}", [(by_step[:k], a), (by_step[k:], b)])
        variant(f"chain by step: first {k} ops to GPU {a}, rest stays", [(by_step[:k], a)])
        variant(f"chain by step: first {k} ops stay, rest to GPU {a}", [(by_step[k:], a)])
    report["variants"] = {k: v["judged"] for k, v in variants.items()}
    report["one_at_a_time"] = one_at_a_time(search, devices, priority, by_step, idle[0])
    for name, v in variants.items():
        print(f"{name:60s} " + "  ".join(f"{o} {j['step_ms']:.3f}" + (f" ({j['peak_gib']:.2f} GiB)" if "peak_gib" in j else "")
                                         for o, j in v["judged"].items()))

    # from the fastest variant (any order), or the one chosen: the order descent, then annealing rounds
    def sequential(judged: dict) -> tuple:
        return min(((o, j) for o, j in judged.items() if o != "parallel channels"), key=lambda kv: kv[1]["step_ms"])

    name, best = min(((n, sequential(v["judged"])) for n, v in variants.items()
                      if (n == chosen if chosen else n != "as found")), key=lambda x: x[1][1]["step_ms"])
    order_name = best[0]
    moved = variants[name]["devices"]
    order = priority if order_name == "own" else dict(search.orders(moved))[order_name]
    bound_us = _lower_bound_us(graph, cluster)
    search.fitting = None
    search.best = Found(search.sim.step_time_us(moved, order), moved.copy(), order, name)
    _order_descent(search, bound_us)
    after_descent = search.best[0]
    home = search.best
    per_round = []
    for _ in range(rounds):
        home = _anneal(search, home)[1]
        per_round.append(round(home[0] / 1e3, 3))
    final = search.examine(search.best[1], search.best[2])[1]
    device_f, t0_f, busy_f = last_stretch(final)
    report.update(fastest_variant=name, fastest_order=order_name, fastest_ms=best[1]["step_ms"],
                  after_order_descent_ms=round(after_descent / 1e3, 3), anneal_round_ms=per_round,
                  best_ms=round(search.best[0] / 1e3, 3), best_peak_gib=round(float(final.peak_memory_bytes.max()) / GIB, 3),
                  best_stretch=dict(device=device_f, from_ms=round(t0_f / 1e3, 3), busy_after_ms=(busy_f / 1e3).round(3).tolist()),
                  model=data["model"], seed=data["seed"], devices=search.best[1].tolist(),
                  priority=None if search.best[2] is None else np.asarray(search.best[2]).tolist(),
                  evals=search.evals, s=round(time.perf_counter() - t0_wall, 1), utc_load=[began, _when()])
    print(json.dumps({k: v for k, v in report.items() if k not in ("variants", "devices", "priority")}))
    _write(report, out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("start")
    parser.add_argument("out")
    parser.add_argument("--rounds", type=int, default=4, help="annealing rounds after the order descent")
    parser.add_argument("--order-descent-evals", type=int, default=2000)
    parser.add_argument("--variant", default=None, help="descend from this variant (default: the fastest; 'as found': the control)")
    args = parser.parse_args()
    main(args.start, args.out, args.rounds, args.order_descent_evals, args.variant)
