"""The training loop every learning placer runs (torch): sample, simulate, update, checkpoint, log.

``train`` is the loop (budget, best placement, checkpoints, log, progress); each learner hands it
its ``step``. ``reinforce`` is ColocRL's and HP's step; Mars's PPO step is in ``ppo``.

One REINFORCE update, as both ColocRL and the Hierarchical Planner train:

1. the policy samples K placements of the units (``samples_per_update``), drawing from a
   ``torch.Generator`` seeded by the run's seed;
2. the evaluator (``rollouts``) simulates them; the reward is minus the square root of each step
   time in seconds (``env.Reward``);
3. the loss is ``-mean_k((R_k - b) * log p(placement_k))`` with ``b`` the moving-average baseline;
   Adam takes one step (learning rate on the staircase schedule, gradient norm clipped);
4. the baseline moves: ``b <- decay * b + (1 - decay) * mean_k R_k``.

devplace's variant adds, as options the papers leave at zero: advantages divided by the standard
deviation of the update's rewards (``normalize_advantage``), an entropy bonus (``entropy_weight``), and
a warm start (``init``): the fastest of some placers' placements, each simulated once, is cloned into
the policy by teacher forcing (``init_updates`` steps of maximum likelihood, no simulation) before
REINFORCE starts, as GDP and DOPPLER start from a heuristic; the learner returns the warm start
itself, and says so, if none of its samples beats it. With ``deviate_from=best`` the samples are the
best placement so far with a few groups moved (``explore_around``), a policy-guided local search;
``fresh_share`` of each batch is then drawn from the policy whole, as the papers sample, so the search
can leave the best's basin when the policy has learned a better one. With ``carry_order`` every sample
is also simulated in the best placement's order (``PlacementEnv``'s ``carried``): the warm start's
own order at first, then the order each new best was fastest in, as sim-search carries its order.
Where the step order interleaves the layers (GNMT), ``module_moves`` adds whole-module moves to each deviating
sample and ``module_alone_share`` of each batch is the best with one module moved and nothing else
(``module_shifts``, towards the least busy device with probability ``module_idle_share``; with ``module_spread``
each other module moves too with chance ``module_spread`` / modules, as sim-search's layer search): search moves, as
sim-search's layer move, never credited to the policy; a search sample is left out of the update altogether.
With ``critical_share`` a share of each batch is the best placement with one of sim-search's schedule-guided
moves (``CriticalMoves``): search moves beside the policy's samples, which the update does not see.
With ``kind_baselines`` each kind of policy sample (fresh, deviation) has its own baseline (``kind_advantages``), so
a fresh sample is judged against the fresh samples before it, not against the deviations it always trails.

The best placement that fits memory is kept and returned. Every ``checkpoint_every`` updates (and
at the end) the whole state (parameters, optimizer, generator, baseline, counters, best, log) is
written to ``checkpoint``; ``resume`` continues from it and ends exactly where an uninterrupted run
with the same seed ends.
"""

from __future__ import annotations

import dataclasses
import io
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from devplace import progress
from devplace.errors import DevplaceError, OutOfMemoryError
from devplace.fileio import write_bytes_atomic
from devplace.learn.env import GIB, PlacementEnv, Reward
from devplace.learn.features import unit_majority
from devplace.learn.log import write_log
from devplace.learn.nets import Sample
from devplace.learn.options import ReinforceOptions, WholePlacementOptions, learning_rate_at
from devplace.learn.rollouts import evaluator
from devplace.placement import Placement, graph_fingerprint
from devplace.placers._moves import critical_crossings

# options that change how a run is carried out, not what it computes: a checkpoint resumes under any of them
RUN_CONTROL = ("samples", "time_budget_s", "workers", "ray", "ray_address", "checkpoint", "checkpoint_every",
               "resume", "log")


@contextmanager
def seeded(seed: int):
    """Build networks inside: their initial parameters depend on ``seed`` only (global RNG restored after)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextmanager
def one_thread():
    """Run torch on one thread inside: the policy's matrices are small, so a second thread only adds
    synchronisation (several times slower on a busy 2-core machine), and rollout workers want the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclasses.dataclass
class _State:
    update: int = 0
    samples: int = 0
    wall_s: float = 0.0
    baseline: float | None = None
    best_step_us: float = math.inf
    best_units: np.ndarray | None = None
    least_over_bytes: float = math.inf
    least_peak_bytes: np.ndarray | None = None
    rows: list = dataclasses.field(default_factory=list)
    init_step_us: float | None = None         # the warm start's simulated step time, once cloned
    init_devices: np.ndarray | None = None
    init_units: np.ndarray | None = None      # the warm start's majority device per unit: what the policy is cloned to
    init_fit: float | None = None             # after cloning: the policy's mean probability of the warm start's choices
    init_updates_done: int = 0                # cloning steps taken (fewer than init_updates if the time budget ran out)
    init_source: str | None = None            # the placer whose placement is the warm start (the fastest of option init)
    init_candidates: dict = dataclasses.field(default_factory=dict)   # each init placer's step time (None: overflows)
    carried: np.ndarray | None = None         # option carry_order: the best placement's priority (None: topological)
    gain_us_by: dict = dataclasses.field(default_factory=dict)   # step time gained below the best so far, per kind of sample
    kind_moments: dict = dataclasses.field(default_factory=dict)  # option kind_baselines: kind -> [baseline, spread**2]


