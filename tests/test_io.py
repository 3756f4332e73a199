"""Graph files: the native format round-trips exactly; dnn-partitioning files import faithfully."""

import json
import math

import numpy as np
import pytest

import devplace as dp
from devplace.errors import GraphError, PlacementError
from devplace.graph import GraphBuilder, OpGraph
from devplace.io import dnn_partitioning, load_graph, native, save_graph
from devplace.placement import Placement
from devplace.sim import simulate

DNN_FILES = {  # file: (nodes, edges), the table in devplace/data/README-dnn-partitioning.md
    "bert_l-3_inference.json": (235, 250),
    "bert_l-3_training.json": (600, 817),
    "resnet50_inference.json": (604, 619),
    "gnmt_layers_training.json": (192, 244),
}


def awkward_graph() -> OpGraph:
    b = GraphBuilder(["gpu", "cpu"])
    b.add_op("matmul/αβ", kind="mm", compute_us={"gpu": 0.1 + 0.2, "cpu": 1e-310},
             persistent_bytes=2**60 + 0.5 if False else 2.0**60, output_bytes=1.5, temp_bytes=3)
    b.add_op("relu 😀", compute_us={"gpu": 1 / 3, "cpu": 7}, colocation="grp 1", role="backward",
             mirror="matmul/αβ")
    b.add_op("opt", compute_us={"gpu": 123456789.123456789, "cpu": 0}, colocation="grp 1", role="update")
    b.add_op("other", compute_us=0.0, role="other", colocation="g2")
    b.add_edge("matmul/αβ", "relu 😀", bytes=0.1 + 0.7, fixed_us=2.5e-7)
    b.add_edge("relu 😀", "opt", bytes=1e18)
    b.add_edge("matmul/αβ", "opt", order_only=True)
    b.meta = {"source": "test", "nested": {"list": [1, 2.5, None], "ünï": "ok"}}
    return b.build()


def assert_same_graph(a: OpGraph, b: OpGraph) -> None:
    assert a.names == b.names and a.kinds == b.kinds and a.device_kinds == b.device_kinds
    for attr in ("compute_us", "persistent_bytes", "output_bytes", "temp_bytes", "role", "mirror",
                 "edge_src", "edge_dst", "edge_bytes", "edge_order_only", "colocation"):
        x, y = getattr(a, attr), getattr(b, attr)
        assert x.dtype == y.dtype and x.shape == y.shape, attr
        assert x.tobytes() == y.tobytes(), attr  # bit for bit
    assert np.array_equal(a.edge_fixed_us, b.edge_fixed_us, equal_nan=True)
    assert a.colocation_names == b.colocation_names
    assert a.meta == b.meta


