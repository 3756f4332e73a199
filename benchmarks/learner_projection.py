"""Can the learners' unit spaces express a good placement? (BENCHMARKS.md, "Learning placers", issue 12.)

Sim-search's placement of each model is projected onto each learner's groups (every group on the device
most of its ops have, ``unit_majority``) and simulated in three schedule orders: the topological one (the
simulator's default, the only one the learners' environment used up to round 3), the faster of topological
and upward-rank (option ``schedule_orders=topological,upward-rank``, ``learn.env``) and sim-search's own
(which sim-search searches). A projection much slower than sim-search means
the learner, moving whole groups, cannot reach that placement whatever its search; a close one means
the search is what falls short. Groupings measured:

- ``colocrl``: ColocRL's groups (colocation + single-consumer chains, capped at ``max_groups``, 256);
- ``colocrl-colocation``: ColocRL's groups with option ``single_consumer=False`` (colocation groups only);
- ``hp-warm``: the grouping HP clones from its warm start (``hp.grouping_of``, the fastest of expert,
  m-SCT+opt and single), which ``deviate_from=best`` then moves group by group;
- ``hp-own``: the grouping ``grouping_of`` gives sim-search's own placement (what a Grouper could learn;
  exact by construction, each group on one device);
- ``slices-N``: N equal runs of colocation units in step order (finer units, for comparison);
- ``mars-N``: Mars's units (ColocRL's groups before the cap, consecutive ones merged to N: ``mars_units``);
- ``mars-along-warm-N``: the same, merged without crossing a device change of the warm start
  (``capped_units_along``, option ``units_along_init`` of Mars).

Each grouping also holds the warm start as closely as it can (``warm_both_orders_us``): a learner whose
units cannot hold its warm start samples only its projection.

    .venv/bin/python benchmarks/learner_projection.py --models gnmt_layers_training,inception_v3,gnmt4

Writes ``benchmarks/results/learner_projection.json`` and prints a markdown table (ms, simulated).
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
from devplace.learn.features import unit_majority
from devplace.learn.env import PlacementEnv
from devplace.learn.hp import grouping_of
from devplace.placers._moves import Units
from devplace.transforms.coplacement import colocation_units

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learned_placers import MODELS, WARM_STARTS, graph_and_cluster  # noqa: E402
from reproduce_papers import RESULTS  # noqa: E402

SLICES = (256, 1024)


def groupings(graph, cluster, warm_devices: np.ndarray, good_devices: np.ndarray) -> dict[str, np.ndarray]:
    """Per grouping name, the group of every op."""
    from devplace.learn.colocrl import ColocRLOptions, colocrl_groups
    from devplace.learn.features import capped_units_along
    from devplace.learn.hp import HPOptions
    from devplace.learn.mars import mars_units
    from devplace.transforms.coplacement import coplacement_groups

    ops = Units.from_labels(graph, colocation_units(graph))
    n_hp = max(1, min(HPOptions().max_groups, 20 * cluster.n_devices))
    out = {"colocrl": colocrl_groups(graph, ColocRLOptions().max_groups).unit_of,
           "colocrl-colocation": colocrl_groups(graph, ColocRLOptions().max_groups, single_consumer=False).unit_of}
    for name, devices in (("hp-warm", warm_devices), ("hp-own", good_devices)):
        per_unit = unit_majority(devices, ops.unit_of, cluster.n_devices, ops.n_units)
        out[name] = grouping_of(per_unit, n_hp, cluster.n_devices)[0][ops.unit_of]
    for n in SLICES:
        out[f"slices-{n}"] = (np.arange(ops.n_units) * min(n, ops.n_units) // ops.n_units)[ops.unit_of]
        out[f"mars-{n}"] = mars_units(graph, n).unit_of
        labels = coplacement_groups(graph, single_consumer=True, mirror=False)
        out[f"mars-along-warm-{n}"] = capped_units_along(graph, labels, n, warm_devices).unit_of
    return out


def project(devices: np.ndarray, group_of: np.ndarray, n_devices: int) -> np.ndarray:
    """Every op on its group's majority device."""
    return unit_majority(devices, group_of, n_devices)[group_of]


