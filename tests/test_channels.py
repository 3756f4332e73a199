"""The link cost model (devplace/sim/channels.py) and everyone who uses it.

Every caller that costs a transfer (the simulator's engine, the list scheduler behind m-ETF and
m-SCT, HEFT, sim-search's moves) must give the same transfer times and channel holds as the one
definition: random edges x every communication model x every caller, compared exactly.

Some random ops are joined by two edges: the tensor is still sent once, for the longest of them."""

import math

import numpy as np
import pytest

from devplace.cluster import COMM_MODELS, Cluster, Device, uniform_cluster
from devplace.graph import GraphBuilder
from devplace.placers import _listsched, _moves
from devplace.placers._memory import MemoryModel
from devplace.placers.heft import _Links
from devplace.sim import Simulator, channels
from devplace.sim.channels import COMM_MODEL_CODES, book, channel_state, planning_model, transfer_us

NAN = float("nan")


# ------------------------------------------------------------------ the definitions themselves
def test_transfer_time_is_the_fixed_time_else_latency_plus_bytes_over_bandwidth():
    assert transfer_us(1000.0, NAN, 5.0, 100.0) == (15.0, 5.0)  # the latency is the pipelined delay
    assert transfer_us(1000.0, 7.0, 5.0, 100.0) == (7.0, 0.0)   # a fixed time replaces the link, holds whole
    assert transfer_us(0.0, 7.0, 5.0, 100.0) == (7.0, 0.0)
    assert transfer_us(0.0, NAN, 5.0, 100.0) == (0.0, 0.0)      # a pure ordering edge is free
    assert transfer_us(1000.0, 0.0, 5.0, 100.0) == (0.0, 0.0)


def test_a_zero_length_transfer_neither_waits_nor_holds():
    for code in COMM_MODEL_CODES.values():
        state = channel_state(3)
        state[:] = 50.0
        assert book(code, state, 0, 1, 3.0, 0.0, 0.0) == 3.0 and (state == 50.0).all()


def test_pipelined_holds_its_pair_for_the_bytes_only():
    state = channel_state(2)
    duration, delay = transfer_us(1000.0, NAN, 5.0, 100.0)
    assert book(channels.PIPELINED, state, 0, 1, 0.0, duration, delay) == 0.0
    assert book(channels.PIPELINED, state, 0, 1, 0.0, duration, delay) == 10.0  # not 15: the latency overlaps
    assert book(channels.PARALLEL, channel_state(2), 0, 1, 0.0, duration, delay) == 0.0


# ------------------------------------------------------------------ names and codes
# Five transfers whose begin times tell the four models apart (10 us latency, 1000 bytes at 100
# bytes/us: 20 us each). p and p2 run on device 0 (p2 after p), r on 3, w on 2; p feeds devices 1
# and 2, r and p2 feed device 1, w feeds device 0.
SIGNATURE_BEGINS_US = {  # (p->1, p->2, r->1, w->0, p2->1)
    "parallel": (10, 10, 10, 10, 30),    # only p2 waits: pair 0->1 is p's until 30
    "sequential": (10, 30, 30, 50, 70),  # one channel per device, held at both ends
    "duplex": (10, 30, 30, 10, 50),      # w->0 does not wait: device 0's receive channel is free
    "pipelined": (10, 10, 10, 10, 20),   # p2 waits only for p's bytes: 10 + 10
}


def signature_graph():
    b = GraphBuilder(["gpu"])
    for name, t in (("p", 10.0), ("p2", 1.0), ("r", 10.0), ("w", 10.0)):
        b.add_op(name, compute_us=t)
    for name in ("q1", "q2", "s", "t", "u"):
        b.add_op(name, compute_us=1.0)
    for src, dst in (("p", "q1"), ("p", "q2"), ("r", "s"), ("w", "u"), ("p2", "t")):
        b.add_edge(src, dst, bytes=1000.0)
    return b.build(), np.array([0, 0, 3, 2, 1, 2, 1, 1, 0], dtype=np.int64)


def test_a_models_code_and_name_agree_everywhere():
    assert COMM_MODELS == tuple(COMM_MODEL_CODES)
    assert len(set(COMM_MODEL_CODES.values())) == len(COMM_MODELS)
    assert {name: getattr(channels, name.upper()) for name in COMM_MODELS} == COMM_MODEL_CODES
    graph, devices = signature_graph()
    transfers = [(0, 1), (0, 2), (2, 1), (3, 0), (1, 1)]  # (producer op, destination device)
    for name, expected in SIGNATURE_BEGINS_US.items():
        cluster = uniform_cluster(4, latency_us=10.0, bandwidth_bytes_per_us=100.0, comm_model=name)
        assert cluster.comm_model_code == COMM_MODEL_CODES[name]
        r = Simulator(graph, cluster).run(devices)
        begins = {(int(op), int(dst)): float(t) for op, dst, t in zip(r.transfer_op, r.transfer_dst, r.transfer_start_us)}
        assert tuple(begins[x] for x in transfers) == expected, name
        # the same five bookings made directly, in the engine's order (by finish time, then op)
        state = channel_state(4)
        direct = {}
        for op, src, dst, ready in ((0, 0, 1, 10.0), (0, 0, 2, 10.0), (2, 3, 1, 10.0), (3, 2, 0, 10.0), (1, 0, 1, 11.0)):
            direct[(op, dst)] = book(cluster.comm_model_code, state, src, dst, ready, *transfer_us(1000.0, NAN, 10.0, 100.0))
        assert tuple(direct[x] for x in transfers) == expected, name
    assert planning_model(channels.PIPELINED) == channels.DUPLEX
    assert [planning_model(c) for c in (channels.PARALLEL, channels.SEQUENTIAL, channels.DUPLEX)] == [0, 1, 2]


# ------------------------------------------------------------------ every caller agrees
def random_cluster(rng, n_dev: int, model: str, overheads: bool) -> Cluster:
    latency = rng.uniform(0.0, 30.0, (n_dev, n_dev)).round(2)
    bandwidth = rng.uniform(50.0, 500.0, (n_dev, n_dev)).round(1)
    send = rng.uniform(0.0, 4.0, (n_dev, n_dev)).round(2) if overheads else None
    recv = rng.uniform(0.0, 4.0, (n_dev, n_dev)).round(2) if overheads else None
    return Cluster(name="random", devices=[Device(f"d{i}", "gpu", 1e12) for i in range(n_dev)], comm_model=model,
                   latency_us=latency, bandwidth_bytes_per_us=bandwidth, send_overhead_us=send, recv_overhead_us=recv)


def random_edge(rng) -> tuple[float, float | None]:
    """(bytes, fixed_us): mostly bytes over the link, some fixed times (0 included), some ordering edges."""
    kind = rng.integers(0, 6)
    nbytes = 0.0 if kind == 0 else float(rng.integers(1, 5000))
    fixed = float(rng.choice([0.0, 3.5, 40.0])) if kind == 1 else None
    return nbytes, fixed


def fan_in(rng, n_dev: int):
    """Producers on random devices finishing one after another (op order), each sending one tensor
    to a consumer ``c`` on a random device, some by two edges. Producers sharing a device are
    chained there by a free edge, so every caller runs them in the same order and books their
    transfers in op order."""
    k = int(rng.integers(2, 9))
    where = rng.integers(0, n_dev, k + 1)
    finish_at = np.cumsum(rng.uniform(1.0, 20.0, k)).round(2)
    b = GraphBuilder(["gpu"])
    last_on = {}
    for i in range(k):
        d = int(where[i])
        b.add_op(f"p{i}", compute_us=float(finish_at[i] - finish_at[last_on[d]]) if d in last_on else float(finish_at[i]))
        if d in last_on:
            b.add_edge(f"p{last_on[d]}", f"p{i}", bytes=0.0)
        last_on[d] = i
    b.add_op("c", compute_us=1.0)
    for i in range(k):
        for _ in range(1 + (rng.random() < 0.3)):
            nbytes, fixed = random_edge(rng)
            b.add_edge(f"p{i}", "c", bytes=nbytes, fixed_us=fixed)
    return b.build(), where.astype(np.int64), k


def longest_transfer(graph, edges, latency_us, bandwidth_bytes_per_us) -> tuple[float, float]:
    """(duration, delay) of the one transfer that carries a tensor for all of ``edges``."""
    options = [transfer_us(graph.edge_bytes[e], graph.edge_fixed_us[e], latency_us, bandwidth_bytes_per_us)
               for e in edges]
    return max(options, key=lambda option: option[0])  # the first of equals


def inputs_by_producer(graph, v) -> dict[int, list[int]]:
    """v's in-edges grouped by producer, in the order of their first edge."""
    out: dict[int, list[int]] = {}
    for e in graph.in_edges(v).tolist():
        out.setdefault(int(graph.edge_src[e]), []).append(e)
    return out


def expected_fan_in(graph, cluster, code, latency_us, devices, finish):
    """Per producer (begin, end) of its transfer to ``c``, booked directly in op order."""
    state = channel_state(cluster.n_devices)
    c = graph.n_ops - 1
    dst = devices[c]
    out = []
    for i, edges in inputs_by_producer(graph, c).items():
        src = devices[i]
        if src == dst:
            out.append((finish[i], finish[i]))
            continue
        duration, delay = longest_transfer(graph, edges, latency_us[src, dst], cluster.bandwidth_bytes_per_us[src, dst])
        begin = book(code, state, src, dst, finish[i], duration, delay)
        out.append((begin, begin + duration))
    return out


