"""Pictures of a comparison: step times, the best placement's timeline, memory, and the placement.

matplotlib with the Agg backend (no screen needed); every figure is written through a temporary
file and a rename.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors  # noqa: E402
import matplotlib.patches  # noqa: E402
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
    wide = bool(times_ms) and max(times_ms) > 10 * min(times_ms)  # else the good placers are slivers
    if wide:
        ax.set_xscale("log")
    ax.set_xlabel("simulated step time (ms" + (", log scale)" if wide else ")"))
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
    """Memory in use per device over the step; capacity lines only when usage comes near them, so a
    small model's curves are not squashed flat against an 8 GiB ceiling."""
    c = result.cluster
    colors = _device_colors(c.n_devices)
    timelines = [result.memory_timeline(d) for d in range(c.n_devices)]
    peak = max((float(used.max()) for _, used in timelines if len(used)), default=0.0)
    unit, scale = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20)) if peak >= s), ("KiB", 2**10))
    show_capacity = peak >= 0.25 * float(c.memory_bytes.min())
    fig, ax = plt.subplots(figsize=(10, 4))
    for d, dev in enumerate(c.devices):
        times, used = timelines[d]
        if len(times):  # hold the last level to the end of the step
            times, used = np.append(times, max(result.step_time_us, times[-1])), np.append(used, used[-1])
            ax.step(times / 1e3, used / scale, where="post", color=colors[d], label=dev.name)
        if show_capacity:
            ax.axhline(dev.memory_bytes / scale, color=colors[d], linestyle=":", linewidth=0.8)
    capacities = sorted({f"{m / 2**30:.2f} GiB" for m in c.memory_bytes})
    ax.set_xlim(0, result.step_time_us / 1e3 * 1.01)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel(f"memory in use ({unit})" + ("; dotted: capacity" if show_capacity else ""))
    ax.legend(fontsize=8, ncol=min(c.n_devices, 4), title=None if show_capacity else f"capacity {', '.join(capacities)}",
              title_fontsize=8)
    ax.set_title(title, fontsize=10)
    _save(fig, path)


def placement_picture(result: SimResult, path: Path, title: str) -> None:
    """Ops coloured by device: the graph drawn by topological level when small (a person can follow
    edges), else a layer-by-time heat map (``layer_time_heatmap``)."""
    if result.graph.n_ops > SMALL_GRAPH_OPS:
        layer_time_heatmap(result, path, title)
        return
    g, c = result.graph, result.cluster
    colors = _device_colors(c.n_devices)
    level = topological_depth(g)
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
    ax.scatter(x, y, c=[colors[d] for d in result.devices], s=18, zorder=2, edgecolors="none")
    ax.set_xlabel("topological level (red edges cross devices)")
    ax.set_yticks([])
    ax.legend(handles=_device_handles(c, colors), fontsize=8, loc="upper right")
    ax.set_title(title, fontsize=10)
    _save(fig, path)


def _device_handles(cluster, colors) -> list:
    return [matplotlib.patches.Patch(color=colors[d], label=dev.name) for d, dev in enumerate(cluster.devices)]


def topological_depth(graph) -> np.ndarray:
    """Longest path from a source to each op, in ops."""
    depth = [0] * graph.n_ops
    ptr, succ = graph.succ_ptr.tolist(), graph.edge_dst[graph.succ_edge].tolist()
    for u in graph.topo_order.tolist():
        below = depth[u] + 1
        for v in succ[ptr[u]:ptr[u + 1]]:
            if depth[v] < below:
                depth[v] = below
    return np.asarray(depth, dtype=np.int64)


def op_scope_parts(graph) -> list[list[str]]:
    """Each op's module path as parts: ``meta['op_scope']`` of a captured graph, else the dotted
    prefix of its name (``encoder.layers.0.mm`` -> ``encoder``, ``layers``, ``0``)."""
    scopes = graph.meta.get("op_scope")
    if isinstance(scopes, list) and len(scopes) == graph.n_ops:
        return [scope.split(".") if scope else [] for scope in scopes]
    return [name.split(":", 1)[-1].replace("/", ".").split(".")[:-1] for name in graph.names]


