"""What Mars's pre-trained encoder changes for its placer (BENCHMARKS.md, "Mars, round 7").

Issue 14's floor asks whether pre-training saves time. Where Mars reaches its target, a warm start or a search
reached it too, so this measures the encoder where it could matter, in two parts:

- ``--curves``: the policy's own samples per PPO update (the batch's mean step time and its fastest fitting one,
  ``policy_curve`` of each ``mars_ablation.py`` run), pre-trained against random encoder. Mars draws every sample from
  its policy (no search moves), so a falling mean is the policy learning; the best so far is not, since the warm start
  sets it from the first sample.
- ``--probe``: linear probes from what the placer reads of each unit to what a placer needs to know of it: its
  compute time (log, ``train.unit_compute_us``), its device in the best known placement (sim-search's, from
  ``mars.py --part baselines``) and, where the layers interleave (GNMT-4), its module layer (``train.module_labels``:
  what a placer of slices of the step must recognise to place modules whole). Readers: the shipped DGI encoder's embeddings, random encoders' (seeds 0-2, the
  width the shipped one has), the unit features the encoders read, and the unit's position in the step alone.
  Ridge regression (features standardised, lambda 1) scored by 5-fold cross-validation over units in a seeded
  order: R^2 for the compute time, accuracy for the device (one-hot least squares, the largest output wins) beside
  the majority device's share. Mars's own units at devplace's ``max_units`` (1,024), without ``module_units``:
  GNMT-4's 15 module units are too few to probe.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/mars.py --part baselines --models gnmt4,inception_v3 --samples 2000
    PYTHONPATH=$PWD .venv/bin/python benchmarks/mars_encoder_use.py --probe --models gnmt4,inception_v3
    PYTHONPATH=$PWD .venv/bin/python benchmarks/mars_encoder_use.py --curves --models gnmt4,inception_v3 \\
        --seeds 0,1,2,3,4,5,6,7,8,9 --samples 4000 --time-cap-s 30

Writes ``benchmarks/results/mars_encoder_use.json`` (both parts, each kept when the other runs) and
``mars_policy_curves.png`` (another ``--config``'s curves: key ``curves_CONFIG``, ``mars_policy_curves_CONFIG.png``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from devplace.fileio import write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mars import MODELS, RUNS, graph_and_cluster, load_now, model_names, write_figure  # noqa: E402
from mars_ablation import PAIRS, run_path  # noqa: E402
from reproduce_papers import RESULTS  # noqa: E402

OUT = RESULTS / "mars_encoder_use.json"
FOLDS = 5
RIDGE = 1.0
PROBE_UNITS = 1024
RANDOM_SEEDS = (0, 1, 2)
EDGE_UPDATES = 5      # the first and the last this many updates of a run are compared
WINDOWS = ((0, 160), (160, 320), (320, 480), (480, 640))   # samples: the arms compared at equal samples too


def _cv_predictions(x: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
    """Out-of-fold ridge predictions of ``y`` (units, outputs) from ``x`` (units, features)."""
    order = np.random.default_rng(seed).permutation(len(x))
    out = np.empty_like(y)
    for fold in np.array_split(order, FOLDS):
        train = np.setdiff1d(order, fold)
        mean, std = x[train].mean(0), x[train].std(0) + 1e-8
        a = np.hstack([(x[train] - mean) / std, np.ones((len(train), 1))])
        w = np.linalg.solve(a.T @ a + RIDGE * np.eye(a.shape[1]), a.T @ y[train])
        out[fold] = np.hstack([(x[fold] - mean) / std, np.ones((len(fold), 1))]) @ w
    return out


def _cv_accuracy(x: np.ndarray, label: np.ndarray, seed: int) -> float:
    """Out-of-fold accuracy of a one-hot least-squares classifier of ``label`` from ``x``."""
    one_hot = np.eye(int(label.max()) + 1)[label]
    return float((_cv_predictions(x, one_hot, seed).argmax(1) == label).mean())


def probe_scores(x: np.ndarray, compute_log: np.ndarray, device: np.ndarray, module: np.ndarray | None,
                 seed: int = 0) -> dict:
    """Cross-validated R^2 of the log compute time, accuracy of the best known device and, where the layers
    interleave (``module``), of the unit's module layer, from ``x``."""
    predicted = _cv_predictions(x, compute_log[:, None], seed)[:, 0]
    r2 = 1.0 - float(((predicted - compute_log) ** 2).sum() / ((compute_log - compute_log.mean()) ** 2).sum())
    return {"compute_r2": r2, "device_accuracy": _cv_accuracy(x, device, seed),
            "module_accuracy": None if module is None else _cv_accuracy(x, module, seed)}


