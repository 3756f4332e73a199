"""Image classifiers of the papers: Inception-V3 (ColocRL, Hierarchical Planner, Baechi, Placeto,
Mars) and ResNet-50 (Hierarchical Planner).

Paper configurations: Inception-V3 on 299x299 images, batch 32 (ColocRL; Baechi also 64), 1000
classes, with its auxiliary classifier; ResNet-50 on 224x224 images, 1000 classes, batch 64 (the
Hierarchical Planner's step-time table, Mirhoseini et al., ICLR 2018, does not state its batch; 64
is our choice).

These are our own compact implementations of the published architectures (He et al. 2016;
Szegedy et al. 2016), laid out like torchvision's (same blocks, channel counts, BN eps) but always
used, even where torchvision is installed, so a captured graph does not depend on what is
installed. ``width`` scales every channel count (1.0 = the paper); the ``small`` presets use a
narrow width for fast tests while keeping every block.

Op names: ResNet-50 ``stem``, ``layer{1..4}.{block}``, ``classifier``; Inception-V3 ``stem``,
``mixed_5b`` ... ``mixed_7c``, ``aux`` (auxiliary classifier), ``classifier``.
Loss: cross-entropy (plus 0.4 x the auxiliary classifier's, see :mod:`devplace.zoo.losses`).
"""

from __future__ import annotations

import torch
from torch import nn

from devplace.zoo import ModelSpec
from devplace.zoo.batches import image_classification_batch
from devplace.zoo.losses import classification_loss


def _scaled(channels: int, width: float) -> int:
    return max(1, int(round(channels * width)))


# ------------------------------------------------------------------------------------- ResNet-50
class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (carries the stride) -> 1x1 expand (x4), each with BN; residual add."""

    expansion = 4

    def __init__(self, in_channels: int, mid_channels: int, stride: int):
        super().__init__()
        out_channels = mid_channels * self.expansion
        self.conv1 = nn.Conv2d(in_channels, mid_channels, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid_channels)
        self.conv2 = nn.Conv2d(mid_channels, mid_channels, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid_channels)
        self.conv3 = nn.Conv2d(mid_channels, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(y + shortcut)


class ResNet50(nn.Module):
    """ResNet-50: 7x7 stem, bottleneck stages of [3, 4, 6, 3] blocks, global pool, ``classifier``."""

    blocks_per_stage = (3, 4, 6, 3)

    def __init__(self, classes: int = 1000, width: float = 1.0):
        super().__init__()
        stem_channels = _scaled(64, width)
        self.stem = nn.Sequential(
            nn.Conv2d(3, stem_channels, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(stem_channels),
            nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
        )
        channels = stem_channels
        for stage, blocks in enumerate(self.blocks_per_stage):
            mid = _scaled(64 * 2**stage, width)
            layer = []
            for b in range(blocks):
                layer.append(Bottleneck(channels, mid, stride=2 if (b == 0 and stage > 0) else 1))
                channels = mid * Bottleneck.expansion
            self.add_module(f"layer{stage + 1}", nn.Sequential(*layer))
        self.classifier = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


# ---------------------------------------------------------------------------------- Inception-V3
class ConvBN(nn.Module):
    """Convolution without bias, batch norm (eps 0.001), ReLU: Inception-V3's basic unit."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


def _chain(in_channels: int, *layers: tuple) -> nn.Sequential:
    """ConvBN layers given as ``(out_channels, kernel, stride, padding)``, chained from ``in_channels``."""
    units = []
    for out_channels, kernel, stride, padding in layers:
        units.append(ConvBN(in_channels, out_channels, kernel, stride, padding))
        in_channels = out_channels
    return nn.Sequential(*units)


class InceptionBlock(nn.Module):
    """Parallel branches over one input, outputs concatenated on channels; ``out_channels`` set by subclasses."""

    out_channels: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


