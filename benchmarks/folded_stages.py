"""Stage plans of a zoo model at Baechi's 30% memory (issue 15, point 3): does a split exist that fits
and cuts where tensors are small, what it costs, and what each device holds at its peak.

For the model (roofline costs for ``baechi-4x2080``, each GPU at 30%) it lists sim-search's folded
stage plans (``devplace.portfolio.sim_search.stages.stage_plans``: the step cut between leader
units where the least crosses, 4 or 5 stages, one device possibly holding two stages that are not
neighbours, each device's estimated need within its memory), cheapest first, each simulated in the
search's three orders (step, peak per GPU, fits). Then the fastest that fits is annealed
``--rounds`` rounds with a fresh search (seed 0), as the track does. Then, for that plan, for the
cheapest plan counting the held bytes alone (no gradients), the cheapest of consecutive stages,
and ``--placement`` (a placement JSON with ``devices`` and
``priority``, e.g. sim-search's best), each GPU's peak split into weights and optimizer state,
saved activations (forward outputs a backward op reads), gradients (backward outputs) and what
is left (received copies and temporaries), read off the simulator at each GPU's peak.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/folded_stages.py [--model resnet50] [--plans 40] [--rounds 8]

Writes ``benchmarks/results/folded_stages.json``. Times are wall clock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.graph import Role  # noqa: E402
from devplace.placement import Placement  # noqa: E402
from devplace.placers._moves import live_bytes_at_peak, read_later, respect_colocation  # noqa: E402
from devplace.portfolio.sim_search.anneal import _anneal  # noqa: E402
from devplace.portfolio.sim_search.config import SearchConfig  # noqa: E402
from devplace.portfolio.sim_search.search import _Search  # noqa: E402
from devplace.portfolio.sim_search.stages import stage_plans  # noqa: E402
from devplace.portfolio.sim_search.starts import step_cuts  # noqa: E402

OUT = RESULTS / "folded_stages.json"
MEMORY_FRACTION = 0.3
GIB = 2**30


def plan_devices(search: _Search, position: np.ndarray, cuts, pattern) -> np.ndarray:
    stage = np.searchsorted(np.asarray(cuts), np.arange(int(position.max()) + 1), side="right")
    return respect_colocation(search.fine, np.asarray(pattern)[stage][position])


def peak_parts(search: _Search, devices: np.ndarray, priority) -> dict:
    """Per GPU at its peak (GiB): weights and state, saved activations, gradients, the rest."""
    g = search.graph
    result = search.sim.run(Placement(devices=devices, priority=priority))
    live = live_bytes_at_peak(result) - g.persistent_bytes
    saved = np.zeros(g.n_ops, bool)
    saved[g.edge_src[read_later(g)]] = True
    forward = (g.role == Role.FORWARD) | (g.role == Role.OTHER)
    parts = {"step_ms": round(result.step_time_us / 1e3, 3), "fits": bool(result.fits), "devices": []}
    for d in range(search.n_dev):
        on = devices == d
        own = g.persistent_bytes[on].sum() + live[on].sum()
        row = {"peak": result.peak_memory_bytes[d], "weights_and_state": g.persistent_bytes[on].sum(),
               "saved_activations": live[on & saved & forward].sum(),
               "gradients": live[on & (g.role == Role.BACKWARD)].sum(),
               "received_and_temporaries": result.peak_memory_bytes[d] - own}
        parts["devices"].append({k: round(float(v) / GIB, 3) for k, v in row.items()})
    return parts


def run(name: str, n_plans: int, rounds: int, placement_path: str | None) -> dict:
    graph = cached_graph(f"zoo:{name}")
    cluster = dp.load_cluster(PRESET).with_memory_fraction(MEMORY_FRACTION)
    search = _Search(graph, cluster, SearchConfig(), 0)
    search.fitting = None
    memory = search.memory_bytes()
    position, crossing, unit_bytes, gradient = step_cuts(search)
    row = {"model": name, "units": len(unit_bytes), "held_gib": round(float(unit_bytes.sum()) / GIB, 3),
           "memory_gib": round(float(memory[0]) / GIB, 3), "load_1min": round(os.getloadavg()[0], 2)}
    began = time.perf_counter()
    plans = stage_plans(unit_bytes, gradient, crossing, memory, SearchConfig().stage_candidates)
    row.update(plans=len(plans), planning_s=round(time.perf_counter() - began, 2), simulated=[])
    fastest = None
    for cost, fullest, cuts, pattern in plans[:n_plans]:
        devices = plan_devices(search, position, cuts, pattern)
        orders = []
        for order, priority in search.orders(devices):
            overflow, step, result = search.measure(devices, priority)
            orders.append({"order": order, "step_ms": round(step / 1e3, 3),
                           "peak_gib": np.round(result.peak_memory_bytes / GIB, 3).tolist(), "fits": overflow == 0})
            if overflow == 0 and (fastest is None or step < fastest[0]):
                fastest = (step, devices.copy(), priority, f"{list(cuts)} on {list(pattern)}, {order}")
        row["simulated"].append({"crossing_ms": round(cost / 1e3, 3), "fullest": round(fullest, 3),
                                 "cuts": list(cuts), "devices": list(pattern), "orders": orders})
        print(json.dumps(row["simulated"][-1]), flush=True)
    probes = {}
    if fastest is not None:
        row["fastest_plan"] = {"step_ms": round(fastest[0] / 1e3, 3), "plan": fastest[3]}
        probes["fastest plan"] = (fastest[1], fastest[2])
        home, annealed, began = fastest, [], time.perf_counter()
        for _ in range(rounds):
            home = _anneal(search, home)[1]
            annealed.append(round(home[0] / 1e3, 3))
        row["annealed_ms"] = annealed
        row["anneal_s"] = round(time.perf_counter() - began, 1)
        print("annealed", annealed, flush=True)
    # the saved activations alone, without the backward's gradients: which plans would they allow?
    held_only = stage_plans(unit_bytes, np.zeros_like(gradient), crossing, memory, SearchConfig().stage_candidates)
    consecutive = [plan for plan in plans if len(plan[3]) == search.n_dev]
    for label, chosen in (("cheapest counting held bytes only", held_only[:1]),
                          ("cheapest consecutive stages", consecutive[:1])):
        for cost, fullest, cuts, pattern in chosen:
            row[label] = {"crossing_ms": round(cost / 1e3, 3), "fullest": round(fullest, 3), "cuts": list(cuts),
                          "devices": list(pattern)}
            probes[label] = (plan_devices(search, position, cuts, pattern), search.updates_first)
    if placement_path:
        given = json.loads(Path(placement_path).read_text())
        probes[f"placement {placement_path}"] = (np.asarray(given["devices"]),
                                                  None if given["priority"] is None else np.asarray(given["priority"]))
    row["peaks"] = {label: peak_parts(search, *probe) for label, probe in probes.items()}
    for label, parts in row["peaks"].items():
        print(label, json.dumps(parts), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--plans", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--placement", default=None)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    out = Path(args.out)
    row = run(args.model, args.plans, args.rounds, args.placement)
    runs = json.loads(out.read_text()) if out.exists() else {}
    runs[args.model] = row | {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    write_text_atomic(out, json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
