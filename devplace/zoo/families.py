"""Graph families: many captured training-step graphs of one kind, for placers that must generalize.

Placeto trains on a family's training split and is judged on graphs it has never seen (the held-out
20%); Mars pre-trains its encoder on all of them. A family is a seeded sample of zoo configurations
from a documented grid, so the same seed always gives the same members, and each member is captured
once (roofline costs for ``CAPTURE_CLUSTER``'s devices, Adam, fixed batch) and cached as graph JSON.

>>> from devplace.zoo import families
>>> families.family_names()
['nasnet', 'recurrent', 'transformer']
>>> len(families.members("transformer")) >= 32
True
>>> train, held_out = families.split("transformer")
>>> len(train), len(held_out)
(32, 8)

The grids (every other key keeps the zoo default; ``batch`` is fixed per family):

- ``nasnet``: NASNet-like cell stacks (:mod:`devplace.zoo.nasnet`), ``stages`` 1-3 and
  ``cells_per_stage`` 1-4 with at most 7 cells in all (3 to 7 cells, about 2,600-6,100 ops),
  ``filters`` 8-44 (stem as wide), ``image_size`` 32-96, 10 classes, batch 16.
- ``recurrent``: half unrolled LSTM language models (``rnnlm``: ``layers`` 1-4, ``seq_len`` 5-30
  with layers x steps <= 60, ``hidden_units`` 256-1024, vocabulary 10,000, batch 64), half GNMT
  translation models (``gnmt``: ``layers`` 2-4, ``seq_len`` 3-8 with layers x steps <= 24,
  ``hidden_units`` 256-1024, vocabulary 10,000, batch 128).
- ``transformer``: BERT-like encoders (``layers`` 1-12, about 600-4,800 ops; ``hidden`` 128-768
  with 64-wide heads and a 4x feed-forward; ``seq_len`` 32-256; vocabulary 8,000; batch 16).

Widths do not change a graph's shape but do change its op times and memory, so members of one shape
still differ. Sizes are chosen so that one capture takes seconds here (capture cost grows with the
op count, not the widths: tracing uses fake tensors).

The cache: ``load(member)`` keeps graphs in ``cache_dir`` (default ``$DEVPLACE_CACHE/families``,
``DEVPLACE_CACHE`` defaulting to ``~/.cache/devplace``), one file per member key and
``CACHE_VERSION``; a file that does not load (truncated, edited) is captured again.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from devplace.errors import DevplaceError, GraphError

log = logging.getLogger("devplace")

MEMBERS_PER_FAMILY = 40
HELD_OUT_FRACTION = 0.2
# Roofline costs are for these devices; a graph placed on another cluster is re-costed from its FLOPs.
CAPTURE_CLUSTER = "baechi-4x2080"
# Bump when the capture (or what a member means) changes, so stale cache files are not read.
CACHE_VERSION = 1


@dataclass(frozen=True)
class Grid:
    """The configurations one zoo model contributes: every combination of ``axes`` (on top of
    ``fixed``) that ``fits``, completed by ``derive`` (keys that follow from others); ``share`` is
    this grid's fraction of the family's members."""

    model: str
    axes: dict
    fixed: dict
    fits: Callable[[dict], bool] = lambda config: True
    share: float = 1.0
    derive: Callable[[dict], dict] = lambda config: config

    def configs(self) -> list[dict]:
        keys = sorted(self.axes)
        out = []
        for values in itertools.product(*(self.axes[k] for k in keys)):
            config = {**self.fixed, **dict(zip(keys, values))}
            if self.fits(config):
                out.append(self.derive(config))
        return out


def _nasnet_cells(c: dict) -> int:
    """Cells of a NASNet stack: two stem cells, N per stage, a reduction cell before each later stage."""
    return 2 + c["stages"] * c["cells_per_stage"] + (c["stages"] - 1)


def _transformer_heads(c: dict) -> dict:
    """64-wide heads (4 below hidden 256) and BERT's 4x feed-forward."""
    return {**c, "heads": c["hidden"] // 64 if c["hidden"] >= 256 else 4, "ffn_units": 4 * c["hidden"]}


FAMILIES: dict[str, tuple[Grid, ...]] = {
    "nasnet": (
        Grid("nasnet", axes=dict(stages=(1, 2, 3), cells_per_stage=(1, 2, 3, 4), filters=(8, 16, 24, 32, 44),
                                 image_size=(32, 64, 96)),
             fixed=dict(classes=10, batch=16), fits=lambda c: _nasnet_cells(c) <= 7,
             derive=lambda c: {**c, "stem_filters": c["filters"]}),
    ),
    "recurrent": (
        Grid("rnnlm", axes=dict(layers=(1, 2, 3, 4), seq_len=(5, 10, 15, 20, 25, 30),
                                hidden_units=(256, 512, 1024)),
             fixed=dict(embedding_units=256, vocab=10000, batch=64),
             fits=lambda c: c["layers"] * c["seq_len"] <= 60, share=0.5),
        Grid("gnmt", axes=dict(layers=(2, 3, 4), seq_len=(3, 4, 5, 6, 8), hidden_units=(256, 512, 1024)),
             fixed=dict(vocab=10000, batch=128), fits=lambda c: c["layers"] * c["seq_len"] <= 24, share=0.5),
    ),
    "transformer": (
        Grid("transformer", axes=dict(layers=tuple(range(1, 13)), hidden=(128, 256, 384, 512, 768),
                                      seq_len=(32, 64, 128, 256)),
             fixed=dict(vocab=8000, batch=16), derive=_transformer_heads),
    ),
}


@dataclass(frozen=True)
class Member:
    """One graph of a family: zoo model ``model`` at ``config`` (sorted key/value pairs).

    ``key`` is stable across runs and machines (a digest of the zoo target), so it names the cache file.
    """

    family: str
    model: str
    config: tuple

    @property
    def target(self) -> str:
        """The zoo target, as ``devplace profile`` takes it."""
        return f"zoo:{self.model}:" + ",".join(f"{k}={v}" for k, v in self.config)

    @property
    def key(self) -> str:
        return f"{self.model}-{hashlib.sha256(self.target.encode()).hexdigest()[:12]}"


def family_names() -> list[str]:
    return sorted(FAMILIES)


def _grids(family: str) -> tuple[Grid, ...]:
    try:
        return FAMILIES[family]
    except KeyError:
        raise DevplaceError(f"no graph family {family!r}: families are {', '.join(family_names())}") from None


def members(family: str, seed: int = 0) -> list[Member]:
    """``MEMBERS_PER_FAMILY`` distinct configurations of ``family``, drawn by ``seed`` from its grids.

    The order is the draw's (random), so that ``split`` can cut it; the same seed gives the same list.
    """
    grids = _grids(family)
    rng = np.random.default_rng(seed)
    chosen: list[Member] = []
    for g, grid in enumerate(grids):
        configs = grid.configs()
        n = MEMBERS_PER_FAMILY - len(chosen) if g == len(grids) - 1 else round(MEMBERS_PER_FAMILY * grid.share)
        if n > len(configs):
            raise AssertionError(f"family {family!r}: grid of {grid.model} has {len(configs)} configurations, needs {n}")
        for i in rng.choice(len(configs), size=n, replace=False):
            chosen.append(Member(family, grid.model, tuple(sorted(configs[i].items()))))
    # interleave the grids, so a split holds out members of each
    return [chosen[i] for i in rng.permutation(len(chosen))]


def split(family: str, seed: int = 0) -> tuple[list[Member], list[Member]]:
    """``(train, held_out)``: the members of ``members(family, seed)``, the last 20% held out."""
    every = members(family, seed)
    n_held = max(1, round(len(every) * HELD_OUT_FRACTION))
    return every[:-n_held], every[-n_held:]


def default_cache_dir() -> Path:
    root = os.environ.get("DEVPLACE_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "devplace") / "families"


def cache_path(member: Member, cache_dir: "str | Path | None" = None) -> Path:
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return folder / f"v{CACHE_VERSION}" / member.family / f"{member.key}.json"


def _cached(member: Member, path: Path):
    """The graph in ``path`` if it is this member's, else None (a bad file is logged and rebuilt)."""
    from devplace.io import load_graph

    if not path.is_file():
        return None
    try:
        graph = load_graph(path)
    except GraphError as exc:
        log.warning("family cache file %s is unreadable (%s); capturing %s again", path, exc, member.target)
        return None
    if graph.meta.get("family_member", {}).get("target") != member.target:
        log.warning("family cache file %s holds another graph; capturing %s again", path, member.target)
        return None
    return graph


def capture(member: Member):
    """Capture ``member`` now (no cache): roofline costs for ``CAPTURE_CLUSTER``, Adam, foreach update."""
    from devplace.cluster import load_cluster
    from devplace.torchcapture import profile_target

    graph = profile_target(member.target, cluster=load_cluster(CAPTURE_CLUSTER))
    return graph.with_meta(family_member={"family": member.family, "key": member.key, "target": member.target})


def load(member: Member, cache_dir: "str | Path | None" = None):
    """The OpGraph of ``member``: from the cache, or captured (seconds) and cached atomically."""
    from devplace.io import save_graph

    path = cache_path(member, cache_dir)
    graph = _cached(member, path)
    if graph is None:
        graph = capture(member)
        save_graph(graph, path)
    return graph


def build(family: str, seed: int = 0, cache_dir: "str | Path | None" = None) -> list:
    """Load (capturing what is not cached) every member of ``family``, reporting progress; the graphs."""
    from devplace import progress

    every = members(family, seed)
    task = progress.current()
    task.begin(f"family {family}", total=len(every))
    graphs = []
    try:
        for done, member in enumerate(every, 1):
            graphs.append(load(member, cache_dir))
            task.update(done, note=f"{member.key} ({graphs[-1].n_ops:,} ops)")
    finally:
        task.end()
    return graphs


# Memory per device, as a fraction of the preset's 8 GiB: about a third of the family's largest
# simulated one-device peak (benchmarks/results/families.json, seed 0), so the four devices together
# offer more than any member's one-device peak while the larger members (8 to 18 of the 40 of each
# family) do not fit on one, and a placer must spread them. Offering the bytes is not being able to
# split them: some members cannot be placed at all (Placeto's benchmark skips 9 of the 48 training
# members it samples, and one held-out member only sim-search fits).
_MEMORY_FRACTION = {"nasnet": 0.01, "recurrent": 0.1, "transformer": 0.1}


def default_cluster(family: str, n_devices: int = 4):
    """The machine a family is placed on: 4 GPUs of ``CAPTURE_CLUSTER`` with memory cut to where it binds;
    with another ``n_devices``, that many of its GPUs holding the same memory in all (what Placeto's
    2-device policy is trained on)."""
    from devplace.cluster import load_cluster

    _grids(family)
    machine = load_cluster(CAPTURE_CLUSTER)
    fraction = _MEMORY_FRACTION[family] * machine.n_devices / n_devices
    if n_devices != machine.n_devices:
        machine = machine.with_devices(n_devices)
    return machine.with_memory_fraction(fraction)


__all__ = ["CACHE_VERSION", "CAPTURE_CLUSTER", "FAMILIES", "Grid", "Member", "build", "cache_path", "capture",
           "default_cache_dir", "default_cluster", "family_names", "load", "members", "split"]
