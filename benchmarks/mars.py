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
    .venv/bin/python benchmarks/mars.py --part starts        # every warm-start candidate: mars_starts.json
    .venv/bin/python benchmarks/mars.py --part equal-time --models transformer --time-budget-s 300   # mars_equal_time.json

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
from learned_placers import DEVPLACE as LEARNER_VARIANT, MODELS as LEARNED_MODELS, thinned  # noqa: E402
from reproduce_papers import CACHE, PAPER_GPU_FRACTION, PRESET, RESULTS, cached_graph  # noqa: E402

MODELS = {
    "gnmt4": LEARNED_MODELS["gnmt4"],
    "inception_v3": LEARNED_MODELS["inception_v3"],
    "transformer": ("Transformer (BERT-base, zoo)", "zoo:transformer", 4, PAPER_GPU_FRACTION),
}
MARS_RUNS = ("mars", "mars-no-pretrain")      # the ablation's arms shown beside the others (its seed-0 runs)
LEARNERS = {"colocrl": {}, "hp": {}}
BASELINES = ("single", "expert", "m-sct+opt", "sim-search")
# ``--part starts``: every algorithmic placer option init may name (all but sim-search and the seeded random one),
# Baechi's with and without their graph optimisations, each scored as Mars's warm start scores it
STARTS = ("single", "expert", "accelerate-auto", "pipeline-partition", "fx-size-partition", "round-robin", "metis",
          "heft", "m-topo", "m-etf", "m-sct", "m-topo+opt", "m-etf+opt", "m-sct+opt")
START_ORDERS = ("topological", "upward-rank")     # devplace's variant's schedule_orders (learned_placers.ROUND4)
# devplace's variant's warm-start candidates for Mars (mars_ablation.DEVPLACE) and, in ``--part equal-time``, for
# ColocRL and HP: the expert, one device and the two fastest split placers on the transformer (``--part starts``)
WARM_STARTS = "expert,single,metis,pipeline-partition"
# ``--part equal-time``: the others at the wall time of Mars's pre-trained arm (``--time-budget-s``), devplace's
# variant with Mars's warm starts for the learners, sim-search capped at that time
EQUAL_TIME = {"colocrl": LEARNER_VARIANT["colocrl"] | {"init": WARM_STARTS},
              "hp": LEARNER_VARIANT["hp"] | {"init": WARM_STARTS}, "sim-search": {}}
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
    """One learner run: best step time, its best-so-far curve (samples, seconds, step us), its own samples per
    update (``policy_curve``: samples, mean and fastest fitting step us of the update's batch) and, with option
    init, the cloning steps taken and the fit they reached (in steps, not seconds: the load does not move them)."""
    began, load = time.perf_counter(), load_now()
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "log.csv"
        try:
            placed = dp.place(graph, cluster, algo=algo, seed=seed, samples=samples, log=str(log), **options)
        except DevplaceError as exc:
            return {"error": str(exc), "seconds": round(time.perf_counter() - began, 1)}
        rows = list(csv.DictReader(log.open()))
    curve = [(int(r["samples"]), float(r["wall_s"]), float(r["best_step_us"])) for r in rows]
    policy_curve = [(int(r["samples"]), float(r["mean_step_us"]), float(r["batch_best_step_us"])) for r in rows]
    return {"best_step_us": dp.simulate(graph, cluster, placed).step_time_us, "curve": thinned(curve),
            "policy_curve": policy_curve,
            "samples": placed.options["samples_simulated"], "seconds": round(time.perf_counter() - began, 1),
            "load_before": round(load, 1), "load_after": round(load_now(), 1),
            **{k: placed.options[k] for k in ("init_updates_done", "init_fit") if k in placed.options}}


def algorithmic(graph, cluster, spec: str, samples: int) -> dict:
    """One algorithmic placer, seed 0: its step time, seconds and devices per op (``mars_encoder_use.py`` probes
    the encoder's embeddings against the best known placement's devices)."""
    began = time.perf_counter()
    options = {"max_evals": samples} if spec == "sim-search" else {}
    try:
        placed = dp.place(graph, cluster, algo=spec, seed=0, **options)
    except DevplaceError as exc:
        return {"error": str(exc).split(":")[0]}
    return {"best_step_us": dp.simulate(graph, cluster, placed).step_time_us,
            "seconds": round(time.perf_counter() - began, 1), "devices": [int(d) for d in placed.devices]}


