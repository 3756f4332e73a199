"""Placeto's generalization (BENCHMARKS.md, "Generalization"): train once, place graphs never seen.

    .venv/bin/python benchmarks/generalization.py --train-shipped     # (re)make devplace/data/placeto-4dev.pt
    .venv/bin/python benchmarks/generalization.py --train-shipped --devices 2   # placeto-2dev.pt
    .venv/bin/python benchmarks/generalization.py                     # the held-out table and the timings
    .venv/bin/python benchmarks/generalization.py --timings-only
    .venv/bin/python benchmarks/generalization.py --families --zero-shot-only   # the families' held-out 20%
    .venv/bin/python benchmarks/generalization.py --families --cross-only     # train on all families but one, place it
    .venv/bin/python benchmarks/generalization.py --families --sample-efficiency   # samples to within 5% of the best

The graphs: ``ZOO_FAMILIES`` below, zoo configurations captured once into benchmarks/.cache (the
last member of each list is held out; what the shipped policy and the committed figures used), or
with ``--families`` devplace's graph families (``devplace.zoo.families``: training split / held-out
20%). Cluster: baechi-4x2080, or with ``--families`` each family's default cluster (memory binds).

For every held-out graph, as ratios to one device (lower is better): Placeto zero-shot with the
shipped policy, fine-tuned (``--finetune-samples``), trained from scratch on that graph alone with
the same budget and with ``--large-samples``, beside m-SCT+opt, expert and sim-search. Then the
wall time of one placing episode (greedy, no per-step simulation) and of one training episode (a
simulation per step: incremental, and whole simulations, in the same run) for 100, 1,000 and 10,000
units. ``--cross-only``: per family, a policy trained on
the others places its held-out graphs, beside its start placer alone and the baselines.
``--sample-efficiency``: per family, on its smallest held-out member, the simulated placements Placeto
(from scratch and fine-tuned), HP and ColocRL need to come within 5% of the best placement any of them
or the baselines found. Writes ``benchmarks/results/generalization.json`` (each mode its own keys).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

import devplace as dp
from devplace.cluster import load_cluster
from devplace.errors import DevplaceError
from devplace.fileio import write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_papers import RESULTS, cached_graph  # noqa: E402

SEED = 0                       # the shipped policies' seed
SHIPPED_SAMPLES = {4: 400000, 2: 200000}   # their budgets of simulated placements, by device count
SHIPPED_OPTIONS = {"learning_rate": 0.003, "final_learning_rate": 0.0003, "max_units": 128}   # docs/learning.md says why
CROSS_SAMPLES = 60000          # each across-families policy's budget (~15 minutes or less here)
TRAIN_EVERY = 2                # the shipped policy trains on every other member of each training split
CLUSTER = "baechi-4x2080"
DATA = Path(__file__).resolve().parent.parent / "devplace" / "data"
SHIPPED = DATA / "placeto-4dev.pt"
ZOO_FAMILIES = {
    "rnnlm": ["zoo:rnnlm:layers=1,seq_len=20", "zoo:rnnlm:layers=2,seq_len=10", "zoo:rnnlm:layers=3,seq_len=10",
              "zoo:rnnlm:layers=2,seq_len=30,hidden_units=1024", "zoo:rnnlm:layers=4,seq_len=10,hidden_units=1024",
              "zoo:rnnlm:layers=3,seq_len=20,hidden_units=1024", "zoo:rnnlm"],
    "transformer": ["zoo:transformer:layers=2,hidden=512,heads=8,ffn_units=2048,seq_len=128,batch=8",
                    "zoo:transformer:layers=4,hidden=512,heads=8,ffn_units=2048,seq_len=128,batch=8",
                    "zoo:transformer:layers=3,hidden=1024,heads=8,ffn_units=4096,seq_len=64,batch=8",
                    "zoo:transformer:layers=6,hidden=768,heads=12,ffn_units=3072,seq_len=128,batch=8"],
}
BASELINES = ("m-sct+opt", "expert", "sim-search")
TIMING_GRAPH = "zoo:gnmt:layers=8"          # enough ops for 10,000 units
TIMING_UNITS = (100, 1000, 10000)
FULL_TIMED_UNITS = 1000        # above it the whole-simulation training episode is timed for its first steps
FULL_TIMED_STEPS = 300


USE_ZOO_FAMILIES = False        # set by --families: devplace.zoo.families instead of ZOO_FAMILIES


def splits() -> dict[str, tuple[list, list]]:
    """Per family: (training graphs, held-out graphs) with their names."""
    if not USE_ZOO_FAMILIES:
        return {name: ([(t, cached_graph(t)) for t in targets[:-1]], [(targets[-1], cached_graph(targets[-1]))])
                for name, targets in ZOO_FAMILIES.items()}
    from devplace.zoo import families

    out = {}
    for name in families.family_names():
        train, held = families.split(name)
        out[name] = ([(m.target, families.load(m)) for m in train], [(m.target, families.load(m)) for m in held])
    return out


def train_shipped(samples: int, n_devices: int) -> dict:
    """The shipped policy for ``n_devices``: the families' training splits (``devplace.zoo.families``), each on
    its family's default cluster (memory binds there, so one device is not an answer; for 2 devices, cut to 2
    holding the same memory), every ``TRAIN_EVERY``-th member."""
    from devplace.learn.placeto import PlacetoOptions, can_fit, train_policy
    from devplace.progress import LineReporter, reporting
    from devplace.zoo import families

    output = DATA / f"placeto-{n_devices}dev.pt"
    log = RESULTS / ("placeto-shipped-training.csv" if n_devices == 4 else f"placeto-shipped-{n_devices}dev-training.csv")
    training = [(member, families.load(member), families.default_cluster(name, n_devices))
                for name in families.family_names() for member in families.split(name)[0][::TRAIN_EVERY]]
    skipped = [m.target for m, g, c in training if not can_fit(g, c)]
    training = [(m, g, c) for m, g, c in training if m.target not in skipped]
    began = time.perf_counter()
    with reporting(LineReporter()):
        figures = train_policy([g for _, g, _ in training], [c for _, _, c in training], output,
                               samples=samples, seed=SEED, options=PlacetoOptions(**SHIPPED_OPTIONS, log=str(log)),
                               meta={"trained_on": [m.target for m, _, _ in training],
                                     "made_by": f"benchmarks/generalization.py --train-shipped --devices {n_devices} "
                                                f"--samples {samples}"})
    figures |= {"wall_s": round(time.perf_counter() - began, 1), "seed": SEED, "options": SHIPPED_OPTIONS,
                "clusters": sorted({c.name for _, _, c in training}), "skipped_cannot_fit": skipped,
                "size_bytes": output.stat().st_size, "load": open("/proc/loadavg").read().split()[:3]}
    print(json.dumps(figures))
    return figures


def step_us(graph, cluster, algo: str, **options) -> dict:
    began = time.perf_counter()
    try:
        placed = dp.place(graph, cluster, algo=algo, seed=SEED, **options)
    except DevplaceError as exc:
        return {"error": str(exc)[:120]}
    return {"step_us": dp.simulate(graph, cluster, placed).step_time_us, "seconds": round(time.perf_counter() - began, 2),
            **{k: placed.options[k] for k in ("episode_s", "units", "samples_simulated", "train_s", "stopped_by",
                                              "start", "start_step_us", "returned")
               if k in placed.options}}


def family_cluster(family: str):
    """The cluster a family is placed on: its default (memory binds) with --families, else CLUSTER."""
    if not USE_ZOO_FAMILIES:
        return load_cluster(CLUSTER)
    from devplace.zoo import families

    return families.default_cluster(family)


def held_out_rows(finetune_samples: int, large_samples: int, zero_shot_only: bool = False, tuned_every: int = 1,
                  part: str = "all") -> list[dict]:
    """Per held-out graph: Placeto zero-shot and the baselines; fine-tuned and from scratch on every
    ``tuned_every``-th held-out graph of each family (their budgets are what costs). ``part`` "policy" runs
    only what uses the shipped policy (zero-shot, fine-tuned), "baselines" the rest (so both can run at once)."""
    policy = {"zero_shot": {}} | ({} if zero_shot_only else {"finetuned": {"finetune_samples": finetune_samples}})
    scratch = {} if zero_shot_only else {
        "scratch_small": {"policy": "scratch", "finetune_samples": finetune_samples},
        "scratch_large": {"policy": "scratch", "finetune_samples": large_samples}}
    baselines = () if part == "policy" else BASELINES
    learned = {"policy": policy, "baselines": scratch}.get(part, policy | scratch)
    rows = []
    for family, (_, held) in splits().items():
        cluster = family_cluster(family)
        for k, (name, graph) in enumerate(held):
            single = dp.simulate(graph, cluster, np.zeros(graph.n_ops, dtype=np.int64))
            row = {"family": family, "graph": name, "ops": graph.n_ops, "single_us": single.step_time_us,
                   "single_fits": single.fits, "load": open("/proc/loadavg").read().split()[:3]}
            chosen = {key: options for key, options in learned.items()
                      if key == "zero_shot" or k % tuned_every == 0}
            row |= {key: step_us(graph, cluster, "placeto", **options) for key, options in chosen.items()}
            row |= {algo: step_us(graph, cluster, algo) for algo in baselines}
            for key in (*chosen, *baselines):
                if "step_us" in row[key]:
                    row[key]["ratio_to_one_device"] = round(row[key]["step_us"] / single.step_time_us, 4)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def cross_family(samples: int) -> list[dict]:
    """For each family: a policy trained (the shipped recipe, ``samples`` simulated placements) on the other
    families' training splits places its held-out graphs zero-shot, beside its start placer alone and the
    baselines, as ratios to one device."""
    import tempfile

    from devplace.learn.placeto import PlacetoOptions, can_fit, train_policy

    every = splits()
    rows = []
    for family, (_, held) in every.items():
        cluster = family_cluster(family)
        others = [other for other in every if other != family]
        training = [(g, family_cluster(other)) for other in others for _, g in every[other][0][::TRAIN_EVERY]]
        training = [(g, c) for g, c in training if can_fit(g, c)]
        with tempfile.TemporaryDirectory() as folder:
            policy = Path(folder) / "cross.pt"
            figures = train_policy([g for g, _ in training], [c for _, c in training], policy, samples=samples,
                                   seed=SEED, options=PlacetoOptions(**SHIPPED_OPTIONS))
            for name, graph in held:
                single = dp.simulate(graph, cluster, np.zeros(graph.n_ops, dtype=np.int64))
                row = {"placed_family": family, "trained_on": others, "graph": name, "ops": graph.n_ops,
                       "single_us": single.step_time_us, "single_fits": single.fits,
                       "train_graphs": len(training), "train_samples": figures["samples_simulated"],
                       "train_s": figures["train_s"], "load": open("/proc/loadavg").read().split()[:3],
                       "zero_shot": step_us(graph, cluster, "placeto", policy=str(policy))}
                zero_shot = row["zero_shot"]
                if "start" in zero_shot:        # the start placer alone: what the episode starts from
                    row["start_placer"] = {"algo": zero_shot["start"], "step_us": zero_shot["start_step_us"]}
                row |= {algo: step_us(graph, cluster, algo) for algo in BASELINES}
                for key in ("zero_shot", "start_placer", *BASELINES):
                    if math.isfinite(row.get(key, {}).get("step_us", math.inf)):
                        row[key]["ratio_to_one_device"] = round(row[key]["step_us"] / single.step_time_us, 4)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


class _Stopped(Exception):
    """Raised to end a timed episode after its first steps."""


def training_episode(net, ug, refresh, start, incremental: bool, max_steps: int | None = None) -> tuple[float, object]:
    """(seconds, Episode) of one seeded training episode's moves and simulations (no gradient), from ``start``;
    with ``max_steps`` (whole simulations only) it stops after that many moves: (seconds, None)."""
    import torch

    from devplace.learn import placeto_policy as pp
    from devplace.learn.placeto import PlacetoOptions

    options = PlacetoOptions(max_units=ug.n_units, incremental_from_units=0 if incremental else ug.n_units + 1)
    evaluate, moves = ug.env.evaluate, [0]

    def counted(unit_devices):
        moves[0] += 1
        if moves[0] > max_steps:
            raise _Stopped
        return evaluate(unit_devices)

    if max_steps is not None:
        ug.env.evaluate = counted      # the whole-simulation episode evaluates once per move
    began = time.perf_counter()
    try:
        episode = pp.run_episode(net, ug, refresh, options, torch.Generator().manual_seed(0), start)
    except _Stopped:
        episode = None
    finally:
        vars(ug.env).pop("evaluate", None)
    return time.perf_counter() - began, episode


def smallest_held_out() -> list[tuple[str, str, object]]:
    """Per family, its held-out member with the fewest ops: (family, target, graph)."""
    return [(family, *min(held, key=lambda named: named[1].n_ops)) for family, (_, held) in splits().items()]


def first_within(log_csv: Path, target_us: float) -> int | None:
    """The samples simulated when a training log's best step time first came within ``target_us`` (None: never)."""
    import csv

    with open(log_csv) as f:
        for row in csv.DictReader(f):
            if float(row["best_step_us"]) <= target_us:
                return int(row["samples"])
    return None


