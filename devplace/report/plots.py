"""Pictures of a comparison: step times, the best placement's timeline, memory, and the placement.

matplotlib with the Agg backend (no screen needed); every figure is written through a temporary
file and a rename.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from devplace.fileio import write_bytes_atomic  # noqa: E402
from devplace.sim.result import SimResult  # noqa: E402

SMALL_GRAPH_OPS = 300


def _save(fig, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue())


def _device_colors(n_devices: int) -> list:
    cmap = plt.get_cmap("tab10" if n_devices <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n_devices)]


def step_time_bars(rows, path: Path, title: str) -> None:
    """Horizontal bars of simulated step time per placer; failed placers are listed, not drawn."""
    ok = sorted((r for r in rows if r.step_time_us is not None), key=lambda r: r.step_time_us)
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(ok), 2) + 1.2))
    names = [r.algorithm + (" (OOM)" if r.oom else "") for r in ok]
    times_ms = [r.step_time_us / 1e3 for r in ok]
    colors = ["#c44" if r.oom else "#4477aa" for r in ok]
    ax.barh(names[::-1], times_ms[::-1], color=colors[::-1])
    for y, t in enumerate(times_ms[::-1]):
        ax.text(t, y, f" {t:.2f}", va="center", fontsize=8)
    failed = [r.algorithm for r in rows if r.step_time_us is None]
    ax.set_xlabel("simulated step time (ms)")
    ax.set_title(title + (f"\nno placement: {', '.join(failed)}" if failed else ""), fontsize=10)
    _save(fig, path)


def gantt(result: SimResult, path: Path, title: str) -> None:
    """Ops per device over time (one row per device), transfers on a thin row beneath."""
    c = result.cluster
    colors = _device_colors(c.n_devices)
    fig, ax = plt.subplots(figsize=(11, 0.6 * c.n_devices + 1.5))
    for d in range(c.n_devices):
        on = np.flatnonzero(result.devices == d)
        spans = [(result.start_us[i] / 1e3, max((result.finish_us[i] - result.start_us[i]) / 1e3, 1e-6)) for i in on]
        ax.broken_barh(spans, (d - 0.4, 0.55), facecolors=colors[d], edgecolor="none")
        xfers = np.flatnonzero(result.transfer_dst == d)
        spans = [(result.transfer_start_us[x] / 1e3, (result.transfer_end_us[x] - result.transfer_start_us[x]) / 1e3) for x in xfers]
        ax.broken_barh(spans, (d + 0.2, 0.2), facecolors="#999999", edgecolor="none")
    ax.set_yticks(range(c.n_devices), [dev.name for dev in c.devices])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms); grey: transfers arriving on the device")
    ax.set_title(title, fontsize=10)
    _save(fig, path)


def memory_over_time(result: SimResult, path: Path, title: str) -> None:
    c = result.cluster
    colors = _device_colors(c.n_devices)
    fig, ax = plt.subplots(figsize=(10, 4))
    for d, dev in enumerate(c.devices):
        times, used = result.memory_timeline(d)
        if len(times):
            ax.step(times / 1e3, used / 2**30, where="post", color=colors[d], label=dev.name)
        ax.axhline(dev.memory_bytes / 2**30, color=colors[d], linestyle=":", linewidth=0.8)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("memory in use (GiB); dotted: capacity")
    ax.legend(fontsize=8, ncol=min(c.n_devices, 4))
    ax.set_title(title, fontsize=10)
    _save(fig, path)


def placement_picture(result: SimResult, path: Path, title: str) -> None:
    """Ops coloured by device: the graph drawn by topological level when small, else a
    level-by-time map (each op a dot at its start time and depth)."""
    g, c = result.graph, result.cluster
    colors = _device_colors(c.n_devices)
    level = np.zeros(g.n_ops, dtype=np.int64)
    for u in g.topo_order:
        preds = g.predecessors(u)
        if len(preds):
            level[u] = level[preds].max() + 1
    op_colors = [colors[d] for d in result.devices]
    if g.n_ops <= SMALL_GRAPH_OPS:
        fig, ax = plt.subplots(figsize=(12, 6))
        slot = np.zeros(g.n_ops)
        counts: dict[int, int] = {}
        for u in g.topo_order:
            slot[u] = counts.get(int(level[u]), 0)
            counts[int(level[u])] = slot[u] + 1
        x, y = level.astype(float), slot
        for e in range(g.n_edges):
            s, t = g.edge_src[e], g.edge_dst[e]
            cross = result.devices[s] != result.devices[t]
            ax.plot([x[s], x[t]], [y[s], y[t]], color="#d33" if cross else "#ccc", linewidth=0.6 if cross else 0.4, zorder=1)
        ax.scatter(x, y, c=op_colors, s=18, zorder=2, edgecolors="none")
        ax.set_xlabel("topological level (red edges cross devices)")
        ax.set_yticks([])
    else:
        fig, ax = plt.subplots(figsize=(12, 6))
        ax.scatter(result.start_us / 1e3, level, c=op_colors, s=3, edgecolors="none")
        ax.set_xlabel("start time (ms)")
        ax.set_ylabel("topological level")
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=colors[d], label=dev.name) for d, dev in enumerate(c.devices)]
    ax.legend(handles=handles, fontsize=8, loc="upper right")
    ax.set_title(title, fontsize=10)
    _save(fig, path)
