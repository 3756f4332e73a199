"""Mars: the DGI-pre-trained encoder, the segment-level placer, PPO's clipped update, learning and determinism."""

import json

import numpy as np
import pytest

import devplace as dp
from devplace.errors import DevplaceError
from devplace.placers import available

from test_learn import SLOW_LINK, fast_and_slow, two_chains

torch = pytest.importorskip("torch")

from devplace.learn.encoder import (SHIPPED, GCNEncoder, corpus_graphs, dgi_loss, dgi_model,  # noqa: E402
                                    discriminator_accuracy, load_encoder, unit_graph)
from devplace.learn.mars import mars_units  # noqa: E402
from devplace.learn.marsnet import SegmentPlacer  # noqa: E402
from devplace.learn.ppo import Batch, PPOSettings, ppo_update  # noqa: E402
from devplace.learn.train import seeded  # noqa: E402

FAST = dict(hidden_size=16, samples_per_update=8, minibatches=1, segment_length=8)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """As the learners train: one thread (a second only adds waiting on a busy machine)."""
    from devplace.learn.train import one_thread

    with one_thread():
        yield


def bundled_unit_graph(name="gnmt_layers_training.json"):
    graph = dp.load_graph(dp.example_path(name))
    return graph, unit_graph(graph, mars_units(graph, 1024).unit_of)


def test_mars_is_registered_off_by_default_with_ppo_and_ablation_options():
    from devplace.compare import default_algos

    info = available()["mars"]
    names = {o["name"] for o in info.describe()["options"]}
    assert {"samples", "checkpoint", "resume", "log", "workers", "clip", "update_epochs", "minibatches",
            "entropy_coef", "value_coef", "segment_length", "pretrained", "encoder", "freeze_encoder"} <= names
    assert not info.by_default and "mars" not in default_algos()
    # REINFORCE's knobs belong to ColocRL and HP: Mars neither lists them nor takes them silently
    reinforce_only = {"tanh_constant", "baseline_decay", "temperature", "deviations", "deviate_from", "lr_decay"}
    assert not names & reinforce_only and reinforce_only <= {o["name"] for o in available()["hp"].describe()["options"]}
    with pytest.raises(DevplaceError, match="tanh_constant"):
        dp.place(two_chains(), fast_and_slow(), algo="mars", samples=4, tanh_constant=2.0)


def test_sampling_and_teacher_forced_evaluation_agree_across_segments():
    """``act`` (unit by unit) and ``evaluate`` (one LSTM call per segment, state carried) give the same
    log-probabilities and values; segments of 5 cut the 47 units into 10."""
    _, g = bundled_unit_graph()
    with seeded(0):
        policy = SegmentPlacer(GCNEncoder(16), 4, 32, segment_length=5)
    drawn = policy.act(g, 3, torch.Generator().manual_seed(0))
    again = policy.evaluate(g, drawn.actions)
    assert drawn.actions.shape == (3, g.n_units) and g.n_units > 5 * 9
    assert torch.allclose(drawn.log_prob, again.log_prob, atol=1e-5)
    assert torch.allclose(drawn.value, again.value, atol=1e-5)


def _ratios_after_update(clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    _, g = bundled_unit_graph()
    with seeded(0):
        policy = SegmentPlacer(GCNEncoder(16), 4, 32, segment_length=16)
    generator = torch.Generator().manual_seed(0)
    drawn = policy.act(g, 8, generator)
    batch = Batch(drawn.actions, drawn.log_prob, drawn.value, torch.randn(8, generator=generator))
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.003)
    ppo_update(lambda a: policy.evaluate(g, a), policy.parameters(), optimizer, batch,
               PPOSettings(clip=clip, update_epochs=10, minibatches=1, entropy_coef=0.0, value_coef=0.0, grad_clip=0.0),
               generator)
    with torch.no_grad():
        return torch.exp(policy.evaluate(g, drawn.actions).log_prob - drawn.log_prob), batch.reward