def _identity(name, graph, cluster, seed, options) -> dict:
    """What a checkpoint must match to be resumed: the learner, graph, cluster, seed and learning options."""
    learning = {k: v for k, v in dataclasses.asdict(options).items() if k not in RUN_CONTROL}
    return {"algo": name, "graph": graph_fingerprint(graph.names), "devices": list(cluster.device_names),
            "seed": seed, "options": learning}


def _save(path, identity, policy, optimizer, generator, state: _State) -> None:
    buffer = io.BytesIO()
    torch.save({"identity": identity, "policy": policy.state_dict(), "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(), "state": dataclasses.asdict(state)}, buffer)
    write_bytes_atomic(path, buffer.getvalue())


def _load(path, identity, policy, optimizer, generator) -> _State:
    try:
        saved = torch.load(path, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise DevplaceError(f"cannot read checkpoint {str(path)!r} ({type(exc).__name__}): delete it or "
                            f"run without resume") from None
    if saved.get("identity") != identity:
        differs = [k for k in identity if saved.get("identity", {}).get(k) != identity[k]]
        raise DevplaceError(f"checkpoint {str(path)!r} is of another run (its {', '.join(differs)} differ): "
                            f"give another checkpoint path or run without resume")
    policy.load_state_dict(saved["policy"])
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["generator"])
    return _State(**saved["state"])


def warm_start(name: str, graph, cluster, init: str, seed: int) -> dict[str, np.ndarray]:
    """Per placer named in ``init`` (comma-separated), the device per op it gives. Algorithmic placers and
    sim-search only: a learner must not pass off another learner's result as its own; with sim-search among
    them, the learner refines sim-search's placement and its figures say so (``init``)."""
    from devplace.placers import available
    from devplace.portfolio import place   # the portfolio parses ALGO+opt; a learner that runs a placer sits beside it

    specs = [spec.strip() for spec in init.split(",") if spec.strip()]
    for spec in specs:
        info = available().get(spec.split("+")[0])
        if info is None or not info.by_default:
            raise DevplaceError(f"{name}: option init={spec!r} must be an algorithmic placer such as expert or "
                                f"m-sct+opt, or sim-search (not a learner)")
    return {spec: np.asarray(place(graph, cluster, algo=spec, seed=seed).devices, dtype=np.int64) for spec in specs}


def fastest_start(starts: dict[str, np.ndarray], whole: PlacementEnv) -> tuple[dict[str, float | None], str | None]:
    """Each warm-start candidate's step time, simulated once in ``whole`` (the environment over single ops; None:
    it overflows), and the fastest that fits (None: none fits)."""
    times = {}
    for spec, devices in starts.items():
        result = whole.evaluate(devices[None])
        times[spec] = None if result.oom[0] else float(result.step_us[0])
    fitting = {spec: t for spec, t in times.items() if t is not None}
    return times, min(fitting, key=fitting.get) if fitting else None


def _clone(state: _State, name, graph, cluster, unit_of, policy, clone, options, seed, deadline: float,
           whole: PlacementEnv, starts: dict[str, np.ndarray] | None) -> None:
    """Simulate each warm-start candidate once (``starts``, or ``warm_start``'s when None), keep the fastest
    that fits, and fit the policy to it by teacher forcing (deterministic: no sampling), stopping early at
    ``deadline`` (``time.perf_counter()``; the time budget covers cloning too)."""
    starts = warm_start(name, graph, cluster, options.init, seed) if starts is None else starts
    state.init_candidates, spec = fastest_start(starts, whole)
    state.samples += len(starts)
    if spec is None:
        return
    state.init_step_us, state.init_devices, state.init_source = state.init_candidates[spec], starts[spec], spec
    state.init_units = unit_majority(state.init_devices, unit_of, cluster.n_devices)
    if options.carry_order:
        state.carried = whole.order_of(state.init_devices)
    targets = torch.from_numpy(state.init_units)
    optimizer = torch.optim.Adam(policy.parameters(), lr=options.init_learning_rate)
    for _ in range(options.init_updates):
        if time.perf_counter() >= deadline:
            break
        log_prob = clone(targets)
        if 0 < options.init_stop_deviations >= _expected_deviations(float(log_prob.detach()), len(targets)):
            break       # close enough: a sample still moves a few units away from the warm start
        loss = -log_prob / len(targets)
        optimizer.zero_grad()
        loss.backward()
        if options.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), options.grad_clip)
        optimizer.step()
        state.init_updates_done += 1
    with torch.no_grad():
        state.init_fit = math.exp(float(clone(targets)) / len(targets))


