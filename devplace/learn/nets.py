"""The learners' networks (torch): the sequence-to-sequence placer with attention, and HP's Grouper.

``Seq2SeqPlacer`` is the policy of ColocRL and the Placer of the Hierarchical Planner: an LSTM
encoder reads the units' feature vectors in step order; an LSTM decoder emits one device per unit,
its input at each step the embedding of the device it chose for the previous unit together with
the encoding of the current unit, and its output reading the whole encoded sequence through
content-based (additive) attention. ``Grouper`` is HP's feed-forward network: each op's features
to a distribution over groups.

Every sample draws from a ``torch.Generator`` the learner owns, so a run is a function of its seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class Sample:
    """K sampled choices, their log-probabilities (with gradient) and mean entropy per decision."""

    actions: torch.Tensor    # (K, N) long
    log_prob: torch.Tensor   # (K,)
    entropy: torch.Tensor    # (K,)


def _draw(logits: torch.Tensor, generator: torch.Generator, noise_std: float, forced: torch.Tensor | None = None):
    """One choice per row: (choice, its log-probability, the row's entropy). Exploration noise is
    Gaussian with ``noise_std`` times the logits' root-mean-square, as HP's public code adds it.
    ``forced`` (one choice per row) is scored instead of drawn: teacher forcing, for behaviour cloning."""
    if noise_std > 0:
        scale = noise_std * logits.detach().norm() / logits.numel() ** 0.5
        logits = logits + scale * torch.randn(logits.shape, generator=generator)
    log_p = F.log_softmax(logits, dim=-1)
    if forced is None:
        choice = torch.multinomial(log_p.exp().detach(), 1, generator=generator).squeeze(-1)
    else:
        choice = forced
    entropy = -(log_p.exp() * log_p).sum(-1)
    return choice, log_p.gather(-1, choice.unsqueeze(-1)).squeeze(-1), entropy


def _deviate(logits: torch.Tensor, center: torch.Tensor, moves: float, generator: torch.Generator,
             preset: torch.Tensor | None = None, uniform_devices: bool = False) -> Sample:
    """devplace's exploration around a centre placement (the greedy decode, or the best placement so far):
    logits (K, N, devices) and centre (K, N). About ``moves`` units per row move to another device drawn from
    the policy without the centre's; which units move is the policy's too, each in proportion to the
    probability it gives a device other than the centre's, so an update teaches it where to move as well as
    where to. ``preset`` (K, N; -1 where none) forces moves chosen elsewhere (boundary shifts). The
    log-probability counts moved units only, so an update credits them and no others. With
    ``uniform_devices`` a moved unit's new device is drawn evenly from the others (the update still credits
    the policy's log-probability of it)."""
    log_p = F.log_softmax(logits, dim=-1)
    p = log_p.detach().exp()
    off = (1.0 - p.gather(-1, center.unsqueeze(-1)).squeeze(-1)).clamp_min(1e-6)
    rate = (moves * off / off.sum(1, keepdim=True)).clamp_max(1.0)
    moved = torch.rand(center.shape, generator=generator) < rate
    others = (torch.ones_like(p) if uniform_devices else p).scatter(-1, center.unsqueeze(-1), 0.0) + 1e-12
    other = torch.multinomial(others.reshape(-1, p.shape[-1]), 1, generator=generator).view(center.shape)
    choice = torch.where(moved, other, center)
    if preset is not None:
        shifted = preset >= 0
        choice, moved = torch.where(shifted, preset, choice), moved | shifted
    entropy = -(log_p.exp() * log_p).sum(-1)
    chosen = log_p.gather(-1, choice.unsqueeze(-1)).squeeze(-1) * moved
    return Sample(choice, chosen.sum(1), entropy.mean(1))


class Seq2SeqPlacer(nn.Module):
    """Encoder LSTM over the units; decoder LSTM (started from the encoder's last state, fed the
    embedding of its previous choice) with additive attention over the encoded units; device logits
    bounded to +-``tanh_constant`` if it is > 0 (HP's public code: 1.0), so no device is ever ruled out,
    then, when sampling, divided by ``temperature``. With ``deviation_rate`` > 0 a sample is the greedy
    decode (or a given centre) with about that share of its units moved to another device (``_deviate``)."""

    def __init__(self, n_features: int, n_devices: int, hidden: int, bidirectional: bool, tanh_constant: float,
                 temperature: float = 1.0, deviation_rate: float = 0.0, uniform_devices: bool = False):
        super().__init__()
        self.n_devices, self.tanh_constant, self.bidirectional = n_devices, tanh_constant, bidirectional
        self.temperature, self.deviation_rate, self.uniform_devices = temperature, deviation_rate, uniform_devices
        hidden = 2 * (hidden // 2) if bidirectional else hidden
        self.embed = nn.Linear(n_features, hidden)
        self.encoder = nn.LSTM(hidden, hidden // 2 if bidirectional else hidden, batch_first=True,
                               bidirectional=bidirectional)
        self.device_embed = nn.Embedding(n_devices + 1, hidden)    # the last row starts the sequence
        self.decoder = nn.LSTMCell(hidden, hidden)
        self.attend_memory = nn.Linear(hidden, hidden, bias=False)
        self.attend_query = nn.Linear(hidden, hidden, bias=False)
        self.attend_score = nn.Linear(hidden, 1, bias=False)
        self.output = nn.Linear(2 * hidden, n_devices)

    def forward(self, features: torch.Tensor, k: int, generator: torch.Generator, noise_std: float = 0.0,
                forced: torch.Tensor | None = None, fed: torch.Tensor | None = None,
                around: torch.Tensor | None = None, preset: torch.Tensor | None = None, deviate: bool = True) -> Sample:
        """K device sequences for the (N, features) units; given ``forced`` (K, N), their log-probabilities,
        and when sampling, its own choices; ``fed`` (K, N), if given, is fed as the previous devices instead.
        Exploring (``deviation_rate`` > 0 or ``around`` given): deviations around ``around`` (K, N), or around
        the greedy decode without it, plus the ``preset`` moves (``_deviate``); ``deviate=False`` samples every
        unit as the papers do even so (option fresh_share)."""
        encoded, (h, c) = self.encoder(torch.tanh(self.embed(features)).unsqueeze(0))
        memory = self.attend_memory(encoded).expand(k, -1, -1)
        h = h.transpose(0, 1).reshape(1, -1).expand(k, -1)       # both directions' last states side by side
        c = c.transpose(0, 1).reshape(1, -1).expand(k, -1)
        previous = torch.full((k,), self.n_devices, dtype=torch.long)
        exploring = forced is None and deviate and (self.deviation_rate > 0 or around is not None)
        actions, log_probs, entropies, all_logits = [], [], [], []
        for i in range(features.shape[0]):
            h, c = self.decoder(self.device_embed(previous), (h, c))
            scores = self.attend_score(torch.tanh(memory + self.attend_query(h).unsqueeze(1))).squeeze(-1)
            context = (F.softmax(scores, -1).unsqueeze(-1) * memory).sum(1)
            logits = self.output(torch.cat([h, context], -1))
            if self.tanh_constant > 0:
                logits = torch.tanh(logits) * self.tanh_constant
            if forced is None:
                logits = logits / self.temperature    # sampling only: a clone fits the untempered policy
            if exploring:     # the decoder never sees a deviation: fed the centre or its own greedy choice
                all_logits.append(logits)
                previous = logits.detach().argmax(-1) if fed is None else fed[:, i]
                continue
            choice, log_p, entropy = _draw(logits, generator, noise_std, None if forced is None else forced[:, i])
            previous = choice if fed is None else fed[:, i]
            actions.append(choice)
            log_probs.append(log_p)
            entropies.append(entropy)
        if exploring:
            logits = torch.stack(all_logits, 1)
            center = logits.detach().argmax(-1) if around is None else around
            return _deviate(logits, center, self.deviation_rate * features.shape[0], generator, preset,
                            self.uniform_devices)
        return Sample(torch.stack(actions, 1), torch.stack(log_probs, 1).sum(1), torch.stack(entropies, 1).mean(1))


class Grouper(nn.Module):
    """Feed-forward: per-op features -> ``hidden`` -> a logit per group (two linear maps, as in HP's public code)."""

    def __init__(self, n_features: int, n_groups: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.Linear(hidden, n_groups))

    def forward(self, features: torch.Tensor, generator: torch.Generator, noise_std: float = 0.0,
                groups: torch.Tensor | None = None, greedy: bool = False) -> Sample:
        """One grouping: a group per op (as a batch of one); given ``groups``, its log-probability; ``greedy``:
        each op's most likely group, credited nothing (devplace's exploration around the greedy decode)."""
        if greedy:
            groups = self.net(features).detach().argmax(-1)
            return Sample(groups.unsqueeze(0), torch.zeros(1), torch.zeros(1))
        groups, log_p, entropy = _draw(self.net(features), generator, noise_std, groups)
        return Sample(groups.unsqueeze(0), log_p.sum().unsqueeze(0), entropy.mean().unsqueeze(0))


def group_features(groups: torch.Tensor, n_groups: int, kind_counts: torch.Tensor, output_bytes: torch.Tensor,
                   edge_src: torch.Tensor, edge_dst: torch.Tensor) -> torch.Tensor:
    """HP's group embedding, from a sampled grouping: per group its rows of the group adjacency matrix
    (edges to each group, edges from each group), the count of each op kind and log(1 + output bytes),
    each row divided by (its largest entry + 1) as the public code does; (n_groups, 2 G + kinds + 1)."""
    counts = torch.zeros(n_groups, kind_counts.shape[1]).index_add_(0, groups, kind_counts)
    output = torch.zeros(n_groups).index_add_(0, groups, output_bytes)
    adjacency = torch.zeros(n_groups * n_groups).index_add_(
        0, groups[edge_src] * n_groups + groups[edge_dst], torch.ones(len(edge_src))).view(n_groups, n_groups)
    rows = torch.cat([adjacency, adjacency.T, counts, torch.log1p(output).unsqueeze(1)], 1)
    return rows / (rows.amax(1, keepdim=True) + 1.0)
