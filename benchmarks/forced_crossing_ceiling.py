"""Round 39: what a bound that charges the crossing ResNet-50 is forced into at 30% memory could reach,
measured before building it (a ceiling, not a bound), and a first sound piece of it measured.

P is the critical path ``turn_cut_us`` reads, x = o_q its turn probe. Three measurements:

- *ceiling*: suppose (unproven) that every placement moves at least X bytes across GPUs on P in the forward
  and X in the backward. *Plain*: the critical path plus twice latency + X / bandwidth. *Windowed*: the comm
  path (``comm_path_us``) with one forward and one backward P edge carrying at least X always cut, the least
  over such pairs. Also the X each way that the plain form needs to reach a target step.
- *chord split*: ``turn_cut_us``'s first (last) cut at P edge a, valued also by a case split on a later
  (earlier) P op o_j: o_j on the first run's device d means a second cut between a and j; o_j off d means
  every path from a first-run op o_i to o_j crosses, so start(o_j) >= finish(o_i) + lambda(o_i, o_j),
  lambda the largest over paths of their inner ops' fastest times plus their least cut cost. The value is
  the lesser case (at least ``turn_cut_us``'s own); then the staircase of each side alone (the first
  cut without ``turn_cut_us``'s pairs), with every able edge valued (no pass limit).
- *regions*: the turn's items made in anc(o_end) for a few ends on P: on P by output bytes, on P by
  ``turn_cut_us``'s whole-tensor rule, off P by output bytes.
- *backward runs*: the turn's last-run argument taken at every backward instant, not only at s. A run of P
  on device B holding o_b, t = start(o_b): each output f of an op that finishes by t (P ops before b, or ops
  off P in anc(x) - x) read by a P op of the run at b or later is on B at t (output bytes) or crosses B's
  channel within (t, T] (at least the cut cost of its edge to its first reader there), so the run's items,
  each weighed min(output bytes, cut cost x the fastest bandwidth), are at most the memory less o_b's
  output and temporaries plus that bandwidth x (T - head_b). The least cut cost splitting P after the probe into
  such runs, D(T), gives max over T of min(T, critical path + D(T)) (plain). Also the items at one instant:
  output bytes against that weight, and how many bytes cross over edges cheaper than 1 ms.
- *assignments*: round 35's witnesses (device per run of P, feasible for its per-device rows at their T) and
  sim-search's best placement restricted to P, each valued plain (P's times plus its cut costs), plain with
  chords (a longest path along P where o_j also waits lambda(o_i, o_j) after o_i finishes when the two are on
  different devices, j - i <= ``WINDOW``), windowed (the comm path with its cut edges always cut) and windowed
  with one chord (the largest head(o_i) + p + lambda + p + tail(o_j) over such pairs, those windows).

    PYTHONPATH=$PWD python benchmarks/forced_crossing_ceiling.py --out benchmarks/results/forced_crossing_ceiling.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import PRESET, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.bounds import relaxation  # noqa: E402
from devplace.bounds.relaxation import _longest_paths, longest_path, windows_us  # noqa: E402
from devplace.bounds.turn_cut import _position_and_hold, _staircase, _turn_items, turn_cut_us  # noqa: E402
from devplace.bounds.turn_path import turn_probe, turn_sides  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402

MiB, GiB = 2**20, 2**30
WINDOW = 16          # P positions on each side of a cut that the chord split looks at
REGION_OPS = 200     # lambda(u, v) is left out (case not charged) past this many ops between u and v


class CriticalPath:
    """P with the relaxation's arrays, and the comm path with some of P's edges always cut."""

    def __init__(self, graph, cluster):
        self.graph, self.cluster = graph, cluster
        self.rel = relaxation(graph, cluster)
        self.ops, self.edges = longest_path(graph, self.rel.fastest_us,
                                            np.where(self.rel.forced_cut, self.rel.cut_us, 0.0))
        self.q = int(np.flatnonzero(self.ops == turn_probe(graph, self.rel, self.ops))[0])
        self.cut = self.rel.cut_us[self.edges]

    def windows(self, cut_positions):
        forced = self.rel.forced_cut.copy()
        forced[self.edges[list(cut_positions)]] = True
        return windows_us(self.graph, self.rel.fastest_us, self.rel.cut_us, forced)

    def windowed_us(self, cut_positions) -> float:
        head, tail = self.windows(cut_positions)
        return float((head + self.rel.fastest_us + tail).max())

    def plain_us(self, cut_positions) -> float:
        forced = self.rel.forced_cut.copy()
        forced[self.edges[list(cut_positions)]] = True
        return float(_longest_paths(self.graph, self.rel.fastest_us, np.where(forced, self.rel.cut_us, 0.0))[0].max())


def ceiling(path: CriticalPath, crossing_mib: float, targets_ms) -> dict:
    graph, cluster = path.graph, path.cluster
    latency_us = float(cluster.latency_us[~np.eye(cluster.n_devices, dtype=bool)].min())
    us_per_byte = 1.0 / float(cluster.bandwidth_bytes_per_us[~np.eye(cluster.n_devices, dtype=bool)].max())
    crossing_us = latency_us + crossing_mib * MiB * us_per_byte
    big = np.flatnonzero(graph.edge_bytes[path.edges] >= crossing_mib * MiB)
    forward, backward = big[big < path.q], big[big >= path.q]
    single = {int(a): path.windowed_us([a]) for a in big}
    pair = min(((path.windowed_us([a, b]), int(a), int(b)) for a in forward for b in backward), default=None)
    critical_us = path.plain_us([])
    return {
        "critical_path_ms": critical_us / 1e3, "comm_path_ms": path.windowed_us([]) / 1e3,
        "crossing_mib": crossing_mib, "crossing_ms": crossing_us / 1e3,
        "plain_ms": (critical_us + 2 * crossing_us) / 1e3,
        "least_single_forward_ms": min(single[int(a)] for a in forward) / 1e3,
        "least_single_backward_ms": min(single[int(b)] for b in backward) / 1e3,
        "least_pair_windowed_ms": pair[0] / 1e3, "least_pair_edges": [pair[1], pair[2]],
        "least_pair_names": [graph.names[path.ops[pair[1]]], graph.names[path.ops[pair[2]]]],
        "least_pair_plain_ms": path.plain_us([pair[1], pair[2]]) / 1e3,
        "crossing_each_way_needed": {f"{t:.3f}": {"ms": (t * 1e3 - critical_us) / 2e3,
                                                  "mib": ((t * 1e3 - critical_us) / 2 - latency_us) / us_per_byte / MiB}
                                     for t in targets_ms},
    }


def chord_lambda_us(path: CriticalPath, u: int, v: int) -> float:
    """The largest, over paths u -> v, of the fastest times of their inner ops plus their least finite cut
    cost (-inf if v is not reached, None past ``REGION_OPS``): by threshold, the longest path over the
    edges whose cut cost is at least it."""
    graph, rel = path.graph, path.rel
    rank = graph.topo_rank
    seen, stack = {u}, [u]
    while stack:
        w = stack.pop()
        for z in graph.successors(w):
            z = int(z)
            if rank[z] <= rank[v] and z not in seen:
                seen.add(z)
                stack.append(z)
                if len(seen) > REGION_OPS:
                    return None
    nodes = sorted(seen, key=lambda z: rank[z])
    edges = [int(e) for w in nodes for e in graph.out_edges(w) if int(graph.edge_dst[e]) in seen]
    best = -np.inf
    for threshold in sorted({rel.cut_us[e] for e in edges if np.isfinite(rel.cut_us[e])}):
        reach = {u: 0.0}
        for w in nodes:
            if w not in reach:
                continue
            for e in graph.out_edges(w):
                z = int(graph.edge_dst[e])
                if z in seen and rel.cut_us[e] >= threshold:
                    reach[z] = max(reach.get(z, -np.inf), reach[w] + (rel.fastest_us[w] if w != u else 0.0))
        if v in reach:
            best = max(best, threshold + reach[v])
    return best


def chord_split(path: CriticalPath) -> dict:
    """``turn_cut_us``'s staircases with each able edge valued by its own pass, and by the chord split."""
    graph, cluster, rel, ops = path.graph, path.cluster, path.rel, path.ops
    p = rel.fastest_us
    off = ~np.eye(cluster.n_devices, dtype=bool)
    us_per_byte = 1.0 / float(cluster.bandwidth_bytes_per_us[off].max())
    bytes_per_us = 1.0 / us_per_byte        # sequential: one channel per device
    capacity = float(cluster.memory_bytes.max())
    made, read = _turn_items(graph, ops, path.q, us_per_byte, *_position_and_hold(graph, ops, us_per_byte))
    q, m = path.q, len(ops)
    lam = {}

    def chord(i, j):
        if (i, j) not in lam:
            lam[i, j] = chord_lambda_us(path, int(ops[i]), int(ops[j]))
        return lam[i, j]

    def through(head, tail, b):
        return head[ops[b]] + p[ops[b]] + path.cut[b] + p[ops[b + 1]] + tail[ops[b + 1]]

    def value(a, first: bool):
        head, tail = path.windows([a])
        own = float((head + p + tail).max())
        split = own
        js = range(a + 2, min(a + 2 + WINDOW, m)) if first else range(max(0, a - WINDOW), a)
        for j in js:
            sources = range(max(0, a - WINDOW), a + 1) if first else range(a + 1, min(m, a + 1 + WINDOW))
            crossing = -np.inf
            for i in sources:
                lam_us = chord(i, j) if first else chord(j, i)
                if lam_us is None or lam_us == -np.inf:
                    continue
                u, v = (ops[i], ops[j]) if first else (ops[j], ops[i])
                crossing = max(crossing, head[u] + p[u] + lam_us + p[v] + tail[v])
            returns = min(through(head, tail, b) for b in (range(a + 1, j) if first else range(j, a)))
            split = max(split, min(max(crossing, own), max(returns, own)))
        return own, split

    head, tail = rel.head_us[ops], rel.tail_us[ops]
    pq = p[ops]
    after = np.cumsum(read[::-1])[::-1]
    sides = {
        "first": (pq[q] + tail[q] + np.maximum(np.cumsum(made)[:-1] - capacity, 0.0) / bytes_per_us,
                  pq[q] + tail[q] + (made.sum() - capacity) / bytes_per_us),
        "last": (head[q] + np.maximum(after[1:] - capacity, 0.0) / bytes_per_us,
                 head[q] + (read.sum() - capacity) / bytes_per_us),
    }
    out = {"turn_cut_ms": turn_cut_us(graph, cluster, rel) / 1e3}
    for side, (able, need) in sides.items():
        edges = np.flatnonzero(np.isfinite(path.cut) & (able < need))
        edges = edges[np.argsort(able[edges], kind="stable")]
        values = np.array([value(int(a), side == "first") for a in edges]).reshape(-1, 2)
        own_us, split_us = _staircase(able[edges], values[:, 0], need), _staircase(able[edges], values[:, 1], need)
        holding = [{"edge": int(a), "op": graph.names[ops[a]], "cut_ms": path.cut[a] / 1e3, "able_from_ms": able[a] / 1e3,
                    "own_ms": v[0] / 1e3, "split_ms": v[1] / 1e3}
                   for a, v in zip(edges, values) if v[1] <= split_us + 1e3]
        out[side] = {"edges": len(edges), "need_ms": need / 1e3, "staircase_own_ms": own_us / 1e3,
                     "staircase_split_ms": split_us / 1e3, "holding": holding[:12]}
    return out


