"""devplace's own placer (sim-search): never worse than its seeds, memory- and colocation-safe, seeded."""

import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.errors import OutOfMemoryError, PlacementError
from devplace.graph import GraphBuilder
from devplace.portfolio.sim_search import SearchConfig
from devplace.progress import Reporter, reporting
from test_baechi import graph_and_cluster  # random DAGs with groups, tight or ample memory

FAST = {"max_evals": 150, "seeds": ("single", "m-etf", "heft", "metis", "m-etf+opt")}


def step_us(g, c, placement) -> float:
    return dp.simulate(g, c, placement).step_time_us


@given(graph_and_cluster())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_never_worse_than_any_seed_it_ran(case):
    """The portfolio's promise: the result is at least as fast as every seed placement that fits."""
    g, c = case
    seeds = {}
    for spec in FAST["seeds"]:
        try:
            seeds[spec] = step_us(g, c, dp.place(g, c, spec))
        except OutOfMemoryError:
            pass
    try:
        p = dp.place(g, c, "sim-search", **FAST)
    except OutOfMemoryError:   # only when no seed fits
        assert seeds == {}
        return
    ours = step_us(g, c, p)
    assert ours == pytest.approx(p.options["step_us"])
    for spec, seed_us in seeds.items():
        assert ours <= seed_us + 1e-9, spec
        assert p.options["seed_results"][spec] <= seed_us + 1e-9   # each seed was judged as placed


@given(graph_and_cluster())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fits_memory_and_keeps_colocation_groups(case):
    g, c = case
    try:
        p = dp.place(g, c, "sim-search", check=False, **FAST)
    except OutOfMemoryError:
        # only when no seed fits: then m-ETF (a seed) cannot place it either
        with pytest.raises(OutOfMemoryError):
            dp.place(g, c, "m-etf")
        return
    assert p.colocation_violations(g) == []
    for members in g.colocation_members:
        assert len(set(p.devices[members].tolist())) <= 1
    result = dp.simulate(g, c, p)
    assert (result.peak_memory_bytes <= c.memory_bytes).all()


def test_same_seed_same_placement_and_order():
    g = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    c = dp.io.dnn_partitioning.cluster_for(g)
    first = dp.place(g, c, "sim-search", seed=3, **FAST)
    again = dp.place(g, c, "sim-search", seed=3, **FAST)
    assert first.devices.tolist() == again.devices.tolist()
    assert (first.priority is None and again.priority is None) or first.priority.tolist() == again.priority.tolist()
    assert first.options["evals"] == again.options["evals"] and first.options["stopped_by"] == "evals"


def greedy_trap(copies: int = 3) -> dp.OpGraph:
    """Per copy: a -> (b, c) -> d, where b's and c's outputs to d are huge but a's are small.

    When a finishes, b and c are both ready and another device is idle, so ETF (earliest start)
    runs them side by side; d then waits for a large transfer. One device per copy is faster."""
    b = GraphBuilder(["gpu"])
    for k in range(copies):
        b.add_op(f"a{k}", compute_us=10.0, output_bytes=10)
        b.add_op(f"b{k}", compute_us=50.0, output_bytes=1e6)
        b.add_op(f"c{k}", compute_us=50.0, output_bytes=1e6)
        b.add_op(f"d{k}", compute_us=10.0)
        b.add_edge(f"a{k}", f"b{k}", bytes=10)
        b.add_edge(f"a{k}", f"c{k}", bytes=10)
        b.add_edge(f"b{k}", f"d{k}", bytes=1e6)
        b.add_edge(f"c{k}", f"d{k}", bytes=1e6)
    return b.build()


def test_search_improves_on_m_etf_where_its_greedy_is_poor():
    g, c = greedy_trap(2), uniform_cluster(4, latency_us=1.0, bandwidth_bytes_per_us=1e3)
    assert step_us(g, c, dp.place(g, c, "single")) == 240.0
    etf = step_us(g, c, dp.place(g, c, "m-etf"))
    # seeded with m-ETF alone, so any gain is the search's own
    p = dp.place(g, c, "sim-search", seeds=("m-etf",), max_evals=400, pipeline_starts=False)
    assert p.options["best_seed"].startswith("seed m-etf")
    assert etf > 1000.0          # the trap works: ETF pays a 1000 us transfer
    assert step_us(g, c, p) == 120.0  # one device per copy


