"""Round 47: the coarse MIP start of zoo ResNet-50 (baechi-4x2080, 30%) alone: every solution HiGHS saved,
expanded and judged in the search's orders (no annealing); [nofloor]: exact's floor_at_bound off (main's sim-search
keeps the floor and expands only the incumbent; round 47's unfloored track is commit fa677ee). Run from the checkout's root:
    PYTHONPATH=$PWD python benchmarks/coarsepool_probe.py GRAPH.json OUT.json [nofloor]"""
import dataclasses, json, math, sys, time
sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET
import devplace as dp
from devplace.placers.exact import ExactOptions, solve_mip
from devplace.portfolio.sim_search import place
from devplace.portfolio.sim_search.coarse_mip import coarse_step
from devplace.portfolio.sim_search.config import SearchConfig
from devplace.portfolio.sim_search.search import _Search
from devplace.costing import costed_for

cl = dp.load_cluster(PRESET).with_memory_fraction(0.3)
g = costed_for(dp.load_graph(sys.argv[1]), cl)
floor_at_bound = sys.argv[3:4] != ['nofloor']
config = SearchConfig()
search = _Search(g, cl, config, 0)
coarse = coarse_step(g, cl, search.step_rank, config.coarse_mip_groups)
ccl = cl.with_memory_fraction(config.coarse_mip_memory)
nested = dataclasses.replace(config, coarse_mip_groups=0, recurrence_evals=0, loose_memory_factor=1.0, order_descent_evals=0)
t0 = time.time()
import hashlib, os, pickle
key = hashlib.sha1(open(sys.argv[1], "rb").read()).hexdigest()[:12]
cache = f"/tmp/cp/first_{key}.pkl"     # the nested sim-search's placement: the same for every weight
if os.path.exists(cache):
    first = pickle.load(open(cache, "rb"))
else:
    first = place(coarse.graph, ccl, options=nested)
    pickle.dump(first, open(cache, "wb"))
t1 = time.time()
solve = solve_mip(coarse.graph, ccl, ExactOptions(time_limit_s=math.inf, max_nodes=config.coarse_mip_nodes,
                                                  floor_at_bound=floor_at_bound), first)
t2 = time.time()
rows = []
for k, sol in enumerate(solve.solutions):
    obj = dp.simulate(coarse.graph, ccl, sol).step_time_us
    devices = coarse.expand(sol.devices)
    orders = [("start", coarse.expand_priority(sol.priority))] + search.orders(devices)
    judged = {}
    for name, pr in orders:
        over, step, _ = search.measure(devices, pr)
        judged[name] = (over / 2**30, step / 1e3)
    rows.append({"k": k, "coarse_sim_ms": obj / 1e3, "judged": judged})
    print(k, round(obj / 1e3, 3), judged, flush=True)
out = {"graph": sys.argv[1], "floor_at_bound": floor_at_bound, "status": solve.status, "nested_s": t1 - t0, "solve_s": t2 - t1, "nodes": solve.nodes, "objective_us": solve.objective_us,
       "first_us": solve.first_us, "rows": rows}
print({k: v for k, v in out.items() if k != "rows"})
json.dump(out, open(sys.argv[2], "w"))