def test_clipped_update_keeps_the_policy_ratio_within_the_clip_range():
    """Ten epochs on one batch: with clipping (0.2) almost every decision's probability ratio stays
    within 0.2 (+0.1 for the step that crosses the edge); without clipping most leave it."""
    clipped, _ = _ratios_after_update(0.2)
    free, _ = _ratios_after_update(1e9)
    outside = lambda r: float(((r - 1).abs() > 0.3).float().mean())   # noqa: E731
    assert outside(clipped) < 0.05, outside(clipped)
    assert outside(free) > 0.5, outside(free)


def test_mars_reaches_the_known_optimum_that_an_untrained_policy_misses():
    """Two chains of 18 ops, a fast and a ten times slower device: the optimum is all on the fast one."""
    g = two_chains(6, {"fast": 100.0, "slow": 1000.0})
    cluster, budget, optimum_us = fast_and_slow(), 240, 36 * 100.0
    options = FAST | dict(learning_rate=0.01, pretrained=False)
    trained = dp.place(g, cluster, algo="mars", seed=0, samples=budget, **options)
    untrained = dp.place(g, cluster, algo="mars", seed=0, samples=budget, **(options | dict(learning_rate=0.0)))
    assert dp.simulate(g, cluster, trained).step_time_us == optimum_us
    assert trained.options["samples_simulated"] == budget
    assert dp.simulate(g, cluster, untrained).step_time_us > optimum_us


def test_log_gives_each_updates_fastest_sample_apart_from_the_best_so_far(tmp_path):
    """The policy's own samples per update (``batch_best_step_us``), which the warm start's best so far hides: each
    update's fastest is at least the best so far, equals it where the best fell, and is above it on some updates."""
    import csv

    g = two_chains(6, {"fast": 100.0, "slow": 1000.0})
    log = tmp_path / "log.csv"
    dp.place(g, fast_and_slow(), algo="mars", seed=0, samples=240, log=str(log),
             **(FAST | dict(learning_rate=0.01, pretrained=False)))
    rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(log.open())]
    previous = float("inf")
    for r in rows:
        assert r["best_step_us"] <= r["batch_best_step_us"] <= r["mean_step_us"]
        assert r["best_step_us"] == previous or r["batch_best_step_us"] == r["best_step_us"]
        previous = r["best_step_us"]
    assert any(r["batch_best_step_us"] > r["best_step_us"] for r in rows)


def test_same_seed_same_run_other_seed_other_run(tmp_path):
    graph = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    from devplace.io.dnn_partitioning import cluster_for

    cluster = cluster_for(graph)
    runs = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        log = tmp_path / f"{name}.csv"
        placed = dp.place(graph, cluster, algo="mars", seed=seed, samples=32, log=str(log), **FAST)
        rows = [line.split(",") for line in log.read_text().splitlines()[1:]]
        runs.append((placed.devices.tolist(), [(r[0], *r[2:]) for r in rows]))     # all but the wall seconds
    assert runs[0] == runs[1]
    assert runs[0][1] != runs[2][1]


def test_shipped_encoder_tells_real_from_corrupted_held_out_graphs_better_than_a_random_encoder():
    """On graphs outside its pre-training corpus, the shipped encoder's DGI discriminator tells real node
    embeddings from those of the row-shuffled graph far better than a random GCN whose discriminator
    alone was trained, on the bundled graphs, for as many steps as the shipped encoder's epochs."""
    cluster = dp.load_cluster("baechi-4x2080")
    held_out = [corpus_graphs(target, cluster)[0][1] for target in ("zoo:transformer:preset=small,layers=3",
                                                                     "zoo:rnnlm:preset=small,layers=2")]
    trained, meta = load_encoder(SHIPPED)
    assert not any(t.startswith(("zoo:transformer:preset=small,layers=3", "zoo:rnnlm:preset=small,layers=2"))
                   for t in meta["graphs"])
    held = [unit_graph(g, mars_units(g, meta["max_units"]).unit_of) for g in held_out]
    with seeded(0):
        random = dgi_model(meta["hidden"], torch.Generator().manual_seed(0))
    optimizer = torch.optim.Adam([random.weight], lr=0.001)
    bundled = [bundled_unit_graph(name)[1] for name in ("gnmt_layers_training.json", "bert_l-3_training.json",
                                                        "resnet50_inference.json")]
    for _ in range(meta["epochs"]):
        for g in bundled:
            optimizer.zero_grad()
            dgi_loss(random, g).backward()
            optimizer.step()
    shipped_accuracy, random_accuracy = discriminator_accuracy(trained, held), discriminator_accuracy(random, held)
    assert shipped_accuracy > 0.8 and shipped_accuracy > random_accuracy + 0.1, (shipped_accuracy, random_accuracy)


