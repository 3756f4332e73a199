"""Round 45 (benchmarks/rounds/how-far-from-optimal.md): what the remaining ordering-only edges into updates cost in one-device peak memory.

Drops every zero-byte edge from a backward op into an update op that is not an alias edge (see
zeropin_residual.py) and simulates the graph on one GPU: an estimate of what an order-only edge
kind in the simulator (no pin) would save. The edges are needed for ordering, so this graph is only
for this estimate.  PYTHONPATH=$PWD .venv/bin/python benchmarks/zeropin_without_order_edges.py GRAPH.json
"""
import sys

import numpy as np

import devplace as dp
from devplace.graph import OpGraph, Role

g = dp.load_graph(sys.argv[1])
role = np.asarray(g.role)
keep = np.ones(g.n_edges, bool)
for e in np.flatnonzero((g.edge_bytes == 0) & (role[g.edge_dst] == Role.UPDATE) & (role[g.edge_src] == Role.BACKWARD)):
    s, u = int(g.edge_src[e]), int(g.edge_dst[e])
    views = set(g.successors(s).tolist()) & set(g.predecessors(u).tolist())
    if not any(g.output_bytes[w] == 0 for w in views):
        keep[e] = False
h = OpGraph(names=list(g.names), kinds=list(g.kinds), device_kinds=list(g.device_kinds), compute_us=g.compute_us,
            persistent_bytes=g.persistent_bytes, output_bytes=g.output_bytes, temp_bytes=g.temp_bytes,
            colocation=g.colocation, colocation_names=g.colocation_names, role=g.role, mirror=g.mirror,
            edge_src=g.edge_src[keep], edge_dst=g.edge_dst[keep], edge_bytes=g.edge_bytes[keep],
            edge_fixed_us=g.edge_fixed_us[keep], meta=dict(g.meta))
cluster = dp.load_cluster("baechi-4x2080")
for label, graph in (("as captured", g), (f"without {int((~keep).sum())} ordering-only edges", h)):
    r = dp.simulate(graph, cluster, np.zeros(graph.n_ops, dtype=int))
    print(f"{label}: one-device peak {r.peak_memory_bytes[0] / 2**30:.3f} GiB, step {r.step_time_us / 1e3:.3f} ms")
