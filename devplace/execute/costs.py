"""Op costs as the executor pays them: each graph op timed inside single-device runs of the program.

Capture times each ATen op in an ``fx.Interpreter`` replay; the executor runs more than that. It
also runs the glue the graph leaves out (``getitem``, scalar arithmetic, record_function markers:
18-60% more instructions than graph ops), and every instruction pays its bookkeeping (fetching
arguments, storing and freeing values). ``executed_costs_us`` runs the program through the same
``RankInterpreter`` a distributed rank uses, every op on one device, and gives each graph op the
wall time from the start of its instruction to the start of the next one (so the frees after it
and the loop's own cost are in), plus the time of the glue instructions it hosts: glue runs on the
device of its first input (schedule.py), so its cost travels with that producer; glue made from
constants alone (``ANYWHERE``: it runs on every device) is charged to its first costed reader;
record_function markers, which the interpreter skips, are charged to no op.

The per-op figure is the median over ``repeats`` runs after ``warmup``: on a shared machine the
runs another process interrupted are the slow ones, and the median leaves them out. Because the
executor's per-op cost is inside these times, a graph costed this way is simulated with the
cluster's ``op_gap_us`` set to 0 (``api.run`` does so).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import torch

from devplace.execute.distributed import RankInterpreter
from devplace.execute.program import Program
from devplace.execute.schedule import make_plan

EXECUTED_COST = "executed"


def host_ops(program: Program, graph) -> dict[str, int]:
    """Instruction name -> the graph op whose cost holds it: glue follows its first input (it runs
    on that device); glue computed from constants alone (scalar arithmetic on the optimizer's step
    count, run on every device) goes to its first reader that has a host."""
    host: dict[str, int] = {}
    for ins in program.instrs:
        op = graph.index_of.get(ins.name)
        if op is None:
            op = next((host[name] for name in ins.inputs if name in host), None)
        if op is not None:
            host[ins.name] = op
    users = program.users()
    for ins in reversed(program.instrs):
        if ins.name not in host:
            op = next((host[u] for u in users[ins.name] if u in host), None)
            if op is not None:
                host[ins.name] = op
    return host


def instruction_times_us(program: Program, graph, state: dict, *, repeats: int = 7, warmup: int = 2) -> dict[str, float]:
    """Median wall time (us) of every instruction in single-device runs through the rank interpreter."""
    from devplace.placement import Placement

    plan = make_plan(program, graph, Placement(devices=np.zeros(graph.n_ops, dtype=np.int64)), 1)
    interp = RankInterpreter(program, plan, 0, torch.device("cpu"), {})
    samples: dict[str, list[float]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a device process runs (distributed.py)
    try:
        for k in range(warmup + repeats):
            interp.state = {name: v.clone() for name, v in state.items()}  # a step updates its inputs in place
            interp.timeline = [] if k >= warmup else None  # each instruction's start (no receives on one device)
            interp.run()
            ended = time.perf_counter_ns()
            if k < warmup:
                continue
            stamps = [(name, start) for _kind, name, _peer, start, _end in interp.timeline] + [("", ended)]
            for (name, t0), (_, t1) in zip(stamps, stamps[1:]):
                samples.setdefault(name, []).append((t1 - t0) / 1e3)
    finally:
        torch.set_num_threads(threads)
    return {name: statistics.median(values) for name, values in samples.items()}


def fold_into_hosts(times_us: dict[str, float], program: Program, graph) -> np.ndarray:
    """Per graph op: its own instruction's time plus that of the glue it hosts."""
    host = host_ops(program, graph)
    costs = np.zeros(graph.n_ops)
    for name, us in times_us.items():
        if name in host:
            costs[host[name]] += us
    return costs


def executed_costs_us(program: Program, graph, state: dict, *, repeats: int = 7, warmup: int = 2) -> np.ndarray:
    """Per graph op: its time and its glue's as the executor runs them on one device."""
    return fold_into_hosts(instruction_times_us(program, graph, state, repeats=repeats, warmup=warmup), program, graph)


def with_executed_costs(graph, program: Program, state: dict, *, repeats: int = 7, warmup: int = 2):
    """A copy of ``graph`` whose every device kind's time is the executed cost (one CPU kind here)."""
    costs = executed_costs_us(program, graph, state, repeats=repeats, warmup=warmup)
    compute = np.repeat(costs[:, None], len(graph.device_kinds), axis=1)
    glue = sum(1 for ins in program.instrs if ins.name not in graph.index_of)
    meta = {**graph.meta, "cost_model": f"{EXECUTED_COST} (rank interpreter, median of {repeats}, "
                                        f"{glue} glue instructions folded into their hosts)"}
    return dataclasses.replace(graph, compute_us=compute, meta=meta)
