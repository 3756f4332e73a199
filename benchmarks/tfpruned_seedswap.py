"""Round 48, a diagnostic: the zoo Transformer's sim-search on the pruned graph (write-after-read pruning) with some
of main's inputs patched in (this process only; devplace/ is untouched):
- with --seed: the metis+fwd seed replaced by the one the same seed placer gives on main's graph (carried over by op name).
  On main's graph METIS's acyclic repair of the forward-only partition moves 0 units (seed 429.349 ms at 30%); on the
  pruned graph, which holds less memory, another repair candidate fits and wins (439 units moved, 438.694 ms);
- with --groups: also main's co-placement groups (300 on main, 298 on the pruned graph) as the search's coarse units.
Run from the checkout's root, PYTHONPATH=$PWD:
    python benchmarks/tfpruned_seedswap.py MAIN.json PRUNED.json SEED OUT.json [FRACTION=0.3] [--seed] [--groups] [KEY=VALUE ...]
KEY=VALUE are sim-search options (Python literals), as in tfpruned_run.py."""
import ast, json, sys, time
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET
import devplace as dp
import devplace.portfolio.sim_search.seeds as seeds
import devplace.transforms as transforms
from devplace.placement import Placement
from devplace.transforms.coplacement import coplacement_groups

main, pruned = dp.load_graph(sys.argv[1]), dp.load_graph(sys.argv[2])
seed, out = int(sys.argv[3]), sys.argv[4]
rest = sys.argv[5:]
frac = float(rest.pop(0)) if rest and not rest[0].startswith("--") and "=" not in rest[0] else 0.3
old_groups, old_seed = "--groups" in rest, "--seed" in rest
kw = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in rest if "=" in a)}
cluster = dp.load_cluster(PRESET).with_memory_fraction(frac)
assert main.names == pruned.names
original = seeds.place_spec


def is_pruned(graph):
    return graph.n_ops == pruned.n_ops and graph.n_edges == pruned.n_edges and graph.names == pruned.names


def place_spec(graph, cluster_, algo, seed, check):
    if algo == "metis+fwd" and is_pruned(graph):
        placement = original(main, cluster_, algo=algo, seed=seed, check=check)
        return Placement(devices=placement.devices, priority=None)     # same op order on both graphs
    return original(graph, cluster_, algo=algo, seed=seed, check=check)


if old_seed:
    seeds.place_spec = place_spec
if old_groups:
    main_groups = coplacement_groups(main)
    transforms.coplacement_groups = lambda graph, **kw: main_groups if is_pruned(graph) else coplacement_groups(graph, **kw)
t0 = time.time()
p = dp.place(pruned, cluster, algo="sim-search", seed=seed, **kw)
r = dp.simulate(pruned, dp.load_cluster(PRESET).with_memory_fraction(0.3), Placement(devices=p.devices, priority=p.priority))
d = {"seed": seed, "fraction": frac, "old_seed": old_seed, "old_groups": old_groups, "kw": kw, "step_us": p.options["step_us"],
     "evals": p.options["evals"], "wall_s": time.time() - t0, "at30_fits": r.fits, "options": p.options,
     "names": list(pruned.names), "devices": [int(x) for x in p.devices],
     "priority": None if p.priority is None else [float(x) for x in p.priority]}
json.dump(d, open(out, "w"), default=str)
print({k: d[k] for k in ("seed", "fraction", "old_seed", "old_groups", "kw", "step_us", "evals", "wall_s", "at30_fits")},
      p.options["found_by"], p.options["best_seed"], p.options["seed_results"].get("metis+fwd"), flush=True)
