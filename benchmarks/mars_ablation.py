"""Mars's pre-training ablation with seeds (BENCHMARKS.md, "Mars: pre-training ablation").

The paper ("Accelerated Device Placement Optimization with Contrastive Learning", ICPP 2021) reports
13.2% less training time with the pre-trained encoder. One run per arm cannot show a difference of
that size: seeds move the curves more than that. So here every model (GNMT-4, Inception-V3, the
BERT-like transformer; ``mars.MODELS``) is trained with ``--seeds`` seeds in the arms of a pair:

- fine-tuned (the paper's setting): ``mars`` (the shipped DGI-pre-trained encoder) against
  ``mars-no-pretrain`` (``pretrained=false``), PPO training encoder and placer together;
- frozen: ``mars-frozen`` against ``mars-no-pretrain-frozen`` (``freeze_encoder=true``): the placer
  cannot move the encoder, so the arms differ only in the embeddings it reads.

With one seed every arm draws the same placer weights and the same samples (``devplace.learn.mars``).
Each run is capped by ``--samples`` and by ``--time-cap-s`` seconds (whichever comes first; the cap
makes the wall time of the whole ablation predictable on a shared machine, the samples it reached
are recorded). This script owns the ablation; ``mars.py`` shows its seed-0 runs beside the others.

Reported per model and arm, for each seed and as the median over seeds: the best step time, the
samples and seconds until the best-so-far came within 5% of the best known placement (the fastest
of the ablation's runs and of ``mars.py``'s baselines at the same budget, if cached; the issue's floor),
within 2% of it (``STRICT``: where a warm start meets 5% at the first batch, the stricter target can
still separate the arms, and the time to 5% is cloning's: the cloning steps each arm took are reported too,
which the load does not move; runs of ``--samples 20`` stop at the first batch) and within 5% of Mars's best (the fastest of all the model's ablation runs,
any arm); "not reached" counts as the run's last sample (its seconds) for the median, said in the table. Two measurements say whether the placer uses
the encoder: its drift (how far fine-tuning moved the encoder's weights, relative to their norm) and
the embedding dependence of the trained policy (``embedding_kl``: the mean KL divergence, per
decision, between the policy's device distribution with each unit's own embedding and with the
embeddings permuted among the units); ``--at-start`` measures the same of the untrained policies,
with the scale of what the decoder reads (``at_start``). ``VARIANTS`` (other PPO settings of the
pre-trained arm) are reported beside, on the same targets, when they have runs; so are ``SEARCHES``
(``--search``: the pre-trained arm's units and warm start searched without a policy at each seed's samples),
which tell what the policy adds to its units.

    .venv/bin/python benchmarks/mars.py --part baselines --samples 1600      # best known (sim-search etc.)
    .venv/bin/python benchmarks/mars_ablation.py --seeds 0,1,2 --samples 1600 --time-cap-s 400 --arms mars-frozen,mars-no-pretrain-frozen
    .venv/bin/python benchmarks/mars_ablation.py --seeds 0,1,2 --samples 1600 --time-cap-s 400   # the fine-tuned pair
    .venv/bin/python benchmarks/mars_ablation.py --seeds 0,1,2 --samples 800 --time-cap-s 300 --arms mars-sb3-ppo
    .venv/bin/python benchmarks/mars_ablation.py --seeds 0,1,2 --at-start
    .venv/bin/python benchmarks/mars_ablation.py --seeds 0,1,2 --samples 1600 --time-cap-s 400 --report
    .venv/bin/python benchmarks/mars_ablation.py --config devplace --seeds 0,1,2,3 --samples 2000 --time-cap-s 75   # 10 min a model
    .venv/bin/python benchmarks/mars.py --part baselines --models gnmt4 --samples 2000        # sim-search at its default budget
    .venv/bin/python benchmarks/mars_ablation.py --config devplace --models gnmt4 --seeds 0,1,2,3,4,5,6,7 --samples 4000 --time-cap-s 37
    .venv/bin/python benchmarks/mars_ablation.py --config devplace --models gnmt4 --seeds 0,1,2,3,4,5,6,7 --samples 4000 --time-cap-s 37 --search
    .venv/bin/python benchmarks/mars_ablation.py --config devplace --models gnmt4 --seeds 0,1,2,3,4,5,6,7 --samples 4000 --time-cap-s 37 --baseline-samples 2000 --report
    .venv/bin/python benchmarks/mars_ablation.py --config embedding-logits --models gnmt4 --seeds 0,1,2,3,4,5 --samples 4000 --time-cap-s 50
    .venv/bin/python benchmarks/mars_ablation.py --config module-logits --models gnmt4 --seeds 0,1,2,3,4,5 --samples 4000 --time-cap-s 50
    .venv/bin/python benchmarks/mars_ablation.py --config own-units --models inception_v3 --seeds 0,1,2,3,4,5 --samples 20 --time-cap-s 300   # cloning only

Runs are kept under benchmarks/.cache/mars/ as they finish; the report writes
``benchmarks/results/mars_ablation_SAMPLES.json`` and ``.png`` (``report_name``: one pair per budget,
so rounds at different budgets keep their files).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from devplace.fileio import write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mars import (BASELINES, MODELS, RUNS, WARM_STARTS, WITHIN, graph_and_cluster, learn, load_now,  # noqa: E402
                  model_names, reach, write_figure)
from learned_placers import ROUND4, thinned  # noqa: E402
from reproduce_papers import RESULTS  # noqa: E402

# The targets a run's best-so-far is timed to: key -> (within, of what). The floor is the 5% one of the best
# known placement; where a warm start's first batch already meets it, the stricter 2% one can still separate the arms.
STRICT = 0.02
# With ``--search`` runs, "best found" also counts the policy-free searches over Mars's units (they are not Mars
# and not a baseline the issue names, so the floor's best known leaves them out; both are reported).
TARGETS = {"to_best_known": (WITHIN, "best_known_us"), "to_best_known_strict": (STRICT, "best_known_us"),
           "to_mars_best": (WITHIN, "mars_best_us"), "to_best_found": (WITHIN, "best_found_us")}
TARGET_NAMES = {"to_best_known": "5% of best known", "to_best_known_strict": "2% of best known",
                "to_mars_best": "5% of Mars's best", "to_best_found": "5% of best found (searches too)"}


ABLATION = {"mars": {}, "mars-no-pretrain": {"pretrained": False},
            "mars-frozen": {"freeze_encoder": True}, "mars-no-pretrain-frozen": {"pretrained": False, "freeze_encoder": True}}
PAIRS = {"fine-tuned": ("mars", "mars-no-pretrain"), "frozen": ("mars-frozen", "mars-no-pretrain-frozen")}
# Beside the ablation, one documented alternative to CleanRL's PPO defaults (the paper states none):
# Stable-Baselines3's PPO defaults where devplace's Mars has the knob (Adam 3e-4, 10 epochs per batch, no
# entropy bonus; the annealing, the value clipping and the 4 minibatches stay), pre-trained encoder.
# "mars-entropy": five times CleanRL's entropy bonus, a first remedy tried where PPO's policy on GNMT-4's 15 module
# units turns nearly deterministic before a local search over the same units would stop improving.
VARIANTS = {"mars-sb3-ppo": {"learning_rate": 3e-4, "update_epochs": 10, "entropy_coef": 0.0},
            "mars-entropy": {"entropy_coef": 0.05}}
ARMS = ABLATION | VARIANTS
# devplace's variant (``--config devplace``), added to every arm; off, the paper's configuration (``--config paper``):
# every placement scored in the faster of two schedule orders; a warm start, the fastest of the expert, one device and
# the two fastest split placers on the transformer (METIS and DeepSpeed's pipeline partition: 435.7 and 436.6 ms
# against 554.0 for the one-device expert; ``mars.py --part starts`` measures every candidate; never sim-search's own
# result: ``mars.WARM_STARTS``), cloned until a sample is expected to move about 2 units from it;
# up to 1,024 units, merged only where the warm start keeps the device; the decoder's unit input layer-normalised
# (``devplace.learn.mars``). Each was measured before it was kept (``--study``).
# Where the step order interleaves the layers (GNMT-4, not the other two) the units are the module layers whole
# (``module_units``): Mars's slices of the step hold pieces of 1-7 of GNMT-4's 15 modules, so no decision moves one.
DEVPLACE = dict(schedule_orders=ROUND4["schedule_orders"], init=WARM_STARTS, init_stop_deviations=2.0,
                units_along_init=True, max_units=1024, normalize_units=True, module_units=True)
# Round 8: Mars's own units (no module_units: on GNMT-4 the 811 units cut along the warm start, where a linear probe
# recovers a unit's best known device from its embedding 93-95% of the time), without and with ``embedding_logits``
# (each unit's logits read its own embedding through a linear head; without it a trained placer places by position).
OWN_UNITS = {k: v for k, v in DEVPLACE.items() if k != "module_units"}
# Round 9: the head on GNMT-4's module units (15), where round 7's local search reached the best known and Mars did not.
CONFIGS = {"paper": {}, "devplace": DEVPLACE, "own-units": OWN_UNITS,
           "embedding-logits": OWN_UNITS | {"embedding_logits": True},
           "module-logits": DEVPLACE | {"embedding_logits": True}}
# ``--study``: the pre-trained arm, seed 0, with devplace's variant and without each of its options in turn
STUDY = {"devplace": DEVPLACE,
         "without-orders": DEVPLACE | {"schedule_orders": "topological"},
         "without-init": {k: v for k, v in DEVPLACE.items() if not k.startswith("init") and k != "units_along_init"},
         "without-stop": DEVPLACE | {"init_stop_deviations": 0.0},
         "without-along": DEVPLACE | {"units_along_init": False},
         "without-1024": DEVPLACE | {"max_units": 256},
         "without-normalize": DEVPLACE | {"normalize_units": False}}


def report_name(samples: int, config: str = "paper") -> str:
    """The report's file name, without extension, for runs of ``samples`` under ``config``."""
    return f"mars_ablation_{samples}" + ("" if config == "paper" else f"_{config}")


