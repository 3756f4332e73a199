"""The options every learning placer takes (budget, rollouts, checkpoints, log, reward, warm start), the
schedule orders of the learners that score whole placements (``WholePlacementOptions``), and the
REINFORCE learners' knobs (``ReinforceOptions``).

Each learner subclasses one of them as its one frozen dataclass of hyper-parameters,
overriding the defaults its paper (or the authors' public code) gives and saying where each comes
from; ``devplace algos --json`` lists them all, and ``devplace.place`` checks them by name and type.

Budgets: ``samples`` (simulated placements) is the default stop and makes a run reproducible;
``time_budget_s`` may end it earlier (then the result depends on the machine's speed).
"""

from __future__ import annotations

from dataclasses import dataclass

from devplace.placers.options import option


@dataclass(frozen=True)
class LearnerOptions:
    samples: int = option(2000, "placements to simulate in all (the budget; makes runs reproducible)")
    time_budget_s: float | None = option(None, "stop after this many seconds of training (None: samples only)")
    workers: int = option(1, "processes (or Ray workers) that simulate each batch")
    ray: bool = option(False, "simulate on a local Ray instance with `workers` CPUs (pip install devplace[ray])")
    ray_address: str = option("", "simulate on the Ray cluster at this address (e.g. auto, ray://host:10001)")
    checkpoint: str = option("", "save the training state to this file every `checkpoint_every` updates")
    checkpoint_every: int = option(10, "updates between checkpoints")
    resume: bool = option(False, "continue from `checkpoint` if it exists (same graph, cluster, seed, options)")
    log: str = option("", "write the training log to this CSV file and its curve beside it (.png)")
    failing_step_s: float = option(100.0, "step time, in seconds, a placement that does not fit scores "
                                          "(Hierarchical Planner public code: 100)")
    oom_penalty_s_per_gib: float = option(0.0, "if > 0: an overflowing placement scores its step time plus this "
                                               "many seconds per GiB over, instead of the failing step time")
    samples_per_update: int = option(4, "placements sampled per policy update (K)")
    hidden_size: int = option(256, "LSTM and embedding width")
    learning_rate: float = option(0.1, "Adam learning rate")
    grad_clip: float = option(1.0, "clip the gradient's global norm to this (0: no clipping)")
    init: str = option("", "warm start: clone the fastest placement of these placers (comma-separated, e.g. "
                           "expert,m-sct+opt,single; sim-search only when named) before training, and return "
                           "it if no sample beats it")
    init_updates: int = option(200, "behaviour-cloning updates of the warm start (teacher forcing, no simulation)")
    init_learning_rate: float = option(0.01, "Adam learning rate while cloning the warm start")
    init_stop_deviations: float = option(0.0, "if > 0: stop cloning once a sample is expected to differ from the warm "
                                              "start in at most this many units, so sampling still explores around it "
                                              "(devplace's variant; 0: all init_updates steps)")


@dataclass(frozen=True)
class WholePlacementOptions(LearnerOptions):
    """The options of the learners whose every sample is a whole placement scored by ``train`` (ColocRL, HP, Mars;
    not Placeto, which scores each move of an episode)."""
    schedule_orders: str = option("topological", "schedule orders each placement is simulated in, comma-separated: "
                                                 "topological (the papers: the runtime's order) and upward-rank; with "
                                                 "both, each scores the faster, and the placement returned carries it "
                                                 "(devplace's variant)")
    carry_order: bool = option(False, "each placement is also simulated in the order of the best placement so far "
                                      "(its priority, carried as sim-search carries its order from move to move), "
                                      "replaced when a new best is faster in its own schedule_orders (devplace's "
                                      "variant; the papers leave the order to the runtime)")

    def orders(self) -> tuple[str, ...]:
        """Option schedule_orders as a tuple (``PlacementEnv`` refuses unknown ones, naming them)."""
        return tuple(o.strip() for o in self.schedule_orders.split(",") if o.strip())


