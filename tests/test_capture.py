"""Capturing PyTorch training steps: op counts, bytes, groups, mirrors and costs worked out by hand."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.torchcapture import capture as capture_step, profile_target  # noqa: E402
from devplace.costing import LAUNCH_US  # noqa: E402
from devplace.cluster import cluster_from_dict  # noqa: E402
from devplace.errors import CaptureError, DevplaceError  # noqa: E402
from devplace.graph import Role  # noqa: E402

pytestmark = pytest.mark.torch
F32 = 4


def capture(*args, **kwargs):
    """The figures below are worked out for the per-parameter optimizer step (the multi-tensor and
    fused forms are tested in test_capture_update.py)."""
    return capture_step(*args, **{"update": "per-parameter", **kwargs})


def gpu_cluster(peak_tflops: float, bandwidth_gbps: float = 1e9):
    return cluster_from_dict({
        "name": f"test{peak_tflops}",
        "devices": [{"kind": "gpu", "count": 2, "memory_gib": 16, "peak_tflops": peak_tflops,
                     "memory_bandwidth_gbps": bandwidth_gbps}],
        "links": {"default": {"latency_us": 1, "bandwidth_bytes_per_us": 1e4}},
    })


def mse(out):
    return out.square().mean()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(3, 4)


@pytest.fixture(scope="module")
def mlp_graph():
    model, x = mlp()
    return capture(model, x, mse, cost="roofline", cluster=gpu_cluster(100.0), return_trace=True)


def ops_of(g, kind, role=None):
    return [i for i in range(g.n_ops) if g.kinds[i] == kind and (role is None or g.role[i] == role)]


def test_mlp_persistent_bytes_are_parameters_and_adam_state(mlp_graph):
    g, _ = mlp_graph
    param_bytes = (8 * 4 + 8 + 2 * 8 + 2) * F32  # 232
    adam_bytes = 2 * param_bytes + 4 * F32  # exp_avg, exp_avg_sq, and a float32 step per parameter
    assert g.persistent_bytes[ops_of(g, "param")].sum() == param_bytes
    assert g.persistent_bytes[ops_of(g, "state")].sum() == adam_bytes
    assert g.persistent_bytes.sum() == param_bytes + adam_bytes


def test_mlp_forward_ops_and_activation_bytes(mlp_graph):
    g, _ = mlp_graph
    forward = Counter(g.kinds[i] for i in range(g.n_ops) if g.role[i] == Role.FORWARD)
    # t+addmm per Linear, relu (and the detach of its output saved for backward), pow+mean for the loss
    assert forward == Counter(t=2, addmm=2, relu=1, detach=1, pow=1, mean=1)
    addmm = ops_of(g, "addmm", Role.FORWARD)
    assert sorted(g.output_bytes[addmm]) == [3 * 2 * F32, 3 * 8 * F32]
    assert g.output_bytes[ops_of(g, "relu")[0]] == 3 * 8 * F32
    assert g.output_bytes[ops_of(g, "input")[0]] == 3 * 4 * F32
    flops = np.asarray(g.meta["op_flops"])
    assert sorted(flops[addmm]) == [2 * 3 * 8 * 2, 2 * 3 * 4 * 8]
    assert flops[ops_of(g, "relu")].tolist() == [3 * 8]  # elementwise: one FLOP per element
    assert g.meta["flop_fallback_ops"] == []  # every op of the step has a formula


def test_mlp_update_ops_and_colocation_groups(mlp_graph):
    g, _ = mlp_graph
    params = ops_of(g, "param")
    assert len(params) == 4 and len(g.colocation_names) == 4
    update = [i for i in range(g.n_ops) if g.role[i] == Role.UPDATE]
    # one addcdiv_ writes each parameter: as many parameter updates as parameters
    assert len(ops_of(g, "addcdiv_", Role.UPDATE)) == len(params)
    # single-tensor Adam: 9 ATen ops per parameter, every one in its parameter's group
    per_group = Counter(int(g.colocation[i]) for i in update)
    assert sorted(per_group.values()) == [9, 9, 9, 9]
    for p in params:
        members = set(g.colocation_members[g.colocation[p]].tolist())
        states = [s for s in ops_of(g, "state") if g.colocation[s] == g.colocation[p]]
        assert len(states) == 3  # step, exp_avg, exp_avg_sq
        assert any(g.kinds[i] == "addcdiv_" for i in members)
        assert members >= set(states) | {p}


def test_views_and_inplace_ops_allocate_nothing(mlp_graph):
    g, _ = mlp_graph
    for kind in ("t", "view", "expand", "detach", "add_", "lerp_", "mul_", "addcmul_", "addcdiv_"):
        found = ops_of(g, kind)
        assert found, kind
        assert (g.output_bytes[found] == 0).all(), kind
    # a transposed weight read later in backward keeps its storage owner (the parameter) as a predecessor
    t_backward = [i for i in ops_of(g, "mm", Role.BACKWARD)]
    assert t_backward


def test_backward_ops_mirror_the_forward_op_they_differentiate(mlp_graph):
    g, traced = mlp_graph
    relu = ops_of(g, "relu")[0]
    assert [g.mirror[i] for i in ops_of(g, "threshold_backward")] == [relu]
    first, second = sorted(ops_of(g, "addmm", Role.FORWARD), key=lambda i: g.output_bytes[i], reverse=True)
    mirrored = Counter(int(g.mirror[i]) for i in ops_of(g, "mm", Role.BACKWARD))
    # second Linear: grad of its weight and of its input; first Linear: only its weight (x needs no grad)
    assert mirrored == {second: 2, first: 1}
    assert (g.mirror[g.role != Role.BACKWARD] == -1).all()
    # no tensor is used twice, so no gradient is summed: every backward op mirrors a forward op (the
    # root gradient, made before autograd runs any Node, takes the mirror of its reader: the loss's mean)
    assert (g.mirror[g.role == Role.BACKWARD] >= 0).all()
    assert [g.mirror[i] for i in ops_of(g, "ones_like")] == ops_of(g, "mean")
    # op names are fx node names, so an executor can run the graph op by op
    fx_names = {n.name for n in traced.gm.graph.nodes}
    assert set(g.names) <= fx_names


class SharedLinear(nn.Module):
    """One Linear applied twice and its first output used twice: three gradient sums."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return self.lin(h) + h


