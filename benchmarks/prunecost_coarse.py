"""Round 46: the coarse MIP start's coarse step (sim-search's coarse_mip.coarse_step) on ResNet-50 without / with the
capture's write-after-read pruning: same pieces? same held bytes? Run with PYTHONPATH=<checkout with the pruning>:
    python benchmarks/prunecost_coarse.py OLD.json NEW.json"""
import sys
import numpy as np
sys.path.insert(0, "benchmarks")
import devplace as dp
from reproduce_papers import PRESET
from devplace.portfolio.sim_search.coarse_mip import coarse_step
from devplace.placers._moves import sources_late_order
from devplace.sim.simulator import costed_for

cl = dp.load_cluster(PRESET).with_memory_fraction(0.3)
res = {}
for tag, path in (("old", sys.argv[1]), ("new", sys.argv[2])):
    g = costed_for(dp.load_graph(path), cl)
    rank = np.argsort(sources_late_order(g))
    c = coarse_step(g, cl, rank, 50)
    res[tag] = (g, rank, c)
    cg = c.graph
    print(tag, "coarse ops", cg.n_ops, "edges", cg.n_edges, "held GiB", round(float(cg.persistent_bytes.sum()) / 2**30, 4),
          "compute ms", round(float(cg.compute_us.min(axis=1).sum()) / 1e3, 3))
(go, ro, co), (gn, rn, cn) = res["old"], res["new"]
print("step_rank equal:", bool((ro == rn).all()), "ops whose rank differs:", int((ro != rn).sum()))
print("coarse_of equal:", bool((co.coarse_of == cn.coarse_of).all()), "ops in another piece:", int((co.coarse_of != cn.coarse_of).sum()))
if co.graph.n_ops == cn.graph.n_ops:
    d = co.graph.persistent_bytes - cn.graph.persistent_bytes
    print("pieces whose held bytes differ:", int((np.abs(d) > 0).sum()), "max diff MiB", float(np.abs(d).max()) / 2**20)
    eo = set(zip(co.graph.edge_src.tolist(), co.graph.edge_dst.tolist())); en = set(zip(cn.graph.edge_src.tolist(), cn.graph.edge_dst.tolist()))
    print("coarse edges only old", len(eo - en), "only new", len(en - eo))
