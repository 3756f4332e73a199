"""Round 50: the ceiling of every bound proven from F1-F4 alone on a zoo row (GNMT unless named) at a memory fraction.

Such a bound holds under any of the simulator's link models, since F1-F4 hold under each (F2: a transfer
begins at its producer's finish or later and lasts latency + bytes / bandwidth; queues only add). The
relaxation the bounds read (fastest times, cut costs, memory) does not depend on the link model. So a
valid placement's step time under the ``pipelined`` model (one channel per ordered pair, held for
bytes / bandwidth only: the least queueing the simulator has) caps every such bound on the
``sequential`` cluster. This runs sim-search under ``pipelined`` (seed, default budget), simulates its
placement under both models, and writes the figures to a JSON. Run from the checkout's root:
    PYTHONPATH=$PWD python benchmarks/gnmtbound_ceiling.py SEED OUT.json [FRACTION=0.3] [MODEL=pipelined] [ZOO=gnmt]
Round 53 names the other zoo rows with ZOO (inception_v3, rnnlm, resnet50, nasnet, transformer)."""
import dataclasses, json, sys, time
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET, cached_graph, cache_path
import devplace as dp
from devplace.placement import Placement

seed, out = int(sys.argv[1]), sys.argv[2]
frac = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
model = sys.argv[4] if len(sys.argv) > 4 else "pipelined"
zoo = f"zoo:{sys.argv[5] if len(sys.argv) > 5 else 'gnmt'}"
print(dp.__file__, cache_path(zoo), flush=True)
g = cached_graph(zoo)
sequential = dp.load_cluster(PRESET).with_memory_fraction(frac)
relaxed = dataclasses.replace(sequential, comm_model=model)
t0 = time.time()
p = dp.place(g, relaxed, algo="sim-search", seed=seed)
wall_s = time.time() - t0
placement = Placement(devices=p.devices, priority=p.priority)
under = {name: dp.simulate(g, c, placement) for name, c in ((model, relaxed), (sequential.comm_model, sequential))}
d = {"zoo": zoo, "seed": seed, "fraction": frac, "model": model, "step_us": p.options["step_us"], "evals": p.options["evals"],
     "found_by": p.options.get("found_by"), "wall_s": wall_s,
     "simulated_us": {k: r.step_time_us for k, r in under.items()}, "fits": {k: bool(r.fits) for k, r in under.items()},
     "peaks_GiB": [float(x) / 2**30 for x in under[model].peak_memory_bytes],
     "devices": [int(x) for x in p.devices], "priority": None if p.priority is None else [float(x) for x in p.priority]}
json.dump(d, open(out, "w"))
print({k: d[k] for k in ("seed", "fraction", "model", "step_us", "evals", "found_by", "wall_s", "simulated_us", "fits")},
      flush=True)
