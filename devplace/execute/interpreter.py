"""Running a ``Program`` one instruction at a time, each on the device it is placed on.

Modelled on ``torch.fx.Interpreter``: one overridable method per kind of instruction, values freed
at their last use from a map computed before the run, and any failure re-raised naming the op::

    run(order)
      for each instruction in order:
        run_node(ins)
          args, kwargs = fetch_args(ins, device)   # Ref -> value on `device` (via fetch)
            fetch(name, device)                    # cached copy, or move_value / receive
          value = placeholder | get_attr | call_function (ins, args, kwargs)
          store(ins, value)                        # keep it; a distributed rank also sends it
        free every value whose last use this was

>>> import torch
>>> from devplace.execute.program import Instr, Program, Ref
>>> prog = Program([Instr("x", "placeholder", "x"),
...                 Instr("y", "call_function", "aten::mul.Tensor", (Ref("x"), Ref("x")), inputs=("x",))],
...                outputs={"loss": "y"}, final={})
>>> cpu = torch.device("cpu")
>>> PlacedInterpreter(prog, [cpu, cpu], {"x": torch.tensor(3.0)}).run()["loss"].item()
9.0

A subclass changes how values travel: ``LocalInterpreter`` (local.py) copies them with ``.to``;
``RankInterpreter`` (distributed.py) sends and receives them with torch.distributed.

Recording: set ``timeline`` to a list before ``run`` and every instruction appends
``("op", name, -1, start_ns, end_ns)`` (``time.perf_counter_ns``); a rank also appends its receive
waits and send postings (``"wait"``/``"send"``, with the peer). An op starts when its inputs are in:
after the last receive wait inside its instruction, if any (``ready_ns``). ``timeline_part`` turns
the records into the plain dicts ``RunResult.timeline`` holds. Left at None, recording costs one
test per instruction.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import torch
from torch.utils._pytree import tree_map

from devplace.execute.program import ExecutionError, Instr, Program, Ref, decode_target


def move_value(value, device: torch.device, non_blocking: bool = False):
    """``value`` (a tensor, or a structure holding tensors) on ``device``."""
    return tree_map(
        lambda v: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v, value
    )


class PlacedInterpreter:
    """Runs ``program`` with instruction ``i`` on ``devices[i]``.

    ``state`` holds the placeholder values (already on their devices); outputs named in
    ``program.outputs`` are returned by ``run`` and never freed early.
    """

    def __init__(self, program: Program, devices: list[torch.device], state: dict):
        self.program = program
        self.devices = devices
        self.state = state
        self.env: dict[str, dict[torch.device, object]] = {}
        self.keep = set(program.outputs.values())
        self.timeline: list | None = None  # a list: record this run (see the module docstring)
        self.ready_ns = 0

    # ------------------------------------------------------------------ driver
    def run(self, order: Iterable[int] | None = None) -> dict:
        order = list(range(len(self.program))) if order is None else list(order)
        last_use = self.last_use_map(order)
        self.env = {}
        timeline = self.timeline
        for position, i in enumerate(order):
            ins = self.program.instrs[i]
            self.current = ins
            try:
                if timeline is None:
                    self.run_node(ins)
                else:
                    self.ready_ns = time.perf_counter_ns()
                    self.run_node(ins)
                    self.record("op", ins.name, -1, self.ready_ns)
            except ExecutionError:
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised naming the op
                raise ExecutionError(
                    f"op {ins.name!r} ({ins.target}) on {self.devices[self.program.index[ins.name]]} failed: "
                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                ) from exc
            for name in last_use.get(position, ()):
                self.env.pop(name, None)
        self.current = None
        return self.collect_outputs()

    def record(self, kind: str, name: str, peer: int, start_ns: int) -> int:
        """Append a ``kind`` event on ``name`` with ``peer`` from ``start_ns`` to now; return now."""
        end = time.perf_counter_ns()
        self.timeline.append((kind, name, peer, start_ns, end))
        return end

    def last_use_map(self, order: list[int]) -> dict[int, list[str]]:
        """Position in ``order`` -> names whose last reader runs there (outputs are kept)."""
        last: dict[str, int] = {}
        for position, i in enumerate(order):
            ins = self.program.instrs[i]
            last.setdefault(ins.name, position)
            for name in ins.inputs:
                last[name] = position
        by_position: dict[int, list[str]] = {}
        for name, position in last.items():
            if name not in self.keep:
                by_position.setdefault(position, []).append(name)
        return by_position

    def run_node(self, ins: Instr) -> None:
        device = self.devices[self.program.index[ins.name]]
        args, kwargs = self.fetch_args(ins, device)
        value = getattr(self, ins.op)(ins, args, kwargs, device)
        self.store(ins, value, device)

    def collect_outputs(self) -> dict:
        out = {}
        for label, name in self.program.outputs.items():
            copies = self.env.get(name)
            if copies:
                out[label] = next(iter(copies.values()))
        return out

    # ------------------------------------------------------------------ values
    def fetch_args(self, ins: Instr, device: torch.device):
        def load(a):
            return self.fetch(a.name, device) if isinstance(a, Ref) else a

        args = tuple(torch.fx.node.map_aggregate(ins.args, load))
        kwargs = dict(torch.fx.node.map_aggregate(ins.kwargs, load))
        return args, kwargs

    def fetch(self, name: str, device: torch.device):
        copies = self.env.get(name)
        if copies is None:
            raise ExecutionError(f"value {name!r} is needed before it was computed: the order is not topological")
        if device in copies:
            return copies[device]
        value = self.move(name, next(iter(copies.values())), device)
        copies[device] = value
        return value

    def move(self, name: str, value, device: torch.device):
        return move_value(value, device)

    def store(self, ins: Instr, value, device: torch.device) -> None:
        self.env[ins.name] = {device: value}

    # ------------------------------------------------------------------ instruction kinds
    def placeholder(self, ins: Instr, args, kwargs, device: torch.device):
        try:
            value = self.state[ins.name]
        except KeyError:
            raise ExecutionError(f"no value for placeholder {ins.name!r}") from None
        return value

    def get_attr(self, ins: Instr, args, kwargs, device: torch.device):
        return move_value(self.program.constants[ins.name], device)

    def call_function(self, ins: Instr, args, kwargs, device: torch.device):
        if ins.target.startswith("profiler::"):
            return None  # record_function markers the optimizer leaves: no effect on any value
        if isinstance(kwargs.get("device"), torch.device):
            kwargs["device"] = device  # factory ops create on the placed device
        return decode_target(ins.target)(*args, **kwargs)


TIMELINE_KINDS = {"op": "ops", "wait": "waits", "send": "sends"}


def timeline_part(records: list, origin_ns: int, device_of: Callable[[str], int]) -> dict[str, list[dict]]:
    """Recorded ``(kind, name, peer, start_ns, end_ns)`` events as ``{"ops": [...], "waits": [...],
    "sends": [...]}``: each a dict with name, device, start_us and end_us after ``origin_ns`` (and
    the peer device for waits and sends)."""
    out: dict[str, list[dict]] = {key: [] for key in TIMELINE_KINDS.values()}
    for kind, name, peer, start, end in records:
        event = {"name": name, "device": device_of(name),
                 "start_us": (start - origin_ns) / 1e3, "end_us": (end - origin_ns) / 1e3}
        if peer >= 0:
            event["peer"] = peer
        out[TIMELINE_KINDS[kind]].append(event)
    return out


def merge_timeline(parts: list[dict]) -> dict:
    """One step's timeline from the parts the devices recorded (each with ``device_end_us``, its
    device -> when its part of the step ended): ops, waits and sends sorted by device and start,
    ``device_end_us`` as a list and ``step_time_us`` the latest end."""
    ends: dict[int, float] = {}
    merged: dict = {key: [] for key in TIMELINE_KINDS.values()}
    for part in parts:
        ends.update(part["device_end_us"])
        for key in TIMELINE_KINDS.values():
            merged[key].extend(part[key])
    for key in TIMELINE_KINDS.values():
        merged[key].sort(key=lambda e: (e["device"], e["start_us"]))
    merged["device_end_us"] = [ends[d] for d in sorted(ends)]
    merged["step_time_us"] = max(ends.values(), default=0.0)
    return merged