def run_path(name: str, arm: str, samples: int, cap_s: float, seed: int, config: str = "paper") -> Path:
    return RUNS / f"{name}-{arm}{'' if config == 'paper' else '-' + config}-{samples}-cap{cap_s:g}-seed{seed}.json"


def encoder_drift(checkpoint: Path, options: dict, seed: int) -> float:
    """||theta_end - theta_start|| / ||theta_start|| over the encoder's weights of a finished run."""
    from devplace.learn.encoder import SHIPPED, GCNEncoder, load_encoder
    from devplace.learn.train import seeded

    end = {k[len("encoder."):]: v for k, v in torch.load(checkpoint, weights_only=False)["policy"].items()
           if k.startswith("encoder.")}
    if options.get("pretrained", True):
        start = load_encoder(SHIPPED)[0].encoder.state_dict()
    else:
        with seeded(seed):
            start = GCNEncoder(64).state_dict()
    moved = math.sqrt(sum(float(((end[k] - v) ** 2).sum()) for k, v in start.items()))
    return moved / math.sqrt(sum(float((v ** 2).sum()) for v in start.values()))


_UNITS: dict = {}     # (graph, options that cut the units, seed) -> unit_of: the warm start is placed once per model and seed


def _policy(graph, cluster, checkpoint: Path, options: dict, seed: int):
    """The policy a run saved in ``checkpoint`` and the unit graph it reads."""
    from devplace.learn.encoder import GCNEncoder, unit_graph
    from devplace.learn.mars import MarsOptions, units_and_starts
    from devplace.placement import graph_fingerprint
    from devplace.learn.marsnet import SegmentPlacer

    settings = MarsOptions(**options)
    weights = torch.load(checkpoint, weights_only=False)["policy"]
    encoder = GCNEncoder(weights["encoder.act1.weight"].shape[0])
    policy = SegmentPlacer(encoder, cluster.n_devices, settings.hidden_size, settings.segment_length,
                           settings.normalize_units, settings.embedding_logits)
    policy.load_state_dict(weights)
    key = (graph_fingerprint(graph.names), settings.max_units, settings.units_along_init, settings.module_units, settings.init,
           settings.schedule_orders, seed)
    if key not in _UNITS:
        _UNITS[key] = units_and_starts(graph, cluster, settings, seed)[0].unit_of
    return policy, unit_graph(graph, _UNITS[key])


