"""LSTM layers unrolled over time: one ``nn.LSTMCell`` call per layer per time step.

The papers' TensorFlow graphs were unrolled the same way, so a captured graph has one group of ops
per (layer, step) and a placer can overlap layers and steps across devices. (``nn.LSTM`` would
capture as a single fused op per layer, hiding all of that.)

A layer maps a list of per-step inputs ``[batch, input_units]`` to a list of per-step outputs
``[batch, hidden_units]``; the cell is the submodule ``cell`` (a bidirectional layer has
``forward_cell`` and ``backward_cell``), so all ops of layer ``i`` sit under ``...layers.{i}``.
"""

from __future__ import annotations

import torch
from torch import nn


def unroll(cell: nn.LSTMCell, steps: list[torch.Tensor], reverse: bool = False) -> list[torch.Tensor]:
    """Run ``cell`` over ``steps`` from a zero state; the hidden output of every step, in input order."""
    order = range(len(steps) - 1, -1, -1) if reverse else range(len(steps))
    outputs: list[torch.Tensor] = [None] * len(steps)  # type: ignore[list-item]
    state = None
    for t in order:
        h, c = cell(steps[t], state)
        state = (h, c)
        outputs[t] = h
    return outputs


class UnrolledLSTMLayer(nn.Module):
    """One unidirectional LSTM layer; with ``residual`` its output is ``h_t + x_t`` (GNMT)."""

    def __init__(self, input_units: int, hidden_units: int, residual: bool = False):
        super().__init__()
        if residual and input_units != hidden_units:
            raise ValueError(f"a residual layer needs input_units == hidden_units, got {input_units}, {hidden_units}")
        self.cell = nn.LSTMCell(input_units, hidden_units)
        self.residual = residual

    def forward(self, steps: list[torch.Tensor]) -> list[torch.Tensor]:
        outputs = unroll(self.cell, steps)
        if self.residual:
            outputs = [h + x for h, x in zip(outputs, steps)]
        return outputs


class BidirectionalLSTMLayer(nn.Module):
    """GNMT's bottom encoder layer: a forward and a backward LSTM, outputs concatenated (2 x hidden)."""

    def __init__(self, input_units: int, hidden_units: int):
        super().__init__()
        self.forward_cell = nn.LSTMCell(input_units, hidden_units)
        self.backward_cell = nn.LSTMCell(input_units, hidden_units)

    def forward(self, steps: list[torch.Tensor]) -> list[torch.Tensor]:
        forward = unroll(self.forward_cell, steps)
        backward = unroll(self.backward_cell, steps, reverse=True)
        return [torch.cat([f, b], dim=1) for f, b in zip(forward, backward)]
