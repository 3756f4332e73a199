"""ResNet-50 at 30% memory by hand (issue 15, point 3, round 44): where sim-search's best loses its
time over one GPU, and what the folded placement a person would build reaches.

A training step of one batch barely overlaps across GPUs, so a split placement costs about the
one-device time plus what crosses on the critical path. This script measures both sides of that:

1. the reference placement (sim-search's best; ``--reference FILE.json`` with its ``devices`` and
   ``priority``, else ``dp.place`` runs here): its simulated critical path split into compute
   (``gap_sides.decompose``), every hop across GPUs (tensor MiB, channel queue, transfer, forward or
   backward), and the compute that runs off the path, by role;
2. folded plans: the step as a line of leader units (a forward op with its backward and update
   ops, as the cheapest-cut starts), cut at four boundaries onto GPUs 0 1 2 3 0 (the stem's GPU
   also holds the last layers); each judged in the search's three orders, the best order kept;
3. from each plan, a *boundary descent*: every unit (colocation group) within ``--window`` leader
   units of a boundary put on the other side's GPU, first the moves that lower the overflow,
   then those that make the step faster and still fit, until a pass moves nothing (this is what
   moves a block's backward ops apart from its forward ops, so the backward crosses at smaller
   gradients);
4. annealing rounds (``anneal._track_rounds``, 2,000 evals each) from the fastest plan after its
   descent, at each of ``--seeds``.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/folded_by_hand.py --reference REF.json

Writes ``benchmarks/results/folded_by_hand.json``. Evals count simulator calls; seconds are wall
clock on a shared machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gap_sides import decompose  # noqa: E402
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.graph import Role  # noqa: E402
from devplace.placers._moves import respect_colocation  # noqa: E402
from devplace.portfolio.sim_search.anneal import _track_rounds  # noqa: E402
from devplace.portfolio.sim_search.config import SearchConfig  # noqa: E402
from devplace.portfolio.sim_search.search import _Search  # noqa: E402
from devplace.sim import Simulator  # noqa: E402

OUT = RESULTS / "folded_by_hand.json"
MEMORY_FRACTION = 0.3
FOLDED = (0, 1, 2, 3, 0)        # GPU per stage: the stem's GPU holds the last stage too
MIB, GIB = 2**20, 2**30


def hops(result) -> list[dict]:
    """Each hop across GPUs on the simulated critical path: tensor, queue and transfer (ms)."""
    graph, path, on = result.graph, result.critical_path, result.devices
    rows = []
    for a, b in zip(path[:-1], path[1:]):
        if on[a] == on[b]:
            continue
        x = np.flatnonzero((result.transfer_op == a) & (result.transfer_dst == on[b]))[0]
        rows.append({"from": graph.names[a], "to": graph.names[b], "gpus": f"{on[a]}>{on[b]}",
                     "MiB": round(float(result.transfer_bytes[x]) / MIB, 1),
                     "queue_ms": round(float(result.transfer_start_us[x] - result.finish_us[a]) / 1e3, 2),
                     "transfer_ms": round(float(result.transfer_end_us[x] - result.transfer_start_us[x]) / 1e3, 2),
                     "pass": Role(graph.role[a]).name.lower()})
    return rows


def breakdown(graph, cluster, devices: np.ndarray, priority: np.ndarray | None) -> dict:
    """``decompose``'s split of the critical path, its hops, and the compute off it by role (ms)."""
    placement = dp.Placement(devices, priority=priority)
    result = Simulator(graph, cluster).run(placement)
    off = np.ones(graph.n_ops, bool)
    off[result.critical_path] = False
    compute_us = result.op_time_us + cluster.op_gap_us
    off_ms = {Role(k).name.lower(): round(float(compute_us[off & (graph.role == k)].sum()) / 1e3, 2)
              for k in np.unique(graph.role)}
    parts = decompose(graph, cluster, placement, np.zeros(0, np.int64))   # no bound path: all compute is "off P"
    keep = ("step_ms", "channel_queue_ms", "transfer_ms", "other_wait_ms", "hops", "busy_ms", "peak_gib")
    return {k: parts[k] for k in keep} | {"path_compute_ms": parts["compute_off_P_ms"],
                                           "off_path_compute_ms": off_ms, "path_hops": hops(result)}


def unit_positions(search: _Search) -> np.ndarray:
    """Each op's place on the line of leader units in step order (a colocation group at its
    earliest member's unit, as the cheapest-cut starts place it)."""
    units, fine = search.leaders, search.fine
    earliest = np.full(fine.n_units, units.n_units, np.int64)
    np.minimum.at(earliest, fine.unit_of, units.unit_of)
    return earliest[fine.unit_of]


def folded_plan(search: _Search, position: np.ndarray, cuts: tuple[int, ...]) -> np.ndarray:
    """Each op's GPU when the line is cut at ``cuts`` onto the GPUs of ``FOLDED``."""
    stage = np.searchsorted(np.asarray(cuts), position, side="right")
    return respect_colocation(search.fine, np.asarray(FOLDED)[stage])


