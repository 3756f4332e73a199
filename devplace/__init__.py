"""devplace: place a neural network's training step across devices.

>>> import devplace as dp
>>> g = dp.load_graph(dp.example_path("gnmt_layers_training.json"))   # doctest: +SKIP
>>> c = dp.load_cluster("baechi-4x2080")
>>> c.n_devices
4

The core (graph, cluster, simulator, algorithmic placers) never imports torch, so this import and
the command line start fast; ``capture`` and ``run`` load torch when called.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

from devplace.cluster import Cluster, Device, load_cluster
from devplace.errors import DevplaceError
from devplace.graph import GraphBuilder, OpGraph, Role
from devplace.io import load_graph, save_graph
from devplace.placement import Placement
from devplace.portfolio import place
from devplace import learn  # noqa: F401,E402  (registers the learning placers; they import torch only when they run)
from devplace.sim import SimResult, Simulator, simulate

__version__ = "0.1.0"

# library code logs under "devplace" and never prints; the application decides what to show
logging.getLogger("devplace").addHandler(logging.NullHandler())


def example_path(name: str) -> Path:
    """Path of a graph bundled with devplace (see ``devplace/data/``)."""
    path = Path(str(resources.files("devplace") / "data" / name))
    if not path.exists():
        available = sorted(p.name for p in path.parent.iterdir() if p.suffix == ".json")
        raise DevplaceError(f"no bundled example {name!r}: available are {', '.join(available)}")
    return path


def capture(model, example_inputs=None, loss_fn=None, optimizer="adam", cost="roofline", cluster=None, **options) -> OpGraph:
    """Capture a PyTorch training step as an OpGraph, by default with roofline costs for ``cluster``'s
    devices (``cost="measured"`` times each op here instead; imports torch, see ``devplace.torchcapture``)."""
    from devplace.torchcapture import capture as capture_step

    return capture_step(model, example_inputs, loss_fn, optimizer=optimizer, cost=cost, cluster=cluster, **options)


def run(target, placement, *, cluster=None, backend="local", steps=5, **options):
    """Run ``target``'s training step for real under ``placement`` (imports torch; see ``devplace.execute``)."""
    from devplace.execute import run as run_step

    return run_step(target, placement, cluster=cluster, backend=backend, steps=steps, **options)


__all__ = [
    "Cluster", "Device", "DevplaceError", "GraphBuilder", "OpGraph", "Placement", "Role",
    "SimResult", "Simulator", "capture", "example_path", "load_cluster", "load_graph", "place", "run", "save_graph", "simulate",
]
