"""Tiny models for tests and quick demos: ``mlp`` and ``small_cnn``.

They follow no paper; they exist so that a capture, a placement and a real run finish in a second.
"""

from __future__ import annotations

import torch
from torch import nn

from devplace.zoo import ModelSpec
from devplace.zoo.batches import image_classification_batch
from devplace.zoo.losses import classification_loss


class MLP(nn.Module):
    """``layers`` hidden Linear+ReLU layers (``layers.{i}``) and a ``classifier``."""

    def __init__(self, in_features: int, hidden_units: int, layers: int, classes: int):
        super().__init__()
        widths = [in_features] + [hidden_units] * layers
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(widths[:-1], widths[1:])
        )
        self.classifier = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.classifier(x)


class SmallCNN(nn.Module):
    """Two 3x3 conv+BN+ReLU+2x2-maxpool stages (``features.{i}``), global pooling, ``classifier``."""

    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.features = nn.ModuleList([self._stage(3, channels), self._stage(channels, 2 * channels)])
        self.classifier = nn.Linear(2 * channels, classes)

    @staticmethod
    def _stage(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
            nn.MaxPool2d(2),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images
        for stage in self.features:
            x = stage(x)
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _make_mlp(c: dict):
    model = MLP(c["in_features"], c["hidden_units"], c["layers"], c["classes"])
    x = torch.randn(c["batch"], c["in_features"])
    labels = torch.randint(0, c["classes"], (c["batch"],))
    return model, (x,), (labels,), classification_loss


def _make_small_cnn(c: dict):
    model = SmallCNN(c["channels"], c["classes"])
    return model, *image_classification_batch(c["batch"], c["image_size"], c["classes"]), classification_loss


SPECS = [
    ModelSpec(
        name="mlp",
        summary="multi-layer perceptron (tests and demos)",
        defaults=dict(batch=32, in_features=64, hidden_units=256, layers=3, classes=10),
        presets=dict(small=dict(batch=4, in_features=8, hidden_units=16, layers=2, classes=3),
                     medium=dict(batch=64, in_features=256, hidden_units=512, layers=3)),
        make=_make_mlp,
    ),
    ModelSpec(
        name="small_cnn",
        summary="two-stage convolutional classifier on 32x32 images (tests and demos)",
        defaults=dict(batch=8, image_size=32, channels=16, classes=10),
        presets=dict(small=dict(batch=2, image_size=8, channels=4, classes=3),
                     medium=dict(batch=16, image_size=32, channels=16)),
        make=_make_small_cnn,
    ),
]
