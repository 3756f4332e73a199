"""A placement: one device per op, and who made it.

``priority`` is optional: list schedulers (m-ETF, m-SCT, HEFT) also decide the order in which each
device runs its ops, and the simulator and the executor follow it when it is given (lower first).
Without it every device runs its ready ops in the graph's topological order.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from devplace.errors import PlacementError
from devplace.fileio import json_default, read_json_object, write_text_atomic

FORMAT = "devplace-placement"
VERSION = 1


def graph_fingerprint(op_names: Sequence[str]) -> str:
    """A short hash of the op names in order: ties a placement file to its graph."""
    digest = hashlib.sha256("\n".join(op_names).encode()).hexdigest()
    return digest[:16]


class ColocationWarning(UserWarning):
    """A placement splits a colocation group: simulated anyway, but not runnable as it is."""


@dataclass(eq=False)
class Placement:
    devices: np.ndarray
    algorithm: str = "manual"
    options: dict = field(default_factory=dict)
    placement_time_s: float = 0.0
    priority: np.ndarray | None = None
    device_names: list[str] | None = None
    graph_fingerprint: str | None = None

    def __post_init__(self) -> None:
        self.devices = np.ascontiguousarray(self.devices, dtype=np.int64).reshape(-1)
        if self.priority is not None:
            try:
                self.priority = np.ascontiguousarray(self.priority, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                raise PlacementError("a placement's priorities must be numbers, one per op") from None
            if len(self.priority) != len(self.devices):
                raise PlacementError(
                    f"placement has {len(self.priority)} priorities for {len(self.devices)} ops"
                )

    def __len__(self) -> int:
        return len(self.devices)

    def check(self, graph, cluster) -> None:
        """Refuse a placement that does not fit the graph and cluster, naming what is off."""
        if len(self.devices) != graph.n_ops:
            raise PlacementError(
                f"the placement has {len(self.devices)} entries but the graph has {graph.n_ops} ops: "
                f"it was made for another graph"
            )
        if self.graph_fingerprint and self.graph_fingerprint != graph_fingerprint(graph.names):
            raise PlacementError(
                "the placement was made for a graph with other op names (fingerprint "
                f"{self.graph_fingerprint} vs {graph_fingerprint(graph.names)}): place this graph again"
            )
        bad = (self.devices < 0) | (self.devices >= cluster.n_devices)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise PlacementError(
                f"op {graph.names[i]!r} is placed on device {int(self.devices[i])}, but cluster "
                f"{cluster.name!r} has devices 0-{cluster.n_devices - 1}"
            )
        if self.device_names is not None:
            used = np.unique(self.devices)
            other = next((int(d) for d in used if d < len(self.device_names)
                          and self.device_names[d] != cluster.device_names[d]), None)
            if other is not None:
                raise PlacementError(
                    f"the placement puts ops on device {other} {self.device_names[other]!r}, but device {other} of "
                    f"cluster {cluster.name!r} is {cluster.device_names[other]!r}: it was made for another cluster"
                )
        if self.priority is not None and not np.isfinite(self.priority).all():
            raise PlacementError("the placement's priorities must be finite numbers")

    def colocation_violations(self, graph) -> list[str]:
        """Names of colocation groups whose ops are split across devices (one entry per op expected)."""
        grouped = graph.colocation >= 0
        groups, devices = graph.colocation[grouped], self.devices[grouped]
        lowest = np.full(len(graph.colocation_names), np.iinfo(np.int64).max)
        highest = np.full(len(graph.colocation_names), np.iinfo(np.int64).min)
        np.minimum.at(lowest, groups, devices)
        np.maximum.at(highest, groups, devices)
        return [graph.colocation_names[g] for g in np.flatnonzero(highest > lowest)]

    def warn_if_colocation_split(self, graph) -> None:
        """Warn (``ColocationWarning``) if the placement splits a colocation group: it can still be
        simulated, but no placer would make it and the executor refuses it."""
        split = self.colocation_violations(graph)
        if split:
            more = f" (and {len(split) - 1} more)" if len(split) > 1 else ""
            warnings.warn(
                f"the placement splits colocation group {split[0]!r}{more} across devices: the simulated step "
                f"is one the executor refuses to run; put each group's ops on one device (every placer does)",
                ColocationWarning, stacklevel=3,
            )

    # ------------------------------------------------------------------ files
    def to_dict(self, graph=None) -> dict:
        data = {
            "format": FORMAT,
            "version": VERSION,
            "algorithm": self.algorithm,
            "options": self.options,
            "n_ops": len(self.devices),
            "graph_fingerprint": graph_fingerprint(graph.names) if graph is not None else self.graph_fingerprint,
            "device_names": self.device_names,
            "devices": self.devices.tolist(),
        }
        if self.priority is not None:
            data["priority"] = self.priority.tolist()
        return data

    def save(self, path: "str | Path", graph=None) -> None:
        """Write the placement as strict JSON: a NaN or infinity (which ``json`` would write as a bare
        ``NaN`` no other reader accepts) is refused, naming the option that holds it. The file holds
        no timing (``placement_time_s`` is the run's, not the placement's), so the same seed writes
        the same bytes and placements can be diffed."""
        data = self.to_dict(graph)
        try:
            text = json.dumps(data, default=json_default, allow_nan=False)
        except ValueError:
            fields = [(f"option {key!r}", value) for key, value in self.options.items()]
            fields += [("priority", self.priority)]
            where = next(name for name, value in fields if not _finite_json(value))
            raise PlacementError(f"placement by {self.algorithm!r}: {where} is not a finite number, and JSON "
                                 f"cannot hold it: record a missing figure as None") from None
        write_text_atomic(path, text)

    @classmethod
    def from_dict(cls, data: dict, source: str = "placement") -> "Placement":
        if data.get("format") != FORMAT:
            raise PlacementError(f"{source} is not a devplace placement file (no \"format\": \"{FORMAT}\")")
        if data.get("version") != VERSION:
            raise PlacementError(f"{source} has placement format version {data.get('version')!r}; this devplace reads {VERSION}")
        if "devices" not in data:
            raise PlacementError(f"{source} is missing the field 'devices'")
        devices = data["devices"]
        if not isinstance(devices, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in devices):
            raise PlacementError(f"{source} field 'devices' must be a list of device indices")
        priority = data.get("priority")
        if priority is not None and not (
            isinstance(priority, list) and all(_is_number(p) for p in priority)
        ):
            raise PlacementError(f"{source} field 'priority' must be a list of numbers, one per op")
        if not isinstance(data.get("options") or {}, dict):
            raise PlacementError(f"{source} field 'options' must be an object")
        if "n_ops" in data and data["n_ops"] != len(devices):
            raise PlacementError(f"{source} field 'n_ops' is {data['n_ops']!r} but 'devices' has {len(devices)} "
                                 f"entries: the file was edited or cut short")
        names = data.get("device_names")
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise PlacementError(f"{source} field 'device_names' must be a list of device names")
        bad = next((d for d in devices if d < 0 or (names is not None and d >= len(names))), None)
        if bad is not None:
            raise PlacementError(f"{source} field 'devices' holds device {bad}, which is not in its 'device_names'"
                                 if bad >= 0 else f"{source} field 'devices' holds the negative device {bad}")
        return cls(
            devices=np.asarray(devices, dtype=np.int64),
            algorithm=str(data.get("algorithm", "manual")),
            options=dict(data.get("options") or {}),
            priority=None if priority is None else np.asarray(priority, dtype=np.float64),
            device_names=data.get("device_names"),
            graph_fingerprint=data.get("graph_fingerprint"),
        )

    @classmethod
    def load(cls, path: "str | Path") -> "Placement":
        data = read_json_object(path, "placement file", PlacementError)
        return cls.from_dict(data, source=f"placement file {str(path)!r}")


def as_placement(placement, graph) -> Placement:
    """Accept a Placement or any sequence of device indices, one per op in op order."""
    if isinstance(placement, Placement):
        return placement
    try:
        devices = np.asarray(placement)
    except Exception:  # noqa: BLE001 - anything not array-like is the user's error
        raise PlacementError("a placement must be a Placement or a sequence of device indices") from None
    if devices.ndim != 1 or not (np.issubdtype(devices.dtype, np.integer) or devices.size == 0):
        raise PlacementError("a placement must be a Placement or a flat sequence of integer device indices")
    return Placement(devices=devices)


def _finite_json(value) -> bool:
    """False if ``value`` holds a NaN or infinity anywhere (in lists and dicts too)."""
    if isinstance(value, dict):
        return all(_finite_json(v) for v in value.values())
    if isinstance(value, (list, tuple, np.ndarray)):
        return all(_finite_json(v) for v in value)
    return not isinstance(value, (float, np.floating)) or bool(np.isfinite(value))  # None, ints, strings: fine


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

