"""The simulator: hand-worked examples of each rule in devplace/sim/engine.py, then invariants
checked on random DAGs."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devplace.cluster import Cluster, Device, load_cluster, uniform_cluster
from devplace.errors import GraphError, PlacementError
from devplace.graph import GraphBuilder, OpGraph, chain_graph
from devplace.placement import Placement
from devplace.sim import Simulator, simulate


def graph_of(ops: dict, edges: list) -> OpGraph:
    """ops: name -> dict(t=..., out=..., tmp=..., per=...); edges: (src, dst, bytes[, fixed_us])."""
    b = GraphBuilder(["gpu"])
    for name, o in ops.items():
        b.add_op(name, compute_us=o.get("t", 0.0), output_bytes=o.get("out", 0),
                 temp_bytes=o.get("tmp", 0), persistent_bytes=o.get("per", 0))
    for src, dst, nbytes, *fixed in edges:
        b.add_edge(src, dst, bytes=nbytes, fixed_us=fixed[0] if fixed else None)
    return b.build()


def place(g: OpGraph, **where) -> np.ndarray:
    return np.array([where[name] for name in g.names], dtype=np.int64)


def starts(result) -> dict:
    return {name: float(result.start_us[i]) for i, name in enumerate(result.graph.names)}


# ------------------------------------------------------------ communication models
# Every transfer below is 5 us latency + 1000 bytes / 100 bytes per us = 15 us.
# The two 10 us producers finish at 10; their transfers either overlap (consumers start at 25)
# or one waits for the other (a consumer starts at 40).
CONTENTION = {
    # name: (producers' devices, consumers' devices, {model: step time})
    "one sender, one receiver each": ((0, 2), (1, 0), {"parallel": 26, "duplex": 26, "sequential": 41, "pipelined": 26}),
    "one sender, two receivers": ((0, 0), (1, 2), {"parallel": 26, "duplex": 41, "sequential": 41, "pipelined": 26}),
    # (parallel: both arrive at 25, then the two consumers share device 0: 25-26, 26-27)
    "two senders, one receiver": ((1, 2), (0, 0), {"parallel": 27, "duplex": 41, "sequential": 41, "pipelined": 27}),
    "disjoint pairs": ((0, 2), (1, 3), {"parallel": 26, "duplex": 26, "sequential": 26, "pipelined": 26}),
}


@pytest.mark.parametrize("model", ["parallel", "sequential", "duplex", "pipelined"])
@pytest.mark.parametrize("case", sorted(CONTENTION))
def test_two_transfers_contend_for_a_channel(model, case):
    (px, py), (cx, cy), expected = CONTENTION[case]
    if px == py:  # one producer op whose output goes to two devices
        g = graph_of({"x": {"t": 10}, "x1": {"t": 1}, "y1": {"t": 1}},
                     [("x", "x1", 1000), ("x", "y1", 1000)])
        devices = place(g, x=px, x1=cx, y1=cy)
    else:
        g = graph_of({"x": {"t": 10}, "y": {"t": 10}, "x1": {"t": 1}, "y1": {"t": 1}},
                     [("x", "x1", 1000), ("y", "y1", 1000)])
        devices = place(g, x=px, y=py, x1=cx, y1=cy)
    c = uniform_cluster(4, latency_us=5, bandwidth_bytes_per_us=100, comm_model=model)
    r = simulate(g, c, devices)
    assert r.step_time_us == expected[model]
    assert len(r.transfer_op) == 2
    # transfers queue first come first served: the earlier producer (lower index at a tie) goes first
    assert sorted(r.transfer_start_us.tolist()) == ([10, 25] if expected[model] == 41 else [10, 10])
    # the critical path: a producer, its transfer (after waiting 15 us for the channel when queued), one or two
    # 1 us consumers (two when they share device 0 after arriving together)
    split = r.critical_path_split_us
    assert split == {"compute": 12 if expected[model] == 27 else 11, "transfer": 15,
                     "channel_wait": 15 if expected[model] == 41 else 0, "other": 0}
    assert "0.015 ms transfers" in r.critical_path_sentence()


def test_same_pair_transfers_queue_in_every_model():
    g = graph_of({"a": {"t": 10}, "b": {"t": 10}, "a1": {"t": 1}, "b1": {"t": 1}},
                 [("a", "a1", 1000), ("b", "b1", 1000)])
    for model in ("parallel", "sequential", "duplex"):
        c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100, comm_model=model)
        r = simulate(g, c, place(g, a=0, b=0, a1=1, b1=1))
        # a's transfer 10-25; b finishes at 20 but its transfer waits for the channel: 25-40
        assert starts(r) == {"a": 0, "b": 10, "a1": 25, "b1": 40}, model


def test_pipelined_transfers_overlap_their_latency_only():
    # 5 us latency + 1000 B / 100 B/us: a's message holds the pair's channel 10-20 and arrives at 25;
    # b's (ready at 20) holds it 20-30 and arrives at 35, not 40: its latency overlaps a's
    g = graph_of({"a": {"t": 10}, "b": {"t": 10}, "a1": {"t": 1}, "b1": {"t": 1}},
                 [("a", "a1", 1000), ("b", "b1", 1000)])
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100, comm_model="pipelined")
    r = simulate(g, c, place(g, a=0, b=0, a1=1, b1=1))
    assert starts(r) == {"a": 0, "b": 10, "a1": 25, "b1": 35}
    assert sorted(zip(r.transfer_start_us.tolist(), r.transfer_end_us.tolist())) == [(10, 25), (20, 35)]
    # many small messages at once: latency paid once, bandwidth share by each
    many = {f"p{k}": {"t": 0} for k in range(5)} | {f"q{k}": {"t": 0} for k in range(5)}
    g = graph_of(many, [(f"p{k}", f"q{k}", 100) for k in range(5)])
    devices = place(g, **{f"p{k}": 0 for k in range(5)}, **{f"q{k}": 1 for k in range(5)})
    assert simulate(g, c, devices).step_time_us == 5 + 5 * 1.0
    c_duplex = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100, comm_model="duplex")
    assert simulate(g, c_duplex, devices).step_time_us == 5 * (5 + 1.0)


def test_tensor_is_sent_once_per_destination_and_cached():
    g = graph_of({"a": {"t": 10, "out": 2000}, "b": {"t": 1}, "c": {"t": 1}, "d": {"t": 1}},
                 [("a", "b", 1000), ("a", "c", 2000), ("a", "d", 500)])
    c = uniform_cluster(3, latency_us=5, bandwidth_bytes_per_us=100)
    r = simulate(g, c, place(g, a=0, b=1, c=1, d=2))
    assert len(r.transfer_op) == 2  # one to device 1 (for b and c), one to device 2
    by_dst = {int(d): i for i, d in enumerate(r.transfer_dst)}
    # to device 1: the largest edge sets the time (5 + 2000/100) and the bytes moved
    assert r.transfer_end_us[by_dst[1]] - r.transfer_start_us[by_dst[1]] == 25
    assert r.transfer_bytes[by_dst[1]] == 2000
    assert r.transfer_end_us[by_dst[2]] == 10 + 5 + 5
    s = starts(r)
    assert s["b"] == 35 and s["c"] == 36 and s["d"] == 20
    assert r.link_bytes.tolist() == [[0, 2000, 500], [0, 0, 0], [0, 0, 0]]
    assert r.bytes_moved == 2500


def test_zero_byte_edges_are_free_and_fixed_us_edges_cost_their_time():
    g = graph_of({"a": {"t": 10}, "b": {"t": 1}, "c": {"t": 1}},
                 [("a", "b", 0), ("a", "c", 10**9, 7.0)])
    c = uniform_cluster(3, latency_us=100, bandwidth_bytes_per_us=1)
    r = simulate(g, c, place(g, a=0, b=1, c=2))
    s = starts(r)
    assert s["b"] == 10  # pure ordering edge: no latency, no transfer
    assert s["c"] == 17  # the fixed time replaces latency + 1e9 bytes / 1 byte per us
    assert r.transfer_dst.tolist() == [2] and r.transfer_bytes.tolist() == [10**9]
    # a fixed time of 0 is also free
    g0 = graph_of({"a": {"t": 10}, "b": {"t": 1}}, [("a", "b", 500, 0.0)])
    r0 = simulate(g0, c, [0, 1])
    assert r0.start_us[1] == 10 and len(r0.transfer_op) == 0


def test_op_gap_follows_every_op_and_delays_sends():
    g = graph_of({"a": {"t": 10}, "b": {"t": 10}}, [("a", "b", 1000)])
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100, op_gap_us=2)
    r = simulate(g, c, [0, 1])
    # a runs 0-10, gap to 12, transfer 12-27, b runs 27-37, gap to 39
    assert starts(r) == {"a": 0, "b": 27}
    assert r.step_time_us == 39
    assert r.busy_us.tolist() == [12, 12]
    preset = load_cluster("placeto-k80")
    chain = chain_graph([1.0, 2.0, 3.0])
    assert simulate(chain, preset, [0, 0, 0]).step_time_us == pytest.approx(6 + 3 * 5.7)


def test_message_overheads_are_device_time_paid_before_the_next_op():
    # a (device 0) feeds b on device 1 and c on device 0; the transfer is 5 + 1000 / 100 = 15 us
    g = graph_of({"a": {"t": 10}, "b": {"t": 10}, "c": {"t": 10}, "long": {"t": 40}},
                 [("a", "b", 1000), ("a", "c", 1000)])
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100, comm_model="duplex",
                        send_overhead_us=4, recv_overhead_us=6)
    # receiver idle: the transfer runs 10-25 while device 0 pays its 4 us (c starts at 14);
    # device 1 pays 6 us on arrival, so b starts at 31
    idle = simulate(g, c, place(g, a=0, b=1, c=0, long=0))
    assert starts(idle) == {"a": 0, "b": 31, "c": 14, "long": 24}
    # receiver busy with `long` (0-40) when the message arrives at 25: it pays after, b starts at 46
    busy = simulate(g, c, place(g, a=0, b=1, c=0, long=1))
    assert starts(busy) == {"a": 0, "b": 46, "c": 14, "long": 0}
    assert busy.step_time_us == 56 and busy.message_overhead_us.tolist() == [4, 6]
    assert busy.to_dict()["message_overhead_us"] == [4, 6]
    # without overheads the same placement is the plain schedule
    plain = simulate(g, uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100, comm_model="duplex"),
                     place(g, a=0, b=1, c=0, long=1))
    assert starts(plain) == {"a": 0, "b": 40, "c": 10, "long": 0}


@pytest.mark.parametrize("long_us,expected", [(50, {"q1": 56, "q2": 57}), (30, {"q1": 36, "q2": 37})])
def test_receive_overheads_coalesce_into_one_wake_up(long_us, expected):
    # p1, p2 (10 us each, device 0) feed q1, q2 (1 us, device 1); pipelined link: transfers hold it
    # 10 us of their 15, so they arrive at 25 and 35. Receive overhead 6 us.
    g = graph_of({"p1": {"t": 10}, "p2": {"t": 10}, "q1": {"t": 1}, "q2": {"t": 1}, "long": {"t": long_us}},
                 [("p1", "q1", 1000), ("p2", "q2", 1000)])
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=100, comm_model="pipelined", recv_overhead_us=6)
    r = simulate(g, c, place(g, p1=0, p2=0, q1=1, q2=1, long=1))
    assert r.transfer_end_us.tolist() == [25, 35]
    # long = 50: both arrive while it runs, one wake-up pays for both (50-56);
    # long = 30: the first is paid 30-36 and the second, arriving at 35, rides along
    assert {k: v for k, v in starts(r).items() if k in expected} == expected


def test_priorities_choose_among_ready_ops():
    g = graph_of({"a": {"t": 10}, "b": {"t": 20}, "c": {"t": 1}}, [("b", "c", 0)])
    c = uniform_cluster(1)
    default = simulate(g, c, [0, 0, 0])
    assert starts(default) == {"a": 0, "b": 10, "c": 30}  # topological order, lowest index first
    first_b = simulate(g, c, Placement(devices=[0, 0, 0], priority=[1.0, 0.0, 2.0]))
    assert starts(first_b) == {"a": 20, "b": 0, "c": 30}
    # a priority only picks among ready ops: c cannot jump ahead of its input
    c_first = simulate(g, c, Placement(devices=[0, 0, 0], priority=[5.0, 9.0, 0.0]))
    assert starts(c_first) == {"a": 0, "b": 10, "c": 30}
    # ties go to the lower op index
    tie = simulate(g, c, Placement(devices=[0, 0, 0], priority=[3.0, 3.0, 3.0]))
    assert starts(tie) == starts(default)
    sim = Simulator(g, c)
    assert sim.step_time_us(np.zeros(3, dtype=np.int64), np.array([1.0, 0.0, 2.0])) == 31


# ------------------------------------------------------------ memory accounting
def memory_example():
    # a (device 0): persistent 100, output 10, temp 5, 10 us; b (device 0) reads a, output 20;
    # c (device 1) reads a over a 5 + 10/1 = 15 us link.
    g = graph_of({"a": {"t": 10, "per": 100, "out": 10, "tmp": 5}, "b": {"t": 10, "out": 20},
                  "c": {"t": 10}}, [("a", "b", 10), ("a", "c", 10)])
    return g, place(g, a=0, b=0, c=1)


def test_memory_timeline_by_hand():
    g, devices = memory_example()
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=1, memory_bytes=1000)
    r = simulate(g, c, devices)
    t0, used0 = r.memory_timeline(0)
    # 0: persistent 100; a starts: +10 output +5 temp; 10: a's temp freed BEFORE b's +20 output;
    # 20: b's output (no consumer) freed when b ends; 25: a's output freed when its transfer ends
    assert list(zip(t0.tolist(), used0.tolist())) == [
        (0, 100), (0, 115), (10, 110), (10, 130), (20, 110), (25, 100)]
    assert r.peak_memory_bytes[0] == 130  # not 135: frees come before allocations at equal times
    t1, used1 = r.memory_timeline(1)
    # the received copy lives from the transfer's start (10) to its last consumer's end (25 + 10)
    assert list(zip(t1.tolist(), used1.tolist())) == [(10, 10), (35, 0)]
    assert r.peak_memory_bytes[1] == 10
    assert r.fits and r.oom_devices == []


def test_output_kept_until_last_local_consumer():
    g = graph_of({"a": {"t": 1, "out": 50}, "b": {"t": 1}, "c": {"t": 100}, "d": {"t": 1}},
                 [("a", "b", 50), ("a", "d", 50), ("c", "d", 0)])
    r = simulate(g, uniform_cluster(1), [0, 0, 0, 0])
    times, used = r.memory_timeline(0)
    # a's 50 bytes stay allocated until d (its last consumer) finishes at 103
    assert used[times < 103].min() == 50 and used[-1] == 0 and times[-1] == 103


def test_an_order_only_edge_orders_its_ends_but_keeps_nothing_allocated():
    # a -> d as an order-only edge (an in-place write after a read): d still waits for a, but a's
    # 50 bytes die with b, its one reader; as a plain zero-byte edge (a view's reader) they live to d
    def run(order_only):
        b = GraphBuilder(["gpu"])
        for name, us, out in (("a", 1, 50), ("b", 1, 0), ("c", 100, 0), ("d", 1, 0)):
            b.add_op(name, compute_us=us, output_bytes=out)
        b.add_edge("a", "b", bytes=50)
        b.add_edge("c", "d")
        b.add_edge("a", "d", order_only=order_only)
        return simulate(b.build(), uniform_cluster(2), [0, 0, 1, 0])

    plain, ordered = run(False), run(True)
    assert ordered.start_us[3] == plain.start_us[3] == 100  # after c on the other device, and after a
    times, used = plain.memory_timeline(0)
    assert used[times < 101].min() == 50 and times[-1] == 101
    times, used = ordered.memory_timeline(0)
    assert list(zip(times.tolist(), used.tolist())) == [(0, 50), (2, 0)]
    # across devices an order-only edge sends nothing and the receiver holds nothing
    b = GraphBuilder(["gpu"])
    b.add_op("a", compute_us=1, output_bytes=50)
    b.add_op("d", compute_us=1)
    b.add_edge("a", "d", order_only=True)
    r = simulate(b.build(), uniform_cluster(2), [0, 1])
    assert r.start_us[1] == 1 and len(r.transfer_op) == 0 and r.peak_memory_bytes.tolist() == [50, 0]


def test_a_received_view_or_weight_takes_the_bytes_sent():
    # a weight (persistent, no output bytes of its own) read through a view (zero time, no bytes of its
    # own) on device 0, by a matmul on device 1: device 1 holds the 400 bytes that arrive until the
    # matmul finishes, as the executor's receive buffer does. Before, a copy was charged the
    # producer's output bytes, 0 here.
    b = GraphBuilder(["gpu"])
    b.add_op("weight", compute_us=0, persistent_bytes=400)
    b.add_op("view", compute_us=0)
    b.add_op("matmul", compute_us=10, output_bytes=8)
    b.add_edge("weight", "view", bytes=400)
    b.add_edge("view", "matmul", bytes=400)
    b.add_edge("weight", "matmul")  # the capture's edge from a storage's owner to a reader of its alias
    g = b.build()
    c = uniform_cluster(2, latency_us=1, bandwidth_bytes_per_us=100)
    r = simulate(g, c, [0, 0, 1])
    assert r.transfer_bytes.tolist() == [400]
    times, used = r.memory_timeline(1)
    assert list(zip(times.tolist(), used.tolist())) == [(0, 400), (5, 408), (15, 400), (15, 0)]
    assert r.peak_memory_bytes.tolist() == [400, 408]
    # the weight itself sent: the same bytes arrive
    assert simulate(g, c, [0, 1, 1]).peak_memory_bytes.tolist() == [400, 408]
    # a graph where no op owns output bytes (dnn-partitioning's: weights only) models no activations,
    # and its copies take nothing, as in its authors' memory model
    weights_only = dataclasses.replace(g, output_bytes=np.zeros(3))
    assert not weights_only.holds_activations and g.holds_activations
    assert simulate(weights_only, c, [0, 0, 1]).peak_memory_bytes.tolist() == [400, 0]


def test_out_of_memory_names_device_and_first_overflow_op():
    g, devices = memory_example()
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=1, memory_bytes=120)
    r = simulate(g, c, devices)
    assert r.oom_devices == [0] and not r.fits
    assert g.names[r.first_overflow_op[0]] == "b"  # 110 + 20 > 120 when b starts
    report = r.overflow_report()
    assert len(report) == 1 and "'gpu0'" in report[0] and "'b'" in report[0]
    assert r.to_dict()["first_overflow_op"] == ["b", None]
    # persistent bytes count from time 0: the op whose weights tip the device over is named
    tight = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=1, memory_bytes=99)
    assert g.names[simulate(g, tight, devices).first_overflow_op[0]] == "a"


def test_critical_path_and_summary():
    g, devices = memory_example()
    c = uniform_cluster(2, latency_us=5, bandwidth_bytes_per_us=1)
    r = simulate(g, c, devices)
    assert r.step_time_us == 35
    assert [g.names[i] for i in r.critical_path] == ["a", "c"]
    # a device that was busy puts its previous op on the path
    g2 = graph_of({"x": {"t": 10}, "y": {"t": 10}, "z": {"t": 1}}, [("x", "z", 0)])
    r2 = simulate(g2, uniform_cluster(1), Placement(devices=[0, 0, 0], priority=[0, 1, 2]))
    assert [g2.names[i] for i in r2.critical_path] == ["x", "y", "z"]
    d = r.to_dict()
    assert d["step_time_us"] == 35 and d["transfers"] == 1 and d["link_bytes"] == [[0, 10], [0, 0]]


# ------------------------------------------------------------ bad input
def test_bad_placements_raise_placement_error():
    g = chain_graph([1.0, 2.0, 3.0])
    c = uniform_cluster(2)
    sim = Simulator(g, c)
    for bad, pattern in (([0, 0], "2 entries but the graph has 3 ops"),
                         ([0, 2, 0], "op 'op1' is placed on device 2.*devices 0-1"),
                         ([0, -1, 0], "op 'op1' is placed on device -1"),
                         ([0.0, 1.0, 0.0], "integer device indices"),
                         ([[0, 1, 0]], "flat sequence")):
        with pytest.raises(PlacementError, match=pattern):
            simulate(g, c, bad)
        with pytest.raises(PlacementError):
            sim.step_time_us(np.asarray(bad))
    with pytest.raises(PlacementError, match="priorities"):
        sim.step_time_us(np.zeros(3, dtype=np.int64), np.zeros(2))
    with pytest.raises(PlacementError, match="3 priorities for 2 ops"):
        Placement(devices=[0, 0], priority=[1, 2, 3])


@pytest.mark.parametrize("priority", [[0.0, np.nan, 1.0], [np.inf, 0.0, 1.0], ["a", "b", "c"]])
def test_step_time_refuses_the_priorities_run_refuses(priority):
    g = chain_graph([1.0, 2.0, 3.0])
    sim = Simulator(g, uniform_cluster(2))
    devices = np.array([0, 1, 0], dtype=np.int64)
    with pytest.raises(PlacementError, match="priorities must be"):
        sim.run(Placement(devices=devices, priority=priority))
    with pytest.raises(PlacementError, match="priorities must be"):
        sim.step_time_us(devices, np.asarray(priority) if priority[0] != "a" else priority)
    assert sim.step_time_us(devices, np.array([2.0, 1.0, 0.0])) == sim.run(devices).step_time_us == 6.0


# ------------------------------------------------------------ the cache of prepared arrays
def test_a_dropped_graph_and_cluster_are_freed_with_their_cache_entry():
    import gc
    import weakref

    from devplace.sim import simulator as simulator_module

    g, c = chain_graph([1.0, 2.0]), uniform_cluster(2)
    result = simulate(g, c, [0, 1])
    sim = Simulator(g, c)
    assert sim.op_time_us is Simulator(g, c).op_time_us  # prepared once per pair
    assert (id(g), id(c)) in simulator_module._cache
    graph_ref, cluster_ref = weakref.ref(g), weakref.ref(c)
    del g, c, result, sim
    gc.collect()
    assert graph_ref() is None and cluster_ref() is None
    assert all(entry[0]() is not None and entry[1]() is not None for entry in simulator_module._cache.values())


def test_the_cache_keeps_at_most_its_bound_and_the_most_recent_pairs():
    from devplace.sim import simulator as simulator_module

    c = uniform_cluster(2)
    graphs = [chain_graph([float(k + 1)] * 3) for k in range(simulator_module.CACHE_PAIRS + 5)]
    for g in graphs:
        assert simulate(g, c, [0, 0, 0]).step_time_us == 3.0 * g.compute_us[0, 0]
    assert len(simulator_module._cache) == simulator_module.CACHE_PAIRS
    assert (id(graphs[-1]), id(c)) in simulator_module._cache and (id(graphs[0]), id(c)) not in simulator_module._cache
    assert simulate(graphs[0], c, [0, 1, 0]).step_time_us == 3.0  # an evicted pair is prepared again


def test_simulating_a_split_colocation_group_warns_and_a_whole_one_does_not():
    import warnings

    from devplace.placement import ColocationWarning

    b = GraphBuilder(["gpu"])
    for name, group in [("a", "g"), ("b", "g"), ("c", "h"), ("d", "h"), ("e", None)]:
        b.add_op(name, compute_us=1.0, colocation=group)
    g, c = b.build(), uniform_cluster(2)
    with pytest.warns(ColocationWarning, match=r"splits colocation group 'h' across devices") as caught:
        assert simulate(g, c, [0, 0, 0, 1, 1]).step_time_us == 3.0
    assert caught[0].filename == __file__  # points at the caller's line
    assert Placement(devices=[1, 0, 0, 1, 0]).colocation_violations(g) == ["g", "h"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        simulate(g, c, [1, 1, 0, 0, 1])


def test_missing_device_kind_raised_when_simulating_on_that_kind():
    g = chain_graph([1.0, 2.0])  # gpu times only
    het = load_cluster("cpu+4gpu")
    with pytest.raises(GraphError, match="no compute times for device kind 'cpu'"):
        simulate(g, het, [1, 1])
    assert simulate(g, uniform_cluster(2), [0, 1]).step_time_us == 3.0


def test_heterogeneous_devices_use_their_kind_column():
    b = GraphBuilder(["gpu", "cpu"])
    b.add_op("a", compute_us={"gpu": 1.0, "cpu": 10.0})
    b.add_op("b", compute_us={"gpu": 2.0, "cpu": 20.0})
    g = b.build()
    c = Cluster("het", [Device("c", "cpu", 1e9), Device("g", "gpu", 1e9)], "parallel",
                np.zeros((2, 2)), np.full((2, 2), 1.0))
    r = simulate(g, c, [0, 1])
    assert r.finish_us.tolist() == [10.0, 2.0] and r.op_time_us.tolist() == [10.0, 2.0]


# ------------------------------------------------------------ invariants on random DAGs
@st.composite
def random_case(draw):
    n = draw(st.integers(1, 25))
    n_dev = draw(st.integers(1, 4))
    times = draw(st.lists(st.floats(0, 100, allow_nan=False), min_size=n, max_size=n))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=3 * n)) if pairs else []
    edge_bytes = draw(st.lists(st.sampled_from([0.0, 1.0, 500.0, 1e5]), min_size=len(chosen), max_size=len(chosen)))
    fixed = draw(st.lists(st.sampled_from([np.nan, np.nan, 0.0, 3.5]), min_size=len(chosen), max_size=len(chosen)))
    out = draw(st.lists(st.sampled_from([0.0, 8.0, 1000.0]), min_size=n, max_size=n))
    devices = draw(st.lists(st.integers(0, n_dev - 1), min_size=n, max_size=n))
    model = draw(st.sampled_from(["parallel", "sequential", "duplex", "pipelined"]))
    gap = draw(st.sampled_from([0.0, 0.0, 1.5]))
    send, recv = draw(st.sampled_from([0.0, 3.0])), draw(st.sampled_from([0.0, 7.5]))
    perm = draw(st.permutations(range(n)))  # op order need not be topological
    priority = draw(st.none() | st.lists(st.integers(0, 5).map(float), min_size=n, max_size=n))
    g = OpGraph(
        names=[f"v{i}" for i in range(n)], kinds=[""] * n, device_kinds=["gpu"],
        compute_us=np.array(times)[perm].reshape(n, 1) if n else np.zeros((0, 1)),
        persistent_bytes=np.ones(n), output_bytes=np.array(out), temp_bytes=np.full(n, 3.0),
        colocation=np.full(n, -1), colocation_names=[], role=np.zeros(n), mirror=np.full(n, -1),
        edge_src=np.array([perm[i] for i, _ in chosen], dtype=np.int64),
        edge_dst=np.array([perm[j] for _, j in chosen], dtype=np.int64),
        edge_bytes=np.array(edge_bytes), edge_fixed_us=np.array(fixed, dtype=float),
    )
    c = uniform_cluster(n_dev, latency_us=2.0, bandwidth_bytes_per_us=50.0, comm_model=model, op_gap_us=gap,
                        send_overhead_us=send, recv_overhead_us=recv)
    return g, c, np.array(devices, dtype=np.int64), None if priority is None else np.array(priority)


def longest_path_us(g: OpGraph, gap: float) -> float:
    finish = np.zeros(g.n_ops)
    for v in g.topo_order:
        preds = g.predecessors(v)
        finish[v] = (finish[preds].max() if len(preds) else 0.0) + g.compute_us[v, 0] + gap
    return float(finish.max())


def reference_peak_memory(g: OpGraph, n_dev: int, devices: np.ndarray, r) -> np.ndarray:
    """Peak bytes per device from the rules in docs/simulator.md, as live intervals [alloc, free)
    over the simulated schedule: independent of the engine's event list and sort."""
    intervals = [[] for _ in range(n_dev)]  # (alloc, free, bytes)
    for u in range(g.n_ops):
        d = devices[u]
        intervals[d].append((0.0, np.inf, g.persistent_bytes[u]))
        intervals[d].append((r.start_us[u], r.finish_us[u], g.temp_bytes[u]))
        free = r.finish_us[u]
        for v in g.successors(u):
            if devices[v] == d:
                free = max(free, r.finish_us[v])
        for x in np.flatnonzero(r.transfer_op == u):
            free = max(free, r.transfer_end_us[x])
            dv = r.transfer_dst[x]
            last = max(r.finish_us[v] for v in g.successors(u) if devices[v] == dv)
            sent = max(g.edge_bytes[e] for e in g.out_edges(u) if devices[g.edge_dst[e]] == dv)
            held = max(g.output_bytes[u], sent) if (g.output_bytes.any() or g.temp_bytes.any()) else g.output_bytes[u]
            intervals[dv].append((r.transfer_start_us[x], last, held))
        intervals[d].append((r.start_us[u], free, g.output_bytes[u]))
    peak = np.zeros(n_dev)
    for d in range(n_dev):
        for t in {a for a, _, _ in intervals[d]}:
            peak[d] = max(peak[d], sum(b for a, f, b in intervals[d] if a <= t < f))
    return peak