def _expected_deviations(log_prob: float, n_units: int) -> float:
    """Units in which a sample is expected to differ from targets of total log-probability ``log_prob``, taking
    every decision at the mean per-decision probability (option init_stop_deviations)."""
    return n_units * (1.0 - math.exp(log_prob / n_units))


def centre(state: _State) -> np.ndarray | None:
    """Option deviate_from=best: the best placement so far per unit (the warm start until a sample beats it;
    None before either exists, and the learner then deviates from its greedy decode)."""
    if state.best_units is not None and (state.init_step_us is None or state.best_step_us < state.init_step_us):
        return state.best_units
    return state.init_units


def boundary_shifts(group_centre: np.ndarray, k: int, expected: float, generator: torch.Generator):
    """(K, groups) forced moves (-1: none): each boundary between consecutive groups on different devices is
    shifted with probability ``expected`` / boundaries, by moving the group on one side (either, evenly) to the
    other side's device; None without boundaries. Layer-per-device splits are improved by moving their cuts,
    which single random moves rarely do (a move inside a block adds two cuts)."""
    cuts = torch.from_numpy(np.flatnonzero(group_centre[:-1] != group_centre[1:]))
    if expected <= 0 or len(cuts) == 0:
        return None
    devices = torch.from_numpy(np.asarray(group_centre, dtype=np.int64))
    shift = torch.rand(k, len(cuts), generator=generator) < min(1.0, expected / len(cuts))
    left = torch.rand(k, len(cuts), generator=generator) < 0.5      # the left group takes the right's device
    target = torch.where(left, cuts, cuts + 1)
    device = torch.where(left, devices[cuts + 1], devices[cuts])
    preset = torch.full((k, len(group_centre)), -1, dtype=torch.long)
    rows = torch.arange(k).unsqueeze(1).expand_as(target)
    preset[rows[shift], target[shift]] = device[shift]
    return preset


def explore_around(centre_units: np.ndarray, group_of_unit: np.ndarray, n_devices: int, n_groups: int, k: int,
                   generator: torch.Generator, boundary_moves: float, draw,
                   layer_of_unit: np.ndarray | None = None) -> Sample:
    """Option deviate_from=best for a policy that places groups of units: ``draw(group_centre (K, G),
    preset)`` deviates around each group's majority device of the centre; a moved group's units all take its
    new device, every other unit keeps the centre's (so the centre is held exactly, finer than the groups).
    With ``layer_of_unit`` (option layer_moves) a moved unit's whole layer follows it (``with_layers``). Option
    module_moves' whole-module moves are added by ``reinforce`` (``module_shifts``), outside the policy."""
    group_centre = unit_majority(centre_units, group_of_unit, n_devices, n_groups)
    around = torch.from_numpy(group_centre).expand(k, -1)
    drawn = draw(around, boundary_shifts(group_centre, k, boundary_moves, generator))
    moved = (drawn.actions != around)[:, group_of_unit]
    actions = torch.where(moved, drawn.actions[:, group_of_unit], torch.from_numpy(centre_units).expand(k, -1))
    if layer_of_unit is not None:
        actions = torch.from_numpy(with_layers(actions.numpy(), moved.numpy(), layer_of_unit))
    return Sample(actions, drawn.log_prob, drawn.entropy)


def kind_advantages(rewards: np.ndarray, kinds: list[str], moments: dict, decay: float,
                    normalize: bool) -> np.ndarray:
    """Option kind_baselines: each row's reward minus the moving-average baseline of its kind of sample, divided
    (``normalize``) by that kind's moving root-mean-square advantage; ``moments`` (kind -> [baseline, spread
    squared]) moves by ``decay`` as the shared baseline does. A kind seen first is its own baseline. Measured on
    gnmt_layers_training (HP, round 8b): the one fresh row of a batch beside two deviations of the best was the
    slowest in 98 of 99 batches, so under one baseline its normalised advantage was about -1.15 whatever it drew,
    and an update pushed down whatever it drew: no signal, zero in expectation.

    >>> moments = {"fresh": [-0.70, 0.01 ** 2]}
    >>> kind_advantages(np.array([-0.60, -0.61, -0.70]), ["deviation", "deviation", "fresh"], moments, 0.9,
    ...                 False).round(3).tolist()      # the fresh row is at its own baseline: no push either way
    [0.005, -0.005, 0.0]
    """
    advantage = np.zeros(len(rewards))
    for kind in dict.fromkeys(kinds):
        rows = np.asarray([k == kind for k in kinds])
        baseline, spread_sq = moments.get(kind, [float(rewards[rows].mean()), 0.0])
        advantage[rows] = rewards[rows] - baseline
        spread_sq = decay * spread_sq + (1 - decay) * float(np.mean(advantage[rows] ** 2)) if spread_sq > 0 \
            else float(np.mean(advantage[rows] ** 2))
        if normalize and spread_sq > 0:
            advantage[rows] /= math.sqrt(spread_sq)
        moments[kind] = [decay * baseline + (1 - decay) * float(rewards[rows].mean()), spread_sq]
    return advantage


