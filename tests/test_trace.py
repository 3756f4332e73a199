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
