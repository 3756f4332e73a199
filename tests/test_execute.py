"""Running placed training steps for real: numbers equal an eager step, faults end cleanly."""

import dataclasses
import inspect
import os
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fault_injection  # noqa: E402  (tests/fault_injection.py: the faults live with the tests)
from devplace.cluster import load_cluster, uniform_cluster  # noqa: E402
from devplace.errors import DevplaceError, PlacementError  # noqa: E402
from devplace.execute import ExecutionError, eager_reference, max_difference, prepare, run  # noqa: E402
from devplace.execute.calibrate import (  # noqa: E402
    LINK_FIGURES, calibrated_cluster, cluster_toml, fit_link, link_programs, refit, spec_from_measurements, synthetic_graph,
    synthetic_program,
)
from devplace.execute.costs import fold_into_hosts, host_ops, instruction_times_us, with_executed_costs  # noqa: E402
from devplace.execute.distributed import run_distributed, run_distributed_many  # noqa: E402
from devplace.execute.local import run_local  # noqa: E402
from devplace.execute.schedule import ANYWHERE, check_against_graph, make_plan  # noqa: E402
from devplace.placement import Placement  # noqa: E402
from devplace.portfolio import place  # noqa: E402
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


def test_output_members_run_on_their_producers_device_and_match_an_eager_step(monkeypatch):
    """The small CNN captured with every output member split off (its pooling indices, batch-norm statistics
    and weight gradients are ops of their own), each member's readers on the other device from its producer:
    the tuple stays where it was computed, each member crosses alone, and the step matches an eager one."""
    from devplace.torchcapture import graph_from_fx

    monkeypatch.setattr(graph_from_fx, "MEMBER_MIN_BYTES", 0)
    p = prepare(MODELS["cnn"], repeats=1)
    members = [i for i in range(p.graph.n_ops) if p.graph.kinds[i] == "getitem"]
    assert len(members) >= 3
    devices = np.zeros(p.graph.n_ops, np.int64)
    for i in members:
        devices[[r for r in p.graph.successors(i).tolist() if p.graph.colocation[r] < 0]] = 1
    pl = Placement(devices=devices)
    check_against_graph(p.program, p.graph, pl, cluster_for(p.graph))
    plan = make_plan(p.program, p.graph, pl, 2)
    sent = {p.program.instrs[j].name for j in plan.sends}
    assert {p.graph.names[i] for i in members} & sent
    assert not {p.graph.names[p.graph.predecessors(i)[0]] for i in members} & sent - {p.graph.names[i] for i in members}
    result = run(None, pl, cluster=cluster_for(p.graph), prepared=p, steps=1, warmup=0)
    worst, error = max_difference(result.outputs, eager_reference(p))
    assert error <= TOLERANCE, f"{worst} differs by {error:.2e}"


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


def test_rank_that_raises_is_named_and_no_process_survives(prepared, monkeypatch):
    p = prepared["mlp"]
    pl = placements(p)["round-robin"]
    plan = make_plan(p.program, p.graph, pl, 2)
    op = next(p.program.instrs[i].name for i in plan.rank_order[1] if p.program.instrs[i].op == "call_function")
    for entry in (run, run_distributed, run_distributed_many):  # production code takes no fault
        assert "fault" not in inspect.signature(entry).parameters
    fault_injection.install(monkeypatch, rank=1, op=op, action="raise")
    with pytest.raises(ExecutionError, match=rf"rank 1 failed at op '{op}'.*fault injected"):
        run_distributed(p.program, plan, p.state, 2, steps=1, warmup=0, timeout_s=30)
    assert children_alive() == []


def test_rank_that_hangs_times_out_and_no_process_survives(prepared, monkeypatch):
    p = prepared["mlp"]
    pl = placements(p)["round-robin"]
    plan = make_plan(p.program, p.graph, pl, 2)
    op = next(p.program.instrs[i].name for i in plan.rank_order[0] if p.program.instrs[i].op == "call_function")
    fault_injection.install(monkeypatch, rank=0, op=op, action="hang", seconds=600)
    started = time.monotonic()
    with pytest.raises(ExecutionError, match=rf"rank 0 hung at op '{op}'"):
        run_distributed(p.program, plan, p.state, 2, steps=1, warmup=0, timeout_s=2)
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


def _op_costs_us(spec):
    """Made-up executed costs for a synthetic program: matrix multiplies by size, the rest by bytes."""
    from devplace.execute.calibrate import _ops

    def cost(target, shape):
        if target is None:
            return 2.0
        return shape[0] ** 3 / 40_000 if target == "aten::mm.default" else 4 + np.prod(shape) / 1e3

    return [cost(target, shape) for _, target, _, shape, _ in _ops(spec)]