def probe(name: str) -> dict:
    """``probe_scores`` of every reader on one model (needs its sim-search baseline with devices)."""
    import torch

    from devplace.learn.encoder import SHIPPED, GCNEncoder, load_encoder, unit_graph
    from devplace.learn.features import unit_majority
    from devplace.learn.mars import mars_units
    from devplace.learn.train import module_labels, seeded, unit_compute_us

    best = [json.loads(p.read_text()) for p in sorted(RUNS.glob(f"{name}-sim-search-*.json"))]
    best = [b for b in best if "devices" in b]
    if not best:
        raise SystemExit(f"{name}: no sim-search baseline with devices under {RUNS}: run "
                         f"`mars.py --part baselines --models {name}` first")
    best = min(best, key=lambda b: b["best_step_us"])
    graph, cluster = graph_and_cluster(name)
    units = mars_units(graph, PROBE_UNITS)
    g = unit_graph(graph, units.unit_of)
    compute_log = np.log1p(unit_compute_us(graph, cluster, units.unit_of).mean(1))
    device = unit_majority(np.asarray(best["devices"]), units.unit_of, cluster.n_devices)
    module = module_labels(graph, units.unit_of)
    shipped = load_encoder(SHIPPED)[0].encoder
    readers = {"pre-trained (DGI)": shipped}
    for seed in RANDOM_SEEDS:
        with seeded(seed):
            readers[f"random, seed {seed}"] = GCNEncoder(shipped.hidden)
    rows = {}
    with torch.no_grad():
        for reader, encoder in readers.items():
            rows[reader] = probe_scores(encoder(g.x, g.edge_index).numpy(), compute_log, device, module)
    features = g.x.numpy()
    rows["unit features (encoder input)"] = probe_scores(features, compute_log, device, module)
    rows["position in the step only"] = probe_scores(features[:, -3:-2], compute_log, device, module)
    return {"units": g.n_units, "best_known_us": best["best_step_us"], "best_known_from": "sim-search",
            "majority_device_share": float(np.bincount(device).max() / len(device)),
            "majority_module_share": None if module is None else float(np.bincount(module).max() / len(module)),
            "devices_used": int(len(np.unique(device))), "readers": rows, "load": round(load_now(), 1)}


def _mean(points, column: int, updates: slice) -> float:
    values = [p[column] for p in points[updates] if math.isfinite(p[column])]
    return statistics.mean(values) if values else math.nan


def curves(names: list[str], seeds: list[int], samples: int, cap_s: float, config: str) -> dict:
    """Per model, arm and seed: the policy's batch mean and batch best over the first and last ``EDGE_UPDATES``
    updates, and the change (negative: the policy's own samples got faster); medians per arm."""
    out = {}
    for name in names:
        arms = {}
        for arm in PAIRS["fine-tuned"]:
            runs = []
            for seed in seeds:
                path = run_path(name, arm, samples, cap_s, seed, config)
                if not path.exists() or "policy_curve" not in (r := json.loads(path.read_text())):
                    continue
                points = r["policy_curve"]
                first, last = slice(0, EDGE_UPDATES), slice(-EDGE_UPDATES, None)
                run = {"seed": seed, "updates": len(points), "samples": r["samples"], "best_step_us": r["best_step_us"],
                       "first_mean_us": _mean(points, 1, first), "last_mean_us": _mean(points, 1, last),
                       "first_batch_best_us": _mean(points, 2, first), "last_batch_best_us": _mean(points, 2, last),
                       "points": points}
                run["mean_change"] = run["last_mean_us"] / run["first_mean_us"] - 1
                run["batch_best_change"] = run["last_batch_best_us"] / run["first_batch_best_us"] - 1
                run["window_mean_us"] = [statistics.mean(w) if (w := [p[1] for p in points if a < p[0] <= b])
                                         else None for a, b in WINDOWS]
                runs.append(run)
            if runs:
                windows = [[r["window_mean_us"][i] for r in runs if r["window_mean_us"][i] is not None]
                           for i in range(len(WINDOWS))]
                arms[arm] = {"runs": runs, "median_window_mean_us": [statistics.median(w) if w else None
                                                                     for w in windows],
                             "window_runs": [len(w) for w in windows], **{f"median_{k}": statistics.median(r[k] for r in runs) for k in (
                    "first_mean_us", "last_mean_us", "first_batch_best_us", "last_batch_best_us", "mean_change",
                    "batch_best_change")}}
        if arms:
            out[name] = arms
    return out