def module_shifts(unit_devices: np.ndarray, centre_units: np.ndarray, module_of_unit: np.ndarray, expected: float,
                  n_devices: int, generator: torch.Generator, busy_us: np.ndarray | None = None,
                  idle_share: float = 0.0, spread: float = 0.0) -> np.ndarray:
    """Option module_moves: (K, U) devices where each sample moves ``expected`` module layers (``module_of_unit``;
    its integer part, and one more with the probability of its fraction), drawn evenly without repeats, each
    with all its units to one device drawn evenly from those other than its majority device in the centre:
    one move at a time, as sim-search moves. On GNMT-4 a descent over such moves from the expert passes sim-search (BENCHMARKS.md,
    "Learning placers", round 6); the learners' groups, slices of the step, each hold pieces of 1-7 modules.
    With ``busy_us`` (the centre's compute time per device; option module_idle_share) each module goes instead,
    with probability ``idle_share``, to the least busy device other than its own, as sim-search's layer move
    does half the time. With ``spread`` (option module_spread) each sample also moves each other module with
    chance ``spread`` / modules, as sim-search's layer search draws its candidates (1.5): several modules at once,
    which leaves a basin where every single module move is slower.

    >>> module_shifts(np.zeros((1, 4), dtype=np.int64), np.zeros(4, dtype=np.int64), np.array([0, 0, 1, 1]), 2.0,
    ...               2, torch.Generator().manual_seed(0))     # both modules, each to the other device
    array([[1, 1, 1, 1]])
    """
    n_modules = int(module_of_unit.max()) + 1
    majority = unit_majority(centre_units, module_of_unit, n_devices, n_modules)
    k = len(unit_devices)
    count = int(expected) + (torch.rand(k, generator=generator) < expected - int(expected)).long()
    rank = torch.rand(k, n_modules, generator=generator).argsort(dim=1).argsort(dim=1)    # a random order per sample
    move = (rank < count.unsqueeze(1)).numpy()
    target = (majority + torch.randint(1, n_devices, (k, n_modules), generator=generator).numpy()) % n_devices
    if busy_us is not None and idle_share > 0:
        others = np.where(np.arange(n_devices)[None] == majority[:, None], np.inf, np.asarray(busy_us)[None])
        idle = (torch.rand(k, n_modules, generator=generator) < idle_share).numpy()
        target = np.where(idle, others.argmin(axis=1)[None], target)
    if spread > 0:
        move |= (torch.rand(k, n_modules, generator=generator) < spread / n_modules).numpy()
    return np.where(move[:, module_of_unit], target[:, module_of_unit], unit_devices)


def unit_compute_us(graph, cluster, unit_of: np.ndarray) -> np.ndarray:
    """(units, devices) compute time of each unit on each device (its ops' times plus the per-op gap), so a
    placement's busy time per device is a sum (option module_idle_share: sim-search's ``busy_us``)."""
    from devplace.sim import Simulator

    per_op = Simulator(graph, cluster).op_time_us + cluster.op_gap_us
    out = np.zeros((int(unit_of.max()) + 1, cluster.n_devices))
    np.add.at(out, unit_of, per_op)
    return out


def busy_of(unit_devices: np.ndarray, compute_us: np.ndarray) -> np.ndarray:
    """Compute time per device of a placement of units (``unit_compute_us``)."""
    return np.bincount(unit_devices, weights=compute_us[np.arange(len(unit_devices)), unit_devices],
                       minlength=compute_us.shape[1])


def module_labels(graph, unit_of: np.ndarray) -> np.ndarray | None:
    """Option module_moves: per unit (``unit_of``: colocation units), its module layer as sim-search's layer move
    takes it (``portfolio.sim_search.interleaved_layers``), or None where the step order does not interleave the
    layers (RNNLM, Inception-V3: sim-search draws no layer move there either)."""
    from devplace.placers._moves import sources_late_order
    from devplace.portfolio.sim_search import interleaved_layers

    layers = interleaved_layers(graph, np.argsort(sources_late_order(graph)))
    if layers is None:
        return None
    module = np.empty(int(unit_of.max()) + 1, dtype=np.int64)
    module[unit_of] = layers.unit_of
    return module


def module_units(graph, max_units: int):
    """Options module_units (ColocRL, Mars): the module layers whole as ``Units`` (``module_labels`` over single
    ops), at most ``max_units`` of them, or None where the step order does not interleave the layers."""
    from devplace.learn.features import capped_units

    module_of_op = module_labels(graph, np.arange(graph.n_ops))
    return None if module_of_op is None else capped_units(graph, module_of_op, max_units)