def regions(path: CriticalPath, ends) -> list:
    graph, rel, ops = path.graph, path.rel, path.ops
    anc, desc = turn_sides(graph, int(ops[path.q]))
    position = np.full(graph.n_ops, -1)
    position[ops] = np.arange(len(ops))
    src, dst, out = graph.edge_src, graph.edge_dst, graph.output_bytes
    items = np.unique(src[anc[src] & (src != ops[path.q]) & desc[dst] & (out[src] > 0) & (rel.cut_us > 0)])
    us_per_byte = 1.0 / float(path.cluster.bandwidth_bytes_per_us[~np.eye(path.cluster.n_devices, dtype=bool)].max())
    whole, _ = _turn_items(graph, ops, path.q, us_per_byte, *_position_and_hold(graph, ops, us_per_byte))
    rows = []
    for end in ends:
        inside = turn_sides(graph, int(ops[end]))[0][items]
        on_path, off_path = items[inside & (position[items] >= 0)], items[inside & (position[items] < 0)]
        rows.append({"end": end, "op": graph.names[ops[end]], "on_path_output_gib": out[on_path].sum() / GiB,
                     "on_path_whole_tensor_gib": whole[: end + 1].sum() / GiB,
                     "off_path_output_gib": out[off_path].sum() / GiB})
    return rows


