"""Mars beside the other placers (BENCHMARKS.md, "Learning placers").

On GNMT-4, Inception-V3 and the BERT-like transformer of the zoo (the papers' configurations, 4 GPUs
of baechi-4x2080 at the papers' 12 GB), seed 0, at one sample budget:

- ``colocrl`` and ``hp`` at the same budget; ``single``, ``expert``, ``m-sct+opt`` and ``sim-search``
  (its own budget of simulator calls, set to the same number);
- ``mars`` and ``mars`` ``pretrained=false``: their seed-0 runs of the pre-training ablation, which
  ``mars_ablation.py`` owns (it runs them; this script reads its report at the same budget).

The best known placement of a model is the fastest any of them found. For each learner: its best
step time, and the samples and seconds it took to come within 5% of the best known (and within 5%
of the better Mars run's final best, the paper's "training time" to converge). Runs are sample
budgets, so step times do not depend on the machine; seconds do, and the machine is shared: the
load average is recorded beside them.

    .venv/bin/python benchmarks/mars.py --part baselines     # the algorithmic placers
    .venv/bin/python benchmarks/mars.py --part learners      # colocrl and hp
    .venv/bin/python benchmarks/mars_ablation.py --seeds 0 --samples 800   # the two Mars runs: mars_ablation_800.json
    .venv/bin/python benchmarks/mars.py --report             # mars.json, the curves PNG and the table

Each run is kept under benchmarks/.cache/mars/ as it finishes (the parts may run side by side); the
report writes ``benchmarks/results/mars.json`` and ``benchmarks/results/mars_curves.png``.
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

import devplace as dp
from devplace.errors import DevplaceError
from devplace.fileio import write_bytes_atomic, write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learned_placers import MODELS as LEARNED_MODELS, thinned  # noqa: E402
from reproduce_papers import CACHE, PAPER_GPU_FRACTION, PRESET, RESULTS, cached_graph  # noqa: E402

MODELS = {
    "gnmt4": LEARNED_MODELS["gnmt4"],
    "inception_v3": LEARNED_MODELS["inception_v3"],
    "transformer": ("Transformer (BERT-base, zoo)", "zoo:transformer", 4, PAPER_GPU_FRACTION),
}
MARS_RUNS = ("mars", "mars-no-pretrain")      # the ablation's arms shown beside the others (its seed-0 runs)
LEARNERS = {"colocrl": {}, "hp": {}}
BASELINES = ("single", "expert", "m-sct+opt", "sim-search")
PAPER = {"gnmt4": {"mars_s": 1.379, "no_pretrain_s": 1.396, "best_previous_s": 1.418},
         "inception_v3": {"mars_s": 0.067, "no_pretrain_s": 0.067, "best_previous_s": 0.067},
         "transformer": {"mars_s": 9.214, "no_pretrain_s": 11.363, "best_previous_s": 11.737}}
RUNS = CACHE / "mars"
WITHIN = 0.05


def graph_and_cluster(name: str):
    _, source, devices, fraction = MODELS[name]
    cluster = dp.load_cluster(PRESET)
    return cached_graph(source), cluster.with_devices(devices).with_memory_fraction(fraction)


def load_now() -> float:
    return os.getloadavg()[0]


def learn(graph, cluster, algo: str, samples: int, options: dict, seed: int = 0) -> dict:
    """One learner run: best step time and its best-so-far curve (samples, seconds, step us)."""
    began, load = time.perf_counter(), load_now()
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "log.csv"
        try:
            placed = dp.place(graph, cluster, algo=algo, seed=seed, samples=samples, log=str(log), **options)
        except DevplaceError as exc:
            return {"error": str(exc), "seconds": round(time.perf_counter() - began, 1)}
        rows = list(csv.DictReader(log.open()))
    curve = [(int(r["samples"]), float(r["wall_s"]), float(r["best_step_us"])) for r in rows]
    return {"best_step_us": dp.simulate(graph, cluster, placed).step_time_us, "curve": thinned(curve),
            "samples": placed.options["samples_simulated"], "seconds": round(time.perf_counter() - began, 1),
            "load_before": round(load, 1), "load_after": round(load_now(), 1)}


def algorithmic(graph, cluster, spec: str, samples: int) -> dict:
    began = time.perf_counter()
    options = {"max_evals": samples} if spec == "sim-search" else {}
    try:
        placed = dp.place(graph, cluster, algo=spec, seed=0, **options)
    except DevplaceError as exc:
        return {"error": str(exc).split(":")[0]}
    return {"best_step_us": dp.simulate(graph, cluster, placed).step_time_us,
            "seconds": round(time.perf_counter() - began, 1)}


def run_part(part: str, names: list[str], samples: int) -> None:
    for name in names:
        graph, cluster = graph_and_cluster(name)
        print(f"{name}: {graph.n_ops} ops on {cluster.name}, load {load_now():.1f}", flush=True)
        if part == "baselines":
            todo = {spec: (lambda spec=spec: algorithmic(graph, cluster, spec, samples)) for spec in BASELINES}
        else:
            todo = {run: (lambda run=run: learn(graph, cluster, run, samples, LEARNERS[run])) for run in LEARNERS}
        for run, do in todo.items():
            path = RUNS / f"{name}-{run}-{samples}.json"
            if path.exists():
                continue
            result = do() | {"ops": graph.n_ops, "cluster": cluster.name}
            write_text_atomic(path, json.dumps(result, default=float) + "\n")
            print(f"  {run}: {result.get('best_step_us', math.nan) / 1e3:.2f} ms in {result.get('seconds')} s "
                  f"{result.get('error', '')}", flush=True)


def reach(curve: list, target_us: float) -> tuple[int | None, float | None]:
    """Samples and seconds at which a best-so-far curve first comes within ``target_us``."""
    for samples, seconds, best in curve:
        if best <= target_us:
            return samples, seconds
    return None, None


def earlier_learner(name: str, algo: str, samples: int) -> dict | None:
    """ColocRL's or HP's run in learned_placers.json (same graph, cluster and seed), cut at ``samples``:
    its best-so-far curve up to that many samples, if that run went so far."""
    path = RESULTS / "learned_placers.json"
    run = json.loads(path.read_text()).get(name, {}).get(algo, {}) if path.exists() else {}
    curve = [p for p in run.get("curve", []) if p[0] <= samples]
    if not curve or run.get("samples", 0) < samples:
        return None
    return {"best_step_us": curve[-1][2], "curve": curve, "samples": samples,
            "source": f"learned_placers.json ({run['samples']} samples), cut at {samples}"}


def ablation_runs(name: str, samples: int) -> dict:
    """The seed-0 runs of ``MARS_RUNS`` in the ablation's report at ``samples`` for ``name``."""
    from mars_ablation import report_name

    path = RESULTS / f"{report_name(samples)}.json"
    entry = json.loads(path.read_text()).get(name, {}) if path.exists() else {}
    return {arm: run for arm in MARS_RUNS for run in entry["arms"].get(arm, []) if run["seed"] == 0}


