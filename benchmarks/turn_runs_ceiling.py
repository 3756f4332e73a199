"""Round 35: how high can a bound go that charges EVERY run of the critical path at the forward/backward
turn, not just the first (``turn_cut_us``)? Measured before building it, as a ceiling.

Take P (the path ``turn_cut_us`` reads), its probe x = o_q, s = start(x), and the turn's *items*: outputs f of
ops in anc(x), f != x, read over an edge that costs time by an op in desc(x). An item made at P position a
(its producer o_a) and read at P positions B (readers o_b, b > q) weighs its output bytes where it is held
and, when it crosses a channel, its longest edge's hold time (``turn_cut_us``; bytes / the fastest bandwidth).
For one T this script minimises, over device assignments of P's positions (4 devices, HiGHS MIP), the cost of
P's cut edges subject to rows that hold for every placement whose step is T (each is a fact ``turn_cut_us``'s
proof already uses; per device d):

- ``mem``: the items held on d at s weigh at most d's memory; an item made on d and read on d by a P op is
  held (its producer copy lives until its readers there finish, after s);
- ``ship``: the items made on d and not held there were shipped through d's channel within [0, s];
- ``recv``: the items read on d and not held there arrive through d's channel within [s, T];
- ``chan``: an item made on d and read elsewhere (or the reverse) holds d's channel within [0, T];
- ``eager`` (optimistic, not proven: it ignores a transfer queued past s): an item read on d is held there.

s is a variable in [head_x, T - p_x - tail_x]. One channel per GPU, both ways (``sequential``, the zoo's
cluster; under ``duplex`` ``chan`` would split into a send and a receive row).

``runs`` is the brief's version: only P's forward runs, each run's made bytes (output or hold, the smaller)
at most the memory plus the channel's capacity in [0, s]. Each assignment found is valued two ways: *plain*,
P's compute plus its cut costs, and *windowed*, the comm path with those cut edges forced (what
``turn_cut_us`` computes for one edge). A bound from these rows reaches at most the largest min(T', g(T')),
g(T') the least value over assignments feasible at T'; an assignment feasible at T with value v caps that at
max(T, v) (for T' >= T, g(T') <= v). The windowed search minimises a surrogate (each edge's own windowed
rise plus a tenth of its cost), so its values are witnesses, upper estimates of g (a ceiling, not a bound).
HiGHS runs to a node limit, not a time limit, so the figures do not depend on the machine's load; "check"
runs fix one assignment.

    PYTHONPATH=$PWD python benchmarks/turn_runs_ceiling.py --out benchmarks/results/turn_runs_ceiling.json
    ... --check resnet50 devices.npy priority.npy     # the rows on a placement, at its own step
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import PRESET, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.bounds import relaxation  # noqa: E402
from devplace.bounds.relaxation import longest_path, windows_us  # noqa: E402
from devplace.bounds.turn_path import turn_probe, turn_sides  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.sim.engine import memory_events  # noqa: E402

GiB = 2**30
ROWS = ("mem", "ship", "recv", "chan")
# (model, T in ms, rows, objective): the runs whose figures the round's notes quote. An objective that is a
# pair (cut edges, device per run) checks that one assignment (the searches found these; HiGHS's path to them
# depends on its node order, so the ceiling's witnesses are checked on their own)
RUNS = {
    "resnet50": [(392, "runs", "cost"), (400, "runs", "cost"), (392, ROWS, "cost"),
                 (393, ROWS, ((39, 78, 261, 330), (0, 1, 2, 1, 0))), (397, ROWS, ((40, 80, 259, 333), (0, 3, 1, 3, 0))),
                 (400, ROWS + ("eager",), ((38, 261, 301, 324), (0, 1, 2, 0, 3))),
                 (450, ROWS + ("eager",), ((0, 40, 78, 260, 261, 301, 320), (0, 1, 0, 2, 0, 3, 0, 1))),
                 (393, ROWS, "windowed"), (400, ROWS + ("eager",), "windowed"), (400, ROWS + ("eager",), "cost")],
    "inception_v3": [(197, "runs", "cost"), (197, ROWS, "cost"), (197, ROWS + ("eager",), "cost")],
    "transformer": [(378, "runs", "cost"), (378, ROWS, "cost"), (378, ROWS + ("eager",), "cost")],
}


@dataclass
class Turn:
    """P, its probe and the turn's items (see the module docstring)."""

    path_ops: np.ndarray
    path_edges: np.ndarray
    q: int
    us_per_byte: float
    producers: np.ndarray      # per item: its producer op
    made_at: np.ndarray        # per item: its producer's P position, -1 off P
    read_at: list              # per item: the P positions of its readers after x
    out_bytes: np.ndarray      # per item: output bytes (what holding it weighs)
    hold_bytes: np.ndarray     # per item: its longest edge's hold time / us_per_byte, at most out_bytes
    cut_us: np.ndarray         # per P edge
    p_us: np.ndarray
    head_us: np.ndarray
    tail_us: np.ndarray
    memory_bytes: float
    n_devices: int


