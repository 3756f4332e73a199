"""Round 49: sim-search on the pruned RNNLM graph at 30% memory, annealing over the co-placement groups of
main's (unpruned) graph, patched in this process only (devplace/ untouched), as round 46's
prunecost_oldgroups.py did for ResNet-50. Both graphs have the same ops in the same order.
    PYTHONPATH=$PWD python benchmarks/rnnpruned_oldgroups.py SEED PRUNED.json MAIN.json OUT.json [CALLER]
With CALLER (a file name, e.g. search.py: sim-search's annealing units; __init__.py: the seeds' Baechi
co-placement coarsening in devplace/transforms) only calls made from that file get main's groups."""
import json
import sys
import time

sys.path.insert(0, "benchmarks")
import devplace as dp  # noqa: E402
import devplace.transforms as transforms_mod  # noqa: E402
from devplace.transforms.coplacement import coplacement_groups  # noqa: E402
from reproduce_papers import PRESET  # noqa: E402

seed, new_path, old_path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
caller = sys.argv[5] if len(sys.argv) > 5 else None
new, old = dp.load_graph(new_path), dp.load_graph(old_path)
assert old.names == new.names
old_groups = coplacement_groups(old)
calls = []


def patched(graph, **kw):
    mine = graph.n_ops == new.n_ops and graph.names == new.names and not kw and \
        (caller is None or sys._getframe(1).f_code.co_filename.endswith(caller))
    calls.append(mine)
    return old_groups if mine else coplacement_groups(graph, **kw)


transforms_mod.coplacement_groups = patched
t0 = time.time()
p = dp.place(new, dp.load_cluster(PRESET).with_memory_fraction(0.3), algo="sim-search", seed=seed)
keep = ("evals", "found_by", "capped_step_us", "grad_blocks", "recurrence", "order_descent")
d = {"seed": seed, "graph": new_path, "groups_of": old_path, "caller": caller, "step_ms": p.options["step_us"] / 1e3,
     "wall_s": round(time.time() - t0, 1), "patched_calls": calls, "report": {k: p.options.get(k) for k in keep}}
json.dump(d, open(out, "w"), default=str, indent=1)
print(json.dumps({k: d[k] for k in ("seed", "step_ms", "wall_s")}), d["report"]["evals"], flush=True)
