"""The target machine: devices, their memory, and the links between them.

A ``Cluster`` is what a placement is made for and simulated on. Links are held as dense
device-by-device matrices (latency in microseconds, bandwidth in bytes per microsecond, which is
MB/s; ``send_overhead_us`` / ``recv_overhead_us``: the time each message costs the sending /
receiving device itself, as when the devices are processes that post and complete transfers on the
cores they compute on), and ``comm_model`` says how transfers share the links:

- ``parallel``: every ordered device pair has its own channel; transfers on one pair queue.
- ``sequential``: each device has one channel for all its sends and receives (Baechi's model); a
  transfer holds the sender's and the receiver's channel.
- ``duplex``: each device has one send channel and one receive channel.
- ``pipelined``: as ``parallel``, but a transfer holds its channel only for bytes / bandwidth; the
  latency overlaps the next messages (a transport with many messages in flight). Placers that
  model links themselves treat it as ``duplex``.

In every model a tensor is sent to a given device at most once and stays cached there.

Presets are TOML files in ``devplace/clusters/``; ``devplace clusters`` lists them and a user can
copy one and edit it.

>>> c = load_cluster("baechi-4x2080")
>>> c.n_devices, c.comm_model, round(c.transfer_us(0, 1, 1_000_000), 1)
(4, 'sequential', 309.4)
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Mapping

import numpy as np

from devplace.errors import ClusterError
from devplace.frozen import FrozenDict, freeze, read_only_array, set_read_only_state
from devplace.sim import channels
from devplace.sim.channels import COMM_MODEL_CODES, COMM_MODELS


@dataclass(frozen=True)
class Device:
    """One device. ``kind`` selects the graph's compute-time column for it; ``model`` and the peaks
    say what a roofline-costed column was costed for (bf16/fp16: tensor-core peaks, 0 if none)."""

    name: str
    kind: str
    memory_bytes: float
    peak_flops: float = 0.0
    memory_bandwidth_bytes_per_s: float = 0.0
    model: str = ""
    peak_flops_bf16: float = 0.0
    peak_flops_fp16: float = 0.0


@dataclass(eq=False, frozen=True)
class Cluster:
    """Devices and links, validated on construction and unchangeable afterwards (frozen fields,
    read-only matrices, a read-only ``meta``): derive a variant with ``with_memory_fraction``,
    ``with_devices`` or ``dataclasses.replace``, which validates it again."""

    name: str
    devices: tuple[Device, ...]
    comm_model: str
    latency_us: np.ndarray
    bandwidth_bytes_per_us: np.ndarray
    op_gap_us: float = 0.0
    description: str = ""
    meta: Mapping = field(default_factory=FrozenDict)
    send_overhead_us: np.ndarray | None = None  # [src, dst]: device time per message, charged to src
    recv_overhead_us: np.ndarray | None = None  # [src, dst]: charged to dst; both default to zeros

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "meta", freeze(dict(self.meta)))
        d = len(self.devices)
        if d == 0:
            raise ClusterError(f"cluster {self.name!r} has no devices: add at least one [[devices]] entry")
        if self.comm_model not in COMM_MODELS:
            raise ClusterError(
                f"cluster {self.name!r} has comm_model {self.comm_model!r}: use one of {', '.join(COMM_MODELS)}"
            )
        names = [dev.name for dev in self.devices]
        if len(set(names)) != d:
            dup = next(n for n in names if names.count(n) > 1)
            raise ClusterError(f"cluster {self.name!r} names device {dup!r} twice: device names must be unique")
        for dev in self.devices:
            if not (math.isfinite(dev.memory_bytes) and dev.memory_bytes > 0):
                raise ClusterError(f"device {dev.name!r} has memory_bytes = {dev.memory_bytes!r}: it must be > 0")
            for attr in ("peak_flops", "memory_bandwidth_bytes_per_s", "peak_flops_bf16", "peak_flops_fp16"):
                value = getattr(dev, attr)
                if not (math.isfinite(value) and value >= 0):
                    raise ClusterError(f"device {dev.name!r} has {attr} = {value!r}: it must be >= 0")
        for attr in ("latency_us", "bandwidth_bytes_per_us"):
            object.__setattr__(self, attr, read_only_array(getattr(self, attr), np.float64).reshape(d, d))
        off = ~np.eye(d, dtype=bool)
        for attr in ("send_overhead_us", "recv_overhead_us"):
            value = getattr(self, attr)
            value = np.zeros((d, d)) if value is None else np.array(value, dtype=np.float64).reshape(d, d)
            np.fill_diagonal(value, 0.0)  # a device sends nothing to itself
            object.__setattr__(self, attr, read_only_array(value, np.float64))
        bad_latency = off & ~(np.isfinite(self.latency_us) & (self.latency_us >= 0))
        bad_bandwidth = off & ~(self.bandwidth_bytes_per_us > 0)
        bad_send = ~(np.isfinite(self.send_overhead_us) & (self.send_overhead_us >= 0))
        bad_recv = ~(np.isfinite(self.recv_overhead_us) & (self.recv_overhead_us >= 0))
        for bad, what in ((bad_latency, "latency_us must be a finite number >= 0"),
                          (bad_bandwidth, "bandwidth_bytes_per_us must be > 0"),
                          (bad_send, "send_overhead_us must be a finite number >= 0"),
                          (bad_recv, "recv_overhead_us must be a finite number >= 0")):
            if bad.any():
                a, b = (int(x) for x in np.argwhere(bad)[0])
                raise ClusterError(
                    f"cluster {self.name!r} link {self.devices[a].name!r} -> {self.devices[b].name!r}: {what}"
                )
        if not (math.isfinite(self.op_gap_us) and self.op_gap_us >= 0):
            raise ClusterError(f"cluster {self.name!r} has op_gap_us = {self.op_gap_us!r}: it must be >= 0")

    __setstate__ = set_read_only_state  # a pickled or copied one stays read-only

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    @property
    def memory_bytes(self) -> np.ndarray:
        return np.array([dev.memory_bytes for dev in self.devices], dtype=np.float64)

    @property
    def device_names(self) -> list[str]:
        return [dev.name for dev in self.devices]

    @property
    def device_kinds(self) -> list[str]:
        return [dev.kind for dev in self.devices]

    @property
    def comm_model_code(self) -> int:
        return COMM_MODEL_CODES[self.comm_model]

    def device_index(self, name: str) -> int:
        for i, dev in enumerate(self.devices):
            if dev.name == name:
                return i
        raise ClusterError(f"cluster {self.name!r} has no device {name!r} (it has {', '.join(self.device_names)})")

    @property
    def message_latency_us(self) -> np.ndarray:
        """The fixed part of a message's cost that placers plan with: the link's latency plus the
        device time it costs its sender and receiver (all three delay a consumer on an idle device)."""
        return self.latency_us + self.send_overhead_us + self.recv_overhead_us

    def transfer_us(self, src: int, dst: int, nbytes: float) -> float:
        """Time from sending ``nbytes`` on ``src`` until a consumer on ``dst`` can use them, link and
        devices idle, as the simulator and the placers cost it (``sim.channels.transfer_us``): the
        message latency (link and both devices' overheads) plus bytes / bandwidth; 0 for no bytes."""
        if src == dst:
            return 0.0
        latency = self.latency_us[src, dst] + self.send_overhead_us[src, dst] + self.recv_overhead_us[src, dst]
        return float(channels.transfer_us(float(nbytes), math.nan, latency, self.bandwidth_bytes_per_us[src, dst])[0])

    def with_memory_fraction(self, fraction: float) -> "Cluster":
        """The same cluster with every device's memory scaled, as Baechi's 30% experiments."""
        if not (0 < fraction <= 1e6):
            raise ClusterError(f"memory fraction {fraction!r} must be > 0")
        devices = [replace(dev, memory_bytes=dev.memory_bytes * fraction) for dev in self.devices]
        return replace(self, name=f"{self.name}@mem{fraction:g}", devices=devices)

    def with_memory_bytes(self, memory_bytes) -> "Cluster":
        """The same cluster with each device's memory set to ``memory_bytes`` (one per device), its
        name kept: what a search under a cap or a looser memory runs on."""
        memory = np.broadcast_to(np.asarray(memory_bytes, dtype=np.float64), (self.n_devices,))
        devices = [replace(dev, memory_bytes=float(m)) for dev, m in zip(self.devices, memory)]
        return replace(self, devices=devices)

    def with_devices(self, n_devices: int) -> "Cluster":
        """The same machine with ``n_devices`` devices, for a paper's 2- or 8-GPU setting.

        Only for a uniform cluster (one device kind and memory, one link everywhere): devices are
        copies of the first, named like the preset's (``gpu0``, ``gpu1``, ...).
        """
        if n_devices < 1:
            raise ClusterError(f"a cluster needs at least one device, not {n_devices!r}")
        first = self.devices[0]
        off = ~np.eye(self.n_devices, dtype=bool)
        links = (self.latency_us, self.bandwidth_bytes_per_us, self.send_overhead_us, self.recv_overhead_us)
        uniform = all(replace(dev, name=first.name) == first for dev in self.devices) and (
            self.n_devices == 1 or all(np.ptp(matrix[off]) == 0 for matrix in links)
        )
        if not uniform:
            raise ClusterError(f"cluster {self.name!r} is not uniform (devices or links differ): write a TOML for "
                               f"{n_devices} devices instead")
        base = first.name.rstrip("0123456789") or first.kind
        devices = [replace(first, name=f"{base}{i}") for i in range(n_devices)]
        one = [matrix[off][0] if self.n_devices > 1 else default for matrix, default in zip(links, (0.0, np.inf, 0.0, 0.0))]
        latency, bandwidth = uniform_links(n_devices, one[0], one[1])
        return replace(self, name=f"{self.name}@{n_devices}dev", devices=devices, latency_us=latency,
                       bandwidth_bytes_per_us=bandwidth, send_overhead_us=np.full((n_devices, n_devices), one[2]),
                       recv_overhead_us=np.full((n_devices, n_devices), one[3]))

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "comm_model": self.comm_model,
            "op_gap_us": self.op_gap_us,
            "devices": [asdict(dev) for dev in self.devices],
            "latency_us": self.latency_us.tolist(),
            "bandwidth_bytes_per_us": self.bandwidth_bytes_per_us.tolist(),
            "send_overhead_us": self.send_overhead_us.tolist(),
            "recv_overhead_us": self.recv_overhead_us.tolist(),
        }