def test_time_budget_still_returns_the_best_seed():
    g, c = greedy_trap(), uniform_cluster(2, latency_us=1.0, bandwidth_bytes_per_us=1e3)
    p = dp.place(g, c, "sim-search", time_budget_s=0.0, seeds=("m-etf", "single"))
    assert p.options["stopped_by"] == "time"
    assert step_us(g, c, p) == pytest.approx(p.options["best_seed_step_us"])


def test_only_the_eval_budget_stops_it_unless_a_time_budget_is_asked_for():
    assert SearchConfig().time_budget_s is None
    g, c = greedy_trap(), uniform_cluster(2, latency_us=1.0, bandwidth_bytes_per_us=1e3)
    p = dp.place(g, c, "sim-search", max_evals=60, seeds=("m-etf",))
    assert p.options["stopped_by"] == "evals" and p.options["time_budget_s"] is None


def test_silent_by_default_and_reports_progress_and_logs_when_asked(capsys, caplog):
    g, c = greedy_trap(2), uniform_cluster(2, latency_us=1.0, bandwidth_bytes_per_us=1e3)
    dp.place(g, c, "sim-search", max_evals=100, seeds=("round-robin", "m-etf"))
    assert capsys.readouterr() == ("", "")

    events = []

    class Collect(Reporter):
        def begin(self, task, total=None):
            events.append(("begin", task, total))

        def update(self, done, *, best_step_us=None, note=""):
            events.append(("update", done, best_step_us))

        def end(self):
            events.append(("end",))

    with caplog.at_level(logging.DEBUG, logger="devplace"), reporting(Collect()):
        p = dp.place(g, c, "sim-search", max_evals=100, seeds=("round-robin", "m-etf"), closed_gap=0.0)
    assert capsys.readouterr() == ("", "")
    assert [e[1:] for e in events if e[0] == "begin"] == [("sim-search: seeds", 2), ("sim-search", 100)]
    assert sum(e[0] == "begin" for e in events) == sum(e[0] == "end" for e in events)
    bests = [e[2] for e in events if e[0] == "update" and e[2] is not None]
    assert bests and bests == sorted(bests, reverse=True) and bests[-1] == pytest.approx(p.options["step_us"])
    assert any(r.name.startswith("devplace.") and "best" in r.getMessage() for r in caplog.records)


def test_unknown_options_are_refused_by_name():
    g, c = greedy_trap(1), uniform_cluster(2, latency_us=1.0, bandwidth_bytes_per_us=1e3)
    with pytest.raises(PlacementError, match="max_eval"):
        dp.place(g, c, "sim-search", max_eval=20)
    with pytest.raises(PlacementError, match="quiet"):   # silence is the default: no such option
        dp.place(g, c, "sim-search", quiet=True)


def test_a_graph_that_costs_nothing_is_placed_without_dividing_by_its_zero_step_time():
    b = GraphBuilder(["gpu"])
    for name in "abcd":
        b.add_op(name, compute_us=0.0)
    b.add_edge("a", "b"), b.add_edge("a", "c"), b.add_edge("c", "d")
    g, c = b.build(), uniform_cluster(3)
    p = dp.place(g, c, "sim-search", max_evals=50, seeds=("round-robin", "single"))
    assert step_us(g, c, p) == 0.0 and p.options["step_us"] == 0.0


def test_zero_byte_edge_across_devices_with_no_transfer_at_all():
    # the search meets this often: every cross-device edge is a pure ordering edge, so the step
    # has no transfer; the memory pass once read the (empty) transfer list at index -1
    b = GraphBuilder(["gpu"])
    b.add_op("a", compute_us=10.0, output_bytes=100)
    b.add_op("b", compute_us=20.0, output_bytes=100)
    b.add_edge("a", "b", bytes=0.0)
    g, c = b.build(), uniform_cluster(2)
    result = dp.simulate(g, c, [0, 1])
    assert len(result.transfer_op) == 0 and result.step_time_us == 30.0
    assert result.peak_memory_bytes.tolist() == [100.0, 100.0]