def with_layers(unit_devices: np.ndarray, moved: np.ndarray, layer_of_unit: np.ndarray) -> np.ndarray:
    """Option layer_moves: (K, U) devices where every unit of a layer (``layer_of_unit``) one of whose units
    ``moved`` takes that unit's new device (the last moved one's, in unit order, if several of a layer moved).
    A slice of the step holds the forward ops of some layers and the backward ops of others, so moving it
    alone adds transfers between a layer's forward and backward ops; moving the layers whole does not.

    >>> with_layers(np.array([[1, 0, 0, 0]]), np.array([[True, False, False, False]]), np.array([0, 1, 0, 1]))
    array([[1, 0, 1, 0]])
    """
    out = np.array(unit_devices, dtype=np.int64, copy=True)
    for row, moves in zip(out, moved):
        units = np.flatnonzero(moves)
        if len(units):
            layer_device = np.full(int(layer_of_unit.max()) + 1, -1, dtype=np.int64)
            layer_device[layer_of_unit[units]] = row[units]
            follow = layer_device[layer_of_unit]
            row[follow >= 0] = follow[follow >= 0]
    return out


def layer_labels(graph, unit_of: np.ndarray) -> np.ndarray:
    """Option layer_moves: per unit (``unit_of``: colocation units), its layer: each forward op with the
    backward and update ops that follow it, colocation groups whole (``placers._moves.leader_units``, closed:
    sim-search's coarse units when its co-placement groups degenerate)."""
    from devplace.placers._moves import leader_units

    n_units = int(unit_of.max()) + 1
    layer = np.empty(n_units, dtype=np.int64)
    layer[unit_of] = leader_units(graph, closed=True).unit_of    # a closed leader unit is a union of colocation units
    return layer


class CriticalMoves:
    """Option critical_share (devplace's variant; the papers sample every placement from the policy): rows that
    are the best placement so far (the centre) with one of sim-search's moves read off the centre's simulated
    schedule, over Baechi's co-placement groups (sim-search's coarse units): half the time a *pull* (of two
    consecutive ops of the critical path on different devices, the one that waits goes to the producer's device or
    the producer to the waiter's, evenly), else an *unload* (a critical-path op on the busiest device, or any op
    there, goes to the least busy device with its group). A move sets every unit (``unit_of``) its group touches.

    Measured on RNNLM (benchmarks/rounds/learning-placers.md, round 7b): from the expert (115.96 ms), a greedy search
    over these moves, each placement scored in the faster of its topological and upward-rank orders as the
    learners score theirs, reaches 108.43 ms within 6-17 candidates (seeds 0-2); over random co-placement groups
    it ends at 111.81, 115.90 and 112.85 ms after 3,000 (``benchmarks/learner_orders.py``); sim-search itself
    scored that way (no carried order) ends at 108.03. The learners' own moves (slices of the step, their
    layers) never beat the expert there in 10 minutes."""

    def __init__(self, graph, cluster, unit_of: np.ndarray, orders: tuple[str, ...]):
        from devplace.placers._moves import Units
        from devplace.transforms import coplacement_groups

        self.env = PlacementEnv(graph, cluster, np.arange(graph.n_ops), orders)
        self.unit_of = unit_of
        self.groups = Units.from_labels(graph, coplacement_groups(graph))
        self._centre: np.ndarray | None = None
        self._schedule = None        # the centre's (critical path, cross-device pairs on it, busy time per device)

    def schedule(self, centre_units: np.ndarray, carried: np.ndarray | None):
        """The centre's critical path, its (waiting op, producer) pairs on different devices and each device's busy
        time, in the order the centre scores best in (simulated again only when the centre changes)."""
        if self._centre is None or not np.array_equal(self._centre, centre_units):
            devices = np.ascontiguousarray(centre_units[self.unit_of], dtype=np.int64)
            priority = self.env.order_of(devices, carried)
            result = self.env.sim.run(Placement(devices=devices, priority=priority))
            self._centre, self._schedule = centre_units.copy(), critical_crossings(result, devices)
        return self._schedule

    def draw(self, centre_units: np.ndarray, carried: np.ndarray | None, k: int,
             generator: torch.Generator) -> np.ndarray:
        """(k, U) devices: the centre, each row with one pull or unload move."""
        path, pairs, busy = self.schedule(centre_units, carried)
        devices = centre_units[self.unit_of]
        hot, cold = int(np.argmax(busy)), int(np.argmin(busy))
        on_hot = path[devices[path] == hot]
        on_hot = on_hot if len(on_hot) else np.flatnonzero(devices == hot)
        rows = np.repeat(centre_units[None], k, axis=0)
        for row in rows:
            coin, side, pick = torch.rand(3, generator=generator).tolist()
            if len(pairs) and coin < 0.5:
                waiting, producer = pairs[int(pick * len(pairs))]
                op, target = (waiting, devices[producer]) if side < 0.5 else (producer, devices[waiting])
            elif hot != cold and len(on_hot):
                op, target = on_hot[int(pick * len(on_hot))], cold
            else:
                continue        # one device does all the work and no path crosses: nothing to move
            row[np.unique(self.unit_of[self.groups.members(int(self.groups.unit_of[op]))])] = target
        return rows


class _Carrying:
    """The evaluator, each placement also simulated in the run's carried order (option carry_order; without
    it ``state.carried`` stays None and nothing changes)."""

    def __init__(self, rollouts, state: _State):
        self.rollouts, self.state = rollouts, state

    def evaluate(self, unit_devices: np.ndarray):
        return self.rollouts.evaluate(unit_devices, self.state.carried)


