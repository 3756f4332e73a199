"""Learning placers against random search at equal samples and the algorithmic placers (BENCHMARKS.md,
"Learning placers").

For each model, on the papers' clusters: colocrl and hp train for ``--samples`` simulated placements
(and at most ``--time-budget-s`` each); random search draws the same number of placements (the
``random`` placer's, one seed each) in the same run; under ``--config devplace``, where the layers
interleave (GNMT), so does a module-move search alone from the learners' warm start (``module_search``:
what the learners' search moves reach without the policy). Their best step time so far is recorded
against samples and against wall-clock seconds, beside the final step times of single, expert,
m-SCT+opt and sim-search.

``--config`` picks the learners' options: ``paper`` (the papers' and the public code's defaults) or
``devplace`` (``DEVPLACE``: a warm start from the fastest of expert, m-SCT+opt and single, then
REINFORCE sampling deviations from the best placement so far, with boundary shifts, whole layers moved to
devices drawn evenly, normalised advantages, the best placement's order carried to every sample (not on GNMT-4:
``MODEL_OPTIONS``), and, where layers interleave, whole module layers moved, half of each batch a single module move
alone (a search sample), toward the least busy device half the time, each other module moved with it with chance
1.5 / modules (round 8a), and GNMT-4 may start from METIS; each kind of policy sample is judged against its own
baseline (round 8b); see docs/learning.md). Rows of one configuration are kept when the other is run
(``colocrl`` and ``colocrl/devplace`` in the JSON). ``learning_table`` keeps a warm-started run's
start, its best sample and what it returns apart, and says whether the best sample beat the start,
random search at the same number of samples and the algorithmic placers, and how far it is from sim-search.

    .venv/bin/python benchmarks/learned_placers.py                          # every model, 2000 samples
    .venv/bin/python benchmarks/learned_placers.py --quick                  # the two bundled graphs, 200 samples
    .venv/bin/python benchmarks/learned_placers.py --models gnmt4 --samples 20000 --time-budget-s 600
    .venv/bin/python benchmarks/learned_placers.py --config paper --models rnnlm   # the papers' defaults
    .venv/bin/python benchmarks/learned_placers.py --batch-cost GRAPH.json   # a batch of 64 vs 64 simulations

Writes ``benchmarks/results/learned_placers.json`` (one entry per model, merged with earlier runs)
and ``benchmarks/results/learned_placers_<model>.png`` (the two curves), and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import devplace as dp
from devplace.cluster import load_cluster
from devplace.errors import DevplaceError
from devplace.fileio import write_bytes_atomic, write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import PAPER_GPU_FRACTION, PRESET, RESULTS, cached_graph  # noqa: E402

LEARNERS = ("colocrl", "hp")
# devplace's variant's warm start: the fastest of these algorithmic placers (never sim-search: a learner
# refining sim-search's placement would be another claim than one beating it)
WARM_STARTS = "expert,m-sct+opt,single"
# devplace's variant (docs/learning.md): options beside the warm start, per learner; samples deviate from the
# best placement so far, and cloning is short (the policy then only steers which units move, and where)
# (round 4: every placement in the faster of the topological and upward-rank orders, a quarter of each batch
# drawn from the policy whole, and ColocRL's groups without the single-consumer rule: benchmarks/learner_projection.py)
# (round 5: a moved group takes its layers along, forward with backward and update ops, to a device drawn
# evenly from the others: benchmarks/learner_neighbourhood.py)
# (round 6: every sample also scored in the best placement's order, carried as sim-search carries its order:
# sim-search's RNNLM devices are 116.35 ms in their own orders, 108.10 in its carried one; and, where layers
# interleave, about one module layer moved whole per sample, as sim-search's layer move: on GNMT-4 a descent over
# such moves from the expert reaches 229.51 ms, the learners' groups each hold pieces of 1-7 modules)
ROUND4 = dict(schedule_orders="topological,upward-rank", fresh_share=0.25)
ROUND5 = dict(layer_moves=True, uniform_devices=True)
ROUND6 = dict(carry_order=True, module_moves=1.0)
# (round 7, two parts, each a search sample the policy is not credited with: on every model a quarter of each batch is
# the best placement with one of sim-search's schedule-guided moves, a co-placement group pulled along the critical
# path or unloaded off the busiest device: on RNNLM sim-search scored as the learners score (no carried order) ends at
# 108.03 ms, and a greedy search over those moves from the expert reaches 108.43 ms within 6-17 candidates, while the
# learners' own moves never beat the expert's 115.96 there; where layers interleave, half of each batch is the best
# with one module moved alone, and module moves go to the least busy device half the time, as sim-search's: GNMT-4
# HP at 300 samples 266.33 -> 229.76 ms; module search alone reaches 229.76 too, after 150:
# benchmarks/learner_variants.py)
ROUND7 = dict(critical_share=0.25, module_alone_share=0.5, module_idle_share=0.5)
# (round 8a, where layers interleave: a module search sample also moves each other module with chance 1.5 / modules, as
# sim-search's layer search draws; single module moves stop in a basin: module search alone from the expert ends at
# 229.76-244.13 ms over seeds 0-3 at 300 samples, with the spread at 222.43-256.91 (better on 2, worse on 1), and from
# METIS at 241.18 / 242.07 against 219.64 / 216.96 on seeds 0 / 1: benchmarks/learner_variants.py, BENCHMARKS round 8a)
# (round 8b: each kind of policy sample judged against its own baseline: on gnmt_layers_training the one fresh row of
# a batch was the slowest policy row in 98% of batches (HP and ColocRL), so its shared-baseline advantage was -1.15
# whatever it drew. HP at 400 samples: seed 0 367.48 -> 337.89 ms, seed 1 342.09 -> 367.62: either way the escape
# from m-SCT+opt's basin is one fresh sample, and whether one comes is chance: benchmarks/learner_kinds.py)
ROUND8 = dict(module_spread=1.5, kind_baselines=True)
DEVPLACE = {
    "colocrl": dict(init_updates=50, deviations=2.0, deviate_from="best", boundary_moves=1.0, learning_rate=0.001,
                    normalize_advantage=True, single_consumer=False, **ROUND4, **ROUND5, **ROUND6, **ROUND7, **ROUND8),
    "hp": dict(init_updates=50, deviations=1.0, deviate_from="best", boundary_moves=1.0, position_features=64,
               tanh_constant=0.0, learning_rate=0.001, noise_updates=0, normalize_advantage=True, **ROUND4, **ROUND5,
               **ROUND6, **ROUND7, **ROUND8),
}
# per model, changes to DEVPLACE (round 7, measured: benchmarks/learner_variants.py): on GNMT-4 the carried order
# changed no best of HP's 300 samples (229.76 ms either way) and cost 37% more time (166.5 against 121.5 s)
# GNMT-4's round-7 runs had no critical moves (they were measured on RNNLM and gnmt_layers_training at the same time)
# round 8a: GNMT-4's warm start may also be METIS's placement (317.30 ms against the expert's 345.82), the start from
# which HP reached 216.94 ms in mars.py's equal-time run and sim-search's layer search finds 216.94
MODEL_OPTIONS: dict[str, dict] = {"gnmt4": dict(carry_order=False, critical_share=0.0, init=f"{WARM_STARTS},metis")}
# per learner and model, changes on top of those (round 8c): HP on GNMT-4 with round 8a's options returned 245.17 ms at
# 10 minutes (round 7a's 229.76); at 400 samples, seed 0, from METIS, round 6's mix (every sample a deviation carrying a
# module move, the carried order, no single-module or spread search samples) reached 217.03 against 240.65 with round
# 7's and 253.73 with round 8a's (benchmarks/learner_variants.py): HP on GNMT-4 runs round 6's mix
LEARNER_MODEL_OPTIONS: dict[tuple[str, str], dict] = {
    ("hp", "gnmt4"): dict(carry_order=True, module_alone_share=0.0, module_idle_share=0.0, module_spread=0.0,
                          kind_baselines=False)}
BASELINES = ("single", "expert", "m-sct+opt", "sim-search")
# name: (what, graph source, devices, memory fraction); zoo models at the papers' configurations
MODELS = {
    "gnmt4": ("GNMT-4 (the demo's graph)", "zoo:gnmt:layers=4,seq_len=40", 4, PAPER_GPU_FRACTION),
    "rnnlm": ("RNNLM (HP, 2 GPUs)", "zoo:rnnlm", 2, PAPER_GPU_FRACTION),
    "inception_v3": ("Inception-V3 (ColocRL, 4 GPUs)", "zoo:inception_v3", 4, PAPER_GPU_FRACTION),
    "gnmt_layers_training": ("gnmt_layers_training (bundled)", "gnmt_layers_training.json", None, None),
    "bert_l-3_training": ("bert_l-3_training (bundled)", "bert_l-3_training.json", None, None),
}
QUICK = ("gnmt_layers_training", "bert_l-3_training")


def graph_and_cluster(name: str):
    _, source, devices, fraction = MODELS[name]
    if source.endswith(".json"):
        from devplace.io.dnn_partitioning import cluster_for

        graph = dp.load_graph(dp.example_path(source))
        return graph, cluster_for(graph)
    graph = cached_graph(source)
    cluster = load_cluster(PRESET)
    if devices != cluster.n_devices:
        cluster = cluster.with_devices(devices)
    return graph, cluster.with_memory_fraction(fraction)


def thinned(curve: list) -> list:
    """The points of a best-so-far curve where the best changes, and its last one (enough for a step plot)."""
    return [point for k, point in enumerate(curve)
            if k == 0 or k == len(curve) - 1 or point[2] != curve[k - 1][2]]


def random_search(graph, cluster, samples: int, time_budget_s: float | None, orders: str = "topological",
                  carry_order: bool = False) -> dict:
    """Best step time so far of ``samples`` random placements that fit (the random placer, seeds 0..), each
    scored as the learners score theirs: in the fastest of the schedule ``orders`` and, with ``carry_order``,
    of the best placement's order so far (``learn.env``)."""
    from devplace.learn.env import PlacementEnv

    env = PlacementEnv(graph, cluster, np.arange(graph.n_ops), tuple(orders.split(",")))
    best, carried, curve, began = math.inf, None, [], time.perf_counter()
    for seed in range(samples):
        if time_budget_s is not None and time.perf_counter() - began > time_budget_s:
            break
        devices = np.asarray(dp.place(graph, cluster, algo="random", seed=seed, check=False).devices)
        result = env.evaluate(devices[None], carried)
        if not result.oom[0] and result.step_us[0] < best:
            best = float(result.step_us[0])
            carried = env.order_of(devices, carried) if carry_order else None
        curve.append((seed + 1, round(time.perf_counter() - began, 3), best))
    return {"best_step_us": best, "curve": thinned(curve), "orders": orders, "carry_order": carry_order}


