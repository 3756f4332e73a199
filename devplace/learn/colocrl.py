"""ColocRL: a sequence-to-sequence policy learns a device per group of ops by REINFORCE.

"Device Placement Optimization with Reinforcement Learning" (Mirhoseini et al., ICML 2017):

1. group the ops as the paper does: the framework's colocation groups, and an op whose output
   only one op reads joins that op (``coplacement_groups`` without the forward/backward rule);
   more than ``max_groups`` groups merge into runs of consecutive groups;
2. describe each group by its op types, output size and adjacency (``features``);
3. an LSTM encoder-decoder with attention reads the groups in step order and emits one device per
   group (``nets.Seq2SeqPlacer``);
4. REINFORCE with K sampled placements per update, reward minus the square root of the step time,
   a moving-average baseline, Adam (``train.reinforce``).

The paper trains against real runs on 20 controllers for 12-27 hours; here every sample is a
simulation, so a run is minutes on a laptop.

>>> from devplace.graph import chain_graph
>>> colocrl_groups(chain_graph([1.0, 2.0, 3.0]), 256).n_units      # a chain is one group
1
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.learn.features import N_FEATURES, capped_units, unit_features, unit_majority
from devplace.learn.options import ReinforceOptions
from devplace.placers import register
from devplace.placers._memory import check_can_fit
from devplace.placers._moves import Units
from devplace.placers.options import option
from devplace.transforms.coplacement import colocation_units, coplacement_groups

NAME = "colocrl"


@dataclass(frozen=True)
class ColocRLOptions(ReinforceOptions):
    """ColocRL's hyper-parameters. The paper gives REINFORCE with K samples per controller (one per worker,
    4 to 8), the sqrt reward, a moving-average baseline and Adam, and bounds no logits; the rest it leaves
    open. Clipping (1.0) and baseline decay (0.9) are those of the same authors' public Hierarchical Planner
    code. The width, 256, is that code's 512 halved and the learning rate, 0.001, Adam's usual one: at 0.01
    and width 256 the policy collapsed onto one device within a few hundred samples on the demo's GNMT graph
    (a measured choice, not the paper's)."""

    max_groups: int = option(256, "most groups the policy places (consecutive groups merge beyond it)")
    single_consumer: bool = option(True, "an op whose output only one op reads joins that op's group (the paper); "
                                         "False: colocation groups only, finer, so more placements are expressible "
                                         "(devplace's variant: on gnmt_layers_training the paper's 47 groups hold "
                                         "sim-search's placement only 11% slower, colocation's 96 exactly)")
    learning_rate: float = option(0.001, "Adam learning rate")
    tanh_constant: float = option(0.0, "if > 0: device logits are tanh(x) times this (the paper bounds none)")
    module_units: bool = option(False, "where the step order interleaves the layers (a recurrent net such as GNMT), "
                                       "the groups are the module layers whole (a module over all its time steps, "
                                       "with its backward and update ops), so each of the policy's decisions places "
                                       "a module and its deviations move modules, credited to it, as Mars's option "
                                       "of that name; elsewhere no change (devplace's variant)")


def colocrl_groups(graph, max_groups: int, single_consumer: bool = True, modules: bool = False):
    """Colocation groups plus (``single_consumer``) single-consumer chains, at most ``max_groups`` of them,
    as ``Units``; with ``modules`` (option module_units) the module layers where the step order interleaves
    them (``train.module_units``, as Mars's option of that name)."""
    if modules:
        from devplace.learn.train import module_units

        units = module_units(graph, max_groups)
        if units is not None:
            return units
    labels = coplacement_groups(graph, single_consumer=True, mirror=False) if single_consumer else colocation_units(graph)
    return capped_units(graph, labels, max_groups)


@register(NAME, "ColocRL (ICML 2017): seq2seq LSTM + attention places op groups, REINFORCE on the simulator",
          ColocRLOptions, by_default=False)
def place(graph, cluster, *, seed: int = 0, options: ColocRLOptions = ColocRLOptions()):
    import torch

    from devplace.learn.nets import Sample, Seq2SeqPlacer
    from devplace.learn.train import explore_around, layer_labels, reinforce, seeded

    check_can_fit(graph, cluster, NAME)
    groups = colocrl_groups(graph, options.max_groups, options.single_consumer, options.module_units)
    # the simulator sees colocation units (each inside one group), so a centre finer than the groups
    # (deviate_from=best, a warm start the capped groups cannot hold) is kept exactly
    units = Units.from_labels(graph, colocation_units(graph))
    group_of_unit = np.empty(units.n_units, dtype=np.int64)
    group_of_unit[units.unit_of] = groups.unit_of
    layers = layer_labels(graph, units.unit_of) if options.layer_moves else None
    features = torch.from_numpy(unit_features(graph, groups.unit_of))
    n_devices = cluster.n_devices
    with seeded(seed):
        policy = Seq2SeqPlacer(N_FEATURES, n_devices, options.hidden_size, bidirectional=False,
                               tanh_constant=options.tanh_constant, temperature=options.temperature,
                               deviation_rate=min(1.0, options.deviations / groups.n_units),
                               uniform_devices=options.uniform_devices)

    anchor = []    # the cloned warm start: with option deviations, the decoder is fed it instead of its own choices

    def sample(k, generator, noise_std, around, fresh=False):
        if fresh:     # option fresh_share: every group drawn, the decoder fed its own choices, as the paper samples
            drawn = policy(features, k, generator, noise_std, deviate=False)
            return Sample(drawn.actions[:, group_of_unit], drawn.log_prob, drawn.entropy)
        if around is not None:
            return explore_around(around, group_of_unit, n_devices, groups.n_units, k, generator,
                                  options.boundary_moves,
                                  lambda fed, preset: policy(features, k, generator, fed=fed, around=fed, preset=preset),
                                  layers)
        fed = anchor[0].expand(k, -1) if anchor and options.deviations > 0 else None
        drawn = policy(features, k, generator, noise_std, fed=fed)
        return Sample(drawn.actions[:, group_of_unit], drawn.log_prob, drawn.entropy)

    def clone(targets):
        targets = torch.from_numpy(unit_majority(targets.numpy(), group_of_unit, n_devices, groups.n_units))
        anchor[:] = [targets]
        return policy(features, 1, None, 0.0, forced=targets.unsqueeze(0)).log_prob[0]

    return reinforce(NAME, graph, cluster, units.unit_of, policy, sample, options, seed, clone)
