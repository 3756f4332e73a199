"""Inputs as models take them: keyword dicts, None/int/bool constants, and an error naming the forms that work."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.errors import CaptureError  # noqa: E402

pytestmark = pytest.mark.torch


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, mask=None, repeat: int = 1, negate: bool = False):
        y = self.fc(x)
        for _ in range(repeat):
            y = self.fc(y)
        if mask is not None:
            y = y * mask
        return -y if negate else y


def loss(out):
    return out.square().mean()


def test_keyword_inputs_and_constants_are_taken_as_the_model_is_called():
    model, x = Masked(), torch.randn(2, 4)
    plain = dp.capture(model, (x,), loss, cluster="baechi-4x2080")
    # None in a position, an int that unrolls a loop, a bool that adds an op
    positional = dp.capture(model, (x, None, 3, True), loss, cluster="baechi-4x2080")
    keyword = dp.capture(model, {"x": x, "repeat": 3, "negate": True, "mask": None}, loss, cluster="baechi-4x2080")
    masked = dp.capture(model, {"x": x, "mask": torch.ones(2, 4)}, loss, cluster="baechi-4x2080")
    addmm = lambda g: sum(k == "addmm" for k in g.kinds)  # noqa: E731
    assert addmm(plain) == 2 and addmm(positional) == 4 and addmm(keyword) == 4
    assert positional.kinds.count("neg") == keyword.kinds.count("neg") > 0 == plain.kinds.count("neg")
    inputs = lambda g: sum(k == "input" for k in g.kinds)  # noqa: E731
    assert inputs(plain) == inputs(keyword) == 1 and inputs(masked) == 2  # constants are not graph inputs


def test_an_input_of_another_type_names_the_forms_that_work():
    model, x = Masked(), torch.randn(2, 4)
    with pytest.raises(CaptureError, match=r"example_inputs\['mask'\] is a list: give .*dict of keyword inputs.*None"):
        dp.capture(model, {"x": x, "mask": [1, 2]}, loss, cluster="baechi-4x2080")
    with pytest.raises(CaptureError, match=r"example_inputs is a set: give a tensor, a tuple"):
        dp.capture(model, {x}, loss, cluster="baechi-4x2080")