def warm_start_candidate(graph, cluster, spec: str) -> dict:
    """One placer as a warm-start candidate, seed 0 (METIS is seeded): its step time as option init scores it (``train.fastest_start``,
    in the faster of ``START_ORDERS``; None: it overflows), the devices it uses and the seconds it took."""
    import numpy as np

    from devplace.learn.env import PlacementEnv
    from devplace.learn.train import fastest_start, warm_start

    began, load = time.perf_counter(), load_now()
    try:
        devices = warm_start("mars", graph, cluster, spec, seed=0)[spec]
    except DevplaceError as exc:
        return {"error": str(exc).split(":")[0], "seconds": round(time.perf_counter() - began, 1)}
    seconds = round(time.perf_counter() - began, 1)
    step_us = fastest_start({spec: devices}, PlacementEnv(graph, cluster, np.arange(graph.n_ops), START_ORDERS))[0][spec]
    return {"best_step_us": math.inf if step_us is None else step_us, "fits": step_us is not None,
            "devices_used": len(np.unique(devices)), "seconds": seconds, "load_before": round(load, 1)}


def equal_time_path(name: str, run: str, budget_s: float) -> Path:
    return RUNS / f"{name}-{run}-devplace-t{budget_s:g}.json"


def equal_time(graph, cluster, run: str, budget_s: float) -> dict:
    """One ``EQUAL_TIME`` run capped at ``budget_s`` seconds (the learners' sample budget never binds)."""
    if run == "sim-search":
        began = time.perf_counter()
        placed = dp.place(graph, cluster, algo=run, seed=0, time_budget_s=budget_s)
        return {"best_step_us": dp.simulate(graph, cluster, placed).step_time_us,
                "seconds": round(time.perf_counter() - began, 1)}
    return learn(graph, cluster, run, 10**6, EQUAL_TIME[run] | {"time_budget_s": budget_s})


def equal_time_table(names: list[str], budget_s: float, ablation: str) -> str:
    """``--part equal-time``'s runs beside Mars's (the ablation report ``ablation``: the pre-trained arm's best
    and median over its seeds), margins against the best of the others; written to ``mars_equal_time.json``, whose
    other models' entries (earlier rounds, other ablation reports) are kept."""
    mars = json.loads((RESULTS / f"{ablation}.json").read_text())
    path = RESULTS / "mars_equal_time.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    lines = ["| model | Mars, pre-trained: best / median of seeds (ms) | s per seed | " + " | ".join(EQUAL_TIME)
             + " | Mars's best against the best of them (+: Mars faster) | paper's Mars margin |",
             "|" + "---|" * (5 + len(EQUAL_TIME))]
    for name in names:
        runs = {run: json.loads(p.read_text()) for run in EQUAL_TIME if (p := equal_time_path(name, run, budget_s)).exists()}
        if name not in mars or not runs:
            continue
        pre = mars[name]["arms"]["mars"]
        best, median = min(r["best_step_us"] for r in pre), mars[name]["summary"]["mars"]["median_best_step_us"]
        others = min(r["best_step_us"] for r in runs.values())
        paper = PAPER[name]
        results[name] = {"mars_best_us": best, "mars_median_us": median, "runs": runs, "budget_s": budget_s,
                         "ablation": ablation, "mars_margin": 1 - best / others,
                         "paper_margin": 1 - paper["mars_s"] / paper["best_previous_s"]}
        cells = [f"{runs[r]['best_step_us'] / 1e3:.1f} ({runs[r].get('samples', '-')} samples, {runs[r]['seconds']:.0f} s)"
                 if r in runs else "-" for r in EQUAL_TIME]
        lines.append(f"| {MODELS[name][0]} | {best / 1e3:.1f} / {median / 1e3:.1f} | {mars[name]['time_cap_s']:g} | "
                     + " | ".join(cells) + f" | {results[name]['mars_margin']:+.1%} | "
                     f"{results[name]['paper_margin']:+.1%} |")
    write_text_atomic(path, json.dumps(results, indent=1, default=float) + "\n")
    return "\n".join(lines)


