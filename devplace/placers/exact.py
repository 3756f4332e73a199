"""Exact placement for small graphs: a mixed-integer program solved by HiGHS, with a time limit.

The starting point is the latency integer program of Tarnawski et al. (NeurIPS 2020, "Efficient
Algorithms for Device Placement of DNN Graph Operators"): binary op-to-device variables, per-device
memory knapsacks, colocation equalities, and edges that pay their transfer when their ends are
apart. Their program schedules each device's ops as contiguous "calls" whose communication does not
overlap compute; the simulator schedules ops one by one, so this program instead keeps a start time
per op (the disjunctive form of a one-machine-at-a-time schedule) and is built to be a relaxation of
the simulator, which also makes it friendlier to an open solver: few big-M rows, one variable per
colocation unit and device, device symmetry broken, and a simulated placement as the first incumbent.

Variables: ``x[u, d]`` (unit u on device d, binary; units and the facts used are those of
``devplace.bounds``), ``s[v]`` (op start), ``W`` (step time), ``z[e]`` (edge e is cut), ``q[a, b]``
(ops a and b share a device) and binary ``o[a, b]`` (a runs before b). Rows:

- each unit on one device it fits; per device, persistent bytes at most its memory, and so are
  they plus the output, temporaries and inputs of any op when it starts there (F3, F4);
- ``s[b] >= s[a] + dur[a] + cut_us[e] z[e]`` per edge, with ``z[e] >= x[ua, d] - x[ub, d]`` (F2),
  and a consumer waits for the longest edge of the one transfer to its device (F2);
- ``W >= s[v] + dur[v]``, ``W >= `` each device's compute (F1) and ``W >=`` the best bound of
  ``devplace.bounds`` (every simulated run still is a solution);
- for pairs of ops with no path between them, on one device one runs after the other (F1):
  ``s[b] >= s[a] + dur[a] - M (1 - o) - M (1 - q)`` and the mirror row, ``M`` the first incumbent's
  simulated step time, which also caps ``W`` (a valid cap: that incumbent is a solution).

How its objective relates to the simulator: every simulated run of a valid placement, under any
priority, is a solution of this program (its starts satisfy every row), so the program's optimum, and
the dual bound HiGHS proves for it, is at most the simulated optimum: ``mip_bound_us`` is a certified
lower bound. Channel queues, message overheads and the rest of memory over time are left out, and
only the ``max_pairs`` pairs of longest ops get disjunctive rows (dropping rows keeps it a
relaxation), so the program's value for a placement can be below its simulated step time. The
placement returned is the best *simulated* of the improving solutions HiGHS found (each under its
start order and under the default priority) and the first incumbent: ``step_us`` is its simulated
step time and ``gap`` = step / bound - 1 how far it can be from optimal. With co-placement or
fusion (``exact+opt``) the program sees the coarse graph, so its bound holds only for placements
that keep the fused groups together, not for every placement of the original graph.

>>> from devplace.graph import chain_graph
>>> from devplace.cluster import uniform_cluster
>>> p = place(chain_graph([10.0, 20.0], edge_bytes=1e6), uniform_cluster(2))
>>> p.devices.tolist(), round(p.options["mip_bound_us"], 3), p.options["step_us"]
([0, 0], 30.0, 30.0)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numba import njit
from scipy import sparse

from devplace.bounds import lower_bounds, relaxation
from devplace.errors import OutOfMemoryError, PlacementError
from devplace.placement import Placement
from devplace.placers import register
from devplace.placers._highs import highs_solver
from devplace.placers.options import option
from devplace.sim import Simulator


@dataclass(frozen=True)
class ExactOptions:
    time_limit_s: float = option(30.0, "seconds HiGHS may spend; the incumbent and its proven bound are returned")
    max_ops: int = option(1000, "larger graphs are refused: the program grows with the square of the ops")
    start: tuple[str, ...] = option(("sim-search",), "placers whose best simulated placement is the first incumbent "
                                    "(HiGHS starts from it; it also sets the big-M); empty for none. sim-search "
                                    "already keeps the best of m-ETF, HEFT, m-TOPO, one device and the rest")
    max_pairs: int = option(20000, "disjunctive pairs kept, longest ops first: fewer solve faster, with a weaker bound")
    mip_rel_gap: float = option(1e-4, "HiGHS stops when incumbent / bound - 1 is below this")
    max_nodes: int = option(0, "stop after this many branch-and-bound nodes (0: no limit); unlike the time "
                               "limit, the same on every machine")
    floor_at_bound: bool = option(True, "W starts at devplace's certified bound: a proven bound at least as "
                                        "strong, and a stop as soon as a solution reaches it. False: W is the "
                                        "program's own step time however far below, so placements the floor "
                                        "would tie are told apart (the coarse MIP start)")


@register("exact", "mixed-integer program (HiGHS, time-limited) for small graphs: the best placement it finds "
          "and a certified lower bound", ExactOptions, by_default=False)
def place(graph, cluster, *, seed: int = 0, options: ExactOptions = ExactOptions()) -> Placement:
    # HiGHS runs single-threaded with a fixed seed: the same model and node limit give the same
    # result, so the seed is unused (a time limit that stops it makes the result depend on speed)
    if options.time_limit_s <= 0 or options.max_pairs < 0 or options.max_nodes < 0:
        raise PlacementError("exact: time_limit_s must be > 0, max_pairs and max_nodes >= 0")
    if graph.n_ops > options.max_ops:
        raise PlacementError(
            f"exact: the graph has {graph.n_ops:,} ops, more than max_ops = {options.max_ops:,}; it is for small "
            f"graphs: raise max_ops, or place the co-placed and fused graph (exact+opt; its bound then only "
            f"holds for placements that keep the fused groups together)")
    began = time.perf_counter()
    solve = solve_mip(graph, cluster, options, _first_incumbent(graph, cluster, options.start))
    candidates = [] if solve.first is None else [solve.first]
    for solution in solve.solutions:
        candidates += [solution, Placement(devices=solution.devices)]
    sim = Simulator(graph, cluster)
    best, best_us = None, np.inf
    for candidate in candidates:
        result = sim.run(candidate)
        if result.fits and result.step_time_us < best_us:
            best, best_us = candidate, result.step_time_us
    if best is None:
        raise OutOfMemoryError(
            f"exact: no placement found that fits ({solve.status}); give it more time_limit_s or larger devices")
    bound_us = max(solve.mip_bound_us, solve.bound_us)
    best.options = {
        "mip_status": solve.status, "mip_bound_us": solve.mip_bound_us, "mip_objective_us": solve.objective_us,
        "step_us": best_us, "lower_bound_us": bound_us, "gap": best_us / bound_us - 1 if bound_us > 0 else 0.0,
        "disjunctive_pairs": solve.n_pairs, "all_pairs": solve.n_pairs == solve.n_candidate_pairs,
        "first_incumbent_us": solve.first_us, "mip_nodes": solve.nodes,
        "solve_s": round(time.perf_counter() - began, 3),
    }
    return Placement(devices=best.devices, priority=best.priority, options=best.options)


@dataclass
class MipSolve:
    """What one solve gives: the first incumbent (None without one) and its simulated step time,
    every improving solution HiGHS found (its incumbent first; each with its start times as the
    priority), and the solve's figures."""

    first: Placement | None
    first_us: float | None
    solutions: list[Placement]
    status: str
    mip_bound_us: float
    objective_us: float | None
    bound_us: float          # the best of devplace.bounds, which the program's W starts from
    nodes: int
    n_pairs: int
    n_candidate_pairs: int


