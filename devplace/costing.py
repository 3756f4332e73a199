"""Op times from FLOPs and bytes (roofline), and keeping a graph's times true to the cluster it meets.

A captured graph records which device each of its time columns was costed for (``meta["costed_for"]``:
kind -> the device's model and peak figures) and how (``meta["cost_model"]``). ``costed_for`` is
called where a graph meets a cluster (placing, simulating): if the cluster's devices of a kind are
not the ones the graph was costed for, a roofline graph is re-costed from its stored per-op FLOPs,
bytes and dtypes, and a measured graph is refused, since its times hold only for the device that
ran them. Without this an RTX 2080 graph simulated silently on V100s with 2080 times.

Roofline: an op takes max(FLOPs / peak for its dtype, bytes / memory bandwidth) / efficiency plus a
kernel launch. bf16 and fp16 ops use the device's tensor-core peaks where it has them; a device
without one runs them at its fp32 peak, and the graph's ``cost_notes`` say so.
"""

from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np

from devplace.cluster import Cluster, Device
from devplace.errors import ClusterError

# Achieved fraction of peak, and the fixed cost of launching one kernel, per device kind.
EFFICIENCY = 0.6
LAUNCH_US = {"gpu": 5.0, "cpu": 1.0}
DEFAULT_LAUNCH_US = 5.0
ROOFLINE = "roofline"
# dtype name (as torch prints it, without "torch.") -> the Device field holding its peak
DTYPE_PEAKS = {"bfloat16": "peak_flops_bf16", "float16": "peak_flops_fp16"}


def device_spec(dev: Device) -> dict:
    """What a time column was costed for: the device's model and the figures roofline reads."""
    return {"model": dev.model, "peak_flops": dev.peak_flops, "peak_flops_bf16": dev.peak_flops_bf16,
            "peak_flops_fp16": dev.peak_flops_fp16, "memory_bandwidth_bytes_per_s": dev.memory_bandwidth_bytes_per_s}


def kind_devices(cluster: Cluster) -> dict[str, Device]:
    """The device standing for each kind of ``cluster``; devices of one kind must be alike, since a
    graph has one time column per kind."""
    first: dict[str, Device] = {}
    for dev in cluster.devices:
        other = first.setdefault(dev.kind, dev)
        if device_spec(other) != device_spec(dev):
            raise ClusterError(
                f"devices {other.name!r} and {dev.name!r} of cluster {cluster.name!r} are both of kind {dev.kind!r} "
                f"but differ in model or peak figures: a graph has one time column per kind, so give them different kinds"
            )
    return first


def roofline_us(flops: np.ndarray, bytes_moved: np.ndarray, launches: np.ndarray, dtypes: list[str],
                cluster: Cluster, *, kinds: "list[str] | None" = None) -> tuple[dict[str, np.ndarray], list[str]]:
    """(one time column per device kind of ``cluster`` (or of ``kinds``), notes on missing peaks).

    ``launches``: kernel launches per op (0 for views, a share for a piece of a multi-tensor kernel)."""
    columns: dict[str, np.ndarray] = {}
    notes: list[str] = []
    dtype_array = np.asarray(dtypes, dtype=object)
    for kind, dev in kind_devices(cluster).items():
        if kinds is not None and kind not in kinds:
            continue
        if not (dev.peak_flops > 0 and dev.memory_bandwidth_bytes_per_s > 0):
            raise ClusterError(
                f"device {dev.name!r} of cluster {cluster.name!r} has no peak_tflops or memory_bandwidth_gbps: "
                f"the roofline cost model needs both (add them to the cluster file, or use cost='measured')"
            )
        peak = np.full(len(flops), dev.peak_flops)
        for dtype, attr in DTYPE_PEAKS.items():
            uses = dtype_array == dtype
            if not uses.any():
                continue
            if getattr(dev, attr) > 0:
                peak[uses] = getattr(dev, attr)
            else:
                notes.append(f"device {dev.name!r} ({dev.model or dev.kind}) has no {dtype} peak: "
                             f"its {int(uses.sum())} {dtype} ops are costed at the fp32 peak")
        seconds = np.maximum(flops / peak, bytes_moved / dev.memory_bandwidth_bytes_per_s) / EFFICIENCY
        columns[kind] = np.where(launches > 0, seconds * 1e6 + launches * LAUNCH_US.get(kind, DEFAULT_LAUNCH_US), 0.0)
    return columns, notes


