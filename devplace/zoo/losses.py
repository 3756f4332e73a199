"""The loss functions of the zoo: ``loss_fn(outputs, *targets) -> scalar tensor`` (batch mean).

Module-level functions, not closures: they hold no tensors, so a capture can trace them with fake
targets, and they pickle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
"""Target value of positions that do not count in the loss (unmasked tokens in masked-LM)."""

AUX_LOSS_WEIGHT = 0.4
"""Weight of Inception-V3's auxiliary classifier loss (Szegedy et al. 2016 train with 0.4 too)."""


def classification_loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of class logits ``[batch, classes]`` against ``labels [batch]``.

    ``outputs`` may be ``(logits, aux_logits)`` (Inception-V3 with its auxiliary classifier):
    then the loss is ``CE(logits) + 0.4 * CE(aux_logits)``.
    """
    if isinstance(outputs, (tuple, list)):
        logits, aux_logits = outputs
        return F.cross_entropy(logits, labels) + AUX_LOSS_WEIGHT * F.cross_entropy(aux_logits, labels)
    return F.cross_entropy(outputs, labels)


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of per-token logits ``[batch, seq, vocab]`` against ``targets [batch, seq]``.

    Positions whose target is ``IGNORE_INDEX`` do not count.
    """
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )
