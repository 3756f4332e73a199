"""Classic baselines: round-robin, random, expert, METIS min-cut, HEFT."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.errors import OutOfMemoryError
from devplace.graph import GraphBuilder, Role
from devplace.placers.expert import Rule, matching_rule, rules

BASELINES = ["round-robin", "random", "metis", "heft"]


def random_dag(seed: int, n: int = 30, density: float = 0.2, n_groups: int = 4) -> dp.OpGraph:
    rng = np.random.default_rng(seed)
    b = GraphBuilder(["gpu"])
    for i in range(n):
        group = int(rng.integers(-n_groups, n_groups)) if n_groups else -1
        b.add_op(f"op{i}", compute_us=float(rng.integers(1, 50)), output_bytes=float(rng.integers(0, 4096)),
                 persistent_bytes=float(rng.integers(0, 4096)), colocation=f"g{group}" if group >= 0 else None)
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < density:
                b.add_edge(f"op{i}", f"op{j}", bytes=float(rng.integers(0, 10_000)))
    return b.build()


def wide_graph(width: int = 8, depth: int = 10, edge_bytes: float = 10.0) -> dp.OpGraph:
    """A source, ``width`` independent chains of ``depth`` ops, a sink."""
    b = GraphBuilder(["gpu"])
    b.add_op("source", compute_us=1.0)
    b.add_op("sink", compute_us=1.0)
    for w in range(width):
        for k in range(depth):
            b.add_op(f"c{w}.{k}", compute_us=10.0, output_bytes=edge_bytes)
            b.add_edge("source" if k == 0 else f"c{w}.{k - 1}", f"c{w}.{k}", bytes=edge_bytes)
        b.add_edge(f"c{w}.{depth - 1}", "sink", bytes=edge_bytes)
    return b.build()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_devices=st.integers(1, 4), algo=st.sampled_from(BASELINES))
def test_every_baseline_keeps_colocation_groups(seed, n_devices, algo):
    g = random_dag(seed)
    p = dp.place(g, uniform_cluster(n_devices), algo, seed=seed)   # place() rejects a split group
    assert p.colocation_violations(g) == []
    for members in g.colocation_members:
        assert len(set(p.devices[members].tolist())) <= 1


@pytest.mark.parametrize("algo", BASELINES)
def test_baselines_with_graph_optimizations(algo):
    g = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    cluster = dp.io.dnn_partitioning.cluster_for(g)
    p = dp.place(g, cluster, algo + "+opt+fwd")
    assert p.options["coarse_ops"] < g.n_ops and p.colocation_violations(g) == []


def test_round_robin_deals_ops_in_turn_and_keeps_groups():
    b = GraphBuilder(["gpu"])
    for i in range(6):
        b.add_op(f"op{i}", compute_us=1.0, colocation="pair" if i in (1, 4) else None)
    p = dp.place(b.build(), uniform_cluster(3), "round-robin")
    assert p.devices.tolist() == [0, 1, 2, 0, 1, 2]


def test_random_is_seeded():
    g = random_dag(1, n=60, n_groups=0)
    c = uniform_cluster(4)
    a, b = (dp.place(g, c, "random", seed=5).devices for _ in range(2))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, dp.place(g, c, "random", seed=6).devices)
    assert len(set(a.tolist())) == 4


def test_random_may_not_fit_and_place_says_so():
    g = random_dag(2, n=40)
    tiny = uniform_cluster(2, memory_bytes=float(g.persistent_bytes.sum()) / 4)
    with pytest.raises(OutOfMemoryError):
        dp.place(g, tiny, "random")


def test_heft_beats_single_on_a_wide_graph_with_cheap_communication():
    g = wide_graph()
    c = uniform_cluster(4, latency_us=1.0, bandwidth_bytes_per_us=1e4)
    single = dp.simulate(g, c, dp.place(g, c, "single")).step_time_us
    heft = dp.place(g, c, "heft")
    assert heft.priority is not None
    assert dp.simulate(g, c, heft).step_time_us <= 0.3 * single
    assert len(set(heft.devices.tolist())) == 4


def test_heft_keeps_a_chain_together_when_communication_is_dear():
    g = wide_graph(width=1, depth=20, edge_bytes=1e6)
    c = uniform_cluster(4, latency_us=1000.0, bandwidth_bytes_per_us=10.0)
    assert len(set(dp.place(g, c, "heft").devices.tolist())) == 1


def test_heft_respects_memory():
    g = wide_graph(width=4, depth=5)
    per_chain = 5 * 10.0
    b = GraphBuilder(["gpu"])   # same graph with heavy parameters: 2 chains per device at most
    for i, name in enumerate(g.names):
        b.add_op(name, compute_us=float(g.compute_us[i, 0]), output_bytes=float(g.output_bytes[i]),
                 persistent_bytes=1000.0 if name.startswith("c") else 0.0)
    for s, d, nbytes in zip(g.edge_src, g.edge_dst, g.edge_bytes):
        b.add_edge(g.names[s], g.names[d], bytes=float(nbytes))
    heavy = b.build()
    c = uniform_cluster(2, memory_bytes=2 * 5 * 1000.0 + 4 * per_chain + 200.0)
    p = dp.place(heavy, c, "heft")      # place() checks memory by simulation
    assert "memory_overcommitted" not in p.options
    assert np.bincount(p.devices, minlength=2).tolist()[0] >= 10


def _part_quotient_is_acyclic(g, devices) -> bool:
    q = nx.DiGraph()
    q.add_edges_from((int(devices[s]), int(devices[d])) for s, d in zip(g.edge_src, g.edge_dst)
                     if devices[s] != devices[d])
    return nx.is_directed_acyclic_graph(q)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_devices=st.integers(2, 4))
def test_metis_parts_form_a_dag(seed, n_devices):
    g = random_dag(seed, n=40, density=0.1)
    p = dp.place(g, uniform_cluster(n_devices), "metis", seed=seed)
    assert _part_quotient_is_acyclic(g, p.devices)


def test_metis_balances_independent_chains_and_cuts_little():
    g = wide_graph(width=4, depth=25, edge_bytes=1e4)
    c = uniform_cluster(4)
    p = dp.place(g, c, "metis")
    load = np.bincount(p.devices, weights=g.compute_us[:, 0], minlength=4)
    assert load.max() <= 1.15 * load.mean()
    # source and sink touch every chain, so 6 cut edges are forced; a min cut adds only a few
    assert np.count_nonzero(p.devices[g.edge_src] != p.devices[g.edge_dst]) <= 12
    assert _part_quotient_is_acyclic(g, p.devices)


def test_metis_is_deterministic_for_a_seed():
    g = random_dag(3, n=80, density=0.05)
    c = uniform_cluster(3)
    assert np.array_equal(dp.place(g, c, "metis", seed=4).devices, dp.place(g, c, "metis", seed=4).devices)


def gnmt_named_graph(layers: int = 4) -> dp.OpGraph:
    """A toy step following the zoo's GNMT names; backward ops carry no module path, only a mirror."""
    b = GraphBuilder(["gpu"])
    forward = ["encoder.embedding.lookup"]
    forward += [f"encoder.layers.{i}.cell.mm" for i in range(layers)]
    forward += ["decoder.embedding.lookup", "attention.scores", "attention.softmax"]
    forward += [f"decoder.layers.{i}.cell.mm" for i in range(layers)]
    forward += ["classifier.mm", "loss"]
    for name in forward:
        b.add_op(name, compute_us=10.0)
    for a, c in zip(forward, forward[1:]):
        b.add_edge(a, c, bytes=100.0)
    previous = "loss"
    for name in reversed(forward[:-1]):
        grad = f"grad{len(b._names)}"
        b.add_op(grad, compute_us=10.0, role=Role.BACKWARD, mirror=name)
        b.add_edge(previous, grad, bytes=100.0)
        previous = grad
    return b.build()


