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

This package is the bottom layer: a placer here places on its own and never imports what sits
above it (``devplace.portfolio``, which combines placers and parses ``ALGO+opt+fwd`` specs,
``compare``, ``report``, ``cli``). Placers that run other placers register from the portfolio
into the same registry, so ``available()`` is the one list of placers; ``devplace.place`` (the
portfolio's front door) validates options, runs a placer, times it and checks its result.

>>> {"m-etf", "sim-search", "colocrl"} <= set(available())
True
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

import numpy as np

from devplace.errors import OutOfMemoryError, PlacementError
from devplace.placement import Placement
from devplace.placers.options import NO_OPTIONS, NoOptions, describe_options


@dataclass(frozen=True)
class PlacerInfo:
    name: str
    summary: str
    function: Callable
    module: str
    options: type = NoOptions
    by_default: bool = True   # False: compare runs it only when asked by name (it trains or solves for long)

    def run(self, graph, cluster, *, seed: int, options) -> Placement:
        """Call the placer with validated ``options``; its result as a Placement (a placer may return
        plain device indices)."""
        result = self.function(graph, cluster, seed=seed, options=options)
        return result if isinstance(result, Placement) else Placement(devices=np.asarray(result, dtype=np.int64))

    def describe(self) -> dict:
        """Name, summary, declared options and whether compare runs it by default (``devplace algos --json``)."""
        return {"name": self.name, "summary": self.summary, "options": describe_options(self.options),
                "by_default": self.by_default}


_REGISTRY: dict[str, PlacerInfo] = {}
_LOADED = False


def register(name: str, summary: str, options: type = NoOptions, *, by_default: bool = True) -> Callable:
    """Decorator: make ``function`` available as ``algo=name``, taking the options ``options`` declares.
    ``by_default=False`` keeps it out of ``compare``'s default rows (a placer that trains or solves
    for long is run when named)."""

    def wrap(function: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name].function is not function:
            raise RuntimeError(f"two placers registered as {name!r}")
        _REGISTRY[name] = PlacerInfo(name, summary, function, function.__module__, options, by_default)
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
    """Every registered placer by name: this package's and the portfolio's (imported with ``devplace``)."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def placer(name: str) -> PlacerInfo:
    """The placer registered as ``name``, or a PlacementError listing the names there are."""
    placers = available()
    if name not in placers:
        raise PlacementError(f"no placer named {name!r}: use one of {', '.join(placers)}")
    return placers[name]


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


__all__ = ["register", "available", "placer", "check_feasible", "PlacerInfo", "NO_OPTIONS"]
