"""Mars's policy (torch): the GCN encoder's unit embeddings, placed segment by segment by an LSTM with attention.

The units, in step order, are cut into segments of ``segment_length``. An LSTM reads the unit
embeddings in order; the decoder, an LSTM whose input at each unit is the embedding of the device
it chose for the previous unit beside the unit's encoding, places one segment at a time, attending
(dot-product, "general" form) only over that segment's encodings, and hands its state on to the
next segment. Attention, the costly part, is thus segment by segment rather than unit by unit, so a
long graph fits in memory. A value head reads the same decoder state as the device head (PPO's
critic: the expected reward from this decision on).

``act`` samples K placements without gradients, one unit at a time; ``evaluate`` recomputes the
log-probabilities, entropies and values of given placements with gradients, one LSTM call per
segment (teacher forcing), for PPO's epochs. Both run the same weights in the same order, so on the
placements ``act`` drew they agree to rounding.

``normalize_units`` (devplace's choice, option ``normalize_units`` of Mars) layer-normalises the
reader's unit encodings: untrained, they have a root mean square of 0.05-0.15 on the zoo models
against about 1 for the previous device's embedding beside them in the decoder's input
(``nn.Embedding`` starts at N(0, 1)), so the decoder hears the device it chose last far more than
the unit it is placing. Normalised, both halves start at the same scale. The layer norm draws no
random numbers, so with one seed the rest of the network starts alike with or without it.

``embedding_logits`` (devplace's choice, option ``embedding_logits`` of Mars) adds to each unit's device
logits a linear term of that unit's own embedding, standardised over the graph's units (as a linear
probe reads them; so the pre-trained and random encoders' different scales do not decide how fast the
term learns). Without it the embeddings reach a decision only through the reader LSTM and the
decoder's state, and a trained placer on GNMT-4 placed by position: permuting the embeddings among the
units changed its decisions by about 2e-4 nats (benchmarks/rounds/mars.md, "Mars, round 7"), while a linear probe on
the same embeddings recovers a unit's device in the best known placement 93-95% of the time. The head
starts at zero (the paper's placer, no random numbers drawn) and learns in cloning and PPO.

``evaluate(..., order=...)`` hands unit i the embedding of unit ``order[i]``, so ``mean_kl`` of the two
distributions says how much the decisions depend on the embeddings (0: the placer places by position).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from devplace.learn.encoder import GCNEncoder, UnitGraph


@dataclass
class Decisions:
    """Per placement and unit (K, U): the chosen device, its log-probability, the entropy and the value;
    (K, U, devices): the log-probability of every device."""

    actions: torch.Tensor
    log_prob: torch.Tensor
    entropy: torch.Tensor
    value: torch.Tensor
    device_log_prob: torch.Tensor


class SegmentPlacer(nn.Module):
    def __init__(self, encoder: GCNEncoder, n_devices: int, hidden: int, segment_length: int,
                 normalize_units: bool = False, embedding_logits: bool = False):
        super().__init__()
        self.encoder, self.n_devices, self.segment_length = encoder, n_devices, segment_length
        self.reader = nn.LSTM(encoder.hidden, hidden, batch_first=True)
        self.unit_norm = nn.LayerNorm(hidden) if normalize_units else nn.Identity()
        self.device_embed = nn.Embedding(n_devices + 1, hidden)    # the last row starts the sequence
        self.decoder = nn.LSTM(2 * hidden, hidden, batch_first=True)
        self.attend = nn.Linear(hidden, hidden, bias=False)
        self.head = nn.Linear(2 * hidden, n_devices)
        self.value_head = nn.Linear(2 * hidden, 1)
        self.embedding_head = None
        if embedding_logits:      # zeros: draws nothing, so with one seed the rest starts as without it
            self.embedding_head = nn.Linear(encoder.hidden, n_devices)
            nn.init.zeros_(self.embedding_head.weight)
            nn.init.zeros_(self.embedding_head.bias)

    def _encode(self, g: UnitGraph, order: torch.Tensor | None = None):
        """(U, hidden) unit encodings, the reader's last state (which starts the decoder) and (U, devices) each
        unit's logit term from its own embedding (zeros without ``embedding_logits``); ``order``: unit i gets
        the embedding of unit ``order[i]``."""
        embedded = self.encoder(g.x, g.edge_index)
        if order is not None:
            embedded = embedded[order]
        encoded, state = self.reader(embedded.unsqueeze(0))
        if self.embedding_head is None:
            unit_logits = embedded.new_zeros(g.n_units, self.n_devices)
        else:
            unit_logits = self.embedding_head((embedded - embedded.mean(0)) / (embedded.std(0, unbiased=False) + 1e-5))
        return self.unit_norm(encoded[0]), state, unit_logits

    def _segments(self, n_units: int):
        return [(s, min(s + self.segment_length, n_units)) for s in range(0, n_units, self.segment_length)]

    def _heads(self, h: torch.Tensor, memory: torch.Tensor):
        """Device logits and value from decoder outputs h (K, T, H) attending over memory (T_seg, H)."""
        weights = F.softmax(h @ self.attend(memory).T, dim=-1)
        features = torch.cat([h, weights @ memory], -1)
        return self.head(features), self.value_head(features).squeeze(-1)

    @torch.no_grad()
    def act(self, g: UnitGraph, k: int, generator: torch.Generator) -> Decisions:
        """K placements sampled unit by unit (no gradients)."""
        encoded, (h0, c0), unit_logits = self._encode(g)
        state = (h0.expand(1, k, -1).contiguous(), c0.expand(1, k, -1).contiguous())
        previous = torch.full((k,), self.n_devices, dtype=torch.long)
        out = {name: [] for name in ("actions", "log_prob", "entropy", "value", "device_log_prob")}
        for first, end in self._segments(g.n_units):
            memory = encoded[first:end]
            for t in range(first, end):
                step_in = torch.cat([self.device_embed(previous), encoded[t].expand(k, -1)], -1).unsqueeze(1)
                h, state = self.decoder(step_in, state)
                logits, value = self._heads(h, memory)
                log_p = F.log_softmax(logits[:, 0] + unit_logits[t], -1)
                previous = torch.multinomial(log_p.exp(), 1, generator=generator).squeeze(-1)
                out["actions"].append(previous)
                out["log_prob"].append(log_p.gather(-1, previous.unsqueeze(-1)).squeeze(-1))
                out["entropy"].append(-(log_p.exp() * log_p).sum(-1))
                out["value"].append(value[:, 0])
                out["device_log_prob"].append(log_p)
        return Decisions(**{name: torch.stack(v, 1) for name, v in out.items()})

    def evaluate(self, g: UnitGraph, actions: torch.Tensor, order: torch.Tensor | None = None) -> Decisions:
        """Log-probabilities, entropies and values of the (K, U) ``actions`` (with gradients); ``order``: each
        unit i reads the embedding of unit ``order[i]`` (a measurement: how much decisions depend on the embeddings)."""
        k = actions.shape[0]
        encoded, (h0, c0), unit_logits = self._encode(g, order)
        state = (h0.expand(1, k, -1).contiguous(), c0.expand(1, k, -1).contiguous())
        previous = torch.cat([torch.full((k, 1), self.n_devices, dtype=torch.long), actions[:, :-1]], 1)
        log_probs, entropies, values, device_log_probs = [], [], [], []
        for first, end in self._segments(g.n_units):
            memory = encoded[first:end]
            steps_in = torch.cat([self.device_embed(previous[:, first:end]), memory.expand(k, -1, -1)], -1)
            h, state = self.decoder(steps_in, state)
            logits, value = self._heads(h, memory)
            log_p = F.log_softmax(logits + unit_logits[first:end], -1)
            device_log_probs.append(log_p)
            log_probs.append(log_p.gather(-1, actions[:, first:end].unsqueeze(-1)).squeeze(-1))
            entropies.append(-(log_p.exp() * log_p).sum(-1))
            values.append(value)
        return Decisions(actions, torch.cat(log_probs, 1), torch.cat(entropies, 1), torch.cat(values, 1),
                         torch.cat(device_log_probs, 1))


def mean_kl(own: torch.Tensor, other: torch.Tensor) -> float:
    """Mean over decisions of KL(own || other), both (..., devices) log-probabilities, in nats."""
    return float((own.exp() * (own - other)).sum(-1).mean())