def layer_chain(layers: int = 12, activation_bytes: float = 1e9) -> dp.OpGraph:
    """A training step of a chain of layers: forward f0..fL-1, backward bL-1..b0.

    Each forward output (an activation) lives until its layer's backward op, and each backward
    output (a gradient of the same size) until the next backward op: on one device the peak holds
    every activation at once, while a sum-of-bytes model counts activations and gradients alike."""
    b = GraphBuilder(["gpu"])
    for k in range(layers):
        b.add_op(f"f{k}", compute_us=100.0, output_bytes=activation_bytes, persistent_bytes=1e6)
        if k:
            b.add_edge(f"f{k - 1}", f"f{k}", bytes=activation_bytes)
    for k in reversed(range(layers)):
        b.add_op(f"b{k}", compute_us=200.0, output_bytes=activation_bytes, role="backward", mirror=f"f{k}")
        b.add_edge(f"f{k}", f"b{k}", bytes=activation_bytes)
        if k < layers - 1:
            b.add_edge(f"b{k + 1}", f"b{k}", bytes=activation_bytes)
    return b.build()


def test_tight_memory_repair_finds_a_fit_where_no_device_and_no_baechi_placer_does():
    g = layer_chain()
    one_device_peak = dp.simulate(g, uniform_cluster(1), [0] * g.n_ops).peak_memory_bytes[0]
    c = uniform_cluster(4, memory_bytes=0.4 * one_device_peak, bandwidth_bytes_per_us=1e4)
    assert g.output_bytes.sum() > c.memory_bytes.sum()    # the never-freeing count cannot fit it
    for baseline in ("single", "m-etf", "m-topo"):
        with pytest.raises(OutOfMemoryError):
            dp.place(g, c, baseline)
    p = dp.place(g, c, "sim-search", max_evals=100, seeds=("single", "m-etf"))
    result = dp.simulate(g, c, p)                          # place() checked it too; check it here anyway
    assert (result.peak_memory_bytes <= c.memory_bytes).all() and len(set(p.devices.tolist())) >= 3
    assert p.colocation_violations(g) == []
    assert p.options["best_seed"].startswith(("pipeline", "repair"))   # neither seed could start it


def test_oom_error_names_the_least_overflow_and_the_largest_groups():
    g = layer_chain()
    c = uniform_cluster(4, memory_bytes=2.5e9, bandwidth_bytes_per_us=1e4)   # 12 activations cannot fit in 10 GB
    with pytest.raises(OutOfMemoryError, match=r"least total overflow is [0-9.]+ GiB.*largest groups") as err:
        dp.place(g, c, "sim-search", max_evals=50, repair_max_evals=200, seeds=("single",))
    assert "'f" in str(err.value)     # a forward op (with its backward) is named as a group


def test_repair_is_deterministic_for_a_seed():
    g = layer_chain()
    peak = dp.simulate(g, uniform_cluster(1), [0] * g.n_ops).peak_memory_bytes[0]
    c = uniform_cluster(4, memory_bytes=0.4 * peak, bandwidth_bytes_per_us=1e4)
    runs = [dp.place(g, c, "sim-search", seed=5, max_evals=80, seeds=("round-robin",))
            for _ in range(2)]
    assert runs[0].devices.tolist() == runs[1].devices.tolist()
    assert runs[0].options["evals"] == runs[1].options["evals"]


def test_backward_ops_tied_to_the_loss_follow_their_input_instead():
    # captures give a weight-gradient sum the loss as mirror; 70 such ops would all follow the loss
    from devplace.placers._moves import leader_units

    b = GraphBuilder(["gpu"])
    b.add_op("loss", compute_us=1.0)
    for k in range(70):
        b.add_op(f"f{k}", compute_us=1.0, output_bytes=100)
        b.add_edge(f"f{k}", "loss", bytes=100)
    for k in range(70):
        b.add_op(f"g{k}", compute_us=1.0, role="backward", mirror="loss")
        b.add_edge("loss", f"g{k}", bytes=1)
        b.add_edge(f"f{k}", f"g{k}", bytes=100)
    g = b.build()
    units = leader_units(g)
    assert all(units.unit_of[g.index(f"g{k}")] == units.unit_of[g.index(f"f{k}")] for k in range(70))
    assert len({int(units.unit_of[g.index(f"g{k}")]) for k in range(70)}) == 70


