"""Transformer: a BERT-base-like encoder trained with a masked-LM loss (the BERT of Mars and of the
dnn-partitioning graphs).

Paper configuration (BERT-base, Devlin et al. 2019): 12 layers (24 for the deeper variant, preset
``layers24``, still at hidden 768), hidden 768, 12 heads, feed-forward 3072, GELU, post-LayerNorm,
vocabulary 30,522, sequence 128. The step-time table of Mars (Lan, Chen, Li, ICPP 2021) does
not state the batch; 32 is our choice.

Choices: attention is written out (matmul, scale, softmax, matmul) rather than calling
``scaled_dot_product_attention``, so the captured graph shows BERT's attention ops and not a
CPU-specific fused kernel; the masked-LM decoder is not tied to the word embedding (a shared
parameter would tie two distant ops to one device); no next-sentence head; no dropout by default.
The example batch masks a fixed 15% of positions (chosen from ``seed``); the loss is the token
cross-entropy over the masked positions only.

Op names: ``embeddings`` (word, position, token type, LayerNorm), ``encoder.layers.{i}``
(``.attention``, ``.feed_forward``), ``mlm_head``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from devplace.errors import DevplaceError
from devplace.zoo import ModelSpec
from devplace.zoo.losses import IGNORE_INDEX, token_cross_entropy

MASK_FRACTION = 0.15


class Embeddings(nn.Module):
    """Sum of word, position and token-type embeddings, then LayerNorm."""

    def __init__(self, vocab: int, hidden: int, max_positions: int, dropout: float):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_positions, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor, token_types: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.word(tokens) + self.position(positions).unsqueeze(0) + self.token_type(token_types)
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with output projection, residual and LayerNorm (post-norm)."""

    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        if hidden % heads:
            raise DevplaceError(f"transformer: hidden={hidden} is not divisible by heads={heads}")
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        return x.view(batch, seq, self.heads, hidden // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        context = self.dropout(torch.softmax(scores, dim=-1)) @ v
        context = context.transpose(1, 2).reshape(x.shape)
        return self.norm(x + self.dropout(self.output(context)))


class FeedForward(nn.Module):
    """Linear -> GELU -> Linear, residual and LayerNorm."""

    def __init__(self, hidden: int, ffn_units: int, dropout: float):
        super().__init__()
        self.intermediate = nn.Linear(hidden, ffn_units)
        self.output = nn.Linear(ffn_units, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.output(nn.functional.gelu(self.intermediate(x)))
        return self.norm(x + self.dropout(y))


class EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn_units: int, dropout: float):
        super().__init__()
        self.attention = SelfAttention(hidden, heads, dropout)
        self.feed_forward = FeedForward(hidden, ffn_units, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.feed_forward(self.attention(x))


class Encoder(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, ffn_units: int, dropout: float):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, ffn_units, dropout) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class MaskedLMHead(nn.Module):
    """Dense -> GELU -> LayerNorm -> projection onto the vocabulary."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(nn.functional.gelu(self.dense(x))))


class BertMLM(nn.Module):
    """``forward(tokens [B, S], token_types [B, S]) -> logits [B, S, vocab]``."""

    def __init__(self, vocab: int, layers: int, hidden: int, heads: int, ffn_units: int, max_positions: int,
                 dropout: float = 0.0):
        super().__init__()
        self.embeddings = Embeddings(vocab, hidden, max_positions, dropout)
        self.encoder = Encoder(layers, hidden, heads, ffn_units, dropout)
        self.mlm_head = MaskedLMHead(hidden, vocab)

    def forward(self, tokens: torch.Tensor, token_types: torch.Tensor) -> torch.Tensor:
        return self.mlm_head(self.encoder(self.embeddings(tokens, token_types)))


def _make(c: dict):
    model = BertMLM(c["vocab"], c["layers"], c["hidden"], c["heads"], c["ffn_units"], c["seq_len"], c["dropout"])
    batch, seq = c["batch"], c["seq_len"]
    original = torch.randint(0, c["vocab"], (batch, seq))
    masked = torch.rand(batch, seq).argsort(dim=1)[:, : max(1, round(MASK_FRACTION * seq))]
    is_masked = torch.zeros(batch, seq, dtype=torch.bool).scatter_(1, masked, True)
    tokens = original.masked_fill(is_masked, c["mask_token"] % c["vocab"])
    labels = original.masked_fill(~is_masked, IGNORE_INDEX)
    token_types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    return model, (tokens, token_types), (labels,), token_cross_entropy


SPECS = [
    ModelSpec(
        name="transformer",
        summary="BERT-base-like encoder (12 layers, hidden 768, 12 heads, seq 128), masked-LM loss (Mars)",
        defaults=dict(layers=12, hidden=768, heads=12, ffn_units=3072, vocab=30522, seq_len=128, batch=32,
                      dropout=0.0, mask_token=103),
        presets=dict(
            small=dict(layers=2, hidden=32, heads=4, ffn_units=64, vocab=100, seq_len=16, batch=2),
            medium=dict(layers=2, hidden=128, heads=4, ffn_units=512, vocab=2000, seq_len=64, batch=8),
            layers24=dict(layers=24),
        ),
        make=_make,
    ),
]