def turn_of(graph, cluster, rel) -> Turn:
    path_ops, path_edges = longest_path(graph, rel.fastest_us, np.where(rel.forced_cut, rel.cut_us, 0.0))
    x = turn_probe(graph, rel, path_ops)
    n, n_dev = graph.n_ops, cluster.n_devices
    us_per_byte = 1.0 / float(cluster.bandwidth_bytes_per_us[~np.eye(n_dev, dtype=bool)].max())
    anc, desc = turn_sides(graph, x)
    position = np.full(n, -1, np.int64)
    position[path_ops] = np.arange(len(path_ops))
    src, dst, out = graph.edge_src, graph.edge_dst, graph.output_bytes
    hold = np.where(np.isnan(graph.edge_fixed_us), graph.edge_bytes * us_per_byte, graph.edge_fixed_us)
    crossing = np.flatnonzero(anc[src] & (src != x) & desc[dst] & (out[src] > 0) & (rel.cut_us > 0))
    producers = np.unique(src[crossing])
    index = {int(f): i for i, f in enumerate(producers)}
    read_at = [set() for _ in producers]
    hold_bytes = np.zeros(len(producers))
    for e in crossing:
        i = index[int(src[e])]
        hold_bytes[i] = max(hold_bytes[i], min(float(out[src[e]]), hold[e] / us_per_byte))
        if position[dst[e]] >= 0:
            read_at[i].add(int(position[dst[e]]))
    return Turn(path_ops, path_edges, int(np.flatnonzero(path_ops == x)[0]), us_per_byte, producers, position[producers],
                [sorted(b) for b in read_at], out[producers].astype(float), hold_bytes, rel.cut_us[path_edges],
                rel.fastest_us[path_ops], rel.head_us[path_ops], rel.tail_us[path_ops],
                float(cluster.memory_bytes.max()), n_dev)


def runs_cut_us(turn: Turn, step_us: float) -> float:
    """The brief's version: least cost of cuts splitting P's forward into runs whose made bytes (output or
    hold, the smaller) fit the memory plus the channel's capacity in [0, s], s <= T - p_x - tail_x."""
    q = turn.q
    s_us = step_us - turn.p_us[q] - turn.tail_us[q]
    cap = turn.memory_bytes + max(s_us, 0.0) / turn.us_per_byte
    made = np.zeros(q)
    on_path = (turn.made_at >= 0) & (turn.made_at < q)
    np.add.at(made, turn.made_at[on_path], np.minimum(turn.out_bytes, turn.hold_bytes)[on_path])
    prefix = np.concatenate([[0.0], np.cumsum(made)])
    least = np.full(q + 1, np.inf)      # least cost of runs covering positions < j, a cut before j
    least[0] = 0.0
    for j in range(1, q + 1):
        for i in range(j):
            if prefix[j] - prefix[i] <= cap and np.isfinite(least[i]):
                cost = least[i] + (turn.cut_us[i - 1] if i > 0 else 0.0)
                least[j] = min(least[j], cost)
    return float(least[q])


