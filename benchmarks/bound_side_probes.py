"""The Transformer at Baechi's 30% memory, the bound side: what every placement pays beside the path (issue 15, point 3).

zoo:transformer's certified bound (375.2 ms, ``devplace.bounds.memory_path_us``) charges the critical path P
and the side routes beside it; sim-search's placement (420.6 ms) also pays cuts on its path (18.7 ms) and,
at the end, the weight-gradient products of its last stage queued on GPU 0 after the path. This measures
the candidate charges for that work, each a valid lower bound (proof below), against the certified bounds:

- **branch work** (``branch_work_us``): split P into *runs* (maximal stretches with no cut edge, each on
  one device d). An op q off P with time, whose latest input from P comes from the run (directly or
  through one zero-time op off P: the captured views), either runs on d, after the run's first op
  finishes (d runs it and the run's later path ops one at a time, F1 of ``devplace.bounds``), or does
  not: then an edge of that input chain is cut, so q starts no earlier than its input's finish plus
  the chain's cheaper cut (F2) and the step ends no earlier than q's finish plus its tail
  (``comm_windows``), and, under ``sequential`` and ``duplex``, the chain's transfer leaves d and holds
  d's (send) channel for at least that cut (``sim/channels.py``: one transfer per producer and device,
  FIFO; a transfer shared by several chains is divided among the chains its sender has). So for a run
  starting at path op v_i, step - start(v_i) >= p_i + the least, over which ops stay, of the largest
  of (the run's later path time + the staying ops' time), (the leaving ops' channel time), (each
  leaving op's input finish + cut + time + tail, from v_i's finish); fractional stays give a smaller
  least, so a valid one. Each cut edge delays the path by its cut cost (F2). A dynamic program over
  the runs' ends takes the least, over every split of P, of the largest run bound; channel and
  compute are separate resources in the simulator (transfers overlap compute), so the charges are
  maxima, not sums. With the channel term off (``parallel`` / ``pipelined``) it is the same program
  without it.
- **one-device turn** (``one_device_turn``): if P has no cut, every path op is on one device d, and when
  a path op x that takes time on every device starts, d holds P's units' persistent bytes, x's output
  and temporaries, and every output of a path op before x that a path op after x reads (it lives on d
  until that reader, which starts after x finishes, has finished; ``docs/simulator.md``, memory). If
  that exceeds the largest device for some x, every placement cuts P at least once.
- **offloading the last stage's weight gradients** (placement side): sim-search's seed-0 placement with
  the weight-gradient products and bias sums that GPU 0 runs after 300 ms (off P, with no path op
  after them) moved, by when their inputs were ready, to each other GPU; the same from the placement
  without its 0-2-0 detour (``transformer_structures.py``), by layer (``UnitLayers``), judged in the
  fastest of sim-search's orders that fits; and every update unit moved to the device of the
  gradient it reads.

    .venv/bin/python benchmarks/bound_side_probes.py [--models transformer ...] [--no-placements]

Writes ``benchmarks/results/bound_side_probes.json``. Figures are wall clock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace import bounds  # noqa: E402
from devplace.bounds.relaxation import longest_path  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.graph import Role  # noqa: E402
from devplace.io.dnn_partitioning import cluster_for  # noqa: E402

OUT = RESULTS / "bound_side_probes.json"
MEMORY_FRACTION = 0.3
ZOO = ("transformer", "mlp", "small_cnn", "rnnlm", "resnet50", "inception_v3", "nasnet", "gnmt")
BUNDLED = ("bert_l-3_training", "gnmt_layers_training", "resnet50_inference", "bert_l-3_inference")
GIB = 2**30


@njit(cache=True)
def _run_fits(t_us, later_us, n, time_us, channel_us, leave_us):
    """Can the run's branch ops (sorted by time / channel, best first) be split, fractionally, so that
    every term stays within ``t_us`` (from the run's first op's finish)?"""
    free = t_us
    stay = 0.0
    for k in range(n):
        if leave_us[k] > t_us:
            stay += time_us[k]
        elif channel_us[k] <= free:
            free -= channel_us[k]
        else:
            stay += time_us[k] * (1.0 - free / channel_us[k])
            free = 0.0
    return later_us + stay <= t_us


@njit(cache=True)
def _branch_runs_kernel(before, cut_us, q_pos, q_leave, q_time, q_channel):
    """Per path position i, the least, over splits of the path from v_i on, of the largest run bound
    (step - start(v_i)); ``q_*`` sorted by position (the branch op's latest input from the path)."""
    m = before.shape[0] - 1
    rest = np.zeros(m + 1)
    first = np.searchsorted(q_pos, np.arange(m + 1))
    nq = q_pos.shape[0]
    p, ch, lv, ratio, lv_rel = np.empty(nq), np.empty(nq), np.empty(nq), np.empty(nq), np.empty(nq)
    for i in range(m - 1, -1, -1):
        n, total, best, w_prev = 0, 0.0, np.inf, 0.0
        base = before[i + 1]
        for e in range(i, m):
            for k in range(first[e], first[e + 1]):
                r = q_time[k] / q_channel[k] if q_channel[k] > 0 else np.inf
                x = n
                while x > 0 and ratio[x - 1] < r:
                    ratio[x], p[x], ch[x], lv[x] = ratio[x - 1], p[x - 1], ch[x - 1], lv[x - 1]
                    x -= 1
                ratio[x], p[x], ch[x], lv[x] = r, q_time[k], q_channel[k], q_leave[k]
                n += 1
                total += q_time[k]
            later = before[e + 1] - base
            for k in range(n):
                lv_rel[k] = lv[k] - base
            lo, hi = max(later, w_prev - (base - before[i])), later + total
            if not _run_fits(lo, later, n, p, ch, lv_rel):
                while hi - lo > 1e-7 * max(hi, 1.0):
                    mid = 0.5 * (lo + hi)
                    if _run_fits(mid, later, n, p, ch, lv_rel):
                        hi = mid
                    else:
                        lo = mid
                lo = hi
            w_prev = lo + base - before[i]         # the run v_i .. v_e: step - start(v_i) >= this
            if w_prev >= best:
                break                              # longer runs only add
            if e == m - 1:
                best = min(best, w_prev)
            elif cut_us[e] < np.inf:               # cut after v_e: the rest starts c_e later
                best = min(best, max(w_prev, before[e + 1] - before[i] + cut_us[e] + rest[e + 1]))
        rest[i] = best
    return rest


def _branch_ops(graph, rel, path_ops, position, channel: bool):
    """Per branch op (off the path, with time, an input chain from the path): its latest path input's
    position, its leave bound (input finish + cheaper cut of the chain + time + tail, along the path's
    fastest times), its time and its share of the run device's channel."""
    src, dst, p, cut = graph.edge_src, graph.edge_dst, rel.fastest_us, rel.cut_us
    chains = []          # (q, path position, sender u, via z or -1, cut u -> next, cut z -> q)
    for e in np.flatnonzero((position[src] >= 0) & (position[dst] < 0)):
        u, v = int(src[e]), int(dst[e])
        if p[v] > 0:
            chains.append((v, position[u], u, -1, cut[e], np.inf))
            continue
        for k in range(graph.succ_ptr[v], graph.succ_ptr[v + 1]):
            e2 = graph.succ_edge[k]
            q = int(dst[e2])
            if position[q] < 0 and p[q] > 0:
                chains.append((q, position[u], u, v, cut[e], cut[e2]))
    table = np.array(chains, dtype=np.float64).reshape(-1, 6)
    q, j = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
    latest = np.full(graph.n_ops, -1, np.int64)
    np.maximum.at(latest, q, j)
    table, q, j = table[j == latest[q]], q[j == latest[q]], j[j == latest[q]]
    u, z, c1, c2 = table[:, 2].astype(np.int64), table[:, 3].astype(np.int64), table[:, 4], table[:, 5]
    chains_of_u = np.bincount(u, minlength=graph.n_ops)
    chains_of_z = np.bincount(z[z >= 0], minlength=graph.n_ops)
    share = np.minimum(c1 / chains_of_u[u], np.where(z >= 0, c2 / np.maximum(chains_of_z[np.maximum(z, 0)], 1), np.inf))
    share = np.where(np.isfinite(share), share, 0.0)      # a chain never cut: the op stays (leave bound inf)
    ops, inverse = np.unique(q, return_inverse=True)
    cross = np.full(len(ops), -np.inf)
    np.maximum.at(cross, inverse, np.minimum(c1, c2))
    channel_us = np.zeros(len(ops))
    if channel:
        np.add.at(channel_us, inverse, share)
    at = np.zeros(len(ops), np.int64)
    at[inverse] = j
    before = np.concatenate([[0.0], np.cumsum(p[path_ops])])
    leave = before[at + 1] + cross + p[ops] + rel.tail_us[ops]
    order = np.argsort(at, kind="stable")
    return before, at[order], leave[order], p[ops][order], channel_us[order]


def branch_work_us(graph, cluster, rel, channel: bool) -> float:
    """The branch-work bound on the critical path P of ``devplace.bounds`` (module docstring)."""
    path_ops, path_edges = longest_path(graph, rel.fastest_us, np.zeros(graph.n_edges))
    position = np.full(graph.n_ops, -1, np.int64)
    position[path_ops] = np.arange(len(path_ops))
    channel = channel and cluster.comm_model in ("sequential", "duplex")
    before, at, leave, time_us, channel_us = _branch_ops(graph, rel, path_ops, position, channel)
    cut_us = np.append(rel.cut_us[path_edges], np.inf)
    return float(_branch_runs_kernel(before, cut_us, at, leave, time_us, channel_us)[0])


def one_device_turn(graph, cluster, rel) -> dict:
    """What P kept on one device holds at its fullest start (module docstring), against the largest device."""
    path_ops, path_edges = longest_path(graph, rel.fastest_us, np.zeros(graph.n_edges))
    position = np.full(graph.n_ops, -1, np.int64)
    position[path_ops] = np.arange(len(path_ops))
    src, dst = graph.edge_src, graph.edge_dst
    ahead = (position[src] >= 0) & (position[dst] > position[src])
    last_reader = np.full(graph.n_ops, -1, np.int64)
    np.maximum.at(last_reader, src[ahead], position[dst[ahead]])
    producers = np.flatnonzero(last_reader >= 0)
    live = np.zeros(len(path_ops) + 1)
    np.add.at(live, position[producers] + 1, graph.output_bytes[producers])
    np.add.at(live, last_reader[producers], -graph.output_bytes[producers])
    live = np.cumsum(live)[:-1] + rel.footprint[path_ops].min(axis=1)
    live[rel.op_time_us[path_ops].min(axis=1) <= 0] = 0.0
    x = int(np.argmax(live))
    persistent = float(rel.unit_bytes[np.unique(rel.unit[path_ops])].sum())
    cheapest = int(np.argmin(rel.cut_us[path_edges]))
    return {"probe": graph.names[path_ops[x]], "held_gib": round((persistent + live[x]) / GIB, 3),
            "persistent_gib": round(persistent / GIB, 3), "largest_device_gib": round(cluster.memory_bytes.max() / GIB, 3),
            "cut_forced": bool(persistent + live[x] > cluster.memory_bytes.max()),
            "cheapest_path_edge": f"{graph.names[path_ops[cheapest]]} -> {graph.names[path_ops[cheapest + 1]]}",
            "cheapest_path_cut_ms": round(float(rel.cut_us[path_edges][cheapest]) / 1e3, 3)}


def probe(name: str, graph, cluster) -> dict:
    began = time.perf_counter()
    certified = bounds.lower_bounds(graph, cluster)
    row = {"graph": name, "ops": graph.n_ops, "comm_model": cluster.comm_model,
           "bounds_s": round(time.perf_counter() - began, 2), "certified_ms": round(certified["best_us"] / 1e3, 3),
           "certified_by": certified["best"], "critical_path_ms": round(certified["critical_path_us"] / 1e3, 3)}
    rel = bounds.relaxation(graph, cluster)
    for channel in (False, True):
        began = time.perf_counter()
        value = branch_work_us(graph, cluster, rel, channel)
        key = "branch_work_channel" if channel else "branch_work"
        row[f"{key}_ms"], row[f"{key}_s"] = round(value / 1e3, 3), round(time.perf_counter() - began, 2)
    row["one_device_turn"] = one_device_turn(graph, cluster, rel)
    row["load_1min"] = os.getloadavg()[0]
    print(json.dumps(row), flush=True)
    return row


def offload_trials(graph, cluster) -> dict:
    """sim-search's seed-0 placement with the last stage's weight gradients moved (module docstring)."""
    from transformer_structures import fastest_fitting

    from devplace.placers._layers import UnitLayers
    from devplace.placers._moves import respect_colocation, with_colocation
    from devplace.portfolio import sim_search as ss
    from devplace.portfolio.sim_search.search import _Search

    placement = dp.place(graph, cluster, algo="sim-search")
    devices, priority = np.asarray(placement.devices), placement.priority
    search = _Search(graph, cluster, ss.SearchConfig(), 0)
    sim, fine = search.sim, search.fine
    base = sim.run(dp.Placement(devices=devices, priority=priority))
    rel = bounds.relaxation(graph, cluster)
    path_ops, _ = longest_path(graph, rel.fastest_us, np.zeros(graph.n_edges))
    on_path = np.zeros(graph.n_ops, bool)
    on_path[path_ops] = True
    feeds_path = np.zeros(graph.n_ops, bool)          # some path op comes after it
    for v in graph.topo_order[::-1]:
        succ = graph.edge_dst[graph.succ_edge[graph.succ_ptr[v]:graph.succ_ptr[v + 1]]]
        feeds_path[v] = bool((on_path[succ] | feeds_path[succ]).any())
    last_device = int(devices[path_ops[-1]])
    late = np.flatnonzero(~on_path & ~feeds_path & (rel.fastest_us > 0) & (devices == last_device)
                          & (graph.role != Role.UPDATE) & (base.start_us > 300e3))
    out = {"step_ms": round(base.step_time_us / 1e3, 3), "device": last_device, "ops": len(late),
           "ops_ms": round(float(rel.fastest_us[late].sum()) / 1e3, 2), "moves": []}
    for ready_before_us in (360e3, 375e3, 390e3):
        moved = late[base.ready_us[late] < ready_before_us]
        for target in range(cluster.n_devices):
            if target == last_device:
                continue
            trial = devices.copy()
            trial[moved] = target
            result = sim.run(dp.Placement(devices=trial, priority=priority))
            out["moves"].append({"ready_before_ms": ready_before_us / 1e3, "ops": len(moved), "to": target,
                                 "step_ms": round(result.step_time_us / 1e3, 3), "fits": bool(result.fits)})
            print(json.dumps(out["moves"][-1]), flush=True)
    layers = UnitLayers.of(graph)
    layer = layers.layer_of_unit()[layers.unit_of]
    clean = devices.copy()
    clean[(layer <= 6) & (clean == 2)] = 0          # transformer_structures.py's "0-2-0 detour removed"
    gradients = ~on_path & ~feeds_path & (rel.fastest_us > 0) & (graph.role != Role.UPDATE)
    out["detour_removed_ms"] = round(fastest_fitting(search, respect_colocation(fine, clean))[0] / 1e3, 3)
    for last_layer in (2, 4, 6):
        for target in range(1, cluster.n_devices):
            trial = clean.copy()
            moved = gradients & (layer <= last_layer) & (trial == 0)
            trial[moved] = target
            scored = fastest_fitting(search, respect_colocation(fine, trial))
            out["moves"].append({"detour_removed": True, "layers_up_to": last_layer, "ops": int(moved.sum()),
                                 "to": target, "step_ms": None if scored is None else round(scored[0] / 1e3, 3),
                                 "order": None if scored is None else scored[2]})
            print(json.dumps(out["moves"][-1]), flush=True)
    trial = devices.copy()
    for u in np.flatnonzero(graph.role == Role.UPDATE):
        for k in range(graph.pred_ptr[u], graph.pred_ptr[u + 1]):
            e = graph.pred_edge[k]
            f = graph.edge_src[e]
            if graph.role[f] != Role.UPDATE and graph.edge_bytes[e] > 0 and rel.fastest_us[f] > 0:
                trial[with_colocation(fine, np.array([u]))] = devices[f]
                break
    trial = respect_colocation(fine, trial)
    result = sim.run(dp.Placement(devices=trial, priority=priority))
    out["updates_with_their_gradients"] = {"step_ms": round(result.step_time_us / 1e3, 3), "fits": bool(result.fits),
                                           "ops_moved": int((trial != devices).sum())}
    print(json.dumps(out["updates_with_their_gradients"]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(ZOO))
    parser.add_argument("--graphs", nargs="*", default=list(BUNDLED))
    parser.add_argument("--no-placements", action="store_true", help="skip the Transformer's offload trials")
    args = parser.parse_args()
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_1min_start": os.getloadavg()[0],
              "rows": []}
    machine = dp.load_cluster(PRESET).with_memory_fraction(MEMORY_FRACTION)
    for model in args.models:
        report["rows"].append(probe(f"zoo:{model}", cached_graph(f"zoo:{model}"), machine))
    for name in args.graphs:
        graph = dp.load_graph(dp.example_path(f"{name}.json"))
        report["rows"].append(probe(name, graph, cluster_for(graph)))
    if not args.no_placements and "transformer" in args.models:
        report["offload"] = offload_trials(cached_graph("zoo:transformer"), machine)
    report["load_1min_end"] = os.getloadavg()[0]
    write_text_atomic(OUT, json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
