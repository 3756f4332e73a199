"""The test tier with library models: Hugging Face transformers and timm models built from small
configs with random weights (nothing downloaded), captured whole.

Needs the test-only extra ``models`` (pyproject.toml); skipped without it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
os.environ["HF_HUB_OFFLINE"] = "1"  # build from configs only: never reach for the Hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _declare_torchvision_ops() -> None:
    """torchvision's PyPI wheel links CUDA and fails at import beside the CPU torch ("operator
    torchvision::nms does not exist"); timm imports it, and transformers does when it is installed.
    Declaring the two operator schemas its import registers fake kernels for lets it import (the ops
    themselves are never called by these models). The one torchvision workaround in devplace."""
    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # declared already: a working torchvision, or an earlier call
        return
    _declare_torchvision_ops.lib = lib  # keep the library (and its definitions) alive


_declare_torchvision_ops()
transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

import devplace as dp  # noqa: E402
from torch import nn  # noqa: E402

pytestmark = pytest.mark.torch
VOCAB, SEQ, BATCH = 256, 32, 2


def _ids(seed=0, batch=BATCH, seq=SEQ):
    return torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _lm_loss(out):
    return out.loss.float()


def gpt2(layers=2, width=64, batch=BATCH, seq=SEQ):
    """Decoder-only language model."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=VOCAB, n_positions=seq,
                                     bos_token_id=0, eos_token_id=0)
    ids = _ids(0, batch, seq)
    return transformers.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}, _lm_loss


def bert(layers=2, width=64, batch=BATCH, seq=SEQ):
    """Encoder-only language model (masked LM) with an attention mask."""
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=4,
                                     intermediate_size=2 * width, vocab_size=VOCAB, max_position_embeddings=seq)
    ids = _ids(0, batch, seq)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    return transformers.BertForMaskedLM(config), inputs, _lm_loss


def t5(layers=2, width=64, batch=BATCH, seq=SEQ):
    """Encoder-decoder, called with ``attention_mask=None`` as users do."""
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=width, d_ff=2 * width, num_layers=layers, num_decoder_layers=layers,
                                   num_heads=4, d_kv=width // 4, vocab_size=VOCAB, decoder_start_token_id=0,
                                   pad_token_id=0, eos_token_id=1)
    inputs = {"input_ids": _ids(0, batch, seq), "attention_mask": None, "labels": _ids(1, batch, seq)}
    return transformers.T5ForConditionalGeneration(config), inputs, _lm_loss


def mixtral():
    """Mixture of experts (grouped matmuls); torch's fake grouped-mm kernel takes bf16 only."""
    torch.manual_seed(0)
    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=SEQ)
    ids = _ids()
    return transformers.MixtralForCausalLM(config).to(torch.bfloat16), {"input_ids": ids, "labels": ids}, _lm_loss


def _classifier(model, image_size=32, classes=10, batch=BATCH):
    x = torch.randn(batch, 3, image_size, image_size, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(batch) % classes
    return model, x, lambda out: nn.functional.cross_entropy(out, labels)


def vit(depth=2, width=64, image_size=32, batch=BATCH):
    """Vision transformer (timm)."""
    torch.manual_seed(0)
    return _classifier(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=image_size, patch_size=8,
                                         embed_dim=width, depth=depth, num_heads=4, num_classes=10),
                       image_size, batch=batch)


def resnet(image_size=32, batch=BATCH):
    """Convolutional network with batch norm (timm)."""
    torch.manual_seed(0)
    return _classifier(timm.create_model("resnet18", pretrained=False, num_classes=10), image_size, batch=batch)


def mobilenet():
    """Depthwise and pointwise convolutions, squeeze-excitation (timm)."""
    torch.manual_seed(0)
    return _classifier(timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=10))


class LSTMTagger(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.lstm = nn.LSTM(32, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, ids):
        return self.head(self.lstm(self.embed(ids))[0])


def lstm(hidden=64, batch=BATCH, seq=SEQ):
    """A plain nn.LSTM (one ATen op per layer on CPU)."""
    torch.manual_seed(0)
    ids = _ids(0, batch, seq)
    return LSTMTagger(hidden), ids, lambda out: nn.functional.cross_entropy(out.reshape(-1, VOCAB), ids.reshape(-1))


MODELS = {f.__name__: f for f in (gpt2, bert, t5, mixtral, vit, resnet, mobilenet, lstm)}


# Medium sizes (a one-thread CPU step of tens to hundreds of ms), for benchmarks/capture_fidelity.py:
# targets tests/test_capture_models.py:medium_gpt2 etc.
def medium_gpt2():
    return gpt2(layers=4, width=256, batch=4, seq=128)


def medium_bert():
    return bert(layers=4, width=256, batch=4, seq=128)


def medium_t5():
    return t5(layers=2, width=256, batch=4, seq=64)


def medium_vit():
    return vit(depth=4, width=192, image_size=64, batch=8)


def medium_resnet():
    return resnet(image_size=64, batch=8)


def medium_lstm():
    return lstm(hidden=256, batch=8, seq=64)


_graphs: dict = {}


def captured(name):
    """(model, graph) of a library model, captured once per test session (roofline on 8 x H100)."""
    if name not in _graphs:
        model, inputs, loss = MODELS[name]()
        _graphs[name] = model, dp.capture(model, inputs, loss, cluster="8xh100-nvlink")
    return _graphs[name]


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("name", list(MODELS))
def test_library_model_step_is_captured_whole(name):
    model, g = captured(name)
    roles = g.role_counts()
    assert roles["forward"] > 0 and roles["backward"] > 0 and roles["update"] > 0
    # persistent memory: weights and buffers, Adam's two moments per weight and a float32 step count
    params = list(model.parameters())
    expected = 3 * _bytes(params) + _bytes(model.buffers()) + 4 * len(params)
    assert g.persistent_bytes.sum() == expected
    # the floor of issue 11: FLOPs estimated from shapes alone are under 1% of the step's
    flops = np.asarray(g.meta["op_flops"])
    guessed = np.isin(np.asarray(g.kinds, dtype=object), g.meta["flop_fallback_ops"])
    assert flops[guessed].sum() < 0.01 * flops.sum()
    one = dp.simulate(g, dp.load_cluster("8xh100-nvlink"), [0] * g.n_ops)
    assert one.step_time_us == pytest.approx(g.compute_us[:, 0].sum())
    assert one.peak_memory_bytes[0] >= expected


def test_expert_matmuls_count_their_analytic_flops():
    """Mixtral's experts run as grouped matmuls: per token and chosen expert, a fused gate/up
    projection (hidden -> 2 x intermediate) and a down projection, 2 FLOPs per multiply-add;
    backward twice the forward (gradients of inputs and of weights)."""
    model, g = captured("mixtral")
    config = model.config
    tokens = BATCH * SEQ
    per_layer = 2 * tokens * config.num_experts_per_tok * 3 * config.hidden_size * config.intermediate_size
    flops = np.asarray(g.meta["op_flops"])
    grouped = [i for i, k in enumerate(g.kinds) if k == "_grouped_mm"]
    assert grouped
    assert flops[grouped].sum() == pytest.approx(3 * config.num_hidden_layers * per_layer, rel=1e-9)
    assert {g.meta["op_dtype"][i] for i in grouped} == {"bfloat16"}
