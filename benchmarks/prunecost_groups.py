"""Round 46: ResNet-50's co-placement groups and memory with and without the capture's write-after-read pruning.

Run from a checkout WITH the pruning (`git revert 7f422d6` on main), PYTHONPATH=<that checkout>:
    python benchmarks/prunecost_groups.py OLD.json NEW.json [MAIN_BEST.json]
OLD/NEW: the two cached zoo_resnet50 graphs (without / with the pruning). MAIN_BEST: a JSON with "devices" and
"priority" of a sim-search placement found on OLD (prunecost_run.py writes one);
it is carried over op by op by name and simulated on both graphs at 30% memory."""
import json, sys
from collections import Counter
import numpy as np
sys.path.insert(0, "benchmarks")
import devplace as dp
from reproduce_papers import PRESET
from devplace.transforms.coplacement import coplacement_groups, colocation_units

old, new = dp.load_graph(sys.argv[1]), dp.load_graph(sys.argv[2])
print("ops", old.n_ops, new.n_ops, "edges", old.n_edges, new.n_edges)
assert old.names == new.names or sorted(old.names) == sorted(new.names)
pos = {n: i for i, n in enumerate(new.names)}
to_new = np.array([pos[n] for n in old.names])   # old index -> new index
out = {}
for tag, g in (("old", old), ("new", new)):
    grp = coplacement_groups(g); unit = colocation_units(g)
    sizes = sorted(Counter(grp.tolist()).values(), reverse=True)
    out[tag] = dict(groups=len(sizes), units=len(set(unit.tolist())), largest=sizes[:8],
                    singletons=sum(1 for s in sizes if s == 1))
    print(tag, out[tag])
# ops whose group changed: compare the partitions (old labels mapped to new op order)
go = np.empty(new.n_ops, int); go[to_new] = coplacement_groups(old)
gn = coplacement_groups(new)
# an op 'keeps' its group if its old group and new group have the same member set
def members(labels):
    d = {}
    for i, l in enumerate(labels.tolist()): d.setdefault(l, []).append(i)
    return {l: frozenset(m) for l, m in d.items()}
mo, mn = members(go), members(gn)
changed = [i for i in range(new.n_ops) if mo[go[i]] != mn[gn[i]]]
merged_groups = Counter(gn[changed].tolist())
print("ops whose group changed", len(changed), "in", len(merged_groups), "new groups; largest new groups touched:",
      sorted(((len(mn[l]), l) for l in merged_groups), reverse=True)[:6])
out["changed_ops"] = len(changed)
# single-consumer pairs lost/gained
def sc_pairs(g, names):
    n = g.n_ops
    pair = np.unique(g.edge_src.astype(np.int64) * n + g.edge_dst)
    p, c = pair // n, pair % n
    only = np.bincount(p, minlength=n)[p] == 1
    return {(names[a], names[b]) for a, b in zip(p[only], c[only])}
so, sn = sc_pairs(old, old.names), sc_pairs(new, new.names)
print("single-consumer pairs old", len(so), "new", len(sn), "gained", len(sn - so), "lost", len(so - sn))
print(" examples gained:", list(sn - so)[:5])
out.update(sc_old=len(so), sc_new=len(sn), sc_gained=len(sn - so), sc_lost=len(so - sn))
# one-device peak
one = dp.load_cluster(PRESET).with_devices(1) if hasattr(dp.load_cluster(PRESET), "with_devices") else None
for tag, g in (("old", old), ("new", new)):
    r = dp.simulate(g, one, np.zeros(g.n_ops, int))
    out[tag]["one_device_peak_GiB"] = float(r.peak_memory_bytes[0] / 2**30)
    out[tag]["one_device_step_ms"] = r.step_time_us / 1e3
    print(tag, "one-device peak GiB", out[tag]["one_device_peak_GiB"], "step ms", r.step_time_us / 1e3)
if len(sys.argv) > 3:
    best = json.load(open(sys.argv[3]))
    cl = dp.load_cluster(PRESET).with_memory_fraction(0.3)
    dev_o = np.array(best["devices"]); pri_o = None if best["priority"] is None else np.array(best["priority"])
    dev_n = np.empty(new.n_ops, int); dev_n[to_new] = dev_o
    pri_n = None
    if pri_o is not None:
        pri_n = np.empty(new.n_ops); pri_n[to_new] = pri_o
    from devplace.placement import Placement
    cap = cl.devices[0].memory_bytes if hasattr(cl.devices[0], "memory_bytes") else None
    for tag, g, d, p in (("old", old, dev_o, pri_o), ("new", new, dev_n, pri_n)):
        for with_pri in (True, False):
            pl = Placement(devices=d, priority=p if with_pri else None)
            r = dp.simulate(g, cl, pl)
            row = dict(step_ms=r.step_time_us / 1e3, fits=r.fits,
                       peaks_GiB=[round(float(x) / 2**30, 3) for x in r.peak_memory_bytes])
            out[f"main_best_on_{tag}" + ("" if with_pri else "_default_priority")] = row
            print("main best on", tag, "priority" if with_pri else "default priority", row)
    out["main_best_search_step_ms"] = best["step_us"] / 1e3
json.dump(out, open("benchmarks/results/prunecost_groups.json", "w"), indent=1)