def sample_efficiency(budget: int, cap_s: float, tolerance: float = 0.05) -> list[dict]:
    """Samples to come within ``tolerance`` of the best known placement (the fastest of every run here, sim-search
    included), on the smallest held-out member of each family: Placeto from scratch and fine-tuned from the shipped
    policy (our start, and the paper's random one), HP and ColocRL from scratch, each for ``budget`` simulated
    placements and at most ``cap_s`` seconds. Read from each run's training log (best step time so far)."""
    import tempfile

    runs = {"placeto_scratch": ("placeto", {"policy": "scratch", "finetune_samples": budget}),
            "placeto_finetuned": ("placeto", {"finetune_samples": budget}),
            "placeto_scratch_random_start": ("placeto", {"policy": "scratch", "finetune_samples": budget,
                                                         "start": "random"}),
            "placeto_finetuned_random_start": ("placeto", {"finetune_samples": budget, "start": "random"}),
            "hp": ("hp", {"samples": budget}), "colocrl": ("colocrl", {"samples": budget})}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for family, name, graph in smallest_held_out():
            cluster = family_cluster(family)
            single = dp.simulate(graph, cluster, np.zeros(graph.n_ops, dtype=np.int64)).step_time_us
            row = {"family": family, "graph": name, "ops": graph.n_ops, "single_us": single, "budget": budget,
                   "cap_s": cap_s, "load": open("/proc/loadavg").read().split()[:3]}
            logs = {}
            for key, (algo, options) in runs.items():
                logs[key] = Path(folder) / f"{family}-{key}.csv"
                row[key] = step_us(graph, cluster, algo, **options, time_budget_s=cap_s, log=str(logs[key]))
                print(key, json.dumps(row[key]), flush=True)
            row |= {algo: step_us(graph, cluster, algo) for algo in BASELINES}
            known = [row[k]["step_us"] for k in (*runs, *BASELINES) if math.isfinite(row[k].get("step_us", math.inf))]
            row["best_known_us"] = min(known)
            target = (1 + tolerance) * row["best_known_us"]
            for key in runs:
                if logs[key].exists():
                    row[key]["samples_to_within"] = first_within(logs[key], target)
            for key in (*runs, *BASELINES):
                if math.isfinite(row[key].get("step_us", math.inf)):
                    row[key]["ratio_to_best_known"] = round(row[key]["step_us"] / row["best_known_us"], 4)
                    row[key]["ratio_to_one_device"] = round(row[key]["step_us"] / single, 4)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def episode_timings() -> list[dict]:
    """Per unit count: a placing episode, and a training episode with incremental and with whole simulations
    (same seed, same start: the same moves), in the same run; above ``FULL_TIMED_UNITS`` units the
    whole-simulation episode is timed for its first ``FULL_TIMED_STEPS`` moves and extrapolated."""
    import torch

    from devplace.learn import placeto_policy as pp
    from devplace.learn.placeto import PlacetoOptions, start_placement, unit_graph

    cluster = load_cluster(CLUSTER)
    graph = cached_graph(TIMING_GRAPH)
    net = pp.load_policy(SHIPPED, cluster)[0]
    out = []
    torch.set_num_threads(1)
    for units in TIMING_UNITS:
        options = PlacetoOptions(max_units=units)
        began = time.perf_counter()
        ug = unit_graph(graph, cluster, units)
        prepare_s = time.perf_counter() - began
        refresh = pp.refresh_steps(ug.n_units, options)
        began = time.perf_counter()
        start = start_placement(ug, options, SEED)
        placing = pp.run_episode(net, ug, refresh, options, torch.Generator().manual_seed(0), start, sample=False)
        placing_s = time.perf_counter() - began
        began = time.perf_counter()
        ug.env.evaluate(np.zeros((1, ug.n_units), dtype=np.int64))
        one_simulation_s = time.perf_counter() - began
        n_ops = ug.env.graph.n_ops
        row = {"graph": TIMING_GRAPH, "ops": graph.n_ops, "units": ug.n_units, "coarse_ops": n_ops,
               "memory_is_ample": ug.env.memory_is_ample, "start": start.algo,
               "prepare_s": round(prepare_s, 3), "placing_episode_s": round(placing_s, 3),
               "placing_simulations": placing.simulations, "one_simulation_ms": round(1e3 * one_simulation_s, 2),
               "load_before": open("/proc/loadavg").read().split()[:3]}
        incremental_s, episode = training_episode(net, ug, refresh, start, incremental=True)
        began = time.perf_counter()
        log_p, entropy = pp.log_probs(net, ug, episode)
        (log_p.sum() + entropy.sum()).backward()
        row |= {"training_simulations": episode.simulations, "backward_s": round(time.perf_counter() - began, 3),
                "incremental_episode_s": round(incremental_s, 3),
                "incremental_full_simulation_equivalents": round(episode.simulated_ops / n_ops, 1),
                "mean_resimulated_fraction": round((episode.simulated_ops - n_ops) / (ug.n_units * n_ops), 4),
                "moves_that_changed_a_device": int((episode.actions != start.unit_devices).sum())}
        if ug.n_units <= FULL_TIMED_UNITS:
            full_s, full = training_episode(net, ug, refresh, start, incremental=False)
            row |= {"full_episode_s": round(full_s, 3), "full_episode_timed_steps": ug.n_units,
                    "same_costs": full.costs_s == episode.costs_s}
        else:
            full_s, _ = training_episode(net, ug, refresh, start, incremental=False, max_steps=FULL_TIMED_STEPS)
            full_s *= ug.n_units / FULL_TIMED_STEPS
            row |= {"full_episode_s": round(full_s, 1), "full_episode_timed_steps": FULL_TIMED_STEPS}
        row |= {"full_over_incremental": round(full_s / incremental_s, 2),
                "load_after": open("/proc/loadavg").read().split()[:3]}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-shipped", action="store_true", help="train the shipped policy (seed %d)" % SEED)
    parser.add_argument("--devices", type=int, choices=sorted(SHIPPED_SAMPLES), default=4,
                        help="the shipped policy's device count")
    parser.add_argument("--samples", type=int, help="the shipped policy's budget (default: %s by device count)"
                        % SHIPPED_SAMPLES)
    parser.add_argument("--timings-only", action="store_true")
    parser.add_argument("--cross-only", action="store_true", help="only train on all but one family, place it")
    parser.add_argument("--cross-samples", type=int, default=CROSS_SAMPLES, help="each cross-family policy's budget")
    parser.add_argument("--sample-efficiency", action="store_true",
                        help="samples to within 5%% of the best known placement: Placeto, HP, ColocRL")
    parser.add_argument("--efficiency-samples", type=int, default=2000, help="each run's budget there")
    parser.add_argument("--efficiency-cap-s", type=float, default=300.0, help="each run's time cap there")
    parser.add_argument("--families", action="store_true", help="use devplace.zoo.families, not ZOO_FAMILIES")
    parser.add_argument("--zero-shot-only", action="store_true",
                        help="held-out graphs: only zero-shot, m-SCT+opt and expert (no training)")
    parser.add_argument("--finetune-samples", type=int, default=3000)
    parser.add_argument("--large-samples", type=int, default=20000)
    parser.add_argument("--part", choices=("all", "policy", "baselines"), default="all",
                        help="held-out table: only the shipped policy's columns, or only the others")
    parser.add_argument("--tuned-every", type=int, default=1,
                        help="fine-tune and train from scratch on every K-th held-out graph of each family only")
    args = parser.parse_args(argv)
    global USE_ZOO_FAMILIES
    USE_ZOO_FAMILIES = args.families
    path = RESULTS / "generalization.json"
    results = {}          # what this run measured; merged into the file's other keys at the end
    if args.train_shipped:
        key = "shipped" if args.devices == 4 else f"shipped_{args.devices}dev"
        results[key] = train_shipped(args.samples or SHIPPED_SAMPLES[args.devices], args.devices)
    elif args.timings_only:
        results["episode_timings"] = episode_timings()
    elif args.cross_only:
        results["cross_families" if args.families else "cross_family"] = cross_family(args.cross_samples)
    elif args.sample_efficiency:
        results["sample_efficiency" if args.families else "sample_efficiency_zoo"] = sample_efficiency(
            args.efficiency_samples, args.efficiency_cap_s)
    elif args.zero_shot_only:
        key = "zero_shot_families" if args.families else "zero_shot_held_out"
        results[key] = held_out_rows(0, 0, zero_shot_only=True)
    else:
        key = ("held_out_families" if args.families else "held_out") + ("" if args.part == "all" else "_" + args.part)
        results[key] = held_out_rows(args.finetune_samples, args.large_samples, tuned_every=args.tuned_every,
                                     part=args.part)
        results[key + "_budgets"] = {"finetune_samples": args.finetune_samples, "large_samples": args.large_samples,
                                     "tuned_every": args.tuned_every}
        if args.part == "all":
            results["episode_timings"] = episode_timings()
    earlier = json.loads(path.read_text()) if path.exists() else {}   # read last: another part may have written
    write_text_atomic(path, json.dumps(earlier | results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