# ---------------------------------------------------------------------- loading
def preset_names() -> list[str]:
    folder = resources.files("devplace") / "clusters"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_cluster(name_or_path: "str | Path") -> Cluster:
    """A preset by name (``baechi-4x2080``) or a TOML file by path."""
    text_name = str(name_or_path)
    path = Path(text_name)
    if path.suffix == ".toml" or path.exists():
        if path.is_dir():
            raise ClusterError(f"cluster file {text_name!r} is a directory: give a .toml file")
        if not path.is_file():
            raise ClusterError(f"cluster file {text_name!r} does not exist")
        try:
            source = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ClusterError(f"cluster file {text_name!r} is not a UTF-8 text (TOML) file: byte {exc.start} "
                               f"cannot be read") from None
        default_name = path.stem
    else:
        if text_name not in preset_names():
            raise ClusterError(
                f"no cluster preset named {text_name!r}: use one of {', '.join(preset_names())} "
                f"or the path of a .toml file"
            )
        source = (resources.files("devplace") / "clusters" / f"{text_name}.toml").read_text()
        default_name = text_name
    try:
        spec = tomllib.loads(source)
    except tomllib.TOMLDecodeError as exc:
        raise ClusterError(f"cluster file {text_name!r} is not valid TOML: {exc}") from None
    return cluster_from_dict(spec, default_name=default_name)


