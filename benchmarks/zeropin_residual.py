"""Round 45 (benchmarks/rounds/how-far-from-optimal.md): the zero-byte edges from backward ops into update ops that remain after the fix.

An edge s -> u is an alias edge (u reads a view of s's output, e.g. a gradient ``t(mm)``) when a
zero-output op w lies between them (s -> w -> u); the others are write-after-read ordering edges
from ops that read the weight u writes (e.g. a grad-input matmul) and that nothing else orders
before u.  PYTHONPATH=$PWD .venv/bin/python benchmarks/zeropin_residual.py GRAPH.json
"""
import sys

import numpy as np

import devplace as dp
from devplace.graph import Role

g = dp.load_graph(sys.argv[1])
role = np.asarray(g.role)
sel = np.flatnonzero((g.edge_bytes == 0) & (role[g.edge_dst] == Role.UPDATE) & (role[g.edge_src] == Role.BACKWARD))
alias, order = [], []
for e in sel:
    s, u = int(g.edge_src[e]), int(g.edge_dst[e])
    views = set(g.successors(s).tolist()) & set(g.predecessors(u).tolist())
    (alias if any(g.output_bytes[w] == 0 for w in views) else order).append(s)
for label, srcs in (("alias (the update reads a view of it)", alias), ("ordering only (reads the weight)", order)):
    srcs = np.unique(np.array(srcs, dtype=int))
    big = sorted(srcs.tolist(), key=lambda s: -g.output_bytes[s])[:4]
    print(f"{label}: {len(srcs)} sources, {g.output_bytes[srcs].sum() / 2**20:.1f} MiB of outputs; largest",
          [(g.names[s], round(g.output_bytes[s] / 2**20, 1), g.meta["op_scope"][s]) for s in big])
