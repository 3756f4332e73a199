"""Round 45 (benchmarks/rounds/how-far-from-optimal.md): a 2-layer MLP classifier with foreach Adam: which zero-byte edges run from forward ops
into update ops, and why (the fx nodes, their storage keys and owners), and how much memory the
one-GPU simulation still holds when the first update starts.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/zeropin_tiny.py
"""
import numpy as np
import torch
import torch.nn.functional as F

import devplace as dp
from devplace.graph import Role
from devplace.torchcapture import capture
from devplace.torchcapture.memory import mutated_args, storage_key, storage_map, tensors_in

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4096))
x, y = torch.randn(64, 16), torch.randint(0, 4096, (64,))
g, traced = capture(model, x, lambda out, y: F.cross_entropy(out, y), cluster="baechi-4x2080",
                    targets=(y,), return_trace=True)
owner = storage_map(traced.gm).owner
nodes = {n.name: n for n in traced.gm.graph.nodes}


def keys(node):
    return [(hex(k), owner.get(k)) for k in (storage_key(t) for t in tensors_in(node.meta.get("val")))]


print("zero-byte edges forward -> update:")
for e in range(g.n_edges):
    s, d = int(g.edge_src[e]), int(g.edge_dst[e])
    if g.role[s] == Role.FORWARD and g.role[d] == Role.UPDATE and g.edge_bytes[e] == 0:
        src, dst = nodes[g.names[s]], nodes[g.names[d]]
        print(f"  {src.name} ({src.target}, {g.output_bytes[s]:.0f} B, storage {keys(src)}) -> {dst.name} ({dst.target})")
        print(f"    {src.name} reads: " + ", ".join(f"{a.name} {keys(a)}" for a in src.all_input_nodes))
        print(f"    {dst.name} reads: " + ", ".join(f"{a.name} {keys(a)}" for a in dst.all_input_nodes)
              + f"; writes in place: {[a.name for a in mutated_args(dst)]}")
live = [storage_key(t) for n in traced.gm.graph.nodes for t in tensors_in(n.meta.get("val"))]
print(f"storage keys of all node values: {len(live)} tensors, {len(set(live))} storages, "
      f"{len(set(live)) - len(set(owner))} without an owner")
logits = next(i for i in range(g.n_ops) if g.role[i] == Role.FORWARD and g.output_bytes[i] == 64 * 4096 * 4)
r = dp.simulate(g, dp.load_cluster("baechi-4x2080"), np.zeros(g.n_ops, dtype=int))
times, in_use = r.memory_timeline(0)
first_update = r.start_us[g.role == Role.UPDATE].min()
held = in_use[np.searchsorted(times, first_update, side="right") - 1] - g.persistent_bytes.sum()
print(f"logits {g.names[logits]} ({g.output_bytes[logits]:.0f} B) successors: {[g.names[v] for v in g.successors(logits)]}")
print(f"one GPU: non-persistent bytes held when the first update starts: {held:.0f}; peak {r.peak_memory_bytes[0]:.0f} B")