def test_expert_puts_each_gnmt_layer_on_its_own_device():
    g = gnmt_named_graph()
    p = dp.place(g, uniform_cluster(4), "expert")
    dev = dict(zip(g.names, p.devices.tolist()))
    for i in range(4):
        assert dev[f"encoder.layers.{i}.cell.mm"] == i == dev[f"decoder.layers.{i}.cell.mm"]
    assert dev["attention.scores"] == dev["decoder.layers.0.cell.mm"] == 0
    assert dev["classifier.mm"] == 3
    mirrored = np.flatnonzero(g.mirror >= 0)
    assert np.array_equal(p.devices[mirrored], p.devices[g.mirror[mirrored]])


def test_expert_with_fewer_devices_than_layers_stacks_neighbouring_layers():
    g = gnmt_named_graph(layers=4)
    dev = dict(zip(g.names, dp.place(g, uniform_cluster(2), "expert").devices.tolist()))
    assert [dev[f"encoder.layers.{i}.cell.mm"] for i in range(4)] == [0, 0, 1, 1]


def test_expert_splits_a_graph_without_rules_by_module_blocks_instead_of_refusing():
    g = dp.load_graph(dp.example_path("gnmt_layers_training.json"))    # names like '1:node1': no rule
    c = dp.io.dnn_partitioning.cluster_for(g)
    assert matching_rule(g, c.n_devices) is None
    p = dp.place(g, c, "expert")
    assert len(set(p.devices.tolist())) == c.n_devices
    load = np.bincount(p.devices, weights=g.compute_us[:, 0], minlength=c.n_devices)
    assert load.max() <= 1.5 * load.mean()