def module_search(graph, cluster, samples: int, options: dict) -> dict | None:
    """Where the step order interleaves the layers (``learn.train.module_labels``), the yardstick of what the
    policy adds: a learner run with ``options`` (the same warm start, orders and module moves) whose every
    sample is a search sample (``module_alone_share=1``, ``fresh_share=0``: the best so far with one random
    module moved), so the policy never decides and never updates; the same for either learner. None elsewhere."""
    from devplace.learn.train import module_labels
    from devplace.transforms import colocation_units

    if module_labels(graph, colocation_units(graph)) is None:
        return None
    return learner(graph, cluster, "hp", samples, None, options | {"module_alone_share": 1.0, "fresh_share": 0.0})


def learner_options(algo: str, config: str, model: str, per_learner: bool = True) -> dict:
    """The options of ``algo`` under ``config``: none for the papers' defaults; for devplace's variant,
    ``DEVPLACE`` and a warm start from the fastest of ``WARM_STARTS``, with ``MODEL_OPTIONS``' changes for
    ``model`` (which may name other warm starts) and, with ``per_learner``, ``LEARNER_MODEL_OPTIONS``' for ``algo``
    on ``model`` (module search alone keeps the model's search samples whichever learner's mix differs)."""
    if config == "paper":
        return {}
    return (DEVPLACE[algo] | {"init": WARM_STARTS} | MODEL_OPTIONS.get(model, {})
            | (LEARNER_MODEL_OPTIONS.get((algo, model), {}) if per_learner else {}))


