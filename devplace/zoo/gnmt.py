"""GNMT: the LSTM sequence-to-sequence translation model with attention of Baechi, ColocRL, the
Hierarchical Planner, Placeto and Mars, unrolled over time steps.

Paper configurations (the step-time tables of Baechi, Jeon et al., SoCC 2020, and of the
Hierarchical Planner, Mirhoseini et al., ICLR 2018): Baechi's code uses 4 layers, 512 LSTM units,
a 30,000-word vocabulary, batch 128 and maximum length 40 (the defaults here); Baechi also reports
length 50 and batch 256; the Hierarchical Planner uses 2, 4 and 8 layers. Set them with ``layers``,
``hidden_units``, ``seq_len``, ``batch``.

Architecture (GNMT, Wu et al. 2016, as in TensorFlow's nmt "gnmt_v2" model the papers ran):

- Encoder: embedding; layer 0 bidirectional (a forward and a backward LSTM, outputs concatenated);
  layers 1.. unidirectional; the top ``layers - 2`` layers residual.
- Decoder: embedding; ``layers`` LSTM layers. Bahdanau (additive) attention over the encoder outputs
  is queried with the bottom decoder layer's output; layer 0 reads [embedding, previous context],
  every higher layer reads [layer below, current context]; the top ``layers - 2`` layers residual.
- ``classifier``: projection of the top decoder output onto the vocabulary; token cross-entropy.

Every LSTM is unrolled: one ``nn.LSTMCell`` call per layer per time step, as in the papers'
TensorFlow graphs, so layers and steps can overlap across devices.

Simplifications (documented, not hidden): all sentences are full length (no padding masks); the
decoder starts from a zero state rather than the encoder's final states; the attention is plain
Bahdanau, not GNMT's normalised variant; no dropout. Source and target have ``seq_len`` tokens.

Op naming convention (the expert placer puts each LSTM layer on its own device by these names):

==========================  ======================================================================
``encoder.embedding``       source embedding
``encoder.layers.{i}``      encoder layer i (``.cell``; layer 0: ``.forward_cell``, ``.backward_cell``)
``decoder.embedding``       target embedding
``decoder.layers.{i}``      decoder layer i (``.cell``), including its input concat and residual add
``attention``               attention (``.memory_layer``, ``.query_layer``, scores, softmax, context)
``classifier``              vocabulary projection
==========================  ======================================================================
"""

from __future__ import annotations

import torch
from torch import nn

from devplace.errors import DevplaceError
from devplace.zoo import ModelSpec
from devplace.zoo.losses import token_cross_entropy
from devplace.zoo.recurrent import BidirectionalLSTMLayer, UnrolledLSTMLayer


def _is_residual(layer: int, layers: int) -> bool:
    """GNMT makes the top ``layers - 2`` layers residual (so layer 2 upward)."""
    return layer >= 2 and layers > 2


class GNMTEncoder(nn.Module):
    """Source embedding and ``layers`` unrolled LSTM layers; returns ``[batch, seq, hidden]``."""

    def __init__(self, vocab: int, hidden_units: int, layers: int, bidirectional: bool):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden_units)
        stack: list[nn.Module] = []
        for i in range(layers):
            if i == 0 and bidirectional:
                stack.append(BidirectionalLSTMLayer(hidden_units, hidden_units))
            else:
                input_units = 2 * hidden_units if (i == 1 and bidirectional) else hidden_units
                stack.append(UnrolledLSTMLayer(input_units, hidden_units, residual=_is_residual(i, layers)))
        self.layers = nn.ModuleList(stack)

    def forward(self, source: torch.Tensor) -> torch.Tensor:
        steps = list(self.embedding(source).unbind(1))
        for layer in self.layers:
            steps = layer(steps)
        return torch.stack(steps, dim=1)