def solve_mip(graph, cluster, options: ExactOptions, first: Placement | None) -> MipSolve:
    """Build the program from the ``first`` incumbent (a placement that fits, or None) and run HiGHS
    under ``options``' limits; no placement is judged here (``place`` keeps the best simulated)."""
    rel = relaxation(graph, cluster)
    first_result = Simulator(graph, cluster).run(first) if first is not None else None
    bound_us = lower_bounds(graph, cluster)["best_us"]
    # without the floor HiGHS's dual bound is still one on the program's optimum, so still certified
    model = _Model(graph, cluster, rel, first_result, options.max_pairs,
                   bound_us if options.floor_at_bound else 0.0)
    solutions, status, mip_bound_us, objective_us = model.solve(options.time_limit_s, options.mip_rel_gap,
                                                               options.max_nodes)
    placements = []
    for solution in solutions:
        devices, starts = model.placement(solution)
        placements.append(Placement(devices=devices, priority=starts))
    return MipSolve(first, first_result.step_time_us if first_result is not None else None, placements, status,
                    mip_bound_us, objective_us, bound_us, model.nodes, model.n_pairs, model.n_candidate_pairs)


def _first_incumbent(graph, cluster, start: tuple[str, ...]):
    """The fastest in simulation of the ``start`` placers' placements, or None (none asked for, or
    none found one that fits)."""
    from devplace.placers import placer

    sim = Simulator(graph, cluster)
    if "exact" in start:
        raise PlacementError("exact: option start cannot name 'exact' itself; name other placers or none")
    best, best_us = None, np.inf
    for algo in start:
        info = placer(algo)  # through the registry: a placer never calls the layer above it
        try:
            placement = info.run(graph, cluster, seed=0, options=info.options())
        except OutOfMemoryError:
            continue
        if not sim.run(placement).fits:
            continue
        step_us = sim.step_time_us(placement.devices, placement.priority)
        if step_us < best_us:
            best, best_us = placement, step_us
    return best