def embedding_kl(graph, cluster, checkpoint: Path, options: dict, seed: int, placements: int = 16) -> dict:
    """How much the trained policy's decisions depend on which embedding each unit gets: the mean, over
    the decisions of ``placements`` sampled placements, of KL(policy || policy with the unit embeddings
    permuted among the units), both given the same previous decisions (teacher forcing), in nats; beside
    it, for scale, the mean KL(policy || uniform), how far the policy has moved from a coin toss at all.
    A nearly deterministic policy hides logit changes from the KL, so ``logit_change`` is the logits' own
    change: mean |change| of the centred log-probabilities over their mean |value| (0: the embeddings
    do not move the logits; 1: they move them as much as the logits differ between devices)."""
    from devplace.learn.marsnet import mean_kl

    policy, g = _policy(graph, cluster, checkpoint, options, seed)
    generator = torch.Generator().manual_seed(seed)
    actions = policy.act(g, placements, generator).actions
    order = torch.randperm(g.n_units, generator=generator)
    with torch.no_grad():
        own, permuted = (policy.evaluate(g, actions, o).device_log_prob for o in (None, order))
    uniform = torch.full_like(own, -math.log(cluster.n_devices))
    centred, moved = own - own.mean(-1, keepdim=True), permuted - permuted.mean(-1, keepdim=True)
    return {"embedding_kl": mean_kl(own, permuted), "uniform_kl": mean_kl(own, uniform),
            "logit_change": float((moved - centred).abs().mean() / centred.abs().mean())}


