"""Measured costs: the time of each graph op on the local device.

``measured_us`` runs the traced step on real tensors, whole and in order, several times and takes
each ATen op's median time. (The roofline model, which runs nothing, is ``devplace.costing``: it
needs no torch, so a graph can be re-costed for another cluster without it.)
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from devplace.errors import CaptureError
from devplace.progress import SILENT, current


def local_device_kind() -> str:
    return "gpu" if torch.cuda.is_available() else "cpu"


def local_device_model() -> str:
    """The name of the device measured times hold for (recorded in the graph's ``costed_for``)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        name = ""
    return f"this machine's CPU ({name or platform.processor() or platform.machine()})"


CLOCKS = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}


def measured_us(gm: torch.fx.GraphModule, real_args: list, op_names: list[str], *,
                repeats: int = 5, warmup: int = 1, progress: bool = True, clock: str = "wall") -> np.ndarray:
    """Median time (us) of each op in ``op_names`` on the local device; placeholders take 0.

    The whole graph runs ``warmup + repeats`` times in order, each from fresh copies of
    ``real_args``, and each op is timed where it runs. Timing an op alone and repeated instead
    (tried first) left 20-30% of the eager step out: an op repeated on its own finds its operands,
    its output block and its code hot and frees nothing, while in a step its operands come from other
    ops and the tensors whose last use it is are freed after it. Each op's time here includes those
    frees. The clock's own cost (what an empty window reads, about 0.8 us for the thread CPU clock
    on a VM, against ops of a few us in small graphs) is measured and taken off every op.

    ``clock="cpu"`` counts this thread's CPU time instead of wall time: on a shared machine with
    one intra-op thread it leaves out the time other processes held the core.
    """
    if clock not in CLOCKS:
        raise CaptureError(f"unknown clock {clock!r}: use one of {', '.join(CLOCKS)}")
    timer = _ReplayTimer(gm, CLOCKS[clock])
    samples: dict[str, list[float]] = {}
    reporter = current() if progress else SILENT   # the caller's progress hook (silent unless installed)
    reporter.begin("timing ops", total=warmup + repeats)
    try:
        for k in range(warmup + repeats):
            args = [a.clone() if isinstance(a, torch.Tensor) else a for a in real_args]
            # grad mode on, as in the step traced: the CPU LSTM kernel keeps the workspace its
            # backward reads only then (the values require no grad, so no autograd graph is built)
            with torch.enable_grad():
                timer.run(*args)
            if k >= warmup:
                for name, us in timer.times_us.items():
                    samples.setdefault(name, []).append(us)
            reporter.update(k + 1)
    finally:
        reporter.end()
    return np.array([statistics.median(samples[name]) if name in samples else 0.0 for name in op_names])


def clock_overhead_ns(clock, samples: int = 2001) -> float:
    """Median reading of an empty timing window: what each timed op's reading has on top of the op."""
    readings = []
    for _ in range(samples):
        start = clock()
        readings.append(clock() - start)
    return statistics.median(readings)


class _ReplayTimer(torch.fx.Interpreter):
    """Runs the graph in order, timing each ATen op's call together with the freeing of the values
    whose last use it is (where a framework frees them too)."""

    def __init__(self, gm: torch.fx.GraphModule, clock):
        super().__init__(gm, garbage_collect_values=False)
        self.clock = clock
        self.empty_ns = clock_overhead_ns(clock)
        last_user: dict[torch.fx.Node, torch.fx.Node] = {}
        for node in gm.graph.nodes:
            for value in node.all_input_nodes:
                last_user[value] = node
        self.dying: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        for value, user in last_user.items():
            self.dying.setdefault(user, []).append(value)
        self.times_us: dict[str, float] = {}

    def run_node(self, n):
        if not (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                and n.target.namespace != "profiler"):
            value = super().run_node(n)
            self._free(n)
            return value
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        start = self.clock()
        value = n.target(*args, **kwargs)
        del args, kwargs
        self._free(n)
        self.times_us[n.name] = max(self.clock() - start - self.empty_ns, 0) / 1e3
        return value

    def _free(self, n) -> None:
        for value in self.dying.get(n, ()):
            self.env.pop(value, None)