def device_program(turn: Turn, step_us: float, rows, weight, fix=None, node_limit: int = 4000):
    """The MIP of the module docstring: (objective, HiGHS dual bound, status, device per P position)."""
    m, n_dev, q, r = len(turn.path_ops), turn.n_devices, turn.q, turn.us_per_byte
    n_items = len(turn.out_bytes)
    z0, y0 = 0, m * n_dev
    h0 = y0 + m - 1
    ship0, recv0, out0, in0 = (h0 + k * n_items * n_dev for k in range(1, 5))
    s_var = in0 + n_items * n_dev
    n_vars = s_var + 1

    def z(i, d):
        return z0 + i * n_dev + d

    def per_item(base, f, d):
        return base + f * n_dev + d

    coo_r, coo_c, coo_v, lo, hi = [], [], [], [], []

    def row(terms, low, high):
        for col, val in terms:
            coo_r.append(len(lo))
            coo_c.append(col)
            coo_v.append(val)
        lo.append(low)
        hi.append(high)

    for i in range(m):
        row([(z(i, d), 1) for d in range(n_dev)], 1, 1)
    for i in range(m - 1):
        for d in range(n_dev):
            if np.isfinite(turn.cut_us[i]):
                row([(y0 + i, 1), (z(i, d), -1), (z(i + 1, d), 1)], 0, np.inf)
            else:
                row([(z(i, d), 1), (z(i + 1, d), -1)], 0, 0)
    for d in range(n_dev):
        mem, ship, recv, chan = [], [], [], []
        for f in range(n_items):
            a, readers = int(turn.made_at[f]), turn.read_at[f]
            h = per_item(h0, f, d)
            if a >= 0:
                for b in readers:
                    row([(h, 1), (z(a, d), -1), (z(b, d), -1)], -1, np.inf)
                    row([(per_item(out0, f, d), 1), (z(a, d), -1), (z(b, d), 1)], 0, np.inf)
                    row([(per_item(in0, f, d), 1), (z(b, d), -1), (z(a, d), 1)], 0, np.inf)
                row([(per_item(ship0, f, d), 1), (z(a, d), -1), (h, 1)], 0, np.inf)
            for b in readers:
                row([(per_item(recv0, f, d), 1), (z(b, d), -1), (h, 1)], 0, np.inf)
                if "eager" in rows:
                    row([(h, 1), (z(b, d), -1)], 0, np.inf)
            mem.append((h, turn.out_bytes[f]))
            us = r * turn.hold_bytes[f]
            ship.append((per_item(ship0, f, d), us))
            recv.append((per_item(recv0, f, d), us))
            chan += [(per_item(out0, f, d), us), (per_item(in0, f, d), us)]
        if "mem" in rows:
            row(mem, -np.inf, turn.memory_bytes)
        if "ship" in rows:
            row(ship + [(s_var, -1)], -np.inf, 0)
        if "recv" in rows:
            row(recv + [(s_var, 1)], -np.inf, step_us)
        if "chan" in rows:
            row(chan, -np.inf, step_us)
    s_low, s_high = turn.head_us[q], step_us - turn.p_us[q] - turn.tail_us[q]
    if s_high < s_low:
        return np.inf, np.inf, "s has no room", None
    matrix = sparse.csr_array((coo_v, (coo_r, coo_c)), shape=(len(lo), n_vars))
    objective = np.zeros(n_vars)
    objective[y0:y0 + m - 1] = np.where(np.isfinite(weight), weight, 0.0)
    integrality = np.zeros(n_vars)
    integrality[z0:z0 + m * n_dev] = 1
    low, high = np.zeros(n_vars), np.ones(n_vars)
    low[s_var], high[s_var] = s_low, s_high
    if fix is None:
        low[z(0, 0)] = 1        # the devices are alike: P starts on device 0
    else:
        for i in range(m):
            for d in range(n_dev):
                low[z(i, d)] = high[z(i, d)] = float(fix[i] == d)
    res = milp(objective, constraints=LinearConstraint(matrix, lo, hi), integrality=integrality,
               bounds=Bounds(low, high), options=dict(node_limit=node_limit))
    if res.x is None:
        return np.inf, np.inf, res.message, None
    devices = res.x[z0:z0 + m * n_dev].reshape(m, n_dev).argmax(axis=1)
    return float(res.fun), float(getattr(res, "mip_dual_bound", np.nan)), res.message, devices


def _spread(pattern, m: int) -> np.ndarray:
    """Device per P position from (cut edges, device per run)."""
    cuts, runs = pattern
    devices = np.empty(m, np.int64)
    for start, end, device in zip((0, *[c + 1 for c in cuts]), (*[c + 1 for c in cuts], m), runs):
        devices[start:end] = device
    return devices


def backward_held_gib(graph, rel, turn: Turn, devices: np.ndarray) -> list:
    """Optimistic multi-instant memory of one P assignment (not a proven row): per GPU, the most it holds at
    the start of a backward P op o_b there, counting o_b's output and temporaries, the persistent bytes of P's ops
    there, and every output of an earlier P op that a P op at b or later reads there (as if every transfer
    began when its producer finished). Off-P ops are left out."""
    position = np.full(graph.n_ops, -1, np.int64)
    position[turn.path_ops] = np.arange(len(turn.path_ops))
    src, dst = graph.edge_src, graph.edge_dst
    inner = (position[src] >= 0) & (position[dst] > position[src]) & (graph.output_bytes[src] > 0) & (rel.cut_us > 0)
    made, read = position[src[inner]], position[dst[inner]]
    footprint = (graph.output_bytes + graph.temp_bytes)[turn.path_ops]
    persistent = np.bincount(devices, weights=graph.persistent_bytes[turn.path_ops], minlength=turn.n_devices)
    held = np.zeros(turn.n_devices)
    for b in range(turn.q + 1, len(turn.path_ops)):
        d = devices[b]
        live = np.unique(made[(made < b) & (read >= b) & (devices[read] == d)])
        held[d] = max(held[d], footprint[b] + persistent[d] + graph.output_bytes[turn.path_ops[live]].sum())
    return [round(float(h) / GiB, 3) for h in held]