def assemble(names: list[str], samples: int) -> dict:
    results = {}
    for name in names:
        entry = dict(ablation_runs(name, samples))
        for run in (*LEARNERS, *BASELINES):
            path = RUNS / f"{name}-{run}-{samples}.json"
            if path.exists():
                entry[run] = json.loads(path.read_text())
            elif run in LEARNERS and earlier_learner(name, run, samples):
                entry[run] = earlier_learner(name, run, samples)
        found = [r["best_step_us"] for r in entry.values() if math.isfinite(r.get("best_step_us", math.inf))]
        if not found:
            continue
        best_known = min(found)
        mars_best = min((entry[r]["best_step_us"] for r in MARS_RUNS if "best_step_us" in entry.get(r, {})),
                        default=math.inf)
        for run in (*MARS_RUNS, *LEARNERS):
            if "curve" in entry.get(run, {}):
                for key, target in (("to_best_known", best_known), ("to_mars_best", mars_best)):
                    s, t = reach(entry[run]["curve"], (1 + WITHIN) * target)
                    entry[run][f"samples_{key}"], entry[run][f"seconds_{key}"] = s, t
        margins = {}
        for key, runs in (("over_best_previous", (*LEARNERS, *BASELINES)), ("over_best_learner", LEARNERS)):
            prior = min((entry[r]["best_step_us"] for r in runs if "best_step_us" in entry.get(r, {})), default=math.inf)
            mars = entry.get("mars", {}).get("best_step_us", math.inf)     # the paper's Mars: pre-trained
            margins[key] = 1 - mars / prior if math.isfinite(prior) and math.isfinite(mars) else None
        results[name] = {"runs": entry, "best_known_us": best_known, "samples": samples, "mars_margin": margins,
                         "paper": PAPER[name]}
    return results


