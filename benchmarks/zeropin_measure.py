"""Round 45 (benchmarks/rounds/how-far-from-optimal.md): zero-byte edges into update ops and one-device peak memory, before/after the fix.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/zeropin_measure.py BEFORE.json AFTER.json LOGITS_OP
"""
import sys

import numpy as np

import devplace as dp
from devplace.graph import Role


def figures(path: str, logits: str) -> dict:
    g = dp.load_graph(path)
    role, src, dst, b = np.asarray(g.role), g.edge_src, g.edge_dst, g.edge_bytes
    zero_into_update = (b == 0) & (role[dst] == Role.UPDATE)
    out = {
        "ops": g.n_ops, "edges": g.n_edges,
        "zero-byte forward->update edges": int((zero_into_update & (role[src] == Role.FORWARD)).sum()),
        "  ...whose source has an output (MiB, summed over sources)": float(
            g.output_bytes[np.unique(src[zero_into_update & (role[src] == Role.FORWARD)])].sum() / 2**20),
        "zero-byte backward->update edges": int((zero_into_update & (role[src] == Role.BACKWARD)).sum()),
        "  ...their sources' outputs (MiB)": float(
            g.output_bytes[np.unique(src[zero_into_update & (role[src] == Role.BACKWARD)])].sum() / 2**20),
    }
    i = g.index(logits)
    out[f"{logits} successors"] = [g.names[v] for v in g.successors(i)]
    cluster = dp.load_cluster("baechi-4x2080")
    one = dp.simulate(g, cluster, np.zeros(g.n_ops, dtype=int))
    out["one-device peak GiB"] = float(one.peak_memory_bytes[0] / 2**30)
    out["one-device step ms"] = one.step_time_us / 1e3
    # the classifier (its forward, backward, parameters and updates) alone on GPU 1, the rest on GPU 0
    scope = g.meta["op_scope"]
    head = logits_scope = scope[i]
    devices = np.array([1 if s == head else 0 for s in scope])
    two = dp.simulate(g, cluster, devices)
    out[f"'{logits_scope}' ops on GPU 1 ({int(devices.sum())} ops): GPU 1 peak GiB"] = float(two.peak_memory_bytes[1] / 2**30)
    out["  GPU 0 peak GiB"] = float(two.peak_memory_bytes[0] / 2**30)
    out["  step ms"] = two.step_time_us / 1e3
    return out


if __name__ == "__main__":
    before, after, logits = sys.argv[1:4]
    fb, fa = figures(before, logits), figures(after, logits)
    for k in fb:
        print(f"{k}: {fb[k]}  ->  {fa[k]}")