def test_native_round_trip_is_exact(tmp_path):
    g = awkward_graph()
    path = tmp_path / "g.json"
    save_graph(g, path)
    back = load_graph(path)
    assert_same_graph(g, back)
    assert back.compute_us[0, 0] == 0.1 + 0.2 != 0.3
    assert math.isnan(back.edge_fixed_us[1]) and back.edge_fixed_us[0] == 2.5e-7
    # saving the loaded graph writes the same bytes: nothing is added on load
    save_graph(back, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()
    # no temporary file left behind by the atomic write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.json", "g.json"]


def test_native_file_layout_is_the_documented_one(tmp_path):
    save_graph(awkward_graph(), tmp_path / "g.json")
    data = json.loads((tmp_path / "g.json").read_text())
    assert data["format"] == "devplace-graph" and data["version"] == 1
    assert set(data["ops"]) == {"name", "kind", "compute_us", "persistent_bytes", "output_bytes",
                                "temp_bytes", "colocation", "role", "mirror"}
    assert set(data["edges"]) == {"src", "dst", "bytes", "fixed_us", "order_only"}
    assert data["edges"]["fixed_us"] == [2.5e-7, None, None]  # absent fixed time is null
    assert data["edges"]["order_only"] == [False, False, True]
    assert data["ops"]["role"] == ["forward", "backward", "update", "other"]
    assert data["ops"]["mirror"] == [None, "matmul/αβ", None, None]
    assert data["ops"]["colocation"] == [None, "grp 1", "grp 1", "g2"]


def test_minimal_native_file_uses_defaults(tmp_path):
    path = tmp_path / "min.json"
    path.write_text(json.dumps({
        "format": "devplace-graph", "version": 1, "device_kinds": ["gpu"],
        "ops": {"name": ["a", "b"], "compute_us": {"gpu": [1, 2]}},
        "edges": {"src": ["a"], "dst": ["b"]},
    }))
    g = load_graph(path)
    assert g.n_ops == 2 and g.n_edges == 1 and g.output_bytes.tolist() == [0, 0]
    assert g.role.tolist() == [0, 0] and g.colocation.tolist() == [-1, -1]
    assert math.isnan(g.edge_fixed_us[0]) and g.edge_bytes.tolist() == [0] and g.edge_order_only.tolist() == [False]


def native_dict(**op_changes) -> dict:
    data = native.to_dict(awkward_graph())
    data = json.loads(json.dumps(data))
    for key, value in op_changes.items():
        section, field = key.split("__")
        if value is None:
            del data[section][field]
        else:
            data[section][field] = value
    return data


@pytest.mark.parametrize("changes,pattern", [
    ({"edges__dst": ["relu 😀", "opt", "nowhere"]}, "edges.dst.*'nowhere', which does not exist"),
    ({"edges__src": ["matmul/αβ", "ghost", "matmul/αβ"]}, "edges.src.*'ghost'"),
    ({"ops__name": ["a", "b", "a", "c"]}, "duplicate op name 'a'"),
    ({"ops__mirror": [None, "missing", None, None]}, "ops.mirror.*'relu 😀'.*'missing'"),
    ({"ops__persistent_bytes": [0, "many", 0, 0]}, "persistent_bytes.*'relu 😀'.*'many'"),
    ({"ops__output_bytes": [0, 0, -4, 0]}, "op 'opt' has output_bytes = -4"),
    ({"ops__temp_bytes": [0, 0]}, "'temp_bytes' must be a list of 4 entries"),
    ({"ops__role": ["forward", "forward", "sideways", "other"]}, "unknown role 'sideways'"),
    ({"ops__role": ["forward", 1, 7, "other"]}, "unknown role 7"),
    ({"ops__role": ["forward", "backward", [2], "other"]}, "unknown role \\[2\\]"),
    ({"edges__dst": ["relu 😀", ["opt"], "opt"]}, "edges.dst.*\\['opt'\\], which does not exist"),
    ({"ops__compute_us": {"gpu": [1, 2, 3, 4]}}, "no times for device kind 'cpu'"),
    ({"edges__bytes": [1, None, 2]}, "'bytes' entry for 'relu 😀 -> opt' is None"),
    ({"edges__fixed_us": [None, -1, None]}, "edge 'relu 😀' -> 'opt' has fixed_us = -1"),
    ({"edges__order_only": [False, "yes", True]}, "'order_only' entry for 'relu 😀 -> opt' is 'yes': it must be true or false"),
    ({"edges__order_only": [False, True, True]}, "edge 'relu 😀' -> 'opt' is order_only but carries bytes"),
])
def test_bad_native_files_name_the_culprit(changes, pattern):
    with pytest.raises(GraphError, match=pattern):
        native.from_dict(native_dict(**changes), source="graph file 'x.json'")


def test_meta_must_be_an_object():
    data = native_dict()
    data["meta"] = "notes"
    with pytest.raises(GraphError, match="field 'meta' must be a JSON object"):
        native.from_dict(data)


def test_roles_may_be_given_by_code_or_any_case():
    g = native.from_dict(native_dict(ops__role=[0, "BACKWARD", 2, "Other"]))
    assert g.role.tolist() == [0, 1, 2, 3]


def test_nan_in_a_native_file_names_op_and_field(tmp_path):
    data = native_dict(ops__compute_us={"gpu": [1, float("nan"), 1, 1], "cpu": [1, 1, 1, 1]})
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(data))  # Python writes the NaN literal
    with pytest.raises(GraphError, match="op 'relu 😀' has compute time for 'gpu'.*nan"):
        load_graph(path)