def test_gradient_sums_mirror_the_op_that_made_the_tensor_not_the_loss():
    torch.manual_seed(0)
    g, traced = capture(SharedLinear(), torch.randn(2, 4), mse, optimizer="sgd", cost="roofline",
                        cluster=gpu_cluster(1.0), return_trace=True)
    fx = {n.name: n for n in traced.gm.graph.nodes}
    sums = ops_of(g, "add", Role.BACKWARD)
    assert len(sums) == 3  # the gradients of h, of lin.weight and of lin.bias, two terms each
    # h = addmm(bias, x, weight.t()): its gradient sum mirrors that addmm, the one reading the input
    (first_linear,) = [i for i in ops_of(g, "addmm", Role.FORWARD) if "input_0" in
                       {a.name for a in fx[g.names[i]].all_input_nodes}]
    mirrors = sorted(int(g.mirror[i]) for i in sums)
    assert mirrors == [-1, -1, first_linear]
    # a parameter's sum goes to no autograd Node (autograd.grad returns it): no mirror, but its group
    for i in sums:
        if g.mirror[i] < 0:
            assert g.colocation_names[g.colocation[i]] in ("param:lin.weight", "param:lin.bias")
    # op_scope follows the mirror
    assert [g.meta["op_scope"][i] for i in sums if g.mirror[i] >= 0] == ["lin"]
    loss = ops_of(g, "mean")[0]
    assert all(g.kinds[i] != "add" for i in np.flatnonzero(g.mirror == loss))