def plot_curves(results: dict, suffix: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(2, len(results), figsize=(5 * len(results), 7), squeeze=False)
    for col, (name, arms) in enumerate(results.items()):
        for k, (arm, entry) in enumerate(arms.items()):
            for i, run in enumerate(entry["runs"]):
                pts = run["points"]
                for row, column in ((0, 1), (1, 2)):
                    axes[row][col].plot([p[0] for p in pts], [p[column] / 1e3 for p in pts], color=f"C{k}",
                                        alpha=0.5, lw=0.8, label=arm if i == 0 else None)
        axes[0][col].set_title(MODELS[name][0], fontsize=9)
        axes[1][col].set_xlabel("simulated placements")
    axes[0][0].set_ylabel("mean of the update's samples (ms)")
    axes[1][0].set_ylabel("fastest fitting sample of the update (ms)")
    write_figure(figure, axes, f"mars_policy_curves{suffix}.png")


def curves_table(results: dict) -> str:
    lines = ["| model | arm | runs | updates (median) | batch mean, first 5 updates (ms) | last 5 (ms) | change | "
             "batch best, first 5 (ms) | last 5 (ms) | change | runs whose mean fell |", "|" + "---|" * 11]
    for name, arms in results.items():
        for arm, e in arms.items():
            runs = e["runs"]
            lines.append("| " + " | ".join([
                MODELS[name][0], arm, str(len(runs)), f"{statistics.median(r['updates'] for r in runs):g}",
                f"{e['median_first_mean_us'] / 1e3:.1f}", f"{e['median_last_mean_us'] / 1e3:.1f}",
                f"{e['median_mean_change']:+.1%}", f"{e['median_first_batch_best_us'] / 1e3:.1f}",
                f"{e['median_last_batch_best_us'] / 1e3:.1f}", f"{e['median_batch_best_change']:+.1%}",
                f"{sum(r['mean_change'] < 0 for r in runs)}/{len(runs)}"]) + " |")
    lines += ["", "| model | arm | " + " | ".join(f"batch mean at samples {a}-{b}: median (runs)" for a, b in WINDOWS)
              + " |", "|" + "---|" * (2 + len(WINDOWS))]
    for name, arms in results.items():
        for arm, e in arms.items():
            lines.append("| " + " | ".join([MODELS[name][0], arm] + [
                "-" if m is None else f"{m / 1e3:.1f} ({n})"
                for m, n in zip(e["median_window_mean_us"], e["window_runs"])]) + " |")
    return "\n".join(lines)


def probe_table(results: dict) -> str:
    lines = ["| model | units | reader | compute time, R^2 (5-fold) | best known device, accuracy (5-fold; majority "
             "device's share) | module layer, accuracy (5-fold; largest module's share) |", "|" + "---|" * 6]
    for name, p in results.items():
        for reader, s in p["readers"].items():
            module = "-" if s["module_accuracy"] is None else \
                f"{s['module_accuracy']:.3f} ({p['majority_module_share']:.3f})"
            lines.append("| " + " | ".join([MODELS[name][0], str(p["units"]), reader, f"{s['compute_r2']:.3f}",
                                            f"{s['device_accuracy']:.3f} ({p['majority_device_share']:.3f})",
                                            module]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gnmt4,inception_v3", help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--probe", action="store_true", help="the linear probes (needs mars.py's baselines)")
    parser.add_argument("--curves", action="store_true", help="the policy curves of mars_ablation.py's runs")
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7", help="the ablation runs' seeds (--curves)")
    parser.add_argument("--samples", type=int, default=4000, help="the ablation runs' --samples (--curves)")
    parser.add_argument("--time-cap-s", type=float, default=30.0, help="the ablation runs' --time-cap-s (--curves)")
    parser.add_argument("--config", default="devplace", help="the ablation runs' --config (--curves)")
    args = parser.parse_args(argv)
    names = model_names(parser, args.models)
    saved = json.loads(OUT.read_text()) if OUT.exists() else {}
    if args.probe:
        saved["probe"] = {name: probe(name) for name in names}
        print(probe_table(saved["probe"]))
    if args.curves:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        suffix = "" if args.config == "devplace" else f"_{args.config}"     # each config's curves kept apart
        saved[f"curves{suffix}"] = found = curves(names, seeds, args.samples, args.time_cap_s, args.config)
        saved[f"curves_runs{suffix}"] = {"seeds": seeds, "samples": args.samples, "time_cap_s": args.time_cap_s,
                                "config": args.config}
        if found:
            plot_curves(found, suffix)
        print(curves_table(found))
    write_text_atomic(OUT, json.dumps(saved, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