def _number(table: dict, key: str, where: str, default: float | None = None) -> float:
    if key not in table:
        if default is None:
            raise ClusterError(f"{where} is missing the field {key!r}")
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ClusterError(f"{where} field {key!r} must be a number, not {value!r}")
    if not MAX_FIGURE >= abs(value):  # also NaN and inf
        raise ClusterError(f"{where} field {key!r} must be >= 0 and finite (at most {MAX_FIGURE:g}), not {value!r}")
    return float(value)


def _link(table: dict, where: str, extra: tuple[str, ...] = ()) -> tuple[float, float, float, float]:
    """(latency_us, bandwidth_bytes_per_us, send_overhead_us, recv_overhead_us) from a link table;
    ``us_per_byte`` is Baechi's form of the bandwidth."""
    _known_fields(table, LINK_FIELDS + extra, where)
    latency, send, recv = (_number(table, key, where, 0.0) for key in ("latency_us", "send_overhead_us", "recv_overhead_us"))
    for key, value in (("latency_us", latency), ("send_overhead_us", send), ("recv_overhead_us", recv)):
        if not (math.isfinite(value) and value >= 0):
            raise ClusterError(f"{where} field {key!r} must be >= 0, not {value!r}")
    if "us_per_byte" in table and "bandwidth_bytes_per_us" in table:
        raise ClusterError(f"{where} gives both 'us_per_byte' and 'bandwidth_bytes_per_us': keep one")
    if "us_per_byte" in table:
        per_byte = _number(table, "us_per_byte", where)
        if per_byte <= 0:
            raise ClusterError(f"{where} field 'us_per_byte' must be > 0")
        return latency, 1.0 / per_byte, send, recv
    bandwidth = _number(table, "bandwidth_bytes_per_us", where)
    if bandwidth <= 0:
        raise ClusterError(f"{where} field 'bandwidth_bytes_per_us' must be > 0, not {bandwidth!r}")
    return latency, bandwidth, send, recv


