"""Round 46: one sim-search of zoo ResNet-50 (baechi-4x2080) at a memory fraction, its result and report to a JSON.
The graph is the one cached_graph picks for the devplace on PYTHONPATH (main: without the write-after-read pruning;
main with `git revert 7f422d6`: with it). Run from the checkout's root:
    PYTHONPATH=<checkout> python benchmarks/prunecost_run.py SEED OUT.json [FRACTION=0.3] [COARSE_SHARE]"""
import json, sys, time
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET, cached_graph, cache_path
import devplace as dp
from devplace.placement import Placement

seed, out = int(sys.argv[1]), sys.argv[2]
frac = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
kw = {"coarse_share": float(sys.argv[4])} if len(sys.argv) > 4 else {}
print(dp.__file__, cache_path("zoo:resnet50"), flush=True)
g = cached_graph("zoo:resnet50")
t0 = time.time()
p = dp.place(g, dp.load_cluster(PRESET).with_memory_fraction(frac), algo="sim-search", seed=seed, **kw)
r = dp.simulate(g, dp.load_cluster(PRESET).with_memory_fraction(0.3), Placement(devices=p.devices, priority=p.priority))
d = {"seed": seed, "fraction": frac, "kw": kw, "step_us": p.options["step_us"], "evals": p.options["evals"],
     "wall_s": time.time() - t0, "at30_step_us": r.step_time_us, "at30_fits": r.fits,
     "peaks_GiB": [float(x) / 2**30 for x in r.peak_memory_bytes], "options": p.options,
     "devices": [int(x) for x in p.devices],
     "priority": None if p.priority is None else [float(x) for x in p.priority]}
json.dump(d, open(out, "w"), default=str)
print({k: d[k] for k in ("seed", "fraction", "kw", "step_us", "evals", "wall_s", "at30_fits")},
      {k: p.options.get(k) for k in ("found_by", "best_seed")}, p.options.get("coarse_mip"), flush=True)