def _simulated_measurements(truth: dict, comm_model: str) -> list[dict]:
    """Link program records whose 'measured' steps are simulated on a link with known figures."""
    known = uniform_cluster(2, kind="cpu", comm_model=comm_model, **truth)
    records = []
    for spec in link_programs():
        graph, sides = synthetic_graph(spec, _op_costs_us(spec))
        records.append({"devices": [0, 1], "program": str(spec), "spec": spec, "op_costs_us": _op_costs_us(spec),
                        "measured_us": simulate(graph, known, sides).step_time_us})
    return records


TRUTH = {"latency_us": 80.0, "bandwidth_bytes_per_us": 2000.0, "send_overhead_us": 40.0, "recv_overhead_us": 120.0}


@pytest.mark.parametrize("comm_model", ["duplex", "pipelined"])
def test_link_fit_recovers_known_figures_through_the_simulator(comm_model):
    fit = fit_link(_simulated_measurements(TRUTH, comm_model), comm_model)
    for key in LINK_FIGURES:
        assert fit[key] == pytest.approx(TRUTH[key], rel=0.05), key
    assert fit["median_abs_error"] < 0.01
    # a link with other figures is told apart: nothing here is a constant of the fit
    other = {"latency_us": 20.0, "bandwidth_bytes_per_us": 500.0, "send_overhead_us": 300.0, "recv_overhead_us": 50.0}
    fit = fit_link(_simulated_measurements(other, comm_model), comm_model)
    for key in LINK_FIGURES:
        assert fit[key] == pytest.approx(other[key], rel=0.05), key


def test_calibrated_cluster_toml_loads_back_and_refits_for_another_model(tmp_path):
    device = {"peak_tflops": 0.05, "memory_bandwidth_gbps": 10.0, "op_gap_us": 3.0}
    programs = _simulated_measurements(TRUTH, "pipelined")
    spec, calibration = spec_from_measurements([device, dict(device, op_gap_us=5.0)], programs, 2, "here")
    assert spec["comm_model"] == "duplex" and len(calibration["links"][0]["programs"]) == len(programs)
    measured = calibrated_cluster(spec, calibration)
    path = tmp_path / "here.toml"
    path.write_text(cluster_toml(measured))
    text = path.read_text()
    assert "median |error|" in text and sum(line.startswith("#   ") for line in text.splitlines()) == len(programs)
    cluster = load_cluster(path)
    assert cluster.n_devices == 2 and cluster.op_gap_us == pytest.approx(4.0) and cluster.comm_model == "duplex"
    for key in LINK_FIGURES:  # the fitted figures load back (duplex's fit of pipelined steps: not the truth)
        assert spec["links"]["default"][key] > 0
        assert getattr(cluster, key)[0, 1] == getattr(cluster, key)[1, 0] == pytest.approx(getattr(measured, key)[0, 1])
    # the measurements were made on a pipelined link: refitting for that model finds it, measuring nothing
    pipelined = refit(measured, "pipelined")
    assert pipelined.comm_model == "pipelined" and pipelined.meta["calibration"]["comm_model"] == "pipelined"
    for key in LINK_FIGURES:
        assert getattr(pipelined, key)[0, 1] == pytest.approx(TRUTH[key], rel=0.05), key
    assert pipelined.meta["calibration"]["links"][0]["median_abs_error"] < 0.01
    with pytest.raises(DevplaceError, match="no calibration measurements"):
        refit(cluster, "pipelined")


def test_cli_calibrate_reports_the_four_link_figures_and_the_fit_error(monkeypatch, tmp_path):
    import json

    from typer.testing import CliRunner

    import devplace.execute.calibrate as calibration
    from devplace.cli import app

    device = {"peak_tflops": 0.05, "memory_bandwidth_gbps": 10.0, "op_gap_us": 3.0}
    programs = _simulated_measurements(TRUTH, "duplex")
    measured = calibrated_cluster(*spec_from_measurements([device] * 2, programs, 2, "x"))
    monkeypatch.setattr(calibration, "calibrate", lambda *args, **kwargs: measured)  # no processes: the report only
    out = CliRunner().invoke(app, ["calibrate", "-o", str(tmp_path / "x.toml")])
    assert out.exit_code == 0, out.output
    line = " ".join(out.output.split())  # the console wraps it
    assert "link latency 80 us, bandwidth 2000 B/us, per message 40 us on the sender and 120 us on the receiver" in line
    assert "median error 0% over 34 synthetic programs" in line
    assert load_cluster(tmp_path / "x.toml").recv_overhead_us[0, 1] == pytest.approx(120.0, rel=0.05)
    out = CliRunner().invoke(app, ["calibrate", "-o", str(tmp_path / "x.toml"), "--json"])
    fit = json.loads(out.output)["fits"][0]
    assert fit["send_overhead_us"] == pytest.approx(40.0, rel=0.05) and len(fit["programs"]) == 34
    assert set(fit["programs"][0]) == {"program", "measured_us", "simulated_us"}