def test_cli_pretrains_an_encoder_that_mars_then_uses(tmp_path):
    from typer.testing import CliRunner

    from devplace.cli import app

    out = tmp_path / "encoder.pt"
    done = CliRunner().invoke(app, ["train", "mars-encoder", "-o", str(out), "--graph", "data:gnmt_layers_training.json",
                                    "--graph", "data:bert_l-3_training.json", "--epochs", "3", "--hidden", "16", "--json"])
    assert done.exit_code == 0, done.output
    meta = json.loads(done.stdout)
    assert meta["epochs"] == 3 and set(meta["graphs"]) == {"data:gnmt_layers_training.json", "data:bert_l-3_training.json"}
    model, saved = load_encoder(out)
    assert model.hidden_channels == 16 and saved["seed"] == 0
    graph = dp.load_graph(dp.example_path("bert_l-3_training.json"))
    from devplace.io.dnn_partitioning import cluster_for

    placed = dp.place(graph, cluster_for(graph), algo="mars", seed=0, samples=16, encoder=str(out), **FAST)
    assert placed.options["samples_simulated"] == 16


def test_bad_encoder_file_and_options_are_one_line_errors(tmp_path):
    graph = dp.load_graph(dp.example_path("bert_l-3_training.json"))
    from devplace.io.dnn_partitioning import cluster_for

    cluster = cluster_for(graph)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    for options, words in ((dict(encoder=str(tmp_path / "missing.pt")), "does not exist"),
                           (dict(encoder=str(junk)), "cannot read mars encoder"),
                           (dict(segment_length=0), "segment_length"), (dict(clip=0.0), "clip")):
        with pytest.raises(DevplaceError, match=words) as caught:
            dp.place(graph, cluster, algo="mars", seed=0, samples=8, **options)
        assert "\n" not in str(caught.value)


def test_a_family_source_is_its_training_split(monkeypatch):
    """``family:NAME`` pre-trains on the family's training split, never on its held-out members."""
    from types import SimpleNamespace

    from devplace.zoo import families

    train = SimpleNamespace(model="gnmt", config=(("layers", 2),), file="gnmt_layers_training.json")
    held = SimpleNamespace(model="gnmt", config=(("layers", 3),), file="bert_l-3_training.json")
    monkeypatch.setattr(families, "split", lambda name: ([train], [held]))
    monkeypatch.setattr(families, "load", lambda member: dp.load_graph(dp.example_path(member.file)))
    got = corpus_graphs("family:recurrent", None)
    assert [name for name, _ in got] == ["family:recurrent:gnmt:layers=2"]
    assert got[0][1].n_ops == dp.load_graph(dp.example_path("gnmt_layers_training.json")).n_ops


def test_killed_and_resumed_mars_run_ends_exactly_like_an_uninterrupted_one(tmp_path):
    """PPO's state (parameters, Adam, generator, annealing step) survives a checkpoint: resumed = whole."""
    from devplace.progress import reporting
    from test_learn import KillAfter, Killed, _final_state, _same_parameters, _train

    options = FAST | dict(samples=48, samples_per_update=4, checkpoint_every=2, pretrained=False)
    whole, whole_params, whole_state = _train(tmp_path, "whole", "mars", **options)
    with reporting(KillAfter(7)), pytest.raises(Killed):
        _train(tmp_path, "part", "mars", **options)
    assert _final_state(tmp_path / "part.pt")[1]["update"] == 6
    resumed, params, state = _train(tmp_path, "part", "mars", resume=True, **options)
    assert resumed.devices.tolist() == whole.devices.tolist() and _same_parameters(params, whole_params)
    assert [r["loss"] for r in state["rows"]] == [r["loss"] for r in whole_state["rows"]]



