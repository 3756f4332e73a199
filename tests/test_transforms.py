"""Baechi's graph optimizations: co-placement, acyclic fusion, forward-only view, and the place() hook."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.graph import GraphBuilder, Role, chain_graph
from devplace.transforms import coplacement_groups, forward_view, fuse, optimize, quotient


@st.composite
def random_dags(draw, max_ops=24, training=False):
    """A random DAG (edges go from lower to higher index) with colocation groups and byte figures;
    about one edge in five only orders its ends."""
    n = draw(st.integers(3, max_ops))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    density = draw(st.sampled_from([0.1, 0.25, 0.5]))
    b = GraphBuilder(["gpu"])
    half = n // 2
    for i in range(n):
        group = int(rng.integers(-3, 3))
        backward = training and i >= half
        b.add_op(
            f"op{i}", compute_us=float(rng.integers(1, 20)), output_bytes=float(rng.integers(0, 1000)),
            temp_bytes=float(rng.integers(0, 100)), persistent_bytes=float(rng.integers(0, 100)),
            colocation=f"g{group}" if group >= 0 else None,
            role=Role.BACKWARD if backward else Role.FORWARD,
            mirror=f"op{n - 1 - i}" if backward and n - 1 - i < half else None,
        )
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < density:
                nbytes, order_only = float(rng.integers(0, 500)), (i + j) % 5 == 0
                b.add_edge(f"op{i}", f"op{j}", bytes=0.0 if order_only else nbytes, order_only=order_only)
    return b.build()


def quotient_is_acyclic(graph, labels) -> bool:
    q = nx.DiGraph()
    q.add_nodes_from(set(labels.tolist()))
    q.add_edges_from((labels[s], labels[d]) for s, d in zip(graph.edge_src, graph.edge_dst) if labels[s] != labels[d])
    return nx.is_directed_acyclic_graph(q)


def test_fusion_refuses_the_contraction_that_would_close_a_cycle():
    b = GraphBuilder(["gpu"])
    for name in "abc":
        b.add_op(name, compute_us=1.0)
    b.add_edge("a", "b"), b.add_edge("a", "c"), b.add_edge("c", "b")
    f = fuse(b.build(), [0, 0, 1])
    assert f.graph.n_ops == 3
    # a and b stay separate but must still share a device
    assert f.graph.colocation[f.coarse_of[0]] == f.graph.colocation[f.coarse_of[1]] >= 0
    assert f.graph.colocation[f.coarse_of[2]] == -1


def test_fusion_contracts_a_diamond_inside_one_group():
    b = GraphBuilder(["gpu"])
    for name in "abcd":
        b.add_op(name, compute_us=2.0, persistent_bytes=10.0)
    for s, d in ["ab", "ac", "bd", "cd"]:
        b.add_edge(s, d, bytes=4.0)
    f = fuse(b.build(), [0, 0, 0, 0])
    assert f.graph.n_ops == 1
    assert f.graph.compute_us[0, 0] == 8.0 and f.graph.persistent_bytes[0] == 40.0


def test_merged_edges_sum_distinct_producers_and_keep_fixed_times():
    b = GraphBuilder(["gpu"])
    for name in ["x", "y", "u", "v"]:
        b.add_op(name, compute_us=1.0)
    b.add_edge("x", "y", bytes=1.0)
    b.add_edge("x", "u", bytes=100.0, fixed_us=5.0)
    b.add_edge("x", "v", bytes=60.0, fixed_us=7.0)   # same producer into the same coarse op: max
    b.add_edge("y", "v", bytes=30.0, fixed_us=2.0)   # another producer: added
    f = quotient(b.build(), [0, 0, 1, 1])
    assert f.graph.n_ops == 2 and f.graph.n_edges == 1
    assert f.graph.edge_bytes[0] == 130.0 and f.graph.edge_fixed_us[0] == 9.0


def test_a_coarse_edge_only_orders_when_every_edge_it_merges_does():
    b = GraphBuilder(["gpu"])
    for name in ["x", "y", "u", "v", "w"]:
        b.add_op(name, compute_us=1.0, output_bytes=10.0)
    b.add_edge("x", "u", order_only=True)
    b.add_edge("y", "v", order_only=True)
    b.add_edge("y", "w", order_only=True)
    b.add_edge("x", "w", bytes=4.0)
    f = quotient(b.build(), [0, 0, 1, 1, 2])
    edges = {(int(s), int(d)): bool(o) for s, d, o in zip(f.graph.edge_src, f.graph.edge_dst, f.graph.edge_order_only)}
    assert edges == {(0, 1): True, (0, 2): False}
    # y's output is read by nobody outside its coarse op: held there as a temporary, not an output
    assert f.graph.output_bytes[0] == 10.0 and f.graph.temp_bytes[0] == 10.0


@settings(max_examples=60, deadline=None)
@given(graph=random_dags(training=True), group_count=st.integers(1, 4), seed=st.integers(0, 1000))
def test_fusion_keeps_graphs_acyclic_and_round_trips(graph, group_count, seed):
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, group_count, size=graph.n_ops)
    f = fuse(graph, groups)                   # building the OpGraph validates acyclicity
    assert quotient_is_acyclic(graph, f.coarse_of)
    # every original op in exactly one coarse op, and the figures add up
    members = np.concatenate([f.members(c) for c in range(f.graph.n_ops)])
    assert sorted(members.tolist()) == list(range(graph.n_ops))
    assert np.allclose(f.graph.compute_us.sum(), graph.compute_us.sum())
    assert np.allclose(f.graph.persistent_bytes.sum(), graph.persistent_bytes.sum())
    # fused ops never mix groups; a placement keeping coarse groups together keeps the groups together
    for c in range(f.graph.n_ops):
        assert len(set(groups[f.members(c)].tolist())) == 1
    coarse_devices = rng.integers(0, 3, size=f.graph.n_ops)
    for g_members in f.graph.colocation_members:
        coarse_devices[g_members] = coarse_devices[g_members[0]]
    devices = f.expand(coarse_devices)
    for g in np.unique(groups):
        assert len(set(devices[groups == g].tolist())) == 1


def contract_by_sets(graph, groups):
    """The fusion rule done the obvious way (neighbour sets of pieces, passes in topological order):
    the oracle for the compiled contraction."""
    piece = list(range(graph.n_ops))

    def find(x):
        while piece[x] != x:
            x = piece[x]
        return x

    def neighbours(p, ends, others):
        return {find(o) for e, o in zip(ends, others) if find(e) == p} - {p}

    src, dst = graph.edge_src.tolist(), graph.edge_dst.tolist()
    candidates = sorted({(u, v) for u, v in zip(src, dst) if groups[u] == groups[v]},
                        key=lambda e: (graph.topo_rank[e[0]], graph.topo_rank[e[1]]))
    changed = True
    while changed:
        changed = False
        for u, v in candidates:
            ru, rv = find(u), find(v)
            if ru != rv and (len(neighbours(ru, src, dst)) == 1 or len(neighbours(rv, dst, src)) == 1):
                piece[max(ru, rv)] = min(ru, rv)
                changed = True
    return [find(i) for i in range(graph.n_ops)]


@settings(max_examples=60, deadline=None)
@given(graph=random_dags(training=True), group_count=st.integers(1, 3), seed=st.integers(0, 1000))
def test_compiled_fusion_contracts_exactly_what_the_rule_allows(graph, group_count, seed):
    groups = np.random.default_rng(seed).integers(0, group_count, size=graph.n_ops)
    roots = contract_by_sets(graph, groups)
    coarse_of = fuse(graph, groups).coarse_of
    same_piece = coarse_of[:, None] == coarse_of[None, :]
    assert (same_piece == (np.array(roots)[:, None] == np.array(roots)[None, :])).all()


def test_fusion_hash_table_survives_rebuilds():
    from devplace.transforms.fusion import _add, _rebuilt, _table

    keys, counts = _table(4)
    used = np.zeros(1, np.int64)
    for key in range(5):
        assert _add(keys, counts, used, key, 1) == 0
    for key in range(4):
        assert _add(keys, counts, used, key, -1) == 1      # removed: tombstones stay behind
    keys, counts = _rebuilt(keys, counts, used)
    assert used[0] == 1 and _add(keys, counts, used, 4, 1) == 1 and _add(keys, counts, used, 0, 1) == 0


@settings(max_examples=40, deadline=None)
@given(graph=random_dags(training=True))
def test_optimized_placements_expand_to_valid_placements(graph):
    c = optimize(graph, coplacement=True, fusion=True, forward_only=True)
    assert c.graph.n_ops <= graph.n_ops
    # every backward op with a mirror lands with its forward op, whatever the coarse placement
    devices = c.expand(np.arange(c.graph.n_ops) % 3)
    mirrored = np.flatnonzero(graph.mirror >= 0)
    assert np.array_equal(devices[mirrored], devices[graph.mirror[mirrored]])
    p = dp.place(graph, uniform_cluster(3), "round-robin+opt+fwd")
    assert p.colocation_violations(graph) == [] and len(p.devices) == graph.n_ops


@settings(max_examples=40, deadline=None)
@given(graph=random_dags())
def test_fused_memory_is_conservative_on_one_device(graph):
    f = fuse(graph, coplacement_groups(graph))
    one = uniform_cluster(1, memory_bytes=1e12)
    coarse_peak = dp.simulate(f.graph, one, np.zeros(f.graph.n_ops, dtype=np.int64)).peak_memory_bytes[0]
    expanded = dp.Placement(devices=np.zeros(graph.n_ops, dtype=np.int64),
                            priority=f.expand_priority(f.graph.topo_rank))
    assert coarse_peak >= dp.simulate(graph, one, expanded).peak_memory_bytes[0] - 1e-6


def test_coplacement_rules():
    b = GraphBuilder(["gpu"])
    for name in ["src", "left", "right", "join", "alone"]:
        b.add_op(name, compute_us=1.0)
    b.add_op("join_grad", compute_us=1.0, role="backward", mirror="join")
    b.add_op("p", compute_us=1.0, colocation="params")
    b.add_op("p_update", compute_us=1.0, colocation="params", role="update")
    for s, d in [("src", "left"), ("src", "right"), ("left", "join"), ("right", "join")]:
        b.add_edge(s, d)
    g = b.build()
    groups = coplacement_groups(g)
    by = dict(zip(g.names, groups.tolist()))
    assert by["left"] == by["right"] == by["join"] == by["join_grad"]   # single consumers + mirror
    assert by["src"] != by["join"]                                       # two consumers: not joined
    assert by["p"] == by["p_update"] != by["alone"]


def test_forward_view_places_backward_with_forward_and_keeps_groups():
    b = GraphBuilder(["gpu"])
    b.add_op("f1", compute_us=2.0, output_bytes=100.0)
    b.add_op("f2", compute_us=3.0, colocation="w")
    b.add_op("g2", compute_us=4.0, role="backward", mirror="f2", output_bytes=50.0)
    b.add_op("g1", compute_us=5.0, role="backward", mirror="f1")
    b.add_op("upd", compute_us=1.0, role="update", colocation="w")
    b.add_op("sum1", compute_us=1.0, role="backward")  # partial sums of a gradient: no mirror, no
    b.add_op("sum2", compute_us=1.0, role="backward")  # group; each follows its largest input
    b.add_op("sum3", compute_us=1.0, role="backward", colocation="w")
    b.add_op("stray", compute_us=1.0, role="backward")  # no input with a leader: follows its reader
    b.add_op("lone", compute_us=1.0, role="backward")   # nothing to follow at all
    for s, d, nbytes in [("f1", "f2", 0), ("f2", "g2", 0), ("f1", "g1", 0), ("g2", "g1", 0), ("g2", "upd", 0),
                         ("g1", "sum1", 0), ("sum1", "sum2", 0), ("g2", "sum2", 0), ("sum2", "sum3", 0),
                         ("stray", "g1", 0)]:
        b.add_edge(s, d, bytes=nbytes)
    g = b.build()
    v = forward_view(g)
    assert v.graph.n_ops == 3                      # f1, f2, lone
    devices = v.expand([0, 1, 2])
    by = dict(zip(g.names, devices.tolist()))
    # sum1 reads g1 only; sum2 reads sum1 (0 bytes) and g2 (50 bytes): the larger leads
    assert by["g1"] == by["f1"] == by["stray"] == by["sum1"] == 0 and by["lone"] == 2
    assert by["g2"] == by["upd"] == by["f2"] == by["sum2"] == by["sum3"] == 1
    # f1's output is read by g1 (kept for backward) and g2's output is a follower's: both persistent
    assert v.graph.persistent_bytes[v.coarse_of[0]] >= 100.0
    assert v.graph.persistent_bytes[v.coarse_of[1]] >= 50.0
    assert v.graph.compute_us[v.coarse_of[1], 0] == 3.0 + 4.0 + 1.0 + 2 * 1.0  # f2, g2, upd, sum2, sum3


def test_place_hook_records_sizes_and_expands_priorities_in_topological_order():
    g = chain_graph([5.0] * 12, edge_bytes=100.0)
    p = dp.place(g, uniform_cluster(2), "heft+opt")
    assert p.options["original_ops"] == 12 and p.options["coarse_ops"] == 1
    assert np.all(np.diff(p.priority[g.topo_order]) > 0)
    assert len(set(p.devices.tolist())) == 1


def test_bundled_graphs_shrink():
    g = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    c = optimize(g, coplacement=True, fusion=True, forward_only=True)
    assert c.graph.n_ops < g.n_ops // 2
    devices = c.expand(np.arange(c.graph.n_ops) % 6)
    assert dp.Placement(devices=devices).colocation_violations(g) == []


def test_fused_op_names_are_unique_and_readable():
    f = fuse(chain_graph([1.0] * 4), [0, 0, 1, 1])
    assert f.graph.names == ("op0[+1]", "op2[+1]")


def test_quotient_rejects_a_cyclic_grouping():
    from devplace.errors import GraphError

    b = GraphBuilder(["gpu"])
    for name in "abc":
        b.add_op(name, compute_us=1.0)
    b.add_edge("a", "c"), b.add_edge("c", "b")
    with pytest.raises(GraphError, match="cycle"):
        quotient(b.build(), [0, 0, 1])
