"""The operator graph of one training step: the vocabulary every other module speaks.

An ``OpGraph`` holds its ops and edges as numpy arrays (so a 100k-op graph costs megabytes, not a
million Python objects) with the names beside them. Op ``i`` is row ``i`` of every per-op array;
a placement is one device index per op in that order. The graph is validated on construction and
cannot change afterwards (frozen fields, read-only arrays, name tuples, a read-only ``meta``), so
every later stage, and every cache keyed on it, may trust it.

>>> b = GraphBuilder(device_kinds=["gpu"])
>>> b.add_op("matmul", compute_us={"gpu": 10.0}, output_bytes=4096)
0
>>> b.add_op("relu", compute_us={"gpu": 2.0}, output_bytes=4096)
1
>>> b.add_edge("matmul", "relu", bytes=4096)
>>> g = b.build()
>>> g.n_ops, g.n_edges, g.successors(0).tolist()
(2, 1, [1])
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import Iterable, Mapping, Sequence

import numpy as np

from devplace.errors import GraphError
from devplace.frozen import FrozenDict, freeze, read_only_array, set_read_only_state


class Role(IntEnum):
    """What part of the training step an op belongs to."""

    FORWARD = 0
    BACKWARD = 1
    UPDATE = 2
    OTHER = 3

    @classmethod
    def parse(cls, value: "str | int | Role") -> "Role":
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise GraphError(
                    f"unknown role {value!r}: use one of forward, backward, update, other"
                ) from None
        try:
            return cls(int(value))
        except (TypeError, ValueError):
            raise GraphError(
                f"unknown role {value!r}: use one of forward, backward, update, other (or 0-3)"
            ) from None


ROLE_NAMES = tuple(r.name.lower() for r in Role)


@dataclass(eq=False, frozen=True)
class OpGraph:
    """Ops and tensor edges of a training step, validated and with CSR adjacency.

    Times are microseconds, sizes bytes. ``compute_us[i, k]`` is op ``i``'s time on a device of kind
    ``device_kinds[k]``. ``colocation[i]`` indexes ``colocation_names`` (-1: no group); ops of one
    group must share a device. ``mirror[i]`` is, for a backward op, the forward op it differentiates
    (-1 otherwise). ``edge_fixed_us[e]`` is NaN unless the edge has a fixed transfer time (graphs
    that give times, not bytes), which then replaces the cluster's link model for that edge.
    ``edge_order_only[e]`` marks an edge that only orders its ends (an in-place write after the
    reads it must follow): it carries no bytes and does not keep its producer's output allocated.
    ``meta`` is a free-form read-only record (``devplace.frozen``); ``with_meta`` derives a graph
    with a changed one.
    """

    names: tuple[str, ...]
    kinds: tuple[str, ...]
    device_kinds: tuple[str, ...]
    compute_us: np.ndarray
    persistent_bytes: np.ndarray
    output_bytes: np.ndarray
    temp_bytes: np.ndarray
    colocation: np.ndarray
    colocation_names: tuple[str, ...]
    role: np.ndarray
    mirror: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_bytes: np.ndarray
    edge_fixed_us: np.ndarray
    edge_order_only: np.ndarray | None = None   # None: no edge is order-only
    meta: Mapping = field(default_factory=FrozenDict)

    def __post_init__(self) -> None:
        n = len(self.names)
        converted = {
            "names": tuple(self.names), "kinds": tuple(self.kinds), "device_kinds": tuple(self.device_kinds),
            "colocation_names": tuple(self.colocation_names), "meta": freeze(dict(self.meta)),
            "compute_us": read_only_array(self.compute_us, np.float64).reshape(n, len(self.device_kinds)),
            "role": read_only_array(self.role, np.int8),
            "edge_order_only": read_only_array(
                np.zeros(len(self.edge_src), np.bool_) if self.edge_order_only is None else self.edge_order_only, np.bool_),
        }
        for attr in ("colocation", "mirror", "edge_src", "edge_dst"):
            converted[attr] = read_only_array(getattr(self, attr), np.int64)
        for attr in ("persistent_bytes", "output_bytes", "temp_bytes", "edge_bytes", "edge_fixed_us"):
            converted[attr] = read_only_array(getattr(self, attr), np.float64)
        for attr, value in converted.items():
            object.__setattr__(self, attr, value)  # frozen: only construction may set fields
        _validate(self)
        self._build_adjacency()
        object.__setattr__(self, "topo_order", _topological_order(self))

    __setstate__ = set_read_only_state  # a pickled or copied one stays read-only

    def with_meta(self, **changes) -> "OpGraph":
        """The same graph with ``changes`` merged into its meta record (the arrays are shared: none can change)."""
        graph = copy.copy(self)
        object.__setattr__(graph, "meta", freeze({**self.meta, **changes}))
        return graph

    # ----------------------------------------------------------------- structure
    @property
    def n_ops(self) -> int:
        return len(self.names)

    @property
    def n_edges(self) -> int:
        return len(self.edge_src)

    def _build_adjacency(self) -> None:
        n = self.n_ops
        for prefix, ends in (("succ", self.edge_src), ("pred", self.edge_dst)):
            ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(ends, minlength=n), out=ptr[1:])
            edge = np.argsort(ends, kind="stable").astype(np.int64, copy=False)
            for name, array in ((f"{prefix}_ptr", ptr), (f"{prefix}_edge", edge)):
                array.flags.writeable = False
                object.__setattr__(self, name, array)

    def successors(self, op: int) -> np.ndarray:
        return self.edge_dst[self.succ_edge[self.succ_ptr[op] : self.succ_ptr[op + 1]]]

    def predecessors(self, op: int) -> np.ndarray:
        return self.edge_src[self.pred_edge[self.pred_ptr[op] : self.pred_ptr[op + 1]]]

    def out_edges(self, op: int) -> np.ndarray:
        return self.succ_edge[self.succ_ptr[op] : self.succ_ptr[op + 1]]

    def in_edges(self, op: int) -> np.ndarray:
        return self.pred_edge[self.pred_ptr[op] : self.pred_ptr[op + 1]]

    @cached_property
    def index_of(self) -> Mapping[str, int]:
        """Op name -> op index."""
        return FrozenDict((name, i) for i, name in enumerate(self.names))

    def index(self, name: str) -> int:
        try:
            return self.index_of[name]
        except KeyError:
            raise GraphError(f"no op named {name!r} in the graph") from None

    @cached_property
    def holds_activations(self) -> bool:
        """Whether the graph models activation memory: some op owns output or temporary bytes. The
        dnn-partitioning graphs do not (a node's memory is its weights), so the simulator charges
        their received copies nothing either, as their authors' model does."""
        return bool(self.output_bytes.any() or self.temp_bytes.any())

    @cached_property
    def topo_rank(self) -> np.ndarray:
        """Position of each op in ``topo_order``: the default scheduling priority."""
        rank = np.empty(self.n_ops, dtype=np.int64)
        rank[self.topo_order] = np.arange(self.n_ops, dtype=np.int64)
        rank.flags.writeable = False
        return rank

    @cached_property
    def colocation_members(self) -> tuple[np.ndarray, ...]:
        """For each colocation group, the indices of its ops (ascending)."""
        order = np.argsort(self.colocation, kind="stable")
        order.flags.writeable = False
        bounds = np.searchsorted(self.colocation[order], np.arange(len(self.colocation_names) + 1)).tolist()
        return tuple(order[lo:hi] for lo, hi in zip(bounds, bounds[1:]))

    # ----------------------------------------------------------------- figures
    def kind_index(self, device_kind: str) -> int:
        try:
            return self.device_kinds.index(device_kind)
        except ValueError:
            raise GraphError(
                f"the graph has no compute times for device kind {device_kind!r} "
                f"(it has: {', '.join(self.device_kinds)}); capture or cost it for that kind, "
                f"or use a cluster whose devices are of a kind the graph knows"
            ) from None

    def role_counts(self) -> dict[str, int]:
        counts = np.bincount(self.role, minlength=len(Role))
        return {ROLE_NAMES[r]: int(counts[r]) for r in range(len(Role))}

    def total_compute_us(self) -> dict[str, float]:
        return {k: float(self.compute_us[:, i].sum()) for i, k in enumerate(self.device_kinds)}

    def summary(self) -> dict:
        """The figures ``devplace info`` prints."""
        return {
            "ops": self.n_ops,
            "edges": self.n_edges,
            "roles": self.role_counts(),
            "device_kinds": list(self.device_kinds),
            "persistent_bytes": float(self.persistent_bytes.sum()),
            "output_bytes": float(self.output_bytes.sum()),
            "temp_bytes": float(self.temp_bytes.sum()),
            "total_compute_us": self.total_compute_us(),
            "colocation_groups": len(self.colocation_names),
            "edge_bytes": float(self.edge_bytes.sum()),
            "fixed_cost_edges": int(np.count_nonzero(~np.isnan(self.edge_fixed_us))),
            "order_only_edges": int(np.count_nonzero(self.edge_order_only)),
            "source": self.meta.get("source", ""),
        }


# --------------------------------------------------------------------- validation
def _validate(g: OpGraph) -> None:
    n = len(g.names)
    for attr in ("kinds", "persistent_bytes", "output_bytes", "temp_bytes", "colocation",
                 "role", "mirror"):
        if len(getattr(g, attr)) != n:
            raise GraphError(f"field {attr!r} has {len(getattr(g, attr))} entries for {n} ops")
    n_edges = len(g.edge_src)
    for attr in ("edge_dst", "edge_bytes", "edge_fixed_us", "edge_order_only"):
        if len(getattr(g, attr)) != n_edges:
            raise GraphError(f"field {attr!r} has {len(getattr(g, attr))} entries for {n_edges} edges")
    if len(set(g.names)) != n:
        seen: set[str] = set()
        for name in g.names:
            if name in seen:
                raise GraphError(f"duplicate op name {name!r}: op names must be unique")
            seen.add(name)
    if len(set(g.device_kinds)) != len(g.device_kinds):
        raise GraphError(f"duplicate device kind in {g.device_kinds}")

    def check_figures(values: np.ndarray, field_name: str, owner) -> None:
        bad = ~np.isfinite(values) | (values < 0)
        if bad.any():
            i = int(np.flatnonzero(bad.reshape(len(values), -1).any(axis=1))[0])
            raise GraphError(
                f"{owner(i)} has {field_name} = {float(values[i])!r}: it must be a finite number >= 0"
            )

    op_name = lambda i: f"op {g.names[i]!r}"  # noqa: E731
    for k, kind in enumerate(g.device_kinds):
        check_figures(g.compute_us[:, k], f"compute time for {kind!r} (us)", op_name)
    check_figures(g.persistent_bytes, "persistent_bytes", op_name)
    check_figures(g.output_bytes, "output_bytes", op_name)
    check_figures(g.temp_bytes, "temp_bytes", op_name)

    if n_edges:
        for attr in ("edge_src", "edge_dst"):
            ends = getattr(g, attr)
            bad = (ends < 0) | (ends >= n)
            if bad.any():
                e = int(np.flatnonzero(bad)[0])
                raise GraphError(f"edge {e} refers to op index {int(ends[e])}, which does not exist")
        edge_name = lambda e: f"edge {g.names[g.edge_src[e]]!r} -> {g.names[g.edge_dst[e]]!r}"  # noqa: E731
        self_loops = np.flatnonzero(g.edge_src == g.edge_dst)
        if len(self_loops):
            raise GraphError(f"{edge_name(int(self_loops[0]))} is a self-loop: remove it")
        check_figures(g.edge_bytes, "bytes", edge_name)
        fixed = g.edge_fixed_us
        bad = ~np.isnan(fixed) & (~np.isfinite(fixed) | (fixed < 0))
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            raise GraphError(f"{edge_name(e)} has fixed_us = {float(fixed[e])!r}: it must be >= 0 or absent")
        carrying = g.edge_order_only & ((g.edge_bytes > 0) | ~np.isnan(fixed))
        if carrying.any():
            e = int(np.flatnonzero(carrying)[0])
            raise GraphError(f"{edge_name(e)} is order_only but carries bytes or a fixed_us: an ordering edge moves "
                             "no data (drop order_only, or its bytes and fixed_us)")

    n_groups = len(g.colocation_names)
    bad = (g.colocation < -1) | (g.colocation >= n_groups)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise GraphError(f"op {g.names[i]!r} names colocation group {int(g.colocation[i])}, which does not exist")
    bad = (g.role < 0) | (g.role >= len(Role))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise GraphError(f"op {g.names[i]!r} has role {int(g.role[i])}: use 0-3 (forward, backward, update, other)")
    bad = (g.mirror < -1) | (g.mirror >= n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise GraphError(f"op {g.names[i]!r} mirrors op index {int(g.mirror[i])}, which does not exist")


def _topological_order(g: OpGraph) -> np.ndarray:
    """Kahn's algorithm, smallest op index first among ready ops; names a cycle if there is one."""
    import heapq

    n = g.n_ops
    indegree = np.diff(g.pred_ptr).tolist()
    succ_ptr = g.succ_ptr.tolist()
    succ = g.edge_dst[g.succ_edge].tolist()
    ready = [i for i in range(n) if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        u = heapq.heappop(ready)
        order.append(u)
        for v in succ[succ_ptr[u] : succ_ptr[u + 1]]:
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, v)
    if len(order) != n:
        cycle = _find_cycle(g, done=set(order))
        shown = " -> ".join(repr(g.names[i]) for i in cycle[:12])
        more = f" (+{len(cycle) - 12} more)" if len(cycle) > 12 else ""
        raise GraphError(
            f"the graph has a cycle: {shown}{more} -> {g.names[cycle[0]]!r}; "
            f"a training step must be acyclic: remove one of these edges"
        )
    result = np.asarray(order, dtype=np.int64)
    result.flags.writeable = False
    return result


def _find_cycle(g: OpGraph, done: set[int]) -> list[int]:
    """Walk predecessors among ops Kahn could not order until one repeats."""
    start = next(i for i in range(g.n_ops) if i not in done)
    path: list[int] = []
    position: dict[int, int] = {}
    u = start
    while u not in position:
        position[u] = len(path)
        path.append(u)
        u = next(int(p) for p in g.predecessors(u) if int(p) not in done)
    return list(reversed(path[position[u] :]))


# ----------------------------------------------------------------------- building
class GraphBuilder:
    """Collects ops and edges by name, then builds a validated ``OpGraph``.

    Importers, capture and tests all build graphs through this, so the rules live in one place.
    """

    def __init__(self, device_kinds: Sequence[str]):
        self.device_kinds = list(device_kinds)
        self._names: list[str] = []
        self._index: dict[str, int] = {}
        self._kinds: list[str] = []
        self._compute: list[list[float]] = []
        self._persistent: list[float] = []
        self._output: list[float] = []
        self._temp: list[float] = []
        self._coloc: list[int] = []
        self._coloc_index: dict[str, int] = {}
        self._role: list[int] = []
        self._mirror: list[str | None] = []
        self._src: list[int] = []
        self._dst: list[str] = []
        self._edge_bytes: list[float] = []
        self._edge_fixed: list[float] = []
        self._order_only: list[bool] = []
        self.meta: dict = {}

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def add_op(
        self,
        name: str,
        *,
        compute_us: Mapping[str, float] | float,
        kind: str = "",
        persistent_bytes: float = 0.0,
        output_bytes: float = 0.0,
        temp_bytes: float = 0.0,
        colocation: str | None = None,
        role: "str | int | Role" = Role.FORWARD,
        mirror: str | None = None,
    ) -> int:
        """Add an op; ``compute_us`` is a time per device kind, or one time for every kind."""
        if name in self._index:
            raise GraphError(f"duplicate op name {name!r}: op names must be unique")
        if isinstance(compute_us, Mapping):
            missing = [k for k in self.device_kinds if k not in compute_us]
            if missing:
                raise GraphError(
                    f"op {name!r} has no compute time for device kind(s) {', '.join(missing)}"
                )
            times = [float(compute_us[k]) for k in self.device_kinds]
        else:
            times = [float(compute_us)] * len(self.device_kinds)
        role_code = int(Role.parse(role))  # may raise: check before changing any list
        index = len(self._names)
        self._index[name] = index
        self._names.append(name)
        self._kinds.append(kind)
        self._compute.append(times)
        self._persistent.append(float(persistent_bytes))
        self._output.append(float(output_bytes))
        self._temp.append(float(temp_bytes))
        if colocation is None:
            self._coloc.append(-1)
        else:
            self._coloc.append(self._coloc_index.setdefault(colocation, len(self._coloc_index)))
        self._role.append(role_code)
        self._mirror.append(mirror)
        return index

    def add_edge(self, src: str, dst: str, *, bytes: float = 0.0, fixed_us: float | None = None,
                 order_only: bool = False) -> None:
        """Add a tensor edge; ``fixed_us`` replaces the link model's time for it; ``order_only``: the
        consumer runs after the producer but does not read its output."""
        if src not in self._index:
            raise GraphError(f"edge {src!r} -> {dst!r} starts at op {src!r}, which does not exist")
        self._src.append(self._index[src])
        self._dst.append(dst)
        self._edge_bytes.append(float(bytes))
        self._edge_fixed.append(math.nan if fixed_us is None else float(fixed_us))
        self._order_only.append(bool(order_only))

    def build(self) -> OpGraph:
        dst = []
        for s, d in zip(self._src, self._dst):
            if d not in self._index:
                raise GraphError(
                    f"edge {self._names[s]!r} -> {d!r} ends at op {d!r}, which does not exist"
                )
            dst.append(self._index[d])
        mirror = []
        for name, m in zip(self._names, self._mirror):
            if m is None:
                mirror.append(-1)
            elif m in self._index:
                mirror.append(self._index[m])
            else:
                raise GraphError(f"op {name!r} mirrors op {m!r}, which does not exist")
        return OpGraph(
            names=list(self._names),
            kinds=list(self._kinds),
            device_kinds=list(self.device_kinds),
            compute_us=np.asarray(self._compute, dtype=np.float64).reshape(-1, len(self.device_kinds)),
            persistent_bytes=np.asarray(self._persistent),
            output_bytes=np.asarray(self._output),
            temp_bytes=np.asarray(self._temp),
            colocation=np.asarray(self._coloc, dtype=np.int64),
            colocation_names=sorted(self._coloc_index, key=self._coloc_index.__getitem__),
            role=np.asarray(self._role, dtype=np.int8),
            mirror=np.asarray(mirror, dtype=np.int64),
            edge_src=np.asarray(self._src, dtype=np.int64),
            edge_dst=np.asarray(dst, dtype=np.int64),
            edge_bytes=np.asarray(self._edge_bytes),
            edge_fixed_us=np.asarray(self._edge_fixed),
            edge_order_only=np.asarray(self._order_only, dtype=np.bool_),
            meta=dict(self.meta),
        )


def chain_graph(compute_us: Iterable[float], *, edge_bytes: float = 0.0, device_kind: str = "gpu") -> OpGraph:
    """A straight line of ops, for examples and tests."""
    b = GraphBuilder([device_kind])
    previous = None
    for i, t in enumerate(compute_us):
        name = f"op{i}"
        b.add_op(name, compute_us=t, output_bytes=edge_bytes)
        if previous is not None:
            b.add_edge(previous, name, bytes=edge_bytes)
        previous = name
    return b.build()
