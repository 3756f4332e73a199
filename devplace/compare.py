"""Run several placers on one graph and cluster and line their results up.

A placer that fails (out of memory, no rule for this graph) gets its row with the reason; the
others still run.

Algorithm variants: a row is named ``ALGO[+VARIANT...]``, the one syntax ``--algos`` takes.
Variants switch on Baechi's graph optimizations before placing (``devplace.place`` options):

- ``+opt``: co-placement and operator fusion, as Baechi ran its placers (``m-sct+opt``);
- ``+fwd``: forward-operator-based placement (place forward ops, backward ops follow).

``m-sct+opt+fwd`` combines them. The default rows are every registered placer plus ``+opt`` for
Baechi's three (the paper's configuration, and the only one that places a 30k-op graph in seconds).

>>> parse_algo("m-sct+opt")
('m-sct', {'coplacement': True, 'fusion': True})
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import numpy as np

from devplace.cluster import Cluster
from devplace.errors import DevplaceError, OutOfMemoryError, PlacementError
from devplace.graph import OpGraph
from devplace.placement import Placement
from devplace.placers import available, place
from devplace.sim import SimResult, simulate


VARIANTS = {"opt": {"coplacement": True, "fusion": True}, "fwd": {"forward_only": True}}
OPTIMIZED_BY_DEFAULT = ("m-topo", "m-etf", "m-sct")


def parse_algo(spec: str) -> tuple[str, dict]:
    """``"m-sct+opt"`` -> ``("m-sct", {"coplacement": True, "fusion": True})``; refuses unknown names."""
    name, *variants = [part.strip() for part in spec.strip().split("+")]
    placers = available()
    if name not in placers:
        raise PlacementError(f"no placer named {name!r} in {spec!r}: use one of {', '.join(placers)}")
    options: dict = {}
    for variant in variants:
        if variant not in VARIANTS:
            raise PlacementError(
                f"unknown variant {variant!r} in {spec!r}: use ALGO+opt (co-placement + fusion) or ALGO+fwd"
            )
        options |= VARIANTS[variant]
    return name, options


def default_algos() -> list[str]:
    """Every registered placer but the learning ones (they train; ask for them by name), then Baechi's
    placers with their optimizations (``+opt``)."""
    names = [name for name, info in available().items() if not info.learned]
    return names + [f"{name}+opt" for name in OPTIMIZED_BY_DEFAULT if name in names]


@dataclass
class CompareRow:
    algorithm: str
    step_time_us: float | None = None
    speedup_vs_single: float | None = None
    placement_time_s: float | None = None
    peak_memory_bytes: list[float] = field(default_factory=list)
    bytes_moved: float | None = None
    devices_used: int | None = None
    oom: bool = False
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Comparison:
    graph: OpGraph
    cluster: Cluster
    rows: list[CompareRow]
    placements: dict[str, Placement]
    results: dict[str, SimResult]

    @property
    def best(self) -> CompareRow | None:
        ok = [r for r in self.rows if r.error is None and not r.oom]
        return min(ok, key=lambda r: r.step_time_us) if ok else None


def compare(
    graph: OpGraph,
    cluster: Cluster,
    algos: Iterable[str] | None = None,
    *,
    seed: int = 0,
    options: dict[str, dict] | None = None,
    on_row: Callable[[CompareRow], None] | None = None,
) -> Comparison:
    """Place with each algorithm spec (``default_algos()`` by default) and simulate each placement.

    ``options[spec]`` adds placer options for one row; ``on_row`` sees each row as it finishes.
    """
    names = list(algos) if algos is not None else default_algos()
    parsed = {spec: parse_algo(spec) for spec in names}  # refuse a misspelt name before placing anything
    options = options or {}
    rows: list[CompareRow] = []
    placements: dict[str, Placement] = {}
    results: dict[str, SimResult] = {}
    for name in names:
        row = CompareRow(algorithm=name)
        try:
            algo, variant = parsed[name]
            placement = place(graph, cluster, algo=algo, seed=seed, **variant, **options.get(name, {}))
        except DevplaceError as exc:
            row.error = str(exc)
            row.oom = isinstance(exc, OutOfMemoryError)
        except Exception as exc:  # noqa: BLE001 - a bug in one placer must not hide the other rows
            row.error = f"internal error in the placer ({type(exc).__name__}: {exc})"
        else:
            result = simulate(graph, cluster, placement)
            placements[name], results[name] = placement, result
            row.step_time_us = result.step_time_us
            row.placement_time_s = placement.placement_time_s
            row.peak_memory_bytes = result.peak_memory_bytes.tolist()
            row.bytes_moved = result.bytes_moved
            row.devices_used = int(len(np.unique(placement.devices)))
            row.oom = bool(result.oom_devices)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    single = next((r for r in rows if r.algorithm == "single" and r.step_time_us), None)
    if single is not None:
        for row in rows:
            if row.step_time_us:
                row.speedup_vs_single = single.step_time_us / row.step_time_us
    return Comparison(graph, cluster, rows, placements, results)