def run_items(path: CriticalPath, first: int, weigh):
    """For runs of P from position ``first`` on: held[b, c], the items of a run from b to c at start(o_b)
    (outputs of P ops before b, or of ops off P in anc(x) - x, read over an edge that costs time by a P op
    in [b, c], each once, weighed by ``weigh(edges)``), and the item edges with where they are made and read."""
    graph, rel, ops, q = path.graph, path.rel, path.ops, path.q
    m = len(ops)
    anc, _ = turn_sides(graph, int(ops[q]))
    position = np.full(graph.n_ops, -1)
    position[ops] = np.arange(m)
    src, dst, out = graph.edge_src, graph.edge_dst, graph.output_bytes
    before = ((position[src] >= 0) & (position[src] < position[dst])) | ((position[src] < 0) & anc[src] & (src != ops[q]))
    edges = np.flatnonzero((position[dst] >= first) & (rel.cut_us > 0) & np.isfinite(rel.cut_us) & (out[src] > 0)
                           & before)
    made_at, read_at, weight = position[src[edges]], position[dst[edges]], weigh(edges)
    held = np.zeros((m, m))
    for b in range(first, m):
        live = np.flatnonzero((made_at < b) & (read_at >= b))
        live = live[np.lexsort((read_at[live], src[edges[live]]))]
        first_read = live[np.unique(src[edges[live]], return_index=True)[1]]
        np.add.at(held[b], read_at[first_read], weight[first_read])
        held[b] = np.cumsum(held[b])
    return held, edges, made_at, read_at


