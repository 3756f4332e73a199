"""NASNet: a NASNet-A-like network of cells with many parallel branches (Placeto's benchmark).

Follows NASNet-A (Zoph et al. 2018) in its mobile configuration "4 @ 1056": ``cells_per_stage``
(N) = 4 normal cells per stage, ``filters`` = 44 (so the last stage outputs 6 x 4 x 44 = 1056
channels), 224x224 images, 1000 classes. Placeto (Addanki et al., NeurIPS 2019) does not state
its batch; 32 is our choice.

Structure: a 3x3 stride-2 convolution stem, two reduction cells as stem cells (filters/4, filters/2),
then ``stages`` (3, as NASNet-A; fewer make the shallower stacks of the graph families) stages of N
normal cells with a reduction cell (filters doubled) before every stage but the first, ReLU, global average pooling and ``classifier``. Each cell takes the two previous cells' outputs,
brings both to its filter count (1x1 conv, or a factorised reduction when the older one is twice as
large), computes five blocks, each the sum of two operations (separable 3x3/5x5/7x7 convolutions,
3x3 average or max pooling, identity) on earlier states, and concatenates the results on channels.
The cell wiring is our reading of the NASNet-A cell figures ("NASNet-like": op choices match, we
do not claim identity). A separable convolution is NASNet's "applied twice" form: (ReLU, depthwise
kxk, pointwise 1x1, BN) x 2.

Op names: ``stem``, ``cells.{i}`` (``.preprocess_prev``, ``.preprocess_cur``, ``.blocks.{j}.left``
/ ``.right``), ``classifier``. Loss: cross-entropy.
"""

from __future__ import annotations

import torch
from torch import nn

from devplace.zoo import ModelSpec
from devplace.zoo.batches import image_classification_batch
from devplace.zoo.losses import classification_loss

# A block is (op_left, input_left, op_right, input_right); input 0 is the older previous cell
# output h[i-1], input 1 the previous cell output h[i], input 2 + j the output of block j.
NORMAL_BLOCKS = (
    ("sep3x3", 1, "identity", 1),
    ("sep3x3", 0, "sep5x5", 1),
    ("avg3x3", 1, "identity", 0),
    ("avg3x3", 0, "avg3x3", 0),
    ("sep5x5", 0, "sep3x3", 0),
)
NORMAL_CONCAT = (0, 2, 3, 4, 5, 6)  # h[i-1] and all five blocks: 6 x filters channels
REDUCTION_BLOCKS = (
    ("sep7x7", 0, "sep5x5", 1),
    ("max3x3", 1, "sep7x7", 0),
    ("avg3x3", 1, "sep5x5", 0),
    ("max3x3", 1, "sep3x3", 2),
    ("avg3x3", 2, "identity", 3),
)
REDUCTION_CONCAT = (3, 4, 5, 6)  # blocks 1-4: 4 x filters channels


