"""Round 53: for each zoo row at 30% memory, the ceiling of every bound proven from the facts F1-F4 alone.

Round 50's argument (``gnmtbound_ceiling.py``): such a bound holds under each of the simulator's link models and
reads nothing that depends on the model, so it is at most the step time of any placement that fits, simulated
under ``pipelined`` (one channel per ordered pair, held for bytes / bandwidth only). A placement found by sim-search
under ``pipelined`` is therefore a ceiling. Where that ceiling is below the 10% floor (the best placement / 1.1),
no bound built from F1-F4 can bring the row within 10%: it needs a bound that charges what ``sequential`` adds
(each GPU's one channel), or a faster placement.

This collects the placements ``gnmtbound_ceiling.py`` saved (one JSON per row and seed), re-simulates each under
``pipelined`` at the same memory to check its figure and that it fits, and writes the table beside each row's best
and certified bound from ``results/exact_and_bounds_zoo.json``. Run from the checkout's root:
    PYTHONPATH=$PWD python benchmarks/gnmtbound_ceiling.py SEED DIR/ceiling_MODEL_sSEED.json 0.3 pipelined MODEL
    PYTHONPATH=$PWD python benchmarks/bound_ceilings.py DIR [OUT=benchmarks/results/bound_ceilings.json]"""
import dataclasses
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402
from devplace.placement import Placement  # noqa: E402

TARGET_GAP = 0.10


def verdict(row: dict) -> str:
    if row["certified_bound_ms"] >= row["floor_ms"]:
        return "within 10% already"
    if row["f1_f4_bound_can_reach_floor"]:
        return f"room: an F1-F4 bound may reach the floor ({row['ceiling_ms'] - row['floor_ms']:.3f} ms above it)"
    return f"no F1-F4 bound reaches the floor (it is {row['floor_ms'] - row['ceiling_ms']:.3f} ms above the ceiling)"


def main(saved_dir: str, out: str) -> None:
    zoo_rows = {r["graph"]: r for r in json.loads((RESULTS / "exact_and_bounds_zoo.json").read_text())["rows"]}
    rows = {}
    for path in sorted(glob.glob(os.path.join(saved_dir, "ceiling_*_s*.json"))):
        saved = json.loads(open(path).read())
        model = saved["zoo"].split(":", 1)[1]
        graph = cached_graph(saved["zoo"])
        cluster = dp.load_cluster(PRESET).with_memory_fraction(saved["fraction"])
        relaxed = dataclasses.replace(cluster, comm_model=saved["model"])
        placement = Placement(devices=np.asarray(saved["devices"]), priority=np.asarray(saved["priority"]))
        result = dp.simulate(graph, relaxed, placement)
        if not result.fits or abs(result.step_time_us - saved["step_us"]) > 1e-6 * saved["step_us"]:
            raise SystemExit(f"{path}: simulates at {result.step_time_us:.3f} us (fits: {result.fits}), "
                             f"saved {saved['step_us']:.3f} us: recapture or rerun gnmtbound_ceiling.py")
        best, bound = zoo_rows[model]["best_ms"], zoo_rows[model]["certified_bound_ms"]
        row = rows.setdefault(model, {"best_ms": best, "certified_bound_ms": bound, "floor_ms": best / (1 + TARGET_GAP),
                                      "runs": []})
        row["runs"].append({"seed": saved["seed"], "ceiling_ms": result.step_time_us / 1e3, "evals": saved["evals"],
                            "wall_s": saved["wall_s"], "sequential_ms": saved["simulated_us"]["sequential"] / 1e3,
                            "peaks_GiB": saved["peaks_GiB"], "file": os.path.basename(path)})
    for model, row in rows.items():
        row["ceiling_ms"] = min(run["ceiling_ms"] for run in row["runs"])
        row["f1_f4_bound_can_reach_floor"] = row["ceiling_ms"] >= row["floor_ms"]
        row["verdict"] = verdict(row)
        print(f"{model}: best {row['best_ms']:.3f}, bound {row['certified_bound_ms']:.3f}, floor {row['floor_ms']:.3f}, "
              f"ceiling {row['ceiling_ms']:.3f} ms over {len(row['runs'])} seed(s): "
              f"{verdict(row)}", flush=True)
    write_text_atomic(out, json.dumps({"what": __doc__.split("\n")[0], "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else str(RESULTS / "bound_ceilings.json"))
