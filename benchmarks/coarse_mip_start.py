"""sim-search with its coarse MIP start, gradient block and recurrence tracks on the zoo at 30% memory (issue 15, point 3, placement side).

For each model: sim-search at its defaults (seed 0) on ``baechi-4x2080`` with each RTX 2080 at 30%
of its 8 GiB, as the "How far from optimal" table runs it. The coarse MIP track runs last, so the
best before it (``coarse_mip.before_us``) is what sim-search gives without it; the script prints
that, the expanded program placement, the best after the track, the certified bound and the gap.
``--groups`` / ``--memory`` / ``--nodes`` / ``--rounds`` set the track's options (e.g. to sweep K).
The gradient block track (``grad_blocks.py``) runs after it: ``grad_block_before_ms`` is the best
before that track. The recurrence track (``recurrence.py``) runs after that: ``recurrence_before_ms`` is the best
before it; the branch track (``branches.py``) runs after that: ``branch_before_ms`` is the best
before it, ``after_ms`` the result. ``--seed`` picks sim-search's seed.
Writes ``benchmarks/results/coarse_mip_start.json`` (temp file, then rename; ``--out`` elsewhere).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/coarse_mip_start.py --models resnet50 rnnlm
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import devplace as dp  # noqa: E402
from reproduce_papers import PRESET, cached_graph  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "coarse_mip_start.json"
MODELS = ("resnet50", "rnnlm", "transformer", "inception_v3", "nasnet", "gnmt")


def run(model: str, options: dict, seed: int = 0) -> dict:
    graph = cached_graph(f"zoo:{model}")
    cluster = dp.load_cluster(PRESET).with_memory_fraction(0.3)
    load = os.getloadavg()[0]
    began = time.perf_counter()
    utc = time.strftime("%H:%M:%S", time.gmtime())
    placement = dp.place(graph, cluster, algo="sim-search", seed=seed, **options)
    seconds = time.perf_counter() - began
    result = dp.simulate(graph, cluster, placement)
    track, blocks = placement.options["coarse_mip"], placement.options["grad_blocks"]
    recurrence, branches = placement.options["recurrence"], placement.options["branches"]
    bound_us = placement.options["lower_bound_us"]
    ms = (lambda us: None if us is None else round(us / 1e3, 3))
    return {
        "model": model, "ops": graph.n_ops, "options": options,
        "before_ms": ms(track.get("before_us")), "coarse_ops": track.get("coarse_ops"),
        "mip_status": track.get("status"), "mip_nodes": track.get("nodes"),
        "mip_objective_ms": ms(track.get("objective_us")), "expanded_ms": ms(track.get("expanded_us")),
        "track_rounds": track.get("rounds"), "track_best_ms": ms(track.get("best_us")),
        "grad_block_share": blocks.get("share"), "grad_block_before_ms": ms(blocks.get("before_us")),
        "grad_block_descent_ends_ms": [ms(us) for us in blocks.get("descent_ends_us", [])],
        "grad_block_rounds": blocks.get("rounds"), "grad_block_best_ms": ms(blocks.get("best_us")),
        "recurrence_pieces": recurrence.get("pieces"), "recurrent_weights": recurrence.get("recurrent_weights"),
        "recurrence_before_ms": ms(recurrence.get("before_us")),
        "recurrence_descent_ends_ms": [ms(us) for us in recurrence.get("descent_ends_us", [])],
        "recurrence_rounds": recurrence.get("rounds"), "recurrence_best_ms": ms(recurrence.get("best_us")),
        "branch_share": branches.get("share"), "branch_before_ms": ms(branches.get("before_us")),
        "branch_descent_ends_ms": [ms(us) for us in branches.get("descent_ends_us", [])],
        "branch_rounds": branches.get("rounds"), "branch_best_ms": ms(branches.get("best_us")),
        "seed": seed, "evals": placement.options["evals"], "utc": utc,
        "after_ms": ms(result.step_time_us), "fits": bool(result.fits), "bound_ms": ms(bound_us),
        "gap": round(result.step_time_us / bound_us - 1, 4), "found_by": placement.options["found_by"],
        "seconds": round(seconds, 1), "load_at_start": round(load, 2), "load_at_end": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--groups", type=int, help="coarse_mip_groups")
    parser.add_argument("--memory", type=float, help="coarse_mip_memory")
    parser.add_argument("--nodes", type=int, help="coarse_mip_nodes")
    parser.add_argument("--rounds", type=int, help="coarse_mip_rounds")
    parser.add_argument("--seed", type=int, default=0, help="sim-search's seed")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    options = {f"coarse_mip_{name}": value for name, value in
               (("groups", args.groups), ("memory", args.memory), ("nodes", args.nodes), ("rounds", args.rounds))
               if value is not None}
    rows = []
    for model in args.models:
        rows.append(run(model, options, args.seed))
        print(json.dumps(rows[-1]), flush=True)
        temp = args.out.with_suffix(".tmp")
        temp.write_text(json.dumps({"cluster": f"{PRESET} at 30% memory", "seed": args.seed, "rows": rows}, indent=1) + "\n")
        temp.rename(args.out)


if __name__ == "__main__":
    main()
