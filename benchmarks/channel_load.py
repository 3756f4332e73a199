"""Round 56: how busy each GPU's one channel is in sim-search's best placement of a zoo row (baechi-4x2080,
`sequential` links: a transfer holds its sender's and its receiver's channel for latency + bytes / bandwidth).

Writes, per device, its compute (busy) time, its channel's load (the summed durations of the transfers it sends or
receives) and how many messages it sends and receives, beside the step time; and the placement itself, so that a
bound can be checked against it later. Also the same placement's step under each of the simulator's link models,
and what its critical path is made of (`SimResult.critical_path_split_us`). Run from the checkout's root (SAVED: a
JSON this wrote, whose placement is read instead of searching):
    PYTHONPATH=$PWD python benchmarks/channel_load.py MODEL SEED OUT.json [FRACTION=0.3] [SAVED]"""
import dataclasses, json, sys, time
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET, cached_graph
import devplace as dp
from devplace.fileio import write_text_atomic
from devplace.placement import Placement

model, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fraction = float(sys.argv[4]) if len(sys.argv) > 4 else 0.3
g = cached_graph(f"zoo:{model}")
cluster = dp.load_cluster(PRESET).with_memory_fraction(fraction)
t0 = time.time()
if len(sys.argv) > 5:
    saved = json.load(open(sys.argv[5]))
    p = Placement(devices=saved["devices"], priority=saved["priority"])
    wall_s = saved["wall_s"]    # the search's, when that JSON was written
else:
    p = dp.place(g, cluster, algo="sim-search", seed=seed)
    wall_s = time.time() - t0
placement = Placement(devices=p.devices, priority=p.priority)
sim = dp.simulate(g, cluster, placement)
by_model = {m: dp.simulate(g, dataclasses.replace(cluster, comm_model=m), placement).step_time_us / 1e3
            for m in ("parallel", "sequential", "duplex", "pipelined")}
n = cluster.n_devices
duration_us = sim.transfer_end_us - sim.transfer_start_us
channel_us = [float(duration_us[(sim.transfer_src == d) | (sim.transfer_dst == d)].sum()) for d in range(n)]
messages = [int(((sim.transfer_src == d) | (sim.transfer_dst == d)).sum()) for d in range(n)]
record = {"model": model, "seed": seed, "fraction": fraction, "wall_s": wall_s, "step_ms": sim.step_time_us / 1e3,
          "latency_us": float(cluster.latency_us[0, 1]) if n > 1 else None,
          "compute_ms": [float(b) / 1e3 for b in sim.busy_us], "channel_ms": [c / 1e3 for c in channel_us],
          "messages": messages, "transfers": int(len(duration_us)),
          "transfer_ms_total": float(duration_us.sum()) / 1e3, "critical_path_ops": int(len(sim.critical_path)),
          "step_ms_same_placement_by_link_model": by_model,
          "critical_path_ms": {part: us / 1e3 for part, us in sim.critical_path_split_us.items()},
          "devices": [int(d) for d in p.devices], "priority": [float(x) for x in p.priority]}
write_text_atomic(out, json.dumps(record))
print(json.dumps({k: v for k, v in record.items() if k not in ("devices", "priority")}), flush=True)