def run_part(part: str, names: list[str], samples: int, budget_s: float = 300.0) -> None:
    for name in names:
        graph, cluster = graph_and_cluster(name)
        print(f"{name}: {graph.n_ops} ops on {cluster.name}, load {load_now():.1f}", flush=True)
        if part == "starts":
            todo = {f"start-{spec}": (lambda spec=spec: warm_start_candidate(graph, cluster, spec)) for spec in STARTS}
        elif part == "equal-time":
            todo = {run: (lambda run=run: equal_time(graph, cluster, run, budget_s)) for run in EQUAL_TIME}
        elif part == "baselines":
            todo = {spec: (lambda spec=spec: algorithmic(graph, cluster, spec, samples)) for spec in BASELINES}
        else:
            todo = {run: (lambda run=run: learn(graph, cluster, run, samples, LEARNERS[run])) for run in LEARNERS}
        for run, do in todo.items():
            path = equal_time_path(name, run, budget_s) if part == "equal-time" else RUNS / f"{name}-{run}-{samples}.json"
            if path.exists():
                continue
            result = do() | {"ops": graph.n_ops, "cluster": cluster.name}
            write_text_atomic(path, json.dumps(result, default=float) + "\n")
            print(f"  {run}: {result.get('best_step_us', math.nan) / 1e3:.2f} ms in {result.get('seconds')} s "
                  f"{result.get('error', '')}", flush=True)


def starts_table(names: list[str], samples: int) -> str:
    """``--part starts``' runs as a table (fastest first), written to ``RESULTS/mars_starts.json``."""
    results = {name: {spec: json.loads(p.read_text()) for spec in STARTS
                      if (p := RUNS / f"{name}-start-{spec}-{samples}.json").exists()} for name in names}
    write_text_atomic(RESULTS / "mars_starts.json", json.dumps(results, indent=1, default=float) + "\n")
    lines = ["| model | placer | step time as a warm start (ms) | devices used | s to place | load |", "|" + "---|" * 6]
    for name, runs in results.items():
        for spec, r in sorted(runs.items(), key=lambda kv: kv[1].get("best_step_us", math.inf)):
            time_ms = r.get("error") or (f"{r['best_step_us'] / 1e3:.1f}" if r["fits"] else "does not fit")
            lines.append(f"| {MODELS[name][0]} | {spec} | {time_ms} | {r.get('devices_used', '-')} | {r['seconds']} "
                         f"| {r.get('load_before', '-')} |")
    return "\n".join(lines)


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
    parser.add_argument("--part", choices=("learners", "baselines", "starts", "equal-time"),
                        help="run one part (they can run side by side); starts: every warm-start candidate (STARTS), "
                             "equal-time: EQUAL_TIME at --time-budget-s beside --ablation's Mars; each printed as a table")
    parser.add_argument("--time-budget-s", type=float, default=300.0, help="seconds per run of --part equal-time")
    parser.add_argument("--ablation", default="mars_ablation_2000_devplace",
                        help="the ablation report (benchmarks/results/NAME.json) --part equal-time sets Mars beside")
    parser.add_argument("--report", action="store_true", help="write mars.json, the curves and the table")
    args = parser.parse_args(argv)
    names = model_names(parser, args.models)
    RUNS.mkdir(parents=True, exist_ok=True)
    if args.part:
        run_part(args.part, names, args.samples, args.time_budget_s)
        if args.part == "starts":
            print(starts_table(names, args.samples))
        if args.part == "equal-time":
            print(equal_time_table(names, args.time_budget_s, args.ablation))
    if args.report or not args.part:
        results = assemble(names, args.samples)
        write_text_atomic(RESULTS / "mars.json", json.dumps(results, indent=1, default=float) + "\n")
        plot(results)
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