def learner(graph, cluster, algo: str, samples: int, time_budget_s: float | None, options: dict) -> dict:
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "log.csv"
        try:
            placed = dp.place(graph, cluster, algo=algo, seed=0, samples=samples, time_budget_s=time_budget_s,
                              log=str(log), **options)
        except DevplaceError as exc:
            return {"error": str(exc), "options": options, "seconds": round(time.perf_counter() - began, 1)}
        rows = list(csv.DictReader(log.open())) if log.exists() else []    # none: the time ran out while cloning
    curve = [(int(r["samples"]), float(r["wall_s"]), float(r["best_step_us"])) for r in rows]
    run = {"best_step_us": dp.simulate(graph, cluster, placed).step_time_us, "curve": thinned(curve),
           "samples": placed.options["samples_simulated"], "seconds": round(time.perf_counter() - began, 1),
           "options": options, "date": time.strftime("%Y-%m-%d")}
    figures = ("init", "init_candidates", "init_step_us", "init_fit", "init_updates_done", "learned_step_us",
               "returned", "gain_us_by")
    return run | {key: placed.options[key] for key in figures if key in placed.options}


def batch_cost(graph, cluster, k: int = 64) -> dict:
    """Seconds to score a batch of ``k`` random placements through the environment, against ``k``
    single ``simulate`` calls on the same placements (measured in one run, best of three)."""
    from devplace.learn.env import PlacementEnv
    from devplace.transforms import colocation_units

    units = colocation_units(graph)
    env = PlacementEnv(graph, cluster, units)
    batch = np.random.default_rng(0).integers(0, cluster.n_devices, size=(k, env.n_units))
    env.evaluate(batch[:1])
    timings = {"batch_s": [], "singles_s": []}
    for _ in range(3):
        began = time.perf_counter()
        env.evaluate(batch)
        timings["batch_s"].append(time.perf_counter() - began)
        began = time.perf_counter()
        for row in batch:
            dp.simulate(graph, cluster, row[units])
        timings["singles_s"].append(time.perf_counter() - began)
    return {"k": k, "memory_is_ample": env.memory_is_ample, **{key: min(v) for key, v in timings.items()}}


