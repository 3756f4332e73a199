"""The list scheduler's fast core against the plain scan it replaced, kept here as the reference.

The scheduler picks, at each step, the (ready op, device) pair that starts earliest (ties: longer
bottom level, lower op, lower device), with m-SCT's keep-idle rule. The package now keeps the ready
pairs in per-device heaps; the reference below scans them all. Both must give the same schedule to
the bit (devices, order, start and finish times, out-of-memory status and stuck op) on random
graphs with ties, colocation groups, tight memory and every communication model, and on the bundled
graphs, for m-ETF and m-SCT; with the never-freeing memory model and with memory followed over the
schedule (where a pair refused for memory competes again after the next op is booked).
"""

import numpy as np
import pytest
from numba import njit

import devplace as dp
from devplace.cluster import Cluster, Device, load_cluster, uniform_cluster
from devplace.graph import GraphBuilder
from devplace.placers._listsched import _claim_run, schedule, schedule_args
from devplace.placers._lp import round_favorites
from devplace.placers._memory import MemoryModel, ScheduleMemory, claim, earlier_edge_from, members_of, release_inputs
from devplace.sim.channels import COMM_MODELS, book, channel_state, transfer_us


@njit(cache=True)
def reference_inputs_ready(
    v, d, commit, device, finish, arrival, pred_ptr, pred_edge, edge_src, edge_bytes, edge_fixed_us,
    latency_us, bandwidth, model, free_us, scratch,
):
    """The former ``_inputs_ready`` (a quadratic search for a producer's other edges), unchanged.

    When all of v's inputs are on device d; with ``commit`` the transfers are booked.

    Without ``commit`` they are booked on ``scratch``, a copy of the channel state, so transfers of
    one op queue behind each other exactly as they would when booked. A producer joined to v by
    several edges sends its tensor once, for as long as the longest of them (as the simulator)."""
    n_dev = free_us.shape[1]
    channels = free_us
    if not commit:
        scratch[:, :] = free_us
        channels = scratch
    lo, hi = pred_ptr[v], pred_ptr[v + 1]
    ready = 0.0
    for k in range(lo, hi):
        e = pred_edge[k]
        u = edge_src[e]
        du = device[u]
        if du == d:
            t = finish[u]
        elif arrival[u * n_dev + d] >= 0.0:
            t = arrival[u * n_dev + d]
        elif earlier_edge_from(u, lo, k, pred_edge, edge_src):
            continue  # its transfer is booked and counted in ready already
        else:
            duration, delay = transfer_us(edge_bytes[e], edge_fixed_us[e], latency_us[du, d], bandwidth[du, d])
            for j in range(k + 1, hi):
                f = pred_edge[j]
                if edge_src[f] == u:
                    longer, longer_delay = transfer_us(edge_bytes[f], edge_fixed_us[f], latency_us[du, d], bandwidth[du, d])
                    if longer > duration:
                        duration, delay = longer, longer_delay
            t = book(model, channels, du, d, finish[u], duration, delay) + duration
            if commit and duration > 0.0:
                arrival[u * n_dev + d] = t
        if t > ready:
            ready = t
    return ready


