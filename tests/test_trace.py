"""Chrome trace export: valid JSON that Perfetto can open, one slice per op and per transfer."""

import json

import numpy as np

import devplace as dp
from devplace.cluster import uniform_cluster
from devplace.io import dnn_partitioning
from devplace.sim import chrome_trace, simulate, write_chrome_trace


def test_trace_has_one_slice_per_op_and_transfer_and_loads_back(tmp_path):
    g = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    c = dnn_partitioning.cluster_for(g)
    devices = np.arange(g.n_ops, dtype=np.int64) * c.n_devices // g.n_ops  # contiguous blocks
    r = simulate(g, c, devices)
    assert len(r.transfer_op) > 0
    path = tmp_path / "trace.json"
    write_chrome_trace(r, path)
    data = json.loads(path.read_text())
    assert data == json.loads(json.dumps(chrome_trace(r)))
    events = data["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    ops = [e for e in slices if e["tid"] == 0]
    transfers = [e for e in slices if e["cat"] == "transfer"]
    assert len(slices) == g.n_ops + len(r.transfer_op)
    assert len(ops) == g.n_ops and len(transfers) == len(r.transfer_op)
    assert sorted(e["name"] for e in ops) == sorted(g.names)
    by_name = {e["name"]: e for e in ops}
    for i in (0, g.n_ops // 2, g.n_ops - 1):
        e = by_name[g.names[i]]
        assert e["pid"] == devices[i] and e["ts"] == r.start_us[i]
        assert e["dur"] == r.finish_us[i] - r.start_us[i]
    assert max(e["ts"] + e["dur"] for e in slices) == r.step_time_us
    assert sum(e["args"]["bytes"] for e in transfers) == r.bytes_moved
    assert data["otherData"]["step_time_us"] == r.step_time_us
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {f"{d} (gpu)" for d in c.device_names}


def test_memory_counters_follow_the_timeline(tmp_path):
    b = dp.GraphBuilder(["gpu"])
    b.add_op("a", compute_us=10, output_bytes=100, persistent_bytes=7)
    b.add_op("b", compute_us=5, temp_bytes=3)
    b.add_edge("a", "b", bytes=100)
    g = b.build()
    r = simulate(g, uniform_cluster(2, latency_us=1, bandwidth_bytes_per_us=10), [0, 1])
    counters = [e for e in chrome_trace(r)["traceEvents"] if e["ph"] == "C"]
    per_device = {d: [(e["ts"], e["args"]["bytes"]) for e in counters if e["pid"] == d] for d in (0, 1)}
    assert per_device[0] == [(0, 7), (0, 107), (21, 7)]  # a's output held until the send ends at 21
    assert per_device[1] == [(10, 100), (21, 103), (26, 100), (26, 0)]  # b ends: temp, then copy
    write_chrome_trace(r, tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_measured_timeline_sits_beside_the_simulated_schedule(tmp_path):
    b = dp.GraphBuilder(["gpu"])
    b.add_op("a", compute_us=10, output_bytes=100)
    b.add_op("b", compute_us=5)
    b.add_edge("a", "b", bytes=100)
    r = simulate(b.build(), uniform_cluster(2, latency_us=1, bandwidth_bytes_per_us=10), [0, 1])
    measured = {  # as RunResult.timeline holds it: "getitem" is glue the graph leaves out
        "ops": [{"name": "a", "device": 0, "start_us": 1.0, "end_us": 14.0},
                {"name": "getitem", "device": 1, "start_us": 2.0, "end_us": 3.0},
                {"name": "b", "device": 1, "start_us": 40.0, "end_us": 47.0}],
        "waits": [{"name": "a", "device": 1, "peer": 0, "start_us": 4.0, "end_us": 39.0}],
        "sends": [{"name": "a", "device": 0, "peer": 1, "start_us": 14.5, "end_us": 15.0}],
        "device_end_us": [16.0, 48.0], "step_time_us": 48.0,
    }
    path = tmp_path / "both.json"
    write_chrome_trace(r, path, measured=measured)
    data = json.loads(path.read_text())
    assert data == json.loads(json.dumps(chrome_trace(r, measured)))
    events = data["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(processes.values()) == ["measured", "simulated"]
    rows = {(processes[e["pid"]], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    slices = [(processes[e["pid"]], rows[processes[e["pid"]], e["tid"]], e["name"], e["ts"], e["dur"])
              for e in events if e["ph"] == "X"]
    assert sorted(slices) == [
        ("measured", "gpu0 compute", "a", 1.0, 13.0),
        ("measured", "gpu0 send", "a to gpu1", 14.5, 0.5),
        ("measured", "gpu1 compute", "b", 40.0, 7.0),
        ("measured", "gpu1 compute", "getitem", 2.0, 1.0),
        ("measured", "gpu1 receive", "a from gpu0", 4.0, 35.0),
        ("simulated", "gpu0 compute", "a", 0.0, 10.0),
        ("simulated", "gpu1 compute", "b", 21.0, 5.0),
        ("simulated", "gpu1 receive", "a from gpu0", 10.0, 11.0),
    ]
    measured_b = next(e for e in events if e["ph"] == "X" and processes[e["pid"]] == "measured" and e["name"] == "b")
    assert measured_b["cat"] == "forward" and measured_b["args"]["simulated_start_us"] == 21.0
    counters = {(processes[e["pid"]], e["name"]) for e in events if e["ph"] == "C"}
    assert counters == {("simulated", "memory gpu0"), ("simulated", "memory gpu1")}
    assert data["otherData"]["measured_step_time_us"] == 48.0 and data["otherData"]["step_time_us"] == r.step_time_us
