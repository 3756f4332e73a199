"""Mars: the DGI-pre-trained encoder, the segment-level placer, PPO's clipped update, learning and determinism."""

import json

import pytest

import devplace as dp
from devplace.errors import DevplaceError
from devplace.placers import available

from test_learn import fast_and_slow, two_chains

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


def test_same_seed_same_run_other_seed_other_run(tmp_path):
    graph = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    from devplace.io.dnn_partitioning import cluster_for

    cluster = cluster_for(graph)
    runs = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        log = tmp_path / f"{name}.csv"
        placed = dp.place(graph, cluster, algo="mars", seed=seed, samples=32, log=str(log), **FAST)
        rows = [line.split(",") for line in log.read_text().splitlines()[1:]]
        runs.append((placed.devices.tolist(), [(r[0], r[2], r[3], r[4], r[5], r[6]) for r in rows]))
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