# Largest figure a cluster file may give: sums and products of figures stay finite in float64.
MAX_FIGURE = 1e30
# Most devices a cluster may have: the simulator keeps n x n link matrices (4096: 128 MiB each).
MAX_DEVICES = 4096

TOP_FIELDS = ("name", "description", "comm_model", "op_gap_us", "devices", "links")
DEVICE_FIELDS = ("name", "kind", "model", "count", "memory_gib", "memory_bytes", "peak_tflops", "peak_tflops_bf16",
                 "peak_tflops_fp16", "memory_bandwidth_gbps")
LINK_FIELDS = ("latency_us", "bandwidth_bytes_per_us", "us_per_byte", "send_overhead_us", "recv_overhead_us")


def _known_fields(table, allowed: tuple[str, ...], where: str) -> dict:
    """Refuse misspelt fields: a typo silently ignored would give a different cluster."""
    if not isinstance(table, dict):
        raise ClusterError(f"{where} must be a table, not {table!r}")
    unknown = [key for key in table if key not in allowed]
    if unknown:
        raise ClusterError(f"{where} has the unknown field {unknown[0]!r}: use {', '.join(allowed)}")
    return table


def cluster_from_dict(spec: dict, default_name: str = "cluster") -> Cluster:
    """Build a cluster from the TOML layout documented in ``docs/cluster-format.md``."""
    name = str(spec.get("name", default_name))
    _known_fields(spec, TOP_FIELDS, f"cluster {name!r}")
    if not isinstance(spec.get("devices", []), list):
        raise ClusterError(f"cluster {name!r} field 'devices' must be a list of [[devices]] tables")
    devices: list[Device] = []
    for k, entry in enumerate(spec.get("devices", [])):
        where = f"cluster {name!r} device entry {k + 1}"
        _known_fields(entry, DEVICE_FIELDS, where)
        if "kind" not in entry:
            raise ClusterError(f"{where} is missing the field 'kind'")
        count = _number(entry, "count", where, 1.0)
        if not (count >= 1 and count.is_integer()):
            raise ClusterError(f"{where} field 'count' must be a whole number >= 1, not {entry['count']!r}")
        count = int(count)
        if len(devices) + count > MAX_DEVICES:
            raise ClusterError(f"{where} field 'count' = {count} makes more than {MAX_DEVICES} devices, the most devplace "
                               f"simulates (its link matrices are devices x devices)")
        base = str(entry.get("name", entry["kind"]))
        if "memory_gib" in entry and "memory_bytes" in entry:
            raise ClusterError(f"{where} gives both 'memory_gib' and 'memory_bytes': keep one")
        if "memory_gib" not in entry and "memory_bytes" not in entry:
            raise ClusterError(f"{where} is missing the field 'memory_gib' (or 'memory_bytes')")
        memory = _number(entry, "memory_gib", where, 0.0) * 2**30 or _number(entry, "memory_bytes", where, 0.0)
        for i in range(count):
            devices.append(
                Device(
                    name=f"{base}{i}" if count > 1 or "name" not in entry else base,
                    kind=str(entry["kind"]),
                    memory_bytes=memory,
                    peak_flops=_number(entry, "peak_tflops", where, 0.0) * 1e12,
                    memory_bandwidth_bytes_per_s=_number(entry, "memory_bandwidth_gbps", where, 0.0) * 1e9,
                    model=str(entry.get("model", "")),
                    peak_flops_bf16=_number(entry, "peak_tflops_bf16", where, 0.0) * 1e12,
                    peak_flops_fp16=_number(entry, "peak_tflops_fp16", where, 0.0) * 1e12,
                )
            )
    d = len(devices)
    links = _known_fields(spec.get("links", {}), ("default", "pairs"), f"cluster {name!r} [links]")
    default = links.get("default")
    if default is None and d > 1:
        raise ClusterError(f"cluster {name!r} is missing [links.default] (latency_us and bandwidth_bytes_per_us)")
    lat, bw, send, recv = (0.0, np.inf, 0.0, 0.0) if default is None else _link(default, f"cluster {name!r} [links.default]")
    latency, bandwidth = uniform_links(d, lat, bw)
    send_overhead, recv_overhead = np.full((d, d), send), np.full((d, d), recv)
    index = {dev.name: i for i, dev in enumerate(devices)}
    if not isinstance(links.get("pairs", []), list):
        raise ClusterError(f"cluster {name!r} field 'links.pairs' must be a list of [[links.pairs]] tables")
    for k, pair in enumerate(links.get("pairs", [])):
        where = f"cluster {name!r} [[links.pairs]] entry {k + 1}"
        ends = pair.get("devices", []) if isinstance(pair, dict) else []
        if not isinstance(ends, list) or len(ends) != 2 or ends[0] == ends[1] or any(e not in index for e in ends):
            raise ClusterError(
                f"{where} field 'devices' must name two different devices of the cluster "
                f"({', '.join(index)}), not {ends!r}"
            )
        a, b = index[ends[0]], index[ends[1]]
        for matrix, value in zip((latency, bandwidth, send_overhead, recv_overhead), _link(pair, where, extra=("devices",))):
            matrix[a, b] = matrix[b, a] = value
    return Cluster(
        name=name,
        devices=devices,
        comm_model=str(spec.get("comm_model", "parallel")),
        latency_us=latency,
        bandwidth_bytes_per_us=bandwidth,
        op_gap_us=_number(spec, "op_gap_us", f"cluster {name!r}", 0.0),
        description=str(spec.get("description", "")),
        send_overhead_us=send_overhead,
        recv_overhead_us=recv_overhead,
    )