def test_freeze_encoder_keeps_the_encoder_as_it_starts_and_still_trains_the_placer(tmp_path):
    """With ``freeze_encoder`` the encoder's weights end as they start (the seed's random GCN) while the
    placer's move; without it PPO moves both."""
    g, cluster = two_chains(6, {"fast": 100.0, "slow": 1000.0}), fast_and_slow()
    options = FAST | dict(learning_rate=0.01, pretrained=False, encoder_hidden=8, samples=32)
    with seeded(0):      # as mars builds its networks
        start = SegmentPlacer(GCNEncoder(8), cluster.n_devices, FAST["hidden_size"], FAST["segment_length"]).state_dict()

    def moved(frozen: bool, part: str) -> float:
        checkpoint = tmp_path / f"frozen-{frozen}.pt"
        if not checkpoint.exists():
            dp.place(g, cluster, algo="mars", seed=0, checkpoint=str(checkpoint), freeze_encoder=frozen, **options)
        end = torch.load(checkpoint, weights_only=False)["policy"]
        return max(float((end[k] - v).abs().max()) for k, v in start.items() if k.startswith(part))

    assert moved(True, "encoder.") == 0.0 and moved(True, "decoder.") > 1e-3
    assert moved(False, "encoder.") > 1e-3 and moved(False, "decoder.") > 1e-3


def test_schedule_orders_let_mars_score_a_placement_in_its_faster_order(tmp_path):
    """Option schedule_orders (devplace's variant): Mars's every placement is scored in the faster of the
    topological and upward-rank orders, and the placement returned carries the order its figure was
    simulated in. An untrained policy (learning rate 0) draws the same placements either way; on a graph
    where some splits wait 100 us for an idle op in the topological order, they score less with both orders."""
    from devplace.cluster import uniform_cluster
    from devplace.graph import GraphBuilder

    b = GraphBuilder(["gpu"])    # test_learn's waits_for_an_idle_op, with a read twice so it is a unit of its own
    for name in ("x", "a", "c", "b1", "b2", "b3"):
        b.add_op(name, compute_us={"gpu": 100.0})
    for src, dst in (("a", "b1"), ("a", "c"), ("b1", "b2"), ("b2", "b3")):
        b.add_edge(src, dst, bytes=8.0)
    g, cluster = b.build(), uniform_cluster(2)
    options = FAST | dict(learning_rate=0.0, pretrained=False, samples=64)

    def run(orders: str):
        log = tmp_path / f"{orders}.csv"
        placed = dp.place(g, cluster, algo="mars", seed=0, schedule_orders=orders, log=str(log), **options)
        rows = [line.split(",") for line in log.read_text().splitlines()]
        column = rows[0].index("mean_step_us")
        return placed, [float(r[column]) for r in rows[1:]]

    (both, both_means), (_, topological_means) = run("topological,upward-rank"), run("topological")
    assert all(x <= y for x, y in zip(both_means, topological_means)) and sum(both_means) < sum(topological_means)
    assert dp.simulate(g, cluster, both).step_time_us == both.options["step_us"]