def _two_layer_training_graph():
    """w0 -> f0 -> f1 (reads w1) -> loss -> b1 -> b0, each b reading its f's saved output; g1 and
    g0 make the weights' gradients, which only the updates u1 and u0 read. A topological sort
    lists both weights first."""
    b = GraphBuilder(["gpu"])
    for k in range(2):
        b.add_op(f"w{k}", compute_us=0.0, persistent_bytes=10, role="other")
    b.add_op("f0", compute_us=1.0, output_bytes=1000)
    b.add_op("f1", compute_us=1.0, output_bytes=500)
    b.add_op("loss", compute_us=1.0, output_bytes=4)
    b.add_op("b1", compute_us=1.0, output_bytes=100, role="backward", mirror="f1")
    b.add_op("g1", compute_us=1.0, output_bytes=2000, role="backward", mirror="f1")
    b.add_op("b0", compute_us=1.0, output_bytes=3000, role="backward", mirror="f0")
    b.add_op("g0", compute_us=1.0, output_bytes=10, role="backward", mirror="f0")
    for k in range(2):
        b.add_op(f"u{k}", compute_us=1.0, role="update")
        b.add_edge(f"g{k}", f"u{k}", bytes=10)
        b.add_edge(f"w{k}", f"u{k}", bytes=10)
    for src, dst, nbytes in (("w0", "f0", 10), ("f0", "f1", 1000), ("w1", "f1", 10), ("f1", "loss", 500),
                             ("loss", "b1", 4), ("f1", "b1", 500), ("b1", "g1", 100), ("b1", "b0", 100),
                             ("f0", "b0", 1000), ("b0", "g0", 3000)):
        b.add_edge(src, dst, bytes=nbytes)
    return b.build()


def test_step_order_puts_each_weight_just_before_its_first_reader():
    from devplace.placers._moves import sources_late_order

    g = _two_layer_training_graph()
    names = [g.names[i] for i in sources_late_order(g)]
    assert sorted(names) == sorted(g.names)
    assert names.index("w1") == names.index("f1") - 1 and names.index("w0") == names.index("f0") - 1
    assert names.index("w1") > names.index("f0")      # a topological sort would put it first


def test_held_bytes_count_only_what_backward_and_update_ops_read_later():
    from devplace.placers._moves import held_bytes

    g = _two_layer_training_graph()
    held = dict(zip(g.names, held_bytes(g).tolist()))
    assert held["f0"] == 1000 and held["f1"] == 500      # saved for b0 and b1
    assert held["w0"] == 10 + 0 and held["loss"] == 4     # persistent bytes; the loss's output is read by b1
    assert held["b0"] == 0 and held["g1"] == 0            # gradients are short-lived


def test_updates_first_frees_a_gradient_before_the_next_backward_op():
    """On one device, the topological order runs b0 before u1, so g1's 2000-byte weight gradient
    is still alive when b0 allocates its 3000; updates first runs u1 first and frees it."""
    from devplace.portfolio.sim_search.search import _Search

    g = _two_layer_training_graph()
    search = _Search(g, uniform_cluster(2, memory_bytes=1e6), SearchConfig(), 0)
    devices = np.zeros(g.n_ops, np.int64)
    orders = dict(search.orders(devices))
    sim = search.sim
    peaks = {name: sim.run(dp.Placement(devices=devices, priority=orders[name])).peak_memory_bytes[0]
             for name in ("topological", "updates first")}
    assert peaks["updates first"] < peaks["topological"]


def test_layer_move_puts_a_whole_module_with_its_backward_ops_and_weights_on_another_device():
    """Two layers taking turns (a recurrent net over two time steps): a layer move carries all of
    one, both time steps; where each layer runs once, in one piece, no layer move is drawn."""
    from test_baselines import scoped_step

    from devplace.portfolio.sim_search.anneal import _critical_info, _propose
    from devplace.portfolio.sim_search.search import _Search

    config = SearchConfig(move_weights=(("layer", 1.0),))
    once = scoped_step([(f"layers.{k}", 10.0, 100.0) for k in range(3)])
    assert _Search(once, uniform_cluster(2), config, 0).layers is None
    g = scoped_step([(f"layers.{k % 2}", 10.0, 100.0) for k in range(4)])
    search = _Search(g, uniform_cluster(2), config, 0)
    devices = np.zeros(g.n_ops, np.int64)
    info = _critical_info(search, devices, None)
    scope = dict(zip(g.names, g.meta["op_scope"]))
    for _ in range(10):
        move, changes = _propose(search, devices, info)
        assert move == "layer" and len(changes) == 1
        ops, target = changes[0]
        moved = {g.names[v] for v in ops}
        layer = {scope[n] for n in moved} - {""}
        assert target == 1 and len(layer) == 1          # one module, to the other device
        assert moved >= {n for n, s in scope.items() if s in layer}     # all of it: weights, forward, backward