SEARCH_KINDS = ("search", "critical")   # samples of no policy decision (module_alone_share, critical_share)


@dataclasses.dataclass
class Update:
    """What one policy update reports to the loop: the placements it sampled, their outcomes, the mean
    entropy per decision, its loss and, if the learner tells them apart, each sample's kind (``reinforce``:
    deviation, search, critical or fresh), so the figures say which kind found the gains (``gain_us_by``)."""

    unit_devices: np.ndarray
    outcomes: object
    entropy: float
    loss: float
    kinds: list[str] | None = None


# one update: (placements to sample, generator, run state, the batch evaluator, the reward) -> Update
UpdateStep = Callable[[int, torch.Generator, "_State", object, Reward], Update]


def reinforce(name: str, graph, cluster, unit_of: np.ndarray, policy: torch.nn.Module,
              sample: Callable[[int, torch.Generator, float, np.ndarray | None], Sample], options: ReinforceOptions,
              seed: int, clone: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Placement:
    """Train ``policy`` (whose ``sample(k, generator, noise_std, centre, fresh=False)`` gives K device rows per
    unit, around ``centre`` when it is not None: option deviate_from=best; every decision drawn when ``fresh``:
    option fresh_share) by REINFORCE and return the best placement that fits, with the run's figures in
    ``Placement.options``.
    ``clone(targets)`` is the policy's log-probability of one device per unit (needed for option ``init``)."""
    if options.deviate_from not in ("greedy", "best"):
        raise DevplaceError(f"{name}: option deviate_from={options.deviate_from!r} must be greedy or best")
    if options.fresh_share > 0 and options.deviate_from != "best":
        raise DevplaceError(f"{name}: option fresh_share needs deviate_from=best (without it every sample is "
                            f"already drawn from the policy)")
    if not 0 <= options.fresh_share <= 1:
        raise DevplaceError(f"{name}: option fresh_share={options.fresh_share} must be between 0 and 1")
    if options.boundary_moves > 0 and options.deviate_from != "best":
        raise DevplaceError(f"{name}: option boundary_moves needs deviate_from=best (boundaries of the best "
                            f"placement so far)")
    if not 0 <= options.critical_share < 1 or (options.critical_share > 0 and options.deviate_from != "best"):
        raise DevplaceError(f"{name}: option critical_share={options.critical_share} must be in [0, 1) and needs "
                            f"deviate_from=best (moves from the best placement so far)")
    if (options.layer_moves or options.module_moves > 0 or options.module_alone_share > 0) and \
            options.deviate_from != "best":
        raise DevplaceError(f"{name}: options layer_moves, module_moves and module_alone_share need "
                            f"deviate_from=best (layers moved from the best placement so far)")
    if options.module_spread < 0:
        raise DevplaceError(f"{name}: option module_spread={options.module_spread} must be at least 0 (1.5: "
                            f"sim-search's layer search)")
    for field in ("module_alone_share", "module_idle_share"):
        if not 0 <= getattr(options, field) <= 1:
            raise DevplaceError(f"{name}: option {field}={getattr(options, field)} must be between 0 and 1")
    if options.fresh_share + options.module_alone_share > 1:
        raise DevplaceError(f"{name}: options fresh_share + module_alone_share = "
                            f"{options.fresh_share + options.module_alone_share} must be at most 1 (shares of a batch)")
    wants_modules = options.module_moves > 0 or options.module_alone_share > 0
    modules = module_labels(graph, unit_of) if wants_modules else None
    compute_us = unit_compute_us(graph, cluster, unit_of) if modules is not None and options.module_idle_share > 0 \
        else None
    optimizer = torch.optim.Adam(policy.parameters(), lr=options.learning_rate)
    moves = CriticalMoves(graph, cluster, unit_of, options.orders()) if options.critical_share > 0 else None

    def shifted(rows: np.ndarray, around: np.ndarray, expected: float, generator, spread: float = 0.0) -> np.ndarray:
        """``rows`` with ``expected`` whole modules moved from ``around`` and each other with chance ``spread`` /
        modules (options module_moves, module_idle_share, module_spread)."""
        busy_us = None if compute_us is None else busy_of(around, compute_us)
        return module_shifts(rows, around, modules, expected, cluster.n_devices, generator, busy_us,
                             options.module_idle_share, spread)

    def step(k, generator, state, rollouts, reward) -> Update:
        noise = options.logit_noise_std if state.update < options.noise_updates else 0.0
        around = centre(state) if options.deviate_from == "best" else None
        critical = min(int(options.critical_share * k + 0.5), k - 1) if around is not None and moves else 0
        fresh = min(int(options.fresh_share * k + 0.5), k - critical) if around is not None else 0
        alone = min(k - critical - fresh, int(options.module_alone_share * k + 0.5)) if around is not None and \
            modules is not None else 0
        parts, kinds = [], []
        if k - critical - fresh - alone:   # the policy's deviations from the best (or its samples, without a centre)
            drawn = sample(k - critical - fresh - alone, generator, noise, around)
            if around is not None and modules is not None and options.module_moves > 0:
                drawn.actions = torch.from_numpy(shifted(drawn.actions.numpy(), around, options.module_moves,
                                                         generator))
            parts.append(drawn)
            kinds += ["deviation" if around is not None else "policy"] * (k - critical - fresh - alone)
        if alone:     # search samples: the best with one module moved, no policy decision, so nothing credited
            rows = torch.from_numpy(shifted(np.tile(around, (alone, 1)), around, 1.0, generator, options.module_spread))
            parts.append(Sample(rows, torch.zeros(alone), torch.zeros(alone)))
            kinds += ["search"] * alone
        if fresh:     # the last `fresh` rows are drawn from the policy whole, so a run can leave the best's basin
            parts.append(sample(fresh, generator, noise, None, fresh=True))
            kinds += ["fresh"] * fresh
        drawn = Sample(*(torch.cat([getattr(part, f) for part in parts]) for f in ("actions", "log_prob", "entropy")))
        unit_devices = drawn.actions.numpy()
        if critical:  # option critical_share: sim-search's moves from the best, no policy decision, so nothing credited
            unit_devices = np.concatenate([unit_devices, moves.draw(around, state.carried, critical, generator)])
            kinds += ["critical"] * critical
        outcomes = rollouts.evaluate(unit_devices)
        mine = np.asarray([kind not in SEARCH_KINDS for kind in kinds])
        if not mine.any():     # only search samples: the policy and its baseline are left as they are
            return Update(unit_devices, outcomes, math.nan, math.nan, kinds)
        rewards = reward(outcomes)[mine]
        drawn_mine = torch.from_numpy(mine[:len(drawn.log_prob)])     # the critical rows, last, were not drawn
        log_prob, entropy = drawn.log_prob[drawn_mine], drawn.entropy[drawn_mine]
        if state.baseline is None:
            state.baseline = float(rewards.mean())
        if options.kind_baselines:
            advantage = kind_advantages(rewards, [kind for kind, m in zip(kinds, mine) if m], state.kind_moments,
                                        options.baseline_decay, options.normalize_advantage)
        else:
            advantage = rewards - state.baseline
            if options.normalize_advantage and len(rewards) > 1:
                advantage = advantage / (rewards.std() + 1e-8)
        loss = -(torch.as_tensor(advantage, dtype=torch.float32) * log_prob).mean()
        if options.entropy_weight:
            loss = loss - options.entropy_weight * entropy.mean()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(options, state.update)
        optimizer.zero_grad()
        loss.backward()
        if options.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), options.grad_clip)
        optimizer.step()
        state.baseline = options.baseline_decay * state.baseline + (1 - options.baseline_decay) * float(rewards.mean())
        return Update(unit_devices, outcomes, float(entropy.detach().mean()), float(loss.detach()), kinds)

    return train(name, graph, cluster, unit_of, policy, optimizer, step, options, seed, clone)


