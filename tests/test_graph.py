"""OpGraph: structure (CSR, topological order), the builder, and validation messages."""

import copy
import dataclasses
import math
import pickle

import numpy as np
import pytest

from devplace.errors import DevplaceError, GraphError
from devplace.graph import GraphBuilder, OpGraph, Role, chain_graph


def diamond() -> OpGraph:
    b = GraphBuilder(["gpu", "cpu"])
    b.add_op("d", compute_us={"gpu": 4.0, "cpu": 40.0}, kind="add", output_bytes=8)
    b.add_op("a", compute_us={"gpu": 1.0, "cpu": 10.0}, kind="matmul", persistent_bytes=100, temp_bytes=7)
    b.add_op("b", compute_us={"gpu": 2.0, "cpu": 20.0}, colocation="g", role="backward", mirror="a")
    b.add_op("c", compute_us={"gpu": 3.0, "cpu": 30.0}, colocation="g", role=Role.UPDATE)
    b.add_edge("a", "b", bytes=10)
    b.add_edge("a", "c", bytes=20, fixed_us=5.0)
    b.add_edge("b", "d", bytes=30)
    b.add_edge("c", "d")
    return b.build()


def test_builder_fills_every_column():
    g = diamond()
    assert (g.n_ops, g.n_edges) == (4, 4)
    assert g.names == ("d", "a", "b", "c")
    assert g.kinds == ("add", "matmul", "", "")
    assert g.compute_us.tolist() == [[4, 40], [1, 10], [2, 20], [3, 30]]
    assert g.persistent_bytes.tolist() == [0, 100, 0, 0]
    assert g.temp_bytes.tolist() == [0, 7, 0, 0]
    assert g.output_bytes.tolist() == [8, 0, 0, 0]
    assert g.colocation_names == ("g",)
    assert g.colocation.tolist() == [-1, -1, 0, 0]
    assert g.role.tolist() == [Role.FORWARD, Role.FORWARD, Role.BACKWARD, Role.UPDATE]
    assert g.mirror.tolist() == [-1, -1, 1, -1]
    assert g.edge_bytes.tolist() == [10, 20, 30, 0]
    assert np.isnan(g.edge_fixed_us[[0, 2, 3]]).all() and g.edge_fixed_us[1] == 5.0
    assert g.role_counts() == {"forward": 2, "backward": 1, "update": 1, "other": 0}
    assert g.total_compute_us() == {"gpu": 10.0, "cpu": 100.0}
    assert g.summary()["fixed_cost_edges"] == 1


def test_csr_adjacency_and_topological_order():
    g = diamond()
    a, b, c, d = (g.index(x) for x in "abcd")
    assert sorted(g.successors(a).tolist()) == [b, c]
    assert sorted(g.predecessors(d).tolist()) == [b, c]
    assert g.successors(d).tolist() == [] and g.predecessors(a).tolist() == []
    for op in range(g.n_ops):
        assert (g.edge_src[g.out_edges(op)] == op).all()
        assert (g.edge_dst[g.in_edges(op)] == op).all()
    # Kahn's order, smallest index first among ready ops: a, b, c, d
    assert g.topo_order.tolist() == [a, b, c, d]
    assert g.topo_rank[g.topo_order].tolist() == [0, 1, 2, 3]
    assert [m.tolist() for m in g.colocation_members] == [[b, c]]


def test_graph_is_immutable():
    g = diamond()
    with pytest.raises(ValueError):
        g.compute_us[0, 0] = 1.0
    with pytest.raises(ValueError):
        g.topo_order[0] = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.names = ("x",) * 4
    with pytest.raises(AttributeError):  # a tuple: no item assignment, no append
        g.names.append("e")
    with pytest.raises(TypeError):
        g.names[0] = "x"
    with pytest.raises(ValueError):
        g.colocation_members[0][0] = 0
    with pytest.raises(TypeError, match="read-only"):
        g.index_of["a"] = 0
    for copied in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g)):  # pickling makes writeable arrays
        assert not copied.compute_us.flags.writeable and not copied.succ_ptr.flags.writeable
        assert not copied.colocation_members[0].flags.writeable
        assert copied.names == g.names and copied.topo_order.tolist() == g.topo_order.tolist()