class BahdanauAttention(nn.Module):
    """Additive attention: ``score(q, k_s) = v . tanh(W_k k_s + W_q q)``; returns the context."""

    def __init__(self, hidden_units: int):
        super().__init__()
        self.memory_layer = nn.Linear(hidden_units, hidden_units, bias=False)
        self.query_layer = nn.Linear(hidden_units, hidden_units)
        self.v = nn.Parameter(torch.empty(hidden_units).uniform_(-hidden_units**-0.5, hidden_units**-0.5))

    def forward(self, query: torch.Tensor, keys: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """``query [B, H]``, ``keys = memory_layer(memory) [B, S, H]``, ``memory [B, S, H]`` -> ``[B, H]``."""
        scores = torch.tanh(keys + self.query_layer(query).unsqueeze(1)) @ self.v  # [B, S]
        weights = torch.softmax(scores, dim=1)
        return torch.bmm(weights.unsqueeze(1), memory).squeeze(1)


class GNMTDecoderLayer(nn.Module):
    """One decoder step of one layer: ``cell([x, context])``, plus ``x`` when residual."""

    def __init__(self, input_units: int, hidden_units: int, residual: bool):
        super().__init__()
        self.cell = nn.LSTMCell(input_units + hidden_units, hidden_units)
        self.residual = residual

    def forward(self, x: torch.Tensor, context: torch.Tensor, state):
        h, c = self.cell(torch.cat([x, context], dim=1), state)
        return (h + x if self.residual else h), (h, c)


class GNMTDecoder(nn.Module):
    """Target embedding and ``layers`` decoder layers (the step loop lives in :class:`GNMT`)."""

    def __init__(self, vocab: int, hidden_units: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden_units)
        self.layers = nn.ModuleList(
            GNMTDecoderLayer(hidden_units, hidden_units, residual=_is_residual(i, layers)) for i in range(layers)
        )


class GNMT(nn.Module):
    """``forward(source [B, S], target_in [B, T]) -> logits [B, T, vocab]`` (teacher forcing)."""

    def __init__(self, vocab: int, hidden_units: int, layers: int, bidirectional: bool = True):
        super().__init__()
        self.encoder = GNMTEncoder(vocab, hidden_units, layers, bidirectional)
        self.decoder = GNMTDecoder(vocab, hidden_units, layers)
        self.attention = BahdanauAttention(hidden_units)
        self.classifier = nn.Linear(hidden_units, vocab)

    def forward(self, source: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(source)
        keys = self.attention.memory_layer(memory)
        context = memory.new_zeros(memory.shape[0], memory.shape[2])
        states = [None] * len(self.decoder.layers)
        outputs = []
        for x in self.decoder.embedding(target_in).unbind(1):
            for i, layer in enumerate(self.decoder.layers):
                x, states[i] = layer(x, context, states[i])
                if i == 0:
                    context = self.attention(x, keys, memory)
            outputs.append(x)
        return self.classifier(torch.stack(outputs, dim=1))


def _make(c: dict):
    if c["layers"] < (2 if c["bidirectional"] else 1):
        raise DevplaceError(
            f"gnmt: layers={c['layers']} is too few: the encoder needs at least 2 layers with "
            f"bidirectional=true (the bidirectional layer feeds a unidirectional one), 1 without"
        )
    model = GNMT(c["vocab"], c["hidden_units"], c["layers"], c["bidirectional"])
    source = torch.randint(0, c["vocab"], (c["batch"], c["seq_len"]))
    target = torch.randint(0, c["vocab"], (c["batch"], c["seq_len"] + 1))
    return model, (source, target[:, :-1]), (target[:, 1:],), token_cross_entropy


SPECS = [
    ModelSpec(
        name="gnmt",
        summary="GNMT seq2seq LSTM with attention, unrolled (Baechi: 4 layers, 512 units, len 40, batch 128)",
        defaults=dict(layers=4, hidden_units=512, vocab=30000, seq_len=40, batch=128, bidirectional=True),
        presets=dict(
            small=dict(layers=4, hidden_units=16, vocab=50, seq_len=4, batch=2),
            medium=dict(hidden_units=128, vocab=2000, seq_len=10, batch=16),
            baechi_len50=dict(seq_len=50),
            hp_nmt2=dict(layers=2, hidden_units=1024, batch=256),
        ),
        make=_make,
    ),
]