def test_link_programs_run_through_the_executor_with_the_transfers_the_simulator_sees():
    """Each synthetic program runs on one device through the rank interpreter (what its op costs
    are timed by), and split over the pair it makes exactly the transfers its graph has."""
    from devplace.execute.costs import executed_costs_us

    for spec in link_programs(quick=True):
        program, state = synthetic_program(spec, "p: ", seed=3)
        graph, sides = synthetic_graph(spec, prefix="p: ")
        costs = executed_costs_us(program, graph, state, repeats=1, warmup=0)
        assert len(costs) == graph.n_ops and costs.min() > 0, spec
        plan = make_plan(program, graph, Placement(devices=np.where(sides == 0, 1, 2)), 3)
        crossing = {(int(graph.edge_src[e]), int(sides[graph.edge_dst[e]]))
                    for e in range(len(graph.edge_src)) if sides[graph.edge_src[e]] != sides[graph.edge_dst[e]]}
        assert plan.n_transfers == len(crossing) > 0, spec
        assert not plan.recvs[0] and set(plan.recvs[1]) <= {2} and set(plan.recvs[2]) == {1}
    again = synthetic_program(spec, "p: ", seed=3)[1]  # the same values from the same seed
    assert state.keys() == again.keys() and all(torch.equal(state[k], again[k]) for k in state)


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


def write_two_cpu_cluster(path) -> None:
    path.write_text(
        'name = "two"\ncomm_model = "duplex"\n[[devices]]\nkind = "cpu"\ncount = 2\nmemory_gib = 4\n'
        "[links.default]\nlatency_us = 50\nbandwidth_bytes_per_us = 1000\n"
    )


def test_cli_run_prints_measured_and_simulated_step_times(prepared, tmp_path):
    import json
    import subprocess
    import sys

    p = prepared["mlp"]
    placement = placements(p)["round-robin"]
    placement.save(tmp_path / "placement.json", p.graph)
    write_two_cpu_cluster(tmp_path / "two.toml")
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


def test_timeline_of_a_step_has_every_op_wait_and_send_in_place(prepared):
    """Distributed: one interval per executed instruction (graph ops on their placed rank), none
    overlapping on a rank, the waits between them; a wait per cross-device value on its reader."""
    p = prepared["mlp"]
    pl = placements(p)["round-robin"]
    plan = make_plan(p.program, p.graph, pl, 2)
    result = run(None, pl, cluster=cluster_for(p.graph), prepared=p, backend="distributed", steps=1, warmup=0,
                 timeline=True)
    timeline = result.timeline
    ops = [e for e in timeline["ops"] if e["name"] in p.graph.index_of]
    assert sorted(e["name"] for e in ops) == sorted(p.graph.names)
    assert all(e["device"] == pl.devices[p.graph.index_of[e["name"]]] for e in ops)
    for d in range(2):
        ran = [p.program.instrs[i].name for i in plan.rank_order[d]]
        assert sorted(e["name"] for e in timeline["ops"] if e["device"] == d) == sorted(ran)
        busy = sorted((e["start_us"], e["end_us"]) for e in timeline["ops"] + timeline["waits"] if e["device"] == d)
        assert all(0 <= start <= end <= timeline["device_end_us"][d] for start, end in busy)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(busy, busy[1:])), f"rank {d} overlaps"
    received = sorted((name, dst, src) for dst, by_src in enumerate(plan.recvs) for src, events in by_src.items()
                      for name, _ in events)
    assert sorted((e["name"], e["device"], e["peer"]) for e in timeline["waits"]) == received
    sent = sorted((p.program.instrs[i].name, int(plan.home[i]), dst) for i, to in plan.sends.items() for dst, _ in to)
    assert sorted((e["name"], e["device"], e["peer"]) for e in timeline["sends"]) == sent
    assert len(received) == result.n_transfers > 0
    assert timeline["step_time_us"] == max(timeline["device_end_us"]) == result.step_times_us[-1]
    assert result.simulation.step_time_us == result.simulated_step_time_us
    local = run(None, pl, cluster=cluster_for(p.graph), prepared=p, steps=2, warmup=0, timeline=True)
    assert sorted(e["name"] for e in local.timeline["ops"]) == sorted(ins.name for ins in p.program.instrs)
    assert local.timeline["waits"] == [] and local.timeline["step_time_us"] == local.step_times_us[-1]
    assert run(None, pl, cluster=cluster_for(p.graph), prepared=p, steps=1, warmup=0).timeline is None


