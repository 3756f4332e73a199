"""Placeto's network, episode and training loop (torch, imported only when Placeto runs; see ``placeto``).

The network (``PlacetoNet``): the units' features are embedded, then passed along the edges
``rounds`` times (each unit hears its predecessors: topological order) and against them
``rounds`` times (reverse topological order), with PyTorch Geometric's ``SAGEConv``; the two
halves are joined. For the current unit, the head reads its embedding, the means of the
embeddings of its ancestors, its descendants and the units parallel to it (neither), and a few
inputs of the moment (its device, where its neighbours' bytes are, each device's share of the
compute), and gives a distribution over the devices. Nothing depends on the number of units, so
one policy places graphs of any size; the number of devices is fixed.

The episode (``run_episode``): units start where ``placeto.start_placement`` puts them (an
algorithmic placement, or random devices drawn from the seed: ``start``); they are
visited once, in step order; each may move. The embedding and the start times are refreshed every
``refresh`` steps (every step in the paper; 16 times an episode by default here, which is what
keeps a 1,000-unit episode cheap: see benchmarks/generalization.py), the head runs every step. Training simulates after every step for the reward;
placing does not (only at the refreshes, for the start times, keeping the best state seen), and
``place`` returns the better of that state and the start placer's own placement.

Training (``reinforce``): one episode per update; reward at step t is log(cost before) - log(cost
after), cost being the simulated step time plus the capped memory penalty, so an episode's return
is log(initial / final cost) whatever the graph's scale; discount 1; the baseline at step index t
is the mean return from t over the graph's last ``baseline_window`` episodes; entropy bonus; Adam
with the learning rate decayed linearly, gradient norm clipped.
"""

from __future__ import annotations

import io
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import SAGEConv

from devplace import progress
from devplace.errors import DevplaceError, OutOfMemoryError
from devplace.fileio import write_bytes_atomic
from devplace.learn.env import GIB
from devplace.learn.log import write_log
from devplace.learn.placeto import (NAME, SCRATCH, PlacetoOptions, Start, UnitGraph, n_node_features, node_features,
                                    shipped_policy_path, start_placement, step_cost_s, unit_graph)
from devplace.learn.train import one_thread, seeded
from devplace.placement import Placement
from devplace.sim import IncrementalSimulator
from devplace.sim import simulate as simulate_graph

FORMAT = "devplace-placeto-policy/2"   # 2: memory per device among the head's inputs
MAX_REFRESHES = 16


