"""``run``: execute a captured training step under a placement and compare with the simulator.

>>> import devplace as dp
>>> r = dp.run("zoo:mlp:preset=small", [0] * n_ops, cluster=c)      # doctest: +SKIP
>>> r.measured_step_time_us, r.simulated_step_time_us                # doctest: +SKIP
>>> r = dp.run("zoo:mlp:preset=small", [0] * n_ops, cluster=c, timeline=True)  # doctest: +SKIP
>>> dp.sim.write_chrome_trace(r.simulation, "step.json", measured=r.timeline)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from devplace.errors import DevplaceError
from devplace.execute.local import as_executed, median, parse_devices, run_local
from devplace.execute.program import ExecutionError, Program
from devplace.execute.schedule import carried_over, check_against_graph, make_plan

BACKENDS = ("local", "distributed")


@dataclass
class Prepared:
    """A captured step ready to run: its graph (op costs), program and initial values."""

    graph: object
    program: Program
    state: dict  # placeholder name -> initial tensor
    model: torch.nn.Module
    example_inputs: tuple
    targets: tuple
    loss_fn: object
    optimizer: str
    cost: str = "measured"  # "executed": times include the executor's per-op cost (simulate with no op gap)

    def simulation_cluster(self, cluster):
        """The cluster to simulate this step on: without ``op_gap_us`` when the costs already hold it."""
        if self.cost == "executed" and cluster.op_gap_us:
            import dataclasses

            return dataclasses.replace(cluster, op_gap_us=0.0)
        return cluster


def prepare(target, *, cost: str = "measured", optimizer: str = "adam", repeats: int = 5) -> Prepared:
    """Capture ``target`` (a ``zoo:``/``file.py:fn`` string or a zoo model) once, keeping its trace.

    ``cost``: a capture cost model, or ``executed``: every op timed as this executor runs it, glue
    included (costs.py), which is what a run on this machine's CPUs is compared against."""
    from devplace.execute.costs import EXECUTED_COST, with_executed_costs

    from devplace.torchcapture import capture
    from devplace.torchcapture.targets import load_target

    if isinstance(target, str):
        model, example_inputs, loss_fn, targets = load_target(target)
    else:
        model, example_inputs, loss_fn, targets = target.model, target.example_inputs, target.loss_fn, target.targets
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # op times as a one-thread device sees them (see distributed.py)
    try:
        # per-parameter updates: the executor tracks in-place writes through the tensor an op
        # returns, which multi-tensor (foreach/fused) ops do not
        graph, traced = capture(model, example_inputs, loss_fn, optimizer=optimizer, update="per-parameter",
                                cost="measured" if cost == EXECUTED_COST else cost, targets=targets,
                                repeats=1 if cost == EXECUTED_COST else repeats, progress=False, return_trace=True)
    finally:
        torch.set_num_threads(threads)
    program = Program.from_traced(traced)
    placeholders = [n.name for n in traced.gm.graph.nodes if n.op == "placeholder"]
    values = traced.real_args(model, example_inputs, targets)
    state = dict(zip(placeholders, values))
    if cost == EXECUTED_COST:
        graph = with_executed_costs(graph, program, state, repeats=repeats)
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    return Prepared(graph, program, state, model, tuple(inputs), tuple(targets), loss_fn, traced.optimizer, cost)


@dataclass
class RunResult:
    backend: str
    n_devices: int
    measured_step_time_us: float
    simulated_step_time_us: float
    step_times_us: list[float]
    loss: float
    n_transfers: int
    outputs: dict = field(default_factory=dict, repr=False)  # loss, param:NAME, grad:NAME (CPU tensors)
    simulation: object = field(default=None, repr=False)  # the SimResult the simulated time comes from
    # with run(timeline=True), the last measured step: {"ops", "waits", "sends"} lists of dicts with name,
    # device, start_us, end_us (waits and sends: peer too) from the step's start, "device_end_us" (when
    # each device's part ended) and "step_time_us"; distributed: each rank's times from its own start
    timeline: dict | None = field(default=None, repr=False)
    # what the simulated figure is the simulation of: the same execution as the measured one
    simulated_as: str = ""

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "n_devices": self.n_devices,
            "measured_step_time_us": self.measured_step_time_us,
            "simulated_step_time_us": self.simulated_step_time_us,
            "relative_error": (self.simulated_step_time_us - self.measured_step_time_us) / self.measured_step_time_us,
            "simulated_as": self.simulated_as,
            "step_times_us": self.step_times_us,
            "loss": self.loss,
            "transfers_per_step": self.n_transfers,
        }


def _from_default_capture(placement, prepared: Prepared):
    """A placement made on the step's default capture (foreach updates, what `devplace place`
    places) carried over to the per-parameter graph the executor runs; else unchanged (and refused
    by the checks that follow, with the way to make a matching one)."""
    from devplace.cluster import load_cluster
    from devplace.torchcapture import capture

    any_gpus = load_cluster("8xh100-nvlink")  # only the op names matter here, not their times
    for update in ("foreach", "fused"):
        placed_graph = capture(prepared.model, prepared.example_inputs, prepared.loss_fn, optimizer=prepared.optimizer,
                               update=update, cost="roofline", cluster=any_gpus, targets=prepared.targets,
                               progress=False)
        carried = carried_over(placement, prepared.graph, placed_graph)
        if carried is not None:
            return carried
    return placement