def test_meta_is_read_only_all_the_way_down_and_with_meta_derives_a_new_graph():
    b = GraphBuilder(["gpu"])
    b.add_op("a", compute_us=1.0)
    b.meta = {"source": "test", "capture_seconds": {"total": 1.0}, "op_scope": ["x"]}
    g = b.build()
    b.meta["source"] = "changed after build"  # the graph took a copy
    assert g.meta["source"] == "test"
    for edit in (lambda: g.meta.__setitem__("source", "x"), lambda: g.meta.update(source="x"),
                 lambda: g.meta["capture_seconds"].__setitem__("total", 2.0), lambda: g.meta.pop("source"),
                 lambda: g.meta.setdefault("new", 1), lambda: g.meta.clear()):
        with pytest.raises(TypeError, match="read-only"):
            edit()
    with pytest.raises(TypeError, match="read-only"):
        g.meta["op_scope"].append("y")
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.meta = {}
    derived = g.with_meta(source="derived", extra={"k": [1, 2]})
    assert derived.meta == {"source": "derived", "capture_seconds": {"total": 1.0}, "op_scope": ["x"],
                            "extra": {"k": [1, 2]}}
    assert g.meta["source"] == "test" and "extra" not in g.meta
    assert derived.compute_us is g.compute_us and derived.names is g.names  # nothing to copy: nothing can change
    with pytest.raises(TypeError, match="read-only"):
        derived.meta["extra"]["k"][0] = 0
    assert pickle.loads(pickle.dumps(derived)).meta == derived.meta  # spawned processes receive graphs


def test_a_callers_array_is_copied_so_it_cannot_change_the_graph():
    persistent = np.zeros(2)
    g = OpGraph(names=["a", "b"], kinds=["", ""], device_kinds=["gpu"], compute_us=np.ones((2, 1)),
                persistent_bytes=persistent, output_bytes=np.zeros(2), temp_bytes=np.zeros(2),
                colocation=np.full(2, -1), colocation_names=[], role=np.zeros(2), mirror=np.full(2, -1),
                edge_src=np.array([0]), edge_dst=np.array([1]), edge_bytes=np.zeros(1), edge_fixed_us=np.full(1, np.nan))
    persistent[0] = 5.0  # the caller still owns its array
    assert g.persistent_bytes[0] == 0.0 and persistent.flags.writeable


def test_topological_order_respects_every_edge_on_a_random_dag():
    rng = np.random.default_rng(3)
    n = 300
    perm = rng.permutation(n)  # a random DAG whose op order is not topological
    src, dst = [], []
    for _ in range(900):
        i, j = sorted(rng.choice(n, 2, replace=False))
        src.append(perm[i])
        dst.append(perm[j])
    g = OpGraph(
        names=[f"o{i}" for i in range(n)], kinds=[""] * n, device_kinds=["gpu"],
        compute_us=np.ones((n, 1)), persistent_bytes=np.zeros(n), output_bytes=np.zeros(n),
        temp_bytes=np.zeros(n), colocation=np.full(n, -1), colocation_names=[],
        role=np.zeros(n), mirror=np.full(n, -1), edge_src=src, edge_dst=dst,
        edge_bytes=np.zeros(len(src)), edge_fixed_us=np.full(len(src), np.nan),
    )
    assert sorted(g.topo_order.tolist()) == list(range(n))
    rank = g.topo_rank
    assert (rank[g.edge_src] < rank[g.edge_dst]).all()


def test_single_compute_time_applies_to_every_kind_and_chain_graph():
    b = GraphBuilder(["gpu", "cpu"])
    b.add_op("x", compute_us=3.5)
    assert b.build().compute_us.tolist() == [[3.5, 3.5]]
    g = chain_graph([1, 2, 3], edge_bytes=4)
    assert g.topo_order.tolist() == [0, 1, 2] and g.edge_bytes.tolist() == [4, 4]


# ------------------------------------------------------------------ validation messages
def test_cycle_message_prints_the_cycle():
    b = GraphBuilder(["gpu"])
    for name in ("start", "p", "q", "r"):
        b.add_op(name, compute_us=1)
    b.add_edge("start", "p")
    b.add_edge("p", "q")
    b.add_edge("q", "r")
    b.add_edge("r", "p")
    with pytest.raises(GraphError) as err:
        b.build()
    msg = str(err.value)
    assert "cycle" in msg
    cycle = msg.split("cycle: ")[1].split(";")[0]
    # the cycle is printed as a closed walk over exactly p, q, r in edge order
    hops = [h.strip().strip("'") for h in cycle.split("->")]
    assert hops[0] == hops[-1] and sorted(hops[:-1]) == ["p", "q", "r"]
    for x, y in zip(hops, hops[1:]):
        assert (x, y) in {("p", "q"), ("q", "r"), ("r", "p")}
    assert "start" not in cycle


def test_edge_to_a_missing_op_names_it():
    b = GraphBuilder(["gpu"])
    b.add_op("a", compute_us=1)
    b.add_edge("a", "ghost")
    with pytest.raises(GraphError, match="'ghost'.*does not exist"):
        b.build()
    with pytest.raises(GraphError, match="'phantom'.*does not exist"):
        b.add_edge("phantom", "a")


