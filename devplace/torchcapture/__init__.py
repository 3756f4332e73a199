"""Capturing a PyTorch training step as an ``OpGraph`` (needs torch).

The package is ``devplace.torchcapture``, not ``devplace.capture``: importing a submodule binds its
name on the parent package, which would replace the lazy ``devplace.capture`` function.

>>> import torch, devplace as dp
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> g = dp.capture(model, torch.randn(3, 4), lambda out: out.square().mean(), cost="roofline",
...                cluster=dp.load_cluster("8xh100-nvlink"))
>>> g.role_counts()["update"] > 0
True

Pipeline: ``trace.trace_step`` (make_fx, fake tensors) -> ``graph_from_fx.op_stats`` (FLOPs,
bytes) -> ``costs`` (roofline or measured times) -> ``graph_from_fx.build_graph``.
"""

from __future__ import annotations

import time

from devplace.torchcapture.costs import local_device_kind, measured_us, roofline_us
from devplace.torchcapture.graph_from_fx import build_graph, op_stats
from devplace.torchcapture.targets import load_target
from devplace.torchcapture.trace import TracedStep, trace_step
from devplace.errors import CaptureError

COST_MODELS = ("measured", "roofline")


def capture(model, example_inputs=None, loss_fn=None, optimizer: str | None = "adam", cost: str = "measured",
            cluster=None, *, targets=(), repeats: int = 5, progress: bool = True, clock: str = "wall",
            return_trace: bool = False):
    """The OpGraph of one training step of ``model`` (forward, backward, optimizer update).

    ``loss_fn(model_output, *targets)`` must return a scalar tensor. ``model`` may also be a zoo
    model (``devplace.zoo.build(...)``), which brings its inputs, targets and loss. ``cost="roofline"`` needs a ``cluster``
    whose devices give peak FLOP/s and memory bandwidth and runs nothing for real;
    ``cost="measured"`` times every op here (device kind "cpu" or "gpu").
    With ``return_trace`` also returns the ``TracedStep`` (fx graph whose node names are the op names).
    """
    if cost not in COST_MODELS:
        raise CaptureError(f"unknown cost model {cost!r}: use one of {', '.join(COST_MODELS)}")
    if cost == "roofline" and cluster is None:
        raise CaptureError("cost='roofline' needs a cluster (its devices' peak FLOP/s and memory bandwidth)")
    if all(hasattr(model, a) for a in ("model", "example_inputs", "targets", "loss_fn")):
        model, example_inputs, targets, loss_fn = model.model, model.example_inputs, model.targets, model.loss_fn
    started = time.perf_counter()
    traced = trace_step(model, example_inputs, loss_fn, optimizer, targets=targets)
    trace_s = time.perf_counter() - started
    stats = op_stats(traced)
    if cost == "roofline":
        compute = roofline_us(stats.flops, stats.bytes_read + stats.bytes_written, stats.has_kernel, cluster)
    else:
        times = measured_us(traced.gm, traced.real_args(model, example_inputs, targets), stats.names,
                            repeats=repeats, progress=progress, clock=clock)
        compute = {local_device_kind(): times}
    meta = {
        "source": f"capture:{type(model).__name__}",
        "cost_model": cost if cost == "roofline" else f"measured ({clock} clock)",
        "optimizer": traced.optimizer,
        "op_flops": stats.flops.tolist(),
        "op_bytes_read": stats.bytes_read.tolist(),
        "op_bytes_written": stats.bytes_written.tolist(),
        "flop_fallback_ops": stats.estimated,
        "total_flops": float(stats.flops.sum()),
    }
    graph = build_graph(traced, stats, compute, meta)
    graph = graph.with_meta(capture_seconds={"trace": round(trace_s, 3),
                                             "total": round(time.perf_counter() - started, 3)})
    return (graph, traced) if return_trace else graph


def profile_target(target: str, *, cost: str = "roofline", cluster=None, optimizer: str | None = "adam", **options):
    """``devplace profile TARGET``: load a ``file.py:function`` or ``zoo:NAME[:k=v,...]`` target and capture it."""
    model, example_inputs, loss_fn, targets = load_target(target)
    graph = capture(model, example_inputs, loss_fn, optimizer=optimizer, cost=cost, cluster=cluster,
                    targets=targets, **options)
    return graph.with_meta(source=target)


__all__ = ["COST_MODELS", "CaptureError", "TracedStep", "capture", "profile_target", "trace_step"]