def run(target, placement, *, cluster=None, backend: str = "local", steps: int = 5, warmup: int = 1,
        devices: list[str] | None = None, timeout_s: float = 60.0, prepared: Prepared | None = None,
        timeline: bool = False) -> RunResult | None:
    """Run the training step of ``target`` with every op on its placed device.

    ``placement``: a Placement, a placement file path, or one device index per graph op.
    ``cluster``: the cluster to simulate on (default: ``n`` devices of this machine's kind with a
    quick calibration of its links). ``backend``: ``local`` (one process, ``devices`` are torch
    devices) or ``distributed`` (one process per device). Returns measured (median over ``steps``
    after ``warmup``) and simulated step times of the same execution (``simulated_as`` says which:
    the local backend pays no messages, and on CPUs runs every op on one thread, local.as_executed),
    and the first step's loss, gradients and parameters;
    ``timeline``: also record the last step's timeline (``RunResult.timeline``), for
    ``devplace.sim.write_chrome_trace(result.simulation, path, measured=result.timeline)``; that step
    is still one of the measured ones, a few percent slower for the recording (~0.2 us per instruction).
    Under ``torchrun`` the distributed backend runs this process's rank; ranks other than 0 return None.
    """
    from devplace.placement import Placement, as_placement
    from devplace.sim import simulate

    if backend not in BACKENDS:
        raise DevplaceError(f"unknown backend {backend!r}: use local or distributed")
    if steps < 1 or warmup < 0:
        raise DevplaceError("steps must be >= 1 and warmup >= 0")
    prepared = prepared or prepare(target)
    graph, program = prepared.graph, prepared.program
    if isinstance(placement, (str,)) or hasattr(placement, "__fspath__"):
        placement = Placement.load(placement)
    if isinstance(placement, Placement) and len(placement) != graph.n_ops:
        placement = _from_default_capture(placement, prepared)
    placement = as_placement(placement, graph)
    n_devices = int(placement.devices.max()) + 1 if len(placement) else 1
    if cluster is None and backend == "distributed":
        from devplace.execute.distributed import under_torchrun

        if under_torchrun():
            raise DevplaceError("under torchrun give --cluster (a TOML from `devplace calibrate` or a preset)")
    if cluster is None:
        from devplace.execute.calibrate import calibrate

        cluster = calibrate(n_devices=max(n_devices, 2), quick=True)
    elif isinstance(cluster, str):
        from devplace.cluster import load_cluster

        cluster = load_cluster(cluster)
    n_devices = cluster.n_devices
    check_against_graph(program, graph, placement, cluster)
    plan = make_plan(program, graph, placement, n_devices)
    state = {k: v.clone() for k, v in prepared.state.items()}
    if backend == "local":
        torch_devices = parse_devices(devices or [], n_devices)
        simulated = as_executed(prepared.simulation_cluster(cluster), placement, torch_devices)
        done = run_local(program, plan, state, torch_devices, steps=steps, warmup=warmup, timeline=timeline)
    else:
        from devplace.execute.distributed import run_distributed, run_under_torchrun, under_torchrun

        simulated = (prepared.simulation_cluster(cluster), placement,
                     f"the placement on {cluster.name}, one process per device, messages charged (distributed backend)")
        if under_torchrun():  # every process runs this; rank 0 gathers and reports
            done = run_under_torchrun(program, plan, state, steps=steps, warmup=warmup, devices=devices,
                                      timeline=timeline)
            if done is None:
                return None
        else:
            done = run_distributed(program, plan, state, n_devices, steps=steps, warmup=warmup,
                                   timeout_s=timeout_s, devices=devices, timeline=timeline)
    simulation = simulate(graph, *simulated[:2])
    outputs, times = done[:2]
    if "loss" not in outputs:
        raise ExecutionError("the run finished without a loss: this is a bug in the executor")
    return RunResult(backend, n_devices, median(times), float(simulation.step_time_us), times, float(outputs["loss"]),
                     plan.n_transfers, outputs, simulation, done[2] if timeline else None, simulated[2])


def eager_reference(prepared: Prepared) -> dict:
    """One plain eager training step on one device: ``loss`` and ``param:NAME`` (the check's truth)."""
    model = copy.deepcopy(prepared.model)
    model.train()
    params = [p for _, p in model.named_parameters()]
    optimizer = {
        "adam": lambda: torch.optim.Adam(params, foreach=False),
        "adamw": lambda: torch.optim.AdamW(params, foreach=False),
        "sgd": lambda: torch.optim.SGD(params, lr=1e-2, foreach=False),
    }.get(prepared.optimizer)
    opt = optimizer() if optimizer else None
    loss = prepared.loss_fn(model(*prepared.example_inputs), *prepared.targets)
    loss.backward()
    out = {"loss": loss.detach().clone()}
    for name, p in model.named_parameters():
        out[f"grad:{name}"] = p.grad.detach().clone()
    if opt is not None:
        opt.step()
    for name, p in model.named_parameters():
        out[f"param:{name}"] = p.detach().clone()
    return out


def max_difference(result: dict, reference: dict) -> tuple[str, float]:
    """The output that differs most from the reference (relative to its scale) and by how much."""
    worst, worst_err = "", 0.0
    for key, ref in reference.items():
        if key not in result:
            return key, float("inf")
        got = result[key].to(ref.dtype).reshape(ref.shape)
        err = float((got - ref).abs().max() / (ref.abs().max() + 1e-6)) if ref.numel() else 0.0
        if err > worst_err or not np.isfinite(err):
            worst, worst_err = key, err
    return worst, worst_err