# ----------------------------------------------------------------------------------------- network
class PlacetoNet(nn.Module):
    def __init__(self, n_devices: int, hidden_size: int = 32, rounds: int = 3, head_size: int = 64):
        super().__init__()
        self.config = {"n_devices": n_devices, "hidden_size": hidden_size, "rounds": rounds, "head_size": head_size}
        self.embed_in = nn.Linear(n_node_features(n_devices), hidden_size)
        self.along = nn.ModuleList(SAGEConv(hidden_size, hidden_size) for _ in range(rounds))
        self.against = nn.ModuleList(SAGEConv(hidden_size, hidden_size) for _ in range(rounds))
        width = 2 * hidden_size
        self.head = nn.Sequential(nn.Linear(4 * width + n_fresh(n_devices), head_size), nn.ReLU(),
                                  nn.Linear(head_size, n_devices))

    def embed(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        """(units, 2 x hidden): message passing along the edges and against them."""
        start = torch.relu(self.embed_in(x))
        down = up = start
        for conv in self.along:
            down = torch.relu(conv(down, edges))
        for conv in self.against:
            up = torch.relu(conv(up, edges.flip(0)))
        return torch.cat([down, up], dim=1)

    def logits(self, embedding, current, pools, fresh) -> torch.Tensor:
        """(S, devices) for S current units: ``pools`` (S, 3, units) are mean weights over ancestors,
        descendants and parallel units; ``fresh`` (S, n_fresh) the inputs of the moment."""
        pooled = (pools @ embedding).flatten(1)
        return self.head(torch.cat([embedding[current], pooled, fresh], dim=1))


def n_fresh(n_devices: int) -> int:
    """Sizes of the three pools (share of units), the current device, neighbours' bytes per device, compute per
    device, memory need per device as a share of its memory (where a move would not fit)."""
    return 3 + 4 * n_devices


def pools(ug: UnitGraph, current: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((S, 3, units) mean weights, (S, 3) pool sizes as shares of the units) for the ``current`` units."""
    n = ug.n_units
    ancestors = np.unpackbits(ug.ancestors[current], axis=1, count=n).astype(bool)
    descendants = np.unpackbits(ug.descendants[current], axis=1, count=n).astype(bool)
    itself = np.zeros_like(ancestors)
    itself[np.arange(len(current)), current] = True
    parallel = ~(ancestors | descendants | itself)
    masks = np.stack([ancestors, descendants, parallel], axis=1).astype(np.float32)
    sizes = masks.sum(axis=2)
    return masks / np.maximum(sizes, 1.0)[:, :, None], sizes / n


def fresh_inputs(ug: UnitGraph, devices: np.ndarray, loads_us: np.ndarray, unit: int, sizes: np.ndarray,
                 memory_share: np.ndarray) -> np.ndarray:
    n_dev = ug.cluster.n_devices
    here = np.zeros(n_dev, dtype=np.float32)
    here[devices[unit]] = 1.0
    lo, hi = ug.neighbour_ptr[unit], ug.neighbour_ptr[unit + 1]
    near = np.bincount(devices[ug.neighbour_unit[lo:hi]], weights=ug.neighbour_bytes[lo:hi], minlength=n_dev)
    near = near / max(float(near.sum()), 1.0)
    load = loads_us / max(float(loads_us.sum()), 1e-9)
    return np.concatenate([sizes, here, near, load, np.minimum(memory_share, 2.0)]).astype(np.float32)


# ----------------------------------------------------------------------------------------- episode
def refresh_steps(n_units: int, options: PlacetoOptions) -> int:
    """Steps between refreshes of the embedding: the option, or so that an episode has at most MAX_REFRESHES."""
    if options.refresh_every < 0:
        raise DevplaceError(f"{NAME}: option refresh_every is {options.refresh_every}: use 0 (automatic) or more")
    return options.refresh_every or max(1, math.ceil(n_units / MAX_REFRESHES))


@dataclass
class Episode:
    actions: np.ndarray
    fresh: np.ndarray                   # (units, n_fresh) the head's inputs of the moment, per step
    segments: list                      # (first step, node features) per refresh
    costs_s: list = field(default_factory=list)   # cost before the first step, then after each (training)
    simulations: int = 0
    simulated_ops: int = 0              # dispatches those simulations made (less than simulations x ops: incremental)
    best_cost_s: float = math.inf       # of the states simulated that fit memory
    best_step_us: float = math.inf
    best_devices: np.ndarray | None = None
    least_over_bytes: float = math.inf


def simulate(ug: UnitGraph, devices: np.ndarray, options: PlacetoOptions, episode: Episode, with_start: bool,
             incremental: IncrementalSimulator | None = None, moved: int = -1):
    """Simulate the unit placement on the coarse graph; keep the best that fits; (cost, start fraction or None).
    With ``incremental`` (the run of ``devices``, but for unit ``moved`` when it is not a refresh) nothing is
    simulated again but what moving that unit can change: the same figures."""
    episode.simulations += 1
    if with_start:
        result = incremental.result() if incremental is not None else ug.env.sim.run(ug.env.expand(devices[None])[0])
        step_us = result.step_time_us
        over = float(np.maximum(result.peak_memory_bytes - ug.cluster.memory_bytes, 0.0).sum())
        start = np.full(ug.n_units, np.inf)
        np.minimum.at(start, ug.env.unit_of, result.start_us)
        start_fraction = start / max(step_us, 1e-9)
    else:
        outcome = (ug.env.evaluate(devices[None]) if incremental is None
                   else ug.env.move_unit(incremental, moved, int(devices[moved])))
        step_us, over, start_fraction = float(outcome.step_us[0]), float(outcome.over_bytes[0]), None
    cost = float(step_cost_s(step_us, over, options))
    episode.least_over_bytes = min(episode.least_over_bytes, over)
    if over <= 0 and cost < episode.best_cost_s:
        episode.best_cost_s, episode.best_step_us, episode.best_devices = cost, step_us, devices.copy()
    return cost, start_fraction


def initial_devices(n_units: int, n_devices: int, generator: torch.Generator) -> np.ndarray:
    """The arbitrary placement an episode starts from (the paper's s0): a device per unit, uniformly at random."""
    return torch.randint(n_devices, (n_units,), generator=generator).numpy().astype(np.int64)


def run_episode(net: PlacetoNet, ug: UnitGraph, refresh: int, options: PlacetoOptions, generator: torch.Generator,
                start: Start, *, sample: bool = True) -> Episode:
    """One pass over the units from ``start`` (random devices if it has none): with ``sample`` each move is drawn
    (and simulated, for the reward), else the likeliest device is taken and only the refreshes and the end are
    simulated. The start state is simulated first, so an episode's best state is never worse than its start."""
    n, n_dev = ug.n_units, ug.cluster.n_devices
    devices = initial_devices(n, n_dev, generator) if start.unit_devices is None else start.unit_devices.copy()
    loads = np.bincount(devices, weights=ug.compute_us, minlength=n_dev)
    memory = ug.cluster.memory_bytes.astype(np.float64)
    need = np.bincount(devices, weights=ug.need_bytes, minlength=n_dev)
    edges = torch.from_numpy(np.stack([ug.edge_src, ug.edge_dst]))
    episode = Episode(actions=np.empty(n, dtype=np.int64), fresh=np.empty((n, n_fresh(n_dev)), dtype=np.float32),
                      segments=[])
    # a training episode simulates after every move: incrementally, from the start's run, where that pays
    incremental = ug.env.incremental(devices) if sample and n >= options.incremental_from_units else None
    with torch.no_grad():
        for t in range(n):
            if t % refresh == 0:
                cost, start_fraction = simulate(ug, devices, options, episode, with_start=True, incremental=incremental)
                if t == 0:
                    episode.costs_s.append(cost)
                x = torch.from_numpy(node_features(ug, devices, t, start_fraction))
                episode.segments.append((t, x))
                embedding = net.embed(x, edges)
            weights, sizes = pools(ug, np.array([t]))
            episode.fresh[t] = fresh_inputs(ug, devices, loads, t, sizes[0], need / memory)
            logits = net.logits(embedding, torch.tensor([t]), torch.from_numpy(weights),
                                torch.from_numpy(episode.fresh[t:t + 1]))[0]
            if sample:
                action = int(torch.multinomial(torch.softmax(logits, dim=0), 1, generator=generator))
            else:
                action = int(torch.argmax(logits))
            episode.actions[t] = action
            loads[devices[t]] -= ug.compute_us[t]
            loads[action] += ug.compute_us[t]
            need[devices[t]] -= ug.need_bytes[t]
            need[action] += ug.need_bytes[t]
            devices[t] = action
            if sample:
                episode.costs_s.append(simulate(ug, devices, options, episode, with_start=False,
                                                incremental=incremental, moved=t)[0])
    if not sample:
        simulate(ug, devices, options, episode, with_start=False)   # the final state
    n_ops = ug.env.graph.n_ops
    episode.simulated_ops = episode.simulations * n_ops if incremental is None else n_ops + incremental.resimulated_ops
    return episode


def log_probs(net: PlacetoNet, ug: UnitGraph, episode: Episode) -> tuple[torch.Tensor, torch.Tensor]:
    """The episode's actions again, with gradients: (log probability, entropy) per step, a refresh at a time."""
    edges = torch.from_numpy(np.stack([ug.edge_src, ug.edge_dst]))
    ends = [t for t, _ in episode.segments[1:]] + [ug.n_units]
    log_p, entropy = [], []
    for (first, x), end in zip(episode.segments, ends):
        steps = np.arange(first, end)
        weights, _ = pools(ug, steps)
        logits = net.logits(net.embed(x, edges), torch.from_numpy(steps), torch.from_numpy(weights),
                            torch.from_numpy(episode.fresh[first:end]))
        all_log_p = torch.log_softmax(logits, dim=1)
        log_p.append(all_log_p[torch.arange(len(steps)), torch.from_numpy(episode.actions[first:end])])
        entropy.append(-(all_log_p.exp() * all_log_p).sum(dim=1))
    return torch.cat(log_p), torch.cat(entropy)


# ---------------------------------------------------------------------------------------- training
@dataclass
class Run:
    """A training run's figures, and per graph the best state seen (by index into its graphs)."""

    updates: int = 0
    samples: int = 0
    wall_s: float = 0.0
    stopped_by: str = "samples"
    best: dict = field(default_factory=dict)      # graph index -> Episode holding its best state
    rows: list = field(default_factory=list)


def reinforce(net: PlacetoNet, graphs: list[UnitGraph], starts: list[Start], options: PlacetoOptions, *,
              samples: int, seed: int, title: str) -> Run:
    """Train ``net`` on ``graphs`` (one drawn per episode, seeded; each episode from the graph's start) for
    ``samples`` simulated placements."""
    optimizer = torch.optim.Adam(net.parameters(), lr=options.learning_rate)
    generator = torch.Generator().manual_seed(seed)
    pick = np.random.default_rng(seed)
    history = [deque(maxlen=max(1, options.baseline_window)) for _ in graphs]
    run = Run()
    began = time.perf_counter()
    task = progress.current()
    task.begin(title, total=samples)
    while run.samples < samples:
        if options.time_budget_s is not None and time.perf_counter() - began >= options.time_budget_s:
            run.stopped_by = "time"
            break
        i = int(pick.integers(len(graphs)))
        ug = graphs[i]
        episode = run_episode(net, ug, refresh_steps(ug.n_units, options), options, generator, starts[i])
        log_cost = np.log(np.asarray(episode.costs_s))
        returns = (log_cost[:-1] - log_cost[-1]).astype(np.float32)   # sum of log(before / after) from step t on
        baseline = np.mean(history[i], axis=0) if history[i] else np.zeros_like(returns)
        history[i].append(returns)
        done = min(run.samples / samples, 1.0)
        for group in optimizer.param_groups:
            group["lr"] = options.learning_rate + (options.final_learning_rate - options.learning_rate) * done
        log_p, entropy = log_probs(net, ug, episode)
        loss = (-(torch.from_numpy(returns - baseline) * log_p).mean()
                - options.entropy_weight * (1.0 - 0.9 * done) * entropy.mean())
        optimizer.zero_grad()
        loss.backward()
        if options.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), options.grad_clip)
        optimizer.step()
        if i not in run.best or episode.best_cost_s < run.best[i].best_cost_s:
            run.best[i] = episode
        run.updates += 1
        run.samples += episode.simulations
        run.wall_s = time.perf_counter() - began
        run.rows.append({"update": run.updates, "wall_s": round(run.wall_s, 3), "samples": run.samples,
                         "best_step_us": run.best[i].best_step_us, "mean_step_us": episode.costs_s[-1] * 1e6,
                         "batch_best_step_us": episode.best_step_us,
                         "entropy": float(entropy.detach().mean()), "loss": float(loss.detach())})
        task.update(run.samples, best_step_us=None if len(graphs) > 1 else run.best[i].best_step_us)
    task.end()
    if options.log and run.rows:
        write_log(options.log, run.rows, title)
    return run


# ---------------------------------------------------------------------------------------- policies
def save_policy(path, net: PlacetoNet, meta: dict) -> None:
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "config": net.config, "state": net.state_dict(), "meta": meta}, buffer)
    write_bytes_atomic(path, buffer.getvalue())


