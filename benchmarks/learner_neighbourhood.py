"""Why does a warm-started learner not move from its start? (BENCHMARKS.md, "Learning placers", issue 12.)

For each model: the learners' warm start (the fastest of ``WARM_STARTS``), ColocRL's groups under
devplace's variant (colocation groups, capped at 256) and sim-search's placement (seed 0). Measured,
every placement scored as the learners score it (the faster of the schedule orders of ``--orders``):

- ``one_moves``: every group of the start moved alone to each other device: how many are faster than
  the start, and the fastest (the neighbourhood ``deviations`` samples from);
- ``run_moves``: every run of ``--spans`` consecutive groups (in step order) moved whole to each
  other device: moves of several units along a cut, as the expert's layers differ from sim-search's;
- ``layer_moves``: every group moved with the rest of its layers (a forward op with its backward and update
  ops: option ``layer_moves``) to each other device;
- ``module_moves`` (where the step order interleaves the layers, as GNMT's: option ``module_moves``): every
  module layer (all its time steps, with backward and update ops) moved whole to each other device;
  ``module_descent``: a greedy descent over those moves from the start (the fastest each time, until none is
  faster); ``sim_search_on_modules_us``: sim-search's placement with each module on its majority device;
- ``towards``: the groups where sim-search's projection differs from the start, applied in step order
  one at a time: the step time along that path (is there a barrier between the two?);
- ``orders``: sim-search's devices in each schedule order the environment knows and in sim-search's own
  (what order it found its placement with: ``found_by``).

    .venv/bin/python benchmarks/learner_neighbourhood.py --models gnmt4,rnnlm

Writes ``benchmarks/results/learner_neighbourhood.json`` and prints a summary (ms, simulated).
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
from devplace.learn.env import ORDERS, PlacementEnv
from devplace.learn.features import unit_majority
from devplace.placers._moves import Units
from devplace.transforms.coplacement import colocation_units

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learned_placers import WARM_STARTS, graph_and_cluster  # noqa: E402
from reproduce_papers import RESULTS  # noqa: E402


def measure(name: str, orders: tuple[str, ...], spans: tuple[int, ...]) -> dict:
    from devplace.learn.colocrl import colocrl_groups
    from devplace.learn.train import layer_labels, module_labels, warm_start

    graph, cluster = graph_and_cluster(name)
    n_dev = cluster.n_devices
    units = Units.from_labels(graph, colocation_units(graph))     # what the learners' environment moves
    groups = colocrl_groups(graph, 256, single_consumer=False)
    group_of_unit = np.empty(units.n_units, dtype=np.int64)
    group_of_unit[units.unit_of] = groups.unit_of
    members = [np.flatnonzero(group_of_unit == g) for g in range(groups.n_units)]
    env = PlacementEnv(graph, cluster, units.unit_of, orders)
    candidates = warm_start("neighbourhood", graph, cluster, WARM_STARTS, 0)
    whole = PlacementEnv(graph, cluster, np.arange(graph.n_ops), orders)
    scored = {spec: whole.evaluate(d[None]) for spec, d in candidates.items()}
    spec = min((s for s in scored if not scored[s].oom[0]), key=lambda s: scored[s].step_us[0])
    centre = unit_majority(candidates[spec], units.unit_of, n_dev, units.n_units)   # held per unit, as the learners do
    centre_us = float(env.evaluate(centre[None]).step_us[0])
    searched = dp.place(graph, cluster, algo="sim-search", seed=0)
    good = np.asarray(searched.devices, dtype=np.int64)
    target = unit_majority(good, units.unit_of, n_dev, units.n_units)
    entry = {"ops": graph.n_ops, "units": units.n_units, "groups": groups.n_units, "orders": list(orders),
             "warm_start": spec, "warm_start_us": float(scored[spec].step_us[0]), "centre_us": centre_us,
             "sim_search_us": dp.simulate(graph, cluster, searched).step_time_us,
             "sim_search_found_by": searched.options.get("found_by"), "target_us": float(env.evaluate(target[None]).step_us[0]),
             "units_differing": int(np.count_nonzero(target != centre)),
             "groups_differing": len(np.unique(group_of_unit[target != centre])), "load_average": os.getloadavg(),
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    sim = dp.Simulator(graph, cluster)
    entry["orders_of_sim_search_devices"] = {
        order: float(PlacementEnv(graph, cluster, np.arange(graph.n_ops), (order,)).evaluate(good[None]).step_us[0])
        for order in ORDERS} | {"its own": sim.run(searched).step_time_us}
    began = time.perf_counter()
    layer = layer_labels(graph, units.unit_of)
    for label, lengths in (("one_moves", (1,)), ("run_moves", spans), ("layer_moves", (1,))):
        rows, moved = [], []
        for first in range(groups.n_units):
            for length in lengths:
                if first + length > groups.n_units:
                    break
                chosen = np.concatenate(members[first:first + length])
                if label == "layer_moves":     # the group with the rest of its layers (option layer_moves)
                    chosen = np.flatnonzero(np.isin(layer, layer[chosen]))
                for device in range(n_dev):
                    row = centre.copy()
                    row[chosen] = device
                    if (row != centre).any():
                        rows.append(row)
                        moved.append((first, length, device))
        outcomes = env.evaluate(np.array(rows))
        steps = np.where(outcomes.oom, np.inf, outcomes.step_us)
        best = int(np.argmin(steps))
        entry[label] = {"moves": len(rows), "faster": int(np.count_nonzero(steps < centre_us)),
                        "faster_by_2pct": int(np.count_nonzero(steps < 0.98 * centre_us)),
                        "fastest_us": float(steps[best]), "median_us": float(np.median(steps)),
                        "fastest_move": moved[best]}
    row, path = centre.copy(), []
    for group in np.unique(group_of_unit[target != centre]):    # in step order
        row[members[group]] = target[members[group]]
        path.append(float(env.evaluate(row[None]).step_us[0]))
    entry["towards"] = {"steps": len(path), "max_us": max(path, default=centre_us),
                        "path_us": path[:: max(1, len(path) // 40)] + path[-1:]}
    modules = module_labels(graph, units.unit_of)
    if modules is not None:
        entry |= module_neighbourhood(env, centre, centre_us, modules, target, n_dev)
    entry["neighbourhood_s"] = round(time.perf_counter() - began, 1)
    return entry


def module_neighbourhood(env: PlacementEnv, centre: np.ndarray, centre_us: float, modules: np.ndarray,
                         target: np.ndarray, n_dev: int) -> dict:
    """Option module_moves' neighbourhood of ``centre`` (per unit), a greedy descent over it, and ``target``
    (sim-search's placement per unit) with each module on its majority device."""
    def moves(row):
        out = [(m, d) for m in range(int(modules.max()) + 1) for d in range(n_dev)
               if (row[modules == m] != d).any()]
        rows = np.array([np.where(modules == m, d, row) for m, d in out])
        return out, env.evaluate(rows).step_us

    out, steps = moves(centre)
    entry = {"module_moves": {"modules": int(modules.max()) + 1, "moves": len(out),
                              "faster": int(np.count_nonzero(steps < centre_us)),
                              "fastest_us": float(steps.min()), "fastest_move": out[int(np.argmin(steps))]}}
    row, row_us, path = centre.copy(), centre_us, []
    while True:
        out, steps = moves(row)
        if steps.min() >= row_us:
            break
        module, device = out[int(np.argmin(steps))]
        row, row_us = np.where(modules == module, device, row), float(steps.min())
        path.append((module, device, row_us))
    projected = unit_majority(target, modules, n_dev)[modules]
    return entry | {"module_descent": {"moves": len(path), "ends_us": row_us, "path": path},
                    "sim_search_on_modules_us": float(env.evaluate(projected[None]).step_us[0])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gnmt4,rnnlm")
    parser.add_argument("--orders", default="topological,upward-rank")
    parser.add_argument("--spans", default="4,16", help="lengths of the runs of consecutive groups moved whole")
    args = parser.parse_args(argv)
    path = RESULTS / "learner_neighbourhood.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        results[name] = measure(name, tuple(args.orders.split(",")), tuple(int(x) for x in args.spans.split(",")))
        write_text_atomic(path, json.dumps(results, indent=1) + "\n")
        print(name, json.dumps(results[name], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