def windowed_us(graph, rel, turn: Turn, cuts) -> float:
    """The comm path with these P edges always cut (the value ``turn_cut_us`` gives one edge)."""
    forced = rel.forced_cut.copy()
    forced[turn.path_edges[list(cuts)]] = True
    head, tail = windows_us(graph, rel.fastest_us, rel.cut_us, forced)
    return float((head + rel.fastest_us + tail).max(initial=0.0))


def measure(model: str, runs) -> dict:
    graph = cached_graph(f"zoo:{model}")
    cluster = dp.load_cluster(PRESET).with_memory_fraction(0.3)
    rel = relaxation(graph, cluster)
    turn = turn_of(graph, cluster, rel)
    on_path = (turn.made_at >= 0) & np.array([len(b) > 0 for b in turn.read_at])
    report = {
        "model": model, "path_ops": len(turn.path_ops), "probe_position": turn.q,
        "items": len(turn.out_bytes), "items_gib": turn.out_bytes.sum() / GiB,
        "items_made_and_read_on_path_gib": turn.out_bytes[on_path].sum() / GiB,
        "their_hold_gib": turn.hold_bytes[on_path].sum() / GiB, "memory_gib": turn.memory_bytes / GiB,
        "critical_path_ms": turn.p_us.sum() / 1e3, "comm_path_ms": windowed_us(graph, rel, turn, []) / 1e3, "runs": [],
    }
    print(f"{model}: P {len(turn.path_ops)} ops, probe at {turn.q}, items {report['items']} "
          f"({report['items_gib']:.3f} GiB; made and read on P {report['items_made_and_read_on_path_gib']:.3f}, "
          f"hold {report['their_hold_gib']:.3f}), memory {report['memory_gib']:.3f} GiB, critical path "
          f"{report['critical_path_ms']:.3f} ms, comm path {report['comm_path_ms']:.3f} ms", flush=True)
    base = report["comm_path_ms"] * 1e3
    rise = None
    for step_ms, rows, objective in runs:
        began = time.perf_counter()
        if rows == "runs":
            cost = runs_cut_us(turn, step_ms * 1e3)
            entry = {"T_ms": step_ms, "rows": "runs", "objective": "cost", "cut_ms": cost / 1e3,
                     "plain_ms": (turn.p_us.sum() + cost) / 1e3}
        else:
            if objective == "windowed" and rise is None:      # each edge's own windowed rise
                rise = np.array([windowed_us(graph, rel, turn, [i]) - base if np.isfinite(c) else np.inf
                                 for i, c in enumerate(turn.cut_us)])
            weight = turn.cut_us if objective != "windowed" else rise + 0.1 * turn.cut_us
            fix = None if isinstance(objective, str) else _spread(objective, len(turn.path_ops))
            value, dual, status, devices = device_program(turn, step_ms * 1e3, rows, weight, fix=fix)
            objective = objective if isinstance(objective, str) else "check"
            cuts = [] if devices is None else [int(i) for i in np.flatnonzero(np.diff(devices))]
            cost = float(turn.cut_us[cuts].sum())
            entry = {"T_ms": step_ms, "rows": list(rows), "objective": objective, "status": str(status),
                     "objective_value": value / 1e3 if objective != "windowed" else value,
                     "dual": dual / 1e3 if objective != "windowed" else dual,
                     "cuts": cuts, "devices": None if devices is None else [int(devices[0])] + [int(devices[i + 1]) for i in cuts],
                     "cut_ms": cost / 1e3, "plain_ms": (turn.p_us.sum() + cost) / 1e3,
                     "windowed_ms": windowed_us(graph, rel, turn, cuts) / 1e3,
                     "backward_held_gib": None if devices is None else backward_held_gib(graph, rel, turn, devices)}
        entry["seconds"] = time.perf_counter() - began
        report["runs"].append(entry)
        print("  " + json.dumps(entry), flush=True)
    return report