def load_policy(path, cluster) -> tuple[PlacetoNet, dict]:
    """The policy in ``path``; refused with the reason if it is not one, or was made for another device count."""
    try:
        saved = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise DevplaceError(f"{NAME}: cannot read policy {str(path)!r} ({type(exc).__name__}): give a file "
                            f"written by `devplace train placeto`") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise DevplaceError(f"{NAME}: {str(path)!r} is not a Placeto policy (format {FORMAT}): give a file "
                            f"written by `devplace train placeto`")
    config = saved["config"]
    if config["n_devices"] != cluster.n_devices:
        raise DevplaceError(f"{NAME}: policy {str(path)!r} places on {config['n_devices']} devices but cluster "
                            f"{cluster.name!r} has {cluster.n_devices}: train a policy for {cluster.n_devices} devices "
                            f"(devplace train placeto --cluster {cluster.name} -o policy.pt) and pass "
                            f"--option policy=policy.pt")
    net = PlacetoNet(**config)
    net.load_state_dict(saved["state"])
    return net, dict(saved.get("meta", {}))


def train_new(graphs, clusters, output, *, samples: int, seed: int, options: PlacetoOptions, hidden_size: int,
              rounds: int, meta: dict) -> dict:
    with one_thread():
        units = [unit_graph(g, c, options.max_units) for g, c in zip(graphs, clusters)]
        starts = [start_placement(u, options, seed) for u in units]
        with seeded(seed):
            net = PlacetoNet(clusters[0].n_devices, hidden_size, rounds)
        run = reinforce(net, units, starts, options, samples=samples, seed=seed, title=f"{NAME} training")
    figures = {"updates": run.updates, "samples_simulated": run.samples, "train_s": round(run.wall_s, 3),
               "stopped_by": run.stopped_by, "graphs": len(graphs),
               "units": [u.n_units for u in units], "starts": [s.algo for s in starts]}
    save_policy(output, net, meta | {"clusters": sorted({c.name for c in clusters}), "seed": seed, "samples": samples,
                                     "start": options.start} | figures)
    return figures


