"""Where each instruction runs, in which order, and the send/receive plan that cannot deadlock.

Devices: an instruction that is a graph op (placeholder or ATen op) runs where the placement puts
it. Glue the graph leaves out (``getitem``, scalar arithmetic) runs with its first input, so tuples
never cross devices; glue without inputs (constants) runs on every device that wants it
(``ANYWHERE``).

Order: one global topological order of the instructions, ready ones taken lowest priority first
(the placement's ``priority`` if it has one, else the graph's topological rank), ties by position.
Each device runs its own instructions in that order, so the devices' orders are restrictions of one
topological order.

Communication: one event per (value, receiving device). The sender posts a non-blocking send right
after computing the value; a receiver posts its receives from device ``s`` in the sender's order,
ahead of need (distributed.py) and at the latest when it needs the value, and then waits for it.
Deadlock is impossible: take the earliest instruction in the global order that has not finished;
everything it reads was computed earlier in that order and its sends are posted without waiting,
so its receives complete. Tags are event numbers, so messages can never be confused.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from devplace.errors import PlacementError
from devplace.execute.program import Program

ANYWHERE = -1


@dataclass
class Plan:
    home: np.ndarray  # device per instruction, ANYWHERE for constants
    order: list[int]  # global order of instruction indices
    rank_order: list[list[int]]  # per device
    sends: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # instr -> [(dst, tag)]
    recvs: list[dict[int, list[tuple[str, int]]]] = field(default_factory=list)  # dst -> {src: [(name, tag)]}

    @property
    def n_transfers(self) -> int:
        return sum(len(v) for v in self.sends.values())


def carried_over(placement, graph, placed_graph):
    """``placement``, made on ``placed_graph`` (the same step captured with foreach or fused optimizer
    updates, as ``devplace place`` captures by default), for ``graph``, the per-parameter capture the
    executor runs; None if it was not made on ``placed_graph``.

    Forward and backward ops are the same ops in both captures and keep their devices; each update
    op goes where its colocation group (its parameter and optimizer state) was placed."""
    from devplace.graph import Role
    from devplace.placement import Placement, graph_fingerprint

    if len(placement) != placed_graph.n_ops or (
            placement.graph_fingerprint and placement.graph_fingerprint != graph_fingerprint(placed_graph.names)):
        return None
    placed_role = np.asarray(placed_graph.role)
    device_of = {name: int(d) for name, d, role in zip(placed_graph.names, placement.devices, placed_role)
                 if role != Role.UPDATE}
    devices = np.array([device_of.get(name, -1) if role != Role.UPDATE else -1
                        for name, role in zip(graph.names, np.asarray(graph.role))], dtype=np.int64)
    for members in graph.colocation_members:
        known = devices[members][devices[members] >= 0]
        if len(known):
            devices[members[devices[members] < 0]] = known[0]
    for v in graph.topo_order:  # anything left (a step counter) follows its first placed input
        if devices[v] < 0:
            inputs = graph.predecessors(v)
            placed = inputs[devices[inputs] >= 0]
            devices[v] = placed[0] if len(placed) else 0
    return Placement(devices=devices, algorithm=placement.algorithm,
                     options=placement.options | {"carried_over_from_ops": placed_graph.n_ops},
                     device_names=placement.device_names, graph_fingerprint=graph_fingerprint(graph.names))


def check_against_graph(program: Program, graph, placement, cluster) -> None:
    """Refuse a graph/placement that does not describe this traced step (before anything starts)."""
    if len(placement) != graph.n_ops:  # the executor runs the per-parameter optimizer step
        raise PlacementError(
            f"the placement has {len(placement)} entries but the graph has {graph.n_ops} ops (the step the "
            f"executor runs): it was made for another graph; place this target's default capture (`devplace "
            f"place TARGET`) or the graph of `devplace profile TARGET --update per-parameter -o graph.json`"
        )
    placement.check(graph, cluster)
    missing = [name for name in graph.names if name not in program.index]
    if missing:
        raise PlacementError(
            f"graph op {missing[0]!r} (and {len(missing) - 1} more) is not in the traced step: "
            f"the graph was captured from another model or configuration; capture it again"
        )
    split = placement.colocation_violations(graph)
    if split:
        raise PlacementError(
            f"the placement splits colocation group {split[0]!r} across devices; the executor needs a "
            f"parameter, its optimizer state and its in-place updates on one device: place again with a "
            f"placer that honours colocation (devplace place)"
        )


def make_plan(program: Program, graph, placement, n_devices: int) -> Plan:
    n = len(program)
    index = program.index
    graph_devices = placement.devices
    if placement.priority is not None:
        op_key = np.asarray(placement.priority, dtype=np.float64)
    else:
        op_key = graph.topo_rank.astype(np.float64)
    home = np.full(n, ANYWHERE, dtype=np.int64)
    key = np.full(n, -np.inf)
    for i, ins in enumerate(program.instrs):
        op = graph.index_of.get(ins.name)
        if op is not None:
            home[i] = graph_devices[op]
            key[i] = op_key[op]
            continue
        for name in ins.inputs:
            j = index[name]
            if home[j] != ANYWHERE:
                home[i], key[i] = home[j], key[j]
                break
    order = _priority_topological_order(program, key)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)

    rank_order = [[i for i in order if home[i] in (d, ANYWHERE)] for d in range(n_devices)]
    # one event per (value, device that reads it), numbered in the global order of the producers
    wanted: dict[int, set[int]] = {}
    for i, ins in enumerate(program.instrs):
        readers = [home[i]] if home[i] != ANYWHERE else []
        for name in ins.inputs:
            j = index[name]
            if home[j] != ANYWHERE and home[i] != ANYWHERE and home[i] != home[j]:
                wanted.setdefault(j, set()).add(int(home[i]))
        del readers
    sends: dict[int, list[tuple[int, int]]] = {}
    recvs: list[dict[int, list[tuple[str, int]]]] = [dict() for _ in range(n_devices)]
    tag = 0
    for j in sorted(wanted, key=lambda j: position[j]):
        for dst in sorted(wanted[j]):
            sends.setdefault(j, []).append((dst, tag))
            recvs[dst].setdefault(int(home[j]), []).append((program.instrs[j].name, tag))
            tag += 1
    return Plan(home, order, rank_order, sends, recvs)


def _priority_topological_order(program: Program, key: np.ndarray) -> list[int]:
    n = len(program)
    index = program.index
    users: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    for i, ins in enumerate(program.instrs):
        for name in dict.fromkeys(ins.inputs + ins.after):
            users[index[name]].append(i)
            indegree[i] += 1
    ready = [(key[i], i) for i in range(n) if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(ready, (key[u], u))
    if len(order) != n:
        raise PlacementError("the traced step has a dependency cycle; this is a bug in capture")
    return order
