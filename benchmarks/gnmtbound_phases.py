"""Round 50: zoo GNMT's step in three phases (forward until the classifier's product ``addmm_760`` starts;
its chain until the input gradient ``mm_1`` ends; the backward after), for a saved placement under each
link model and for the relaxation every bound reads (heads, tails, work), to a JSON. Run from the
checkout's root:
    PYTHONPATH=$PWD python benchmarks/gnmtbound_phases.py PLACEMENT.json OUT.json [FRACTION=0.3]
(PLACEMENT.json: the output of gnmtbound_ceiling.py)"""
import dataclasses, json, sys
sys.path.insert(0, "benchmarks")
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order
from reproduce_papers import PRESET, cached_graph
import devplace as dp
from devplace.bounds import relaxation
from devplace.placement import Placement
from devplace.sim.channels import COMM_MODELS

src, out = sys.argv[1], sys.argv[2]
frac = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
g = cached_graph("zoo:gnmt")
base = dp.load_cluster(PRESET).with_memory_fraction(frac)
saved = json.load(open(src))
placement = Placement(devices=np.array(saved["devices"]), priority=np.array(saved["priority"]))
index = {n: i for i, n in enumerate(g.names)}
product, input_grad = index["addmm_760"], index["mm_1"]
ms = lambda us: round(float(us) / 1e3, 3)
rows = {}
for model in COMM_MODELS:
    r = dp.simulate(g, dataclasses.replace(base, comm_model=model), placement)
    after = r.start_us >= r.finish_us[input_grad]
    held = r.finish_us - r.start_us
    rows[model] = {"step_ms": ms(r.step_time_us), "fits": bool(r.fits), "phase1_ms": ms(r.start_us[product]),
                   "phase2_ms": ms(r.finish_us[input_grad] - r.start_us[product]),
                   "phase3_ms": ms(r.step_time_us - r.finish_us[input_grad]),
                   "busy_ms": [ms(x) for x in np.bincount(r.devices, weights=held, minlength=base.n_devices)],
                   "busy_phase3_ms": [ms(x) for x in np.bincount(r.devices[after], weights=held[after], minlength=base.n_devices)],
                   "classifier_device": int(r.devices[product]),
                   "peaks_GiB": [round(float(x) / 2**30, 3) for x in r.peak_memory_bytes]}
    print(model, rows[model], flush=True)
rel = relaxation(g, base)
p = rel.fastest_us
edges = sp.csr_matrix((np.ones(g.n_edges), (g.edge_src, g.edge_dst)), shape=(g.n_ops, g.n_ops))
ancestors = breadth_first_order(edges.T.tocsr(), product, directed=True, return_predecessors=False)[1:]
descendants = breadth_first_order(edges, input_grad, directed=True, return_predecessors=False)[1:]
relaxed = {"head_product_ms": ms(rel.head_us[product]), "input_grad_end_ms": ms(rel.head_us[input_grad] + p[input_grad]),
           "tail_input_grad_ms": ms(rel.tail_us[input_grad]), "work_ms": ms(p.sum()),
           "work_before_product_ms": ms(p[ancestors].sum()), "work_after_input_grad_ms": ms(p[descendants].sum())}
print("relaxation", relaxed)
json.dump({"placement": src, "fraction": frac, "models": rows, "relaxation": relaxed}, open(out, "w"), indent=1)