@njit(cache=True)
def reference_schedule(
    time_us, op_gap_us, level, favorite, use_favorites, group, group_ptr, group_members,
    succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, edge_bytes, edge_fixed_us,
    latency_us, bandwidth, model,
    device, reserved, temp_max, capacity, copy_counted, static_bytes, output_bytes, temp_bytes, moves,
    track_schedule, schedule_claim, schedule_release,
):
    """The scheduler as it was before the ready-set heaps (a full scan of every ready op on every
    device at each step, again after each stale estimate), copied unchanged from main after memory
    began to follow the schedule: the new one must agree. Returns (status, start, finish, order,
    stuck op); status 1 = out of memory.

    With ``track_schedule`` memory is checked by ``_memory.run_claim`` over the schedule being built
    (its arrays are ``schedule_claim`` and ``schedule_release``, ``device`` is theirs), else by the
    never-freeing ``_memory.claim``."""
    n, n_dev = time_us.shape
    start = np.zeros(n)
    finish = np.zeros(n)
    order = np.full(n, -1, np.int64)
    arrival = np.full(n * n_dev, -1.0)
    # the last step at which a pair did not fit: for good with the never-freeing model, until the
    # next op is booked when memory follows the schedule (booking an op may free memory anywhere)
    blocked = np.full(n * n_dev, -1, np.int64)
    stamp = np.zeros(n * n_dev, np.int64)
    tick = 0
    delta = np.zeros(n_dev)
    free_us = channel_state(n_dev)
    scratch = channel_state(n_dev)
    device_free = np.zeros(n_dev)
    kept_for = np.full(n_dev, -1, np.int64)     # m-SCT: the favorite child a device waits for
    scheduled = np.zeros(n, np.bool_)
    waiting = np.zeros(n, np.int64)
    for v in range(n):
        waiting[v] = pred_ptr[v + 1] - pred_ptr[v]
    ready_ops = np.empty(n, np.int64)
    n_ready = 0
    for v in range(n):
        if waiting[v] == 0:
            ready_ops[n_ready] = v
            n_ready += 1
    # when each ready op's inputs could be on each device: a lower bound kept up to date lazily, as
    # channels only get busier; the winning pair is recomputed exactly before it is committed
    inputs_at = np.zeros(n * n_dev)
    est = np.zeros(n_dev)
    allowed = np.zeros(n_dev, np.bool_)
    step = 0
    while step < n:
        best_slot, best_d = -1, -1
        best_t, best_level, best_v = np.inf, 0.0, -1
        for relax in range(2):
            for slot in range(n_ready):
                v = ready_ops[slot]
                open_est = np.inf     # earliest start on a device open to v (not kept for another child)
                for d in range(n_dev):
                    allowed[d] = (device[v] < 0 or device[v] == d) and blocked[v * n_dev + d] < step
                    est[d] = max(device_free[d], inputs_at[v * n_dev + d])
                    if allowed[d] and (kept_for[d] < 0 or kept_for[d] == v) and est[d] < open_est:
                        open_est = est[d]
                for d in range(n_dev):
                    if not allowed[d]:
                        continue
                    if use_favorites and relax == 0 and kept_for[d] >= 0 and kept_for[d] != v:
                        # urgent: every other device open to v would start it strictly later
                        # (d, kept for another child, is not one of them)
                        if open_est <= est[d]:
                            continue
                    t = est[d]
                    if t < best_t or (t == best_t and (level[v] > best_level or (
                            level[v] == best_level and v < best_v))):
                        best_t, best_level, best_v, best_slot, best_d = t, level[v], v, slot, d
            if best_slot >= 0 or not use_favorites:
                break
        if best_slot < 0:
            return 1, start, finish, order, ready_ops[0] if n_ready > 0 else -1
        v, d = best_v, best_d
        exact = reference_inputs_ready(v, d, False, device, finish, arrival, pred_ptr, pred_edge, edge_src,
                                       edge_bytes, edge_fixed_us, latency_us, bandwidth, model, free_us, scratch)
        if exact > inputs_at[v * n_dev + d]:
            inputs_at[v * n_dev + d] = exact     # channels got busier since: look again
            continue
        inputs_at[v * n_dev + d] = exact
        best_t = max(device_free[d], exact)
        if track_schedule:
            if not _claim_run(v, d, best_t, best_t + time_us[v, d] + op_gap_us, finish, schedule_claim):
                blocked[v * n_dev + d] = step
                continue
        elif device[v] < 0:
            ops = members_of(v, group, group_ptr, group_members)
            tick += 1
            if not claim(ops, d, False, delta, stamp, tick, device, reserved, temp_max, capacity,
                         copy_counted, static_bytes, output_bytes, temp_bytes,
                         succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves):
                blocked[v * n_dev + d] = n
                continue
            tick += 1
            claim(ops, d, True, delta, stamp, tick, device, reserved, temp_max, capacity,
                  copy_counted, static_bytes, output_bytes, temp_bytes,
                  succ_ptr, succ_edge, pred_ptr, pred_edge, edge_src, edge_dst, moves)
        reference_inputs_ready(v, d, True, device, finish, arrival, pred_ptr, pred_edge, edge_src,
                               edge_bytes, edge_fixed_us, latency_us, bandwidth, model, free_us, scratch)
        start[v] = best_t
        finish[v] = best_t + time_us[v, d] + op_gap_us
        device_free[d] = finish[v]
        if track_schedule:
            release_inputs(v, finish, *schedule_release)
        scheduled[v] = True
        order[v] = step
        step += 1
        n_ready -= 1
        ready_ops[best_slot] = ready_ops[n_ready]
        if use_favorites:
            for o in range(n_dev):
                if kept_for[o] == v:
                    kept_for[o] = -1
            f = favorite[v]
            if kept_for[d] < 0 and f >= 0 and not scheduled[f] and (device[f] < 0 or device[f] == d):
                kept_for[d] = f
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            w = edge_dst[succ_edge[k]]
            waiting[w] -= 1
            if waiting[w] == 0:
                ready_ops[n_ready] = w
                n_ready += 1
                for o in range(n_dev):
                    inputs_at[w * n_dev + o] = reference_inputs_ready(
                        w, o, False, device, finish, arrival, pred_ptr, pred_edge, edge_src,
                        edge_bytes, edge_fixed_us, latency_us, bandwidth, model, free_us, scratch)
    return 0, start, finish, order, -1


