"""What a simulation found: the schedule, memory, transfers and what limited the step."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

from devplace.cluster import Cluster
from devplace.graph import OpGraph


MEMORY_ROUNDING = 1e-9   # relative: sums of the same bytes in another order differ in the last bits


def usable_memory_bytes(cluster) -> np.ndarray:
    """Each device's memory plus float rounding: a placer that fills a device exactly (its sum
    taken in another order) must not be called out of memory by the simulator's sum."""
    return cluster.memory_bytes * (1.0 + MEMORY_ROUNDING)


@dataclass(eq=False)
class SimResult:
    graph: OpGraph
    cluster: Cluster
    devices: np.ndarray
    start_us: np.ndarray
    finish_us: np.ndarray
    ready_us: np.ndarray
    cause: np.ndarray
    previous_on_device: np.ndarray
    op_time_us: np.ndarray
    transfer_op: np.ndarray
    transfer_src: np.ndarray
    transfer_dst: np.ndarray
    transfer_start_us: np.ndarray
    transfer_end_us: np.ndarray
    transfer_bytes: np.ndarray
    peak_memory_bytes: np.ndarray
    first_overflow_op: np.ndarray
    memory_event_time_us: np.ndarray
    memory_event_device: np.ndarray
    memory_event_delta: np.ndarray

    @cached_property
    def step_time_us(self) -> float:
        return float(self.finish_us.max()) if len(self.finish_us) else 0.0

    @cached_property
    def busy_us(self) -> np.ndarray:
        """Compute time per device (op times plus the cluster's per-op gap)."""
        per_op = self.op_time_us + self.cluster.op_gap_us
        return np.bincount(self.devices, weights=per_op, minlength=self.cluster.n_devices)

    @cached_property
    def message_overhead_us(self) -> np.ndarray:
        """Device time per device spent on messages (the cluster's send and receive overheads)."""
        c = self.cluster
        sent = c.send_overhead_us[self.transfer_src, self.transfer_dst]
        received = c.recv_overhead_us[self.transfer_src, self.transfer_dst]
        return (np.bincount(self.transfer_src, weights=sent, minlength=c.n_devices).astype(np.float64)
                + np.bincount(self.transfer_dst, weights=received, minlength=c.n_devices))

    @cached_property
    def oom_devices(self) -> list[int]:
        """Devices whose peak exceeds their memory by more than float rounding (``usable_memory_bytes``)."""
        return [int(d) for d in np.flatnonzero(self.peak_memory_bytes > usable_memory_bytes(self.cluster))]

    @property
    def fits(self) -> bool:
        return not self.oom_devices

    @cached_property
    def bytes_moved(self) -> float:
        return float(self.transfer_bytes.sum())

    @cached_property
    def link_bytes(self) -> np.ndarray:
        """Bytes sent from device i to device j."""
        d = self.cluster.n_devices
        moved = np.zeros((d, d))
        np.add.at(moved, (self.transfer_src, self.transfer_dst), self.transfer_bytes)
        return moved

    @cached_property
    def critical_path(self) -> np.ndarray:
        """Ops (first to last) on the chain of waits that ends at the last op to finish.

        From each op we step back to what it waited for: the input that arrived last, if the op
        started as soon as it was ready, else the op that held its device. (Compiled: a search reads
        it every few simulations, and the walk is thousands of steps long.)"""
        return _critical_path(self.finish_us, self.start_us, self.ready_us, self.previous_on_device, self.cause)

    @cached_property
    def critical_path_split_us(self) -> dict[str, float]:
        """What the step's critical path is made of, adding up to the step time: ``compute`` (its
        ops, gaps included), ``transfer`` (the messages where it changes device), ``channel_wait``
        (those messages waiting for a busy channel after their producer finished) and ``other``
        (message overheads owed by a device, and a start after time 0).

        It says which side to work on: a step that is compute on a path that crosses devices is
        not helped by faster links, one whose path waits for channels is.

        >>> from devplace.graph import chain_graph
        >>> from devplace.cluster import uniform_cluster
        >>> from devplace.sim import simulate
        >>> g = chain_graph([10.0, 20.0], edge_bytes=1000.0)
        >>> two = uniform_cluster(2, latency_us=5.0, bandwidth_bytes_per_us=1000.0)
        >>> simulate(g, two, [0, 1]).critical_path_split_us
        {'compute': 30.0, 'transfer': 6.0, 'channel_wait': 0.0, 'other': 0.0}
        """
        path = self.critical_path
        split = {"compute": 0.0, "transfer": 0.0, "channel_wait": 0.0, "other": 0.0}
        if len(path) == 0:
            return split
        split["compute"] = float((self.finish_us[path] - self.start_us[path]).sum())
        transfer_of = {(int(op), int(dst)): i for i, (op, dst) in enumerate(zip(self.transfer_op, self.transfer_dst))}
        for producer, consumer in zip(path[:-1].tolist(), path[1:].tolist()):
            i = transfer_of.get((producer, int(self.devices[consumer])))
            if self.devices[producer] != self.devices[consumer] and i is not None:
                split["channel_wait"] += float(self.transfer_start_us[i] - self.finish_us[producer])
                split["transfer"] += float(self.transfer_end_us[i] - self.transfer_start_us[i])
        split["other"] = max(0.0, self.step_time_us - sum(split.values()))
        return split

    def critical_path_sentence(self) -> str:
        """``critical_path_split_us`` in words, for the command line and the report."""
        split = {k: v / 1e3 for k, v in self.critical_path_split_us.items()}
        words = [f"{split['compute']:.3f} ms compute", f"{split['transfer']:.3f} ms transfers",
                 f"{split['channel_wait']:.3f} ms waiting for busy channels"]
        if split["other"] > 0.0005:
            words.append(f"{split['other']:.3f} ms other (message overheads, a late start)")
        return f"Critical path ({len(self.critical_path)} ops): " + ", ".join(words) + "."

    def memory_timeline(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """(time us, bytes in use) after each allocation or free on ``device``."""
        on_device = self.memory_event_device == device
        return self.memory_event_time_us[on_device], np.cumsum(self.memory_event_delta[on_device])

    def overflow_report(self) -> list[str]:
        """One sentence per device over its memory limit, naming the op where it overflowed."""
        lines = []
        for d in self.oom_devices:
            dev = self.cluster.devices[d]
            op = int(self.first_overflow_op[d])
            where = f", first at op {self.graph.names[op]!r}" if op >= 0 else ""
            lines.append(
                f"device {dev.name!r} needs {self.peak_memory_bytes[d] / 2**30:.3f} GiB but has "
                f"{dev.memory_bytes / 2**30:.3f} GiB{where}"
            )
        return lines

    def to_dict(self) -> dict:
        """The figures ``devplace simulate --json`` prints."""
        return {
            "step_time_us": self.step_time_us,
            "peak_memory_bytes": self.peak_memory_bytes.tolist(),
            "memory_bytes": self.cluster.memory_bytes.tolist(),
            "oom_devices": self.oom_devices,
            "first_overflow_op": [
                self.graph.names[op] if op >= 0 and d in self.oom_devices else None
                for d, op in enumerate(self.first_overflow_op.tolist())
            ],
            "busy_us": self.busy_us.tolist(),
            "message_overhead_us": self.message_overhead_us.tolist(),
            "bytes_moved": self.bytes_moved,
            "transfers": int(len(self.transfer_op)),
            "link_bytes": self.link_bytes.tolist(),
            "critical_path_ops": len(self.critical_path),
            "critical_path_split_us": self.critical_path_split_us,
            "device_names": self.cluster.device_names,
        }


@njit(cache=True)
def _critical_path(finish_us, start_us, ready_us, previous_on_device, cause):
    """``SimResult.critical_path``: every step goes to an op dispatched earlier, so at most n steps."""
    n = finish_us.shape[0]
    path = np.empty(n, np.int64)
    if n == 0:
        return path
    v = np.argmax(finish_us)
    length = 1
    path[0] = v
    while length < n:
        if start_us[v] > ready_us[v] and previous_on_device[v] >= 0:
            v = previous_on_device[v]
        elif cause[v] >= 0:
            v = cause[v]
        else:
            break
        path[length] = v
        length += 1
    return path[:length][::-1].copy()