def recurrent_layers(n_layers: int = 2, steps: int = 4, pair_bytes: float = 0.0) -> dp.OpGraph:
    """``n_layers`` independent recurrent layers taking turns over ``steps`` time steps (each step's op
    reads the layer's previous one); with ``pair_bytes``, each odd layer also reads the layer before it
    at the same step over an edge of that many bytes, so the two want one device."""
    b = GraphBuilder(["gpu"])
    for t in range(steps):
        for k in range(n_layers):
            b.add_op(f"l{k}_t{t}", compute_us=100.0, output_bytes=10.0)
            if t:
                b.add_edge(f"l{k}_t{t - 1}", f"l{k}_t{t}", bytes=10.0)
            if pair_bytes and k % 2:
                b.add_edge(f"l{k - 1}_t{t}", f"l{k}_t{t}", bytes=pair_bytes)
    b.meta["op_scope"] = [f"layers.{name[1]}" for name in b.build().names]
    return b.build()


def test_layer_descent_puts_each_interleaved_layer_whole_on_its_own_device():
    """From one device (the only seed, no annealing), the descent moves one layer, all time steps,
    to the other device: the step halves. With the descent off the search keeps the seed; on a graph
    whose layers run once each no descent runs, so its evals are the same either way."""
    g, c = recurrent_layers(), uniform_cluster(2)
    config = dict(seeds=("single",), pipeline_starts=False, max_evals=0, layer_search_evals=0)
    on = dp.place(g, c, "sim-search", seed=0, **config)
    off = dp.place(g, c, "sim-search", seed=0, layer_descent_evals=0, **config)
    assert off.options["step_us"] == pytest.approx(800.0)
    assert on.options["step_us"] == pytest.approx(400.0)
    assert on.options["found_by"].startswith("layer descent (1 moves)")
    device = dict(zip(g.names, on.devices.tolist()))
    assert {device[f"l0_t{t}"] for t in range(4)} != {device[f"l1_t{t}"] for t in range(4)}
    assert all(len({device[f"l{k}_t{t}"] for t in range(4)}) == 1 for k in range(2))
    from test_baselines import scoped_step

    once = scoped_step([(f"layers.{k}", 10.0, 100.0) for k in range(3)])
    runs = [dp.place(once, c, "sim-search", seed=0, max_evals=50, layer_descent_evals=n) for n in (0, 3000)]
    assert runs[0].options["evals"] == runs[1].options["evals"]
    assert np.array_equal(runs[0].devices, runs[1].devices)


def test_layer_search_moves_layers_together_where_one_layer_moves_are_all_slower():
    """All on one device (1,600 us), every one-layer move is slower (the moved layer's partner waits
    2,000 us for its edge), so the greedy descent stays; the layer search's moves of several layers
    at once put each coupled pair on its own device (800 us)."""
    g, c = recurrent_layers(4, pair_bytes=2e7), uniform_cluster(2)  # 2,000 us per pair edge
    config = dict(seeds=("single",), pipeline_starts=False, max_evals=0)
    off = dp.place(g, c, "sim-search", seed=0, layer_search_evals=0, **config)
    on = dp.place(g, c, "sim-search", seed=0, **config)
    assert off.options["step_us"] == pytest.approx(1600.0)
    assert on.options["step_us"] == pytest.approx(800.0)
    assert on.options["found_by"].startswith("layer search")
    device = dict(zip(g.names, on.devices.tolist()))
    pair = [{device[f"l{k}_t{t}"] for t in range(4) for k in ks} for ks in ((0, 1), (2, 3))]
    assert all(len(p) == 1 for p in pair) and pair[0] != pair[1]