def test_backward_stamps_agree_with_torchs_own_except_on_gradient_sums(monkeypatch):
    """torch's AOT-autograd hooks stamp the same Node as ours on every op run inside a Node; the
    gradient sums (``is_gradient_acc``) get the loss's seq_nr from torch and no stamp from ours."""
    from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
    from devplace import zoo
    from devplace.torchcapture import trace

    ours = trace._stamp_backward_nodes

    def both(loss):
        setup_stacktrace_preservation_hooks([loss.grad_fn])
        ours(loss)

    monkeypatch.setattr(trace, "_stamp_backward_nodes", both)
    m = zoo.build("rnnlm", preset="small")
    traced = trace.trace_step(m.model, m.example_inputs, m.loss_fn, "none", targets=m.targets)
    loss_seq = max(n.meta["seq_nr"] for n in traced.gm.graph.nodes if trace._phase(n) == "forward")
    seen = Counter()
    for node in traced.gm.graph.nodes:
        if node.op != "call_function" or trace._phase(node) != "backward":
            continue
        stamp = node.meta["custom"].get("grad_fn")
        if node.meta.get("is_gradient_acc"):
            assert stamp is None and node.meta["seq_nr"] == loss_seq, node.name
            seen["sum"] += 1
        elif stamp is None:  # the root gradient, made by autograd.grad before any Node runs
            assert node.target is torch.ops.aten.ones_like.default
            seen["root"] += 1
        else:
            assert stamp == node.meta["seq_nr"], node.name
            seen["stamped"] += 1
    assert seen["root"] == 1 and seen["sum"] > 10 and seen["stamped"] > 100


def test_every_op_records_its_module_scope(mlp_graph):
    g, _ = mlp_graph
    scope = g.meta["op_scope"]
    assert len(scope) == g.n_ops
    forward = {(g.kinds[i], scope[i]) for i in range(g.n_ops) if g.role[i] == Role.FORWARD}
    # Sequential(Linear, ReLU, Linear): modules "0", "1", "2"; the loss runs outside the model
    assert forward == {("t", "0"), ("addmm", "0"), ("relu", "1"), ("detach", "1"), ("t", "2"), ("addmm", "2"),
                       ("pow", ""), ("mean", "")}
    for i in np.flatnonzero(g.mirror >= 0):
        assert scope[i] == scope[g.mirror[i]]
    for i in range(g.n_ops):
        if g.role[i] == Role.UPDATE or g.kinds[i] in ("param", "state"):
            # colocation group "param:2.weight" -> module "2"
            assert scope[i] == g.colocation_names[g.colocation[i]].removeprefix("param:").rpartition(".")[0]
    assert {scope[i] for i in ops_of(g, "input")} == {""}


def test_roofline_times_scale_with_peak_flops():
    model, x = mlp()
    slow = capture(model, x, mse, cost="roofline", cluster=gpu_cluster(1e-3))
    fast = capture(model, x, mse, cost="roofline", cluster=gpu_cluster(2e-3))
    launch = LAUNCH_US["gpu"]
    flops = np.asarray(slow.meta["op_flops"])
    busy = flops > 0
    assert busy.sum() > 10
    ratio = (slow.compute_us[busy, 0] - launch) / (fast.compute_us[busy, 0] - launch)
    np.testing.assert_allclose(ratio, 2.0, rtol=1e-9)
    np.testing.assert_allclose(slow.compute_us[busy, 0] - launch, flops[busy] / 1e9 / 0.6 * 1e6, rtol=1e-9)
    assert slow.device_kinds == ("gpu",)


def test_roofline_gives_one_column_per_device_kind():
    model, x = mlp()
    g = capture(model, x, mse, cost="roofline", cluster=dp.load_cluster("cpu+4gpu"))
    assert g.device_kinds == ("cpu", "gpu")
    kernel = g.compute_us[:, 1] > 0
    launch = LAUNCH_US
    # the CPU preset has a tenth of the GPU's FLOP/s and bandwidth: 10x the time above the launch cost
    np.testing.assert_allclose(g.compute_us[kernel, 0] - launch["cpu"], 10 * (g.compute_us[kernel, 1] - launch["gpu"]), rtol=0.5)
    assert kernel.sum() > 20