def baselines(graph, cluster) -> dict:
    out = {}
    for spec in BASELINES:
        began = time.perf_counter()
        try:
            placed = dp.place(graph, cluster, algo=spec, seed=0)
            out[spec] = {"step_us": dp.simulate(graph, cluster, placed).step_time_us,
                         "seconds": round(time.perf_counter() - began, 1)}
        except DevplaceError as exc:
            out[spec] = {"error": str(exc).split(":")[0]}
    return out


def plot(name: str, entry: dict) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    runs = {label: entry[label] for label in (*run_labels(), "random", "module_search")
            if "curve" in entry.get(label, {})}
    for column, (index, label) in enumerate(((0, "simulated placements"), (1, "wall-clock seconds"))):
        for algo, run in runs.items():
            points = [(p[index], p[2] / 1e3) for p in run["curve"] if math.isfinite(p[2])]
            if points:
                axes[column].step(*zip(*points), where="post", label=algo)
        for k, (spec, base) in enumerate(entry["baselines"].items()):
            if "step_us" in base:
                axes[column].axhline(base["step_us"] / 1e3, ls="--", lw=1, color=f"C{k + 3}", label=spec)
        axes[column].set_xlabel(label)
    axes[0].set_yscale("log")   # the first samples are 10-30x the last: a linear axis hides the end
    axes[0].set_ylabel("best step time so far (ms, log scale)")
    axes[0].legend(fontsize=8)
    figure.suptitle(f"{MODELS[name][0]}: {entry['ops']} ops on {entry['cluster']}")
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=100)
    plt.close(figure)
    write_bytes_atomic(RESULTS / f"learned_placers_{name}.png", out.getvalue())


def run_label(algo: str, config: str) -> str:
    """The key of a learner's run in the results: ``colocrl`` (papers' defaults), ``colocrl/devplace``."""
    return algo if config == "paper" else f"{algo}/{config}"


def run_labels() -> list[str]:
    return [run_label(algo, config) for config in ("paper", "devplace") for algo in LEARNERS]