def place(graph, cluster, *, seed: int, options: PlacetoOptions) -> Placement:
    with one_thread():
        ug = unit_graph(graph, cluster, options.max_units)
        if options.policy == SCRATCH:
            with seeded(seed):
                net, source = PlacetoNet(cluster.n_devices), SCRATCH
        else:
            path = options.policy or shipped_policy_path(cluster.n_devices)
            net, source = load_policy(path, cluster)[0], str(path)
        start = start_placement(ug, options, seed)
        candidates, figures = [], {}
        if options.finetune_samples > 0:
            run = reinforce(net, [ug], [start], options, samples=options.finetune_samples, seed=seed, title=f"{NAME} fine-tuning")
            candidates += list(run.best.values())
            figures = {"samples_simulated": run.samples, "updates": run.updates, "train_s": round(run.wall_s, 3),
                       "stopped_by": run.stopped_by}
        began = time.perf_counter()
        episode = run_episode(net, ug, refresh_steps(ug.n_units, options), options,
                              torch.Generator().manual_seed(seed), start, sample=False)
        episode_s = time.perf_counter() - began
    best = min([episode] + candidates, key=lambda e: e.best_cost_s)
    devices, priority, step_us, returned = start.op_devices, start.op_priority, start.step_us, "start"
    if best.best_devices is not None:
        learned = ug.expand(best.best_devices)
        result = simulate_graph(graph, cluster, Placement(devices=learned))
        if result.fits and result.step_time_us < step_us:
            devices, priority, step_us, returned = learned, None, result.step_time_us, "episode"
    if devices is None:
        least = min(e.least_over_bytes for e in [episode] + candidates)
        raise OutOfMemoryError(f"{NAME}: no placement it tried fits memory (least overflow {least / GIB:.3f} GiB); "
                               f"raise finetune_samples, or give the devices more memory")
    return Placement(devices=devices, priority=priority, options=figures | {
        "policy": source, "units": ug.n_units, "episode_s": round(episode_s, 4), "step_us": step_us,
        "start": start.algo, "start_step_us": start.step_us, "returned": returned})
