"""Simulating one training step under a placement."""

from devplace.sim.result import SimResult
from devplace.sim.simulator import Simulator, simulate
from devplace.sim.trace import chrome_trace, write_chrome_trace

__all__ = ["SimResult", "Simulator", "simulate", "chrome_trace", "write_chrome_trace"]
