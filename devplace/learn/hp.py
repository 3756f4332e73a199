"""The Hierarchical Planner: a Grouper puts ops into groups, a Placer puts groups on devices, one reward.

"A Hierarchical Model for Device Placement" (Mirhoseini et al., ICLR 2018):

1. the Grouper, a feed-forward network, reads each op's features (type, output size, adjacency)
   and samples a group for it (ops of a colocation group are one input, so they stay together);
2. each group is embedded from its members (op-type counts, total output size, its row of the
   group adjacency matrix, ``nets.group_features``);
3. the Placer, a sequence-to-sequence LSTM (bidirectional encoder) with attention, samples a device
   per group;
4. both are trained jointly by REINFORCE: one grouping per update (``groupings_per_update``) and K
   placements of it, the log probability of each placement being the Grouper's plus the Placer's.

>>> HPOptions().hidden_size, HPOptions().lr_decay_start, HPOptions().noise_updates
(512, 400, 750)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.learn.features import MAX_KINDS, cross_unit_edges, unit_features, unit_kind_counts
from devplace.learn.options import ReinforceOptions
from devplace.placers import register
from devplace.placers._memory import check_can_fit
from devplace.placers._moves import Units
from devplace.placers.options import option
from devplace.transforms.coplacement import colocation_units

NAME = "hp"


@dataclass(frozen=True)
class HPOptions(ReinforceOptions):
    """The Hierarchical Planner's hyper-parameters, from the authors' public implementation (TensorFlow
    grappler's hierarchical controller): hidden size 512 (Grouper 64), min(256, 20 x devices) groups, device
    logits bounded by tanh to +-1, Adam at 0.1
    decayed x0.95 every 50 updates from update 400, gradient norm clipped to 1.0, exponential
    moving-average baseline with decay 0.9, no entropy bonus but Gaussian noise (std 0.5) on the logits
    (relative to their root-mean-square) for the first 750 updates, 100 s for a failing placement; from the paper: one grouping and K = 4
    placements per update."""

    max_groups: int = option(256, "groups: min(this, 20 x devices)")
    hidden_size: int = option(512, "Placer LSTM and embedding width")
    grouper_hidden_size: int = option(64, "Grouper's hidden width")
    lr_decay: float = option(0.95, "multiply the learning rate by this every `lr_decay_every` updates")
    lr_decay_start: int = option(400, "update at which the decay begins")
    logit_noise_std: float = option(0.5, "Gaussian noise added to the Grouper's and Placer's logits while exploring")
    noise_updates: int = option(750, "updates during which the logit noise is added")
    position_features: int = option(0, "if > 0: the Grouper also reads the op's position in the step as this many "
                                       "bumps, so a warm start's slices of the step are learnable (devplace's "
                                       "variant; the paper's Grouper reads type, size and adjacency only)")
    groupings_per_update: int = option(1, "groupings sampled per update, the K placements shared among them "
                                          "(the paper: one grouping, four placements)")


@register(NAME, "Hierarchical Planner (ICLR 2018): Grouper + seq2seq Placer trained jointly, REINFORCE on "
          "the simulator", HPOptions, by_default=False)
def place(graph, cluster, *, seed: int = 0, options: HPOptions = HPOptions()):
    import torch

    from devplace.learn.nets import Grouper, Sample, Seq2SeqPlacer, group_features
    from devplace.learn.train import explore_around, layer_labels, reinforce, seeded

    check_can_fit(graph, cluster, NAME)
    ops = Units.from_labels(graph, colocation_units(graph))    # what the Grouper assigns: ops, colocation whole
    layers = layer_labels(graph, ops.unit_of) if options.layer_moves else None
    op_features = torch.from_numpy(unit_features(graph, ops.unit_of))
    op_features = torch.cat([op_features, position_bumps(ops.n_units, options.position_features).to(op_features.dtype)], 1)
    kind_counts = torch.from_numpy(unit_kind_counts(graph, ops.unit_of, ops.n_units)).float()
    output_bytes = torch.from_numpy(graph.output_bytes.copy()).float()
    output_bytes = torch.zeros(ops.n_units).index_add_(0, torch.from_numpy(ops.unit_of), output_bytes)
    edge_src, edge_dst = (torch.from_numpy(e) for e in cross_unit_edges(graph, ops.unit_of))
    n_groups = max(1, min(options.max_groups, 20 * cluster.n_devices))
    with seeded(seed):
        grouper = Grouper(op_features.shape[1], n_groups, options.grouper_hidden_size)
        placer = Seq2SeqPlacer(2 * n_groups + MAX_KINDS + 1, cluster.n_devices, options.hidden_size,
                               bidirectional=True, tanh_constant=options.tanh_constant,
                               temperature=options.temperature,
                               deviation_rate=min(1.0, options.deviations / n_groups),
                               uniform_devices=options.uniform_devices)
    policy = torch.nn.ModuleDict({"grouper": grouper, "placer": placer})

    anchor = []    # the cloned warm start's device per group: with option deviations, fed to the Placer's decoder

    def sample(k, generator, noise_std, around, fresh=False):
        if around is not None and not fresh:     # deviate_from=best: around the best placement so far, the greedy grouping's groups
            groups = grouper(op_features, generator, greedy=True).actions[0]
            embedded = group_features(groups, n_groups, kind_counts, output_bytes, edge_src, edge_dst)
            return explore_around(around, groups.numpy(), cluster.n_devices, n_groups, k, generator,
                                  options.boundary_moves,
                                  lambda fed, preset: placer(embedded, k, generator, fed=fed, around=fed, preset=preset),
                                  layers)
        parts = []
        for share in np.array_split(np.arange(k), min(options.groupings_per_update, k)):
            around_greedy = options.deviations > 0 and not fresh    # fresh (option fresh_share): as the paper samples
            grouping = grouper(op_features, generator, noise_std, greedy=around_greedy)
            groups = grouping.actions[0]
            embedded = group_features(groups, n_groups, kind_counts, output_bytes, edge_src, edge_dst)
            fed = anchor[0].expand(len(share), -1) if anchor and around_greedy else None
            placed = placer(embedded, len(share), generator, noise_std, fed=fed, deviate=not fresh)
            parts.append(Sample(actions=placed.actions[:, groups], log_prob=placed.log_prob + grouping.log_prob,
                                entropy=(placed.entropy + grouping.entropy) / 2))
        return Sample(*(torch.cat([getattr(p, name) for p in parts]) for name in ("actions", "log_prob", "entropy")))

    def clone(targets):
        """Log-probability of the warm start as a grouping and a placement: each device's units, in step
        order, cut into equal runs of its share of the groups, and each group on its device."""
        groups, group_device = grouping_of(targets.numpy(), n_groups, cluster.n_devices)
        groups = torch.from_numpy(groups)
        anchor[:] = [torch.from_numpy(group_device)]
        grouping = grouper(op_features, None, 0.0, groups=groups)
        embedded = group_features(groups, n_groups, kind_counts, output_bytes, edge_src, edge_dst)
        placed = placer(embedded, 1, None, 0.0, forced=torch.from_numpy(group_device).unsqueeze(0))
        return placed.log_prob[0] + grouping.log_prob[0]

    return reinforce(NAME, graph, cluster, ops.unit_of, policy, sample, options, seed, clone)


def grouping_of(unit_devices: np.ndarray, n_groups: int, n_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """A grouping that reproduces a placement of units (in step order), as (group per unit, device per group).

    The placement's runs of consecutive units on one device each take a share of the groups proportional
    to their length (at least one) and are cut into that many equal pieces, so each group is a slice of
    the step the Grouper can learn from the units' positions; with more runs than groups, each device's
    units are cut into equal runs of its share of the groups instead.

    >>> grouping_of(np.array([0, 0, 0, 0, 1, 1]), 3, 2)
    (array([0, 0, 1, 1, 2, 2]), array([0, 0, 1]))
    >>> grouping_of(np.array([0, 1, 0, 1, 0]), 4, 2)
    (array([0, 2, 0, 3, 1]), array([0, 0, 1, 1]))
    """
    unit_devices = np.asarray(unit_devices, dtype=np.int64)
    starts = np.r_[0, np.flatnonzero(np.diff(unit_devices)) + 1]
    lengths = np.diff(np.r_[starts, len(unit_devices)])
    groups = np.empty(len(unit_devices), dtype=np.int64)
    if len(starts) <= n_groups:
        pieces = 1 + (n_groups - len(starts)) * lengths // lengths.sum()
        pieces[np.argmax(lengths)] += n_groups - pieces.sum()
        first = np.cumsum(pieces) - pieces
        group_device = np.empty(n_groups, dtype=np.int64)
        for start, length, piece, base in zip(starts, lengths, pieces, first):
            groups[start:start + length] = base + np.arange(length) * piece // length
            group_device[base:base + piece] = unit_devices[start]
        return groups, group_device
    share = max(1, n_groups // n_devices)
    group_device = np.minimum(np.arange(n_groups) // share, n_devices - 1)
    for d in range(n_devices):
        mine = np.flatnonzero(unit_devices == d)
        groups[mine] = min(d * share, n_groups - 1) + np.arange(len(mine)) * share // max(len(mine), 1)
    return groups, group_device


def position_bumps(n_units: int, n_bumps: int):
    """Each unit's position in the step (0 to 1) as ``n_bumps`` Gaussian bumps of width 1 / ``n_bumps``:
    the Grouper is linear, and a linear map of these picks out any contiguous slice of the step.

    >>> position_bumps(3, 2).argmax(1).tolist()
    [0, 0, 1]
    """
    import torch

    if n_bumps < 1:
        return torch.zeros(n_units, 0, dtype=torch.float32)
    position = torch.linspace(0.0, 1.0, n_units).unsqueeze(1)
    centres = torch.linspace(0.0, 1.0, n_bumps).unsqueeze(0)
    return torch.exp(-(((position - centres) * n_bumps) ** 2)).float()
