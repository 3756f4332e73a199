"""FLOPs and bytes moved per ATen op, from the shapes of its fake inputs and outputs.

Every op a family of real models uses has a formula (``devplace info`` and the library-model tests
check that what is left is under 1% of a model's FLOPs):

- matrix products, convolutions of every kind and the GPU attention kernels: ``torch.utils.flop_counter``;
- grouped matmuls (mixture of experts), the CPU attention and RNN kernels, embedding bags:
  ``FORMULAS`` below, from their matrix products or rows read (a GPU runs the same products in its
  own kernels);
- elementwise (ATen's ``pointwise`` tag), reductions (``reduction`` tag), multi-tensor optimizer ops:
  FLOPs per element of their largest operand; normalizations, softmax, losses, pooling, embeddings:
  ``PER_ELEMENT`` and ``PER_OUTPUT``; pure data movement and tensor creation: no FLOPs.

Anything else gets one FLOP per element of its largest operand and is reported as estimated.
"""

from __future__ import annotations

import math

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
    """2 FLOPs per weight element per token, for the input and the recurrent weight matrices
    (the gates' elementwise work is a few FLOPs per hidden unit, small beside them)."""
    x = next(a for a in args if isinstance(a, torch.Tensor))
    weights = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2 and a is not x]
    tokens = x.numel() / max(x.shape[-1], 1)
    return factor * 2.0 * tokens * sum(w.numel() for w in weights[:2])


def _grouped_mm(args, out) -> float:
    """2 FLOPs per multiply-add: every output element sums over the contracted dimension (the last of
    ``self``). With two 2-D operands the groups split the contracted (token) dimension, so the token
    count is summed once over all groups, not once per group."""
    a = args[0]
    per_output = a.shape[-1]
    if a.dim() == 2 and args[1].dim() == 2:
        return 2.0 * out.numel() / max(out.shape[0], 1) * per_output
    return 2.0 * out.numel() * per_output


def _embedding_bag(args, out) -> float:
    """One add per element of every row looked up (weight, indices, ...; backward: grad, indices, ...)."""
    return float(args[1].numel() * args[0].shape[-1])


FORMULAS = {
    "_grouped_mm": _grouped_mm,
    "_embedding_bag": _embedding_bag,
    "_embedding_bag_forward_only": _embedding_bag,
    "_embedding_bag_backward": _embedding_bag,
    "_embedding_bag_dense_backward": _embedding_bag,
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa_cpu,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_cpu_backward,
    "mkldnn_rnn_layer": _rnn_layer,
    "mkldnn_rnn_layer_backward": lambda a, o: _rnn_layer(a, o, factor=2.0),
}

# Kernels that exist only on the CPU backend -> the op a GPU runs for the same call. A graph costed
# for GPUs (roofline) names them so; their FLOP formulas above already count the GPU kernel's work.
GPU_KERNELS = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "_scaled_dot_product_flash_attention_backward",
    "mkldnn_rnn_layer": "_cudnn_rnn",
    "mkldnn_rnn_layer_backward": "_cudnn_rnn_backward",
}

# Ops that read a scalar back to the host (an optimizer's step count for its bias correction):
# host work, no device kernel to launch, so the roofline charges them nothing.
HOST_OPS = {"_local_scalar_dense"}

