"""Comparing placers: the CLI writes every promised file, a failing placer keeps its row, large
graphs get a layer-by-time heat map."""

import csv
import html
import json
import subprocess
import sys

import numpy as np
import pytest

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.compare import compare, default_algos, parse_algo
from devplace.errors import ClusterError, PlacementError
from devplace.graph import GraphBuilder
from devplace.report import plots, write_report
from devplace.sim import simulate

REPORT_FILES = ("report.html", "comparison.csv", "comparison.json", "step_times.png", "best_timeline.png",
                "best_memory.png", "best_placement.png", "best_trace.json", "best_placement.json")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_cli_compare_on_a_zoo_model_writes_every_file_and_json_rows(tmp_path):
    out = tmp_path / "report"
    algos = "single,round-robin,m-etf,m-sct+opt,m-topo+opt+fwd"
    proc = subprocess.run(
        [sys.executable, "-m", "devplace.cli", "compare", "zoo:mlp:preset=small", "--cluster", "baechi-4x2080",
         "--algos", algos, "--output", str(out), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["algorithm"] for r in rows] == algos.split(",")
    for row in rows:
        assert {"algorithm", "step_time_us", "placement_time_s", "peak_memory_bytes", "oom", "error"} <= set(row)
        assert row["error"] is None and not row["oom"] and row["step_time_us"] > 0
        assert len(row["peak_memory_bytes"]) == 4
    single = rows[0]["step_time_us"]
    assert rows[0]["speedup_vs_single"] == pytest.approx(1.0)
    assert rows[1]["speedup_vs_single"] == pytest.approx(single / rows[1]["step_time_us"])
    for name in REPORT_FILES:
        assert (out / name).stat().st_size > 0, name
    for name in ("step_times.png", "best_timeline.png", "best_memory.png", "best_placement.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    page = (out / "report.html").read_text()
    assert "The best placement (" in page and "): Critical path (" in page and "ms compute" in page
    for name in REPORT_FILES[1:]:
        assert f'"{name}"' in page, name  # linked by a relative path, so the folder opens from disk
    table = list(csv.DictReader((out / "comparison.csv").read_text().splitlines()))
    assert [r["algorithm"] for r in table] == [r["algorithm"] for r in rows]
    for line, row in zip(table, rows):
        assert float(line["step_time_us"]) == pytest.approx(row["step_time_us"])
        per_device = [float(b) for b in line["peak_memory_bytes_per_device"].split(";")]
        assert per_device == pytest.approx(row["peak_memory_bytes"], abs=1.0)
        assert float(line["max_peak_memory_bytes"]) == pytest.approx(max(row["peak_memory_bytes"]))
    assert json.loads((out / "comparison.json").read_text()) == rows
    best = min(rows, key=lambda r: r["step_time_us"])
    assert json.loads((out / "best_placement.json").read_text())["algorithm"] == parse_algo(best["algorithm"])[0]


def test_cli_refuses_an_unknown_variant_before_capturing():
    proc = subprocess.run([sys.executable, "-m", "devplace.cli", "compare", "zoo:mlp", "--cluster", "baechi-4x2080",
                           "--algos", "m-sct+turbo"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown variant 'turbo'" in proc.stderr


def _heavy_chain(n_ops: int, gib_each: float):
    """A chain whose ops each hold ``gib_each`` GiB of parameters, named without expert rules
    (so ``expert`` places it by its scope split)."""
    b = GraphBuilder(["gpu"])
    for i in range(n_ops):
        b.add_op(f"op{i}", compute_us=100.0, persistent_bytes=gib_each * 2**30, output_bytes=1024)
        if i:
            b.add_edge(f"op{i - 1}", f"op{i}", bytes=1024)
    return b.build()


def test_failing_placers_get_their_row_and_the_others_still_run(tmp_path):
    graph = _heavy_chain(8, 0.5)  # 4 GiB in all: no single 1.5 GiB device holds it, four do
    cluster = uniform_cluster(4, memory_bytes=1.5 * 2**30, latency_us=10.0)
    seen = []
    algos = ["single", "expert", "m-etf", "m-topo+opt", "m-topo"]
    comparison = compare(graph, cluster, algos, on_row=seen.append)
    rows = {r.algorithm: r for r in comparison.rows}
    assert [r.algorithm for r in seen] == algos
    for name in ("single", "m-topo+opt"):  # fusion makes the whole chain one 4 GiB group
        assert rows[name].oom and rows[name].error and rows[name].step_time_us is None
    for name in ("expert", "m-etf", "m-topo"):   # expert: no rule names these ops, its scope split fits
        row = rows[name]
        assert row.error is None and not row.oom and row.step_time_us > 0
        assert max(row.peak_memory_bytes) <= 1.5 * 2**30
        assert row.speedup_vs_single is None  # there is no single-device time to compare with
    assert comparison.best.algorithm in ("expert", "m-etf", "m-topo")
    page = write_report(comparison, tmp_path, "heavy chain")
    assert html.escape(rows["single"].error) in page.read_text()


def test_algo_variants_parse_to_placer_options():
    assert parse_algo("m-sct") == ("m-sct", {})
    assert parse_algo("m-etf+opt") == ("m-etf", {"coplacement": True, "fusion": True})
    assert parse_algo("m-topo+opt+fwd") == ("m-topo", {"coplacement": True, "fusion": True, "forward_only": True})
    with pytest.raises(PlacementError, match="no placer named 'm-zzz'"):
        parse_algo("m-zzz+opt")
    defaults = default_algos()
    assert {"single", "expert", "m-sct", "m-sct+opt", "m-etf+opt", "m-topo+opt"} <= set(defaults)
    assert len(defaults) == len(set(defaults))


def _layered_graph(layers: int, width: int, scoped: bool):
    b = GraphBuilder(["gpu"])
    rng = np.random.default_rng(0)
    for layer in range(layers):
        for j in range(width):
            name = f"block{layer // 4}.unit{layer}.op{j}" if scoped else f"op_{layer}_{j}"
            b.add_op(name, compute_us=float(rng.uniform(5, 50)), output_bytes=4096)
            if layer:
                prefix = (lambda lay, k: f"block{lay // 4}.unit{lay}.op{k}") if scoped else (lambda lay, k: f"op_{lay}_{k}")
                for k in {j, int(rng.integers(width))}:
                    b.add_edge(prefix(layer - 1, k), name, bytes=4096)
    return b.build()


@pytest.mark.parametrize("scoped", [True, False])
def test_large_graph_gets_a_layer_by_time_heat_map(tmp_path, scoped):
    graph = _layered_graph(40, 10, scoped)
    assert graph.n_ops > plots.SMALL_GRAPH_OPS
    cluster = uniform_cluster(3, latency_us=5.0)
    result = simulate(graph, cluster, dp.place(graph, cluster, algo="m-etf"))
    path = tmp_path / "placement.png"
    plots.placement_picture(result, path, "synthetic")
    assert path.read_bytes()[:8] == PNG_MAGIC
    rows = plots._scope_rows(plots.op_scope_parts(graph), max_rows=30)
    if scoped:  # 40 units do not fit in 30 rows, so the rows are the 10 blocks; in 40 rows they fit
        assert rows is not None and rows[1] == sorted(f"block{i}" for i in range(10))
        assert rows[0][graph.index("block3.unit13.op0")] == rows[1].index("block3")
        assert len(plots._scope_rows(plots.op_scope_parts(graph), max_rows=40)[1]) == 40
    else:
        assert rows is None  # no module paths: bins of topological depth instead
    depth = plots.topological_depth(graph)
    assert depth[graph.index("block9.unit39.op0" if scoped else "op_39_0")] == 39


def test_with_devices_builds_an_n_gpu_variant_of_a_uniform_preset():
    base = dp.load_cluster("baechi-4x2080")
    two, eight = base.with_devices(2), base.with_devices(8)
    assert two.device_names == ["gpu0", "gpu1"] and eight.n_devices == 8
    assert eight.transfer_us(0, 7, 1e6) == base.transfer_us(0, 1, 1e6)
    assert eight.comm_model == base.comm_model and list(eight.memory_bytes) == [base.memory_bytes[0]] * 8
    with pytest.raises(ClusterError, match="not uniform"):
        dp.load_cluster("cpu+4gpu").with_devices(2)


def test_heat_map_rows_follow_a_captured_graphs_op_scope():
    graph = _layered_graph(40, 10, scoped=False)
    graph = graph.with_meta(op_scope=[f"encoder.layers.{int(name.split('_')[1]) // 10}"
                                      if int(name.split("_")[1]) < 30 else "" for name in graph.names])
    rows, labels = plots._scope_rows(plots.op_scope_parts(graph), max_rows=40)
    assert labels == ["(no module)", "encoder.layers.0", "encoder.layers.1", "encoder.layers.2"]
    assert labels[rows[graph.index("op_15_3")]] == "encoder.layers.1"
    assert labels[rows[graph.index("op_35_0")]] == "(no module)"


def test_every_row_reports_its_gap_to_a_certified_lower_bound():
    import devplace as dp
    from devplace.bounds import lower_bounds
    from devplace.compare import compare
    from devplace.io.dnn_partitioning import cluster_for

    graph = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    cluster = cluster_for(graph)
    result = compare(graph, cluster, ["single", "m-etf+opt", "round-robin"])
    bound = lower_bounds(graph, cluster)["best_us"]
    assert result.lower_bound["best_us"] == bound
    for row in result.rows:
        assert row.gap_to_bound == pytest.approx(row.step_time_us / bound - 1.0)
        assert row.gap_to_bound >= 0.0   # a certified bound is never above a simulated step
    assert "gap_to_bound" in result.rows[0].to_dict()