def train(name: str, graph, cluster, unit_of: np.ndarray, policy: torch.nn.Module, optimizer: torch.optim.Optimizer,
          step: UpdateStep, options: WholePlacementOptions, seed: int,
          clone: Callable[[torch.Tensor], torch.Tensor] | None = None,
          starts: dict[str, np.ndarray] | None = None) -> Placement:
    """The loop every learner shares: fit the warm start if asked (``clone``, option ``init``; ``starts``: the
    candidates' placements when the learner has computed them already, ``warm_start``'s result), then run
    ``step`` until the budget is spent, keeping the best placement that fits, checkpointing, logging and
    reporting progress; return that placement, in the fastest of option ``schedule_orders`` (``PlacementEnv``)."""
    if options.samples < 1 or options.samples_per_update < 1:
        raise DevplaceError(f"{name}: options samples and samples_per_update must be at least 1")
    if options.init and clone is None:
        raise DevplaceError(f"{name}: option init is not supported by this learner; leave it empty")
    reward = Reward(options.failing_step_s, options.oom_penalty_s_per_gib)
    orders = options.orders()
    generator = torch.Generator().manual_seed(seed)
    identity = _identity(name, graph, cluster, seed, options)
    checkpoint = Path(options.checkpoint) if options.checkpoint else None
    if options.resume and checkpoint is None:
        raise DevplaceError(f"{name}: option resume needs option checkpoint=PATH")
    state = _State()
    if options.resume and checkpoint.exists():
        state = _load(checkpoint, identity, policy, optimizer, generator)
        if clone is not None and state.init_units is not None:
            with torch.no_grad():    # show the learner its warm start again (its anchor), as cloning did
                clone(torch.from_numpy(state.init_units))
    began = time.perf_counter() - state.wall_s
    stopped_by = "samples"
    task = progress.current()
    task.begin(name, total=options.samples)
    whole = PlacementEnv(graph, cluster, np.arange(graph.n_ops), orders)   # refuses unknown orders, scores whole placements
    with one_thread(), evaluator(graph, cluster, unit_of, workers=options.workers, ray=options.ray,
                                 ray_address=options.ray_address, orders=orders) as rollouts:
        if options.init and state.update == 0 and state.samples == 0:
            deadline = math.inf if options.time_budget_s is None else began + options.time_budget_s
            _clone(state, name, graph, cluster, unit_of, policy, clone, options, seed, deadline, whole, starts)
            state.wall_s = time.perf_counter() - began
        while state.samples < options.samples:
            if options.time_budget_s is not None and time.perf_counter() - began >= options.time_budget_s:
                stopped_by = "time"
                break
            k = min(options.samples_per_update, options.samples - state.samples)
            done = step(k, generator, state, _Carrying(rollouts, state), reward)
            floor_us = min(state.best_step_us, math.inf if state.init_step_us is None else state.init_step_us)
            best = _keep_best(state, done.unit_devices, done.outcomes)
            if best is not None and done.kinds is not None and state.best_step_us < floor_us < math.inf:
                kind = done.kinds[best]
                state.gain_us_by[kind] = state.gain_us_by.get(kind, 0.0) + floor_us - state.best_step_us
            if best is not None and options.carry_order and (
                    state.init_step_us is None or state.best_step_us < state.init_step_us):
                state.carried = whole.order_of(state.best_units[unit_of], state.carried)
            state.update += 1
            state.samples += k
            state.wall_s = time.perf_counter() - began
            state.rows.append({"update": state.update, "wall_s": round(state.wall_s, 3), "samples": state.samples,
                               "best_step_us": state.best_step_us, "mean_step_us": float(done.outcomes.step_us.mean()),
                               "batch_best_step_us": _batch_best_us(done.outcomes),
                               "entropy": done.entropy, "loss": done.loss})
            if checkpoint is not None and state.update % options.checkpoint_every == 0:
                _save(checkpoint, identity, policy, optimizer, generator, state)
            task.update(state.samples, best_step_us=state.best_step_us if state.best_units is not None else None)
    task.end()
    if checkpoint is not None:
        _save(checkpoint, identity, policy, optimizer, generator, state)
    if options.log and state.rows:
        write_log(options.log, state.rows, f"{name} on {graph.meta.get('name', 'graph')} ({cluster.name})")
    learned = state.best_units is not None and (state.init_step_us is None or state.best_step_us < state.init_step_us)
    if not learned and state.init_step_us is None:
        raise _nothing_fits(name, cluster, state)
    devices = np.asarray(state.best_units, dtype=np.int64)[unit_of] if learned else state.init_devices
    figures = {"updates": state.update, "samples_simulated": state.samples, "stopped_by": stopped_by,
               "train_s": round(state.wall_s, 3), "units": int(unit_of.max()) + 1,
               "step_us": state.best_step_us if learned else state.init_step_us,
               "gain_us_by": state.gain_us_by}
    if options.init:
        figures |= {"init": state.init_source, "init_candidates": state.init_candidates,
                    "init_step_us": state.init_step_us, "init_fit": state.init_fit,
                    "init_updates_done": state.init_updates_done, "learned_step_us": state.best_step_us,
                    "returned": "learned" if learned else "init"}
    return Placement(devices=devices, priority=whole.order_of(devices, state.carried), options=figures)


