"""FLOPs and bytes moved per ATen op, from the shapes of its fake inputs and outputs.

Known ops use ``torch.utils.flop_counter``'s formulas. Others get an estimate from shapes: CPU
attention and RNN kernels by their matrix products, everything else one FLOP per element of its
largest operand (elementwise and reduction ops). Which ops were estimated is reported, so that
``devplace info`` can say how much of a graph's cost is a guess.
"""

from __future__ import annotations

import torch
from torch.utils import flop_counter

from devplace.torchcapture.memory import tensor_bytes, tensors_in

aten = torch.ops.aten


def _sdpa_cpu(args, out) -> float:
    q, k, v = args[:3]
    return flop_counter.sdpa_flop_count(q.shape, k.shape, v.shape)


def _sdpa_cpu_backward(args, out) -> float:
    grad_out, q, k, v = args[:4]
    return flop_counter.sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape)


def _rnn_layer(args, out, factor: float = 1.0) -> float:
    """2 FLOPs per weight element per token, for the input and the recurrent weight matrices."""
    x = next(a for a in args if isinstance(a, torch.Tensor))
    weights = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2 and a is not x]
    tokens = x.numel() / max(x.shape[-1], 1)
    return factor * 2.0 * tokens * sum(w.numel() for w in weights[:2])


# ATen ops the flop counter does not know but whose cost is dominated by matrix products
SHAPE_ESTIMATES = {
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa_cpu,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_cpu_backward,
    "mkldnn_rnn_layer": _rnn_layer,
    "mkldnn_rnn_layer_backward": lambda a, o: _rnn_layer(a, o, factor=2.0),
}


def op_name(target) -> str:
    """``aten.addmm.default`` -> ``addmm``; the kind recorded in the graph."""
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))


def _tensor_args(node: torch.fx.Node):
    """(args, kwargs) of a node with fx Nodes replaced by their fake values."""
    fetch = lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a  # noqa: E731
    return torch.fx.node.map_aggregate(node.args, fetch), torch.fx.node.map_aggregate(node.kwargs, fetch)


def node_flops(node: torch.fx.Node) -> tuple[float, bool]:
    """(FLOPs, estimated?) of one call_function node."""
    args, kwargs = _tensor_args(node)
    out = node.meta.get("val")
    packet = getattr(node.target, "overloadpacket", None)
    if packet in flop_counter.flop_registry:
        return float(flop_counter.flop_registry[packet](*args, **kwargs, out_val=out)), False
    name = op_name(node.target)
    if name in SHAPE_ESTIMATES:
        return float(SHAPE_ESTIMATES[name](args, out)), True
    sizes = [t.numel() for t in tensors_in(list(args)) + tensors_in(list(kwargs.values())) + tensors_in(out)]
    return float(max(sizes, default=0)), True


def node_bytes(node: torch.fx.Node) -> tuple[float, float]:
    """(bytes read, bytes written): every tensor operand read once, every tensor result written once."""
    args, kwargs = _tensor_args(node)
    read = sum(tensor_bytes(t) for t in tensors_in(list(args)) + tensors_in(list(kwargs.values())))
    written = sum(tensor_bytes(t) for t in tensors_in(node.meta.get("val")))
    return float(read), float(written)


def node_dtype(node: torch.fx.Node) -> str:
    """The dtype an op computes in, which picks its roofline peak: its first floating-point operand's
    (a matmul's inputs, not an fp32-accumulating output), else its output's."""
    args, kwargs = _tensor_args(node)
    tensors = tensors_in(list(args)) + tensors_in(list(kwargs.values())) + tensors_in(node.meta.get("val"))
    chosen = next((t for t in tensors if t.is_floating_point()), tensors[0] if tensors else None)
    return str(chosen.dtype).removeprefix("torch.") if chosen is not None else ""