def table(results: dict) -> str:
    """The BENCHMARKS.md table: best step time (ms) of each ("-": no placement or not run); a learner
    that simulated another number of placements than the row's (time budget, earlier run) shows it in
    brackets, a warm-started one
    marks "=init" when none of its samples beat its warm start (it then returns the warm start)."""
    labels = run_labels()
    head = ["model", "ops", "samples", *labels, "random", *BASELINES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ms(run):
        value = run.get("best_step_us", run.get("step_us"))
        return f"{value / 1e3:.2f}" if value is not None and math.isfinite(value) else "-"

    def cell(run, samples):
        if not run:
            return "-"
        short = f" ({run['samples']:,})" if run.get("samples", samples) != samples else ""
        return ms(run) + short + (" =init" if run.get("returned") == "init" else "")

    for name, entry in results.items():
        cells = [MODELS[name][0], str(entry["ops"]), str(entry["samples"])]
        cells += [cell(entry.get(label, {}), entry["samples"]) for label in labels]
        cells += [ms(entry["random"])] + [ms(entry["baselines"][b]) for b in BASELINES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_at(curve: list, samples: int) -> float:
    """A best-so-far curve's value after ``samples`` placements (inf before its first that fits)."""
    return min((point[2] for point in curve if point[0] <= samples), default=math.inf)


def learning_table(results: dict, config: str = "devplace") -> str:
    """Per warm-started run: its start, its best sample and what it returned, kept apart, and whether the
    best sample beat the start, random search at the same number of samples, expert and m-SCT+opt, and how far
    it is from sim-search (ms; "-": not run or no rule)."""
    head = ["model", "learner", "warm start", "samples", "best sample", "returned", "beat start",
            "random (same samples)", "beat random", "module search alone (same samples)", "expert", "m-sct+opt",
            "sim-search", "returned vs sim-search"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, entry in results.items():
        for algo in LEARNERS:
            run = entry.get(run_label(algo, config), {})
            if "init_candidates" not in run:    # runs of this table's version only
                continue
            base = {b: entry["baselines"][b].get("step_us") for b in BASELINES}
            random_us = best_at(entry["random"]["curve"], run["samples"])
            best, returned = run["learned_step_us"], run["best_step_us"]
            ms = lambda us: f"{us / 1e3:.2f}" if us is not None and math.isfinite(us) else "-"  # noqa: E731
            lines.append("| " + " | ".join([
                MODELS[name][0], algo, f"{run['init']} {ms(run['init_step_us'])}", f"{run['samples']:,}",
                ms(best), f"{ms(returned)} ({run['returned']})", "yes" if best < run["init_step_us"] else "no",
                ms(random_us), "yes" if best < random_us else "no",
                ms(best_at(entry["module_search"]["curve"], run["samples"]) if "curve" in entry.get("module_search", {})
                   else None),
                ms(base["expert"]), ms(base["m-sct+opt"]),
                ms(base["sim-search"]), f"{100 * (returned / base['sim-search'] - 1):+.1f}%"]) + " |")
    return "\n".join(lines)


def save(path: Path, name: str, entry: dict) -> None:
    """Write ``entry`` as ``name``'s, keeping the learner runs other processes wrote meanwhile, and plot it."""
    results = json.loads(path.read_text()) if path.exists() else {}
    kept = {k: v for k, v in results.get(name, {}).items() if k in run_labels()}  # runs of other processes
    results[name] = kept | entry
    write_text_atomic(path, json.dumps(results, indent=1, default=float) + "\n")
    plot(name, results[name])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--samples", type=int, default=2000, help="simulated placements per learner and for random")
    parser.add_argument("--time-budget-s", type=float, default=None, help="wall-clock cap per learner")
    parser.add_argument("--config", choices=("paper", "devplace"), default="devplace",
                        help="the learners' options: the papers' defaults or devplace's variant (warm start)")
    parser.add_argument("--learners", default=",".join(LEARNERS), help="comma-separated subset of colocrl,hp")
    parser.add_argument("--reuse-baselines", action="store_true",
                        help="take the baselines' figures from the results file (they are seeded: the same)")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}, 200 samples")
    parser.add_argument("--plots", action="store_true", help="only redraw the curves and the table from the results")
    parser.add_argument("--batch-cost", metavar="GRAPH", help="only time a batch of 64 on GRAPH (a graph file) "
                        f"on {PRESET}, with its memory and with ample memory")
    args = parser.parse_args(argv)
    if args.batch_cost:
        graph, cluster = dp.load_graph(args.batch_cost), load_cluster(PRESET)
        costs = {"graph": Path(args.batch_cost).name, "ops": graph.n_ops, "cluster": cluster.name,
                 "with_memory": batch_cost(graph, cluster), "ample": batch_cost(graph, cluster.with_memory_fraction(4.0))}
        write_text_atomic(RESULTS / "learned_placers_batch_cost.json", json.dumps(costs, indent=1) + "\n")
        print(json.dumps(costs, indent=1))
        return 0
    names = list(QUICK) if args.quick else [n.strip() for n in args.models.split(",") if n.strip()]
    samples = 200 if args.quick else args.samples
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: use {', '.join(MODELS)}")
    path = RESULTS / "learned_placers.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if args.plots:
        for name in results:
            plot(name, results[name])
        print(table({n: results[n] for n in results if n in MODELS}))
        print(learning_table({n: results[n] for n in results if n in MODELS}))
        return 0
    for name in names:
        graph, cluster = graph_and_cluster(name)
        print(f"{name}: {graph.n_ops} ops on {cluster.name} ({cluster.n_devices} devices)", flush=True)
        earlier = results.get(name, {})
        reuse = args.reuse_baselines and "baselines" in earlier
        entry = {"ops": graph.n_ops, "cluster": cluster.name, "samples": samples,
                 "time_budget_s": args.time_budget_s, "load_average": os.getloadavg(),
                 "batch_cost": earlier["batch_cost"] if reuse else batch_cost(graph, cluster),
                 "baselines": earlier["baselines"] if reuse else baselines(graph, cluster)}
        cost = entry["batch_cost"]
        print(f"  a batch of {cost['k']}: {cost['batch_s']:.3f} s, {cost['k']} single simulations {cost['singles_s']:.3f} s",
              flush=True)
        print("  " + ", ".join(f"{k} {v.get('step_us', math.nan) / 1e3:.2f} ms" for k, v in entry["baselines"].items()),
              flush=True)
        for algo in [a.strip() for a in args.learners.split(",") if a.strip()]:
            label = run_label(algo, args.config)
            entry[label] = learner(graph, cluster, algo, samples, args.time_budget_s,
                                   learner_options(algo, args.config, name))
            run = entry[label]
            print(f"  {label}: {run.get('best_step_us', math.nan) / 1e3:.2f} ms in {run['seconds']} s "
                  f"{run.get('error', '')} (init {run.get('init_step_us', math.nan) / 1e3:.2f} ms, "
                  f"returned {run.get('returned', '-')}, load {os.getloadavg()[0]:.1f})", flush=True)
        # as many samples as the learners drew (the comparison is at equal samples), scored in their orders;
        # a baselines-only run (--learners '') keeps the earlier comparisons, made at the learners' samples
        drawn = [entry[run_label(a, args.config)].get("samples", samples) for a in LEARNERS
                 if run_label(a, args.config) in entry]
        if not drawn:
            entry |= {key: earlier[key] for key in ("random", "module_search", "samples", "time_budget_s")
                      if key in earlier}
            save(path, name, entry)
            continue
        scored = learner_options(LEARNERS[0], args.config, name)     # the learners' orders, the same for both
        # random search is cheap: drawn as far as any learner run the file keeps, so each is compared at its samples
        kept = [run.get("samples", 0) for label, run in earlier.items() if label in run_labels() and label not in entry]
        entry["random"] = random_search(graph, cluster, max(drawn + kept), args.time_budget_s,
                                        scored.get("schedule_orders", "topological"), scored.get("carry_order", False))
        print(f"  random: {entry['random']['best_step_us'] / 1e3:.2f} ms", flush=True)
        searched = module_search(graph, cluster, max(drawn, default=samples),
                                 learner_options("hp", args.config, name, per_learner=False)) if scored else None
        if searched is not None:
            entry["module_search"] = searched
            print(f"  module search alone: {searched.get('best_step_us', math.nan) / 1e3:.2f} ms "
                  f"{searched.get('error', '')}", flush=True)
        save(path, name, entry)
    results = json.loads(path.read_text()) if path.exists() else {}
    print(table({n: results[n] for n in results if n in MODELS}))
    print(learning_table({n: results[n] for n in results if n in MODELS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
