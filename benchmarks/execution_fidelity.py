"""Execution fidelity: measured vs simulated step time on this machine's 2 CPU devices.

For each model (sizes this 2-core machine runs in seconds) and each placer: capture the training
step and cost every op as the executor runs it (``prepare(cost="executed")``: each op and the glue
it hosts timed through the rank interpreter on one device), calibrate the 2 devices (one-thread
processes joined by gloo; links fitted, with the simulator in the loop, to synthetic programs run
by the executor, for the ``duplex`` model),
place, simulate on the calibrated cluster, and run the placement for real with the distributed
backend. Measuring waits for a quiet machine (1-minute load average below --max-load, up to
--max-wait-s per round) and records the load; each of --rounds rounds runs every placement (order
alternating between rounds) for --steps steps after warm-up; a run's measured time is the median
over rounds of each round's median step. Reports per-run relative error, the median absolute
relative error and Spearman's rank correlation of measured vs simulated, and what the
``pipelined`` model (latency overlapping) predicts with the same measurements fitted for it.

    .venv/bin/python benchmarks/execution_fidelity.py            # ~10 minutes here
    .venv/bin/python benchmarks/execution_fidelity.py --quick    # 2 models, 3 placers, a smoke run
    .venv/bin/python benchmarks/execution_fidelity.py --quick --learners colocrl,hp --learner-samples 200
    .venv/bin/python benchmarks/execution_fidelity.py --quick --learners placeto,colocrl,hp,mars \
        --cluster benchmarks/results/calibrated-2cpu.toml --output benchmarks/results/execution_fidelity_learners_quick.json

``--learners`` adds rows for learning placers (colocrl, hp, placeto, or any other registered learner by
name), each trained against the simulator on the calibrated cluster for ``--learner-samples`` simulated
placements (seed 0; ``--learner-option KEY=VALUE`` sets more of their options, e.g. init=m-sct),
then run for real like every other placement. Placeto places with its shipped policy for the
cluster's device count, fine-tuned on the graph for that budget (its option ``finetune_samples``).

Writes benchmarks/results/execution_fidelity.json, or ``--output`` (and the calibrated cluster
beside the default one when it calibrates).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

MODELS = {
    "mlp": "zoo:mlp:batch=64,in_features=256,hidden_units=512,layers=4,classes=10",
    "small_cnn": "zoo:small_cnn:batch=8,image_size=32,channels=16,classes=10",
    "rnnlm": "zoo:rnnlm:preset=small,hidden_units=128,embedding_units=64,vocab=500,seq_len=6,batch=16",
    "gnmt": "zoo:gnmt:preset=small,layers=2,hidden_units=128,vocab=500,seq_len=4,batch=16",
    "transformer": "zoo:transformer:preset=small,hidden=128,ffn_units=256,seq_len=32,batch=4",
}
ALGOS = ("single", "round-robin", "random", "m-etf", "m-sct", "metis")
RESULTS = Path(__file__).parent / "results"
BUDGET_OPTION = {"placeto": "finetune_samples"}   # a learner whose budget of simulated placements is not `samples`
CACHE = Path(__file__).parent / ".cache" / "execution_fidelity"  # graphs and placements of the last run


def cluster_for_model(cluster, comm_model: str):
    """``cluster`` under ``comm_model``, its links refitted to that model from the calibration's
    measurements when it has them (a cluster loaded from a file keeps its figures)."""
    from devplace.execute.calibrate import refit

    if not cluster.meta.get("calibration"):
        return dataclasses.replace(cluster, comm_model=comm_model)
    return refit(cluster, comm_model)


def load_average() -> float:
    return os.getloadavg()[0]


def wait_for_quiet(max_load: float, max_wait_s: float) -> tuple[float, float]:
    """Wait until the 1-minute load average is below ``max_load`` (at most ``max_wait_s``);
    returns (load when measuring starts, seconds waited)."""
    started = time.time()
    while load_average() >= max_load and time.time() - started < max_wait_s:
        time.sleep(5)
    return load_average(), time.time() - started


def parse_options(pairs: list[str]) -> dict:
    """``KEY=VALUE`` strings as options, each value read as a Python literal when it is one (else a string)."""
    import ast

    options = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            options[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key.strip()] = value
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-load", type=float, default=1.5)
    parser.add_argument("--max-wait-s", type=float, default=60.0)
    parser.add_argument("--cost", choices=("executed", "measured"), default="executed")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cluster", help="use this calibrated cluster TOML instead of calibrating now")
    parser.add_argument("--learners", default="", help="comma-separated learning placers to add (colocrl,hp,...)")
    parser.add_argument("--learner-samples", type=int, default=200, help="simulated placements each learner trains on")
    parser.add_argument("--learner-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of every learner (repeatable), e.g. init=m-sct")
    parser.add_argument("--output", type=Path, default=RESULTS / "execution_fidelity.json",
                        help="where to write the results (JSON)")
    args = parser.parse_args()

    from scipy.stats import spearmanr

    from devplace.cluster import load_cluster
    from devplace.execute import prepare
    from devplace.execute.calibrate import LINK_FIGURES, calibrate, cluster_toml
    from devplace.execute.distributed import run_distributed_many
    from devplace.execute.schedule import check_against_graph, make_plan
    from devplace.fileio import write_text_atomic
    from devplace.io import save_graph
    from devplace.portfolio import place
    from devplace.sim import simulate

    models = dict(list(MODELS.items())[:2]) if args.quick else MODELS
    algos = ALGOS[:3] if args.quick else ALGOS
    learners = [name.strip() for name in args.learners.split(",") if name.strip()]
    learner_options = {name: {BUDGET_OPTION.get(name, "samples"): args.learner_samples} | parse_options(args.learner_option)
                       for name in learners}
    started = time.time()
    if args.cluster:
        cluster, calibration_load = load_cluster(args.cluster), None
    else:
        calibration_load, _ = wait_for_quiet(args.max_load, args.max_wait_s)
        cluster = calibrate(2)
        write_text_atomic(RESULTS / "calibrated-2cpu.toml", cluster_toml(cluster))
    print(f"cluster {cluster.name} ({cluster.comm_model}, load {calibration_load}): op gap {cluster.op_gap_us:.1f} us, "
          f"link 0-1 {cluster.latency_us[0, 1]:.0f} us + bytes / {cluster.bandwidth_bytes_per_us[0, 1]:.0f} B/us, "
          f"per message {cluster.send_overhead_us[0, 1]:.0f} us on the sender, {cluster.recv_overhead_us[0, 1]:.0f} us "
          f"on the receiver", flush=True)

    cases = []  # (model, target, prepared, algo, placement, plan)
    for model, target in models.items():
        prep_load = load_average()
        prepared = prepare(target, cost=args.cost, repeats=7)
        prepared.graph = prepared.graph.with_meta(cost_load_average=prep_load)
        for algo in (*algos, *learners):
            try:
                if algo in learners:  # trained against the cluster its rows are simulated on
                    placement = place(prepared.graph, prepared.simulation_cluster(cluster), algo=algo, seed=0,
                                      **learner_options[algo])
                else:
                    placement = place(prepared.graph, cluster, algo=algo, seed=0)
                check_against_graph(prepared.program, prepared.graph, placement, cluster)
            except Exception as exc:  # noqa: BLE001 - a placer that cannot place this graph is reported
                print(f"  {model}/{algo}: skipped ({exc})", flush=True)
                continue
            cases.append((model, target, prepared, algo, placement,
                          make_plan(prepared.program, prepared.graph, placement, 2)))

    per_round: list[list[float]] = [[] for _ in cases]  # each round's median step per case
    loads = []
    for r in range(args.rounds):
        load, waited = wait_for_quiet(args.max_load, args.max_wait_s)
        order = list(range(len(cases)))
        if r % 2:
            order.reverse()  # alternate, so no placement always runs first or last
        results = run_distributed_many([(cases[k][2].program, cases[k][5], cases[k][2].state) for k in order], 2,
                                       steps=args.steps, warmup=args.warmup, timeout_s=300)
        for k, (_outputs, times) in zip(order, results):
            per_round[k].append(statistics.median(times))
        loads.append({"round": r, "load_before": round(load, 2), "load_after": round(load_average(), 2),
                      "waited_s": round(waited, 1)})
        print(f"round {r}: load {load:.2f} -> {load_average():.2f} (waited {waited:.0f} s)", flush=True)

    pipelined = cluster_for_model(cluster, "pipelined")
    zeros = np.zeros((cluster.n_devices, cluster.n_devices))
    no_overheads = dataclasses.replace(cluster, send_overhead_us=zeros, recv_overhead_us=zeros)
    CACHE.mkdir(parents=True, exist_ok=True)
    rows = []
    for (model, target, prepared, algo, placement, plan), medians in zip(cases, per_round):
        graph = prepared.graph
        sim = simulate(graph, prepared.simulation_cluster(cluster), placement)
        sim_other = simulate(graph, prepared.simulation_cluster(pipelined), placement)
        sim_plain = simulate(graph, prepared.simulation_cluster(no_overheads), placement)
        save_graph(graph, CACHE / f"{model}.json")  # for simulating these runs again later
        placement.save(CACHE / f"{model}-{algo}.placement.json")
        measured = statistics.median(medians)
        row = {
            "model": model, "target": target, "ops": graph.n_ops, "instructions": len(prepared.program),
            "algorithm": algo,
            "ops_on_device1": int((placement.devices == 1).sum()), "transfers": plan.n_transfers,
            "measured_step_time_us": measured, "simulated_step_time_us": sim.step_time_us,
            "relative_error": (sim.step_time_us - measured) / measured,
            "measured_round_medians_us": medians,
            "simulated_pipelined_us": sim_other.step_time_us,
            "simulated_without_overheads_us": sim_plain.step_time_us,
            "simulated_compute_us": float(sim.op_time_us.sum()),
        }
        if algo in learners:
            row |= {"learner_options": learner_options[algo], "train_s": placement.options.get("train_s"),
                    "learner_step_us": placement.options.get("step_us")}
            row |= {k: placement.options[k] for k in ("start", "returned") if k in placement.options}  # a warm start kept?
        rows.append(row)
        print(f"  {model:11s} {algo:12s} measured {measured / 1e3:8.2f} ms  simulated "
              f"{sim.step_time_us / 1e3:8.2f} ms  error {100 * row['relative_error']:+6.1f}%  "
              f"(pipelined {100 * (sim_other.step_time_us - measured) / measured:+6.1f}%)  "
              f"transfers {row['transfers']}", flush=True)

    measured = np.array([r["measured_step_time_us"] for r in rows])
    simulated = np.array([r["simulated_step_time_us"] for r in rows])
    simulated_other = np.array([r["simulated_pipelined_us"] for r in rows])
    simulated_plain = np.array([r["simulated_without_overheads_us"] for r in rows])
    errors = np.abs(simulated - measured) / measured
    rho = float(spearmanr(measured, simulated).statistic) if len(rows) > 2 else float("nan")
    per_model = {}
    for model in models:
        idx = [i for i, r in enumerate(rows) if r["model"] == model]
        if len(idx) > 2:
            per_model[model] = {
                "median_abs_error": float(np.median(errors[idx])),
                "spearman": float(spearmanr(measured[idx], simulated[idx]).statistic),
            }
    single = [i for i, r in enumerate(rows) if r["algorithm"] == "single"]
    summary = {
        "runs": len(rows),
        "median_abs_relative_error": float(np.median(errors)),
        "spearman": rho,
        "pipelined": {"median_abs_relative_error": float(np.median(np.abs(simulated_other - measured) / measured)),
                      "spearman": float(spearmanr(measured, simulated_other).statistic) if len(rows) > 2 else float("nan"),
                      "link": {key: float(getattr(pipelined, key)[0, 1]) for key in LINK_FIGURES}},
        "without_overheads": {"median_abs_relative_error": float(np.median(np.abs(simulated_plain - measured) / measured)),
                              "spearman": float(spearmanr(measured, simulated_plain).statistic) if len(rows) > 2 else float("nan")},
        "single_device_median_error": float(np.median((simulated[single] - measured[single]) / measured[single]))
        if single else None,
        "per_model": per_model,
        "cost": args.cost,
        "cost_load_average": {m: c[2].graph.meta.get("cost_load_average") for m, c in
                              {case[0]: case for case in cases}.items()},
        "calibration_load_average": calibration_load,
        "rounds": loads,
        "cluster": cluster.to_dict(),
        "steps": args.steps, "warmup": args.warmup,
        "seconds": round(time.time() - started, 1),
        "rows": rows,
    }
    write_text_atomic(args.output, json.dumps(summary, indent=2, default=float))
    print(f"median |error| {100 * summary['median_abs_relative_error']:.1f}%, Spearman {rho:.3f} over {len(rows)} runs "
          f"(pipelined: {100 * summary['pipelined']['median_abs_relative_error']:.1f}%, "
          f"{summary['pipelined']['spearman']:.3f}; "
          f"{summary['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
