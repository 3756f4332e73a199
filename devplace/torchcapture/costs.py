"""Cost models: the time of each graph op on each device kind.

- ``roofline_us``: from FLOPs and bytes moved and a device's peak figures, so a graph can be costed
  for hardware one does not have (place for 8 x H100 from a laptop).
- ``measured_us``: runs the traced step once on real tensors and times every ATen op on the local
  device (median of repeats). In-place ops are repeated on copies so the step itself runs once.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from devplace.torchcapture.memory import mutated_args
from devplace.cluster import Cluster
from devplace.errors import CaptureError

# Roofline defaults: achieved fraction of peak, and the fixed cost of launching one kernel.
EFFICIENCY = 0.6
LAUNCH_US = {"gpu": 5.0, "cpu": 1.0}
DEFAULT_LAUNCH_US = 5.0
FLUSH_BYTES = 4 * 2**20  # larger than a core's L2 cache


def roofline_us(
    flops: np.ndarray, bytes_moved: np.ndarray, has_kernel: np.ndarray, cluster: Cluster,
    *, efficiency: float = EFFICIENCY, launch_us: dict[str, float] | None = None,
) -> dict[str, np.ndarray]:
    """One time column per device kind of ``cluster``: max(compute, memory) / efficiency + launch."""
    launch = {**LAUNCH_US, **(launch_us or {})}
    columns: dict[str, np.ndarray] = {}
    for dev in cluster.devices:
        if dev.kind in columns:
            continue
        if not (dev.peak_flops > 0 and dev.memory_bandwidth_bytes_per_s > 0):
            raise CaptureError(
                f"device {dev.name!r} of cluster {cluster.name!r} has no peak_tflops or memory_bandwidth_gbps: "
                f"the roofline cost model needs both (add them to the cluster file, or use cost='measured')"
            )
        seconds = np.maximum(flops / dev.peak_flops, bytes_moved / dev.memory_bandwidth_bytes_per_s) / efficiency
        columns[dev.kind] = np.where(has_kernel, seconds * 1e6 + launch.get(dev.kind, DEFAULT_LAUNCH_US), 0.0)
    return columns


def local_device_kind() -> str:
    return "gpu" if torch.cuda.is_available() else "cpu"


CLOCKS = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}


def measured_us(gm: torch.fx.GraphModule, real_args: list, op_names: list[str], *,
                repeats: int = 5, warmup: int = 1, progress: bool = True, clock: str = "wall") -> np.ndarray:
    """Median time (us) of each op in ``op_names`` on the local device; placeholders take 0.

    ``clock="cpu"`` counts this thread's CPU time instead of wall time: on a shared machine with
    one intra-op thread it leaves out the time other processes held the core.
    """
    if clock not in CLOCKS:
        raise CaptureError(f"unknown clock {clock!r}: use one of {', '.join(CLOCKS)}")
    timer = _TimingInterpreter(gm, repeats=repeats, warmup=warmup, progress=progress, clock=CLOCKS[clock])
    with torch.no_grad():
        timer.run(*real_args)
    return np.array([timer.times_us.get(name, 0.0) for name in op_names])


class _TimingInterpreter(torch.fx.Interpreter):
    """Runs the graph once; before each ATen op's real call, times it ``repeats`` times."""

    def __init__(self, gm, *, repeats: int, warmup: int, progress: bool, clock):
        super().__init__(gm, garbage_collect_values=True)
        self.clock = clock
        # In a real step an op's operands were last touched several ops ago, not by the op itself;
        # rewriting this scratch buffer before each timed call evicts them from the per-core caches.
        self.scratch = torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32)
        self.repeats, self.warmup = repeats, warmup
        self.times_us: dict[str, float] = {}
        self.bar = _progress(len(gm.graph.nodes)) if progress else None

    def run_node(self, n):
        self.node = n
        result = super().run_node(n)
        if self.bar is not None:
            self.bar.advance()
        return result

    def call_function(self, target, args, kwargs):
        if isinstance(target, torch._ops.OpOverload) and target.namespace != "profiler":
            node = self.node
            written = {i for i, a in enumerate(node.args) if a in mutated_args(node)}
            samples = []
            for k in range(self.warmup + self.repeats):
                call_args = tuple(a.clone() if i in written else a for i, a in enumerate(args))
                self.scratch.add_(1.0)
                start = self.clock()
                target(*call_args, **kwargs)
                elapsed = self.clock() - start
                if k >= self.warmup:
                    samples.append(elapsed / 1e3)
            self.times_us[node.name] = statistics.median(samples)
        return target(*args, **kwargs)

    def run(self, *args):
        try:
            return super().run(*args)
        finally:
            if self.bar is not None:
                self.bar.close()


class _progress:
    """A rich progress bar on stderr, silent when stderr is not a terminal."""

    def __init__(self, total: int):
        import sys

        self.progress = None
        if sys.stderr.isatty():
            from rich.progress import Progress

            self.progress = Progress(transient=True)
            self.progress.start()
            self.task = self.progress.add_task("timing ops", total=total)

    def advance(self) -> None:
        if self.progress is not None:
            self.progress.advance(self.task)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
