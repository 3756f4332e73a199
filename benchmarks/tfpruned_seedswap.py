"""Round 48, a diagnostic: the zoo Transformer's sim-search at 30% on the pruned graph (write-after-read pruning)
with its metis+fwd seed replaced by the one the same seed placer gives on main's graph (carried over by op name).
On main's graph METIS's acyclic repair of the forward-only partition moves 0 units (seed 429.349 ms); on the
pruned graph, which holds less memory, another repair candidate fits and wins (439 units moved, 438.694 ms).
Does the search from main's seed walk main's path? Run from the checkout's root, PYTHONPATH=$PWD:
    python benchmarks/tfpruned_seedswap.py MAIN.json PRUNED.json SEED OUT.json"""
import json, sys, time
import numpy as np
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET
import devplace as dp
import devplace.portfolio.sim_search.seeds as seeds
from devplace.placement import Placement

main, pruned = dp.load_graph(sys.argv[1]), dp.load_graph(sys.argv[2])
seed, out = int(sys.argv[3]), sys.argv[4]
cluster = dp.load_cluster(PRESET).with_memory_fraction(0.3)
pos = {n: i for i, n in enumerate(main.names)}
order = np.array([pos[n] for n in pruned.names])
original = seeds.place_spec


def place_spec(graph, cluster_, algo, seed, check):
    if algo == "metis+fwd" and graph.n_edges == pruned.n_edges:
        placement = original(main, cluster_, algo=algo, seed=seed, check=check)
        return Placement(devices=placement.devices[order], priority=None)
    return original(graph, cluster_, algo=algo, seed=seed, check=check)


seeds.place_spec = place_spec
t0 = time.time()
p = dp.place(pruned, cluster, algo="sim-search", seed=seed)
d = {"seed": seed, "step_us": p.options["step_us"], "evals": p.options["evals"], "wall_s": time.time() - t0,
     "options": p.options, "names": list(pruned.names), "devices": [int(x) for x in p.devices],
     "priority": None if p.priority is None else [float(x) for x in p.priority]}
json.dump(d, open(out, "w"), default=str)
print({k: d[k] for k in ("seed", "step_us", "evals", "wall_s")}, p.options["found_by"], p.options["best_seed"],
      p.options["seed_results"].get("metis+fwd"), flush=True)