def _batch_best_us(outcomes) -> float:
    """The fastest fitting placement of one update's batch (inf if none fits): with the batch's mean, whether the
    policy's own samples improve, apart from the best so far, which a warm start or one lucky sample may set."""
    fits = ~outcomes.oom
    return float(outcomes.step_us[fits].min()) if fits.any() else math.inf


def _keep_best(state: _State, unit_devices: np.ndarray, outcomes) -> int | None:
    """Keep the fastest fitting sample if it beats the best so far (its row then), and the least overflow."""
    improved = None
    fits = np.flatnonzero(~outcomes.oom)
    if len(fits):
        i = int(fits[np.argmin(outcomes.step_us[fits])])
        if outcomes.step_us[i] < state.best_step_us:
            state.best_step_us, state.best_units = float(outcomes.step_us[i]), unit_devices[i].copy()
            improved = i
    i = int(np.argmin(outcomes.over_bytes))
    if outcomes.over_bytes[i] < state.least_over_bytes:
        state.least_over_bytes, state.least_peak_bytes = float(outcomes.over_bytes[i]), outcomes.peak_memory_bytes[i]
    return improved


def _nothing_fits(name: str, cluster, state: _State) -> OutOfMemoryError:
    peaks = ", ".join(f"{d.name!r} {p / GIB:.3f} of {m / GIB:.3f} GiB"
                      for d, p, m in zip(cluster.devices, state.least_peak_bytes, cluster.memory_bytes))
    return OutOfMemoryError(
        f"{name} sampled {state.samples} placements and none fits memory: the least overflow is "
        f"{state.least_over_bytes / GIB:.3f} GiB (peak per device: {peaks}); raise samples, set "
        f"oom_penalty_s_per_gib=1 to steer towards fitting, or give the devices more memory"
    )
