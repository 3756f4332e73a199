"""The optimizer step as PyTorch runs it: multi-tensor (foreach) and fused kernels, split per parameter."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.errors import CaptureError  # noqa: E402
from devplace.graph import Role  # noqa: E402

pytestmark = pytest.mark.torch


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(3, 4)


def mse(out):
    return out.square().mean()


def update_ops(g):
    return [i for i in range(g.n_ops) if g.role[i] == Role.UPDATE]


@pytest.mark.parametrize("update, kernels", [("foreach", 8), ("fused", 2)])
def test_multi_tensor_updates_are_one_op_per_parameter_sharing_one_launch(update, kernels):
    model, x = mlp()
    g = dp.capture(model, x, mse, cluster="baechi-4x2080", update=update)
    assert g.meta["optimizer_update"] == update
    ops = update_ops(g)
    prefix = "_foreach_" if update == "foreach" else ("_foreach_", "_fused_adam_")
    multi = [i for i in ops if g.kinds[i].startswith(prefix)]
    # foreach Adam: step += 1, lerp, mul, addcmul, sqrt, div, add eps, addcdiv; fused: step += 1, fused_adam
    assert len(multi) == kernels * 4  # one piece per parameter of each multi-tensor kernel
    assert sum(g.meta["op_launches"][i] for i in multi) == pytest.approx(kernels)
    for i in multi:  # every piece stays with its parameter
        assert g.colocation_names[g.colocation[i]].startswith("param:")
    groups = Counter(g.colocation_names[g.colocation[i]] for i in multi)
    assert set(groups.values()) == {kernels} and len(groups) == 4


def test_updates_cost_fewer_launches_than_the_per_parameter_loop():
    model, x = mlp()
    times = {}
    for update in ("per-parameter", "foreach", "fused"):
        g = dp.capture(model, x, mse, cluster="baechi-4x2080", update=update)
        times[update] = g.compute_us[update_ops(g), 0].sum()
    assert times["fused"] < times["foreach"] < times["per-parameter"]


@pytest.mark.parametrize("update", ["foreach", "fused", "per-parameter"])
def test_the_split_step_updates_weights_as_the_eager_optimizer(update):
    model, x = mlp()
    _, traced = dp.capture(model, x, mse, cluster="baechi-4x2080", update=update, return_trace=True)
    args = traced.real_args(model, x)
    traced.gm(*args)
    eager = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    opt = torch.optim.Adam(list(eager.values()), foreach=False)
    mse(torch.func.functional_call(model, eager, (x,))).backward()
    opt.step()
    for k, name in enumerate(traced.param_names):
        torch.testing.assert_close(args[k], eager[name].detach(), rtol=1e-5, atol=1e-6)


def test_in_place_multi_tensor_writes_are_ordered_by_edges():
    model, x = mlp()
    g = dp.capture(model, x, mse, cluster="baechi-4x2080", update="foreach")
    group = g.colocation_names.index("param:0.weight")
    mine = [i for i in update_ops(g) if g.colocation[i] == group]
    by_kind = {g.kinds[i]: i for i in mine}
    # exp_avg_sq *= beta2 (returns nothing) must run before exp_avg_sq += (1 - beta2) g^2
    assert by_kind["_foreach_addcmul_"] in g.successors(by_kind["_foreach_mul_"]).tolist()
    with pytest.raises(CaptureError, match="unknown optimizer update 'multi'.*foreach, fused, per-parameter"):
        dp.capture(model, x, mse, cluster="baechi-4x2080", update="multi")


@pytest.mark.parametrize("update", ["foreach", "per-parameter"])
def test_a_weights_update_is_ordered_after_the_logits_but_does_not_hold_them(update):
    # The classifier's matmul reads its weight; the weight's update writes it in place, so it must run
    # after that read: an order-only edge. Were it a read, the logits would stay allocated (an output
    # lives until its last reader on its device) until the update, near the end of the step.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4096))
    x, y = torch.randn(64, 8), torch.randint(0, 4096, (64,))
    g = dp.capture(model, x, lambda out, y: nn.functional.cross_entropy(out, y), cluster="baechi-4x2080",
                   targets=(y,), update=update)
    logits = next(i for i in range(g.n_ops) if g.role[i] == Role.FORWARD and g.output_bytes[i] == 64 * 4096 * 4)
    out_edges = g.succ_edge[g.succ_ptr[logits]:g.succ_ptr[logits + 1]]
    into_updates = out_edges[g.role[g.edge_dst[out_edges]] == Role.UPDATE]
    assert len(into_updates) >= 1 and g.edge_order_only[into_updates].all()
    assert not g.edge_order_only[out_edges[g.role[g.edge_dst[out_edges]] != Role.UPDATE]].any()
    result = dp.simulate(g, dp.load_cluster("baechi-4x2080"), np.zeros(g.n_ops, dtype=int))
    assert (result.start_us[g.edge_dst[into_updates]] >= result.finish_us[logits]).all()
    times, in_use = result.memory_timeline(0)
    first_update = result.start_us[update_ops(g)].min()
    held = in_use[np.searchsorted(times, first_update, side="right") - 1] - g.persistent_bytes.sum()
    assert held < g.output_bytes[logits]
