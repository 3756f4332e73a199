"""Costs know where they came from: the devices a graph was costed for, re-costing for others, dtype peaks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.cluster import cluster_from_dict  # noqa: E402
from devplace.costing import EFFICIENCY, LAUNCH_US  # noqa: E402
from devplace.errors import CaptureError, ClusterError  # noqa: E402

pytestmark = pytest.mark.torch


def mse(out):
    return out.float().square().mean()


def mlp(dtype=torch.float32):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).to(dtype)
    return model, torch.randn(16, 64, dtype=dtype)


def test_default_cost_is_roofline_for_a_named_cluster():
    model, x = mlp()
    g = dp.capture(model, x, mse, cluster="baechi-4x2080")
    assert g.meta["cost_model"] == "roofline" and g.device_kinds == ("gpu",)
    assert g.meta["costed_for"]["gpu"]["model"] == "RTX 2080"
    with pytest.raises(CaptureError, match="cost='roofline' \\(the default\\) needs a cluster.*cost='measured'"):
        dp.capture(model, x, mse)


def test_a_graph_placed_on_other_devices_is_recosted_from_its_flops():
    model, x = mlp()
    g2080 = dp.capture(model, x, mse, cluster="baechi-4x2080")
    direct = dp.capture(model, x, mse, cluster="dgx1-8xv100")
    v100 = dp.load_cluster("dgx1-8xv100")
    one = [0] * g2080.n_ops
    on_v100 = dp.simulate(g2080, v100, one).step_time_us
    assert on_v100 == pytest.approx(dp.simulate(direct, v100, one).step_time_us, rel=1e-12)
    assert on_v100 < dp.simulate(g2080, dp.load_cluster("baechi-4x2080"), one).step_time_us
    p = dp.place(g2080, v100, algo="single")
    assert p.devices.tolist() == one
    # the same devices (a preset scaled in memory) keep the graph's own times
    from devplace.costing import costed_for
    assert costed_for(g2080, dp.load_cluster("baechi-4x2080").with_memory_fraction(0.5)) is g2080
    recosted = costed_for(g2080, v100)
    assert recosted.meta["costed_for"]["gpu"]["model"] == "V100 16 GB"
    assert recosted.meta["recosted_from"]["gpu"]["model"] == "RTX 2080"
    np.testing.assert_array_equal(recosted.compute_us, direct.compute_us)


def test_a_roofline_graph_gains_a_column_for_a_device_kind_it_lacks():
    model, x = mlp()
    g = dp.capture(model, x, mse, cluster="baechi-4x2080")
    mixed = dp.load_cluster("cpu+4gpu")
    result = dp.simulate(g, mixed, [0] * g.n_ops)  # all on the CPU device
    direct = dp.capture(model, x, mse, cluster=mixed)
    assert result.step_time_us == pytest.approx(direct.compute_us[:, direct.kind_index("cpu")].sum())


def test_a_measured_graph_is_refused_on_a_named_other_device():
    model, x = mlp()
    g = dp.capture(model, x, mse, cost="measured", repeats=1, progress=False)
    assert g.meta["costed_for"]["cpu"]["model"].startswith("this machine's CPU")
    # a cpu device that names no model is taken to be this machine
    dp.simulate(g, dp.cluster.uniform_cluster(1, kind="cpu"), [0] * g.n_ops)
    other = cluster_from_dict({"name": "xeon", "devices": [{"kind": "cpu", "model": "Xeon 8480", "memory_gib": 64}]})
    with pytest.raises(ClusterError, match="measured on this machine's CPU.*Xeon 8480.*devplace profile"):
        dp.simulate(g, other, [0] * g.n_ops)


def test_same_kind_devices_that_differ_are_refused():
    model, x = mlp()
    mixed = cluster_from_dict({
        "name": "mixed", "devices": [
            {"name": "a", "kind": "gpu", "model": "A", "memory_gib": 8, "peak_tflops": 10, "memory_bandwidth_gbps": 400},
            {"name": "b", "kind": "gpu", "model": "B", "memory_gib": 8, "peak_tflops": 20, "memory_bandwidth_gbps": 900}],
        "links": {"default": {"latency_us": 1, "bandwidth_bytes_per_us": 1e4}}})
    with pytest.raises(ClusterError, match="'a' and 'b'.*both of kind 'gpu'.*different kinds"):
        dp.capture(model, x, mse, cluster=mixed)


def test_bf16_ops_use_the_tensor_core_peak_and_a_device_without_one_is_said_so():
    model, x = mlp(torch.bfloat16)
    h100 = dp.capture(model, x, mse, cluster="8xh100-nvlink")
    assert "bfloat16" in h100.meta["op_dtype"] and not h100.meta["cost_notes"]
    dev = dp.load_cluster("8xh100-nvlink").devices[0]
    flops = np.asarray(h100.meta["op_flops"])
    moved = np.asarray(h100.meta["op_bytes_read"]) + np.asarray(h100.meta["op_bytes_written"])
    bf16 = (np.asarray(h100.meta["op_dtype"]) == "bfloat16") & (flops > 0)
    expected = np.maximum(flops / dev.peak_flops_bf16, moved / dev.memory_bandwidth_bytes_per_s) / EFFICIENCY * 1e6
    launch_us = np.asarray(h100.meta["op_launches"]) * LAUNCH_US["gpu"]
    np.testing.assert_allclose(h100.compute_us[bf16, 0] - launch_us[bf16], expected[bf16], rtol=1e-9)
    v100 = dp.capture(model, x, mse, cluster="dgx1-8xv100")
    assert any("has no bfloat16 peak" in note for note in v100.meta["cost_notes"])
    fp32 = dp.capture(*mlp(), mse, cluster="8xh100-nvlink")
    assert set(fp32.meta["op_dtype"]) <= {"float32", "int64", ""}


class Cumulative(nn.Module):
    """A linear layer and a cumulative product: an op with no FLOP formula (shape estimate)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return torch.cumprod(self.fc(x), dim=-1)


