"""The command line: JSON outputs carry the promised fields; bad input is one line, exit 2."""

import json
import subprocess
import sys

import pytest

import devplace as dp

GNMT = str(dp.example_path("gnmt_layers_training.json"))


def run_cli(*args, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "devplace.cli", *args], capture_output=True, text=True, timeout=120
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_info_json_has_the_promised_fields():
    data = json.loads(run_cli("info", GNMT, "--json").stdout)
    assert data["ops"] == 192 and data["edges"] == 244
    assert data["roles"]["forward"] == 96 and data["roles"]["backward"] == 96
    assert data["persistent_bytes"] == pytest.approx(4933015040.0)
    assert data["total_compute_us"]["gpu"] == pytest.approx(520453.0)


def test_place_then_simulate_json_and_trace(tmp_path):
    placement = tmp_path / "p.json"
    trace = tmp_path / "trace.json"
    run_cli("place", GNMT, "--algo", "single", "--output", str(placement))
    data = json.loads(run_cli("simulate", GNMT, "-p", str(placement), "--json", "--trace", str(trace)).stdout)
    assert data["step_time_us"] == pytest.approx(520453.0)
    assert len(data["peak_memory_bytes"]) == 6 and data["oom_devices"] == []
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["info", "/no/such/graph.json"], "does not exist"),
        (["simulate", GNMT, "-c", "no-such-cluster", "-p", "x.json"], "no cluster preset named 'no-such-cluster'"),
        (["place", GNMT, "--algo", "no-such-algo", "--output", "x.json"], "no placer named 'no-such-algo'"),
    ],
)
def test_bad_input_is_one_clear_line(args, needle, tmp_path):
    proc = run_cli(*args, check=False)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3


def test_cyclic_graph_names_the_cycle_and_writes_nothing(tmp_path):
    graph = {
        "format": "devplace-graph", "version": 1, "device_kinds": ["gpu"],
        "ops": {"name": ["a", "b", "c"], "compute_us": {"gpu": [1, 1, 1]}},
        "edges": {"src": ["a", "b", "c"], "dst": ["b", "c", "b"]},
    }
    path = tmp_path / "cyclic.json"
    path.write_text(json.dumps(graph))
    out = tmp_path / "placement.json"
    proc = run_cli("place", str(path), "-c", "baechi-4x2080", "--algo", "single", "--output", str(out), check=False)
    assert proc.returncode == 2 and "cycle" in proc.stderr and "'b'" in proc.stderr and "'c'" in proc.stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [path]


def test_simulate_refuses_a_placement_for_another_graph(tmp_path):
    placement = tmp_path / "p.json"
    dp.Placement(devices=[0, 0, 0]).save(placement)
    proc = run_cli("simulate", GNMT, "-p", str(placement), check=False)
    assert proc.returncode == 2 and "3 entries but the graph has 192 ops" in proc.stderr


def test_simulate_warns_on_stderr_when_a_placement_splits_a_colocation_group(tmp_path):
    graph = dp.load_graph(GNMT)
    split = tmp_path / "split.json"
    dp.Placement(devices=[i % 2 for i in range(graph.n_ops)]).save(split, graph)
    proc = run_cli("simulate", GNMT, "-p", str(split), "--json")
    assert json.loads(proc.stdout)["step_time_us"] > 0  # still simulated, stdout still one JSON object
    warning = [line for line in proc.stderr.splitlines() if "warning:" in line]
    assert len(warning) == 1 and "splits colocation group" in warning[0] and "more" in warning[0]
    whole = tmp_path / "whole.json"
    dp.Placement(devices=[0] * graph.n_ops).save(whole, graph)
    assert "warning" not in run_cli("simulate", GNMT, "-p", str(whole), "--json").stderr


def test_compare_writes_report_and_json_rows(tmp_path):
    out = tmp_path / "report"
    rows = json.loads(run_cli("compare", GNMT, "--algos", "single", "--out", str(out), "--json").stdout)
    assert [r["algorithm"] for r in rows] == ["single"]
    assert {"algorithm", "step_time_us", "placement_time_s", "peak_memory_bytes", "oom", "error"} <= set(rows[0])
    assert rows[0]["step_time_us"] == pytest.approx(520453.0)
    for name in ("report.html", "comparison.csv", "comparison.json", "step_times.png", "best_timeline.png",
                 "best_memory.png", "best_placement.png", "best_trace.json"):
        assert (out / name).stat().st_size > 0, name
    assert "best_timeline.png" in (out / "report.html").read_text()


def test_written_files_get_ordinary_permissions(tmp_path):
    from devplace.fileio import write_text_atomic

    path = tmp_path / "x.json"
    write_text_atomic(path, "{}")
    assert path.stat().st_mode & 0o777 == 0o666 & ~_current_umask()


def _current_umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