def reference_schedule(g: OpGraph, c, devices: np.ndarray, priority) -> np.ndarray:
    """Start times by the rules in docs/simulator.md, written as a plain time-stepped loop."""
    n, n_dev = g.n_ops, c.n_devices
    prio = g.topo_rank.astype(float) if priority is None else priority
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    arrival = {}  # (op, device) -> time the op's output is there
    running = [None] * n_dev
    queued = [set() for _ in range(n_dev)]
    free_at = {}  # channel -> time it is free
    done = set()
    queued_ops = set()
    send_owed = [0.0] * n_dev  # send overheads add up
    recv_owed = [0.0] * n_dev  # receive overheads coalesce into one wake-up (the largest)
    paying = [None] * n_dev  # (until, includes a receive) while a device pays
    receipts = []  # (time, device, overhead) of every transfer, charged when it arrives

    def release(d, now):  # a device stops running or paying: pay what is owed, or go idle
        owed = send_owed[d] + recv_owed[d]
        paying[d] = (now + owed, recv_owed[d] > 0) if owed > 0 else None
        send_owed[d] = recv_owed[d] = 0.0

    def channels(a, b):
        return {"parallel": [("pair", a, b)], "sequential": [("dev", a), ("dev", b)],
                "duplex": [("send", a), ("recv", b)], "pipelined": [("pair", a, b)]}[c.comm_model]

    t = 0.0
    while len(done) < n:
        progress = True
        while progress:
            progress = False
            for u in sorted(v for v in range(n) if finish[v] == t and v not in done):
                done.add(u)
                running[devices[u]] = None
                arrival[u, devices[u]] = t
                for dv in range(n_dev):
                    edges = [e for e in g.out_edges(u) if devices[g.edge_dst[e]] == dv and dv != devices[u]]
                    if not edges:
                        continue
                    times = [g.edge_fixed_us[e] if not np.isnan(g.edge_fixed_us[e]) else
                             (c.latency_us[devices[u], dv] + g.edge_bytes[e] / c.bandwidth_bytes_per_us[devices[u], dv]
                              if g.edge_bytes[e] > 0 else 0.0) for e in edges]
                    duration = max(times)
                    if duration == 0:
                        arrival[u, dv] = t
                        continue
                    # pipelined: the link's latency does not hold the channel (fixed times do)
                    longest = edges[int(np.argmax(times))]
                    hold = duration - (c.latency_us[devices[u], dv] if c.comm_model == "pipelined"
                                       and np.isnan(g.edge_fixed_us[longest]) else 0.0)
                    chans = channels(devices[u], dv)
                    begin = max([t] + [free_at.get(ch, 0.0) for ch in chans])
                    for ch in chans:
                        free_at[ch] = begin + hold
                    arrival[u, dv] = begin + duration
                    send_owed[devices[u]] += c.send_overhead_us[devices[u], dv]
                    receipts.append((begin + duration, dv, c.recv_overhead_us[devices[u], dv]))
                release(devices[u], t)
            for when, dv, overhead in receipts:
                if when != t:
                    continue
                if running[dv] is None and paying[dv] is None:
                    paying[dv] = (t + overhead, True)
                elif running[dv] is not None or not paying[dv][1]:
                    recv_owed[dv] = max(recv_owed[dv], overhead)
            receipts = [x for x in receipts if x[0] != t]
            for d in range(n_dev):
                if paying[d] is not None and paying[d][0] == t:
                    release(d, t)
            for v in range(n):
                if v not in queued_ops and all(arrival.get((p, devices[v]), np.inf) <= t for p in g.predecessors(v)):
                    queued_ops.add(v)
                    queued[devices[v]].add(v)
            for d in range(n_dev):
                if running[d] is None and paying[d] is None and queued[d]:
                    v = min(queued[d], key=lambda o: (prio[o], o))
                    queued[d].discard(v)
                    running[d] = v
                    start[v] = t
                    finish[v] = t + g.compute_us[v, 0] + c.op_gap_us  # one device kind here
                    progress = True
                    break  # a zero-time op may finish now: settle it before the next device
        future = ([f for f in finish if f > t] + [a for a in arrival.values() if a > t]
                  + [p[0] for p in paying if p is not None and p[0] > t] + [x[0] for x in receipts])
        if len(done) < n:
            t = min(future)
    return start


FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(random_case())
def test_invariants_on_random_dags(case):
    g, c, devices, priority = case
    gap = c.op_gap_us
    sim = Simulator(g, c)
    r = sim.run(Placement(devices=devices, priority=priority))
    total = float(g.compute_us.sum()) + g.n_ops * gap
    eps = 1e-9 * (1 + total)
    # never below the compute-only longest path, nor below total work over the devices
    assert r.step_time_us >= longest_path_us(g, gap) - eps
    assert r.step_time_us >= total / c.n_devices - eps
    # the step-only path agrees, and the same input gives the same output
    assert sim.step_time_us(devices, priority) == r.step_time_us
    again = Simulator(g, c).run(Placement(devices=devices.copy(), priority=priority))
    for attr in ("start_us", "finish_us", "transfer_start_us", "transfer_end_us", "peak_memory_bytes"):
        assert np.array_equal(getattr(r, attr), getattr(again, attr))
    # a device runs one op at a time; an op starts after its inputs finished (and arrived)
    for d in range(c.n_devices):
        on = np.flatnonzero(devices == d)
        order = on[np.lexsort((r.finish_us[on], r.start_us[on]))]  # zero-time ops first at a tie
        assert (r.start_us[order][1:] >= r.finish_us[order][:-1] - eps).all()
    assert (r.start_us[g.edge_dst] >= r.finish_us[g.edge_src] - eps).all()
    assert np.allclose(r.finish_us - r.start_us, g.compute_us[:, 0] + gap)
    # the critical path's parts lie end to end inside the step
    split = r.critical_path_split_us
    assert min(split.values()) >= -eps
    assert split["compute"] + split["transfer"] + split["channel_wait"] <= r.step_time_us + eps
    assert sum(split.values()) == pytest.approx(r.step_time_us, abs=eps) or r.step_time_us == 0
    # at most one transfer per (producer, destination device); memory returns to persistent
    assert len(set(zip(r.transfer_op.tolist(), r.transfer_dst.tolist()))) == len(r.transfer_op)
    for d in range(c.n_devices):
        _, used = r.memory_timeline(d)
        if not len(used):
            assert r.peak_memory_bytes[d] == 0
            continue
        assert used.min() >= -eps and abs(used[-1] - g.persistent_bytes[devices == d].sum()) <= eps
        assert r.peak_memory_bytes[d] == pytest.approx(used.max() if len(used) else 0.0)
    assert np.allclose(r.peak_memory_bytes, reference_peak_memory(g, c.n_devices, devices, r))
    assert np.array_equal(r.start_us, reference_schedule(g, c, devices, priority))
    # on one device the step is exactly the sum of op times plus the gaps
    single = sim.run(np.zeros(g.n_ops, dtype=np.int64))
    assert single.step_time_us == pytest.approx(total, rel=1e-12, abs=1e-9)
    assert len(single.transfer_op) == 0