def at_start(graph, cluster, seed: int, placements: int = 16) -> dict:
    """The policies as they start (one batch at learning rate 0, so the weights stay as built; frozen
    and fine-tuned arms start alike): per encoder its ``embedding_kl`` and the scale of what the decoder
    reads at each unit (root mean square of the unit's encoding and of the previous device's embedding,
    the two halves of its input; and of the encoder's embeddings the reader LSTM turns into encodings), and KL(pre-trained || random) on the pre-trained policy's samples: how
    differently the two encoders make the same placer decide before any training."""
    from devplace.learn.marsnet import mean_kl

    out, policies = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for arm in PAIRS["fine-tuned"]:
            checkpoint = Path(scratch) / f"{arm}.pt"
            learn(graph, cluster, "mars", 16, ARMS[arm] | {"learning_rate": 0.0, "checkpoint": str(checkpoint)},
                  seed=seed)
            out[arm] = embedding_kl(graph, cluster, checkpoint, ARMS[arm], seed, placements)
            policies[arm] = policy, g = _policy(graph, cluster, checkpoint, ARMS[arm], seed)
            with torch.no_grad():
                encoded = policy._encode(g)[0]
                out[arm] |= {"embedding_rms": float(policy.encoder(g.x, g.edge_index).pow(2).mean().sqrt()),
                             "encoding_rms": float(encoded.pow(2).mean().sqrt()),
                             "device_embedding_rms": float(policy.device_embed.weight.pow(2).mean().sqrt())}
    (policy, g), (other, _) = policies.values()
    actions = policy.act(g, placements, torch.Generator().manual_seed(seed)).actions
    with torch.no_grad():
        out["pretrained_vs_random_kl"] = mean_kl(policy.evaluate(g, actions).device_log_prob,
                                                 other.evaluate(g, actions).device_log_prob)
    return out


def run_all(names: list[str], arms: list[str], seeds: list[int], samples: int, cap_s: float,
            config: str = "paper") -> None:
    """Every arm of ``arms`` (``ARMS``, with ``CONFIGS[config]`` added) on every model and seed, kept under RUNS."""
    for name in names:
        graph, cluster = graph_and_cluster(name)
        print(f"{name}: {graph.n_ops} ops on {cluster.name}, load {load_now():.1f}", flush=True)
        for seed in seeds:
            for arm in arms:
                options = ARMS[arm] | CONFIGS[config]
                path = run_path(name, arm, samples, cap_s, seed, config)
                if path.exists():
                    continue
                with tempfile.TemporaryDirectory() as scratch:
                    checkpoint = Path(scratch) / "run.pt"
                    result = learn(graph, cluster, "mars", samples, options | {"time_budget_s": cap_s,
                                                                               "checkpoint": str(checkpoint)},
                                   seed=seed)
                    if "error" not in result:
                        result["encoder_drift"] = encoder_drift(checkpoint, options, seed)
                        result |= embedding_kl(graph, cluster, checkpoint, options, seed)
                write_text_atomic(path, json.dumps(result | {"seed": seed, "ops": graph.n_ops}, default=float) + "\n")
                print(f"  {arm} seed {seed}: {result.get('best_step_us', math.nan) / 1e3:.2f} ms, "
                      f"{result.get('samples')} samples in {result.get('seconds')} s {result.get('error', '')}",
                      flush=True)


# ``--search``: the same units and warm start as the pre-trained arm's, searched without a policy, each seed at the
# samples its pre-trained run drew: "random" draws every unit's device evenly; "local" moves each unit of the best
# placement so far (the warm start until a sample beats it) with probability init_stop_deviations / units to another
# device drawn evenly, what a cloned Mars sample moves at first. If Mars beats them at equal samples, the policy learned.
SEARCHES = ("random", "local")


def search_path(name: str, kind: str, samples: int, cap_s: float, seed: int, config: str) -> Path:
    return RUNS / f"{name}-search-{kind}-{config}-{samples}-cap{cap_s:g}-seed{seed}.json"


def unit_search(graph, cluster, options: dict, seed: int, samples: int, kind: str) -> dict:
    """A ``SEARCHES`` run over Mars's units and warm start for ``options`` and ``seed``: ``samples`` placements (the
    warm-start candidates counted first, as ``train`` counts them) in batches of ``samples_per_update``, scored as
    Mars scores them; its curve, as a Mars run's, holds the searched samples' best only (seconds from the warm start
    chosen on: Mars's curve also leaves out the placers' own time)."""
    import time

    import numpy as np

    from devplace.learn.env import PlacementEnv
    from devplace.learn.features import unit_majority
    from devplace.learn.mars import MarsOptions, units_and_starts
    from devplace.learn.train import fastest_start

    settings = MarsOptions(**options)
    load = load_now()
    units, starts = units_and_starts(graph, cluster, settings, seed)
    began = time.perf_counter()
    init_us, spec = (lambda times, spec: (times[spec], spec))(*fastest_start(starts, PlacementEnv(
        graph, cluster, np.arange(graph.n_ops), settings.orders())))
    env, n_dev = PlacementEnv(graph, cluster, units.unit_of, settings.orders()), cluster.n_devices
    start = unit_majority(starts[spec], units.unit_of, n_dev)
    rng = np.random.default_rng(seed)
    drawn, best_us, best, curve = len(starts), math.inf, start, []
    while drawn < samples:
        k = min(settings.samples_per_update, samples - drawn)
        if kind == "random":
            rows = rng.integers(0, n_dev, (k, units.n_units))
        else:
            centre = best if best_us < init_us else start
            move = rng.random((k, units.n_units)) < settings.init_stop_deviations / units.n_units
            rows = np.where(move, (centre + rng.integers(1, n_dev, (k, units.n_units))) % n_dev, centre)
        outcomes = env.evaluate(rows)
        fits = np.flatnonzero(~outcomes.oom)
        if len(fits) and outcomes.step_us[fits].min() < best_us:
            i = fits[np.argmin(outcomes.step_us[fits])]
            best_us, best = float(outcomes.step_us[i]), rows[i].copy()
        drawn += k
        curve.append((drawn, round(time.perf_counter() - began, 3), best_us))
    return {"best_step_us": min(best_us, init_us), "curve": thinned(curve), "samples": drawn, "init": spec,
            "init_step_us": init_us, "seconds": round(time.perf_counter() - began, 1), "load_before": round(load, 1),
            "load_after": round(load_now(), 1), "kind": kind}


