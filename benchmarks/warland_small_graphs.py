"""Round 51: sim-search (seed 0, default options) on the graphs under 1,000 ops: the four bundled
dnn-partitioning graphs on their files' devices and the zoo's mlp / small_cnn at 30% of baechi-4x2080,
where round 51's branch ran one canonical cap and a search with memory no object (not landed: main runs no caps
under 1,000 ops, and there this script measures main's behaviour).
Run from a checkout's root; the devplace imported is the one on PYTHONPATH:
    PYTHONPATH=<checkout> python benchmarks/warland_small_graphs.py OUT.json"""
import json, os, sys, tempfile, time
sys.path.insert(0, "benchmarks")
import devplace as dp
from devplace.io.dnn_partitioning import cluster_for
from reproduce_papers import PRESET

rows = []
cases = [(name, None) for name in ("bert_l-3_training", "gnmt_layers_training", "resnet50_inference", "bert_l-3_inference")]
cases += [("zoo:mlp", 0.3), ("zoo:small_cnn", 0.3)]
for name, fraction in cases:
    if fraction is None:
        graph = dp.load_graph(dp.example_path(f"{name}.json"))
        cluster = cluster_for(graph)
    else:
        from devplace.torchcapture import profile_target
        cluster = dp.load_cluster(PRESET)
        graph = profile_target(name, cost="roofline", cluster=cluster)
        cluster = cluster.with_memory_fraction(fraction)
    began = time.perf_counter()
    placement = dp.place(graph, cluster, "sim-search", seed=0)
    o = placement.options
    rows.append({"graph": name, "n_ops": graph.n_ops, "step_us": o["step_us"], "evals": o["evals"],
                 "wall_s": time.perf_counter() - began, "found_by": o["found_by"],
                 "canonical_caps_gib": o.get("canonical_caps_gib"), "capped_step_us": o.get("capped_step_us"),
                 "ample_step_us": o.get("ample_step_us"), "lower_bound_us": o["lower_bound_us"]})
    print({k: rows[-1][k] for k in ("graph", "n_ops", "step_us", "evals", "wall_s", "capped_step_us", "ample_step_us")},
          flush=True)
out = sys.argv[1]
with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(os.path.abspath(out)), delete=False) as f:
    json.dump({"devplace": dp.__file__, "rows": rows}, f, indent=1)
os.replace(f.name, out)
