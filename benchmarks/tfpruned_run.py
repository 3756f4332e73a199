"""Round 48: one sim-search of the zoo Transformer (baechi-4x2080) on a given cached graph, its result to a JSON.
MAIN = benchmarks/.cache/zoo_transformer.74a0573886444e10.json (main's capture), PRUNED = ...d26bc03d02db0938.json
(with the write-after-read pruning). Run from the checkout's root, PYTHONPATH=$PWD:
    python benchmarks/tfpruned_run.py GRAPH.json SEED OUT.json [FRACTION=0.3] [KEY=VALUE ...]
KEY=VALUE are sim-search options (Python literals, e.g. virtual_caps=(0.75,0.5))."""
import ast, json, sys, time
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET
import devplace as dp
from devplace.placement import Placement


def _value(s):
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError):
        return s


path, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
frac = float(sys.argv[4]) if len(sys.argv) > 4 else 0.3
kw = dict((k, _value(v)) for k, v in (a.split("=", 1) for a in sys.argv[5:]))
g = dp.load_graph(path)
t0 = time.time()
p = dp.place(g, dp.load_cluster(PRESET).with_memory_fraction(frac), algo="sim-search", seed=seed, **kw)
r = dp.simulate(g, dp.load_cluster(PRESET).with_memory_fraction(0.3), Placement(devices=p.devices, priority=p.priority))
d = {"graph": path, "seed": seed, "fraction": frac, "kw": kw, "step_us": p.options["step_us"],
     "evals": p.options["evals"], "wall_s": time.time() - t0, "at30_step_us": r.step_time_us, "at30_fits": r.fits,
     "peaks_GiB": [float(x) / 2**30 for x in r.peak_memory_bytes], "options": p.options,
     "names": list(g.names), "devices": [int(x) for x in p.devices],
     "priority": None if p.priority is None else [float(x) for x in p.priority]}
json.dump(d, open(out, "w"), default=str)
print({k: d[k] for k in ("seed", "fraction", "kw", "step_us", "evals", "wall_s", "at30_fits")},
      {k: p.options.get(k) for k in ("found_by", "best_seed")}, flush=True)