def test_pipelined_link_hold_rounds_as_the_reference():
    # found by the property test: a 500 B transfer queued behind a 100 kB one on a pipelined link,
    # then a receive overhead; the engine must add the hold as the reference does, to the last bit
    n = 11
    g = OpGraph(
        names=[f"v{i}" for i in range(n)], kinds=[""] * n, device_kinds=["gpu"],
        compute_us=np.array([0, 0, 0, 1.03264345, 0, 1.19830542, 0, 0, 1.24271476, 28.26349353, 0]).reshape(n, 1),
        persistent_bytes=np.ones(n), output_bytes=np.zeros(n), temp_bytes=np.full(n, 3.0),
        colocation=np.full(n, -1), colocation_names=[], role=np.zeros(n), mirror=np.full(n, -1),
        edge_src=np.array([4, 3, 7, 7, 7, 7, 7, 3, 3]), edge_dst=np.array([1, 1, 5, 3, 4, 2, 1, 2, 6]),
        edge_bytes=np.array([500.0, 100000.0, 0, 0, 0, 0, 0, 0, 0]),
        edge_fixed_us=np.array([np.nan] * 5 + [3.5] + [np.nan] * 3),
    )
    c = uniform_cluster(2, latency_us=2.0, bandwidth_bytes_per_us=50.0, comm_model="pipelined", op_gap_us=1.5,
                        recv_overhead_us=7.5)
    devices = np.array([0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1])
    priority = np.array([0.0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0])
    r = Simulator(g, c).run(Placement(devices=devices, priority=priority))
    assert np.array_equal(r.start_us, reference_schedule(g, c, devices, priority))