# FLOPs per element of the op's largest operand or result, from the arithmetic the op does.
PER_ELEMENT = {
    # softmax: max, subtract, exp, sum, divide; its backward: multiply, sum, subtract
    "_softmax": 5, "_log_softmax": 5, "_safe_softmax": 5, "_softmax_backward_data": 3, "_log_softmax_backward_data": 3,
    # normalizations: mean, variance (subtract, square, add), normalize, scale and shift
    "native_layer_norm": 8, "native_batch_norm": 8, "_native_batch_norm_legit": 8,
    "_native_batch_norm_legit_functional": 8, "_native_batch_norm_legit_no_training": 4, "native_group_norm": 8,
    "_fused_rms_norm": 5,
    "native_layer_norm_backward": 12, "native_batch_norm_backward": 12, "native_group_norm_backward": 12,
    "_fused_rms_norm_backward": 9,
    # losses over every element
    "mse_loss": 3, "mse_loss_backward": 3, "binary_cross_entropy": 4, "binary_cross_entropy_backward": 4,
    "binary_cross_entropy_with_logits": 6, "smooth_l1_loss": 4, "smooth_l1_loss_backward": 3,
    "huber_loss": 4, "huber_loss_backward": 3,
    # random masks, scatter-adds, sums over windows, selection
    "bernoulli_": 1, "bernoulli": 1, "native_dropout": 2, "rand_like": 1, "randn_like": 1,
    "embedding_dense_backward": 1, "index_add_": 1, "index_add": 1, "scatter_add": 1, "scatter_add_": 1,
    "index_put_": 1, "index_put": 1, "_adaptive_avg_pool2d": 1, "_adaptive_avg_pool2d_backward": 1,
    "adaptive_max_pool2d": 1, "adaptive_max_pool2d_backward": 1, "max_pool2d_with_indices_backward": 1,
    "avg_pool2d_backward": 1, "topk": 1, "cumsum": 1, "histc": 1, "tril": 1, "triu": 1, "fill_": 0,
    "nll_loss2d_backward": 1, "floor_divide": 1, "remainder": 1,
    # Adam's fused kernel: about 15 FLOPs per parameter element (moments, bias corrections, update)
    "_fused_adam_": 15, "_fused_adamw_": 15, "_fused_sgd_": 2,
}
# FLOPs per element of the first operand, where that is what the op reads (not its largest tensor)
PER_FIRST_OPERAND = {"nll_loss_forward": 1, "nll_loss2d_forward": 1}
# FLOPs per output element times the pooling window's area (kernel_size: the second argument)
WINDOWED = {"max_pool2d_with_indices", "avg_pool2d", "max_pool3d_with_indices", "avg_pool3d"}
# data movement and tensor creation: memory traffic (in bytes), no arithmetic
NO_FLOPS = {
    "cat", "stack", "clone", "copy", "copy_", "_to_copy", "_unsafe_view", "index", "index_select", "gather",
    "scatter", "slice_scatter", "select_scatter", "diagonal_scatter", "constant_pad_nd", "reflection_pad2d",
    "replication_pad2d", "arange", "ones", "zeros", "empty", "empty_like", "empty_strided", "full", "full_like",
    "ones_like", "zeros_like", "new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided",
    "scalar_tensor", "_local_scalar_dense", "embedding", "repeat", "repeat_interleave", "lift_fresh_copy",
    "split_with_sizes_copy", "nll_loss_backward", "sort", "argsort", "nonzero", "unique", "masked_select",
    "linspace", "randperm", "alias", "resize_", "set_", "detach", "item", "flip", "roll", "_assert_async",
    "_assert_scalar", "sym_constrain_range_for_size", "max_unpool2d", "upsample_nearest2d",
    "upsample_nearest2d_backward", "pixel_shuffle", "im2col", "col2im", "bincount", "one_hot",
    "slice_backward", "select_backward", "as_strided_scatter", "narrow_copy", "expand_copy", "permute_copy",
    "view_copy", "t_copy", "transpose_copy", "unsqueeze_copy", "squeeze_copy", "unfold_copy", "transpose_",
    "t_", "squeeze_", "unsqueeze_", "as_strided_",
}
# ops that read only the rows their index picks: bytes read = index + what they write
GATHERS = {"embedding", "index_select", "gather", "index"}
# ... and those that sum the rows they pick: bytes read = index + every row picked (FORMULAS' count)
BAGS = {"_embedding_bag", "_embedding_bag_forward_only"}


def op_name(target) -> str:
    """``aten.addmm.default`` -> ``addmm``; the kind recorded in the graph."""
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", None) or getattr(target, "__name__", str(target))