def run_searches(names: list[str], seeds: list[int], samples: int, cap_s: float, config: str) -> None:
    """``SEARCHES`` on every model and seed whose pre-trained run exists, at that run's samples, kept under RUNS."""
    for name in names:
        graph, cluster = graph_and_cluster(name)
        for seed in seeds:
            mars_run = run_path(name, "mars", samples, cap_s, seed, config)
            if not mars_run.exists():
                continue
            drawn = json.loads(mars_run.read_text())["samples"]
            for kind in SEARCHES:
                path = search_path(name, kind, samples, cap_s, seed, config)
                if not path.exists():
                    result = unit_search(graph, cluster, ARMS["mars"] | CONFIGS[config], seed, drawn, kind)
                    write_text_atomic(path, json.dumps(result | {"seed": seed, "ops": graph.n_ops}, default=float) + "\n")
                    print(f"  search {kind} seed {seed}: {result['best_step_us'] / 1e3:.2f} ms in {drawn} samples, "
                          f"{result['seconds']} s", flush=True)


def study_path(name: str, variant: str, samples: int, cap_s: float) -> Path:
    return RUNS / f"{name}-study-{variant}-{samples}-cap{cap_s:g}-seed0.json"


def study(names: list[str], samples: int, cap_s: float) -> str:
    """``STUDY``: each option of devplace's variant measured by leaving it out (pre-trained encoder, seed 0, the
    same budget); runs kept under RUNS, the table returned and written to ``mars_options_SAMPLES.json``."""
    results = {}
    for name in names:
        graph, cluster = graph_and_cluster(name)
        for variant, options in STUDY.items():
            path = study_path(name, variant, samples, cap_s)
            if not path.exists():
                result = learn(graph, cluster, "mars", samples, options | {"time_budget_s": cap_s}, seed=0)
                write_text_atomic(path, json.dumps(result | {"options": options}, default=float) + "\n")
                print(f"  {name} {variant}: {result.get('best_step_us', math.nan) / 1e3:.2f} ms, "
                      f"{result.get('samples')} samples in {result.get('seconds')} s {result.get('error', '')}", flush=True)
            results.setdefault(name, {})[variant] = json.loads(path.read_text())
    write_text_atomic(RESULTS / f"mars_options_{samples}.json", json.dumps(results, indent=1, default=float) + "\n")
    lines = ["| model | variant | best (ms) | against devplace's variant | samples run | s | load |", "|" + "---|" * 7]
    for name, runs in results.items():
        full = runs["devplace"]["best_step_us"]
        for variant, r in runs.items():
            lines.append("| " + " | ".join([MODELS[name][0], variant, f"{r['best_step_us'] / 1e3:.1f}",
                                            f"{r['best_step_us'] / full - 1:+.1%}", str(r["samples"]),
                                            f"{r['seconds']:.0f}", f"{r['load_before']}-{r['load_after']}"]) + " |")
    return "\n".join(lines)


def start_path(name: str, seed: int) -> Path:
    return RUNS / f"{name}-start-seed{seed}.json"


def measure_starts(names: list[str], seeds: list[int]) -> None:
    """``at_start`` for each model and seed, kept under RUNS."""
    for name in names:
        graph, cluster = graph_and_cluster(name)
        for seed in seeds:
            if not start_path(name, seed).exists():
                figures = at_start(graph, cluster, seed) | {"seed": seed, "load": round(load_now(), 1)}
                write_text_atomic(start_path(name, seed), json.dumps(figures) + "\n")
                print(f"{name} seed {seed} at start: {figures}", flush=True)


def needed(r: dict, key: str, unit: str) -> float:
    """A run's samples or seconds (``unit``) to target ``key``; a run that did not reach it counts all it ran
    (its last sample; its training seconds, the curve's last point)."""
    value = r[f"{unit}_{key}"]
    return value if value is not None else (r["samples"] if unit == "samples" else r["curve"][-1][1])


def median_reach(runs: list[dict], key: str, unit: str = "samples") -> tuple[float, int]:
    """Median over seeds of the samples (or seconds) to ``key`` (``needed``) and how many runs reached it."""
    return statistics.median(needed(r, key, unit) for r in runs), sum(r[f"samples_{key}"] is not None for r in runs)


def _median_of(runs: list[dict], key: str) -> float | None:
    """The median of ``key`` over runs, None if a run lacks it (runs made before it was measured)."""
    values = [r.get(key) for r in runs]
    return None if None in values else statistics.median(values)


