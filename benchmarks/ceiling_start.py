"""Round 56: sim-search of a zoo row at 30% memory (baechi-4x2080, `sequential`, seed 0) whose only start is the
placement of its pipelined ceiling (round 53, `results/bound_ceilings/`): the seeds, pipeline starts and cheapest-cut
starts are replaced by that one placement, so the annealing rounds begin from it; the tracks after them run as usual
(the layer search and descents, where layers interleave, still lay out starts of their own, layer by layer and the
expert's). Run from the checkout's root:
    PYTHONPATH=$PWD python benchmarks/ceiling_start.py MODEL OUT.json"""
import json, sys, time, numpy as np
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET, cached_graph
import devplace as dp
import devplace.portfolio.sim_search as ss
from devplace.fileio import write_text_atomic

model, out = sys.argv[1], sys.argv[2]
saved = json.load(open(f"benchmarks/results/bound_ceilings/ceiling_{model}_s0.json"))
g = cached_graph(f"zoo:{model}")
c = dp.load_cluster(PRESET).with_memory_fraction(0.3)
def only_ceiling(search):
    search.consider(np.asarray(saved["devices"], np.int64), np.asarray(saved["priority"], float), "pipelined ceiling")
ss._run_seeds = only_ceiling
ss._pipeline_starts = lambda s: None
ss._cheap_cut_starts = lambda s: None
t0 = time.time()
p = dp.place(g, c, algo="sim-search", seed=0)
d = {"model": model, "step_ms": p.options["step_us"] / 1e3, "evals": p.options["evals"], "wall_s": time.time() - t0,
     "found_by": p.options["found_by"], "best_seed_ms": p.options["best_seed_step_us"] / 1e3}
write_text_atomic(out, json.dumps(d))
print(d, flush=True)