def test_cli_run_trace_holds_the_simulated_and_the_measured_step(prepared, tmp_path):
    import json
    import subprocess
    import sys

    p = prepared["mlp"]
    placements(p)["round-robin"].save(tmp_path / "placement.json", p.graph)
    write_two_cpu_cluster(tmp_path / "two.toml")
    trace = tmp_path / "trace.json"
    proc = subprocess.run(
        [sys.executable, "-m", "devplace.cli", "run", MODELS["mlp"], "--placement", str(tmp_path / "placement.json"),
         "--cluster", str(tmp_path / "two.toml"), "--backend", "distributed", "--steps", "1", "--warmup", "0",
         "--trace", str(trace)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "trace of the simulated and the last measured step written to" in proc.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(processes.values()) == ["measured", "simulated"]
    for group in ("simulated", "measured"):
        names = [e["name"] for e in events if e["ph"] == "X" and processes[e["pid"]] == group and e["cat"] != "glue"]
        assert set(p.graph.names) <= set(names), group
    waits = [e["name"] for e in events if e["ph"] == "X" and e["cat"] == "wait"]
    plan = make_plan(p.program, p.graph, placements(p)["round-robin"], 2)
    assert len(waits) == plan.n_transfers > 0 and all(" from cpu" in name for name in waits)


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


def test_local_run_simulates_the_execution_it_measures(prepared):
    """On CPUs the local backend runs every op in turn on one thread and copies nothing, so its
    simulated step is every op on one device, whatever the links cost; on GPUs the devices overlap
    and no message pays a per-message overhead (local.as_executed)."""
    from devplace.execute.local import as_executed

    p = prepared["mlp"]
    pl = placements(p)["round-robin"]
    slow = uniform_cluster(2, kind=p.graph.device_kinds[0], latency_us=500.0, bandwidth_bytes_per_us=10.0,
                           send_overhead_us=400.0, recv_overhead_us=400.0)
    result = run(None, pl, cluster=slow, prepared=p, steps=1, warmup=0)
    one_thread = simulate(p.graph, p.simulation_cluster(slow), [0] * p.graph.n_ops).step_time_us
    assert result.simulated_step_time_us == pytest.approx(one_thread)
    assert simulate(p.graph, p.simulation_cluster(slow), pl).step_time_us > 2 * one_thread  # what it printed before
    assert "one CPU thread" in result.to_dict()["simulated_as"]
    cluster, placement, said = as_executed(slow, pl, [torch.device("cuda", 0), torch.device("cuda", 1)])
    assert placement is pl and "without per-message overheads" in said
    assert not cluster.send_overhead_us.any() and not cluster.recv_overhead_us.any()
    assert (cluster.latency_us == slow.latency_us).all()


def test_a_placement_of_the_default_foreach_capture_runs_on_the_per_parameter_step(prepared):
    """`devplace place` captures foreach updates; the executor runs per-parameter ones: forward and
    backward ops keep their devices, each update op follows its parameter, and the step runs."""
    from devplace.execute.schedule import carried_over
    from devplace.graph import Role
    from devplace.torchcapture import capture

    p = prepared["mlp"]
    foreach = capture(p.model, p.example_inputs, p.loss_fn, optimizer=p.optimizer, update="foreach",
                      cost="roofline", cluster=load_cluster("8xh100-nvlink"), targets=p.targets, progress=False)
    assert foreach.n_ops != p.graph.n_ops
    c = load_cluster("8xh100-nvlink").with_devices(2)
    made = place(foreach, c, algo="round-robin")
    carried = carried_over(made, p.graph, foreach)
    same = {n: d for n, d, r in zip(foreach.names, made.devices, foreach.role) if r != Role.UPDATE}
    for name, device, role in zip(p.graph.names, carried.devices, p.graph.role):
        if role != Role.UPDATE and name in same:
            assert device == same[name], name
    assert carried.colocation_violations(p.graph) == []
    assert carried_over(made, p.graph, p.graph) is None  # made on another graph: not carried
    made.device_names = cluster_for(p.graph).device_names  # run on this machine's CPUs
    result = run(p, made, cluster=cluster_for(p.graph), steps=1, warmup=0)
    assert np.isfinite(result.loss)