def check(model: str, devices_path: str, priority_path: str | None) -> dict:
    """The rows on one placement at its own step: a placement's P assignment must be feasible."""
    graph = cached_graph(f"zoo:{model}")
    cluster = dp.load_cluster(PRESET).with_memory_fraction(0.3)
    rel = relaxation(graph, cluster)
    turn = turn_of(graph, cluster, rel)
    devices = np.load(devices_path)
    priority = np.load(priority_path) if priority_path else None
    result = dp.simulate(graph, cluster, dp.Placement(devices=devices, priority=priority))
    step_us = result.step_time_us
    out = {"model": model, "step_ms": step_us / 1e3, "devices": devices.tolist(),
           "priority": None if priority is None else priority.tolist(), "rows": {},
           "memory_gib": _memory_by_kind(graph, turn, result)}
    print(json.dumps(out["memory_gib"]))
    out["backward_held_gib"] = backward_held_gib(graph, rel, turn, devices[turn.path_ops])
    print("backward instants, most held per GPU (GiB, P's ops only):", out["backward_held_gib"])
    for rows in (ROWS, ROWS + ("eager",)):
        value, _, status, _ = device_program(turn, step_us, rows, turn.cut_us, fix=devices[turn.path_ops])
        out["rows"]["+".join(rows)] = {"feasible": bool(np.isfinite(value)), "path_cut_ms": value / 1e3}
        print(f"{model} placement at its step {step_us / 1e3:.3f} ms, rows {'+'.join(rows)}: feasible "
              f"{np.isfinite(value)}, its P cut cost {value / 1e3:.3f} ms", flush=True)
    return out


def _memory_by_kind(graph, turn: Turn, result) -> dict:
    """Per device, what it holds at s = start(x) and at its peak: persistent bytes, the turn's items made on P,
    those made off P, and everything else (the backward's own outputs and temporaries), GiB."""
    devices = result.devices
    order = np.argsort(graph.edge_src, kind="stable")
    succ_ptr = np.searchsorted(graph.edge_src[order], np.arange(graph.n_ops + 1))
    at, device, delta, owner, n_persistent = memory_events(
        succ_ptr, order, graph.edge_dst, graph.edge_order_only, devices, result.cluster.n_devices, result.start_us, result.finish_us,
        graph.persistent_bytes, graph.output_bytes, graph.temp_bytes, result.transfer_op, result.transfer_dst,
        result.transfer_start_us, result.transfer_end_us)
    kind = np.full(graph.n_ops, 3)                       # 3: other
    producers = np.flatnonzero(np.isin(np.arange(graph.n_ops), turn.producers))
    kind[producers] = np.where(np.isin(producers, turn.path_ops), 1, 2)
    kinds = ("persistent", "items made on P", "items made off P", "other")
    s_us = result.start_us[turn.path_ops[turn.q]]
    report = {"s_ms": s_us / 1e3}
    for d in range(result.cluster.n_devices):
        mine = np.flatnonzero(device == d)
        persistent = mine[mine < n_persistent]
        events = mine[mine >= n_persistent]
        events = events[np.lexsort((delta[events] > 0, at[events]))]     # by time, frees first
        level = np.cumsum(delta[events])
        peak_at = at[events[int(np.argmax(level))]] if len(events) else 0.0

        def held(t):
            upto = events[at[events] <= t]
            by = np.bincount(kind[owner[upto]], weights=delta[upto], minlength=4)
            by[0] = delta[persistent].sum()
            return {k: round(float(b) / GiB, 3) for k, b in zip(kinds, by)}
        report[f"device {d}"] = {"at s": held(s_us), "peak_ms": float(peak_at) / 1e3, "at peak": held(peak_at)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(RUNS))
    parser.add_argument("--check", nargs="+", metavar=("MODEL", "DEVICES_NPY"), help="MODEL DEVICES.npy [PRIORITY.npy]")
    parser.add_argument("--plain-steps-ms", nargs="*", type=float, default=None,
                        help="instead of RUNS: the least P cut cost under ROWS at these steps (the plain fixed point)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "models": []}
    if args.check:
        report["check"] = check(args.check[0], args.check[1], args.check[2] if len(args.check) > 2 else None)
    else:
        runs = {m: [(t, ROWS, "cost") for t in args.plain_steps_ms] for m in args.models} if args.plain_steps_ms else RUNS
        report["models"] = [measure(model, runs[model]) for model in args.models]
    report["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    if args.out:
        write_text_atomic(args.out, json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