class InceptionA(InceptionBlock):
    """35x35 block: 1x1 | 1x1-5x5 | 1x1-3x3-3x3 | avgpool-1x1."""

    def __init__(self, c_in: int, pool_channels: int, w: float):
        super().__init__()
        s = lambda n: _scaled(n, w)  # noqa: E731
        self.branches = nn.ModuleList([
            _chain(c_in, (s(64), 1, 1, 0)),
            _chain(c_in, (s(48), 1, 1, 0), (s(64), 5, 1, 2)),
            _chain(c_in, (s(64), 1, 1, 0), (s(96), 3, 1, 1), (s(96), 3, 1, 1)),
            nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), ConvBN(c_in, pool_channels, 1)),
        ])
        self.out_channels = s(64) + s(64) + s(96) + pool_channels


class InceptionB(InceptionBlock):
    """35x35 -> 17x17 reduction: 3x3/2 | 1x1-3x3-3x3/2 | maxpool/2."""

    def __init__(self, c_in: int, w: float):
        super().__init__()
        s = lambda n: _scaled(n, w)  # noqa: E731
        self.branches = nn.ModuleList([
            _chain(c_in, (s(384), 3, 2, 0)),
            _chain(c_in, (s(64), 1, 1, 0), (s(96), 3, 1, 1), (s(96), 3, 2, 0)),
            nn.MaxPool2d(3, stride=2),
        ])
        self.out_channels = s(384) + s(96) + c_in


class InceptionC(InceptionBlock):
    """17x17 block with factorised 7x7 convolutions (1x7 and 7x1) of ``c7`` channels."""

    def __init__(self, c_in: int, c7: int, w: float):
        super().__init__()
        s = lambda n: _scaled(n, w)  # noqa: E731
        c7 = s(c7)
        row, col = ((1, 7), 1, (0, 3)), ((7, 1), 1, (3, 0))
        self.branches = nn.ModuleList([
            _chain(c_in, (s(192), 1, 1, 0)),
            _chain(c_in, (c7, 1, 1, 0), (c7, *row), (s(192), *col)),
            _chain(c_in, (c7, 1, 1, 0), (c7, *col), (c7, *row), (c7, *col), (s(192), *row)),
            nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), ConvBN(c_in, s(192), 1)),
        ])
        self.out_channels = 4 * s(192)


class InceptionD(InceptionBlock):
    """17x17 -> 8x8 reduction: 1x1-3x3/2 | 1x1-1x7-7x1-3x3/2 | maxpool/2."""

    def __init__(self, c_in: int, w: float):
        super().__init__()
        s = lambda n: _scaled(n, w)  # noqa: E731
        self.branches = nn.ModuleList([
            _chain(c_in, (s(192), 1, 1, 0), (s(320), 3, 2, 0)),
            _chain(c_in, (s(192), 1, 1, 0), (s(192), (1, 7), 1, (0, 3)), (s(192), (7, 1), 1, (3, 0)),
                   (s(192), 3, 2, 0)),
            nn.MaxPool2d(3, stride=2),
        ])
        self.out_channels = s(320) + s(192) + c_in


class SplitBranch(nn.Module):
    """A stem followed by a 1x3 and a 3x1 convolution in parallel, concatenated (Inception E)."""

    def __init__(self, stem: nn.Module, c_stem: int, c_out: int):
        super().__init__()
        self.stem = stem
        self.conv_1x3 = ConvBN(c_stem, c_out, (1, 3), padding=(0, 1))
        self.conv_3x1 = ConvBN(c_stem, c_out, (3, 1), padding=(1, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        return torch.cat([self.conv_1x3(y), self.conv_3x1(y)], dim=1)


class InceptionE(InceptionBlock):
    """8x8 block with expanded filter banks: 1x1 | 1x1-(1x3,3x1) | 1x1-3x3-(1x3,3x1) | avgpool-1x1."""

    def __init__(self, c_in: int, w: float):
        super().__init__()
        s = lambda n: _scaled(n, w)  # noqa: E731
        self.branches = nn.ModuleList([
            _chain(c_in, (s(320), 1, 1, 0)),
            SplitBranch(_chain(c_in, (s(384), 1, 1, 0)), s(384), s(384)),
            SplitBranch(_chain(c_in, (s(448), 1, 1, 0), (s(384), 3, 1, 1)), s(384), s(384)),
            nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), ConvBN(c_in, s(192), 1)),
        ])
        self.out_channels = s(320) + 4 * s(384) + s(192)