def boundary_descent(search: _Search, devices: np.ndarray, priority, position: np.ndarray,
                     cuts: tuple[int, ...], window: int, passes: int = 6) -> tuple[np.ndarray, float, float]:
    """Units near each boundary put on the other side's GPU while that lowers (overflow, step);
    returns the devices, the step (us) and the overflow (bytes) at the end."""
    overflow, step, _ = search.measure(devices, priority)
    moves = []
    for k, cut in enumerate(cuts):
        near = np.flatnonzero((position >= cut - window) & (position < cut + window))
        moves += [(u, (FOLDED[k], FOLDED[k + 1])) for u in np.unique(search.fine.unit_of[near])]
    members = {u: np.flatnonzero(search.fine.unit_of == u) for u, _ in moves}
    for _ in range(passes):
        moved = 0
        for u, sides in moves:
            for d in sides:
                if d == devices[members[u][0]]:
                    continue
                trial = devices.copy()
                trial[members[u]] = d
                o, s, _ = search.measure(trial, priority)
                if (o, s) < (overflow, step - 1e-6) and (o == 0 or o < overflow):
                    devices, overflow, step, moved = trial, o, s, moved + 1
                    break
        if not moved:
            break
    return devices, step, overflow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--reference", help="JSON with the reference placement's devices and priority")
    parser.add_argument("--first", default="14", help="boundaries after the stem (comma-separated)")
    parser.add_argument("--second", default="96", help="boundaries in the 56x56 layers")
    parser.add_argument("--third", default="133,180,184,217,254")
    parser.add_argument("--fourth", default="338,375,412,416,449,486")
    parser.add_argument("--window", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    graph = cached_graph(f"zoo:{args.model}")
    machine = dp.load_cluster(PRESET)
    cluster = machine.with_memory_fraction(MEMORY_FRACTION)
    out = {"model": args.model, "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
           "load_1min": round(os.getloadavg()[0], 2), "window": args.window, "rounds": args.rounds}
    one_device = np.zeros(graph.n_ops, np.int64)
    out["one_device_ample_ms"] = round(Simulator(graph, machine).step_time_us(one_device) / 1e3, 3)
    if args.reference:
        ref = json.loads(Path(args.reference).read_text())
        ref_devices, ref_priority = np.asarray(ref["devices"]), ref.get("priority")
        ref_priority = None if ref_priority is None else np.asarray(ref_priority, np.float64)
    else:
        placement = dp.place(graph, cluster, algo="sim-search", seed=0)
        ref_devices, ref_priority = placement.devices, placement.priority
    out["reference"] = breakdown(graph, cluster, ref_devices, ref_priority)
    print(json.dumps({k: v for k, v in out["reference"].items() if k != "path_hops"}), flush=True)

    search = _Search(graph, cluster, SearchConfig(), 0)
    position = unit_positions(search)
    grid = [tuple(int(c) for c in getattr(args, k).split(",")) for k in ("first", "second", "third", "fourth")]
    plans, best = [], None
    for cuts in itertools.product(*grid):
        devices = folded_plan(search, position, cuts)
        judged = []
        for name, priority in search.orders(devices):
            overflow, step, _ = search.measure(devices, priority)
            judged.append((overflow, step, name, priority))
        overflow, step, name, priority = min(judged, key=lambda j: j[:2])
        began = search.evals
        descended, after, left = boundary_descent(search, devices, priority, position, cuts, args.window)
        row = {"cuts": list(cuts), "order": name, "plan_ms": round(step / 1e3, 3), "plan_over_gib": round(overflow / GIB, 3),
               "descent_ms": round(after / 1e3, 3) if left == 0 else None, "descent_evals": search.evals - began}
        plans.append(row)
        print(json.dumps(row), flush=True)
        if left == 0 and (best is None or after < best[0]):
            best = (after, descended, priority, row)
    out["plans"] = plans
    if best is None:
        write_text_atomic(OUT, json.dumps(out, indent=1))
        return
    out["hand"] = breakdown(graph, cluster, best[1], best[2]) | {"cuts": best[3]["cuts"], "order": best[3]["order"]}
    print(json.dumps({k: v for k, v in out["hand"].items() if k != "path_hops"}), flush=True)
    out["annealed"] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        search = _Search(graph, cluster, SearchConfig(), seed)
        search.offer(best[0], best[1], best[2], "folded by hand")
        rounds, after = _track_rounds(search, search.best, "folded by hand", args.rounds, 1.0)
        row = {"seed": seed, "rounds": rounds, "evals": search.evals, "ms": round(after / 1e3, 3)}
        row |= {"breakdown": breakdown(graph, cluster, search.best[1], search.best[2])}
        out["annealed"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "breakdown"}), flush=True)
    write_text_atomic(OUT, json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