@dataclass(frozen=True)
class ReinforceOptions(WholePlacementOptions):
    """The knobs of the REINFORCE learners (ColocRL, HP): their baseline, exploration and devplace's variant."""
    tanh_constant: float = option(1.0, "if > 0: device logits are tanh(x) times this, so no device is ever ruled out")
    lr_decay: float = option(1.0, "multiply the learning rate by this every `lr_decay_every` updates")
    lr_decay_every: int = option(50, "updates between learning-rate decays")
    lr_decay_start: int = option(0, "update at which the decay begins")
    baseline_decay: float = option(0.9, "moving-average baseline: b <- decay * b + (1 - decay) * mean reward")
    logit_noise_std: float = option(0.0, "Gaussian noise added to the policy's logits while exploring")
    noise_updates: int = option(0, "updates during which the logit noise is added")
    temperature: float = option(1.0, "divide the device logits by this before sampling (HP public code: 1.0); "
                                     "below 1 samples nearer the most likely placement, e.g. a cloned warm start")
    normalize_advantage: bool = option(False, "divide each update's advantages by the standard deviation of its "
                                              "rewards (devplace's variant; the papers do not)")
    entropy_weight: float = option(0.0, "add this times the mean entropy per decision to the objective "
                                        "(devplace's variant; the papers add none)")
    deviations: float = option(0.0, "if > 0: explore around the greedy decode, each sample moving this many units "
                                    "on average to another device, credited to those units only (devplace's "
                                    "variant; the papers sample every unit)")
    deviate_from: str = option("greedy", "what option deviations and boundary_moves move units from: greedy (the "
                                         "policy's greedy decode) or best (the best placement so far, the warm "
                                         "start until a sample beats it; devplace's variant)")
    boundary_moves: float = option(0.0, "with deviate_from=best: each sample also shifts about this many boundaries "
                                        "between consecutive groups on different devices by one group (devplace's "
                                        "variant)")
    layer_moves: bool = option(False, "with deviate_from=best: a group that moves takes along the rest of each "
                                      "layer its ops belong to (a forward op with its backward and update ops), so a "
                                      "sample moves whole layers as sim-search's coarse units do (devplace's variant)")
    uniform_devices: bool = option(False, "a deviating unit moves to a device drawn evenly from the others, not from "
                                          "the policy (credited as the policy's choice): after cloning a warm start the "
                                          "policy's mass off it follows the neighbours' devices, an artefact of the "
                                          "cloning, not of any reward (devplace's variant)")
    module_moves: float = option(0.0, "with deviate_from=best, where the step order interleaves the layers (a "
                                      "recurrent net such as GNMT): each sample also moves this many module "
                                      "layers (a module over all its time steps, with its backward and update ops) "
                                      "whole to a device drawn evenly from the others, as sim-search's layer move "
                                      "does; a search move beside the policy's, not credited to it (devplace's "
                                      "variant)")
    critical_share: float = option(0.0, "with deviate_from=best: this share of each update's K samples (rounded, "
                                        "at most K - 1) is the best placement so far with one of sim-search's "
                                        "schedule-guided moves (a co-placement group pulled along the critical path "
                                        "or unloaded off the busiest device), a search move the policy's update "
                                        "leaves out (devplace's variant)")
    module_alone_share: float = option(0.0, "with deviate_from=best, where module_moves' modules exist (the step "
                                            "order interleaves the layers): this share of each update's K samples "
                                            "(rounded) is the best placement so far with exactly one module layer "
                                            "moved and nothing else, a search sample beside the policy's: no "
                                            "decision of the policy, so it is left out of the loss, the baseline "
                                            "and the entropy (devplace's variant)")
    module_idle_share: float = option(0.0, "a module move (module_moves, module_alone_share) sends its module to the "
                                           "least busy device (compute time in the best placement so far) other "
                                           "than its own with this probability, else to one drawn evenly, as "
                                           "sim-search's layer move does half the time (devplace's variant)")
    module_spread: float = option(0.0, "a module_alone_share search sample also moves each other module layer "
                                       "with chance this / modules, as sim-search's layer search draws its "
                                       "candidates (1.5), so a search sample can move several modules at once and "
                                       "leave a basin where every single module move is slower (devplace's "
                                       "variant; 0: one module alone)")
    fresh_share: float = option(0.0, "with deviate_from=best: this share of each update's K samples (rounded) is "
                                     "drawn from the policy whole, every decision, as the papers sample, the rest "
                                     "deviate from the best: global exploration beside the local moves (devplace's "
                                     "variant)")
    kind_baselines: bool = option(False, "each kind of policy sample (fresh_share's whole placements, the deviations "
                                         "from the best) is judged against its own moving-average baseline and, with "
                                         "normalize_advantage, its own moving spread: with one baseline a fresh sample, "
                                         "far slower than any deviation, scores below the batch whatever its quality, "
                                         "and its update is noise (devplace's variant; the papers have one kind)")


def learning_rate_at(options: ReinforceOptions, update: int) -> float:
    """The staircase schedule: ``lr * decay ** ((update - start) // every)`` from ``start`` on."""
    if update < options.lr_decay_start:
        return options.learning_rate
    return options.learning_rate * options.lr_decay ** ((update - options.lr_decay_start) // options.lr_decay_every)