def test_duplicate_name_is_refused_by_builder_and_constructor():
    b = GraphBuilder(["gpu"])
    b.add_op("same", compute_us=1)
    with pytest.raises(GraphError, match="duplicate op name 'same'"):
        b.add_op("same", compute_us=2)
    g = chain_graph([1, 2])
    with pytest.raises(GraphError, match="duplicate op name 'op0'"):
        _rebuild(g, names=["op0", "op0"])


def _rebuild(g: OpGraph, **changes) -> OpGraph:
    fields = {
        name: getattr(g, name) for name in (
            "names", "kinds", "device_kinds", "compute_us", "persistent_bytes", "output_bytes",
            "temp_bytes", "colocation", "colocation_names", "role", "mirror", "edge_src",
            "edge_dst", "edge_bytes", "edge_fixed_us", "edge_order_only", "meta")
    }
    fields.update(changes)
    return OpGraph(**fields)


@pytest.mark.parametrize("field,value,pattern", [
    ("compute_us", [[1.0], [-2.0]], "op 'op1'.*compute time for 'gpu'"),
    ("compute_us", [[math.nan], [2.0]], "op 'op0'.*compute time for 'gpu'.*nan"),
    ("compute_us", [[1.0], [math.inf]], "op 'op1'.*compute time"),
    ("persistent_bytes", [0.0, -1.0], "op 'op1'.*persistent_bytes"),
    ("output_bytes", [math.nan, 0.0], "op 'op0'.*output_bytes"),
    ("temp_bytes", [0.0, -5.0], "op 'op1'.*temp_bytes"),
    ("edge_bytes", [-1.0], "edge 'op0' -> 'op1'.*bytes"),
    ("edge_bytes", [math.nan], "edge 'op0' -> 'op1'.*bytes"),
    ("edge_fixed_us", [-3.0], "edge 'op0' -> 'op1'.*fixed_us"),
    ("edge_fixed_us", [math.inf], "edge 'op0' -> 'op1'.*fixed_us"),
    ("edge_order_only", [True], "edge 'op0' -> 'op1' is order_only but carries bytes"),
    ("edge_order_only", [True, False], "field 'edge_order_only' has 2 entries for 1 edges"),
    ("edge_dst", [7], "edge 0.*op index 7"),
    ("edge_dst", [0], "edge 'op0' -> 'op0'.*self-loop"),
    ("mirror", [-1, 9], "op 'op1' mirrors op index 9"),
    ("colocation", [3, -1], "op 'op0'.*colocation group 3"),
    ("role", [0, 7], "op 'op1' has role 7"),
    ("kinds", ["x"], "field 'kinds' has 1 entries for 2 ops"),
])
def test_bad_figures_name_the_op_and_field(field, value, pattern):
    g = chain_graph([1.0, 2.0], edge_bytes=3)
    with pytest.raises(GraphError, match=pattern):
        _rebuild(g, **{field: np.asarray(value) if field != "kinds" else value})


def test_order_only_edges_default_to_none_and_are_counted():
    g = chain_graph([1.0, 2.0])
    assert g.edge_order_only.tolist() == [False] and g.summary()["order_only_edges"] == 0
    ordered = _rebuild(g, edge_order_only=np.array([True]))
    assert ordered.summary()["order_only_edges"] == 1 and not ordered.edge_order_only.flags.writeable


def test_nan_fixed_us_means_absent():
    g = chain_graph([1.0, 2.0], edge_bytes=3)
    ok = _rebuild(g, edge_fixed_us=np.array([math.nan]))
    assert ok.summary()["fixed_cost_edges"] == 0


def test_builder_errors_name_op_and_kind():
    b = GraphBuilder(["gpu", "cpu"])
    with pytest.raises(GraphError, match="op 'mm'.*device kind.*cpu"):
        b.add_op("mm", compute_us={"gpu": 1.0})
    with pytest.raises(GraphError, match="unknown role 'sideways'"):
        b.add_op("mm", compute_us=1.0, role="sideways")
    b.add_op("bw", compute_us=1.0, mirror="nowhere")
    with pytest.raises(GraphError, match="op 'bw' mirrors op 'nowhere'"):
        b.build()


def test_kind_index_names_the_missing_kind():
    g = chain_graph([1.0])
    assert g.kind_index("gpu") == 0
    with pytest.raises(GraphError, match="device kind 'tpu'.*it has: gpu"):
        g.kind_index("tpu")
    with pytest.raises(GraphError, match="no op named 'nope'"):
        g.index("nope")


def test_every_error_is_a_devplace_error():
    assert issubclass(GraphError, DevplaceError)


def test_empty_graph_is_valid():
    g = GraphBuilder(["gpu"]).build()
    assert g.n_ops == 0 and g.n_edges == 0 and g.topo_order.tolist() == []