def small_cnn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 5))
    return model, torch.randn(2, 3, 8, 8), torch.tensor([1, 4])


def test_small_cnn_graph_measured_on_cpu(monkeypatch):
    from devplace.torchcapture import graph_from_fx

    monkeypatch.setattr(graph_from_fx, "MEMBER_MIN_BYTES", 0)  # hold even this model's few-byte elements apart
    model, x, labels = small_cnn()
    loss = lambda out, y: nn.functional.cross_entropy(out, y)  # noqa: E731
    g = capture(model, (x,), loss, targets=(labels,), cost="measured", repeats=2, progress=False)
    assert g.device_kinds == ("cpu",)
    param_bytes = (4 * 3 * 3 * 3 + 4 + 5 * 64 + 5) * F32
    assert g.persistent_bytes.sum() == param_bytes + 2 * param_bytes + 4 * F32
    conv = ops_of(g, "convolution", Role.FORWARD)
    assert len(conv) == 1 and g.output_bytes[conv[0]] == 2 * 4 * 8 * 8 * F32
    assert [g.mirror[i] for i in ops_of(g, "convolution_backward")] == conv
    pool = ops_of(g, "max_pool2d_with_indices")[0]
    # the values, read by the next layer; the int64 indices, read by the backward, are an output member of their own
    assert g.output_bytes[pool] == 2 * 4 * 4 * 4 * F32 and g.temp_bytes[pool] == 2 * 4 * 4 * 4 * 8
    (indices,) = [e for e in g.out_edges(pool) if g.edge_order_only[e] and g.kinds[g.edge_dst[e]] == "getitem"]
    indices = g.edge_dst[indices]
    assert g.output_bytes[indices] == 2 * 4 * 4 * 4 * 8 and g.colocation[indices] == g.colocation[pool] >= 0
    assert [g.kinds[i] for i in g.successors(indices)] == ["max_pool2d_with_indices_backward"]
    assert "max_pool2d_with_indices_backward" not in [g.kinds[g.edge_dst[e]] for e in g.out_edges(pool)]
    assert g.output_bytes[ops_of(g, "view", Role.FORWARD)].sum() == 0  # Flatten
    assert g.output_bytes[ops_of(g, "target")[0]] == 2 * 8
    assert len(ops_of(g, "addcdiv_", Role.UPDATE)) == 4
    kernels = [i for i in range(g.n_ops) if g.kinds[i] in ("convolution", "addmm", "convolution_backward")]
    assert (g.compute_us[kernels, 0] > 0).all()
    single = dp.simulate(g, dp.cluster.uniform_cluster(1, kind="cpu", memory_bytes=1e12), [0] * g.n_ops)
    assert single.step_time_us == pytest.approx(g.compute_us[:, 0].sum())
    assert single.peak_memory_bytes[0] >= g.persistent_bytes.sum()


def test_sgd_has_no_state_and_one_update_per_parameter():
    model, x = mlp()
    g = capture(model, x, mse, optimizer="sgd", cost="roofline", cluster=gpu_cluster(1.0))
    assert not ops_of(g, "state")
    writes = [i for i in range(g.n_ops) if g.role[i] == Role.UPDATE and g.kinds[i] == "add_"]
    assert len(writes) == 4


class Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow cannot be traced with fake tensors
            return x
        return -x