def scoped_step(blocks: list[tuple[str, float, float]], ops_per_block: int = 3) -> dp.OpGraph:
    """A training step through a chain of modules, recorded as a capture does: fx-like op names,
    module paths in meta["op_scope"], a parameter per forward op, backward ops mirroring forward ones.
    ``blocks``: (module path, compute us of each of its ops, parameter bytes of each of its ops)."""
    b = GraphBuilder(["gpu"])
    scope = {"input": ""}
    b.add_op("input", compute_us=0.0, output_bytes=10.0)
    previous, forward = "input", []
    for path, compute_us, param_bytes in blocks:
        for _ in range(ops_per_block):
            name = f"mm_{len(forward)}"
            b.add_op(f"param_{name}", compute_us=0.0, persistent_bytes=param_bytes)
            b.add_op(name, compute_us=compute_us, output_bytes=10.0)
            b.add_edge(f"param_{name}", name, bytes=param_bytes)
            b.add_edge(previous, name, bytes=10.0)
            scope[name] = scope[f"param_{name}"] = path
            previous = name
            forward.append(name)
    for name in reversed(forward):
        b.add_op(f"grad_{name}", compute_us=1.0, role=Role.BACKWARD, mirror=name)
        b.add_edge(previous, f"grad_{name}", bytes=10.0)
        scope[f"grad_{name}"] = scope[name]
        previous = f"grad_{name}"
    g = b.build()
    b.meta["op_scope"] = [scope[n] for n in g.names]
    return b.build()