def best_at(curve: list, samples: int) -> float:
    """A run's best-so-far step time (us) after ``samples`` samples (inf before its first point)."""
    return min((best for drawn, _, best in curve if drawn <= samples), default=math.inf)


def compare_pairs(arms: dict) -> dict:
    """Per pair with runs in both arms: for each target, on how many seeds the pre-trained arm needed
    fewer, more or as many samples as the random one, and fewer or more seconds (``needed``); per seed
    both arms' best step time at equal samples (the fewer the two runs drew: time-capped runs draw what the
    load lets them), for where neither reaches a target; and, with option init, the cloning steps each arm
    took before its first batch (``cloning``): where a warm start meets a target at the first batch, the time
    to it is cloning's, and its steps, unlike its seconds, do not depend on the load."""
    out = {}
    for pair, (pre, rand) in PAIRS.items():
        by_seed = {arm: {r["seed"]: r for r in arms.get(arm, [])} for arm in (pre, rand)}
        seeds = sorted(set(by_seed[pre]) & set(by_seed[rand]))
        if not seeds:
            continue
        out[pair] = {"seeds": seeds, "equal_samples": [
            {"seed": s, "samples": (n := min(by_seed[pre][s]["samples"], by_seed[rand][s]["samples"])),
             "pretrained_us": best_at(by_seed[pre][s]["curve"], n), "random_us": best_at(by_seed[rand][s]["curve"], n)}
            for s in seeds]}
        if all("init_updates_done" in by_seed[arm][s] for arm in (pre, rand) for s in seeds):
            steps = [(by_seed[pre][s]["init_updates_done"], by_seed[rand][s]["init_updates_done"]) for s in seeds]
            out[pair]["cloning"] = {"steps": steps, "fewer": sum(p < r for p, r in steps),
                                    "more": sum(p > r for p, r in steps), "equal": sum(p == r for p, r in steps)}
        for key in TARGETS:
            diffs = {unit: [needed(by_seed[pre][s], key, unit) - needed(by_seed[rand][s], key, unit) for s in seeds]
                     for unit in ("samples", "seconds")}
            out[pair][key] = {"fewer": sum(d < 0 for d in diffs["samples"]), "more": sum(d > 0 for d in diffs["samples"]),
                              "equal": sum(d == 0 for d in diffs["samples"]),
                              "fewer_seconds": sum(d < 0 for d in diffs["seconds"]),
                              "more_seconds": sum(d > 0 for d in diffs["seconds"])}
    return out


def assemble(names: list[str], seeds: list[int], samples: int, cap_s: float, config: str = "paper",
             baseline_samples: int | None = None) -> dict:
    """The runs of each model, their targets and medians; best known includes ``mars.py``'s baselines run at
    ``baseline_samples`` (default: ``samples``; sim-search's evaluations)."""
    results = {}
    for name in names:
        arms = {arm: [json.loads(p.read_text()) for seed in seeds
                      if (p := run_path(name, arm, samples, cap_s, seed, config)).exists()] for arm in ARMS}
        arms |= {f"search-{kind}": [json.loads(p.read_text()) for seed in seeds
                                    if (p := search_path(name, kind, samples, cap_s, seed, config)).exists()]
                 for kind in SEARCHES}
        arms = {arm: [r for r in runs if "curve" in r] for arm, runs in arms.items()}
        if not any(all(arms[arm] for arm in pair) for pair in PAIRS.values()):
            continue
        arms = {arm: runs for arm, runs in arms.items() if runs}
        baselines = {spec: json.loads(p.read_text()) for spec in BASELINES
                     if (p := RUNS / f"{name}-{spec}-{baseline_samples or samples}.json").exists()}
        found = [r["best_step_us"] for arm in ABLATION for r in arms.get(arm, [])]
        searched = [r["best_step_us"] for arm in arms if arm.startswith("search-") for r in arms[arm]]
        best_of = {"mars_best_us": min(found),
                   "best_known_us": min(found + [b["best_step_us"] for b in baselines.values() if "best_step_us" in b])}
        best_of["best_found_us"] = min([best_of["best_known_us"]] + searched)
        for runs in arms.values():
            for r in runs:
                for key, (within, of) in TARGETS.items():
                    r[f"samples_{key}"], r[f"seconds_{key}"] = reach(r["curve"], (1 + within) * best_of[of])
        summary = {}
        for arm, runs in arms.items():
            summary[arm] = {"median_best_step_us": statistics.median(r["best_step_us"] for r in runs),
                            "median_seconds": statistics.median(r["seconds"] for r in runs),
                            **{f"median_{key}": _median_of(runs, key)
                               for key in ("encoder_drift", "embedding_kl", "uniform_kl", "logit_change")}}
            for key in TARGETS:
                summary[arm][f"median_samples_{key}"], summary[arm][f"reached_{key}"] = median_reach(runs, key)
                summary[arm][f"median_seconds_{key}"] = median_reach(runs, key, "seconds")[0]
        starts = [json.loads(p.read_text()) for seed in seeds if (p := start_path(name, seed)).exists()]
        results[name] = {"arms": arms, "summary": summary, "pairs": compare_pairs(arms), "at_start": starts, **best_of,
                         "baselines": {k: v.get("best_step_us") for k, v in baselines.items()},
                         "samples": samples, "time_cap_s": cap_s, "seeds": seeds, "config": config,
                         "baseline_samples": baseline_samples or samples,
                         "options": CONFIGS[config]}
    return results


