"""Turning a traced training step (fx graph) into an ``OpGraph``.

Graph ops are the fx placeholders (parameters, buffers, optimizer state, inputs) and the ATen
call_function nodes, named as in the fx graph so an executor can map each op back to its node.
Other nodes (``getitem``, Python arithmetic on symbolic scalars, profiler markers) are glue:
an edge through them joins the ATen ops on either side. One kind of ``getitem`` is an op of its
own, an *output member* (``output_members``): where a forward or backward op returns tensors that
different ops read (batch norm's output and the statistics its backward reads; a convolution
backward's input gradient and the weight gradient the update reads), each later tensor is a
zero-time op on its producer's device, so it stays allocated only while its own readers need it.
An op has one output buffer in the graph, so otherwise the statistics' reader would keep the
batch-norm output allocated through the turn of the step, as PyTorch does not.

Edges: each data dependency (bytes of the tensor passed); an edge from a storage's owner to every
op that reads an alias of it (0 bytes), so the owner's output stays allocated while a view of it
is in use; and an edge from every earlier reader of a storage to an op that writes it in place
(0 bytes, ``order_only``), so no placement can run an update before the reads it must follow. The
last kind orders and nothing more: the writer does not read the reader's output, so it must not
keep it allocated (a classifier's logits would otherwise live until its weight's update). So is the
edge from an op that writes a storage in place and returns new tensors besides (batch norm and its
running statistics) to a later reader of that storage: the reader needs the write done, not the
writer's output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from devplace.torchcapture.flops import GPU_KERNELS, HOST_OPS, node_bytes, node_dtype, node_flops, op_name
from devplace.torchcapture.memory import (mutated_args, storage_bytes, storage_key, storage_map, tensor_bytes,
                                          tensors_in)
from devplace.torchcapture.trace import TracedStep, _phase, mirror_of, scope_of
from devplace.graph import GraphBuilder, OpGraph, Role

SCALAR_EDGE_BYTES = 8.0  # a Python/symbolic scalar passed between ops
# An element becomes an output member only if the op's other elements hold at least this: below it the
# memory is noise beside a device's, each member is one more op for every placer, and the learners'
# shipped models were trained on the small graphs, which have none (their features rank op kinds).
MEMBER_MIN_BYTES = 2**20


def is_op_node(node: torch.fx.Node) -> bool:
    if node.op == "placeholder":
        return True
    return (
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target.namespace != "profiler"
    )


@dataclass
class OpStats:
    """Per-op figures the cost models and the graph need, in graph op order."""

    nodes: list[torch.fx.Node]
    flops: np.ndarray
    bytes_read: np.ndarray
    bytes_written: np.ndarray
    launches: np.ndarray  # kernel launches: 0 for placeholders and views, a piece's share for split updates
    dtypes: list[str]  # the dtype an op computes in ("float32", "bfloat16", ...; "" without a kernel)
    estimated: list[str]  # op kinds whose FLOPs are shape estimates
    members: dict[str, str]  # output member (a getitem node) -> the op whose output it takes (output_members)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]


def op_stats(traced: TracedStep) -> OpStats:
    storages = storage_map(traced.gm)
    members = output_members(traced.gm, storages)
    nodes = [n for n in traced.gm.graph.nodes if is_op_node(n) or n.name in members]
    n = len(nodes)
    flops, read, written = np.zeros(n), np.zeros(n), np.zeros(n)
    launches = np.zeros(n)
    dtypes = [""] * n
    estimated: set[str] = set()
    for i, node in enumerate(nodes):
        if node.op == "placeholder" or node.name in members:  # no kernel: its producer computed it
            continue
        outputs = tensors_in(node.meta.get("val"))
        aliasing = bool(outputs) and storages.new_bytes[node.name] == 0 and not mutated_args(node)
        if aliasing:
            continue
        launches[i] = 0.0 if op_name(node.target) in HOST_OPS else (node.meta.get("custom") or {}).get("launches", 1.0)
        flops[i], guessed = node_flops(node)
        if guessed:
            estimated.add(op_name(node.target))
        read[i], written[i] = node_bytes(node)
        dtypes[i] = node_dtype(node)
    return OpStats(nodes, flops, read, written, launches, dtypes, sorted(estimated), members)


def output_members(gm: torch.fx.GraphModule, storages) -> dict[str, str]:
    """The ``getitem`` nodes that are ops of their own: getitem node -> the op it takes from.

    A forward or backward op's element ``k >= 1`` is one when it is a tensor the op allocated (in no
    other element) and the ops reading it are not those reading element 0 (``native_batch_norm``'s
    statistics, read by its backward; ``convolution_backward``'s weight gradient, read by the
    update), and the op's other elements hold at least ``MEMBER_MIN_BYTES``. Update ops are left
    whole: their elements are read at the end of the step, and a multi-tensor update would become
    one op per parameter. So are ops returning scalars only."""
    members: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or not is_op_node(node) or _phase(node) not in ("forward", "backward"):
            continue
        value = node.meta.get("val")
        if not isinstance(value, (tuple, list)) or len(value) < 2 or all(t.dim() == 0 for t in tensors_in(value)):
            continue  # one tensor, or scalars only (a loss and its weight): nothing worth freeing apart
        takes = {u.args[1]: u for u in node.users if u.target is _getitem and isinstance(u.args[1], int)}
        keys = [[storage_key(t) for t in tensors_in(element)] for element in value]
        sizes = [storage_bytes(element) for element in value]
        first_readers = set(takes[0].users) if 0 in takes else set()
        for k, getitem in takes.items():
            own = keys[k]
            if (k == 0 or not own or any(storages.owner.get(key) != node.name for key in own)
                    or any(key in other for j, other in enumerate(keys) if j != k for key in own)
                    or sum(sizes) - sizes[k] < MEMBER_MIN_BYTES):
                continue
            if set(getitem.users) != first_readers:
                members[getitem.name] = node.name
    return members


def build_graph(traced: TracedStep, stats: OpStats, compute_us: dict[str, np.ndarray], meta: dict,
                *, gpu_kernels: bool = False) -> OpGraph:
    """The OpGraph of the traced step with ``compute_us[kind][i]`` for op ``stats.nodes[i]``;
    ``gpu_kernels``: name CPU-only kernels after the op a GPU runs (``GPU_KERNELS``)."""
    gm = traced.gm
    storages = storage_map(gm)
    groups = _colocation(traced, storages)
    mirrors = mirror_of(gm)
    builder = GraphBuilder(list(compute_us))
    is_op = {node.name: True for node in stats.nodes}
    nodes_by_name = {node.name: node for node in stats.nodes}
    member_bytes: dict[str, float] = {}  # output member -> the bytes it takes from its producer's output
    taken: dict[str, float] = {}  # producer -> the bytes its members took
    holder_of = dict(storages.owner)  # storage key -> the op holding it: a member holds its own
    for name, producer in stats.members.items():
        value = nodes_by_name[name].meta.get("val")
        member_bytes[name] = float(storage_bytes(value))
        taken[producer] = taken.get(producer, 0.0) + member_bytes[name]
        holder_of.update((storage_key(t), name) for t in tensors_in(value))
        groups[name] = groups.setdefault(producer, f"outputs:{producer}")  # a tuple never crosses devices

    for i, node in enumerate(stats.nodes):
        times = {kind: float(col[i]) for kind, col in compute_us.items()}
        if node.op == "placeholder":
            kind, owner = traced.placeholder_info[node.name]
            size = float(storages.new_bytes[node.name])
            persistent = kind in ("param", "buffer", "state")
            builder.add_op(
                node.name, compute_us=times, kind=kind,
                persistent_bytes=size if persistent else 0.0, output_bytes=0.0 if persistent else size,
                colocation=groups.get(node.name), role=Role.OTHER,
            )
            continue
        producer = stats.members.get(node.name)
        role = {"forward": Role.FORWARD, "backward": Role.BACKWARD, "update": Role.UPDATE}.get(
            _phase(nodes_by_name[producer] if producer else node), Role.OTHER)
        if producer:  # allocated while its producer runs (a temporary there), then held on its own
            builder.add_op(node.name, compute_us=times, kind="getitem", output_bytes=member_bytes[node.name],
                           colocation=groups[node.name], role=role)
            continue
        mirror = mirrors.get(node.name) if role == Role.BACKWARD else None
        kind = op_name(node.target)
        moved = taken.get(node.name, 0.0)
        builder.add_op(
            node.name, compute_us=times, kind=GPU_KERNELS.get(kind, kind) if gpu_kernels else kind,
            output_bytes=float(storages.new_bytes[node.name]) - moved, temp_bytes=moved,
            colocation=groups.get(node.name), role=role, mirror=mirror if mirror in is_op else None,
        )

    edges: dict[tuple[str, str], float] = {}
    reads: set[tuple[str, str]] = set()  # pairs joined by at least one edge that is more than an order
    readers: dict[int, list[str]] = {}  # storage key -> ops that read it so far

    def add(src: str, dst: str, nbytes: float, order_only: bool = False) -> None:
        if src != dst:
            edges[(src, dst)] = max(edges.get((src, dst), 0.0), nbytes)
            if not order_only:
                reads.add((src, dst))

    producers = _producer_resolver(is_op)
    last_writer: dict[int, str] = {}  # storage key -> the op that last wrote it in place
    for node in stats.nodes:
        if node.op == "placeholder":
            continue
        if node.name in stats.members:  # it reads nothing: its producer made it (an order, not a read)
            add(stats.members[node.name], node.name, 0.0, order_only=True)
            continue
        read_keys: dict[int, None] = {}  # in argument order: keys are addresses, so a set's order changes per run
        for arg in node.all_input_nodes:
            for src, nbytes in producers(arg):
                add(src, node.name, nbytes)
            for t in tensors_in(arg.meta.get("val")):
                read_keys[storage_key(t)] = None
        for key in read_keys:
            holder = holder_of.get(key)
            if holder is not None and holder in is_op:
                add(holder, node.name, 0.0)
            if key in last_writer:  # an in-place op returning nothing (multi-tensor) has no data edge;
                writer = last_writer[key]  # one returning new tensors besides (batch norm) is read only in order
                add(writer, node.name, 0.0, order_only=storages.new_bytes[writer] > 0)
        for target in mutated_args(node):
            for t in tensors_in(target.meta.get("val")):
                for reader in readers.get(storage_key(t), []):
                    add(reader, node.name, 0.0, order_only=True)
                last_writer[storage_key(t)] = node.name
        for key in read_keys:
            readers.setdefault(key, []).append(node.name)
    for (src, dst), nbytes in edges.items():
        builder.add_edge(src, dst, bytes=nbytes, order_only=(src, dst) not in reads)
    builder.meta.update(meta)
    scopes = dict(zip(stats.names, op_scopes(traced, stats.nodes, mirrors)))
    builder.meta["op_scope"] = [scopes[stats.members.get(name, name)] for name in stats.names]  # a member: its producer's
    return builder.build()


def op_scopes(traced: TracedStep, nodes: list[torch.fx.Node], mirrors: dict[str, str]) -> list[str]:
    """Module path per op, so placers can read a captured graph's structure (op names stay fx names).

    Forward ops: the innermost module whose forward created them; backward ops: their mirror's;
    update ops, parameters, buffers and optimizer state: the owning parameter's module; others "".
    """
    forward = {n.name: scope_of(n) for n in traced.gm.graph.nodes if _phase(n) == "forward"}
    out = []
    for node in nodes:
        if node.op == "placeholder":
            kind, owner = traced.placeholder_info[node.name]
            out.append(owner.rpartition(".")[0] if kind in ("param", "buffer", "state") else "")
            continue
        phase = _phase(node)
        if phase == "forward":
            out.append(forward[node.name])
        elif phase == "backward":
            out.append(forward.get(mirrors.get(node.name), ""))
        elif phase == "update":
            out.append((node.meta.get("custom") or {}).get("param", "").rpartition(".")[0])
        else:
            out.append("")
    return out


def _producer_resolver(is_op: dict[str, bool]):
    """For an fx node, the graph ops whose outputs it carries, with the bytes of each."""
    cache: dict[str, list[tuple[str, float]]] = {}

    def producers(node: torch.fx.Node) -> list[tuple[str, float]]:
        if node.name in cache:
            return cache[node.name]
        value = node.meta.get("val")
        nbytes = float(sum(tensor_bytes(t) for t in tensors_in(value))) if tensors_in(value) else SCALAR_EDGE_BYTES
        if node.name in is_op:
            result = [(node.name, nbytes)]
        else:  # glue: getitem takes one element of its producer's output; others pass scalars on
            result = []
            for arg in node.all_input_nodes:
                result += [(src, nbytes if node.target is _getitem else b) for src, b in producers(arg)]
        cache[node.name] = result
        return result

    return producers


import operator as _operator  # noqa: E402

_getitem = _operator.getitem


def _colocation(traced: TracedStep, storages) -> dict[str, str]:
    """Op name -> group: a parameter with its optimizer state, gradient accumulation and update ops;
    a module's buffers with the ops that update them in place (one group per module, since one op,
    e.g. batch norm, updates several buffers of its module)."""
    gm = traced.gm
    group_of_storage: dict[int, str] = {}
    groups: dict[str, str] = {}
    nodes = {n.name: n for n in gm.graph.nodes}
    for name, (kind, owner) in traced.placeholder_info.items():
        if kind in ("param", "state", "buffer"):
            label = f"buffers:{owner.rpartition('.')[0]}" if kind == "buffer" else f"param:{owner}"
            groups[name] = label
            for t in tensors_in(nodes[name].meta.get("val")):
                group_of_storage[storage_key(t)] = label
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        custom = node.meta.get("custom") or {}
        if custom.get("phase") == "update" and "param" in custom and is_op_node(node):
            groups[node.name] = f"param:{custom['param']}"
            continue
        for target in mutated_args(node):
            for t in tensors_in(target.meta.get("val")):
                label = group_of_storage.get(storage_key(t))
                if label is not None and is_op_node(node):
                    groups[node.name] = label
    for param, grad in traced.grad_nodes.items():
        for name in _accumulation(nodes[grad]):
            groups.setdefault(name, f"param:{param}")
    return groups


def _accumulation(grad: torch.fx.Node) -> list[str]:
    """The ops that produce a gradient: views of it down to, and including, a summing ``add``."""
    out = []
    node = grad
    while node.op == "call_function" and is_op_node(node):
        name = op_name(node.target)
        if name == "add":
            out.append(node.name)
            break
        schema = node.target._schema
        if not (schema.returns and schema.returns[0].alias_info is not None):
            break
        out.append(node.name)
        node = node.args[0]
    return out