def _same_device(spec: dict, dev: Device, measured: bool) -> bool:
    if measured:  # figures of a measuring machine are not known; only a declared model can differ
        return not dev.model or dev.model.lower() in spec.get("model", "").lower()
    return spec == device_spec(dev)


_recosted: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def costed_for(graph, cluster: Cluster):
    """``graph`` with times for ``cluster``'s devices: itself when it was costed for them (or records
    nothing, as graphs from other tools), else re-costed by roofline (adding a column for a device
    kind it lacks); a measured graph is refused."""
    record = graph.meta.get("costed_for")
    if not record:
        return graph
    measured = graph.meta.get("cost_model") != ROOFLINE
    devices = kind_devices(cluster)
    stale = [dev for kind, dev in devices.items() if kind in record and not _same_device(record[kind], dev, measured)]
    if not measured and "op_flops" in graph.meta:  # roofline can also cost kinds the graph lacks
        stale += [dev for kind, dev in devices.items() if kind not in record and kind not in graph.device_kinds]
    if not stale:
        return graph
    dev = stale[0]
    was = record[dev.kind].get("model") or "other figures"
    if measured:
        raise ClusterError(
            f"the graph's {dev.kind!r} times were measured on {was}, but cluster {cluster.name!r} has "
            f"{dev.model or dev.name}: re-capture it for this cluster (`devplace profile TARGET --cluster "
            f"{cluster.name}`, roofline) or measure it on that device"
        )
    key = tuple(sorted((kind, tuple(sorted(device_spec(d).items()))) for kind, d in kind_devices(cluster).items()))
    per_graph = _recosted.setdefault(graph, {})
    if key not in per_graph:
        per_graph[key] = _recost(graph, cluster, [d.kind for d in stale])
    return per_graph[key]


def _recost(graph, cluster: Cluster, kinds: list[str]):
    meta = graph.meta
    if "op_flops" not in meta:
        raise ClusterError(
            f"the graph was costed for other {kinds[0]!r} devices than cluster {cluster.name!r}'s and stores no "
            f"per-op FLOPs to re-cost it: re-capture it with `devplace profile TARGET --cluster {cluster.name}`"
        )
    flops, read, written = (np.asarray(meta[k], dtype=np.float64) for k in ("op_flops", "op_bytes_read", "op_bytes_written"))
    dtypes = meta.get("op_dtype") or ["float32"] * graph.n_ops
    launches = np.asarray(meta.get("op_launches") or (graph.compute_us.max(axis=1) > 0), dtype=np.float64)
    columns, notes = roofline_us(flops, read + written, launches, dtypes, cluster, kinds=kinds)
    device_kinds = list(graph.device_kinds) + [k for k in kinds if k not in graph.device_kinds]
    compute = np.zeros((graph.n_ops, len(device_kinds)))
    compute[:, : len(graph.device_kinds)] = graph.compute_us
    for kind, column in columns.items():
        compute[:, device_kinds.index(kind)] = column
    devices = kind_devices(cluster)
    new_meta = {**meta, "costed_for": {**meta["costed_for"], **{k: device_spec(devices[k]) for k in kinds}},
                "cost_notes": notes, "recosted_from": {k: meta["costed_for"][k] for k in kinds if k in meta["costed_for"]}}
    return replace(graph, device_kinds=device_kinds, compute_us=compute, meta=new_meta)