def _figure(value) -> str:
    return "-" if value is None else f"{value:.2e}"


def _cell(samples, seconds) -> str:
    return "not reached" if samples is None else f"{samples} ({seconds:.0f} s)"


def table(results: dict) -> str:
    lines = ["| model | arm | seed | best (ms) | " + " | ".join(f"to {TARGET_NAMES[k]}: samples (s)" for k in TARGETS)
             + " | samples run | s | load | cloning steps | encoder drift | KL to permuted embeddings (nats) "
             "| KL to uniform (nats) | logit change |", "|" + "---|" * (11 + len(TARGETS))]
    for name, entry in results.items():
        for arm, runs in entry["arms"].items():
            for r in runs:
                lines.append("| " + " | ".join([
                    MODELS[name][0], arm, str(r["seed"]), f"{r['best_step_us'] / 1e3:.1f}",
                    *(_cell(r[f"samples_{k}"], r[f"seconds_{k}"]) for k in TARGETS), str(r["samples"]),
                    f"{r['seconds']:.0f}", f"{r['load_before']}-{r['load_after']}", str(r.get("init_updates_done", "-")),
                    *(_figure(r.get(key)) for key in ("encoder_drift", "embedding_kl", "uniform_kl", "logit_change"))])
                    + " |")
    lines += ["", "Medians over seeds; a run that did not reach a target counts all its samples (seconds).", "",
              "| model | best known (ms) | Mars's best (ms) | arm | median best (ms) | "
              + " | ".join(f"median samples (s) to {TARGET_NAMES[k]} (reached)" for k in TARGETS) + " |",
              "|" + "---|" * (5 + len(TARGETS))]
    for name, entry in results.items():
        for arm, s in entry["summary"].items():
            lines.append("| " + " | ".join([
                MODELS[name][0], f"{entry['best_known_us'] / 1e3:.1f}", f"{entry['mars_best_us'] / 1e3:.1f}", arm,
                f"{s['median_best_step_us'] / 1e3:.1f}",
                *(f"{s[f'median_samples_{k}']:g} ({s[f'median_seconds_{k}']:.0f} s) "
                  f"({s[f'reached_{k}']}/{len(entry['arms'][arm])})" for k in TARGETS)]) + " |")
    lines += ["", "| model | pair | seeds | " + " | ".join(
        f"to {TARGET_NAMES[k]}: pre-trained fewer / more / equal samples; fewer / more seconds" for k in TARGETS)
        + " |", "|" + "---|" * (3 + len(TARGETS))]
    for name, entry in results.items():
        for pair, c in entry["pairs"].items():
            lines.append("| " + " | ".join([MODELS[name][0], pair, ",".join(map(str, c["seeds"]))] + [
                f"{c[k]['fewer']} / {c[k]['more']} / {c[k]['equal']}; {c[k]['fewer_seconds']} / {c[k]['more_seconds']}"
                for k in TARGETS]) + " |")
    seeds = sorted({e["seed"] for entry in results.values() for c in entry["pairs"].values() for e in c["equal_samples"]})
    lines += ["", "Best step time at equal samples (the fewer the pair's runs drew), pre-trained / random (ms; equal: "
              "within 0.1 ms):", "", "| model | pair | " + " | ".join(f"seed {s}" for s in seeds)
              + " | pre-trained lower / higher / equal |", "|" + "---|" * (3 + len(seeds))]
    for name, entry in results.items():
        for pair, c in entry["pairs"].items():
            cells = {e["seed"]: f"{e['pretrained_us'] / 1e3:.1f} / {e['random_us'] / 1e3:.1f} ({e['samples']})"
                     for e in c["equal_samples"]}
            signs = [0 if abs(e["pretrained_us"] - e["random_us"]) < 100 else (1 if e["pretrained_us"] > e["random_us"] else -1)
                     for e in c["equal_samples"]]
            lines.append("| " + " | ".join([MODELS[name][0], pair] + [cells.get(s, "-") for s in seeds]
                                           + [f"{signs.count(-1)} / {signs.count(1)} / {signs.count(0)}"]) + " |")
    lines += ["", "Cloning steps before the first batch (option init), pre-trained / random:", "",
              "| model | pair | " + " | ".join(f"seed {s}" for s in seeds) + " | pre-trained fewer / more / equal |",
              "|" + "---|" * (3 + len(seeds))]
    for name, entry in results.items():
        for pair, c in entry["pairs"].items():
            if "cloning" in c:
                cells = dict(zip(c["seeds"], (f"{p} / {r}" for p, r in c["cloning"]["steps"])))
                lines.append("| " + " | ".join([MODELS[name][0], pair] + [cells.get(s, "-") for s in seeds] + [
                    f"{c['cloning']['fewer']} / {c['cloning']['more']} / {c['cloning']['equal']}"]) + " |")
    lines += ["", "| model | seed | encoder | KL to permuted embeddings (nats) | KL to uniform (nats) | logit change "
              "| embedding rms | unit encoding rms | previous-device embedding rms | KL pre-trained to random (nats) |",
              "|" + "---|" * 10]
    for name, entry in results.items():
        for start in entry["at_start"]:
            for arm in PAIRS["fine-tuned"]:
                a = start[arm]
                lines.append("| " + " | ".join([MODELS[name][0], str(start["seed"]), arm, f"{a['embedding_kl']:.2e}",
                                                f"{a['uniform_kl']:.2e}", _figure(a["logit_change"]),
                                                f"{a['embedding_rms']:.3f}",
                                                f"{a['encoding_rms']:.3f}", f"{a['device_embedding_rms']:.3f}",
                                                f"{start['pretrained_vs_random_kl']:.2e}"]) + " |")
    return "\n".join(lines)