def test_radix_argsort_matches_numpy_stable_sort():
    from devplace.sim.engine import stable_argsort_nonnegative

    rng = np.random.default_rng(7)
    values = np.concatenate([
        np.round(rng.uniform(0, 1e6, 20_000), 1),  # many ties
        rng.uniform(0, 1e-300, 100), [0.0, -0.0, 5e-324, 1e308], np.full(50, 3.0)])
    rng.shuffle(values)
    assert np.array_equal(stable_argsort_nonnegative(values), np.argsort(values, kind="stable"))
    assert stable_argsort_nonnegative(np.zeros(0)).tolist() == []


def test_large_graph_memory_events_are_in_time_order():
    rng = np.random.default_rng(5)
    n = 3000
    src = rng.integers(0, n - 1, 2 * n)
    dst = np.minimum(src + rng.integers(1, 50, 2 * n), n - 1)
    g = OpGraph(
        names=[f"v{i}" for i in range(n)], kinds=[""] * n, device_kinds=["gpu"],
        compute_us=rng.uniform(0, 10, (n, 1)).round(), persistent_bytes=np.ones(n),
        output_bytes=np.full(n, 4.0), temp_bytes=np.full(n, 2.0), colocation=np.full(n, -1),
        colocation_names=[], role=np.zeros(n), mirror=np.full(n, -1), edge_src=src, edge_dst=dst,
        edge_bytes=np.full(2 * n, 4.0), edge_fixed_us=np.full(2 * n, np.nan))
    r = simulate(g, uniform_cluster(3), rng.integers(0, 3, n))
    t, delta = r.memory_event_time_us, r.memory_event_delta
    assert len(t) > 4096 and (np.diff(t) >= 0).all()
    same = np.flatnonzero(np.diff(t) == 0)
    after_persistent = same >= n
    # at equal times no allocation comes before a free
    assert not ((delta[same] > 0) & (delta[same + 1] < 0) & after_persistent).any()


