"""Round 47: devplace's bound of each zoo model's coarse graph (coarse_step, 50 groups, 0.85 of 30% memory): the floor the
coarse program's W had. Run from the checkout's root: PYTHONPATH=$PWD python benchmarks/coarsepool_coarse_bound.py MODEL..."""
import sys
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET, cached_graph
import numpy as np, devplace as dp
from devplace.bounds import lower_bounds
from devplace.costing import costed_for
from devplace.placers._moves import sources_late_order
from devplace.portfolio.sim_search.coarse_mip import coarse_step
cl = dp.load_cluster(PRESET).with_memory_fraction(0.3)
for m in sys.argv[1:]:
    g = costed_for(cached_graph(f"zoo:{m}"), cl)
    c = coarse_step(g, cl, np.argsort(sources_late_order(g)), 50)
    lb = lower_bounds(c.graph, cl.with_memory_fraction(0.85))
    print(m, c.graph.n_ops, round(lb["best_us"] / 1e3, 3), lb["best"], flush=True)
