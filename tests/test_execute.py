"""Running placed training steps for real: numbers equal an eager step, faults end cleanly."""

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from devplace.cluster import load_cluster, uniform_cluster  # noqa: E402
from devplace.errors import PlacementError  # noqa: E402
from devplace.execute import ExecutionError, eager_reference, max_difference, prepare, run  # noqa: E402
from devplace.execute.calibrate import cluster_toml, fit_link, spec_from_measurements  # noqa: E402
from devplace.execute.costs import fold_into_hosts, host_ops, instruction_times_us, with_executed_costs  # noqa: E402
from devplace.execute.distributed import run_distributed, run_distributed_many  # noqa: E402
from devplace.execute.local import run_local  # noqa: E402
from devplace.execute.schedule import ANYWHERE, check_against_graph, make_plan  # noqa: E402
from devplace.placement import Placement  # noqa: E402
from devplace.placers import place  # noqa: E402
from devplace.sim import simulate  # noqa: E402

MODELS = {
    "mlp": "zoo:mlp:preset=small",
    "cnn": "zoo:small_cnn:preset=small",
    "gnmt": "zoo:gnmt:preset=small,layers=2,seq_len=3",
}
ALGOS = ("single", "round-robin", "m-etf")
# float32 ops reordered across devices; Adam divides by sqrt(v), so allow a little more than eps
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def prepared():
    return {name: prepare(target, repeats=1) for name, target in MODELS.items()}


def cluster_for(graph, n=2):
    return uniform_cluster(n, kind=graph.device_kinds[0], latency_us=50.0, bandwidth_bytes_per_us=1000.0)


def placements(p):
    c = cluster_for(p.graph)
    return {algo: place(p.graph, c, algo=algo, seed=0) for algo in ALGOS}


def params_apart(p):
    """Parameters, their state, updates and views on device 0, all other ops on device 1: views of
    weights are sent to device 1, and device 0 updates the weights in place while the backward pass
    on device 1 may not have taken them yet (the send must not read the updated storage)."""
    owners = {name for name, kind in p.program.placeholder_kinds.items() if kind == "param"}
    on_owner = [p.graph.colocation[i] >= 0 or p.program.storage.get(name) in owners for i, name in enumerate(p.graph.names)]
    return Placement(devices=np.where(on_owner, 0, 1))


def children_alive() -> list[int]:
    """PIDs of live processes whose parent is this test process (ranks left behind)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] not in ("Z", "X"):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "resource_tracker" not in cmdline:  # multiprocessing's helper, shared, lives with us
                alive.append(int(entry.name))
    return alive


@pytest.mark.parametrize("model", list(MODELS))
def test_local_backend_matches_an_eager_step(prepared, model):
    p = prepared[model]
    reference = eager_reference(p)
    for algo, pl in placements(p).items():
        result = run(None, pl, cluster=cluster_for(p.graph), prepared=p, steps=1, warmup=0)
        worst, error = max_difference(result.outputs, reference)
        assert error <= TOLERANCE, f"{model}/{algo}: {worst} differs by {error:.2e}"
        assert (result.n_transfers > 0) == (len(np.unique(pl.devices)) > 1)
        assert set(reference) <= set(result.outputs)


def test_distributed_backend_matches_an_eager_step(prepared):
    """All models x placements in one set of two processes (one start-up)."""
    jobs, labels = [], []
    for model, p in prepared.items():
        for algo, pl in {**placements(p), "params-apart": params_apart(p)}.items():
            check_against_graph(p.program, p.graph, pl, cluster_for(p.graph))
            jobs.append((p.program, make_plan(p.program, p.graph, pl, 2), p.state))
            labels.append((model, algo))
    results = run_distributed_many(jobs, 2, steps=1, warmup=0, timeout_s=60)
    for (model, algo), (outputs, times) in zip(labels, results):
        worst, error = max_difference(outputs, eager_reference(prepared[model]))
        assert error <= TOLERANCE, f"{model}/{algo}: {worst} differs by {error:.2e}"
        assert len(times) == 1 and times[0] > 0
    assert children_alive() == []


def test_multi_step_run_keeps_training(prepared):
    """Parameters are updated in place on their device, so a second step starts from the first's."""
    p = prepared["mlp"]
    pl = placements(p)["m-etf"]
    plan = make_plan(p.program, p.graph, pl, 2)
    state = {k: v.clone() for k, v in p.state.items()}
    run_local(p.program, plan, state, [torch.device("cpu")] * 2, steps=2, warmup=0)
    name = next(n for n, kind in p.program.placeholder_kinds.items() if kind == "param")
    assert not torch.equal(state[name], p.state[name])