def assert_same_schedule(graph, cluster, favorite=None, budget_bytes=None) -> int:
    """Run the package's scheduler and the reference on fresh memory models; all outputs equal.
    ``budget_bytes`` makes memory follow the schedule, with those limits. Returns the status (0
    placed, 1 out of memory)."""
    runs = []
    for scheduler in (reference_schedule, schedule):
        memory = MemoryModel(graph, cluster)
        timed = None if budget_bytes is None else ScheduleMemory(graph, budget_bytes)
        runs.append((scheduler(*schedule_args(graph, cluster, memory, favorite, timed)), memory, timed))
    ((status, start, finish, order, stuck), before, timed), ((status2, start2, finish2, order2, stuck2), after, timed2) = runs
    assert (status2, stuck2) == (status, stuck)
    pairs = [(start, start2), (finish, finish2), (order, order2), (before.device, after.device),
             (before.reserved_bytes, after.reserved_bytes)]
    if timed is not None:
        pairs += [(timed.device, timed2.device), (timed.peak, timed2.peak), (timed.live, timed2.live)]
    for old, new in pairs:
        np.testing.assert_array_equal(new, old)
    return int(status)


def random_graph(rng, n_ops: int, kinds: list[str], *, ties: bool, groups: bool):
    """A random DAG (inputs from the 30 ops before, some producers joined twice), per-kind compute
    times, some zero-byte and fixed-time edges; with ``ties`` every time is a multiple of 10 us."""
    b = GraphBuilder(kinds)
    for i in range(n_ops):
        base = float(rng.integers(1, 6) * 10) if ties else float(rng.uniform(1.0, 100.0))
        group = f"g{rng.integers(0, max(1, n_ops // 10))}" if groups and rng.random() < 0.25 else None
        b.add_op(f"o{i}", compute_us={k: base * (1 + j) for j, k in enumerate(kinds)},
                 persistent_bytes=float(rng.integers(0, 4) * 1000), output_bytes=float(rng.integers(1, 5) * 500),
                 temp_bytes=float(rng.integers(0, 3) * 700), colocation=group)
    for i in range(1, n_ops):
        for u in rng.integers(max(0, i - 30), i, rng.integers(0, 4)).tolist():
            kind = rng.integers(0, 8)
            nbytes = 0.0 if kind == 0 else float(rng.integers(1, 4) * 1000 if ties else rng.uniform(1.0, 5000.0))
            b.add_edge(f"o{u}", f"o{i}", bytes=nbytes, fixed_us=40.0 if kind == 1 else None)
    return b.build()


