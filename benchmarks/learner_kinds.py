"""Which kind of sample finds a learner's gains, and does the policy's own sampling improve? (BENCHMARKS.md,
"Learning placers", round 8b.)

Runs ColocRL or HP under ``--config devplace`` (``learned_placers.learner_options``) with any extra options, and
records every sample with its kind (``deviation`` of the best, ``fresh`` whole placement from the policy,
``critical`` / ``search`` moves beside the policy): per kind the mean, median and best step time, the out-of-memory
share and the repeats; every new best and the kind that found it; and the mean and best of each kind per window
of updates (whether the policy's samples get faster). A placement that repeats an earlier sample is counted.

    .venv/bin/python benchmarks/learner_kinds.py --model gnmt_layers_training --algo hp --samples 400 \\
        --variant kind_baselines=true --variant base --seeds 1,0
    .venv/bin/python benchmarks/learner_kinds.py --model bert_l-3_training --algo hp --samples 4000 --time-budget-s 600

Writes ``benchmarks/results/learner_kinds.json`` (one entry per model, algo, variant and seed, merged with
earlier runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import devplace as dp
import devplace.learn.train as training
from devplace.fileio import write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learned_placers import graph_and_cluster, learner_options  # noqa: E402
from learner_variants import changes  # noqa: E402
from reproduce_papers import RESULTS  # noqa: E402

WINDOW_UPDATES = 20


def recorded_run(model: str, algo: str, samples: int, seed: int, extra: dict,
                 time_budget_s: float | None = None) -> dict:
    """One seeded run with every update's samples, their kinds and outcomes recorded (``train``'s step spied on)."""
    graph, cluster = graph_and_cluster(model)
    rows = []
    plain = training.train

    def spying(name, graph, cluster, unit_of, policy, optimizer, step, *args, **kwargs):
        def spied(*step_args):
            done = step(*step_args)
            rows.append((done.kinds, done.unit_devices.copy(), done.outcomes.step_us.copy(), done.outcomes.oom.copy()))
            return done
        return plain(name, graph, cluster, unit_of, policy, optimizer, spied, *args, **kwargs)

    training.train = spying
    began = time.perf_counter()
    try:
        placed = dp.place(graph, cluster, algo=algo, seed=seed, samples=samples, time_budget_s=time_budget_s,
                          **(learner_options(algo, "devplace", model) | extra))
    finally:
        training.train = plain
    seconds = time.perf_counter() - began
    kinds = np.array([kind for batch in rows for kind in batch[0]])
    units = np.concatenate([batch[1] for batch in rows])
    step_ms = np.concatenate([batch[2] for batch in rows]) / 1e3
    oom = np.concatenate([batch[3] for batch in rows])
    update = np.concatenate([[i] * len(batch[0]) for i, batch in enumerate(rows)])
    _, first = np.unique(units, axis=0, return_index=True)
    per_kind = {}
    for kind in dict.fromkeys(kinds.tolist()):
        mine = kinds == kind
        windows = [(u, u + WINDOW_UPDATES) for u in range(0, len(rows), WINDOW_UPDATES)]
        per_kind[kind] = {
            "n": int(mine.sum()), "mean_ms": float(step_ms[mine].mean()), "median_ms": float(np.median(step_ms[mine])),
            "best_ms": float(step_ms[mine].min()), "oom_share": float(oom[mine].mean()),
            "repeats": int(mine.sum() - np.isin(np.flatnonzero(mine), first).sum()),
            "mean_ms_per_window": [float(step_ms[mine & (update >= a) & (update < b)].mean()) for a, b in windows
                                   if (mine & (update >= a) & (update < b)).any()],
            "best_ms_per_window": [float(step_ms[mine & (update >= a) & (update < b)].min()) for a, b in windows
                                   if (mine & (update >= a) & (update < b)).any()]}
    bests, best = [], np.inf
    for i in range(len(step_ms)):
        if not oom[i] and step_ms[i] < best:
            best = step_ms[i]
            bests.append({"sample": i + 1, "ms": round(float(best), 3), "kind": str(kinds[i])})
    return {"seed": seed, "samples": len(step_ms), "time_budget_s": time_budget_s, "seconds": round(seconds, 1),
            "load_average": os.getloadavg(), "returned_ms": placed.options["step_us"] / 1e3,
            "init": placed.options.get("init"), "init_ms": placed.options.get("init_step_us", float("nan")) / 1e3,
            "gain_us_by": placed.options["gain_us_by"],
            "window_updates": WINDOW_UPDATES, "per_kind": per_kind, "new_bests": bests,
            "options": learner_options(algo, "devplace", model) | extra,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gnmt_layers_training")
    parser.add_argument("--algo", default="hp", choices=("colocrl", "hp"))
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--time-budget-s", type=float, default=None, help="wall-clock cap per run")
    parser.add_argument("--variant", action="append", default=[],
                        help="base, or KEY=VALUE[,KEY=VALUE...] on top of --config devplace's options (repeatable)")
    args = parser.parse_args(argv)
    path = RESULTS / "learner_kinds.json"
    for variant in args.variant or ["base"]:
        extra = changes(variant)
        for seed in (int(s) for s in args.seeds.split(",")):
            run = recorded_run(args.model, args.algo, args.samples, seed, extra, args.time_budget_s)
            results = json.loads(path.read_text()) if path.exists() else {}
            results[f"{args.model}/{args.algo}/{variant}/seed{seed}"] = run
            write_text_atomic(path, json.dumps(results, indent=1) + "\n")
            print(f"{args.model} {args.algo} {variant} seed {seed}: {run['returned_ms']:.2f} ms after {run['samples']} "
                  f"samples in {run['seconds']} s; " + ", ".join(
                      f"{k} mean {v['mean_ms']:.1f} best {v['best_ms']:.2f}" for k, v in run["per_kind"].items()),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