def test_plan_cannot_deadlock(prepared):
    """Replay each rank's order with blocking receives posted in the plan's order: all finish."""
    p = prepared["gnmt"]
    pl = Placement(devices=np.random.default_rng(3).integers(0, 3, p.graph.n_ops))
    plan = make_plan(p.program, p.graph, pl, 3)
    sent: set[tuple[int, int]] = set()  # (tag, dst) posted
    position = [0, 0, 0]
    have = [set() for _ in range(3)]
    index = p.program.index
    while any(position[r] < len(plan.rank_order[r]) for r in range(3)):
        progressed = False
        for r in range(3):
            while position[r] < len(plan.rank_order[r]):
                i = plan.rank_order[r][position[r]]
                ins = p.program.instrs[i]
                remote = [n for n in ins.inputs if plan.home[index[n]] not in (r, ANYWHERE) and n not in have[r]]
                ok = True
                for n in remote:
                    src = int(plan.home[index[n]])
                    tag = next(t for name, t in plan.recvs[r][src] if name == n)
                    if (tag, r) not in sent:
                        ok = False
                        break
                    have[r].add(n)
                if not ok:
                    break
                for dst, tag in plan.sends.get(i, []):
                    sent.add((tag, dst))
                position[r] += 1
                progressed = True
        assert progressed, f"ranks stuck at {position}"
    tags = sorted(t for sends in plan.sends.values() for _, t in sends)
    assert tags == list(range(plan.n_transfers)) and plan.n_transfers > 10


def test_rank_that_raises_is_named_and_no_process_survives(prepared):
    p = prepared["mlp"]
    pl = placements(p)["round-robin"]
    plan = make_plan(p.program, p.graph, pl, 2)
    op = next(p.program.instrs[i].name for i in plan.rank_order[1] if p.program.instrs[i].op == "call_function")
    with pytest.raises(ExecutionError, match=rf"rank 1 failed at op '{op}'.*fault injected"):
        run_distributed(p.program, plan, p.state, 2, steps=1, warmup=0, timeout_s=30,
                        fault={"rank": 1, "op": op, "action": "raise"})
    assert children_alive() == []


def test_rank_that_hangs_times_out_and_no_process_survives(prepared):
    p = prepared["mlp"]
    pl = placements(p)["round-robin"]
    plan = make_plan(p.program, p.graph, pl, 2)
    op = next(p.program.instrs[i].name for i in plan.rank_order[0] if p.program.instrs[i].op == "call_function")
    started = time.monotonic()
    with pytest.raises(ExecutionError, match=rf"rank 0 hung at op '{op}'"):
        run_distributed(p.program, plan, p.state, 2, steps=1, warmup=0, timeout_s=2,
                        fault={"rank": 0, "op": op, "action": "hang", "seconds": 600})
    assert time.monotonic() - started < 60
    assert children_alive() == []


def test_placement_for_another_graph_is_refused_before_starting(prepared):
    p = prepared["mlp"]
    c = cluster_for(p.graph)
    with pytest.raises(PlacementError, match="the graph has"):
        run(None, [0] * (p.graph.n_ops + 1), cluster=c, prepared=p, backend="distributed")
    other = prepared["cnn"]
    with pytest.raises(PlacementError, match="not in the traced step"):
        check_against_graph(p.program, other.graph, Placement(devices=np.zeros(other.graph.n_ops, int)), c)
    assert children_alive() == []


def test_placement_splitting_a_parameter_from_its_update_is_refused(prepared):
    p = prepared["mlp"]
    devices = np.zeros(p.graph.n_ops, dtype=np.int64)
    members = next(m for m in p.graph.colocation_members if len(m) > 1)
    devices[members[0]] = 1
    with pytest.raises(PlacementError, match="colocation group"):
        run(None, devices, cluster=cluster_for(p.graph), prepared=p)


def test_link_fit_recovers_latency_and_bandwidth():
    rng = np.random.default_rng(0)
    sizes = [4096, 65536, 1 << 20, 1 << 24]
    samples = [(s, 120.0 + s / 800.0 + rng.normal(0, 0.5)) for s in sizes]
    fit = fit_link(samples)
    assert fit["latency_us"] == pytest.approx(120.0, abs=2.0)
    assert fit["bandwidth_bytes_per_us"] == pytest.approx(800.0, rel=0.01)
    assert fit["r2"] > 0.999


def test_calibrated_cluster_toml_loads_back(tmp_path):
    device = {"peak_tflops": 0.05, "memory_bandwidth_gbps": 10.0, "op_gap_us": 3.0}
    link = [(4096, 105.0), (1 << 20, 100.0 + (1 << 20) / 1000.0)]
    done = {0: (device, {(0, 1): link}), 1: (dict(device, op_gap_us=5.0), {})}
    spec, calibration = spec_from_measurements(done, 2, "here")

    class Measured:
        meta = {"calibration_spec": spec, "calibration": calibration}

    path = tmp_path / "here.toml"
    path.write_text(cluster_toml(Measured()))
    cluster = load_cluster(path)
    assert cluster.n_devices == 2 and cluster.op_gap_us == pytest.approx(4.0) and cluster.comm_model == "duplex"
    assert cluster.transfer_us(0, 1, 1 << 20) == pytest.approx(100.0 + (1 << 20) / 1000.0, rel=1e-3)