def list_schedule_pinned(graph, cluster, devices):
    """The list scheduler's compiled core with every op pinned to ``devices``: (start, finish)."""
    memory = MemoryModel(graph, cluster)
    memory.device[:] = devices
    status, start, finish, _, _ = _listsched.schedule(*_listsched.schedule_args(graph, cluster, memory, None))
    assert status == 0
    return start, finish


@pytest.mark.parametrize("model", COMM_MODELS)
@pytest.mark.parametrize("overheads", [False, True])
def test_every_caller_gives_the_same_transfer_times_and_channel_holds(model, overheads):
    """Engine, list scheduler, HEFT and moves against direct bookings, on 40 random fan-ins.

    With message overheads the placers plan with latency + overheads (``message_latency_us``) and
    the engine charges them to the devices instead, so the engine is compared without them.
    Placers plan ``pipelined`` as ``duplex``: their expectation is booked with that code."""
    rng = np.random.default_rng(COMM_MODEL_CODES[model] * 100 + overheads)
    for case in range(40):
        n_dev = int(rng.integers(2, 5))
        graph, devices, k = fan_in(rng, n_dev)
        cluster = random_cluster(rng, n_dev, model, overheads)
        c = graph.n_ops - 1
        plan_code = planning_model(cluster.comm_model_code)
        message = cluster.message_latency_us

        # moves: every edge's idle-link time is the one definition with the message latency
        moves = _moves.edge_transfer_us(graph, cluster, devices)
        for e in range(graph.n_edges):
            s, d = devices[graph.edge_src[e]], devices[graph.edge_dst[e]]
            assert moves[e] == (0.0 if s == d else transfer_us(graph.edge_bytes[e], graph.edge_fixed_us[e],
                                                                 message[s, d], cluster.bandwidth_bytes_per_us[s, d])[0])

        # engine (without overheads: it pays them on the devices, not on the link)
        if not overheads:
            r = Simulator(graph, cluster).run(devices)
            finish = r.finish_us
            expected = expected_fan_in(graph, cluster, cluster.comm_model_code, cluster.latency_us, devices, finish)
            sent = {int(op): (b, e) for op, b, e in zip(r.transfer_op, r.transfer_start_us, r.transfer_end_us)}
            for i in range(k):
                got = sent.get(i, (finish[i], finish[i]))  # nothing sent: the input is there when made
                assert got == expected[i], (model, case, i)
            assert r.ready_us[c] == max(end for _, end in expected)

        # the list scheduler and HEFT plan with message latency and the planning model
        start, finish = list_schedule_pinned(graph, cluster, devices)
        planned = expected_fan_in(graph, cluster, plan_code, message, devices, finish)
        ready = max(end for _, end in planned)
        device_free = max([finish[i] for i in range(k) if devices[i] == devices[c]], default=0.0)
        assert start[c] == max(ready, device_free), (model, case)

        links = _Links(graph, cluster, contention=True)
        heft_ready, (booked, _) = links.arrivals(c, int(devices[c]), devices, finish)
        assert heft_ready == ready
        assert dict(booked) == {i: planned[i][1] for i in range(k)
                                if devices[i] != devices[c] and planned[i][1] > planned[i][0]}

        if not overheads and model != "pipelined":  # engine and planners book the same way
            assert (start == r.start_us).all() and (finish == r.finish_us).all()


def test_callers_agree_when_a_producers_later_consumer_needs_its_bytes():
    """A tensor first needed by a zero-byte edge is not there yet for a consumer that reads bytes:
    the simulator sends it, and so the list scheduler and HEFT must book it (HEFT took it as free).
    (The simulator also makes the zero-byte consumer wait for it, as a tensor arrives once per
    device; placers book a transfer when its consumer is placed, so they cannot.)"""
    b = GraphBuilder(["gpu"])
    for name, t in (("a", 10.0), ("order", 1.0), ("reader", 1.0)):
        b.add_op(name, compute_us=t)
    b.add_edge("a", "order", bytes=0.0)
    b.add_edge("a", "reader", bytes=1000.0)
    graph = b.build()
    cluster = uniform_cluster(2, latency_us=5.0, bandwidth_bytes_per_us=100.0, comm_model="duplex")
    devices = np.array([0, 1, 1], dtype=np.int64)
    r = Simulator(graph, cluster).run(devices)
    assert r.start_us[2] == 10.0 + 15.0 + 1.0  # after the transfer and after "order" (25-26)
    links = _Links(graph, cluster, contention=True)
    for v in (1, 2):
        ready, plan = links.arrivals(v, 1, devices, r.finish_us)
        links.commit(1, plan)
    assert ready == 25.0
    start, _ = list_schedule_pinned(graph, cluster, devices)
    assert start[1] == 10.0 and start[2] == ready