def _tensor_args(node: torch.fx.Node):
    """(args, kwargs) of a node with fx Nodes replaced by their fake values."""
    fetch = lambda a: a.meta.get("val") if isinstance(a, torch.fx.Node) else a  # noqa: E731
    return torch.fx.node.map_aggregate(node.args, fetch), torch.fx.node.map_aggregate(node.kwargs, fetch)


def _largest(args, kwargs, out) -> int:
    sizes = [t.numel() for t in tensors_in(list(args)) + tensors_in(list(kwargs.values())) + tensors_in(out)]
    return max(sizes, default=0)


def _list_elements(args) -> int:
    """Elements of a multi-tensor (``_foreach_*``) op: those of its first tensor list."""
    first = next((a for a in args if isinstance(a, (list, tuple)) and tensors_in(a)), [])
    return sum(t.numel() for t in tensors_in(first))


def _pointwise_in_place(name: str) -> bool:
    """``masked_fill_``, ``floor_divide_``: the in-place form of an elementwise op (some lack the tag)."""
    packet = getattr(aten, name.removesuffix("_"), None)
    overloads = packet.overloads() if packet is not None else []
    return any(torch.Tag.pointwise in getattr(packet, o).tags for o in overloads)


def node_flops(node: torch.fx.Node) -> tuple[float, bool]:
    """(FLOPs, estimated?) of one call_function node; estimated means no formula knew the op."""
    args, kwargs = _tensor_args(node)
    out = node.meta.get("val")
    packet = getattr(node.target, "overloadpacket", None)
    if packet in flop_counter.flop_registry:
        return float(flop_counter.flop_registry[packet](*args, **kwargs, out_val=out)), False
    name = op_name(node.target)
    tags = getattr(node.target, "tags", ())
    if name in FORMULAS:
        return float(FORMULAS[name](args, out)), False
    if name in NO_FLOPS:
        return 0.0, False
    if name.startswith("_foreach_"):
        return float(_list_elements(args)), False
    if name in PER_ELEMENT:
        return float(PER_ELEMENT[name] * _largest(args, kwargs, out)), False
    if name in PER_FIRST_OPERAND:
        return float(PER_FIRST_OPERAND[name] * args[0].numel()), False
    if name in WINDOWED:
        window = math.prod(args[1]) if isinstance(args[1], (list, tuple)) else args[1] ** 2
        return float(tensors_in(out)[0].numel() * window), False
    if torch.Tag.pointwise in tags or torch.Tag.reduction in tags or _pointwise_in_place(name):
        return float(_largest(args, kwargs, out)), False
    return float(_largest(args, kwargs, out)), True


def node_bytes(node: torch.fx.Node) -> tuple[float, float]:
    """(bytes read, bytes written): every tensor operand read once, every tensor result written once;
    a gather (embedding lookup, index_select) reads only its index and the rows it writes."""
    args, kwargs = _tensor_args(node)
    operands = tensors_in(list(args)) + tensors_in(list(kwargs.values()))
    written = sum(tensor_bytes(t) for t in tensors_in(node.meta.get("val")))
    name = op_name(node.target)
    if name in GATHERS or name in BAGS:
        rows = _embedding_bag(args, None) * args[0].element_size() if name in BAGS else written
        read = rows + sum(tensor_bytes(t) for t in operands if not t.is_floating_point())
    else:
        read = sum(tensor_bytes(t) for t in operands)
    return float(read), float(written)


def node_dtype(node: torch.fx.Node) -> str:
    """The dtype an op computes in, which picks its roofline peak: its first floating-point operand's
    (a matmul's inputs, not an fp32-accumulating output), else its output's."""
    args, kwargs = _tensor_args(node)
    tensors = tensors_in(list(args)) + tensors_in(list(kwargs.values())) + tensors_in(node.meta.get("val"))
    chosen = next((t for t in tensors if t.is_floating_point()), tensors[0] if tensors else None)
    return str(chosen.dtype).removeprefix("torch.") if chosen is not None else ""
