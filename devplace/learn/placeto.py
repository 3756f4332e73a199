"""Placeto: a graph neural network that places graphs it has never seen, one unit at a time.

"Placeto: Learning Generalizable Device Placement Algorithms for Distributed Machine Learning"
(Addanki et al., NeurIPS 2019). Read top to bottom:

1. ``PlacetoOptions``: the hyper-parameters, each with where its default comes from;
2. ``unit_graph``: the placement units (forward ops with their backward ops, fused; consecutive
   ones merged beyond ``max_units``) and the coarse graph the episode simulates, so a step costs one simulation
   of at most ``max_units`` units, never of the original ops;
3. ``node_features``: what the policy sees of each unit (the paper's list: compute cost, output
   size, current device, visited, current, simulated start time; plus memory need), and the
   ancestor / descendant sets the embedding pools over;
4. the network, the episode and the training loop are in ``placeto_policy`` (torch, imported only
   when Placeto runs): message passing along the edges (topological order) and against them, means
   over the current unit's ancestors, descendants and parallel units, an MLP to a device
   distribution; an episode visits every unit once in step order and may move it; REINFORCE with a
   per-step reward (the drop in simulated step time), a per-step-index baseline and an entropy bonus.

A policy is trained on graphs (``devplace train placeto``, or ``train_policy``) and then places
any graph zero-shot (``algo="placeto", policy=FILE``); ``finetune_samples`` trains it on the graph
first. The device count is part of the policy (its per-device inputs and outputs): a policy made
for another count is refused. Without ``policy`` the one shipped in ``devplace/data`` is used.

>>> PlacetoOptions().learning_rate, PlacetoOptions().grad_clip, PlacetoOptions().memory_penalty_s_per_gib
(0.001, 1.25, 2.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from numba import njit

from devplace.errors import DevplaceError, OutOfMemoryError
from devplace.learn.env import GIB, PlacementEnv
from devplace.learn.features import capped_units, cross_unit_edges, unit_majority
from devplace.placers import register
from devplace.placers._memory import check_can_fit
from devplace.placers.options import option
from devplace.transforms import colocation_units, coplacement_groups, fuse

NAME = "placeto"
SCRATCH = "scratch"
RANDOM = "random"


# ----------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class PlacetoOptions:
    """Placeto's hyper-parameters. From the authors' public code: Adam at 1e-3 decayed linearly to 1e-4,
    gradient norm clipped to 1.25, discount 1, a baseline per step index averaged over past episodes,
    memory penalty 2 x (GiB over) added to the run time and capped, the per-step drop in (log) run time
    as the reward. The paper gives the node features and the pooling over ancestors, descendants and
    parallel nodes. Our choices, not the authors': episodes start from an algorithmic placement
    (``start``: the fastest that fits of the listed placers, each unit on the device most of its ops
    have) rather than the paper's random one, so each step's reward is its improvement over a good
    placement, and a placing episode returns the better of its start and its best state (on the
    original graph); ``start="random"`` is the paper's configuration; entropy weight 0.01 decaying to 0.001 (the authors' 1.0
    goes with their reward in seconds; ours is a log ratio), 3 message-passing rounds each way (the code
    has 8; fewer keeps an episode cheap, not compared here), embeddings refreshed every ``refresh_every``
    steps rather than every step."""

    policy: str = option("", "policy file (from `devplace train placeto`); empty: the shipped one for the "
                             "cluster's device count; 'scratch': a new, untrained policy")
    finetune_samples: int = option(0, "simulated placements to fine-tune the policy on this graph first "
                                      "(0: zero-shot, one greedy episode)")
    start: str = option("expert,m-etf+opt,accelerate-auto",
                        "placers (comma-separated) whose fastest placement that fits is where every episode "
                        "starts (ours); 'random': a random start drawn from the seed (the paper's); random too "
                        "when none fits")
    max_units: int = option(1000, "most placement units (forward ops fused with their backward ops; "
                                  "consecutive ones merge beyond it)")
    refresh_every: int = option(0, "steps between recomputing the embedding and start times (0: so that an "
                                   "episode has at most 64; 1: every step, as the paper)")
    incremental_from_units: int = option(1000, "training episodes over at least this many units re-simulate each "
                                               "move only from where it can change the step (devplace.sim.incremental: "
                                               "the same figures; on GNMT-8 0.95x the time at 100 units, 1.04x at "
                                               "1,000, 1.31x faster at 10,000); below it, a whole simulation per move")
    learning_rate: float = option(0.001, "Adam learning rate at the start (authors' code: 1e-3)")
    final_learning_rate: float = option(0.0001, "learning rate at the end of the budget, reached linearly "
                                                "(authors' code: 1e-4)")
    grad_clip: float = option(1.25, "clip the gradient's global norm to this (authors' code: 1.25)")
    entropy_weight: float = option(0.01, "weight of the entropy bonus, decayed linearly to a tenth of it")
    memory_penalty_s_per_gib: float = option(2.0, "seconds added to the step time per GiB over a device's "
                                                  "memory (authors' code: 2 per GB)")
    memory_penalty_cap_s: float = option(10.0, "most seconds the memory penalty adds (the authors cap it)")
    baseline_window: int = option(20, "past episodes of a graph whose mean return per step index is the baseline")
    time_budget_s: float | None = option(None, "stop fine-tuning after this many seconds (None: samples only)")
    log: str = option("", "write the fine-tuning log to this CSV file and its curve beside it (.png)")


# ------------------------------------------------------------------------------------------- units
@dataclass(eq=False)
class UnitGraph:
    """A graph as Placeto sees it: units, the coarse graph an episode simulates, features, ancestry."""

    graph: object              # the original OpGraph
    cluster: object
    env: PlacementEnv          # the fused graph with per coarse op its unit: one simulation per step
    unit_of_op: np.ndarray     # per original op, its unit
    n_units: int
    edge_src: np.ndarray       # unit -> unit edges (distinct, no self loops)
    edge_dst: np.ndarray
    edge_bytes: np.ndarray
    neighbour_ptr: np.ndarray  # neighbours of unit i (either direction): neighbour_unit[ptr[i]:ptr[i + 1]]
    neighbour_unit: np.ndarray
    neighbour_bytes: np.ndarray
    compute_us: np.ndarray     # per unit, its ops' time averaged over the devices
    need_bytes: np.ndarray     # per unit, its ops' persistent, output and temporary bytes
    static: np.ndarray         # (units, N_STATIC) the features that never change
    ancestors: np.ndarray      # (units, ceil(units / 8)) packed bits: unit j reaches unit i
    descendants: np.ndarray    # packed bits: unit i reaches unit j

    def expand(self, unit_devices: np.ndarray) -> np.ndarray:
        """Devices per unit -> devices per original op."""
        return np.asarray(unit_devices, dtype=np.int64)[self.unit_of_op]


def unit_graph(graph, cluster, max_units: int = 1000) -> UnitGraph:
    """Fuse each forward op with its backward ops and colocation groups (Baechi's co-placement without its
    single-consumer rule, which would fuse whole branches and leave nothing to place; fusion keeps the
    coarse graph acyclic), take its colocation units, merge consecutive ones beyond ``max_units``."""
    if max_units < 1:
        raise DevplaceError(f"{NAME}: option max_units is {max_units}: use 1 or more")
    coarse = fuse(graph, coplacement_groups(graph, single_consumer=False))
    units = capped_units(coarse.graph, colocation_units(coarse.graph), max_units)
    env = PlacementEnv(coarse.graph, cluster, units.unit_of)
    n = units.n_units
    src, dst = cross_unit_edges(coarse.graph, units.unit_of)
    edge_bytes_all = coarse.graph.edge_bytes[units.unit_of[coarse.graph.edge_src] != units.unit_of[coarse.graph.edge_dst]]
    key = src * n + dst
    distinct, inverse = np.unique(key, return_inverse=True)
    edge_bytes = np.bincount(inverse, weights=edge_bytes_all, minlength=len(distinct))
    edge_src, edge_dst = distinct // n, distinct % n
    compute = np.bincount(units.unit_of, weights=env.sim.op_time_us.mean(axis=1), minlength=n)
    cg = coarse.graph
    need = np.bincount(units.unit_of, weights=cg.persistent_bytes + cg.output_bytes + cg.temp_bytes, minlength=n)
    static = static_features(cluster, compute, need, edge_src, edge_bytes, n)
    ends = np.concatenate([edge_src, edge_dst])
    order = np.argsort(ends, kind="stable")
    return UnitGraph(graph=graph, cluster=cluster, env=env, unit_of_op=units.unit_of[coarse.coarse_of], n_units=n,
                     edge_src=edge_src, edge_dst=edge_dst, edge_bytes=edge_bytes,
                     neighbour_ptr=np.searchsorted(ends[order], np.arange(n + 1)),
                     neighbour_unit=np.concatenate([edge_dst, edge_src])[order],
                     neighbour_bytes=np.concatenate([edge_bytes, edge_bytes])[order], compute_us=compute,
                     need_bytes=need, static=static,
                     ancestors=reach_bits(n, edge_dst, edge_src), descendants=reach_bits(n, edge_src, edge_dst))


# ------------------------------------------------------------------------------------------- start
@dataclass(frozen=True)
class Start:
    """Where an episode starts: a device per unit (None: random), and the placer's own per-op placement
    (its devices and, for a list scheduler, its op priorities) with its simulated step time on the
    original graph (what a placing episode must beat)."""

    algo: str
    unit_devices: np.ndarray | None = None
    op_devices: np.ndarray | None = None
    step_us: float = float("inf")
    op_priority: np.ndarray | None = None


def start_placement(ug: UnitGraph, options: PlacetoOptions, seed: int) -> Start:
    """The fastest placement that fits among ``options.start``'s placers (a placer that cannot fit is
    skipped), as units on the device most of their ops have; random when none fits or ``start`` says so."""
    import devplace as dp

    names = [name.strip() for name in options.start.split(",") if name.strip()]
    if not names or names == [RANDOM]:
        return Start(RANDOM)
    if NAME in names or RANDOM in names:
        raise DevplaceError(f"{NAME}: option start is {options.start!r}: give placers other than {NAME} "
                            f"(e.g. expert,m-etf+opt), or 'random' alone")
    best = Start(RANDOM)
    for name in names:
        try:
            placed = dp.place(ug.graph, ug.cluster, algo=name, seed=seed)
        except OutOfMemoryError:
            continue
        result = dp.simulate(ug.graph, ug.cluster, placed)
        if result.fits and result.step_time_us < best.step_us:
            units = unit_majority(placed.devices, ug.unit_of_op, ug.cluster.n_devices, ug.n_units)
            best = Start(name, units, np.asarray(placed.devices), result.step_time_us, placed.priority)
    return best


# ---------------------------------------------------------------------------------------- features
N_STATIC = 6


def static_features(cluster, compute_us, need_bytes, edge_src, edge_bytes, n_units) -> np.ndarray:
    """(units, N_STATIC): compute cost and output transfer time relative to the mean unit's compute
    (so a family's small and large members look alike), memory need as a share of a device, the
    whole step's need as a share of the cluster's memory (is memory tight?), position in the step,
    and log(1 + units) (how big the graph is)."""
    mean_compute = max(float(compute_us.mean()), 1e-9) if n_units else 1.0
    off_diagonal = ~np.eye(cluster.n_devices, dtype=bool)
    bandwidth = float(cluster.bandwidth_bytes_per_us[off_diagonal].mean()) if cluster.n_devices > 1 else 1.0
    out_us = np.bincount(edge_src, weights=edge_bytes, minlength=n_units) / bandwidth
    memory = float(cluster.memory_bytes.min())
    columns = [np.log1p(compute_us / mean_compute), np.log1p(out_us / mean_compute), need_bytes / memory,
               np.full(n_units, need_bytes.sum() / float(cluster.memory_bytes.sum())),
               np.arange(n_units) / max(n_units - 1, 1), np.full(n_units, np.log1p(n_units) / 10.0)]
    return np.stack(columns, axis=1).astype(np.float32)


def n_node_features(n_devices: int) -> int:
    """Static features, then the current device (one-hot), visited, current, start time / step time."""
    return N_STATIC + n_devices + 3


def node_features(ug: UnitGraph, devices: np.ndarray, step: int, start_fraction: np.ndarray) -> np.ndarray:
    """(units, n_node_features) at ``step`` of the episode (units 0..step-1 visited, ``step`` current)."""
    n, n_dev = ug.n_units, ug.cluster.n_devices
    onehot = np.zeros((n, n_dev), dtype=np.float32)
    onehot[np.arange(n), devices] = 1.0
    visited = (np.arange(n) < step).astype(np.float32)
    current = (np.arange(n) == step).astype(np.float32)
    return np.concatenate([ug.static, onehot, visited[:, None], current[:, None],
                           start_fraction.astype(np.float32)[:, None]], axis=1)


def reach_bits(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """(n, ceil(n / 8)) packed bits (numpy's packbits order): row i has bit j when j is reachable from i
    along ``src -> dst``.

    Swept in reverse topological order, one sweep settles an acyclic unit graph; a unit graph with a
    cycle (fusion keeps a group in pieces) is swept again until nothing changes."""
    order = np.argsort(src, kind="stable")
    ptr = np.searchsorted(src[order], np.arange(n + 1))
    return _reach(n, ptr.astype(np.int64), dst[order].astype(np.int64))


@njit(cache=True)
def _reach(n, ptr, succ):
    indegree = np.zeros(n, dtype=np.int64)
    for k in range(len(succ)):
        indegree[succ[k]] += 1
    sweep = np.empty(n, dtype=np.int64)     # Kahn's order; units left on a cycle go last, by number
    head, tail = 0, 0
    for i in range(n):
        if indegree[i] == 0:
            sweep[tail] = i
            tail += 1
    while head < tail:
        i = sweep[head]
        head += 1
        for k in range(ptr[i], ptr[i + 1]):
            indegree[succ[k]] -= 1
            if indegree[succ[k]] == 0:
                sweep[tail] = succ[k]
                tail += 1
    acyclic = tail == n
    for i in range(n):
        if indegree[i] > 0:
            sweep[tail] = i
            tail += 1
    reach = np.zeros((n, (n + 7) // 8), dtype=np.uint8)
    changed = True
    while changed:
        changed = False
        for position in range(n - 1, -1, -1):
            i = sweep[position]
            for k in range(ptr[i], ptr[i + 1]):
                s = succ[k]
                for w in range(reach.shape[1]):
                    merged = reach[i, w] | reach[s, w]
                    if w == s >> 3:
                        merged |= np.uint8(0x80 >> (s & 7))
                    if merged != reach[i, w]:
                        reach[i, w] = merged
                        changed = True
        changed = changed and not acyclic
    return reach


def step_cost_s(step_us: np.ndarray, over_bytes: np.ndarray, options: PlacetoOptions) -> np.ndarray:
    """Step time in seconds plus the capped memory penalty: what the per-step reward is the drop of (in logs)."""
    penalty = np.minimum(options.memory_penalty_s_per_gib * np.asarray(over_bytes) / GIB, options.memory_penalty_cap_s)
    return np.asarray(step_us) / 1e6 + penalty


# ---------------------------------------------------------------------------------------- policies
def _shipped_folder() -> Path:
    return Path(str(resources.files("devplace") / "data"))


def shipped_device_counts() -> list[int]:
    """The device counts a policy is shipped for (``devplace/data/placeto-{N}dev.pt``)."""
    return sorted(int(p.name[len("placeto-"):-len("dev.pt")]) for p in _shipped_folder().glob("placeto-*dev.pt"))


def shipped_policy_path(n_devices: int) -> Path:
    """The pretrained policy shipped in the package for ``n_devices`` (made by benchmarks/generalization.py
    --train-shipped --devices N): the cluster's device count picks it."""
    path = _shipped_folder() / f"placeto-{n_devices}dev.pt"
    if not path.exists():
        counts = " and ".join(str(n) for n in shipped_device_counts()) or "no"
        raise DevplaceError(f"{NAME}: no shipped policy for {n_devices} devices (policies are shipped for {counts} "
                            f"devices); train one with `devplace train placeto --cluster C -o policy.pt` and pass "
                            f"--option policy=policy.pt")
    return path


def can_fit(graph, cluster) -> bool:
    """Whether some placement of the step could fit ``cluster`` (``check_can_fit``); a family's default
    cluster cannot hold a few of its members (an op or colocation group bigger than a device)."""
    try:
        check_can_fit(graph, cluster, NAME)
    except DevplaceError:
        return False
    return True


def family_graphs(names: list[str], cluster=None) -> tuple[list, list[str], list, list[str]]:
    """The training splits of the zoo graph families ``names`` (captured once, then cached): their graphs,
    targets and clusters (``cluster``, or each family's default cluster), less the members that cannot fit
    their cluster, whose targets come last."""
    from devplace.zoo import families

    graphs, targets, clusters, skipped = [], [], [], []
    for name in names:
        train, _ = families.split(name.strip())
        machine = cluster if cluster is not None else families.default_cluster(name.strip())
        for member in train:
            graph = families.load(member)
            if can_fit(graph, machine):
                graphs.append(graph), targets.append(member.target), clusters.append(machine)
            else:
                skipped.append(member.target)
    return graphs, targets, clusters, skipped


@register(NAME, "Placeto (NeurIPS 2019): a graph neural network moves one unit at a time; trained once, places "
          "unseen graphs zero-shot", PlacetoOptions, by_default=False)
def place(graph, cluster, *, seed: int = 0, options: PlacetoOptions = PlacetoOptions()):
    from devplace.learn import placeto_policy

    check_can_fit(graph, cluster, NAME)
    if options.finetune_samples < 0:
        raise DevplaceError(f"{NAME}: option finetune_samples is {options.finetune_samples}: use 0 or more")
    return placeto_policy.place(graph, cluster, seed=seed, options=options)


def train_policy(graphs, cluster, output, *, samples: int, seed: int = 0, options: PlacetoOptions = PlacetoOptions(),
                 hidden_size: int = 32, rounds: int = 3, meta: dict | None = None) -> dict:
    """Train a new policy on ``graphs`` (a family's training split) for ``samples`` simulated placements and
    write it to ``output``; returns the run's figures. ``cluster`` is one cluster, or a list with one per
    graph (a family's own machine); all must have the same device count."""
    from devplace.learn import placeto_policy

    if samples < 1:
        raise DevplaceError(f"{NAME}: samples is {samples}: use 1 or more")
    clusters = list(cluster) if isinstance(cluster, (list, tuple)) else [cluster] * len(graphs)
    if len(clusters) != len(graphs) or len({c.n_devices for c in clusters}) > 1:
        raise DevplaceError(f"{NAME}: give one cluster, or one per graph ({len(graphs)}) with the same device count")
    for g, c in zip(graphs, clusters):
        check_can_fit(g, c, NAME)
    return placeto_policy.train_new(graphs, clusters, output, samples=samples, seed=seed, options=options,
                                    hidden_size=hidden_size, rounds=rounds, meta=meta or {})
