"""Schedule orders that charge transfers more than an idle link would: the upward rank with each
cross-device edge's transfer time scaled by a factor.

Why: the search's "upward rank" order counts a transfer at its idle-link time. Under ``sequential``
channels a transfer holds the one channel of both its GPUs and is queued first-come first-served when
its producer finishes (``devplace.sim.engine``), so a tensor that crosses often waits as long again
behind other transfers. A larger charge ranks the producers of such tensors earlier, so their
transfers are booked before the channel fills with transfers whose readers can wait.
"""

from __future__ import annotations

import numpy as np

from devplace.placers._listsched import bottom_levels
from devplace.placers._moves import edge_transfer_us


def channel_rank_us(graph, cluster, devices: np.ndarray, op_time_us: np.ndarray, factor: float) -> np.ndarray:
    """Longest time from each op's start to the end of the step with every transfer's idle-link time
    (message overheads included) times ``factor``; ``factor`` 1 is ``upward_rank_us``."""
    own = op_time_us[np.arange(graph.n_ops), devices] + float(cluster.op_gap_us)
    return bottom_levels(graph.topo_order.astype(np.int64), graph.succ_ptr, graph.succ_edge, graph.edge_dst,
                         own, factor * edge_transfer_us(graph, cluster, devices))


def channel_rank_orders(search, devices: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """One order per factor of ``config.channel_rank_factors``, as ``search.orders`` lists them; none
    unless the channels are ``sequential`` (under the other models a transfer holds one channel)."""
    if search.cluster.comm_model != "sequential":
        return []
    return [(f"channel rank x{factor:g}", -channel_rank_us(search.graph, search.cluster, devices,
                                                          search.sim.op_time_us, factor))
            for factor in search.config.channel_rank_factors]
