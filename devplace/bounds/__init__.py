"""Certified lower bounds on the step time: how far from optimal a placement can be.

Each bound is at most the step time the simulator gives *every* valid placement (one that keeps
colocation groups together and fits in memory) under *any* priority, so it is at most the optimum,
the smallest simulated step time over placements and priorities. Each is proven from these facts
about one simulated run (``devplace/sim/engine.py``, ``docs/simulator.md``); the step time is the
latest finish:

- (F1) an op on device ``d`` runs from its start to start + its compute time for ``d``'s kind +
  ``op_gap_us``, and a device runs one op at a time;
- (F2) for an edge u -> v, v starts no earlier than u finishes; if they are on different devices, no
  earlier than u's finish plus the edge's transfer time on that link (the one transfer of u's output
  to v's device begins at u's finish or later and lasts as long as its longest edge there). Channel
  queues and message overheads only add to this, so the bounds leave them out;
- (F3) persistent bytes are allocated at time 0 and never freed, so on a device where the placement
  fits, the persistent bytes of its ops are at most its memory; when an op that takes time there
  starts, its output and temporaries are allocated too (they live until it finishes at least), so
  those persistent bytes plus the op's output and temporary bytes are at most the memory as well;
- (F4) the ops of a colocation group share a device (``devplace.place`` refuses anything else);
- (F5) transfers are booked eagerly, in one order, first-come first-served: when op u on d finishes
  at f, the event loop (``sim/engine.advance``, the ``EVENT_FINISH`` branch, engine.py:279-302) books
  at once, at time f, u's one transfer to each other device e holding a reader (device by device),
  by ``channels.book`` (channels.py:71-94). Events are taken in time order, so booking times never
  fall along the booking order. ``book`` begins a transfer at max(f, the free time of each channel it
  holds) and sets those free times to its *hold end* (begin + duration; a ``pipelined`` pair: begin +
  duration - the latency, 0 for a fixed time); a free time is 0 or the hold end of the last transfer
  booked on that channel. Memory (``sim/engine.memory_events``): the received copy takes at least
  u's whole output bytes on e (the bytes sent, if more: a view's or a weight's) from the transfer's
  begin until u's last reader on e finishes, and u's output stays on d until its transfers end.
  The bounds count a copy as u's output bytes, so counting more on e keeps them sound. A *reader* of u is the consumer of an edge from u
  that is not ``order_only``: an order-only edge orders its ends and keeps nothing allocated, so the
  bounds' memory clauses never count on it.

*Lemma E (eager transfer).* A transfer x booked at f either begins at f, or every instant t of
[f, begin(x)) lies in [begin(y), hold end(y)) for some transfer y booked before x (so at or before
f). So at any t in [f, finish of u's last reader on e), u's output (whole) is on e, unless some
transfer booked before x holds a channel at t (then it is on d: x has not begun). Proof, by induction
along the booking order (the first booking begins at f: every free time is 0 <= f). Let t be in [f,
begin(x)). Then begin(x) > f, so begin(x) is the free time of a channel x holds, the hold end of
the last transfer y booked on it before x (not 0 > t >= 0). If begin(y) <= t, y holds at t (t <
hold end(y) = begin(x)). Else begin(y) > t >= f >= booking(y) (F5), so t lies in [booking(y),
begin(y)) and, by induction, in the hold interval of a transfer booked before y, so before x. The
memory clause is F5's. The transfer holding at t need not share a channel with x (a ``sequential``
y from e to g may wait for g's channel), nor be booked before time f (x may queue behind a
transfer booked at f itself): ``tests/test_bounds.py`` finds both stronger claims false on
simulated runs and the lemma true on every transfer.

A *unit* is a colocation group, or an op in none. An op may only go where its unit's persistent
bytes fit, with room for the output and temporaries of each of its ops that takes time there (F3,
F4), and its *fastest time* is its least time over those devices. An edge's *cut
cost* is its least transfer time over ordered pairs of distinct devices that its producer's and
its consumer's units may use (F2, F3); an edge inside a unit, or between units that may only share
one device, is never cut (F4; cut cost inf).

One bound (or one family) per module, each proven in its docstring from these facts: ``classic``
(critical path, communication path, work, largest group), ``interval_work``, ``memory_path``,
``cut_threshold`` (and the cluster order), ``turn_path``, ``turn_cut``; ``relaxation`` is what they all read, its heads and
tails raised by the windows of ``fork_join``.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> b = lower_bounds(chain_graph([10.0, 20.0, 30.0]), uniform_cluster(2))
>>> b["critical_path_us"], b["work_us"], b["best"]
(60.0, 30.0, 'critical_path_us')
"""

from __future__ import annotations

from devplace.bounds.classic import comm_path_us, critical_path_us, largest_group_us, work_us
from devplace.bounds.cut_threshold import cluster_order_us, cut_threshold_us
from devplace.bounds.interval_work import interval_work_us
from devplace.bounds.memory_path import memory_path_us
from devplace.bounds.relaxation import Relaxation, comm_windows, relaxation
from devplace.bounds.turn_cut import turn_cut_us
from devplace.bounds.turn_path import turn_path_us

BOUND_NAMES = ("critical_path_us", "comm_path_us", "work_us", "largest_group_us", "interval_work_us", "memory_path_us",
               "cut_threshold_us", "turn_path_us", "cluster_order_us", "turn_cut_us")


def lower_bounds(graph, cluster) -> dict:
    """Every bound (microseconds), the best (largest) and its name.

    An OutOfMemoryError if memory alone shows that no placement fits."""
    rel = relaxation(graph, cluster)
    bounds = {
        "critical_path_us": critical_path_us(graph, rel),
        "comm_path_us": comm_path_us(rel),
        "work_us": work_us(rel),
        "largest_group_us": largest_group_us(rel),
        "interval_work_us": interval_work_us(graph, cluster, rel),
        "memory_path_us": memory_path_us(graph, cluster, rel),
        "cut_threshold_us": cut_threshold_us(graph, cluster, rel),
        "cluster_order_us": cluster_order_us(graph, rel),
        "turn_path_us": turn_path_us(graph, cluster, rel),
        "turn_cut_us": turn_cut_us(graph, cluster, rel),
    }
    best = max(bounds, key=bounds.__getitem__)
    return bounds | {"best_us": bounds[best], "best": best}


__all__ = ["lower_bounds", "relaxation", "Relaxation", "BOUND_NAMES", "comm_windows", *BOUND_NAMES]
