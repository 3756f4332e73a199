"""Round 48: a placement saved by tfpruned_run.py (devices, priority, names), carried over op by op by name to
another cached graph and simulated there at a memory fraction (default 0.3) of baechi-4x2080:
    python benchmarks/tfpruned_carry.py RESULT.json GRAPH.json [FRACTION=0.3]"""
import json, sys
import numpy as np
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET
import devplace as dp
from devplace.placement import Placement

res, g = json.load(open(sys.argv[1])), dp.load_graph(sys.argv[2])
frac = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
pos = {n: i for i, n in enumerate(res["names"])}
order = np.array([pos[n] for n in g.names])
devices = np.array(res["devices"])[order]
priority = None if res["priority"] is None else np.array(res["priority"])[order]
r = dp.simulate(g, dp.load_cluster(PRESET).with_memory_fraction(frac), Placement(devices=devices, priority=priority))
print(json.dumps({"from": res["step_us"] / 1e3, "step_ms": r.step_time_us / 1e3, "fits": bool(r.fits),
                  "peaks_GiB": [round(float(x) / 2**30, 3) for x in r.peak_memory_bytes]}))