def random_cluster(rng, kinds: list[str], comm_model: str, memory_bytes: float, *, ties: bool) -> Cluster:
    n_dev = int(rng.integers(2, 6))
    if ties:
        latency, bandwidth = np.full((n_dev, n_dev), 20.0), np.full((n_dev, n_dev), 100.0)
    else:
        latency, bandwidth = rng.uniform(0.0, 30.0, (n_dev, n_dev)), rng.uniform(50.0, 500.0, (n_dev, n_dev))
    devices = [Device(f"d{i}", kinds[i % len(kinds)], memory_bytes * (1 + 0.25 * (i % 2))) for i in range(n_dev)]
    return Cluster(name="random", devices=devices, comm_model=comm_model, latency_us=latency,
                   bandwidth_bytes_per_us=bandwidth, op_gap_us=float(rng.choice([0.0, 2.5])))


@pytest.mark.parametrize("comm_model", COMM_MODELS)
@pytest.mark.parametrize("ties", [False, True])
def test_same_schedule_as_the_full_scan_on_random_graphs(comm_model, ties):
    """Ample and tight memory, with and without favorite children: tight memory must make some
    runs skip devices and some run out (both paths compared), ample must place every op."""
    rng = np.random.default_rng(7 + COMM_MODELS.index(comm_model) + 100 * ties)
    statuses = {"ample": set(), "tight": set()}
    for case in range(12):
        kinds = ["gpu", "cpu"][: 1 + case % 2]
        graph = random_graph(rng, int(rng.integers(40, 250)), kinds, ties=ties, groups=case % 3 != 0)
        need = float((graph.persistent_bytes + graph.output_bytes).sum())
        favorite = round_favorites(graph.edge_src, graph.edge_dst, rng.uniform(0.0, 0.3, graph.n_edges), graph.n_ops)
        for memory, fraction in (("ample", 100.0), ("tight", rng.uniform(0.35, 0.8))):
            cluster = random_cluster(rng, kinds, comm_model, need * fraction, ties=ties)
            for chosen in (None, favorite):
                statuses[memory].add(assert_same_schedule(graph, cluster, chosen))
    assert statuses["ample"] == {0}
    assert statuses["tight"] == {0, 1}


@pytest.mark.parametrize("comm_model", COMM_MODELS)
def test_same_schedule_as_the_full_scan_when_memory_follows_the_schedule(comm_model):
    """Memory freed as the schedule goes (``ScheduleMemory``): a pair refused for lack of memory
    must compete again once the next op is booked, as in the scan. Budgets from roomy to too small,
    with and without favorite children, so runs refuse pairs, place them later and run out."""
    rng = np.random.default_rng(41 + COMM_MODELS.index(comm_model))
    statuses = set()
    for case in range(10):
        kinds = ["gpu", "cpu"][: 1 + case % 2]
        graph = random_graph(rng, int(rng.integers(40, 200)), kinds, ties=case % 2 == 0, groups=case % 3 != 0)
        need = float((graph.persistent_bytes + graph.output_bytes).sum())
        favorite = round_favorites(graph.edge_src, graph.edge_dst, rng.uniform(0.0, 0.3, graph.n_edges), graph.n_ops)
        cluster = random_cluster(rng, kinds, comm_model, need, ties=case % 2 == 0)
        for fraction in (0.05, 0.1, 0.2, 0.4):
            budget = cluster.memory_bytes * fraction
            for chosen in (None, favorite):
                statuses.add(assert_same_schedule(graph, cluster, chosen, budget))
    assert statuses == {0, 1}