@njit(cache=True)
def _reachable(n, topo_order, succ_ptr, succ_edge, edge_dst):
    """reach[u, v]: there is a path from u to v (or u == v)."""
    reach = np.zeros((n, n), np.bool_)
    for k in range(n - 1, -1, -1):
        u = topo_order[k]
        reach[u, u] = True
        for j in range(succ_ptr[u], succ_ptr[u + 1]):
            v = edge_dst[succ_edge[j]]
            for w in range(n):
                if reach[v, w]:
                    reach[u, w] = True
    return reach


def _answered():
    """HiGHS statuses whose bound and incumbent are trusted (anything else is a failure)."""
    import highspy

    status = highspy.HighsModelStatus
    return {status.kOptimal, status.kTimeLimit, status.kIterationLimit, status.kSolutionLimit,
            status.kInterrupt, status.kObjectiveBound, status.kObjectiveTarget}


class _Model:
    """The program's columns and rows, built once; ``solve`` runs HiGHS."""

    def __init__(self, graph, cluster, rel, first_result, max_pairs: int, bound_us: float):
        self.graph, self.rel = graph, rel
        n, n_dev = graph.n_ops, cluster.n_devices
        n_units = rel.allowed.shape[0]
        self.columns = 0
        self.lower, self.upper, self.integer, self.start_value = [], [], [], []
        self.rows, self.cols, self.vals, self.row_lower, self.row_upper = [], [], [], [], []
        self.n_rows = 0
        # upper bound on the step time: the first incumbent, else every op in a row, every edge cut.
        # It is the program's unit of time, so that the big-M is 1 (HiGHS' tolerances are absolute)
        if first_result is not None:
            cap_us = first_result.step_time_us
        else:
            finite_cut = np.where(np.isfinite(rel.cut_us), rel.cut_us, 0.0)
            cap_us = float(rel.op_time_us.max(axis=1).sum() + finite_cut.sum())
        self.unit_us = max(cap_us, 1e-9)
        self.big_m = cap_us / self.unit_us
        time_us = rel.op_time_us / self.unit_us
        first = _StartValues(first_result, graph, rel, self._symmetric(cluster), self.unit_us)

        allowed = rel.allowed & self._symmetry_mask(graph, cluster, rel)
        self.x = np.full((n_units, n_dev), -1, np.int64)
        for u, d in zip(*np.nonzero(allowed)):
            self.x[u, d] = self._column(0.0, 1.0, True, first.x(u, d))
        self.s = np.array([self._column(0.0, self.big_m, False, first.start(v)) for v in range(n)], dtype=np.int64)
        # W >= a certified bound of devplace.bounds: every simulated run still is a solution, and
        # branch and bound starts from it
        self.w = self._column(min(bound_us / self.unit_us, self.big_m), self.big_m, False, first.step)

        def duration_terms(v):     # dur[v] = sum_d time[v, d] x[unit(v), d]
            cols = self.x[rel.unit[v]]
            keep = cols >= 0
            return list(cols[keep]), list(time_us[v][keep])

        for u in range(n_units):   # one device per unit
            cols = self.x[u][self.x[u] >= 0]
            self._row(list(cols), [1.0] * len(cols), 1.0, 1.0)
        for d in range(n_dev):     # memory, and W >= the device's compute
            units = np.flatnonzero(self.x[:, d] >= 0)
            self._row(list(self.x[units, d]), list(rel.unit_bytes[units]), -np.inf, float(cluster.memory_bytes[d]))
            ops = np.flatnonzero(self.x[rel.unit, d] >= 0)
            self._row([self.w] + list(self.x[rel.unit[ops], d]), [1.0] + list(-time_us[ops, d]), 0.0, np.inf)
            for v in ops[rel.op_time_us[ops, d] > 0]:
                self._memory_at_start(graph, rel, int(v), d, units, float(cluster.memory_bytes[d]))
        self.z, self.q = {}, {}    # edge -> its z column (None: always cut); op pair -> q column
        for e in range(graph.n_edges):
            a, b = int(graph.edge_src[e]), int(graph.edge_dst[e])
            cols, vals = duration_terms(a)
            cols, vals = [self.s[b], self.s[a]] + cols, [1.0, -1.0] + [-t for t in vals]
            cut = rel.cut_us[e] / self.unit_us
            if np.isfinite(cut) and cut > 0:
                if rel.forced_cut[e]:
                    self._row(cols, vals, cut, np.inf)
                    self.z[e] = None
                    continue
                z = self.z[e] = self._column(0.0, 1.0, False, first.cut(e))
                self._row(cols + [z], vals + [-cut], 0.0, np.inf)
                ua, ub = rel.unit[a], rel.unit[b]
                for d in range(n_dev):   # z >= x[ua, d] - x[ub, d]
                    if self.x[ua, d] >= 0:
                        extra = ([self.x[ub, d]], [1.0]) if self.x[ub, d] >= 0 else ([], [])
                        self._row([z, self.x[ua, d]] + extra[0], [1.0, -1.0] + extra[1], 0.0, np.inf)
            else:
                self._row(cols, vals, 0.0, np.inf)
        self._shared_transfers(graph, rel, first, duration_terms)
        for v in np.flatnonzero(np.diff(graph.succ_ptr) == 0):   # W >= finish of each last op
            cols, vals = duration_terms(v)
            self._row([self.w, self.s[v]] + cols, [1.0, -1.0] + [-t for t in vals], 0.0, np.inf)
        self._disjunctions(graph, rel, first, max_pairs, duration_terms)

    # ------------------------------------------------------------------ building
    def _column(self, lower, upper, integer, start) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(integer)
        self.start_value.append(start)
        self.columns += 1
        return self.columns - 1

    def _row(self, cols, vals, lower, upper) -> None:
        self.rows += [self.n_rows] * len(cols)
        self.cols += list(cols)
        self.vals += list(vals)
        self.row_lower.append(lower)
        self.row_upper.append(upper)
        self.n_rows += 1

    def _memory_at_start(self, graph, rel, v, d, units, capacity) -> None:
        """When op v starts on device d (taking time there), d holds its persistent bytes, v's output
        and temporaries, and the output of each input: the producer's own if it is on d, else the
        received copy when the edge's transfer takes time (both freed only after v finishes) (F3)."""
        held = rel.footprint[v, d]
        inputs = set()
        for k in range(graph.pred_ptr[v], graph.pred_ptr[v + 1]):
            e = graph.pred_edge[k]
            if rel.cut_us[e] > 0 and not graph.edge_order_only[e]:   # on d or sent to d: held either way
                # (inf: same unit, on d); an order-only edge reads nothing and keeps nothing
                inputs.add(int(graph.edge_src[e]))
        held += sum(graph.output_bytes[u] for u in inputs)
        if held > 0:
            vals = rel.unit_bytes[units] + np.where(units == rel.unit[v], held, 0.0)
            self._row(list(self.x[units, d]), list(vals), -np.inf, capacity)

    def _same_device(self, rel, first, a, b):
        """The column q[a, b] (ops a and b share a device), made once; None when they always do."""
        ua, ub = rel.unit[a], rel.unit[b]
        if ua == ub:
            return None
        key = (min(a, b), max(a, b))
        if key not in self.q:
            q = self.q[key] = self._column(0.0, 1.0, False, first.same_device(a, b))
            for d in range(self.x.shape[1]):      # q >= x[ua, d] + x[ub, d] - 1
                if self.x[ua, d] >= 0 and self.x[ub, d] >= 0:
                    self._row([q, self.x[ua, d], self.x[ub, d]], [1.0, -1.0, -1.0], -1.0, np.inf)
        return self.q[key]

    def _shared_transfers(self, graph, rel, first, duration_terms) -> None:
        """u's output goes to a device once, as long as its longest edge there (F2): if u -> w is cut
        and v shares w's device, v waits for that transfer too. Rows only where it costs more than
        v's own edge: s[v] >= s[u] + dur[u] + c[u, w] (z[u, w] + q[v, w] - 1)."""
        for u in range(graph.n_ops):
            out = graph.succ_edge[graph.succ_ptr[u] : graph.succ_ptr[u + 1]]
            for e1 in out:
                for e2 in out:
                    v, w = int(graph.edge_dst[e1]), int(graph.edge_dst[e2])
                    cost = rel.cut_us[e2] / self.unit_us
                    if v == w or e2 not in self.z or not cost > rel.cut_us[e1] / self.unit_us:
                        continue
                    cols, vals = duration_terms(u)
                    cols, vals = [self.s[v], self.s[u]] + cols, [1.0, -1.0] + [-t for t in vals]
                    rhs = -cost
                    for column in (self.z[e2], self._same_device(rel, first, v, w)):
                        if column is None:      # always 1
                            rhs += cost
                        else:
                            cols.append(column)
                            vals.append(-cost)
                    self._row(cols, vals, rhs, np.inf)

    @staticmethod
    def _symmetric(cluster) -> bool:
        """Whether the program is unchanged by any relabelling of devices: one kind and one memory
        (its transfers are each edge's cheapest over all links, the same for every pair)."""
        return len(set(cluster.device_kinds)) == 1 and len(set(cluster.memory_bytes.tolist())) == 1

    def _symmetry_mask(self, graph, cluster, rel) -> np.ndarray:
        """On interchangeable devices, the k-th unit (in order of first op) may only use devices
        0..k: relabelling devices by first use turns any solution into one of these."""
        n_units, n_dev = rel.allowed.shape
        if not self._symmetric(cluster):
            return np.ones((n_units, n_dev), bool)
        return np.arange(n_dev)[None, :] <= _unit_rank(graph, rel)[:, None]

    def _disjunctions(self, graph, rel, first, max_pairs, duration_terms) -> None:
        """One-op-at-a-time rows for the ``max_pairs`` pairs without a path between them whose
        shorter op is longest (pairs of zero-time ops need none)."""
        n = graph.n_ops
        reach = _reachable(n, graph.topo_order, graph.succ_ptr, graph.succ_edge, graph.edge_dst)
        longest = rel.op_time_us.max(axis=1)
        a, b = np.nonzero(np.triu(~(reach | reach.T), k=1))
        weight = np.minimum(longest[a], longest[b])
        busy = weight > 0
        a, b, weight = a[busy], b[busy], weight[busy]
        self.n_candidate_pairs = len(a)
        keep = np.argsort(-weight, kind="stable")[:max_pairs]
        self.n_pairs = len(keep)
        m = self.big_m
        for a, b in zip(a[keep].tolist(), b[keep].tolist()):
            q = self._same_device(rel, first, a, b)
            q_const = 1.0 if q is None else 0.0
            o = self._column(0.0, 1.0, True, first.before(a, b))
            for first_op, second_op, sign in ((a, b, 1.0), (b, a, -1.0)):
                # s[second] - s[first] - dur[first] + M (o or 1 - o) + M (1 - q) >= 0
                cols, vals = duration_terms(first_op)
                cols = [self.s[second_op], self.s[first_op]] + cols
                vals = [1.0, -1.0] + [-t for t in vals]
                # a before b: the row for (a, b) is relaxed when o = 0; (b, a) when o = 1
                cols.append(o)
                vals.append(-m * sign)
                rhs = -m * (1.0 - q_const) - (m if sign > 0 else 0.0)
                if q is not None:
                    cols.append(q)
                    vals.append(-m)
                self._row(cols, vals, rhs, np.inf)

    # ------------------------------------------------------------------ solving
    def solve(self, time_limit_s: float, mip_rel_gap: float, max_nodes: int):
        """(solutions, status, proven bound, incumbent objective): every improving solution HiGHS
        found, the last (its incumbent) first, as the best in the program need not be the best in
        simulation."""
        import highspy

        matrix = sparse.csc_array((self.vals, (self.rows, self.cols)), shape=(self.n_rows, self.columns))
        cost = np.zeros(self.columns)
        cost[self.w] = 1.0
        solver = highs_solver(matrix, cost, self.lower, self.upper, self.row_lower, self.row_upper, self.integer,
                              time_limit=float(time_limit_s), mip_rel_gap=float(mip_rel_gap), random_seed=0,
                              threads=1, mip_improving_solution_save=True,
                              **({"mip_max_nodes": int(max_nodes)} if max_nodes else {}))
        if not any(v is None for v in self.start_value):
            start = highspy.HighsSolution()
            start.col_value = list(map(float, self.start_value))
            start.value_valid = True
            solver.setSolution(start)
        solver.run()
        status = solver.modelStatusToString(solver.getModelStatus())
        info = solver.getInfo()
        self.nodes = int(info.mip_node_count)
        model_status = solver.getModelStatus()
        if model_status not in _answered():   # a numerical failure: nothing from it is trusted
            return [], status, 0.0, None
        bound = float(info.mip_dual_bound)
        bound_us = max(0.0, bound * (1 - 1e-9)) * self.unit_us if np.isfinite(bound) else 0.0
        if info.primal_solution_status != 2:     # no feasible solution
            return [], status, bound_us, None
        solutions = [np.asarray(solver.getSolution().col_value)]
        solutions += [np.asarray(saved.col_value) for saved in reversed(solver.getSavedMipSolutions())]
        return solutions, status, bound_us, float(info.objective_function_value) * self.unit_us

    def placement(self, values):
        """Devices per op and start times per op from a solution."""
        x = np.where(self.x >= 0, values[np.maximum(self.x, 0)], -1.0)
        unit_device = x.argmax(axis=1)
        return unit_device[self.rel.unit].astype(np.int64), values[self.s] * self.unit_us


