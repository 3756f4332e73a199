"""Round 50: every certified bound of zoo GNMT at a memory fraction under each link model, to a JSON.

The bounds proven from F1-F4 alone read only the relaxation (fastest times, cut costs, memory), which
no link model changes; ``memory_path_us`` and ``turn_cut_us`` also read the model (which transfers
share a channel). Run from the checkout's root:
    PYTHONPATH=$PWD python benchmarks/gnmtbound_models.py OUT.json [FRACTION=0.3]"""
import dataclasses, json, sys, time
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET, cached_graph
import devplace as dp
from devplace.bounds import lower_bounds
from devplace.sim.channels import COMM_MODELS

out = sys.argv[1]
frac = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
g = cached_graph("zoo:gnmt")
base = dp.load_cluster(PRESET).with_memory_fraction(frac)
rows = {}
for model in COMM_MODELS:
    t0 = time.time()
    b = lower_bounds(g, dataclasses.replace(base, comm_model=model))
    rows[model] = b | {"seconds": time.time() - t0}
    print(model, {k: (round(v / 1e3, 3) if isinstance(v, float) else v) for k, v in b.items()}, f"{time.time() - t0:.1f} s",
          flush=True)
json.dump({"fraction": frac, "preset_model": base.comm_model, "bounds": rows}, open(out, "w"), indent=1)