def backward_runs(path: CriticalPath, steps_ms, instant: int) -> dict:
    graph, cluster, rel, ops, q = path.graph, path.cluster, path.rel, path.ops, path.q
    m = len(ops)
    src, out = graph.edge_src, graph.output_bytes
    bandwidth = float(cluster.bandwidth_bytes_per_us[~np.eye(cluster.n_devices, dtype=bool)].max())
    held, edges, made_at, read_at = run_items(
        path, q + 1, lambda edges: np.minimum(out[src[edges]], bandwidth * rel.cut_us[edges]))
    footprint = rel.footprint[ops].min(axis=1)
    head = rel.head_us[ops]
    critical_us = path.plain_us([])

    def least_cuts_us(step_us):
        room = float(cluster.memory_bytes.max()) - footprint + bandwidth * np.maximum(step_us - head, 0.0)
        least = np.full(m + 1, np.inf)
        least[q + 1] = 0.0
        for c in range(q + 1, m):
            over = np.flatnonzero(held[q + 1:c + 1, c] > room[q + 1:c + 1])
            lo = q + 1 + (int(over.max()) + 1 if len(over) else 0)
            if lo <= c:
                least[c + 1] = least[lo:c + 1].min() + (path.cut[c] if c < m - 1 else 0.0)
        return float(least[m])

    steps = {f"{t:g}": least_cuts_us(t * 1e3) / 1e3 for t in steps_ms}
    live = np.flatnonzero((made_at < instant) & (read_at >= instant))
    producers = np.unique(src[edges[live]])
    cheap = np.unique(src[edges[live][rel.cut_us[edges[live]] < 1e3]])
    return {"least_cut_ms_by_step_ms": steps,
            "plain_bound_ms": max(min(t, critical_us / 1e3 + v) for t, v in zip(steps_ms, steps.values())),
            "instant": {"position": instant, "op": graph.names[ops[instant]],
                        "items_output_gib": out[producers].sum() / GiB,
                        "items_weighed_gib": held[instant, m - 1] / GiB,
                        "output_of_items_crossing_under_1_ms_gib": out[cheap].sum() / GiB,
                        "items_crossing_under_1_ms": len(cheap)}}


