"""Placing algorithms: one module per algorithm, one signature, one registry.

Each module declares its options as a frozen dataclass (``devplace.placers.options``), defines
``place(graph, cluster, *, seed, options)`` returning a ``Placement`` (or an array of device
indices, one per op) and registers both::

    @dataclass(frozen=True)
    class HeftOptions:
        insertion: bool = option(True, "fill idle gaps on a device")

    @register("heft", "HEFT list scheduling", HeftOptions)
    def place(graph, cluster, *, seed=0, options=HeftOptions()): ...

A placer without options registers without a class and receives ``NO_OPTIONS``.
``devplace.place`` validates the user's options against the class (a misspelt or mistyped one is a
``PlacementError`` naming the valid ones), runs the placer, times it, and refuses a result that
splits a colocation group or overflows a device's memory in simulation, so every caller can trust it.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> place(chain_graph([1.0, 2.0]), uniform_cluster(2), algo="single").devices.tolist()
[0, 0]
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from devplace.costing import costed_for
from devplace.errors import OutOfMemoryError, PlacementError
from devplace.placement import Placement, graph_fingerprint
from devplace.placers.options import NO_OPTIONS, NoOptions, describe_options, parse_options


@dataclass(frozen=True)
class PlacerInfo:
    name: str
    summary: str
    function: Callable
    module: str
    options: type = NoOptions

    def describe(self) -> dict:
        """Name, summary and declared options (``devplace algos --json``)."""
        return {"name": self.name, "summary": self.summary, "options": describe_options(self.options)}


_REGISTRY: dict[str, PlacerInfo] = {}
_LOADED = False


def register(name: str, summary: str, options: type = NoOptions) -> Callable:
    """Decorator: make ``function`` available as ``algo=name``, taking the options ``options`` declares."""

    def wrap(function: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name].function is not function:
            raise RuntimeError(f"two placers registered as {name!r}")
        _REGISTRY[name] = PlacerInfo(name, summary, function, function.__module__, options)
        return function

    return wrap


def _load_all() -> None:
    """Import every module of this package once, so each registers itself."""
    global _LOADED
    if _LOADED:
        return
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    _LOADED = True


def available() -> dict[str, PlacerInfo]:
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def place(
    graph, cluster, algo: str = "m-sct", seed: int = 0, check: bool = True, *,
    coplacement: bool = False, fusion: bool = False, forward_only: bool = False, **options,
) -> Placement:
    """Place ``graph`` on ``cluster`` with the algorithm registered as ``algo``.

    ``coplacement``, ``fusion`` and ``forward_only`` apply Baechi's graph optimizations
    (``devplace.transforms``): the placer sees the smaller graph, its placement (and priorities) are
    expanded back, and the check runs on the original graph. ``options['coarse_ops']`` records the
    size of the graph the placer saw.
    """
    graph = costed_for(graph, cluster)  # times for this cluster's devices (re-costed or refused)
    placers = available()
    if algo not in placers:
        raise PlacementError(f"no placer named {algo!r}: use one of {', '.join(placers)}")
    info = placers[algo]
    config = parse_options(info.options, options, algo)
    optimized = coplacement or fusion or forward_only
    began = time.perf_counter()
    if optimized:
        from devplace.transforms import optimize

        coarsening = optimize(graph, coplacement=coplacement, fusion=fusion, forward_only=forward_only)
        coarse = info.function(coarsening.graph, cluster, seed=seed, options=config)
        result = coarsening.expand_placement(coarse)
    else:
        result = info.function(graph, cluster, seed=seed, options=config)
    elapsed = time.perf_counter() - began
    if not isinstance(result, Placement):
        result = Placement(devices=np.asarray(result, dtype=np.int64))
    result.algorithm = algo
    result.options = {"seed": seed, **asdict(config)} | result.options
    if optimized:
        result.options |= {
            "coplacement": coplacement, "fusion": fusion, "forward_only": forward_only,
            "original_ops": graph.n_ops, "coarse_ops": coarsening.graph.n_ops,
        }
    result.placement_time_s = elapsed
    result.device_names = cluster.device_names
    result.graph_fingerprint = graph_fingerprint(graph.names)
    if check:
        check_feasible(graph, cluster, result)
    return result


def check_feasible(graph, cluster, placement: Placement) -> None:
    """Raise unless the placement keeps colocation groups together and fits memory in simulation."""
    from devplace.sim import simulate

    placement.check(graph, cluster)
    split = placement.colocation_violations(graph)
    if split:
        raise PlacementError(
            f"placer {placement.algorithm!r} split colocation group(s) {', '.join(map(repr, split[:5]))} "
            f"across devices; this is a bug in the placer"
        )
    result = simulate(graph, cluster, placement)
    if result.oom_devices:
        raise OutOfMemoryError(
            f"placement by {placement.algorithm!r} does not fit: " + "; ".join(result.overflow_report())
        )


__all__ = ["register", "place", "available", "check_feasible", "PlacerInfo", "NO_OPTIONS"]
