"""m-ETF (Baechi): earliest-task-first list scheduling under per-device memory limits.

Repeatedly start the (ready op, device) pair that can start earliest, counting transfer and
channel waits; devices whose memory cannot take the op (with its colocation group) are skipped.
ETF's schedule is within (2 - 1/n) of optimal plus the longest chain of transfers (Hwang et al. 1989).
The machinery is in ``_listsched``. Memory is followed over the schedule being built and the
result checked by simulation, else the never-freeing model decides (``_memory.place_within_memory``).

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> place(chain_graph([1.0, 2.0]), uniform_cluster(2)).devices.tolist()
[0, 0]
"""

from __future__ import annotations

from devplace.placement import Placement
from devplace.placers import NO_OPTIONS, register
from devplace.placers._listsched import list_schedule
from devplace.placers._memory import check_can_fit, place_within_memory


@register("m-etf", "Baechi's memory-constrained earliest-task-first list scheduler")
def place(graph, cluster, *, seed: int = 0, options=NO_OPTIONS) -> Placement:
    # deterministic: ties are broken by bottom level, op index, device index, so the seed is unused
    check_can_fit(graph, cluster, "m-etf")
    return place_within_memory(graph, cluster, lambda budget: list_schedule(graph, cluster, algo="m-etf",
                                                                            budget_bytes=budget))