def test_info_reports_fallback_ops_as_ops_and_share_of_flops(tmp_path):
    import json
    import subprocess
    import sys

    g = dp.capture(Cumulative(), torch.randn(8, 64), mse, cluster="baechi-4x2080")
    assert "cumprod" in g.meta["flop_fallback_ops"]
    path = tmp_path / "g.json"
    dp.save_graph(g, path)
    run = lambda *a: subprocess.run([sys.executable, "-m", "devplace.cli", "info", str(path), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=120, check=True).stdout
    data = json.loads(run("--json"))
    guessed = [i for i, k in enumerate(g.kinds) if k in g.meta["flop_fallback_ops"]]
    flops = np.asarray(g.meta["op_flops"])
    assert data["flop_fallback"]["ops"] == len(guessed) >= 1
    assert data["flop_fallback"]["flops_share"] == pytest.approx(flops[guessed].sum() / flops.sum())
    assert data["costed_for"] == {"gpu": "RTX 2080"} and data["cost_model"] == "roofline"
    text = run()
    assert f"{len(guessed)} ops, {flops[guessed].sum() / flops.sum():.2%} of FLOPs (cumprod" in text


def test_profile_without_a_cluster_says_how_to_cost():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "devplace.cli", "profile", "zoo:mlp", "-o", "never.json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--cost roofline (the default) needs --cluster" in proc.stderr and "--cost measured" in proc.stderr


class EveryKind(nn.Module):
    """Layers of the kinds real models use, beyond those of the library-model tier."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 16, mode="mean")
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.rnn = nn.RNN(16, 16, batch_first=True)
        self.cell = nn.LSTMCell(16, 16)
        self.up = nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.norms = nn.Sequential(nn.GroupNorm(2, 4), nn.InstanceNorm2d(4, affine=True))
        self.conv = nn.Sequential(nn.Conv2d(4, 4, 3, groups=4, padding=1), nn.AvgPool2d(2), nn.AdaptiveMaxPool2d(1))
        self.head = nn.Linear(16, 10)

    def forward(self, ids, offsets, image):
        seq = self.bag(ids, offsets).unsqueeze(1).repeat(1, 5, 1)
        h = self.rnn(self.gru(seq)[0])[0]
        c = self.cell(h[:, -1])[0]
        x = self.conv(self.norms(self.up(image))).flatten(1)
        return (nn.functional.mse_loss(self.head(c), torch.zeros(2, 10))
                + nn.functional.binary_cross_entropy_with_logits(x, torch.ones_like(x))
                + nn.functional.smooth_l1_loss(c, torch.zeros_like(c)) + nn.functional.gelu(c).mean())


def test_layers_of_every_kind_have_flop_formulas():
    ids = torch.randint(0, 100, (8,), generator=torch.Generator().manual_seed(0))
    g = dp.capture(EveryKind(), (ids, torch.tensor([0, 4]), torch.randn(2, 4, 8, 8)), lambda out: out,
                   cluster="8xh100-nvlink")
    assert g.meta["flop_fallback_ops"] == []
    flops = np.asarray(g.meta["op_flops"])
    bag = g.kinds.index("_embedding_bag")
    assert flops[bag] == 8 * 16  # one add per element of each row looked up
    # it reads the rows it looks up (and the indices, offsets), not the whole table
    assert g.meta["op_bytes_read"][bag] == 8 * 16 * 4 + (8 + 2) * 8