def test_moves_use_the_definition_for_every_edge_of_a_real_graph():
    import devplace as dp

    graph = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    cluster = dp.load_cluster("baechi-4x2080")
    devices = np.random.default_rng(0).integers(0, 4, graph.n_ops).astype(np.int64)
    got = _moves.edge_transfer_us(graph, cluster, devices)
    s, d = devices[graph.edge_src], devices[graph.edge_dst]
    for e in range(graph.n_edges):
        want = 0.0 if s[e] == d[e] else transfer_us(graph.edge_bytes[e], graph.edge_fixed_us[e],
                                                       cluster.message_latency_us[s[e], d[e]],
                                                       cluster.bandwidth_bytes_per_us[s[e], d[e]])[0]
        assert got[e] == want and not math.isnan(got[e])


def book_inputs(graph, cluster, v, k, device, finish, state, arrived) -> float:
    """A planner's booking of ``v``'s inputs onto device ``k``, written out directly: on ``state``,
    remembering in ``arrived`` where each sent tensor is; returns when the last input is there."""
    code, ready = planning_model(cluster.comm_model_code), 0.0
    for u, edges in inputs_by_producer(graph, v).items():
        src = int(device[u])
        if src == k:
            t = finish[u]
        elif (u, k) in arrived:
            t = arrived[(u, k)]
        else:
            duration, delay = longest_transfer(graph, edges, cluster.message_latency_us[src, k],
                                               cluster.bandwidth_bytes_per_us[src, k])
            t = book(code, state, src, k, finish[u], duration, delay) + duration
            if duration > 0.0:
                arrived[(u, k)] = t
        ready = max(ready, t)
    return ready


@pytest.mark.parametrize("model", COMM_MODELS)
def test_planners_plan_and_commit_the_same_holds(model):
    """The list scheduler and HEFT place ops one after another: for each op, a what-if on every
    device, then a commit on one. Both must predict the same arrival as booking directly, and leave
    the same channel state as direct bookings after every commit (ops finish in index order, so both
    book an op's inputs in the same order)."""
    rng = np.random.default_rng(7 + COMM_MODEL_CODES[model])
    for case in range(15):
        n_dev, n = int(rng.integers(2, 5)), int(rng.integers(6, 30))
        b = GraphBuilder(["gpu"])
        for i in range(n):
            b.add_op(f"o{i}", compute_us=1.0)
        for v in range(1, n):
            for u in sorted(rng.integers(0, v, rng.integers(1, 4)).tolist()):  # some twice
                nbytes, fixed = random_edge(rng)
                b.add_edge(f"o{u}", f"o{v}", bytes=nbytes, fixed_us=fixed)
        graph = b.build()
        cluster = random_cluster(rng, n_dev, model, overheads=True)
        finish = np.cumsum(rng.uniform(0.5, 10.0, n))
        device = np.full(n, -1, np.int64)
        device[0] = 0
        free_us, scratch = channel_state(n_dev), channel_state(n_dev)
        arrival = np.full(n * n_dev, -1.0)

        def listed(v, k, commit):  # the list scheduler's what-if (commit False) or booking
            return _listsched._inputs_ready(
                v, k, commit, device, finish, arrival, graph.pred_ptr, graph.pred_edge, graph.edge_src,
                graph.edge_bytes, graph.edge_fixed_us, cluster.message_latency_us, cluster.bandwidth_bytes_per_us,
                planning_model(cluster.comm_model_code), free_us, scratch)

        links = _Links(graph, cluster, contention=True)
        state, arrived = channel_state(n_dev), {}
        for v in range(1, n):
            plans, predicted = {}, {}
            for k in range(n_dev):
                ready = book_inputs(graph, cluster, v, k, device, finish, state.copy(), dict(arrived))
                heft_ready, plans[k] = links.arrivals(v, k, device, finish)
                assert listed(v, k, False) == heft_ready == ready, (model, case, v, k)
                predicted[k] = ready
            k = int(rng.integers(0, n_dev))
            committed = listed(v, k, True)
            links.commit(k, plans[k])
            book_inputs(graph, cluster, v, k, device, finish, state, arrived)
            device[v] = k
            assert committed == predicted[k]
            assert (free_us == state).all() and (links.free_us == state).all(), (model, case, v)
            listed_arrivals = {(int(i) // n_dev, int(i) % n_dev): arrival[i] for i in np.flatnonzero(arrival >= 0.0)}
            assert listed_arrivals == links.arrived == arrived