def test_mars_warm_start_is_cloned_into_the_policy_and_returned_unless_beaten():
    """Option init (the learners' warm start, now Mars's too): the fastest named placer's placement is cloned
    into the placer by teacher forcing, so the policy then draws it with high probability, and the run
    returns it if no sample beats it (here no PPO update: learning rate 0)."""
    graph = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    from devplace.io.dnn_partitioning import cluster_for

    cluster = cluster_for(graph)
    placed = dp.place(graph, cluster, algo="mars", seed=0, samples=16, init="m-sct+opt", init_updates=60, init_learning_rate=0.03,
                      **(FAST | dict(learning_rate=0.0, pretrained=False)))
    assert placed.options["init"] == "m-sct+opt" and placed.options["init_fit"] > 0.9
    assert placed.options["step_us"] <= placed.options["init_step_us"]    # its devices, scored as every sample
    untrained = dp.place(graph, cluster, algo="mars", seed=0, samples=16, init="m-sct+opt", init_updates=0,
                         **(FAST | dict(learning_rate=0.0, pretrained=False)))
    assert untrained.options["init_fit"] < 0.6


def test_normalize_units_puts_the_unit_encodings_on_the_device_embeddings_scale():
    """Option normalize_units: the unit encodings the decoder reads start at a root mean square of about 1,
    as the previous device's embedding beside them; without it the reader's LSTM outputs are several times
    smaller (BENCHMARKS.md: 6-19x on the zoo models), so the decoder barely hears the unit."""
    _, g = bundled_unit_graph()

    def scales(normalize: bool) -> tuple[float, float]:
        with seeded(0):
            policy = SegmentPlacer(load_encoder(SHIPPED)[0].encoder, 4, 128, 64, normalize_units=normalize)
        with torch.no_grad():
            encoded = policy._encode(g)[0]
        return float(encoded.pow(2).mean().sqrt()), float(policy.device_embed.weight.detach().pow(2).mean().sqrt())

    (units, devices), (raw_units, raw_devices) = scales(True), scales(False)
    assert devices == raw_devices and 0.9 < units / devices < 1.1
    assert raw_units / raw_devices < 0.3


def _bundled_with_warm_start():
    graph = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    from devplace.io.dnn_partitioning import cluster_for

    cluster = cluster_for(graph)
    return graph, cluster, np.asarray(dp.place(graph, cluster, algo="m-sct+opt", seed=0).devices)


def test_units_along_the_warm_start_hold_it_where_evenly_merged_units_do_not():
    """Option units_along_init (``capped_units_along``): capped to a few more units than the warm start has
    runs of one device in step order, the units hold the warm start as the uncapped units do (each unit's
    majority device gives the same per-op placement); merged evenly (``capped_units``) they lose it."""
    from devplace.learn.features import capped_units, capped_units_along, unit_majority
    from devplace.transforms.coplacement import coplacement_groups

    graph, cluster, warm = _bundled_with_warm_start()
    labels = coplacement_groups(graph, single_consumer=True, mirror=False)
    full = mars_units(graph, 10**6)
    runs = 1 + int(np.count_nonzero(np.diff(unit_majority(warm, full.unit_of, cluster.n_devices))))
    cap = runs + 3
    assert cap < full.n_units

    def held(units) -> np.ndarray:
        return unit_majority(warm, units.unit_of, cluster.n_devices, units.n_units)[units.unit_of]

    along, even = capped_units_along(graph, labels, cap, warm), capped_units(graph, labels, cap)
    assert along.n_units <= cap and even.n_units == cap
    assert (held(along) == held(full)).all()
    assert (held(even) != held(full)).any()


def test_init_stop_deviations_ends_cloning_while_samples_still_move_a_few_units():
    """Option init_stop_deviations: cloning stops once a sample is expected to differ from the warm start in
    at most that many units (here 5), before all init_updates; without it cloning runs them all and the policy
    ends closer to the warm start."""
    graph, cluster, _ = _bundled_with_warm_start()
    options = FAST | dict(learning_rate=0.0, pretrained=False, samples=8, init="m-sct+opt", init_updates=60,
                          init_learning_rate=0.03)
    stopped = dp.place(graph, cluster, algo="mars", seed=0, init_stop_deviations=5.0, **options).options
    full = dp.place(graph, cluster, algo="mars", seed=0, **options).options
    units = stopped["units"]
    assert 0 < stopped["init_updates_done"] < 60 == full["init_updates_done"]
    assert units * (1 - stopped["init_fit"]) <= 5.0 + 1e-6      # the fit it stopped at (geometric mean)
    assert full["init_fit"] > stopped["init_fit"]