def plot(results: dict, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (name, entry) in zip(axes[0], results.items()):
        for k, (arm, runs) in enumerate(entry["arms"].items()):
            for i, r in enumerate(runs):
                points = [(p[0], p[2] / 1e3) for p in r["curve"] if math.isfinite(p[2])]
                ax.step(*zip(*points), where="post", color=f"C{k}", alpha=0.8, lw=1,
                        label=arm if i == 0 else None)
        ax.axhline(entry["best_known_us"] / 1e3, ls="--", lw=1, color="k", label="best known")
        for within, style in ((WITHIN, ":"), (STRICT, "-.")):
            ax.axhline((1 + within) * entry["best_known_us"] / 1e3, ls=style, lw=1, color="0.4",
                       label=f"{within:.0%} of best known")
        ax.set_xlabel("simulated placements")
        ax.set_title(MODELS[name][0], fontsize=9)
    axes[0][0].set_ylabel("best step time so far (ms)")
    write_figure(figure, axes, f"{stem}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, each run in every arm of --arms")
    parser.add_argument("--arms", default=",".join(PAIRS["fine-tuned"]), help=f"comma-separated, of {', '.join(ARMS)}: "
                        "the arms to run (a model is reported once both arms of a pair have runs)")
    parser.add_argument("--samples", type=int, default=800, help="simulated placements per run (a cap)")
    parser.add_argument("--time-cap-s", type=float, default=300.0, help="seconds per run (a cap)")
    parser.add_argument("--at-start", action="store_true", help="only measure the untrained policies (at_start; "
                        "the report shows them)")
    parser.add_argument("--report", action="store_true", help="only write the report (JSON, PNG, the table)")
    parser.add_argument("--config", choices=tuple(CONFIGS), default="paper", help="paper: the paper's configuration; "
                        "devplace: devplace's variant added to every arm (DEVPLACE); own-units, embedding-logits: "
                        "round 8 (OWN_UNITS without and with the embedding head); module-logits: DEVPLACE with the head")
    parser.add_argument("--baseline-samples", type=int, default=None, help="read mars.py's baselines (best known) "
                        "made with this many samples (default: --samples)")
    parser.add_argument("--search", action="store_true", help="only run SEARCHES (no policy) over the pre-trained "
                        "arm's units and warm start, each seed at the samples its pre-trained run drew")
    parser.add_argument("--study", action="store_true", help="only measure devplace's variant without each of its "
                        "options in turn (STUDY: pre-trained encoder, seed 0)")
    parser.add_argument("--name", default="", help="the report's file name without extension (default: report_name's, "
                        "from --samples and --config; give another to keep an earlier report of the same budget "
                        "made at another --time-cap-s)")
    args = parser.parse_args(argv)
    names = model_names(parser, args.models)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if any(a not in ARMS for a in arms):
        parser.error(f"unknown arm in {args.arms!r}: use {', '.join(ARMS)}")
    RUNS.mkdir(parents=True, exist_ok=True)
    if args.at_start:
        measure_starts(names, seeds)
        return 0
    if args.study:
        print(study(names, args.samples, args.time_cap_s))
        return 0
    if args.search:
        run_searches(names, seeds, args.samples, args.time_cap_s, args.config)
        return 0
    if not args.report:
        run_all(names, arms, seeds, args.samples, args.time_cap_s, args.config)
    results = assemble(names, seeds, args.samples, args.time_cap_s, args.config, args.baseline_samples)
    stem = args.name or report_name(args.samples, args.config)
    write_text_atomic(RESULTS / f"{stem}.json", json.dumps(results, indent=1, default=float) + "\n")
    if results:         # a model enters once both arms of a pair have runs
        plot(results, stem)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