def test_errors_are_one_clear_sentence():
    model, x = mlp()
    with pytest.raises(CaptureError, match=r"scalar \(0-d\) tensor.*shape \(3, 2\)"):
        capture(model, x, lambda out: out, cost="roofline", cluster=gpu_cluster(1.0))
    with pytest.raises(CaptureError, match="has no parameters"):
        capture(nn.ReLU(), x, mse, cost="roofline", cluster=gpu_cluster(1.0))
    with pytest.raises(CaptureError, match=r"example_inputs\[1\] is a str"):
        capture(model, (x, "text"), mse, cost="roofline", cluster=gpu_cluster(1.0))
    with pytest.raises(CaptureError, match="must be a torch.nn.Module"):
        capture(lambda x: x, x, mse, cost="roofline", cluster=gpu_cluster(1.0))
    gated = nn.Sequential(nn.Linear(4, 4), Gate())
    with pytest.raises(CaptureError, match=r"module 1 \(Gate\) failed"):
        capture(gated, x, mse, cost="roofline", cluster=gpu_cluster(1.0))
    # the scope hooks are gone even though tracing failed inside a module
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in gated.modules())
    assert "nn_module_stack" not in torch.fx.traceback.current_meta
    with pytest.raises(DevplaceError, match="peak_tflops"):
        capture(model, x, mse, cost="roofline", cluster=dp.cluster.uniform_cluster(2))
    assert issubclass(CaptureError, DevplaceError)


def test_profile_file_target(tmp_path):
    source = tmp_path / "net.py"
    source.write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Linear(3, 2), torch.randn(5, 3), lambda out: out.sum()\n"
    )
    g = profile_target(f"{source}:build", cost="roofline", cluster=gpu_cluster(1.0))
    assert g.persistent_bytes.sum() == 3 * (2 * 3 + 2) * F32 + 2 * F32
    assert g.meta["source"].endswith("net.py:build")
    with pytest.raises(CaptureError, match="no function"):
        profile_target(f"{source}:missing", cluster=gpu_cluster(1.0))


def test_import_devplace_stays_torch_free():
    code = "import sys, devplace; assert 'torch' not in sys.modules; assert callable(devplace.capture)"
    subprocess.run([sys.executable, "-c", code], check=True)
    import devplace.torchcapture  # noqa: F401

    # the package has its own name, so importing it leaves the lazy function in place
    assert dp.capture.__module__ == "devplace" and callable(dp.capture)


@pytest.fixture(scope="module")
def gnmt_small():
    from devplace import zoo

    cluster = dp.load_cluster("baechi-4x2080")
    graph, traced = capture(zoo.build("gnmt", preset="small"), cost="roofline", cluster=cluster, return_trace=True)
    return graph, traced, cluster


def test_gnmt_forward_ops_of_a_layer_carry_its_module_path(gnmt_small):
    g, traced, _ = gnmt_small
    scope = g.meta["op_scope"]
    index = {name: i for i, name in enumerate(g.names)}
    # the forward ops that read a parameter of encoder layer 0 (its two cells) ran inside that layer
    readers = set()
    for node in traced.gm.graph.nodes:
        if node.op == "placeholder" and node.name.startswith("param_encoder_layers_0_"):
            readers |= {index[u.name] for u in node.users if u.name in index and g.role[index[u.name]] == Role.FORWARD}
    assert len(readers) >= 8  # 2 cells x 4 weights and biases, read at least once
    assert all(scope[i].startswith("encoder.layers.0.") for i in readers)
    # every LSTM layer's cell ran: forward ops are scoped to each of them
    forward_scopes = {scope[i] for i in range(g.n_ops) if g.role[i] == Role.FORWARD}
    for side in ("encoder", "decoder"):
        for layer in range(1, 4):
            assert f"{side}.layers.{layer}.cell" in forward_scopes
    mirrored = np.flatnonzero(g.mirror >= 0)
    assert len(mirrored) > 1000
    assert all(scope[i] == scope[g.mirror[i]] for i in mirrored)
    # op names are still fx node names (an executor maps them back)
    assert set(g.names) <= {n.name for n in traced.gm.graph.nodes}