def test_views_of_updated_weights_are_copied_before_sending(prepared):
    """A send completes asynchronously; a view of a weight that its own device later updates in
    place must be copied when sent, or the peer may read the updated weight (seen with m-ETF)."""
    p = prepared["cnn"]
    written = p.program.written
    params = [name for name, kind in p.program.placeholder_kinds.items() if kind == "param"]
    views = [ins.name for ins in p.program.instrs if p.program.storage.get(ins.name) in params and ins.op == "call_function"]
    assert set(params) <= written and views and set(views) <= written
    forward_only = [ins.name for ins in p.program.instrs if ins.target.startswith("aten::convolution.")]
    assert forward_only and not set(forward_only) & written


def test_cli_run_prints_measured_and_simulated_step_times(prepared, tmp_path):
    import json
    import subprocess
    import sys

    p = prepared["mlp"]
    placement = placements(p)["round-robin"]
    placement.save(tmp_path / "placement.json", p.graph)
    (tmp_path / "two.toml").write_text(
        'name = "two"\ncomm_model = "duplex"\n[[devices]]\nkind = "cpu"\ncount = 2\nmemory_gib = 4\n'
        "[links.default]\nlatency_us = 50\nbandwidth_bytes_per_us = 1000\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "devplace.cli", "run", MODELS["mlp"], "--placement", str(tmp_path / "placement.json"),
         "--cluster", str(tmp_path / "two.toml"), "--steps", "2", "--check", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["measured_step_time_us"] > 0 and data["simulated_step_time_us"] > 0
    assert len(data["step_times_us"]) == 2 and data["transfers_per_step"] > 0
    assert data["check"]["max_relative_difference"] <= TOLERANCE
    bad = subprocess.run(
        [sys.executable, "-m", "devplace.cli", "run", MODELS["cnn"], "--placement", str(tmp_path / "placement.json"),
         "--cluster", str(tmp_path / "two.toml")],
        capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2 and "made for another graph" in bad.stderr


def test_link_fit_reads_bursts_as_the_communication_model_does():
    sizes = [4096, 65536, 1 << 20]
    # pipelined: a burst of k messages costs latency + k * bytes / bandwidth
    samples = [(s, 300.0 + s / 500.0, 1) for s in sizes] + [(s, 300.0 + 16 * s / 500.0, 16) for s in sizes]
    fit = fit_link(samples, "pipelined")
    assert fit["latency_us"] == pytest.approx(300.0, rel=1e-6)
    assert fit["bandwidth_bytes_per_us"] == pytest.approx(500.0, rel=1e-6)
    assert fit["messages"] == [1, 1, 1, 16, 16, 16]
    # duplex: k * (latency + bytes / bandwidth); the pipelined samples read this way give a lower latency
    samples = [(s, 300.0 + s / 500.0, 1) for s in sizes] + [(s, 16 * (300.0 + s / 500.0), 16) for s in sizes]
    fit = fit_link(samples, "duplex")
    assert fit["latency_us"] == pytest.approx(300.0, rel=1e-6)
    assert fit["bandwidth_bytes_per_us"] == pytest.approx(500.0, rel=1e-6)


def test_glue_is_costed_on_the_op_whose_device_runs_it(prepared):
    p = prepared["gnmt"]
    host = host_ops(p.program, p.graph)
    glue = [ins.name for ins in p.program.instrs if ins.name not in p.graph.index_of]
    assert glue and all(name in host for name in glue if not name.startswith("_record_function"))
    devices = np.random.default_rng(1).integers(0, 2, p.graph.n_ops)
    plan = make_plan(p.program, p.graph, Placement(devices=devices), 2)
    for name, op in host.items():  # glue runs where its host op runs (constants' glue: everywhere)
        assert plan.home[p.program.index[name]] in (devices[op], ANYWHERE), name
    assert sum(plan.home[p.program.index[name]] == ANYWHERE for name in glue) < len(glue) / 2
    times = {ins.name: 1.0 for ins in p.program.instrs}
    costs = fold_into_hosts(times, p.program, p.graph)
    assert costs.sum() == len(host) > len(p.graph.names) and costs.min() >= 1.0  # own time, hosts their glue's too


def test_executed_costs_time_the_interpreter_and_drop_the_op_gap(prepared):
    p = prepared["mlp"]
    times = instruction_times_us(p.program, p.graph, p.state, repeats=2, warmup=1)
    assert set(times) == {ins.name for ins in p.program.instrs} and min(times.values()) >= 0
    calls = [ins.name for ins in p.program.instrs if ins.op == "call_function" and ins.name in p.graph.index_of]
    assert all(times[name] > 0 for name in calls)
    executed = dataclasses.replace(p, graph=with_executed_costs(p.graph, p.program, p.state, repeats=2, warmup=1),
                                   cost="executed")
    assert executed.graph.meta["cost_model"].startswith("executed")
    c = dataclasses.replace(cluster_for(p.graph), op_gap_us=7.0)
    assert executed.simulation_cluster(c).op_gap_us == 0.0 and p.simulation_cluster(c).op_gap_us == 7.0
    single = simulate(executed.graph, executed.simulation_cluster(c), [0] * p.graph.n_ops).step_time_us
    assert single == pytest.approx(executed.graph.compute_us[:, 0].sum())