class SeparableConv(nn.Module):
    """(ReLU, depthwise kxk, pointwise 1x1, BN) twice; the stride is in the first depthwise conv."""

    def __init__(self, channels: int, kernel_size: int, stride: int):
        super().__init__()
        units = []
        for s in (stride, 1):
            units += [
                nn.ReLU(),
                nn.Conv2d(channels, channels, kernel_size, stride=s, padding=kernel_size // 2, groups=channels,
                          bias=False),
                nn.Conv2d(channels, channels, 1, bias=False),
                nn.BatchNorm2d(channels),
            ]
        self.body = nn.Sequential(*units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class FactorizedReduce(nn.Module):
    """Halve the resolution without losing pixels: two 1x1 stride-2 convs, one on a 1-pixel shift."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv_a = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.conv_b = nn.Conv2d(c_in, c_out - c_out // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(x)
        shifted = nn.functional.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.bn(torch.cat([self.conv_a(x), self.conv_b(shifted)], dim=1))


def _relu_conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out))


def _operation(kind: str, channels: int, stride: int) -> nn.Module:
    if kind.startswith("sep"):
        return SeparableConv(channels, int(kind[3]), stride)
    if kind == "avg3x3":
        return nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False)
    if kind == "max3x3":
        return nn.MaxPool2d(3, stride=stride, padding=1)
    if kind == "identity":
        return nn.Identity() if stride == 1 else FactorizedReduce(channels, channels)
    raise ValueError(f"unknown NASNet operation {kind!r}")


class Block(nn.Module):
    """``left(states[a]) + right(states[b])``."""

    def __init__(self, spec: tuple, channels: int, reduction: bool):
        super().__init__()
        op_left, self.input_left, op_right, self.input_right = spec
        stride = lambda source: 2 if reduction and source < 2 else 1  # noqa: E731
        self.left = _operation(op_left, channels, stride(self.input_left))
        self.right = _operation(op_right, channels, stride(self.input_right))

    def forward(self, states: list[torch.Tensor]) -> torch.Tensor:
        return self.left(states[self.input_left]) + self.right(states[self.input_right])


class Cell(nn.Module):
    """A normal or reduction cell over ``(h_prev, h_cur)``; ``out_channels`` is its output width."""

    def __init__(self, c_prev: int, c_cur: int, filters: int, reduction: bool, prev_is_larger: bool):
        super().__init__()
        self.preprocess_prev = FactorizedReduce(c_prev, filters) if prev_is_larger else _relu_conv_bn(c_prev, filters)
        self.preprocess_cur = _relu_conv_bn(c_cur, filters)
        blocks = REDUCTION_BLOCKS if reduction else NORMAL_BLOCKS
        self.concat = REDUCTION_CONCAT if reduction else NORMAL_CONCAT
        self.blocks = nn.ModuleList(Block(b, filters, reduction) for b in blocks)
        self.out_channels = filters * len(self.concat)

    def forward(self, prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
        states = [self.preprocess_prev(prev), self.preprocess_cur(cur)]
        for block in self.blocks:
            states.append(block(states))
        return torch.cat([states[i] for i in self.concat], dim=1)


class NASNet(nn.Module):
    """NASNet-A-like classifier; see the module docstring."""

    def __init__(self, cells_per_stage: int, filters: int, stem_filters: int, classes: int, stages: int = 3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, stem_filters, 3, stride=2, bias=False), nn.BatchNorm2d(stem_filters))
        plan = [(max(1, filters // 4), True), (max(1, filters // 2), True)]  # the two stem cells
        for stage in range(stages):
            if stage > 0:
                plan.append((filters * 2**stage, True))
            plan += [(filters * 2**stage, False)] * cells_per_stage
        cells, c_prev, c_cur, cur_was_reduction = [], stem_filters, stem_filters, False
        for i, (cell_filters, reduction) in enumerate(plan):
            cell = Cell(c_prev, c_cur, cell_filters, reduction, prev_is_larger=cur_was_reduction and i > 0)
            cells.append(cell)
            c_prev, c_cur, cur_was_reduction = c_cur, cell.out_channels, reduction
        self.cells = nn.ModuleList(cells)
        self.classifier = nn.Linear(c_cur, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        prev = cur = self.stem(images)
        for cell in self.cells:
            prev, cur = cur, cell(prev, cur)
        pooled = nn.functional.adaptive_avg_pool2d(torch.relu(cur), 1)
        return self.classifier(torch.flatten(pooled, 1))


def _make(c: dict):
    model = NASNet(c["cells_per_stage"], c["filters"], c["stem_filters"], c["classes"], c["stages"])
    return model, *image_classification_batch(c["batch"], c["image_size"], c["classes"]), classification_loss


SPECS = [
    ModelSpec(
        name="nasnet",
        summary="NASNet-A-like mobile network (4 @ 1056), cells of parallel separable convs and pools (Placeto)",
        defaults=dict(cells_per_stage=4, stages=3, filters=44, stem_filters=32, image_size=224, classes=1000, batch=32),
        presets=dict(small=dict(cells_per_stage=1, filters=8, stem_filters=8, image_size=32, classes=10, batch=2),
                     medium=dict(cells_per_stage=2, filters=16, stem_filters=16, image_size=64, classes=10, batch=8)),
        make=_make,
    ),
]
