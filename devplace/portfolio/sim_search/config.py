"""The search's options, one dataclass, and its name."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from devplace.placers.options import option

log = logging.getLogger("devplace.portfolio.sim_search")    # one logger for the whole search
NAME = "sim-search"
GIB = 2**30


@dataclass(frozen=True)
class SearchConfig:
    """Every knob of the search, in the order the search uses them; each is a place() option."""

    seeds: tuple[str, ...] = option(
        ("single", "expert", "m-topo", "m-etf", "heft", "m-sct", "metis", "round-robin", "random",
         "accelerate-auto", "pipeline-partition", "fx-size-partition",
         "m-topo+opt", "m-etf+opt", "m-sct+opt", "heft+opt", "metis+opt", "metis+fwd"),
        "placers whose placements start the search: ALGO or ALGO+opt / ALGO+fwd")
    max_ops_raw: int = option(6000, "seeds run on the full graph only up to this many ops (else +opt only)")
    max_ops_costly: int = option(3000, "m-SCT runs on the full graph only up to this many ops (HEFT up to max_ops_raw)")
    max_evals: int = option(2000, "simulator calls per annealing round (the budget; makes results reproducible)")
    max_rounds: int = option(4, "annealing rounds at most; a round after the first runs only while the best is "
                                "more than target_gap above the certified lower bound")
    first_start_rounds: int = option(2, "how many of the rounds that begin from the best so far (the first, third, "
                                        "...) begin from the best start instead, each on the random stream where the "
                                        "last left off: which basin a round finds from one start is a coin flip "
                                        "(round 54 of benchmarks/rounds; 1: only the first)")
    small_graph_round_factor: int = option(6, "a graph small enough (small_graph_op_evals) runs up to this x "
                                              "max_rounds rounds while the gap is above target_gap")
    small_graph_op_evals: float = option(3e8, "rounds past max_rounds (up to small_graph_round_factor x max_rounds) "
                                              "while the gap is above target_gap and evals x ops stays under this: "
                                              "a round of a graph of a "
                                              "few thousand ops costs seconds, of tens of thousands half a minute "
                                              "(those stop at max_rounds)")
    virtual_caps: tuple[float, ...] = option(
        (0.75, 0.5), "fractions of the one-device peak: once the rounds are done on a graph that affords whole "
                     "searches more (small_graph_op_evals) and the gap is still wide, one more round under each that "
                     "is below the devices' memory (from the best if it fits, else from a cheapest cut planned for "
                     "it): a placement that fits a lower cap fits the devices, "
                     "and a tighter memory leads the annealing elsewhere; () for none")
    canonical_caps: tuple[float, ...] = option(
        (0.5, 0.6, 0.7, 0.9), "a ladder of fractions of the one-device peak: the whole search runs once per fraction "
                              "that every device holds, with each device's memory cut to it, and the fastest of those "
                              "and of the one-device placements that fit is returned, so more memory above the lowest "
                              "rung is never slower (graphs that afford more searches; (): off)")
    large_graph_canonical_cap: float = option(
        0.63, "fraction of the one-device peak: on graphs that afford no more searches (NASNet, GNMT), where "
              "every device has at least this x that peak, the search runs once with each device's memory cut to "
              "it and the faster of that and the one-device placements that fit is returned, so every such memory "
              "gives the same result at no extra search (chosen in round 37 of benchmarks/rounds; 0: off)")
    canonical_cap_min_ops: int = option(1000, "graphs with fewer ops get no canonical caps (on a graph of a few "
                                              "hundred ops a cap can slow the result more than it steadies it)")
    target_gap: float = option(0.10, "best / lower bound - 1 under which no further round starts")
    closed_gap: float = option(0.001, "stop as soon as best / lower bound - 1 is below this (0: never stop early)")
    time_budget_s: float | None = option(None, "wall-clock cap on the whole placement in seconds (None: "
                                               "none, max_evals alone decides, so the seed makes it reproducible)")
    temperature_start: float = option(0.01, "annealing: accept a move d% slower with probability "
                                            "exp(-d / temperature%), relative to the best step time, at the start")
    temperature_end: float = option(0.0002, "annealing temperature at the end of the budget")
    restart_after: int = option(250, "evals without a new best of the round before continuing from it")
    move_weights: tuple[tuple[str, float], ...] = option(
        (("move", 3.0), ("swap", 1.0), ("run", 2.0), ("pull", 2.0), ("unload", 1.0), ("layer", 1.0)),
        "relative weights of the moves (move, swap, run, pull, unload, layer)")
    critical_share: float = option(0.6, "chance a move starts from a unit on the critical path")
    coarse_share: float = option(0.5, "chance a move acts on co-placement groups rather than colocation units")
    run_max_units: int = option(16, "longest run of units a run move shifts")
    reorder_every: int = option(100, "evals between tries of other schedule orders")
    pipeline_starts: bool = option(True, "try consecutive stages as starts: the forward pass balanced by bytes, and "
                                         "the whole step cut where the least transfer time crosses")
    pipeline_rebalance: int = option(3, "cuts per stage count, each re-weighting a stage by its simulated peak")
    pipeline_shifts: int = option(12, "simulator calls shifting the boundaries of the least overflowing cut "
                                      "(per stage count and balance) until it fits")
    layer_descent_evals: int = option(4000, "simulator calls for the layer descents after the annealing (where layers "
                                            "interleave: the fastest whole-layer move each step, from the annealing's "
                                            "best, the best start and the expert; 0: none)")
    layer_search_evals: int = option(2000, "simulator calls for the layer search before the layer descents (where "
                                           "layers interleave: random moves of whole layers from starts laid out "
                                           "layer by layer, each kept if faster; 0: none)")
    layer_search_starts: int = option(4, "how many of the fastest distinct layer-by-layer starts the layer search "
                                         "shares its evals over")
    coarse_mip_groups: int = option(50, "layer groups of the coarse MIP start (exact's program on the step coarsened "
                                        "to them, after the other rounds while the gap is wide; 0: none)")
    coarse_mip_min_ops: int = option(1000, "graphs with fewer ops get no coarse MIP start")
    coarse_mip_memory: float = option(0.85, "share of each device's memory the coarse program may fill with the "
                                            "pieces' persistent bytes and saved activations")
    coarse_mip_nodes: int = option(10000, "HiGHS branch-and-bound nodes for the coarse program (its only limit, "
                                          "so the same graph gives the same start on every machine)")
    coarse_mip_rounds: int = option(16, "annealing rounds from the coarse MIP start at most, each from that track's "
                                        "best; past max_rounds only while that best is within track_behind of "
                                        "the best found")
    grad_block_share: float = option(0.25, "the gradient block track runs (after the coarse MIP track, while the gap is "
                                           "wide) where weights whose gradients are chains of their own hold at least "
                                           "this share of the step's compute (a recurrent language model's weights)")
    grad_block_min_share: float = option(0.02, "a weight's gradient ops and own ops are a block of their own when they "
                                               "hold at least this share of the step's compute (else they stay in "
                                               "their layer's block)")
    grad_block_starts: int = option(6, "block maps the track descends from: the best laid out by block, then random")
    grad_block_evals: int = option(4000, "simulator calls the gradient block descents share (0: no track)")
    grad_block_rounds: int = option(16, "annealing rounds from the fastest block descent at most, as coarse_mip_rounds")
    track_behind: float = option(0.02, "past max_rounds a track of its own (coarse MIP, gradient blocks, recurrence, "
                                       "branches) goes on only while its best / the best found - 1 is at most this")
    recurrence_starts: int = option(6, "piece maps the recurrence track descends from (after the gradient block "
                                       "track, where it runs and a block's weight is recurrent): the best laid out "
                                       "by piece, then random")
    recurrence_evals: int = option(4000, "simulator calls the recurrence piece descents share (0: no track)")
    recurrence_rounds: int = option(16, "annealing rounds from the fastest recurrence piece descent at most, as "
                                        "grad_block_rounds (and within track_behind past max_rounds)")
    branch_min_branches: int = option(3, "a fork whose region splits into at least this many branches is a cell "
                                         "whose branches the branch track moves whole")
    branch_share: float = option(0.25, "the branch track runs (after the recurrence track, while the gap is wide) "
                                       "where the cells' branches hold at least this share of the step's compute "
                                       "(Inception and NASNet cells)")
    branch_starts: int = option(1, "starts the branch track descends from: the best as it is, then random piece "
                                   "maps (under tight memory random maps seldom fit)")
    branch_evals: int = option(6000, "simulator calls the branch piece descents share (0: no track)")
    branch_rounds: int = option(16, "annealing rounds from the fastest branch piece descent at most, as "
                                    "grad_block_rounds (and within track_behind past max_rounds)")
    loose_memory_factor: float = option(2.0, "the looser-memory track (last, where the memory / this and the memory "
                                             "would not hold the one-device peak; loose_memory.py): up, the search "
                                             "with this x the memory repaired into it and annealed (while the gap is "
                                             "wide, up to loose_memory_max_gap); down, the best repaired into the "
                                             "memory / this, so a memory offers what its fraction's up track does; "
                                             "each only where the placement repaired is within target_gap of that "
                                             "memory's bound; <= 1: none. 2 keeps memories exact")
    loose_memory_max_gap: float = option(0.15, "the up track's search (a whole search more) runs only while best / "
                                               "bound - 1 is at most this: a looser search ends only a few percent "
                                               "below the tight one")
    loose_memory_rounds: int = option(4, "annealing rounds from the repaired looser-memory best, each from that "
                                         "track's best (0: no track)")
    loose_memory_start_behind: float = option(0.25, "no looser-memory rounds from a repaired start slower than the "
                                                    "placement it was repaired from x (1 + this): such a repair undid the "
                                                    "placement rather than fitting it")
    loose_memory_repair_candidates: int = option(24, "repair proposals measured per step when the looser-memory best "
                                                     "is repaired, the fastest that lowers the overflow taken (1: the "
                                                     "first that lowers (overflow, step time), as for the starts)")
    order_descent_evals: int = option(2000, "simulator calls for the order descent, the last phase while the gap is "
                                            "wide: single ops moved in the best's schedule order, its devices fixed "
                                            "(order_descent.py; 0: none)")
    repair_max_evals: int = option(1000, "simulator calls to remove the overflow when no start fits")
    repair_patience: int = option(150, "evals without less overflow before repairing the next start")
    repair_starts: int = option(3, "how many of the least-overflowing starts the repair may try")
    repair_run_share: float = option(0.5, "chance a repair move shifts a run of groups at a stage's edge")
    repair_run_fraction: float = option(0.25, "longest repair run: this share of the overflowing device's groups")
    robust_samples: int = option(0, "score candidates by the mean step time over this many perturbed cost models "
                                    "(devplace.robust, from the seed) instead of the nominal one; that many times "
                                    "slower (0: nominal)")

    def affords_more_searches(self, n_ops: int) -> bool:
        """Whether a whole search more (a rung of the canonical ladder, the looser memory) is affordable on a
        graph of ``n_ops`` ops: a full budget, ``small_graph_round_factor`` x ``max_rounds`` rounds of ``max_evals``,
        times ``n_ops`` within ``small_graph_op_evals``. The rounds loop asks another question, round by round (the evals spent so
        far), so a graph a little above this still gets some rounds past ``max_rounds``."""
        return self.small_graph_round_factor * self.max_rounds * self.max_evals * n_ops <= self.small_graph_op_evals