def uniform_links(n_devices: int, latency_us: float, bandwidth_bytes_per_us: float) -> tuple[np.ndarray, np.ndarray]:
    """Latency and bandwidth matrices with one link between every pair (a device to itself: free)."""
    latency = np.full((n_devices, n_devices), float(latency_us))
    bandwidth = np.full((n_devices, n_devices), float(bandwidth_bytes_per_us))
    np.fill_diagonal(latency, 0.0)
    np.fill_diagonal(bandwidth, np.inf)
    return latency, bandwidth


def uniform_cluster(
    n_devices: int,
    *,
    kind: str = "gpu",
    memory_bytes: float = 8 * 2**30,
    latency_us: float = 0.0,
    bandwidth_bytes_per_us: float = 1e4,
    comm_model: str = "parallel",
    op_gap_us: float = 0.0,
    send_overhead_us: float = 0.0,
    recv_overhead_us: float = 0.0,
    name: str | None = None,
) -> Cluster:
    """``n_devices`` identical devices, every pair joined by the same link (named ``4xgpu`` unless ``name``)."""
    latency, bandwidth = uniform_links(n_devices, latency_us, bandwidth_bytes_per_us)
    return Cluster(
        name=name or f"{n_devices}x{kind}",
        devices=[Device(f"{kind}{i}", kind, float(memory_bytes)) for i in range(n_devices)],
        comm_model=comm_model,
        latency_us=latency,
        bandwidth_bytes_per_us=bandwidth,
        op_gap_us=op_gap_us,
        send_overhead_us=np.full((n_devices, n_devices), float(send_overhead_us)),
        recv_overhead_us=np.full((n_devices, n_devices), float(recv_overhead_us)),
    )