def _scope_rows(parts: list[list[str]], max_rows: int) -> "tuple[np.ndarray, list[str]] | None":
    """Rows from module paths when most ops have one: the deepest prefix length that gives at most
    ``max_rows`` scopes (ops without a path share one row)."""
    if sum(1 for p in parts if p) < 0.5 * len(parts):
        return None
    best = None
    for k in range(1, max(len(p) for p in parts) + 1):
        scopes = [".".join(p[:k]) if p else "(no module)" for p in parts]
        if len(set(scopes)) > max_rows:
            break
        best = scopes
    if best is None or len(set(best)) < 2:
        return None
    labels = sorted(set(best))
    index = {label: i for i, label in enumerate(labels)}
    return np.array([index[s] for s in best], dtype=np.int64), labels


def layer_time_heatmap(result: SimResult, path: Path, title: str, *, max_rows: int = 40, time_bins: int = 160) -> None:
    """Rows = layers (module scopes when op names carry them, else bins of topological depth),
    columns = time bins, colour = the device that computed most of that layer in that bin (paler
    when it was busy for less of the bin). Shows at a glance which device runs which part when."""
    g, c = result.graph, result.cluster
    colors = np.array([matplotlib.colors.to_rgb(x) for x in _device_colors(c.n_devices)])
    depth = topological_depth(g)
    scoped = _scope_rows(op_scope_parts(g), max_rows)
    if scoped is not None:
        row, labels = scoped
        ylabel = "layer (module path of the ops)"
    else:
        n_rows = int(min(max_rows, depth.max() + 1))
        edges = np.linspace(0, depth.max() + 1, n_rows + 1)
        row = np.clip(np.searchsorted(edges, depth, side="right") - 1, 0, n_rows - 1)
        labels = [f"depth {int(np.ceil(edges[i]))}-{int(np.ceil(edges[i + 1])) - 1}" for i in range(n_rows)]
        ylabel = "layer: bin of topological depth (forward at the top, then backward, update)"
    # order rows by the depth of their forward ops (model order: embedding, layers, head), so the
    # forward pass runs down the picture and the backward pass back up; rows without forward ops
    # go by the depth of all their ops
    n_rows = len(labels)
    forward = g.role == 0
    mean_fwd = np.bincount(row[forward], weights=depth[forward], minlength=n_rows)
    n_fwd = np.bincount(row[forward], minlength=n_rows)
    mean_all = np.bincount(row, weights=depth, minlength=n_rows) / np.maximum(np.bincount(row, minlength=n_rows), 1)
    order = np.argsort(np.where(n_fwd > 0, mean_fwd / np.maximum(n_fwd, 1), mean_all), kind="stable")
    rank = np.empty(n_rows, dtype=np.int64)
    rank[order] = np.arange(n_rows)
    row, labels = rank[row], [labels[i] for i in order]

    span_us = max(float(result.step_time_us), 1e-9)
    width = span_us / time_bins
    busy = np.zeros((n_rows, time_bins, c.n_devices))
    start, finish = np.asarray(result.start_us, float), np.asarray(result.finish_us, float)
    b0 = np.clip((start / width).astype(np.int64), 0, time_bins - 1)
    b1 = np.clip((np.maximum(finish - 1e-9, start) / width).astype(np.int64), 0, time_bins - 1)
    one = b0 == b1
    # an op shorter than a bin still shows: at least 2% of the bin
    np.add.at(busy, (row[one], b0[one], result.devices[one]), np.maximum(finish[one] - start[one], 0.02 * width))
    for i in np.flatnonzero(~one):
        for b in range(b0[i], b1[i] + 1):
            overlap = min(finish[i], (b + 1) * width) - max(start[i], b * width)
            busy[row[i], b, result.devices[i]] += max(overlap, 0.0)
    total = busy.sum(axis=2)
    dominant = busy.argmax(axis=2)
    strength = np.where(total > 0, 0.35 + 0.65 * np.clip(total / width, 0, 1), 0.0)[..., None]
    image = 1.0 - strength * (1.0 - colors[dominant])

    fig, ax = plt.subplots(figsize=(12, max(4.0, 0.22 * n_rows + 1.6)))
    ax.imshow(image, aspect="auto", interpolation="nearest", extent=(0, span_us / 1e3, n_rows - 0.5, -0.5))
    ax.set_yticks(range(n_rows), labels, fontsize=7 if n_rows > 25 else 8)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel(ylabel, fontsize=8)
    ax.legend(handles=_device_handles(c, colors), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"{title}\n{g.n_ops} ops; colour: device computing most of the layer in the time bin "
                 f"(paler = busy less of the bin)", fontsize=10)
    _save(fig, path)
