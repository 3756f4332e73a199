"""Simulating one training step under a placement.

The entry points load on first use: ``devplace.cluster`` imports this package's ``channels`` (the
communication models), and the simulator imports ``devplace.cluster``, so importing them here,
with the package, would be an import cycle."""

from importlib import import_module

_ENTRY_POINTS = {
    "SimResult": "devplace.sim.result",
    "Simulator": "devplace.sim.simulator",
    "IncrementalSimulator": "devplace.sim.incremental",
    "simulate": "devplace.sim.simulator",
    "chrome_trace": "devplace.sim.trace",
    "write_chrome_trace": "devplace.sim.trace",
}

__all__ = list(_ENTRY_POINTS)


def __getattr__(name: str):
    if name not in _ENTRY_POINTS:
        raise AttributeError(f"module 'devplace.sim' has no attribute {name!r}")
    return getattr(import_module(_ENTRY_POINTS[name]), name)