def test_placement_files_round_trip_and_bad_ones_are_named(tmp_path):
    import json

    g = chain_graph([1.0, 2.0, 3.0])
    p = Placement(devices=[0, 1, 0], algorithm="m-etf", options={"seed": 3}, placement_time_s=0.25,
                  priority=[0.5, 1.0, 2.0])
    p.save(tmp_path / "p.json", graph=g)
    back = Placement.load(tmp_path / "p.json")
    assert back.devices.tolist() == [0, 1, 0] and back.priority.tolist() == [0.5, 1.0, 2.0]
    assert (back.algorithm, back.options) == ("m-etf", {"seed": 3})
    assert "placement_time_s" not in (tmp_path / "p.json").read_text()  # no timing: same seed, same bytes
    back.check(g, uniform_cluster(2))
    other = chain_graph([1.0, 2.0, 3.0], device_kind="gpu")
    renamed = OpGraph(**{**{k: getattr(other, k) for k in (
        "kinds", "device_kinds", "compute_us", "persistent_bytes", "output_bytes", "temp_bytes",
        "colocation", "colocation_names", "role", "mirror", "edge_src", "edge_dst", "edge_bytes",
        "edge_fixed_us")}, "names": ["x", "y", "z"]})
    with pytest.raises(PlacementError, match="fingerprint"):
        simulate(renamed, uniform_cluster(2), back)
    data = json.loads((tmp_path / "p.json").read_text())
    for change, pattern in (({"priority": ["a", 1, 2]}, "'priority' must be a list of numbers"),
                            ({"devices": [0, "1", 0]}, "'devices' must be a list of device indices"),
                            ({"options": [1]}, "'options' must be an object"),
                            ({"version": 7}, "version 7"),
                            ({"format": "x"}, "not a devplace placement file")):
        (tmp_path / "bad.json").write_text(json.dumps(data | change))
        with pytest.raises(PlacementError, match=pattern):
            Placement.load(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(PlacementError, match="one JSON object"):
        Placement.load(tmp_path / "bad.json")
    with pytest.raises(PlacementError, match="does not exist"):
        Placement.load(tmp_path / "missing.json")


def test_a_device_filled_to_the_byte_fits_whatever_the_summation_order():
    """A placer's sum of the same bytes in another order may land a rounding error above the
    simulator's: that is not out of memory; a byte in a million over is."""
    b = GraphBuilder(["gpu"])
    b.add_op("a", compute_us=1.0, persistent_bytes=1000.0)
    g = b.build()
    rounding_above = uniform_cluster(1, memory_bytes=1000.0 * (1 - 1e-13))
    result = simulate(g, rounding_above, [0])
    assert result.peak_memory_bytes[0] > rounding_above.memory_bytes[0] and result.fits
    really_over = uniform_cluster(1, memory_bytes=1000.0 * (1 - 1e-6))
    assert simulate(g, really_over, [0]).oom_devices == [0]