def test_module_units_place_module_layers_whole_where_layers_interleave():
    """Option module_units: where the step order interleaves the layers (two modules taking turns, as GNMT's do
    over time steps), Mars's units are the modules whole, so each decision moves a module with its backward ops
    and weights, and the placement returned keeps every module on one device; Mars's own units (colocation
    groups and single-consumer chains) run along the step and hold pieces of both. Where each layer runs once
    nothing changes."""
    from test_baselines import scoped_step

    from devplace.learn.train import module_labels

    g = scoped_step([(f"layers.{k % 2}", 10.0, 100.0) for k in range(4)])
    modules = module_labels(g, np.arange(g.n_ops))
    own, whole = mars_units(g, 256), mars_units(g, 256, modules=True)
    assert whole.n_units == 2 and all(len(set(modules[whole.unit_of == u])) == 1 for u in range(whole.n_units))
    assert any(len(set(modules[own.unit_of == u])) > 1 for u in range(own.n_units))     # without it, mixed units
    once = scoped_step([(f"layers.{k}", 10.0, 100.0) for k in range(3)])
    assert (mars_units(once, 256, modules=True).unit_of == mars_units(once, 256).unit_of).all()
    placed = dp.place(g, SLOW_LINK, algo="mars", seed=0, samples=16, module_units=True, **FAST)
    assert placed.options["units"] == 2
    assert all(len(set(placed.devices[modules == m].tolist())) == 1 for m in np.unique(modules))


def test_embedding_logits_make_the_placer_decide_by_each_units_embedding_not_its_position(tmp_path):
    """Option embedding_logits: each unit's device logits read its own embedding through a linear head. Cloned to a
    split warm start, the placer then decides by the embedding: handed the embeddings permuted among the units, its
    decisions change by over 1 nat each (BENCHMARKS.md, round 7: a trained placer without the head, 2e-4) and
    follow the unit whose embedding it got; without the head they change by under 0.4 nats and follow the position."""
    from devplace.learn.features import unit_majority
    from devplace.learn.marsnet import mean_kl

    graph, cluster, warm = _bundled_with_warm_start()
    units = mars_units(graph, 1024)
    g, target = unit_graph(graph, units.unit_of), torch.from_numpy(unit_majority(warm, units.unit_of, cluster.n_devices))
    order = torch.randperm(g.n_units, generator=torch.Generator().manual_seed(0))

    def cloned(head: bool) -> tuple[float, float, float]:
        checkpoint = tmp_path / f"head-{head}.pt"
        dp.place(graph, cluster, algo="mars", seed=0, samples=8, init="m-sct+opt", init_updates=30,
                 init_learning_rate=0.03, max_units=1024, embedding_logits=head, checkpoint=str(checkpoint),
                 **(FAST | dict(learning_rate=0.0, pretrained=False)))
        weights = torch.load(checkpoint, weights_only=False)["policy"]
        policy = SegmentPlacer(GCNEncoder(weights["encoder.act1.weight"].shape[0]), cluster.n_devices,
                               FAST["hidden_size"], FAST["segment_length"], embedding_logits=head)
        policy.load_state_dict(weights)
        with torch.no_grad():
            own, permuted = (policy.evaluate(g, target.unsqueeze(0), o).device_log_prob for o in (None, order))
        greedy = permuted[0].argmax(-1)
        return (mean_kl(own, permuted), float((greedy == target[order]).float().mean()),
                float((greedy == target).float().mean()))

    (kl, by_embedding, by_position), (kl_without, by_embedding_without, by_position_without) = cloned(True), cloned(False)
    assert kl > 1.0 and by_embedding > 0.8 > by_position, (kl, by_embedding, by_position)
    assert kl_without < 0.4 and by_position_without > by_embedding_without, (kl_without, by_embedding_without,
                                                                             by_position_without)