def measure(name: str) -> dict:
    from devplace.learn.train import warm_start

    graph, cluster = graph_and_cluster(name)
    sim = dp.Simulator(graph, cluster)
    both = PlacementEnv(graph, cluster, np.arange(graph.n_ops), ("topological", "upward-rank"))
    began = time.perf_counter()
    searched = dp.place(graph, cluster, algo="sim-search", seed=0)
    search_s = time.perf_counter() - began
    good, order = np.asarray(searched.devices, dtype=np.int64), searched.priority
    starts = {spec: sim.run(d) for spec, d in warm_start("projection", graph, cluster, WARM_STARTS, 0).items()}
    fitting = {spec: r for spec, r in starts.items() if not r.oom_devices}
    warm_spec = min(fitting, key=lambda s: fitting[s].step_time_us)
    warm = np.asarray(warm_start("projection", graph, cluster, warm_spec, 0)[warm_spec])
    ops = Units.from_labels(graph, colocation_units(graph))
    per_unit = unit_majority(good, ops.unit_of, cluster.n_devices, ops.n_units)
    entry = {"ops": graph.n_ops, "colocation_units": ops.n_units, "cluster": cluster.name,
             "sim_search_us": dp.simulate(graph, cluster, searched).step_time_us, "sim_search_s": round(search_s, 1),
             "sim_search_devices_us": sim.run(good).step_time_us,
             "sim_search_devices_both_orders_us": float(both.evaluate(good[None]).step_us[0]),
             "sim_search_runs": int(1 + np.count_nonzero(np.diff(per_unit))),
             "warm_start": warm_spec, "warm_start_us": fitting[warm_spec].step_time_us,
             "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "projections": {}}
    for label, group_of in groupings(graph, cluster, warm, good).items():
        devices = project(good, group_of, cluster.n_devices)
        result, ordered = sim.run(devices), sim.run(dp.Placement(devices=devices, priority=order))
        faster = both.evaluate(devices[None])
        held = both.evaluate(project(warm, group_of, cluster.n_devices)[None])
        entry["projections"][label] = {"groups": int(group_of.max()) + 1,
                                       "warm_both_orders_us": None if held.oom[0] else float(held.step_us[0]),
                                       "step_us": None if result.oom_devices else result.step_time_us,
                                       "both_orders_us": None if faster.oom[0] else float(faster.step_us[0]),
                                       "sim_search_order_us": None if ordered.oom_devices else ordered.step_time_us}
    return entry


def table(results: dict) -> str:
    labels = sorted({label for e in results.values() for label in e["projections"]})
    head = ["model", "sim-search (its order)", "its devices: topological; both orders (runs of units)", "warm start",
            *labels]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, e in results.items():
        base = e["sim_search_us"]

        def ms(us):
            return "OOM" if us is None else f"{us / 1e3:.2f} ({100 * (us / base - 1):+.1f}%)"

        def cell(p):
            if p is None:
                return "-"
            return (f"{p['groups']} groups: {ms(p['step_us'])}; both {ms(p['both_orders_us'])}; "
                    f"sim-search's {ms(p['sim_search_order_us'])}; warm start held, both orders "
                    f"{ms(p.get('warm_both_orders_us'))}")
        lines.append("| " + " | ".join([MODELS[name][0], f"{base / 1e3:.2f}",
                                        f"{ms(e['sim_search_devices_us'])}; {ms(e['sim_search_devices_both_orders_us'])} "
                                        f"({e['sim_search_runs']})",
                                        f"{e['warm_start']} {e['warm_start_us'] / 1e3:.2f}",
                                        *[cell(e["projections"].get(label)) for label in labels]]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gnmt_layers_training,inception_v3,gnmt4,rnnlm")
    args = parser.parse_args(argv)
    path = RESULTS / "learner_projection.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        results[name] = measure(name)
        write_text_atomic(path, json.dumps(results, indent=1) + "\n")
        print(table({name: results[name]}), flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