def table(results: dict) -> str:
    head = ["model", "best known", *MARS_RUNS, *LEARNERS, *BASELINES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, entry in results.items():
        runs = entry["runs"]
        cells = [MODELS[name][0], f"{entry['best_known_us'] / 1e3:.1f}"]
        for run in head[2:]:
            value = runs.get(run, {}).get("best_step_us")
            cells.append(f"{value / 1e3:.1f}" if value is not None and math.isfinite(value) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| model | run | samples to 5% of best known | s | samples to 5% of Mars's best | s | load |",
              "|---|---|---|---|---|---|---|"]
    for name, entry in results.items():
        for run in MARS_RUNS:
            r = entry["runs"].get(run, {})
            if "curve" not in r:
                continue
            cells = [MODELS[name][0], run] + [("-" if r[k] is None else f"{r[k]:,}" if k.startswith("samples")
                                               else f"{r[k]:.0f}") for k in
                                              ("samples_to_best_known", "seconds_to_best_known",
                                               "samples_to_mars_best", "seconds_to_mars_best")]
            cells.append(f"{r['load_before']}-{r['load_after']}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (name, entry) in zip(axes[0], results.items()):
        for run in (*MARS_RUNS, *LEARNERS):
            points = [(p[0], p[2] / 1e3) for p in entry["runs"].get(run, {}).get("curve", []) if math.isfinite(p[2])]
            if points:
                ax.step(*zip(*points), where="post", label=run)
        for k, spec in enumerate(BASELINES):
            value = entry["runs"].get(spec, {}).get("best_step_us")
            if value is not None and math.isfinite(value):
                ax.axhline(value / 1e3, ls="--", lw=1, color=f"C{k + 4}", label=spec)
        ax.set_yscale("log")
        ax.set_xlabel("simulated placements")
        ax.set_title(MODELS[name][0], fontsize=9)
    axes[0][0].set_ylabel("best step time so far (ms, log scale)")
    write_figure(figure, axes, "mars_curves.png")


def write_figure(figure, axes, name: str) -> None:
    """The legend on the first panel, then the figure as ``RESULTS/name`` (PNG), and closed."""
    import io

    from matplotlib import pyplot as plt

    axes[0][0].legend(fontsize=7)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=100)
    plt.close(figure)
    write_bytes_atomic(RESULTS / name, out.getvalue())


def model_names(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The comma-separated ``--models``, each checked against ``MODELS``."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: use {', '.join(MODELS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--samples", type=int, default=480, help="simulated placements per run")
    parser.add_argument("--part", choices=("learners", "baselines"),
                        help="run one part (they can run side by side)")
    parser.add_argument("--report", action="store_true", help="write mars.json, the curves and the table")
    args = parser.parse_args(argv)
    names = model_names(parser, args.models)
    RUNS.mkdir(parents=True, exist_ok=True)
    if args.part:
        run_part(args.part, names, args.samples)
    if args.report or not args.part:
        results = assemble(names, args.samples)
        write_text_atomic(RESULTS / "mars.json", json.dumps(results, indent=1, default=float) + "\n")
        plot(results)
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
