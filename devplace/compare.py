"""Run several placers on one graph and cluster and line their results up.

A placer that fails (out of memory, no rule for this graph) gets its row with the reason; the
others still run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import numpy as np

from devplace.cluster import Cluster
from devplace.errors import DevplaceError
from devplace.graph import OpGraph
from devplace.placement import Placement
from devplace.placers import available, place
from devplace.sim import SimResult, simulate


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
    """Place with each algorithm (all registered ones by default) and simulate each placement."""
    names = list(algos) if algos is not None else list(available())
    options = options or {}
    rows: list[CompareRow] = []
    placements: dict[str, Placement] = {}
    results: dict[str, SimResult] = {}
    for name in names:
        row = CompareRow(algorithm=name)
        try:
            placement = place(graph, cluster, algo=name, seed=seed, **options.get(name, {}))
        except DevplaceError as exc:
            row.error = str(exc)
            row.oom = "does not fit" in str(exc) or "memory" in type(exc).__name__.lower()
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
