"""Round 46: sim-search on ResNet-50 WITH the write-after-read pruning, but annealing over the co-placement groups
of the graph WITHOUT it (patched in this process only; devplace/ is untouched). Run from a checkout with the pruning:
    PYTHONPATH=$PWD python benchmarks/prunecost_oldgroups.py SEED OLD_GRAPH.json OUT.json"""
import json, sys, time
sys.path.insert(0, "benchmarks")
import devplace as dp
from reproduce_papers import PRESET, cached_graph, cache_path
import devplace.transforms as transforms_mod
from devplace.transforms.coplacement import coplacement_groups

seed, old_path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
old = dp.load_graph(old_path)
new = cached_graph("zoo:resnet50")
print(cache_path("zoo:resnet50"), flush=True)
assert old.names == new.names
old_groups = coplacement_groups(old)
def patched(graph, **kw):
    return old_groups if graph.n_ops == new.n_ops and graph.names == new.names else coplacement_groups(graph, **kw)
calls = []
def counted(graph, **kw):
    r = patched(graph, **kw); calls.append(r is old_groups); return r
transforms_mod.coplacement_groups = counted
t0 = time.time()
p = dp.place(new, dp.load_cluster(PRESET).with_memory_fraction(0.3), algo="sim-search", seed=seed)
d = {"seed": seed, "old_groups": True, "step_us": p.options["step_us"], "evals": p.options["evals"],
     "wall_s": time.time() - t0, "patched_calls": calls, "coarse_units": p.options.get("coarse_units"), "options": p.options,
     "devices": [int(x) for x in p.devices],
     "priority": None if p.priority is None else [float(x) for x in p.priority]}
json.dump(d, open(out, "w"), default=str)
print({k: d[k] for k in ("seed", "step_us", "evals", "wall_s", "coarse_units")},
      {k: p.options.get(k) for k in ("found_by", "best_seed", "best_seed_step_us")}, flush=True)