def lp_favorites(graph, cluster):
    """m-SCT's favorite children for ``graph`` on ``cluster`` (its LP, rounded as m-SCT does)."""
    from devplace.placers._listsched import op_times_us
    from devplace.placers._lp import solve_favorite_lp
    from devplace.placers.m_sct import lp_edge_us

    x = solve_favorite_lp(graph, op_times_us(graph, cluster).mean(axis=1), lp_edge_us(graph, cluster))[0]
    return round_favorites(graph.edge_src, graph.edge_dst, x, graph.n_ops)


@pytest.mark.parametrize("name", ["bert_l-3_inference", "bert_l-3_training", "gnmt_layers_training",
                                  "resnet50_inference"])
def test_same_schedule_as_the_full_scan_on_the_bundled_graphs(name):
    """With the graph's own cluster (the inference ones have tight 600 MiB devices), with ample
    memory and with 4 uniform devices of the baechi preset's link, m-ETF and m-SCT."""
    from devplace.io.dnn_partitioning import cluster_for

    graph = dp.load_graph(dp.example_path(f"{name}.json"))
    own = cluster_for(graph)
    for cluster in (own, own.with_memory_fraction(100.0), load_cluster("baechi-4x2080").with_memory_fraction(1000.0)):
        for favorite in (None, lp_favorites(graph, cluster)):
            assert_same_schedule(graph, cluster, favorite)


def test_same_schedule_as_the_full_scan_on_a_large_layered_dag():
    """The benchmark's kind of graph (about sqrt(n) ops a layer), with m-SCT's LP favorites: the
    ready set holds hundreds of ops and most winners' estimates go stale at least once."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from placement_time import random_layered_dag

    graph = random_layered_dag(4000, seed=5)
    cluster = load_cluster("baechi-4x2080").with_memory_fraction(1000.0)
    for favorite in (None, lp_favorites(graph, cluster)):
        assert assert_same_schedule(graph, cluster, favorite) == 0


@pytest.mark.parametrize("comm_model", COMM_MODELS)
def test_same_schedule_as_the_full_scan_when_ops_have_hundreds_of_inputs(comm_model):
    """Fans: a source feeding 300 ops that all feed one sink, some by two or three edges of other
    sizes or a fixed time (the transfer must be booked once, at the first edge, for the longest),
    then a second fan reading the sink; the producer search in ``_inputs_ready`` is linear now."""
    rng = np.random.default_rng(COMM_MODELS.index(comm_model))
    b = GraphBuilder(["gpu"])
    b.add_op("src", compute_us=5.0, output_bytes=2000.0)
    b.add_op("sink", compute_us=5.0, output_bytes=2000.0)
    for i in range(300):
        b.add_op(f"a{i}", compute_us=float(rng.integers(1, 8) * 10), output_bytes=1000.0)
        b.add_op(f"b{i}", compute_us=float(rng.uniform(5.0, 50.0)))
        b.add_edge("src", f"a{i}", bytes=2000.0)
        b.add_edge("sink", f"b{i}", bytes=float(rng.choice([0.0, 2000.0])))
    for i in rng.permutation(300).tolist() + rng.integers(0, 300, 200).tolist():
        kind = rng.integers(0, 4)
        b.add_edge(f"a{i}", "sink", bytes=float(rng.integers(0, 4) * 1000), fixed_us=float(rng.choice([0.0, 90.0])) if kind == 0 else None)
    graph = b.build()
    for n_dev in (3, 8):
        cluster = uniform_cluster(n_dev, latency_us=20.0, bandwidth_bytes_per_us=50.0, comm_model=comm_model)
        favorite = round_favorites(graph.edge_src, graph.edge_dst, rng.uniform(0.0, 0.3, graph.n_edges), graph.n_ops)
        for chosen in (None, favorite):
            assert assert_same_schedule(graph, cluster, chosen) == 0
