"""The benchmark model zoo: every model trains one step in its small preset; configuration handling."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from devplace import zoo  # noqa: E402
from devplace.errors import DevplaceError  # noqa: E402

pytestmark = pytest.mark.torch

EXPECTED_MODELS = {"gnmt", "rnnlm", "inception_v3", "resnet50", "transformer", "nasnet", "mlp", "small_cnn"}


def test_registry_lists_every_model_family():
    assert EXPECTED_MODELS <= set(zoo.names())
    assert zoo.names() == sorted(zoo.names())


@pytest.mark.parametrize("name", sorted(EXPECTED_MODELS))
def test_small_preset_trains_one_step(name):
    m = zoo.build(name, preset="small")
    assert m.name == name and m.config["seed"] == 0
    params = [p for p in m.model.parameters() if p.requires_grad]
    assert params
    outputs = m.model(*m.example_inputs)
    loss = m.loss_fn(outputs, *m.targets)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    with_grad = [p for p in params if p.grad is not None]
    assert len(with_grad) == len(params), f"{len(params) - len(with_grad)} parameters got no gradient"
    assert all(torch.isfinite(p.grad).all() for p in with_grad)


@pytest.mark.parametrize("name", ["gnmt", "transformer", "nasnet"])
def test_build_is_deterministic_and_leaves_global_rng_alone(name):
    state = torch.random.get_rng_state()
    a, b = zoo.build(name, preset="small"), zoo.build(name, preset="small")
    assert torch.equal(torch.random.get_rng_state(), state)
    for (ka, pa), (kb, pb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert ka == kb and torch.equal(pa, pb)
    assert all(torch.equal(x, y) for x, y in zip(a.example_inputs + a.targets, b.example_inputs + b.targets))
    c = zoo.build(name, preset="small", seed=1)
    assert not all(torch.equal(x, y) for x, y in zip(a.model.parameters(), c.model.parameters()))


def _names(model) -> set[str]:
    return {name for name, _ in model.named_modules()}


def test_gnmt_layer_names_and_layers_override():
    m = zoo.build("gnmt", preset="small", layers=2)
    names = _names(m.model)
    assert {"encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "decoder.layers.1",
            "attention", "classifier"} <= names
    assert "encoder.layers.2" not in names and "decoder.layers.2" not in names
    assert len(m.model.encoder.layers) == 2 and len(m.model.decoder.layers) == 2
    # every LSTM cell sits under its layer's name, so placing by layer moves the whole cell
    cells = {n for n, mod in m.model.named_modules() if isinstance(mod, torch.nn.LSTMCell)}
    assert cells == {"encoder.layers.0.forward_cell", "encoder.layers.0.backward_cell", "encoder.layers.1.cell",
                     "decoder.layers.0.cell", "decoder.layers.1.cell"}


def test_gnmt_config_reaches_the_model():
    m = zoo.build("gnmt", preset="small", hidden_units=24, seq_len=7, vocab=33, batch=3, bidirectional=False)
    assert m.model.encoder.layers[0].cell.hidden_size == 24
    assert m.model.classifier.out_features == 33
    assert [tuple(x.shape) for x in m.example_inputs] == [(3, 7), (3, 7)]
    assert tuple(m.model(*m.example_inputs).shape) == (3, 7, 33)
    assert m.config["hidden_units"] == 24 and m.config["layers"] == 4  # the preset's, not the default


def test_gnmt_is_unrolled_one_cell_call_per_layer_and_step():
    m = zoo.build("gnmt", preset="small", layers=3, seq_len=5)
    calls: dict[str, int] = {}
    hooks = [mod.register_forward_hook(lambda mod, i, o, n=n: calls.__setitem__(n, calls.get(n, 0) + 1))
             for n, mod in m.model.named_modules() if isinstance(mod, torch.nn.LSTMCell)]
    m.model(*m.example_inputs)
    for h in hooks:
        h.remove()
    assert len(calls) == 2 + 2 + 3  # bidirectional layer 0 has two cells
    assert set(calls.values()) == {5}


def test_paper_defaults():
    assert zoo.resolve_config("gnmt") == dict(layers=4, hidden_units=512, vocab=30000, seq_len=40, batch=128,
                                              bidirectional=True, seed=0)
    assert zoo.resolve_config("rnnlm")["batch"] == 64 and zoo.resolve_config("rnnlm")["layers"] == 2
    assert zoo.resolve_config("inception_v3")["batch"] == 32
    bert = zoo.resolve_config("transformer")
    assert (bert["layers"], bert["hidden"], bert["heads"], bert["seq_len"], bert["vocab"]) == (12, 768, 12, 128, 30522)


def test_cnn_parameter_counts_match_the_published_architectures():
    # ResNet-50: 25,557,032 parameters; Inception-V3 with auxiliary classifier: 27,161,264.
    def count(name):
        return sum(p.numel() for p in zoo.build(name, batch=1).model.parameters())
    assert count("resnet50") == 25_557_032
    assert count("inception_v3") == 27_161_264


def test_rnnlm_and_transformer_layer_names():
    assert {"rnnlm.layers.0", "rnnlm.layers.1", "classifier"} <= _names(zoo.build("rnnlm", preset="small").model)
    t = zoo.build("transformer", preset="small", layers=3)
    assert {"encoder.layers.0", "encoder.layers.2", "mlm_head"} <= _names(t.model)
    assert "encoder.layers.3" not in _names(t.model)
    (labels,) = t.targets
    assert 0 < (labels != -100).sum() < labels.numel()  # only masked positions count


def test_parse_target_types_values():
    assert zoo.parse_target("zoo:gnmt:layers=4,seq_len=50") == ("gnmt", {"layers": 4, "seq_len": 50})
    name, config = zoo.parse_target("zoo:gnmt:bidirectional=false,preset=small,seed=3")
    assert config == {"bidirectional": False, "preset": "small", "seed": 3}
    assert zoo.parse_target("zoo:transformer:dropout=0.1")[1] == {"dropout": 0.1}
    assert zoo.parse_target("zoo:mlp") == ("mlp", {})
    name, config = zoo.parse_target("zoo:gnmt:preset=small,layers=2")
    assert len(zoo.build(name, **config).model.encoder.layers) == 2


@pytest.mark.parametrize("target, fragments", [
    ("zoo:gnmt:lyers=4", ["'lyers'", "layers", "seq_len", "hidden_units"]),
    ("zoo:gnmtt", ["'gnmtt'", "gnmt", "resnet50"]),
    ("zoo:gnmt:layers=four", ["layers", "'four'", "int"]),
    ("zoo:gnmt:layers", ["'layers'", "KEY=VALUE"]),
    ("zoo:gnmt:bidirectional=maybe", ["bidirectional", "bool"]),
])
def test_parse_target_errors_name_the_fault_and_the_valid_choices(target, fragments):
    with pytest.raises(DevplaceError) as err:
        zoo.parse_target(target)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_invalid_layer_counts_are_explained():
    with pytest.raises(DevplaceError, match="layers=1 is too few.*bidirectional"):
        zoo.build("gnmt", preset="small", layers=1)
    m = zoo.build("gnmt", preset="small", layers=1, bidirectional=False)
    assert {"encoder.layers.0", "decoder.layers.0"} <= _names(m.model) and "encoder.layers.1" not in _names(m.model)
    with pytest.raises(DevplaceError, match="rnnlm: layers must be at least 1"):
        zoo.build("rnnlm", preset="small", layers=0)


def test_build_rejects_unknown_keys_and_presets():
    with pytest.raises(DevplaceError, match="'depth'.*valid keys are .*layers"):
        zoo.build("gnmt", depth=3)
    with pytest.raises(DevplaceError, match="no preset 'tiny'.*small"):
        zoo.build("gnmt", preset="tiny")


def test_import_devplace_does_not_import_the_zoo_or_torch():
    code = "import sys, devplace; print('devplace.zoo' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
