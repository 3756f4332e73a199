"""The link cost model: how long a tensor takes to cross a link, and which channels it holds.

Everything that costs a transfer uses these functions: the simulator's event loop, the list
scheduler behind m-ETF and m-SCT, HEFT, and sim-search's moves. So a communication model is
defined once, by name and code here, and a caller cannot drift from the simulator.

Channel state is one float array ``free_us`` of shape (n_devices + 2, n_devices) from
``channel_state``: when each channel is next free.

- ``free_us[i, j]``: the channel of the ordered pair i -> j (``parallel``, ``pipelined``);
- ``free_us[n, i]``: device i's one channel (``sequential``) or its send channel (``duplex``);
- ``free_us[n + 1, j]``: device j's receive channel (``duplex``).

A planner asks "what if" by booking on a copy (``free_us.copy()``) and commits by booking on the
state itself: the same function either way, so a plan and its commit cannot disagree.

Editing this file: numba's disk cache does not notice that a compiled caller in another file
(the engine, the list scheduler) depends on it, so delete the ``__pycache__`` folders under
``devplace/`` afterwards; ``tests/test_channels.py`` shows a stale caller as a disagreement.

>>> state = channel_state(2)
>>> duration, delay = transfer_us(1000.0, float("nan"), 5.0, 100.0)
>>> duration, delay, book(SEQUENTIAL, state, 0, 1, 0.0, duration, delay)
(15.0, 5.0, 0.0)
>>> book(SEQUENTIAL, state, 1, 0, 3.0, duration, delay)  # waits for the channels the first holds
15.0
"""

from __future__ import annotations

import numpy as np
from numba import njit

PARALLEL = 0    # one channel per ordered device pair
SEQUENTIAL = 1  # one channel per device, held at both ends (Baechi's model)
DUPLEX = 2      # a send and a receive channel per device
PIPELINED = 3   # one channel per ordered pair, held for bytes / bandwidth only

COMM_MODEL_CODES = {"parallel": PARALLEL, "sequential": SEQUENTIAL, "duplex": DUPLEX, "pipelined": PIPELINED}
COMM_MODELS = tuple(COMM_MODEL_CODES)


def planning_model(code: int) -> int:
    """The model placers plan with: ``pipelined`` is planned as ``duplex`` (a placer books a
    transfer when its consumer is placed, and does not model latency overlapping later messages)."""
    return DUPLEX if code == PIPELINED else code


@njit(cache=True, inline="always")
def transfer_us(nbytes, fixed_us, latency_us, bandwidth_bytes_per_us):
    """(duration, delay) of one edge's transfer on an idle link.

    The duration is the edge's fixed time if it has one (not NaN), else latency + bytes /
    bandwidth, and 0 for a zero-byte edge (it moves nothing). The delay is the part of it that
    does not hold a pipelined channel: the latency, or nothing for a fixed time. Placers that plan
    with message overheads pass ``Cluster.message_latency_us`` as the latency."""
    if fixed_us == fixed_us:
        return fixed_us, 0.0
    if nbytes > 0.0:
        return latency_us + nbytes / bandwidth_bytes_per_us, latency_us
    return 0.0, 0.0


@njit(cache=True)
def channel_state(n_devices):
    """Every channel free at time 0, in the layout the module docstring describes."""
    return np.zeros((n_devices + 2, n_devices))


@njit(cache=True, inline="always")
def book(model, free_us, src, dst, ready_us, duration_us, delay_us):
    """Book a transfer src -> dst that could begin at ``ready_us``; returns when it begins.

    It begins once the channels ``model`` needs are free and holds them until it ends (a pipelined
    pair channel only until its bytes are out: begin + (duration - delay)). A transfer of
    duration 0 neither waits nor holds anything."""
    if duration_us == 0.0:
        return ready_us
    n = free_us.shape[1]
    if model == PARALLEL or model == PIPELINED:
        begin = max(ready_us, free_us[src, dst])
        if model == PIPELINED:
            free_us[src, dst] = begin + (duration_us - delay_us)
        else:
            free_us[src, dst] = begin + duration_us
    elif model == SEQUENTIAL:
        begin = max(ready_us, free_us[n, src], free_us[n, dst])
        free_us[n, src] = begin + duration_us
        free_us[n, dst] = begin + duration_us
    else:
        begin = max(ready_us, free_us[n, src], free_us[n + 1, dst])
        free_us[n, src] = begin + duration_us
        free_us[n + 1, dst] = begin + duration_us
    return begin


@njit(cache=True)
def placed_edge_us(src_device, dst_device, edge_bytes, edge_fixed_us, latency_us, bandwidth_bytes_per_us):
    """Per edge, its transfer time on an idle link between the devices its ends are on (0 when
    both are on one device): ``transfer_us`` for a whole placement."""
    out = np.zeros(edge_bytes.shape[0])
    for e in range(edge_bytes.shape[0]):
        s, d = src_device[e], dst_device[e]
        if s != d:
            out[e] = transfer_us(edge_bytes[e], edge_fixed_us[e], latency_us[s, d], bandwidth_bytes_per_us[s, d])[0]
    return out
