"""RNNLM: the 2-layer LSTM language model of ColocRL and the Hierarchical Planner (batch 64).

ColocRL's step-time table (Mirhoseini et al., ICML 2017) gives "RNNLM batch 64" and two LSTM
layers; the papers cite the LSTM language models of Zaremba et al. (2014) and Jozefowicz et al.
(2016). Unstated sizes are our choices: 2048 LSTM units (the Jozefowicz baseline LSTM-2048),
512-unit embeddings, a 10,000-word vocabulary and 20 unrolled steps (Zaremba et al.'s Penn
Treebank set-up). All are configuration keys.

Structure and op names: ``embedding`` -> ``rnnlm.layers.{i}`` (LSTM unrolled over time, one
``nn.LSTMCell`` call per layer per step, see :mod:`devplace.zoo.recurrent`) -> ``classifier``
(projection to the vocabulary). Inputs: tokens ``[batch, seq_len]``; target: the next tokens.
Loss: mean token cross-entropy.
"""

from __future__ import annotations

import torch
from torch import nn

from devplace.errors import DevplaceError
from devplace.zoo import ModelSpec
from devplace.zoo.losses import token_cross_entropy
from devplace.zoo.recurrent import UnrolledLSTMLayer


class LSTMStack(nn.Module):
    """``layers`` unrolled LSTM layers (``layers.{i}``)."""

    def __init__(self, input_units: int, hidden_units: int, layers: int):
        super().__init__()
        widths = [input_units] + [hidden_units] * layers
        self.layers = nn.ModuleList(UnrolledLSTMLayer(a, b) for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, steps: list[torch.Tensor]) -> list[torch.Tensor]:
        for layer in self.layers:
            steps = layer(steps)
        return steps


class RNNLM(nn.Module):
    """Word-level LSTM language model: logits ``[batch, seq_len, vocab]`` for the next tokens."""

    def __init__(self, vocab: int, embedding_units: int, hidden_units: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, embedding_units)
        self.rnnlm = LSTMStack(embedding_units, hidden_units, layers)
        self.classifier = nn.Linear(hidden_units, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        steps = list(self.embedding(tokens).unbind(1))
        return self.classifier(torch.stack(self.rnnlm(steps), dim=1))


def _make(c: dict):
    if c["layers"] < 1:
        raise DevplaceError(f"rnnlm: layers must be at least 1, got {c['layers']}")
    model = RNNLM(c["vocab"], c["embedding_units"], c["hidden_units"], c["layers"])
    text = torch.randint(0, c["vocab"], (c["batch"], c["seq_len"] + 1))
    return model, (text[:, :-1],), (text[:, 1:],), token_cross_entropy


SPECS = [
    ModelSpec(
        name="rnnlm",
        summary="2-layer LSTM language model, unrolled (ColocRL, Hierarchical Planner; batch 64)",
        defaults=dict(layers=2, hidden_units=2048, embedding_units=512, vocab=10000, seq_len=20, batch=64),
        presets=dict(small=dict(layers=2, hidden_units=16, embedding_units=8, vocab=50, seq_len=4, batch=3),
                     medium=dict(hidden_units=256, embedding_units=128, vocab=2000, seq_len=10, batch=16)),
        make=_make,
    ),
]