def test_scope_split_is_contiguous_by_module_balanced_by_compute_and_memory_capped():
    blocks = [(f"blocks.{k}.ff", float(10 + 10 * (k % 3)), 1000.0) for k in range(12)]
    g = scoped_step(blocks)
    assert matching_rule(g, 4) is None
    dev = dict(zip(g.names, dp.place(g, uniform_cluster(4), "expert").devices.tolist()))
    forward = [n for n in g.names if n.startswith("mm_")]
    stages = [dev[n] for n in forward]
    assert stages == sorted(stages) and set(stages) == {0, 1, 2, 3}        # contiguous, in step order
    assert all(len(set(stages[3 * k: 3 * k + 3])) == 1 for k in range(12))  # a module is never cut
    work = np.bincount(stages, weights=[blocks[i // 3][1] * 3 + 3 for i in range(len(forward))]) / 3
    assert work.max() - work.mean() <= 3 * 31                               # balanced to within a block
    assert all(dev[f"grad_{n}"] == dev[n] == dev[f"param_{n}"] for n in forward)

    # memory: four light blocks then four heavy ones; by compute the light ones share device 0,
    # but a 7 kB device holds two blocks (3 kB of parameters + outputs each), a 4 kB one only one
    g = scoped_step([(f"blocks.{k}.ff", 1.0 if k < 4 else 10.0, 1000.0) for k in range(8)])
    forward = [g.index(n) for n in g.names if n.startswith("mm_")]

    def ops_per_device(memory_bytes):
        p = dp.place(g, uniform_cluster(4, memory_bytes=memory_bytes), "expert", check=False)
        return np.bincount(p.devices[forward], minlength=4).tolist()

    assert ops_per_device(1e9) == [12, 6, 3, 3]
    assert ops_per_device(7000.0) == [6, 6, 6, 6]
    assert ops_per_device(4000.0) == [3, 3, 3, 15]


def test_expert_puts_a_cnn_on_one_device():
    b = GraphBuilder(["gpu"])
    for name in ["features.conv1", "features.conv2", "fc"]:
        b.add_op(name, compute_us=5.0)
    b.add_edge("features.conv1", "features.conv2"), b.add_edge("features.conv2", "fc")
    assert len(set(dp.place(b.build(), uniform_cluster(4), "expert").devices.tolist())) == 1


def test_expert_reads_captured_fx_names_through_parameters():
    """Captured graphs name ops like fx nodes; parameters carry the module path with underscores."""
    b = GraphBuilder(["gpu"])
    previous = None
    for side in ("encoder", "decoder"):
        for i in range(2):
            weight = f"param_{side}_layers_{i}_cell_weight_ih"
            b.add_op(weight, compute_us=0.0, persistent_bytes=100.0)
            b.add_op(f"mm_{side}{i}", compute_us=10.0)
            b.add_edge(weight, f"mm_{side}{i}")
            if previous:
                b.add_edge(previous, f"mm_{side}{i}", bytes=10.0)
            previous = f"mm_{side}{i}"
    b.add_op("param_encoder_layers_10_cell_bias", compute_us=0.0)     # layer 10, not layer 1
    g = b.build()
    dev = dict(zip(g.names, dp.place(g, uniform_cluster(11), "expert").devices.tolist()))
    assert dev["mm_encoder1"] == dev["param_encoder_layers_1_cell_weight_ih"] == 1
    assert dev["mm_decoder0"] == 0 and dev["mm_decoder1"] == 1 and dev["param_encoder_layers_10_cell_bias"] == 10


def test_expert_reads_module_scopes_when_the_graph_records_them():
    """Captured graphs keep fx op names and record each op's module in meta["op_scope"]."""
    b = GraphBuilder(["gpu"])
    names = ["mm_0", "mm_1", "mm_2", "mm_3", "cat_4"]
    scopes = ["encoder.layers.0.cell", "encoder.layers.1.cell", "decoder.layers.0.cell", "decoder.layers.1.cell",
              "classifier"]
    for a in names:
        b.add_op(a, compute_us=1.0)
    for a, c in zip(names, names[1:]):
        b.add_edge(a, c)
    b.meta["op_scope"] = scopes
    g = b.build()
    assert dp.place(g, uniform_cluster(2), "expert").devices.tolist() == [0, 1, 0, 1, 1]
    # a graph derived from a captured one may keep meta with one scope per original op: names rule then
    b.meta["op_scope"] = scopes[:-1]
    assert matching_rule(b.build(), 2) is None   # fx names alone: no rule, so the scope split places it
    assert sorted(set(dp.place(b.build(), uniform_cluster(2), "expert").devices.tolist())) == [0, 1]


def test_expert_puts_each_rnnlm_layer_on_its_own_device_with_embedding_first_and_classifier_last():
    b = GraphBuilder(["gpu"])
    names = ["embedding.lookup"] + [f"rnnlm.layers.{i}.cell.mm" for i in range(4)] + ["classifier.mm"]
    for n in names:
        b.add_op(n, compute_us=1.0)
    for a, c in zip(names, names[1:]):
        b.add_edge(a, c)
    g = b.build()
    assert matching_rule(g, 4)[0].name == "rnnlm"
    assert dp.place(g, uniform_cluster(4), "expert").devices.tolist() == [0, 0, 1, 2, 3, 3]
    assert dp.place(g, uniform_cluster(2), "expert").devices.tolist() == [0, 0, 0, 1, 1, 1]


def test_every_zoo_model_has_exactly_one_rule_and_the_table_is_checked():
    from devplace import zoo

    covered = [model for rule in rules() for model in rule.models]
    assert sorted(covered) == zoo.names()
    with pytest.raises(dp.DevplaceError, match="kind must be"):
        Rule.from_table({"name": "x", "kind": "pipeline"})
    with pytest.raises(dp.DevplaceError, match="unknown field"):
        Rule.from_table({"name": "x", "kind": "layers", "layers": ["a.{i}"], "frist": ["b"]})
