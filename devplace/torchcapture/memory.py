"""Which fx nodes allocate memory: storage identity of the FakeTensors in ``node.meta["val"]``.

Memory is storage, not tensors: a view, reshape, transpose or in-place op returns a tensor whose
storage already exists, so it allocates nothing (``output_bytes`` 0). The first node whose output
holds a storage owns it; every later reader of any alias of that storage keeps it alive, which is
why ``graph_from_fx`` adds an edge from the owner to each such reader.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef


def tensors_in(value) -> list[torch.Tensor]:
    """The tensors in a node value (a tensor, or a tuple/list of them, possibly with None)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    return []


def storage_key(t: torch.Tensor) -> int:
    return StorageWeakRef(t.untyped_storage()).cdata


def storage_bytes(value) -> int:
    """Bytes of the distinct storages under the tensors of ``value`` (what holding it keeps allocated)."""
    storages = {storage_key(t): t.untyped_storage().nbytes() for t in tensors_in(value)}
    return sum(storages.values())


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the tensor's own elements (what a transfer of it would move)."""
    return t.numel() * t.element_size()


@dataclass
class StorageMap:
    """Per node: new storage bytes it allocates; per storage: the node that owns it."""

    new_bytes: dict[str, int]
    owner: dict[int, str]  # storage key -> owning node name


def storage_map(gm: torch.fx.GraphModule) -> StorageMap:
    new_bytes: dict[str, int] = {}
    owner: dict[int, str] = {}
    for node in gm.graph.nodes:
        total = 0
        for t in tensors_in(node.meta.get("val")):
            key = storage_key(t)
            if key not in owner:
                owner[key] = node.name
                total += t.untyped_storage().nbytes()
        new_bytes[node.name] = total
    return StorageMap(new_bytes, owner)


# ATen ops that write arguments in place without an alias annotation in their schema:
# op name -> (positions written, position of the flag that must be True for the write).
# native_batch_norm in training mode updates running_mean and running_var.
UNDECLARED_WRITES = {"native_batch_norm": ((3, 4), 5)}


def mutated_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The argument nodes an op writes in place, from the alias annotations of its schema (and
    ``UNDECLARED_WRITES`` for the ops whose schema does not say so)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            values = value if isinstance(value, (list, tuple)) else [value]  # multi-tensor ops write lists
            out += [v for v in values if isinstance(v, torch.fx.Node)]
    written, flag = UNDECLARED_WRITES.get(schema.name.partition("::")[2], ((), None))
    if written and len(node.args) > flag and node.args[flag] is True:
        out += [node.args[i] for i in written if isinstance(node.args[i], torch.fx.Node)]
    return out
