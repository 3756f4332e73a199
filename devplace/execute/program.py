"""A traced training step as a picklable list of instructions, ready to run on placed devices.

An fx ``GraphModule`` from ``make_fx`` cannot be sent to another process as it is (its ATen op
targets do not pickle, and a re-pickled module loses ``node.meta``), so ``Program.from_traced``
turns it into plain ``Instr`` records: the target as a name (``aten::addmm.default``), arguments
with ``Ref(node name)`` in place of nodes, constants as tensors, and each output's shape and dtype
(what a receiving process needs to allocate a buffer).

In-place ops become dataflow: the traced step updates parameters and optimizer state in place
(``param.add_(...)``) and later nodes name the original tensor. Here every reference after an
in-place write is redirected to the writing node, so a value read on another device is always the
updated one, whatever the placement. ``Program.final`` maps each placeholder to the node that holds
its value at the end of the step (its last writer), which is how updated parameters are read back.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch

from devplace.errors import DevplaceError


class ExecutionError(DevplaceError):
    """A placed training step could not be run (an op failed, a rank died or hung)."""


@dataclass(frozen=True)
class Ref:
    """A reference to the value of the instruction named ``name``."""

    name: str


@dataclass
class Instr:
    name: str
    op: str  # placeholder | get_attr | call_function
    target: str  # encoded callable for call_function; the attribute/placeholder name otherwise
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    shape: tuple | None = None  # of the output tensor, when the output is one tensor
    dtype: torch.dtype | None = None
    stride: tuple | None = None  # of the output tensor as traced (a receiver restores it)
    inputs: tuple[str, ...] = ()  # names referenced in args/kwargs, in order, without repeats
    after: tuple[str, ...] = ()  # earlier readers of the value this op writes in place: run them first


def encode_target(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    if getattr(target, "__module__", None) in ("_operator", "operator") and hasattr(operator, target.__name__):
        return f"operator:{target.__name__}"
    module = getattr(target, "__module__", None)
    return f"python:{module}:{target.__qualname__}"


_decoded: dict[str, object] = {}


def decode_target(text: str):
    """The callable ``encode_target`` named (cached)."""
    fn = _decoded.get(text)
    if fn is not None:
        return fn
    if text.startswith("operator:"):
        fn = getattr(operator, text.split(":", 1)[1])
    elif text.startswith("python:"):
        import importlib

        _, module, qualname = text.split(":", 2)
        fn = importlib.import_module(module)
        for part in qualname.split("."):
            fn = getattr(fn, part)
    else:
        qualified, overload = text.rsplit(".", 1)
        namespace, name = qualified.split("::", 1)
        fn = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    _decoded[text] = fn
    return fn


def _mutated_positions(target) -> list[int]:
    """Positions of the arguments an ATen op writes in place (schema alias annotations)."""
    if not isinstance(target, torch._ops.OpOverload):
        return []
    return [
        i for i, arg in enumerate(target._schema.arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    ]


def _returns_alias(target) -> bool:
    """Whether an ATen op's result shares storage with an argument (views, in-place ops)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return len(returns) == 1 and returns[0].alias_info is not None