class InceptionAux(nn.Module):
    """Auxiliary classifier on the 17x17 features: avgpool 5/3, 1x1 conv, 5x5 conv, linear."""

    def __init__(self, c_in: int, classes: int, w: float):
        super().__init__()
        self.pool = nn.AvgPool2d(5, stride=3)
        self.convs = _chain(c_in, (_scaled(128, w), 1, 1, 0), (_scaled(768, w), 5, 1, 0))
        self.fc = nn.Linear(_scaled(768, w), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.convs(self.pool(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


class InceptionV3(nn.Module):
    """Inception-V3 on 299x299 images; returns ``(logits, aux_logits)`` with the aux classifier."""

    def __init__(self, classes: int = 1000, aux_classifier: bool = True, width: float = 1.0):
        super().__init__()
        s = lambda n: _scaled(n, width)  # noqa: E731
        self.stem = nn.Sequential(
            _chain(3, (s(32), 3, 2, 0), (s(32), 3, 1, 0), (s(64), 3, 1, 1)),
            nn.MaxPool2d(3, stride=2),
            _chain(s(64), (s(80), 1, 1, 0), (s(192), 3, 1, 0)),
            nn.MaxPool2d(3, stride=2),
        )
        c = s(192)
        blocks_17 = [("mixed_5b", lambda c: InceptionA(c, s(32), width)),
                     ("mixed_5c", lambda c: InceptionA(c, s(64), width)),
                     ("mixed_5d", lambda c: InceptionA(c, s(64), width)),
                     ("mixed_6a", lambda c: InceptionB(c, width)),
                     ("mixed_6b", lambda c: InceptionC(c, 128, width)),
                     ("mixed_6c", lambda c: InceptionC(c, 160, width)),
                     ("mixed_6d", lambda c: InceptionC(c, 160, width)),
                     ("mixed_6e", lambda c: InceptionC(c, 192, width))]
        blocks_8 = [("mixed_7a", lambda c: InceptionD(c, width)),
                    ("mixed_7b", lambda c: InceptionE(c, width)),
                    ("mixed_7c", lambda c: InceptionE(c, width))]
        self.blocks_17, self.blocks_8 = [], []
        for names, group in ((blocks_17, self.blocks_17), (blocks_8, self.blocks_8)):
            for name, make in names:
                block = make(c)
                self.add_module(name, block)
                group.append(name)
                c = block.out_channels
            if group is self.blocks_17:
                self.aux = InceptionAux(c, classes, width) if aux_classifier else None
        self.classifier = nn.Linear(c, classes)

    def forward(self, images: torch.Tensor):
        x = self.stem(images)
        for name in self.blocks_17:
            x = getattr(self, name)(x)
        aux_logits = self.aux(x) if self.aux is not None else None
        for name in self.blocks_8:
            x = getattr(self, name)(x)
        logits = self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
        return logits if aux_logits is None else (logits, aux_logits)


def _image_batch(c: dict):
    return image_classification_batch(c["batch"], c["image_size"], c["classes"])


def _make_resnet50(c: dict):
    return (ResNet50(c["classes"], c["width"]), *_image_batch(c), classification_loss)


def _make_inception_v3(c: dict):
    return (InceptionV3(c["classes"], c["aux_classifier"], c["width"]), *_image_batch(c), classification_loss)


SPECS = [
    ModelSpec(
        name="resnet50",
        summary="ResNet-50, bottleneck blocks [3, 4, 6, 3], 224x224 (Hierarchical Planner)",
        defaults=dict(batch=64, image_size=224, classes=1000, width=1.0),
        presets=dict(small=dict(batch=2, image_size=32, classes=10, width=0.125),
                     medium=dict(batch=8, image_size=112, classes=10, width=0.25), batch32=dict(batch=32)),
        make=_make_resnet50,
    ),
    ModelSpec(
        name="inception_v3",
        summary="Inception-V3 with auxiliary classifier, 299x299, batch 32 (ColocRL, Baechi, HP, Mars)",
        defaults=dict(batch=32, image_size=299, classes=1000, width=1.0, aux_classifier=True),
        presets=dict(small=dict(batch=2, image_size=299, classes=10, width=0.0625),
                     medium=dict(batch=4, image_size=299, classes=10, width=0.125), batch64=dict(batch=64)),
        make=_make_inception_v3,
    ),
]
