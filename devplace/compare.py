"""Run several placers on one graph and cluster and line their results up.

A placer that fails (out of memory, say) gets its row with the reason; the
others still run. Progress (rows done, best step time so far) goes to ``devplace.progress``.

Rows are named by placer specs, ``ALGO[+opt][+fwd]`` (``devplace.portfolio.variants``), the one
syntax ``--algos`` takes. The default rows are every registered placer plus ``+opt`` for Baechi's
three (the paper's configuration, and the only one that places a 30k-op graph in seconds).

``robust=N`` also re-simulates every placement under N perturbed cost models (``devplace.robust``:
op and link costs scaled by seeded random factors) and gives each row the median and worst step
time over them: a placement that is fast only while every estimate is right shows it there.

>>> "m-sct+opt" in default_algos()
True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import numpy as np

from devplace import progress
from devplace.cluster import Cluster
from devplace.errors import DevplaceError, OutOfMemoryError
from devplace.graph import OpGraph
from devplace.placement import Placement
from devplace.portfolio import available, parse_algo, place
from devplace.robust import check_count, perturbed_models, ranks, robust_step_times
from devplace.sim import SimResult, simulate

OPTIMIZED_BY_DEFAULT = ("m-topo", "m-etf", "m-sct")


def default_algos() -> list[str]:
    """Every placer registered to run by default (not the exact solver nor the learners: ask for them
    by name), then Baechi's placers with their optimizations (``+opt``)."""
    names = [name for name, info in available().items() if info.by_default]
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
    robust_median_us: float | None = None   # over ``robust`` perturbed cost models; None when not asked
    robust_worst_us: float | None = None
    gap_to_bound: float | None = None       # step time / certified lower bound - 1 (devplace.bounds)
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
    lower_bound: dict | None = None  # devplace.bounds.lower_bounds: every bound and the best (None: none found)

    @property
    def best(self) -> CompareRow | None:
        ok = [r for r in self.rows if r.error is None and not r.oom]
        return min(ok, key=lambda r: r.step_time_us) if ok else None

    def ranks(self) -> dict[str, tuple[int | None, int | None, int | None]]:
        """Each row's rank (1: fastest) by nominal, robust median and robust worst step time, among
        the rows that placed and fit (None elsewhere, and for the robust ranks when not asked)."""
        ok = [r.error is None and not r.oom for r in self.rows]
        columns = [ranks([getattr(r, key) if fits else None for r, fits in zip(self.rows, ok)])
                   for key in ("step_time_us", "robust_median_us", "robust_worst_us")]
        return {row.algorithm: tuple(column[i] for column in columns) for i, row in enumerate(self.rows)}


def compare(
    graph: OpGraph,
    cluster: Cluster,
    algos: Iterable[str] | None = None,
    *,
    seed: int = 0,
    options: dict[str, dict] | None = None,
    on_row: Callable[[CompareRow], None] | None = None,
    robust: int = 0,
    robust_seed: int = 0,
) -> Comparison:
    """Place with each algorithm spec (``default_algos()`` by default) and simulate each placement.

    ``options[spec]`` adds placer options for one row; ``on_row`` sees each row as it finishes.
    ``robust > 0`` adds each row's median and worst step time over that many perturbed cost models
    drawn with ``robust_seed`` (the same models for every row).
    """
    robust = check_count("--robust", robust)
    models = perturbed_models(graph, cluster, robust, robust_seed) if robust else []
    names = list(algos) if algos is not None else default_algos()
    for spec in names:
        parse_algo(spec)  # refuse a misspelt name before placing anything
    options = options or {}
    rows: list[CompareRow] = []
    placements: dict[str, Placement] = {}
    results: dict[str, SimResult] = {}
    reporter = progress.current()
    reporter.begin("compare", total=len(names))
    try:
        for done, name in enumerate(names):
            fastest = [r.step_time_us for r in rows if r.error is None and not r.oom]
            reporter.update(done, best_step_us=min(fastest) if fastest else None, note=f"placing {name}")
            rows.append(_row(graph, cluster, name, seed, options.get(name, {}), placements, results))
            if models and name in placements:
                times = robust_step_times(graph, cluster, placements[name], models)
                rows[-1].robust_median_us, rows[-1].robust_worst_us = times.median_us, times.worst_us
            if on_row is not None:
                on_row(rows[-1])
    finally:
        reporter.end()
    single = next((r for r in rows if r.algorithm == "single" and r.step_time_us), None)
    if single is not None:
        for row in rows:
            if row.step_time_us:
                row.speedup_vs_single = single.step_time_us / row.step_time_us
    bound = _lower_bound(graph, cluster, placements)
    if bound is not None and bound["best_us"] > 0:
        for row in rows:
            if row.step_time_us is not None and row.error is None:
                row.gap_to_bound = row.step_time_us / bound["best_us"] - 1.0
    return Comparison(graph, cluster, rows, placements, results, bound)


def _lower_bound(graph: OpGraph, cluster: Cluster, placements: dict[str, Placement]) -> dict | None:
    """The certified lower bounds (well under a second on 25k ops), raised to the bound an ``exact``
    row proved (``exact_mip_us``: its program relaxes the simulator on this graph; not ``exact+opt``,
    whose bound holds only for placements that keep the fused groups together), or None when memory
    alone proves nothing fits (every row then says so itself)."""
    from devplace.bounds import lower_bounds

    try:
        bound = lower_bounds(graph, cluster)
    except DevplaceError:
        return None
    proven = [p.options["mip_bound_us"] for spec, p in placements.items() if parse_algo(spec) == ("exact", {})]
    if proven:
        bound["exact_mip_us"] = max(proven)
        if bound["exact_mip_us"] > bound["best_us"]:
            bound |= {"best_us": bound["exact_mip_us"], "best": "exact_mip_us"}
    return bound


def _row(graph, cluster, name: str, seed: int, options: dict, placements: dict, results: dict) -> CompareRow:
    """Place with one spec and simulate it; a failure becomes the row's error, never an exception."""
    row = CompareRow(algorithm=name)
    try:
        placement = place(graph, cluster, algo=name, seed=seed, **options)
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
    return row