# round 35's witnesses (``results/turn_runs_ceiling.json``): T in ms, cut P edges, device per run
WITNESSES = {"392, least cut cost": ((20, 88, 170, 301), (0, 3, 0, 3, 0)),
             "393": ((39, 78, 261, 330), (0, 1, 2, 1, 0)),
             "400, eager": ((38, 261, 301, 324), (0, 1, 2, 0, 3)),
             "450, eager": ((0, 40, 78, 260, 261, 301, 320), (0, 1, 0, 2, 0, 3, 0, 1))}


def assignments(path: CriticalPath, best_placement: Path | None) -> dict:
    ops, p, m = path.ops, path.rel.fastest_us[path.ops], len(path.ops)
    lam = {}
    for i in range(m):
        for j in range(i + 2, min(m, i + WINDOW + 1)):
            lam_us = chord_lambda_us(path, int(ops[i]), int(ops[j]))
            if lam_us is not None and lam_us > -np.inf:
                lam[i, j] = lam_us

    def values(devices):
        cuts = [i for i in range(m - 1) if devices[i] != devices[i + 1]]
        finish = np.zeros(m)
        for j in range(m):
            start = 0.0 if j == 0 else finish[j - 1] + (path.cut[j - 1] if j - 1 in cuts else 0.0)
            for i in range(max(0, j - WINDOW), j - 1):
                if (i, j) in lam and devices[i] != devices[j]:
                    start = max(start, finish[i] + lam[i, j])
            finish[j] = start + p[j]
        head, tail = path.windows(cuts)
        fp = path.rel.fastest_us
        windowed = float((head + fp + tail).max())
        chorded = max([windowed] + [head[ops[i]] + fp[ops[i]] + v + fp[ops[j]] + tail[ops[j]]
                                    for (i, j), v in lam.items() if devices[i] != devices[j]])
        return {"cuts": len(cuts), "cut_ms": float(path.cut[cuts].sum()) / 1e3, "plain_ms": path.plain_us(cuts) / 1e3,
                "plain_chords_ms": float(finish[-1]) / 1e3, "windowed_ms": windowed / 1e3,
                "windowed_one_chord_ms": float(chorded) / 1e3}

    out = {}
    for name, (cuts, runs) in WITNESSES.items():
        devices = np.empty(m, np.int64)
        for start, end, device in zip((0, *[c + 1 for c in cuts]), (*[c + 1 for c in cuts], m), runs):
            devices[start:end] = device
        out[name] = values(devices)
    if best_placement is not None:
        check = json.loads(best_placement.read_text())["check"]
        out[f"sim-search's best, {check['step_ms']:.3f} ms"] = values(np.asarray(check["devices"])[ops])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--memory-fraction", type=float, default=0.3)
    parser.add_argument("--crossing-mib", type=float, default=196.0)
    parser.add_argument("--targets-ms", type=float, nargs="*", default=[430.0, 482.913])
    parser.add_argument("--region-ends", type=int, nargs="*", default=[4, 14, 24, 34, 44, 74])
    parser.add_argument("--backward-instant", type=int, default=305, help="a P position after the probe")
    parser.add_argument("--best-placement", type=Path,
                        default=Path(__file__).parent / "results" / "turn_runs_ceiling_check.json")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    graph = cached_graph(f"zoo:{args.model}")
    cluster = dp.load_cluster(PRESET).with_memory_fraction(args.memory_fraction)
    began = time.perf_counter()
    path = CriticalPath(graph, cluster)
    result = {"model": args.model, "memory_fraction": args.memory_fraction, "probe": graph.names[path.ops[path.q]],
              "probe_position": path.q, "path_ops": len(path.ops),
              "ceiling": ceiling(path, args.crossing_mib, args.targets_ms)}
    result["chord_split"] = chord_split(path)
    result["regions"] = regions(path, args.region_ends)
    result["backward_runs"] = backward_runs(path, np.arange(392, 561, 4).tolist(), args.backward_instant)
    result["assignments"] = assignments(path, args.best_placement if args.model == "resnet50" else None)
    result["seconds"] = round(time.perf_counter() - began, 1)
    write_text_atomic(args.out, json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
