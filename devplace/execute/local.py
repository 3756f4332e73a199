"""The one-process backend: every device is a torch device of this process (``cuda:i`` or ``cpu``).

Values cross devices with ``.to(device)``, non-blocking where the device allows it. On GPUs each
device runs its ops on its own stream, and a copy to another device first makes the destination
stream wait for the source stream, so devices overlap as far as the data lets them.

Asked for a timeline, the last step records every instruction in this one process's order (on GPUs
the times are when the host issued the work, not when the device ran it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time

import numpy as np
import torch

from devplace.execute.interpreter import PlacedInterpreter, merge_timeline, move_value, timeline_part
from devplace.execute.program import ExecutionError, Program
from devplace.execute.schedule import ANYWHERE, Plan


def parse_devices(names: list[str], n_devices: int) -> list[torch.device]:
    """One torch device per placement device: the names given, else ``cpu`` for each."""
    if not names:
        names = ["cpu"] * n_devices
    if len(names) != n_devices:
        raise ExecutionError(
            f"the placement uses {n_devices} devices but {len(names)} were given ({', '.join(names)}): "
            f"give one --device per placement device"
        )
    devices = []
    for name in names:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise ExecutionError(f"{name!r} is not a torch device: use cpu or cuda:N") from None
        if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
            raise ExecutionError(f"device {name!r} is not available on this machine (torch sees {torch.cuda.device_count()} GPUs)")
        devices.append(device)
    return devices


class LocalInterpreter(PlacedInterpreter):
    """Runs every instruction in this process, with one stream per GPU."""

    def __init__(self, program: Program, devices: list[torch.device], state: dict):
        super().__init__(program, devices, state)
        self.streams = {d: torch.cuda.Stream(d) for d in set(devices) if d.type == "cuda"}

    def run_node(self, ins):
        device = self.devices[self.program.index[ins.name]]
        stream = self.streams.get(device)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            super().run_node(ins)

    def move(self, name, value, device):
        source = next(iter(self.env[name]))
        src_stream, dst_stream = self.streams.get(source), self.streams.get(device)
        if dst_stream is not None and src_stream is not None:
            dst_stream.wait_stream(src_stream)
        moved = move_value(value, device, non_blocking=device.type == "cuda" or source.type == "cuda")
        if src_stream is not None and isinstance(value, torch.Tensor):
            value.record_stream(dst_stream or src_stream)
        return moved

    def synchronize(self) -> None:
        for stream in self.streams.values():
            stream.synchronize()


def as_executed(cluster, placement, devices: list[torch.device]) -> tuple:
    """(cluster, placement, description) to simulate so that the simulated step is the one this
    backend runs. No value crosses a process here, so no per-message overheads are paid; on CPUs
    every device is this process's one thread, which runs every op in turn with no copies, so the
    step is every op on one device; GPUs overlap, and their copies pay the link's latency and
    bandwidth."""
    if all(d.type == "cpu" for d in devices):
        return (cluster, np.zeros(len(placement), dtype=np.int64),
                "every op in turn on this process's one CPU thread; values moved between CPU devices are not "
                "copied (local backend)")
    quiet = {name: np.zeros_like(getattr(cluster, name)) for name in ("send_overhead_us", "recv_overhead_us")}
    return (dataclasses.replace(cluster, **quiet), placement,
            f"{cluster.name} without per-message overheads: one process sends no messages (local backend)")


def instruction_devices(plan: Plan, devices: list[torch.device]) -> list[torch.device]:
    """The torch device of each instruction; constants go to the device of their first reader."""
    out = [devices[h] if h != ANYWHERE else None for h in plan.home.tolist()]
    return [d if d is not None else devices[0] for d in out]


def run_local(program: Program, plan: Plan, state: dict, devices: list[torch.device], *,
              steps: int = 5, warmup: int = 1, timeline: bool = False) -> tuple:
    """Run ``warmup + steps`` training steps; (outputs of the first step on CPU, measured step times),
    and with ``timeline`` the last step's timeline (interpreter.merge_timeline) third."""
    threads = torch.get_num_threads()
    if all(d.type == "cpu" for d in devices):
        torch.set_num_threads(1)  # a CPU device is one thread, as in the distributed backend
    try:
        return _run_steps(program, plan, state, devices, steps, warmup, timeline)
    finally:
        torch.set_num_threads(threads)


def _run_steps(program, plan, state, devices, steps, warmup, timeline):
    placed = instruction_devices(plan, devices)
    state = {name: move_value(v, placed[program.index[name]]) for name, v in state.items()}
    interp = LocalInterpreter(program, placed, state)
    first: dict = {}
    times_us: list[float] = []
    part = None
    for step in range(warmup + steps):
        interp.timeline = [] if timeline and step == warmup + steps - 1 else None
        started = time.perf_counter_ns()
        out = interp.run(plan.order)
        interp.synchronize()
        elapsed_us = (time.perf_counter_ns() - started) / 1e3
        if step == 0:
            first = {k: v.detach().to("cpu", copy=True) for k, v in out.items()}
        if step >= warmup:
            times_us.append(elapsed_us)
        if interp.timeline is not None:
            home = [max(int(h), 0) for h in plan.home.tolist()]  # constants' glue runs on device 0
            part = timeline_part(interp.timeline, started, lambda name: home[program.index[name]])
            part["device_end_us"] = {d: elapsed_us for d in range(len(devices))}
    if timeline:
        return first, times_us, merge_timeline([part])
    return first, times_us


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")