def test_gnmt_gradient_sums_do_not_glue_the_model_to_its_loss(gnmt_small):
    from devplace.transforms import coplacement_groups

    g, _, _ = gnmt_small
    (loss,) = ops_of(g, "nll_loss_forward")
    # only the loss's own backward mirrors it; with torch's seq_nr 213 gradient sums (add) did too
    assert sorted(g.kinds[i] for i in np.flatnonzero(g.mirror == loss)) == ["nll_loss_backward", "ones_like"]
    # the sums of hidden states and attention outputs mirror the forward ops that made them; the 39
    # parameters used at each of the 4 time steps have 3 sums each, which mirror nothing (autograd.grad
    # returns them): the last of each is in its parameter's colocation group, the others feed it
    sums = ops_of(g, "add", Role.BACKWARD)
    unmirrored = [i for i in sums if g.mirror[i] < 0]
    assert len(sums) == 213 and len(unmirrored) == 3 * 39
    assert sum(g.colocation[i] >= 0 for i in unmirrored) == 39
    assert (g.mirror[g.role == Role.BACKWARD] >= 0).sum() == (g.role == Role.BACKWARD).sum() - 117
    # the largest co-placement group: the attention with the decoder layers that read its context (the
    # context's gradient sums meet there), 448 of 2971 ops; 2639 when every sum joined the loss
    assert np.bincount(coplacement_groups(g)).max() < 600


def test_expert_places_captured_gnmt_layers_by_module_scope(gnmt_small):
    g, _, cluster = gnmt_small
    p = dp.place(g, cluster, algo="expert")  # refuses a placement that overflows a device
    scope = g.meta["op_scope"]
    layer_devices = {}
    for i, s in enumerate(scope):
        parts = s.split(".")
        if parts[0] in ("encoder", "decoder") and len(parts) > 2 and parts[1] == "layers":
            layer_devices.setdefault(int(parts[2]), set()).add(int(p.devices[i]))
    # each of the 4 layers (encoder and decoder side together) on its own one of the 4 devices
    assert layer_devices == {0: {0}, 1: {1}, 2: {2}, 3: {3}}
    result = dp.simulate(g, cluster, p)
    assert (result.peak_memory_bytes <= cluster.memory_bytes).all()


def test_batchnorm_running_stats_are_updated_in_place_and_grouped_with_their_module(monkeypatch):
    from devplace.torchcapture import graph_from_fx

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2))
    x = torch.randn(2, 3, 4, 4)
    # elements of a few bytes stay in their op by default (MEMBER_MIN_BYTES); held apart, they are members
    whole = capture(model, x, mse, cost="roofline", cluster=gpu_cluster(1.0))
    assert "getitem" not in whole.kinds
    monkeypatch.setattr(graph_from_fx, "MEMBER_MIN_BYTES", 0)
    g, traced = capture(model, x, mse, cost="roofline", cluster=gpu_cluster(1.0), return_trace=True)
    buffers = ops_of(g, "buffer")
    assert g.persistent_bytes[buffers].sum() == 2 * 4 * F32 + 8  # running mean, var; int64 batch count
    group = {int(g.colocation[i]) for i in buffers}
    assert len(group) == 1 and g.colocation_names[group.pop()] == "buffers:1"
    members = set(g.colocation_members[g.colocation[buffers[0]]].tolist())
    # native_batch_norm updates both running stats (its schema does not say so), add_ the batch count
    # and its statistics, which only its backward reads, are output members on its device (getitem)
    assert {g.kinds[i] for i in members} == {"buffer", "native_batch_norm", "add_", "getitem"}
    assert all(g.role[i] == Role.FORWARD for i in members if g.kinds[i] != "buffer")
    (norm,) = ops_of(g, "native_batch_norm")
    (norm_backward,) = ops_of(g, "native_batch_norm_backward")
    stats = [i for i in members if g.kinds[i] == "getitem"]
    assert len(stats) == 2 and (g.output_bytes[stats] == 4 * F32).all()
    assert all(norm_backward in g.successors(i).tolist() for i in stats)
    # the backward reads the statistics and the running stats the forward wrote, never the normalized output:
    # an edge from the forward op only orders, so that output is freed once the forward has read it
    assert all(g.edge_order_only[e] for e in g.out_edges(norm) if g.edge_dst[e] == norm_backward)
    assert g.output_bytes[norm] == 2 * 4 * 4 * 4 * F32
    # running the traced step on real tensors updates the buffers passed in, as an eager step does
    args = traced.real_args(model, x)
    first = len(traced.param_names)
    traced.gm(*args)
    model.train()
    model(x)
    for k, (name, expected) in enumerate(model.named_buffers()):
        torch.testing.assert_close(args[first + k], expected, msg=name)


