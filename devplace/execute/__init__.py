"""Running a placed training step for real, and calibrating a cluster from this machine (needs torch).

>>> import devplace as dp
>>> result = dp.run("zoo:mlp:preset=small", "placement.json", backend="distributed")  # doctest: +SKIP
>>> result.measured_step_time_us, result.simulated_step_time_us                      # doctest: +SKIP

Modules: ``program`` (a traced step as picklable instructions), ``interpreter`` (runs them op by op
on placed devices), ``schedule`` (devices, per-device order, deadlock-free send/receive plan),
``local`` (one process, ``.to(device)``), ``distributed`` (one process per device,
torch.distributed), ``calibrate`` (measures devices and links into a cluster TOML), ``api``
(``run``, the eager reference a run is checked against).
"""

from devplace.execute.api import BACKENDS, Prepared, RunResult, eager_reference, max_difference, prepare, run
from devplace.execute.program import ExecutionError

__all__ = ["BACKENDS", "ExecutionError", "Prepared", "RunResult", "eager_reference", "max_difference", "prepare", "run"]
