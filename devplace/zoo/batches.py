"""Example batches of the zoo, drawn from torch's global RNG (``build`` seeds and forks it)."""

from __future__ import annotations

import torch


def image_classification_batch(batch: int, image_size: int, classes: int) -> tuple[tuple, tuple]:
    """``((images [batch, 3, size, size],), (labels [batch],))``: normal pixels, uniform labels."""
    images = torch.randn(batch, 3, image_size, image_size)
    labels = torch.randint(0, classes, (batch,))
    return (images,), (labels,)
