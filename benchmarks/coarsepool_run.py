"""Round 47: one sim-search of a zoo model (baechi-4x2080) at 30% memory, its result and coarse MIP report to a JSON.
Run from the checkout's root (the graph is the one cached_graph picks for this checkout's capture code):
    PYTHONPATH=$PWD python benchmarks/coarsepool_run.py MODEL SEED OUT.json [OPTION=VALUE ...]
OPTION=VALUE pairs are sim-search options (VALUE in JSON), but fraction=F, the devices' memory fraction (0.3)."""
import json, os, sys, time
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET, cached_graph, cache_path
import devplace as dp
from devplace.fileio import write_text_atomic

model, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kw = {k: json.loads(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}
fraction = kw.pop("fraction", 0.3)
g = cached_graph(f"zoo:{model}")
t0 = time.time()
p = dp.place(g, dp.load_cluster(PRESET).with_memory_fraction(fraction), algo="sim-search", seed=seed, **kw)
d = {"model": model, "graph": os.path.basename(str(cache_path(f"zoo:{model}"))), "seed": seed, "fraction": fraction, "kw": kw,
     "step_ms": p.options["step_us"] / 1e3, "evals": p.options["evals"], "wall_s": time.time() - t0,
     "load": os.getloadavg(), "found_by": p.options.get("found_by"), "coarse_mip": p.options.get("coarse_mip")}
write_text_atomic(out, json.dumps(d, default=str, indent=1))
print(json.dumps(d, default=str), flush=True)
