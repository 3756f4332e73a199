"""Mars: a contrastively pre-trained graph encoder, a segment-level placer, trained by PPO.

"Accelerated Device Placement Optimization with Contrastive Learning" (Lan, Chen, Li, ICPP 2021):

1. units: the ops grouped as ColocRL groups them (colocation groups, and an op whose output one op
   reads joins it), in step order; beyond ``max_units`` consecutive units merge;
2. a graph convolutional network embeds every unit from its features and its neighbours; its
   weights come from Deep Graph Infomax pre-training on many operator graphs, done once, without
   labels or step times (``encoder``; ``devplace train mars-encoder``; the package ships one) and
   are fine-tuned with the placer; ``pretrained=false`` starts them at random (the paper's ablation;
   everything else, the placer's initial weights and the sampling, is drawn alike in both arms);
   ``freeze_encoder=true`` keeps them as they start, so pre-trained and random arms can differ only
   through the embeddings the placer reads (the paper trains the whole agent by PPO; it does not say
   the encoder is frozen, so the default fine-tunes);
3. the units are cut into segments of ``segment_length``; an LSTM with attention places one segment
   at a time, carrying its state to the next (``marsnet.SegmentPlacer``);
4. PPO with a value head trains encoder and placer together (the placer alone with ``freeze_encoder``)
   on the simulated step time (``ppo``).

devplace's variant (options off by default, the paper's setting; ``--config devplace`` of
``benchmarks/mars_ablation.py`` turns them on, BENCHMARKS.md says what each did): ``schedule_orders``
(each placement scored in the faster of the topological and upward-rank orders, as ColocRL and HP
may), ``init`` (a warm start: the fastest of some algorithmic placers' placements cloned into the
policy before PPO starts, shared with every learner by ``train``), ``units_along_init`` (beyond
``max_units``, units merge only where the warm start keeps the device, so they can hold it: merged
evenly, a unit of GNMT-4's 256 spans about 97 ops of several of the expert's layers, and the expert's
projection on them is 3x slower), ``init_stop_deviations`` (cloning stops while samples still move a
few units, so PPO explores around the warm start), ``normalize_units`` (the decoder's unit input
layer-normalised, ``marsnet``), ``embedding_logits`` (each unit's device logits also read that unit's own
embedding through a linear head, ``marsnet``: without it a trained placer places by position and hardly reads
the embeddings) and ``module_units`` (where the step order interleaves the layers, as GNMT's
do, the units are the module layers whole: 15 on GNMT-4, where a local search over them without a policy
beats Mars's PPO at equal samples; BENCHMARKS.md says by how much).

The paper reports the step times Mars finds and that pre-training cut training time by 13.2%; it
gives no hyper-parameters. Ours are CleanRL's PPO defaults where PPO has one (``MarsOptions`` says
which), and measured choices for the network's sizes.

>>> MarsOptions().clip, MarsOptions().update_epochs, MarsOptions().entropy_coef
(0.2, 4, 0.01)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devplace.learn.features import capped_units, capped_units_along
from devplace.learn.options import WholePlacementOptions
from devplace.placers import register
from devplace.placers._memory import check_can_fit
from devplace.placers.options import option
from devplace.transforms.coplacement import coplacement_groups

NAME = "mars"


@dataclass(frozen=True)
class MarsOptions(WholePlacementOptions):
    """Mars's hyper-parameters. PPO's are CleanRL's ``ppo.py`` defaults (the paper states none): clip 0.2,
    4 epochs per batch of 4 minibatches, entropy coefficient 0.01, value coefficient 0.5 with the value
    loss clipped, advantages normalised per minibatch, Adam at 2.5e-4 annealed linearly to 0 over the
    run, gradient norm clipped to 0.5. No discount: the reward comes once, at the end of a placement,
    so CleanRL's per-step discount (0.99) would leave the first of a thousand decisions almost no
    signal. Measured choices: 16 placements per batch, width 128, segments of 64 units, at most 256
    units as ColocRL (at 1,024 one update on GNMT-4 took 20 s on the shared 2-core machine). REINFORCE's
    options (baseline decay, staircase decay, logit noise, tanh bound) do not apply."""

    samples_per_update: int = option(16, "placements sampled per PPO batch")
    hidden_size: int = option(128, "placer LSTM, attention and device-embedding width")
    learning_rate: float = option(2.5e-4, "Adam learning rate (CleanRL PPO), annealed linearly to 0 over `samples`")
    grad_clip: float = option(0.5, "clip the gradient's global norm to this (CleanRL PPO; 0: no clipping)")
    max_units: int = option(256, "most units placed (consecutive units merge beyond it; ColocRL's cap)")
    segment_length: int = option(64, "units the placer places per segment (attention spans one segment)")
    clip: float = option(0.2, "PPO clip range of the probability ratio (and of the value change)")
    update_epochs: int = option(4, "passes over each batch")
    minibatches: int = option(4, "minibatches per pass")
    entropy_coef: float = option(0.01, "weight of the entropy bonus")
    value_coef: float = option(0.5, "weight of the value loss")
    pretrained: bool = option(True, "start the encoder from its Deep Graph Infomax pre-training (false: random)")
    encoder: str = option("", "pre-trained encoder file (`devplace train mars-encoder`); empty: the shipped one")
    encoder_hidden: int = option(64, "encoder width when pretrained=false (the shipped encoder's)")
    freeze_encoder: bool = option(False, "keep the encoder's weights as they start (pre-trained or random); "
                                  "false, as the paper: PPO fine-tunes them with the placer")
    normalize_units: bool = option(False, "layer-normalise the unit encodings the decoder reads, so they are not "
                                          "dwarfed by the previous device's embedding beside them (devplace's variant)")
    units_along_init: bool = option(False, "with init: beyond max_units, merge units without crossing a device change "
                                           "of the warm start, so the units can hold it (devplace's variant)")
    module_units: bool = option(False, "where the step order interleaves the layers (a recurrent net such as GNMT), "
                                       "the units are the module layers whole (a module over all its time steps, with "
                                       "its backward and update ops; sim-search's layer move), so the policy places "
                                       "modules; elsewhere no change (devplace's variant)")
    embedding_logits: bool = option(False, "add to each unit's device logits a linear term of that unit's own "
                                           "embedding (standardised over the units; the head starts at zero), so the "
                                           "placer reads the encoder directly rather than only through its LSTMs, "
                                           "which learn to place by position (devplace's variant)")


def mars_units(graph, max_units: int, along: np.ndarray | None = None, modules: bool = False):
    """Colocation groups plus single-consumer chains, at most ``max_units`` of them, as ``Units``; merged
    without crossing a device change of the per-op placement ``along`` when given (option units_along_init).
    With ``modules`` (option module_units), where the step order interleaves the layers, the module layers
    instead (``train.module_units``): there a slice of the step holds pieces of several modules (GNMT-4's
    256 evenly merged units hold pieces of 1-7 of its 15), so no decision moves a module whole."""
    from devplace.learn.train import module_units

    whole = module_units(graph, max_units) if modules else None
    if whole is not None:
        return whole
    labels = coplacement_groups(graph, single_consumer=True, mirror=False)
    return capped_units(graph, labels, max_units) if along is None else capped_units_along(graph, labels, max_units, along)


def units_and_starts(graph, cluster, options: MarsOptions, seed: int):
    """Mars's units and, with option units_along_init, the warm-start candidates they were cut along (the
    fastest that fits, as ``train`` picks it; None otherwise, and ``train`` computes them if option init asks)."""
    from devplace.learn.env import PlacementEnv
    from devplace.learn.train import fastest_start, warm_start

    if not options.units_along_init:
        return mars_units(graph, options.max_units, modules=options.module_units), None
    starts = warm_start(NAME, graph, cluster, options.init, seed)
    spec = fastest_start(starts, PlacementEnv(graph, cluster, np.arange(graph.n_ops), options.orders()))[1]
    return mars_units(graph, options.max_units, None if spec is None else starts[spec], options.module_units), starts


def _check(options: MarsOptions) -> None:
    from devplace.errors import DevplaceError

    for name in ("segment_length", "max_units", "update_epochs", "minibatches", "hidden_size", "encoder_hidden"):
        if getattr(options, name) < 1:
            raise DevplaceError(f"{NAME}: option {name} is {getattr(options, name)}: use 1 or more")
    if options.clip <= 0:
        raise DevplaceError(f"{NAME}: option clip is {options.clip}: use a positive range such as 0.2")
    if options.units_along_init and not options.init:
        raise DevplaceError(f"{NAME}: option units_along_init needs option init (the warm start the units are cut "
                            f"along), e.g. init=expert,m-sct+opt,single")


@register(NAME, "Mars (ICPP 2021): DGI-pre-trained GCN encoder, segment-level seq2seq placer, PPO on the "
          "simulator", MarsOptions, by_default=False)
def place(graph, cluster, *, seed: int = 0, options: MarsOptions = MarsOptions()):
    import torch

    from devplace.learn.encoder import SHIPPED, GCNEncoder, load_encoder, unit_graph
    from devplace.learn.marsnet import SegmentPlacer
    from devplace.learn.ppo import Batch, PPOSettings, ppo_update
    from devplace.learn.train import Update, seeded, train

    _check(options)
    check_can_fit(graph, cluster, NAME)
    units, starts = units_and_starts(graph, cluster, options, seed)
    g = unit_graph(graph, units.unit_of)
    with seeded(seed):
        pretrained = load_encoder(options.encoder or SHIPPED)[0].encoder if options.pretrained else None
    with seeded(seed):     # the same draws with and without pre-training: the arms differ in the encoder's weights only
        encoder = GCNEncoder(options.encoder_hidden if pretrained is None else pretrained.hidden)
        policy = SegmentPlacer(encoder, cluster.n_devices, options.hidden_size, options.segment_length,
                               options.normalize_units, options.embedding_logits)
    if pretrained is not None:
        encoder.load_state_dict(pretrained.state_dict())
    encoder.requires_grad_(not options.freeze_encoder)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trained, lr=options.learning_rate, eps=1e-5)
    settings = PPOSettings(options.clip, options.update_epochs, options.minibatches, options.entropy_coef,
                           options.value_coef, options.grad_clip)
    n_updates = -(-options.samples // options.samples_per_update)

    def step(k, generator, state, rollouts, reward) -> Update:
        for group in optimizer.param_groups:       # CleanRL's annealing: linearly to 0 at the last update
            group["lr"] = options.learning_rate * (1.0 - state.update / n_updates)
        drawn = policy.act(g, k, generator)
        unit_devices = drawn.actions.numpy()
        outcomes = rollouts.evaluate(unit_devices)
        batch = Batch(drawn.actions, drawn.log_prob, drawn.value,
                      torch.as_tensor(reward(outcomes), dtype=torch.float32))
        figures = ppo_update(lambda actions: policy.evaluate(g, actions), trained, optimizer, batch,
                             settings, generator)
        return Update(unit_devices, outcomes, figures["entropy"], figures["loss"])

    def clone(targets):      # option init: the log-probability of placing each unit on its warm-start device
        return policy.evaluate(g, targets.unsqueeze(0)).log_prob.sum()

    return train(NAME, graph, cluster, units.unit_of, policy, optimizer, step, options, seed, clone, starts)