@dataclass
class Program:
    instrs: list[Instr]
    outputs: dict[str, str]  # output label -> instruction name (loss, param:NAME, grad:NAME)
    final: dict[str, str]  # placeholder name -> instruction holding its value after the step
    placeholder_kinds: dict[str, str] = field(default_factory=dict)  # name -> param/buffer/state/input
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    storage: dict[str, str] = field(default_factory=dict)  # view or in-place result -> storage owner

    def __post_init__(self) -> None:
        self.index = {ins.name: i for i, ins in enumerate(self.instrs)}

    def __len__(self) -> int:
        return len(self.instrs)

    @classmethod
    def from_traced(cls, traced) -> "Program":
        """Build from a capture ``TracedStep`` (``gm`` returning ``(loss, grads)``)."""
        gm = traced.gm
        current: dict[str, str] = {}  # node name -> node holding its latest value
        instrs: list[Instr] = []
        constants: dict[str, torch.Tensor] = {}
        readers: dict[str, list[str]] = {}  # storage -> instructions that read it (any alias) so far
        storage: dict[str, str] = {}  # value -> the value that owns its storage (views share it)

        def ref(node: torch.fx.Node) -> Ref:
            return Ref(current.get(node.name, node.name))

        for node in gm.graph.nodes:
            if node.op == "output":
                loss, grads = node.args[0]
                outputs = {"loss": current.get(loss.name, loss.name)}
                for pname, g in zip(traced.param_names, grads):
                    if isinstance(g, torch.fx.Node):
                        outputs[f"grad:{pname}"] = current.get(g.name, g.name)
                continue
            val = node.meta.get("val")
            shape = tuple(int(s) for s in val.shape) if isinstance(val, torch.Tensor) else None
            dtype = val.dtype if isinstance(val, torch.Tensor) else None
            stride = tuple(int(s) for s in val.stride()) if isinstance(val, torch.Tensor) else None
            if node.op == "placeholder":
                instrs.append(Instr(node.name, "placeholder", node.name, shape=shape, dtype=dtype, stride=stride))
                continue
            if node.op == "get_attr":
                value = getattr(gm, node.target)
                constants[node.name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
                instrs.append(Instr(node.name, "get_attr", node.target, shape=shape, dtype=dtype, stride=stride))
                continue
            if node.op != "call_function":
                raise ExecutionError(f"node {node.name!r} is a {node.op!r} node, which the executor cannot run")
            args = torch.fx.node.map_arg(node.args, ref)
            kwargs = torch.fx.node.map_arg(node.kwargs, ref)
            inputs: list[str] = []
            torch.fx.node.map_aggregate((args, kwargs), lambda a: inputs.append(a.name) if isinstance(a, Ref) and a.name not in inputs else None)
            after: list[str] = []
            for pos in _mutated_positions(node.target):
                written = node.args[pos] if pos < len(node.args) else None
                if isinstance(written, torch.fx.Node):
                    owner = storage.get(current.get(written.name, written.name), written.name)
                    after += [r for r in readers.get(owner, []) if r != node.name and r not in after]
            instrs.append(Instr(node.name, "call_function", encode_target(node.target), tuple(args), dict(kwargs),
                                shape, dtype, stride, tuple(inputs), tuple(after)))
            if _returns_alias(node.target) and args and isinstance(args[0], Ref):
                storage[node.name] = storage.get(args[0].name, args[0].name)
            for name in inputs:
                readers.setdefault(storage.get(name, name), []).append(node.name)
            for pos in _mutated_positions(node.target):
                written = node.args[pos] if pos < len(node.args) else None
                if isinstance(written, torch.fx.Node):
                    # the op returns the tensor it wrote (in-place and out= ops do)
                    root = written.name
                    latest = current.get(root, root)
                    for base, holder in list(current.items()):
                        if holder == latest:
                            current[base] = node.name
                    current[root] = current[latest] = node.name
        final = {name: current.get(name, name) for name in traced.placeholder_info}
        for pname in traced.param_names:
            placeholder = next(n for n, (k, owner) in traced.placeholder_info.items() if k == "param" and owner == pname)
            outputs[f"param:{pname}"] = final[placeholder]
        kinds = {name: kind for name, (kind, _owner) in traced.placeholder_info.items()}
        return cls(instrs, outputs, final, kinds, constants, storage)

    # ------------------------------------------------------------------ analysis
    @property
    def written(self) -> set[str]:
        """Values whose storage (through any view) some op overwrites in place: a send must copy
        them, or the peer may receive the overwritten data (sends complete asynchronously)."""
        owners: set[str] = set()
        for ins in self.instrs:
            if ins.op != "call_function":
                continue
            for pos in _mutated_positions(decode_target(ins.target)):
                if pos < len(ins.args) and isinstance(ins.args[pos], Ref):
                    owners.add(self.storage.get(ins.args[pos].name, ins.args[pos].name))
        return {ins.name for ins in self.instrs if self.storage.get(ins.name, ins.name) in owners}

    def users(self) -> dict[str, list[str]]:
        users: dict[str, list[str]] = {ins.name: [] for ins in self.instrs}
        for ins in self.instrs:
            for name in ins.inputs:
                users[name].append(ins.name)
        return users