def test_unreadable_files_give_one_sentence(tmp_path):
    with pytest.raises(GraphError, match="does not exist"):
        load_graph(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(GraphError, match="not valid JSON"):
        load_graph(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(GraphError, match="neither a devplace graph"):
        load_graph(tmp_path / "other.json")
    (tmp_path / "v9.json").write_text('{"format": "devplace-graph", "version": 9}')
    with pytest.raises(GraphError, match="version 9"):
        load_graph(tmp_path / "v9.json")


# ------------------------------------------------------------------ dnn-partitioning
@pytest.fixture(scope="module")
def dnn_graphs():
    return {name: load_graph(dp.example_path(name)) for name in DNN_FILES}


@pytest.mark.parametrize("name", sorted(DNN_FILES))
def test_dnn_partitioning_import_keeps_every_figure(name, dnn_graphs):
    g = dnn_graphs[name]
    raw = json.loads(dp.example_path(name).read_text())
    assert (g.n_ops, g.n_edges) == DNN_FILES[name]
    assert g.device_kinds == ("gpu", "cpu")
    nodes = raw["nodes"]
    by_id = {node["id"]: node for node in nodes}
    gpu, cpu = g.kind_index("gpu"), g.kind_index("cpu")
    for i, node in enumerate(nodes):
        assert g.names[i] == f"{node['id']}:{node.get('name', '')}"
        assert g.compute_us[i, gpu] == pytest.approx(node["fpgaLatency"] * 1000, rel=1e-12)
        assert g.compute_us[i, cpu] == pytest.approx(node["cpuLatency"] * 1000, rel=1e-12)
        assert g.persistent_bytes[i] == node["size"]
        assert g.role[i] == (1 if node.get("isBackwardNode") else 0)
    assert int((g.role == 1).sum()) == sum(1 for node in nodes if node.get("isBackwardNode"))
    # colour classes become colocation groups with exactly the same members
    classes = {}
    for i, node in enumerate(nodes):
        if node.get("colorClass") is not None:
            classes.setdefault(node["colorClass"], set()).add(i)
    assert len(g.colocation_names) == len(classes)
    assert sorted(map(sorted, classes.values())) == sorted(m.tolist() for m in g.colocation_members)
    # edge costs become fixed times in us, sizes stay bytes
    index = g.index_of
    for e, edge in enumerate(raw["edges"]):
        assert g.names[g.edge_src[e]] == f"{edge['sourceId']}:{by_id[edge['sourceId']].get('name', '')}"
        assert g.edge_dst[e] == index[f"{edge['destId']}:{by_id[edge['destId']].get('name', '')}"]
        assert g.edge_fixed_us[e] == pytest.approx(edge["cost"] * 1000, rel=1e-12)
        assert g.edge_bytes[e] == edge.get("size", 0.0)
    spec = g.meta["dnn_partitioning"]
    assert spec["max_fpgas"] == raw["maxFPGAs"]
    assert spec["max_size_per_fpga_bytes"] == raw["maxSizePerFPGA"]


def test_backward_ops_mirror_the_forward_op_of_their_class(dnn_graphs):
    g = dnn_graphs["gnmt_layers_training.json"]
    backward = np.flatnonzero(g.role == 1)
    mirrored = backward[g.mirror[backward] >= 0]
    assert len(mirrored) > 0
    for op in mirrored:
        fwd = g.mirror[op]
        assert g.role[fwd] == 0 and g.colocation[fwd] == g.colocation[op] >= 0
    assert (g.mirror[g.role == 0] == -1).all()


@pytest.mark.parametrize("name,expected_ms", [
    ("gnmt_layers_training.json", 520.45),
    ("bert_l-3_training.json", 122.99),
])
def test_one_device_step_time_matches_the_sum_of_latencies(name, expected_ms, dnn_graphs):
    g = dnn_graphs[name]
    cluster = dnn_partitioning.cluster_for(g)
    result = simulate(g, cluster, np.zeros(g.n_ops, dtype=np.int64))
    assert result.step_time_us / 1000 == pytest.approx(expected_ms, abs=0.005)
    assert result.step_time_us == pytest.approx(g.compute_us[:, 0].sum(), rel=1e-12)
    assert result.transfer_op.size == 0


def test_dnn_partitioning_cluster_comes_from_the_file(dnn_graphs):
    g = dnn_graphs["bert_l-3_training.json"]
    c = dnn_partitioning.cluster_for(g)
    assert c.n_devices == g.meta["dnn_partitioning"]["max_fpgas"] == 3
    assert (c.memory_bytes == g.meta["dnn_partitioning"]["max_size_per_fpga_bytes"]).all()
    with pytest.raises(GraphError, match="not imported from a dnn-partitioning file"):
        dnn_partitioning.cluster_for(awkward_graph())


def tiny_dnn(nodes, edges) -> dict:
    return {"maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1, "nodes": nodes, "edges": edges}


def node(i, **extra):
    return {"id": i, "name": f"n{i}", "cpuLatency": 1.0, "fpgaLatency": 0.5, "size": 10.0} | extra


@pytest.mark.parametrize("data,pattern", [
    (tiny_dnn([node(1), node(1)], []), "two nodes with id 1"),
    (tiny_dnn([node(1)], [{"sourceId": 1, "destId": 9, "cost": 1}]), "edge 0 field 'destId' names node 9"),
    (tiny_dnn([node(1), node(2)], [{"sourceId": 1, "destId": 2}]), "edge 0 is missing the field 'cost'"),
    (tiny_dnn([node(1, fpgaLatency=-1)], []), "op '1:n1' has compute time for 'gpu'"),
    (tiny_dnn([node(1, size="big")], []), "node 1 \\('n1'\\) field 'size' must be a number"),
    (tiny_dnn([{"id": 3, "cpuLatency": 1, "size": 0}], []), "node 3.*missing the field 'fpgaLatency'"),
    (tiny_dnn([node(1, cpuLatency=[1])], []), "field 'cpuLatency' must be a number, not \\[1\\]"),
    (tiny_dnn([node([1])], []), "node 0 field 'id' must be a number"),
    (tiny_dnn([node(1)], [[1, 2]]), "edge 0 must be an object"),
    (tiny_dnn([node(1)], []) | {"maxSizePerFPGA": "big"}, "field 'maxSizePerFPGA' must be a number"),
    (tiny_dnn([node(1)], []) | {"maxFPGAs": 0}, "field 'maxFPGAs' must be a whole number >= 1"),
    (tiny_dnn([node(1), node(2)], [{"sourceId": 1, "destId": 2, "cost": 1},
                                   {"sourceId": 2, "destId": 1, "cost": 1}]), "cycle: '1:n1' -> '2:n2'|cycle: '2:n2' -> '1:n1'"),
])
def test_bad_dnn_partitioning_files_name_the_culprit(data, pattern):
    with pytest.raises(GraphError, match=pattern):
        dnn_partitioning.from_dict(data, source="graph file 'd.json'")


def test_the_documented_example_file_loads(tmp_path):
    import re
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "graph-format.md").read_text()
    example = re.search(r"```json\n(.*?)```", doc, re.S).group(1)
    (tmp_path / "example.json").write_text(example)
    g = load_graph(tmp_path / "example.json")
    assert g.n_ops == 4 and g.names[g.mirror[2]] == "matmul" and g.edge_fixed_us[2] == 12.0
    assert g.colocation_names == ("emb",) and g.role_counts()["update"] == 1


@pytest.mark.parametrize("content, why", [
    ("[" * 100_000 + "]" * 100_000, "too deeply"),
    ('{"n": ' + "9" * 5000 + "}", "cannot be read"),
    ("[1, 2]", "holds a JSON list"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_a_bad_graph_or_placement_file_is_named(tmp_path, content, why):
    """Graph and placement files share one reader, so both name the file and what is wrong with it."""
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(GraphError, match=f"graph file .*bad.json.* {why}"):
        load_graph(path)
    with pytest.raises(PlacementError, match=f"placement file .*bad.json.* {why}"):
        Placement.load(path)
    with pytest.raises(PlacementError, match="is a directory"):
        Placement.load(tmp_path)