def test_cpu_attention_and_rnn_kernels_are_costed_as_the_gpu_kernels():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 12)

        def forward(self, x):  # x [B=2, L=3, E=4], one head
            q, k, v = self.proj(x).unsqueeze(1).chunk(3, dim=-1)
            return nn.functional.scaled_dot_product_attention(q, k, v)

    g = capture(Attention(), torch.randn(2, 3, 4), mse, cost="roofline", cluster=gpu_cluster(1.0))
    flops = np.asarray(g.meta["op_flops"])
    forward = 2 * (2 * 2 * 1 * 3 * 3 * 4)  # Q K^T and P V: 2 B H L S E each (B=2, H=1, L=S=3, E=4)
    assert [flops[i] for i in ops_of(g, "_scaled_dot_product_flash_attention")] == [forward]
    # backward recomputes Q K^T (flash attention keeps no scores), then dV = P^T dO, dP = dO V^T,
    # dQ = dS K, dK = dS^T Q: five products of 2 B H L S E
    assert [flops[i] for i in ops_of(g, "_scaled_dot_product_flash_attention_backward")] == [5 * forward // 2]

    lstm = nn.LSTM(3, 5)
    g = capture(lstm, torch.randn(4, 2, 3), lambda out: out[0].square().mean(), cost="roofline",
                cluster=gpu_cluster(1.0))
    flops = np.asarray(g.meta["op_flops"])
    tokens = 4 * 2
    forward = 2 * tokens * (4 * 5 * 3 + 4 * 5 * 5)  # 2 FLOPs per weight element (w_ih, w_hh) per token
    assert [flops[i] for i in ops_of(g, "_cudnn_rnn")] == [forward]
    assert [flops[i] for i in ops_of(g, "_cudnn_rnn_backward")] == [2 * forward]
    assert not {"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"} & set(g.meta["flop_fallback_ops"])
    # costed for GPUs, the CPU-only kernels are named after the ones a GPU runs
    assert not any("mkldnn" in k or k.endswith("_for_cpu") for k in g.kinds)
    cpu = cluster_from_dict({"name": "cpu", "devices": [{"kind": "cpu", "memory_gib": 8, "peak_tflops": 1,
                                                       "memory_bandwidth_gbps": 50}]})
    on_cpu = capture(lstm, torch.randn(4, 2, 3), lambda out: out[0].square().mean(), cluster=cpu)
    assert "mkldnn_rnn_layer" in on_cpu.kinds  # costed for CPUs only: the CPU kernel
    # measured: the replay runs in grad mode, where the CPU kernel keeps the workspace its backward reads
    measured = capture(lstm, torch.randn(4, 2, 3), lambda out: out[0].square().mean(), cost="measured",
                       repeats=1, progress=False)
    assert measured.compute_us[measured.kinds.index("mkldnn_rnn_layer_backward"), 0] > 0


def test_measured_times_leave_out_the_clocks_own_cost(monkeypatch):
    from devplace.torchcapture import costs

    ticks = iter(range(0, 10**12, 7))  # a clock that reads 7 ns more at every call, whatever ran
    monkeypatch.setitem(costs.CLOCKS, "ticks", lambda: next(ticks))
    assert costs.clock_overhead_ns(costs.CLOCKS["ticks"]) == 7
    model, x = mlp()
    _, traced = capture(model, x, mse, cost="roofline", cluster=gpu_cluster(1.0), return_trace=True)
    names = [n.name for n in traced.gm.graph.nodes if n.op == "call_function"]
    ticked = costs.measured_us(traced.gm, traced.real_args(model, x), names, repeats=2, progress=False, clock="ticks")
    assert (ticked == 0).all()  # each op's window read exactly one empty window
    real = costs.measured_us(traced.gm, traced.real_args(model, x), names, repeats=2, progress=False, clock="cpu")
    assert real[names.index("addmm")] > 0