def _unit_rank(graph, rel) -> np.ndarray:
    """Each unit's rank by its first op in topological order (0 for the unit that runs first)."""
    first = np.full(rel.allowed.shape[0], graph.n_ops, np.int64)
    np.minimum.at(first, rel.unit, graph.topo_rank)
    rank = np.empty_like(first)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank


class _StartValues:
    """Values of the program's columns for the first incumbent's simulated run (None without one).

    On interchangeable devices they are relabelled in order of first use, to meet the symmetry rows."""

    def __init__(self, result, graph, rel, symmetric: bool, unit_us: float):
        self.result = result
        self.unit_us = unit_us
        self.step = None if result is None else result.step_time_us / unit_us
        if result is None:
            return
        devices = result.devices.copy()
        if symmetric:
            order = np.argsort(_unit_rank(graph, rel), kind="stable")    # units in rank order
            unit_device = np.zeros(rel.allowed.shape[0], np.int64)
            unit_device[rel.unit] = devices
            relabel, seen = {}, 0
            for u in order:
                if unit_device[u] not in relabel:
                    relabel[unit_device[u]] = seen
                    seen += 1
            devices = np.array([relabel[d] for d in devices], dtype=np.int64)
        self.devices = devices
        self.unit_device = np.zeros(rel.allowed.shape[0], np.int64)
        self.unit_device[rel.unit] = devices
        self.graph = graph

    def x(self, u, d):
        return None if self.result is None else float(self.unit_device[u] == d)

    def start(self, v):
        return None if self.result is None else float(self.result.start_us[v]) / self.unit_us

    def cut(self, e):
        if self.result is None:
            return None
        return float(self.devices[self.graph.edge_src[e]] != self.devices[self.graph.edge_dst[e]])

    def same_device(self, a, b):
        return None if self.result is None else float(self.devices[a] == self.devices[b])

    def before(self, a, b):
        return None if self.result is None else float(self.result.start_us[a] <= self.result.start_us[b])
