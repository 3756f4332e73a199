"""Capturing a PyTorch training step as an ``OpGraph`` (needs torch).

The package is ``devplace.torchcapture``, not ``devplace.capture``: importing a submodule binds its
name on the parent package, which would replace the lazy ``devplace.capture`` function.

>>> import torch, devplace as dp
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> g = dp.capture(model, torch.randn(3, 4), lambda out: out.square().mean(), cluster="8xh100-nvlink")
>>> g.role_counts()["update"] > 0
True

Pipeline: ``trace.trace_step`` (make_fx, fake tensors) -> ``graph_from_fx.op_stats`` (FLOPs,
bytes) -> ``devplace.costing.roofline_us`` or ``costs.measured_us`` (times) -> ``graph_from_fx.build_graph``.
"""

from __future__ import annotations

import time

from devplace.cluster import Cluster, load_cluster
from devplace.costing import ROOFLINE, device_spec, kind_devices, roofline_us
from devplace.torchcapture.costs import local_device_kind, local_device_model, measured_us
from devplace.torchcapture.graph_from_fx import build_graph, op_stats
from devplace.torchcapture.targets import load_target
from devplace.torchcapture.trace import TracedStep, trace_step
from devplace.errors import CaptureError

COST_MODELS = ("roofline", "measured")


def capture(model, example_inputs=None, loss_fn=None, optimizer: str | None = "adam", cost: str = ROOFLINE,
            cluster=None, *, update: str = "foreach", targets=(), repeats: int = 5, progress: bool = True,
            clock: str = "wall", return_trace: bool = False, source: str | None = None):
    """The OpGraph of one training step of ``model`` (forward, backward, optimizer update).

    ``example_inputs``: what the model is called with: a tensor, a tuple of positional inputs or a
    dict of keyword inputs; tensors become graph inputs, None/int/bool constants stay as given.
    ``loss_fn(model_output, *targets)`` must return a scalar tensor. ``model`` may also be a zoo
    model (``devplace.zoo.build(...)``), which brings its inputs, targets and loss.
    ``cost="roofline"`` (the default, as ``devplace profile``) times ops from their FLOPs and bytes
    for the devices of ``cluster`` (a preset name, a .toml path or a Cluster) and runs nothing;
    ``cost="measured"`` times every op here (device kind "cpu" or "gpu"; ``cluster`` unused).
    ``update``: how the optimizer step runs: "foreach" (multi-tensor kernels, PyTorch's default on
    GPUs), "fused" (one kernel) or "per-parameter" (``foreach=False``, a loop of small ops); the first
    two become one op per parameter, each charged its share of the kernel launch.
    With ``return_trace`` also returns the ``TracedStep`` (fx graph whose node names are the op names).
    """
    if cost not in COST_MODELS:
        raise CaptureError(f"unknown cost model {cost!r}: use one of {', '.join(COST_MODELS)}")
    if cost == ROOFLINE:
        if cluster is None:
            raise CaptureError(
                "cost='roofline' (the default) needs a cluster whose devices give peak FLOP/s and memory bandwidth: "
                "pass cluster='8xh100-nvlink' (a preset name, a .toml path or a Cluster), or cost='measured' "
                "to time every op on this machine"
            )
        cluster = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
    if all(hasattr(model, a) for a in ("model", "example_inputs", "targets", "loss_fn")):
        model, example_inputs, targets, loss_fn = model.model, model.example_inputs, model.targets, model.loss_fn
    started = time.perf_counter()
    traced = trace_step(model, example_inputs, loss_fn, optimizer, targets=targets, update=update)
    trace_s = time.perf_counter() - started
    stats = op_stats(traced)
    notes: list[str] = []
    if cost == ROOFLINE:
        compute, notes = roofline_us(stats.flops, stats.bytes_read + stats.bytes_written, stats.launches,
                                     stats.dtypes, cluster)
        costed = {kind: device_spec(dev) for kind, dev in kind_devices(cluster).items()}
    else:
        times = measured_us(traced.gm, traced.real_args(model, example_inputs, targets), stats.names,
                            repeats=repeats, progress=progress, clock=clock)
        compute = {local_device_kind(): times}
        costed = {local_device_kind(): {"model": local_device_model()}}
    meta = {
        "source": source or f"capture:{type(model).__name__}",
        "cost_model": cost if cost == ROOFLINE else f"measured ({clock} clock)",
        "costed_for": costed,
        "cost_notes": notes,
        "optimizer": traced.optimizer,
        "optimizer_update": traced.update,
        "op_flops": stats.flops.tolist(),
        "op_bytes_read": stats.bytes_read.tolist(),
        "op_bytes_written": stats.bytes_written.tolist(),
        "op_dtype": stats.dtypes,
        "op_launches": stats.launches.tolist(),
        "flop_fallback_ops": stats.estimated,
        "total_flops": float(stats.flops.sum()),
        # total: tracing, FLOP counting and costing; building the OpGraph after it is not included
        "capture_seconds": {"trace": round(trace_s, 3), "total": round(time.perf_counter() - started, 3)},
    }
    graph = build_graph(traced, stats, compute, meta, gpu_kernels=cost == ROOFLINE and "gpu" in compute)
    return (graph, traced) if return_trace else graph


def profile_target(target: str, *, cost: str = ROOFLINE, cluster=None, optimizer: str | None = "adam", **options):
    """``devplace profile TARGET``: load a ``file.py:function`` or ``zoo:NAME[:k=v,...]`` target and capture it."""
    model, example_inputs, loss_fn, targets = load_target(target)
    return capture(model, example_inputs, loss_fn, optimizer=optimizer, cost=cost, cluster=cluster,
                   targets=targets, source=target, **options)


__all__ = ["COST_MODELS", "CaptureError", "TracedStep", "capture", "profile_target", "trace_step"]
