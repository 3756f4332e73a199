"""Measuring this machine's devices and links into a cluster that ``place`` and ``simulate`` accept.

Devices are one-thread CPU processes joined by gloo, as the distributed executor runs them.

- op speed per device: a matrix multiply gives ``peak_tflops``, a large elementwise add gives
  ``memory_bandwidth_gbps`` (what capture's roofline model reads);
- the executor's own cost per op, ``op_gap_us``: a chain of tiny ops run through the same
  interpreter, minus the ops' bare time;
- every device pair's link, as four figures: ``latency_us``, ``bandwidth_bytes_per_us`` and the
  device time each message costs its sender and its receiver, ``send_overhead_us`` and
  ``recv_overhead_us`` (posting isend/irecv, gloo's transport threads taking the ranks' cores,
  waking a waiting rank). In a split step those costs land on busy ranks, where no timing of an
  idle link shows them (BENCHMARKS.md, "Execution fidelity"), so the figures are fitted with the
  simulator in the loop. Synthetic programs over the pair run for real, all in one launch: hop
  chains (one message at a time, 256 B-4 MiB), bursts (16 messages in flight) and busy exchanges
  (a chain of matrix multiplies on each device, swapping rows every 1, 3 or 8 multiplies, used at
  once or a period later). Each op is costed as the executor runs it on one device
  (``executed_costs_us``), and least squares on log(simulated / measured) picks the four figures
  for which ``simulate`` (the asked ``comm_model``, ``op_gap_us`` 0) gives the measured median
  steps. The fit's median error over its own programs is reported beside them: what the figures
  cannot absorb, such as a message between two computing ranks costing several times what it
  costs between idle ones (gloo's transport threads wait for a core).

Duplex is the default comm model: it is what the placers plan with, and pipelined did not predict
real steps consistently better (BENCHMARKS.md, "Execution fidelity").

Device figures are the fastest of their repeats (what an op costs; on a shared machine slower
repeats time other processes' work); program steps are medians, because waiting for the peer to be
scheduled is part of what every transfer costs, and ``devplace run`` reports median steps too.

``calibrate(...)`` returns the Cluster with its measurements in ``meta["calibration"]`` (``refit``
fits them for another comm model without measuring again); ``cluster_toml`` writes it in the
preset format (``devplace/clusters/*.toml``) with the per-program figures as comments.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from dataclasses import replace

import numpy as np

from devplace.errors import DevplaceError

LINK_FIGURES = ("latency_us", "bandwidth_bytes_per_us", "send_overhead_us", "recv_overhead_us")
HOPS = 16  # messages in a hop chain
BURST = 16  # messages in a burst
CHAIN = 24  # matrix multiplies per device in a busy exchange
HOP_BYTES = (256, 4_096, 65_536, 262_144, 1_048_576, 4_194_304)
BURST_BYTES = (256, 4_096, 65_536, 1_048_576)
EXCHANGE_MATRICES = (128, 192)  # about 50 and 170 us per multiply on one core here
EXCHANGE_EVERY = (1, 3, 8)
QUICK_HOP_BYTES = (4_096, 262_144, 2_097_152)
QUICK_BURST_BYTES = (4_096, 262_144)
QUICK_EXCHANGE_EVERY = (1, 8)


def _fastest_us(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timings: on a shared machine the slower ones time other work."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return min(times)


def _device_speed(repeats: int) -> dict:
    import torch

    n = 256
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    mm_us = _fastest_us(lambda: torch.mm(a, b), repeats)
    x, y = torch.randn(2**21), torch.randn(2**21)
    torch.add(x, y)
    add_us = _fastest_us(lambda: torch.add(x, y), repeats)
    return {"peak_tflops": 2 * n**3 / mm_us / 1e6, "memory_bandwidth_gbps": 3 * x.numel() * 4 / add_us / 1e3}


def _op_gap_us(repeats: int, rank: int = 0, status=None) -> float:
    """Per-op cost of the executor beyond the op itself: a rank's interpreter bookkeeping."""
    import torch

    from devplace.execute.distributed import RankInterpreter
    from devplace.execute.program import Instr, Program, Ref
    from devplace.execute.schedule import Plan

    n_ops = 200
    instrs = [Instr("x", "placeholder", "x")]
    for i in range(n_ops):
        prev = "x" if i == 0 else f"op{i - 1}"
        instrs.append(Instr(f"op{i}", "call_function", "aten::add.Tensor", (Ref(prev), Ref("x")), inputs=(prev, "x")))
    program = Program(instrs, outputs={"loss": f"op{n_ops - 1}"}, final={})
    cpu = torch.device("cpu")
    x = torch.ones(16)
    order = list(range(len(instrs)))
    plan = Plan(np.full(len(instrs), rank), order, [order] * (rank + 1), {}, [{}] * (rank + 1))
    interp = RankInterpreter(program, plan, rank, cpu, {"x": x}, status=status)
    interp.run()
    run_us = _fastest_us(interp.run, repeats)
    add = torch.ops.aten.add.Tensor

    def bare():
        v = x
        for _ in range(n_ops):
            v = add(v, x)

    bare_us = _fastest_us(bare, repeats)
    return max(0.0, (run_us - bare_us) / n_ops)


# ---------------------------------------------------------------------- synthetic programs
def link_programs(quick: bool = False) -> list[dict]:
    """What a link is fitted over: one description per synthetic program (``synthetic_graph`` and
    ``synthetic_program`` rebuild it)."""
    specs = [{"kind": "hop", "bytes": b} for b in (QUICK_HOP_BYTES if quick else HOP_BYTES)]
    specs += [{"kind": "burst", "bytes": b} for b in (QUICK_BURST_BYTES if quick else BURST_BYTES)]
    for n in EXCHANGE_MATRICES[:1] if quick else EXCHANGE_MATRICES:
        for every in QUICK_EXCHANGE_EVERY if quick else EXCHANGE_EVERY:
            for rows in (1, n):
                for lag in (0, 1):
                    specs.append({"kind": "exchange", "matrix": n, "rows": rows, "every": every, "lag": lag})
    return specs


def program_label(spec: dict) -> str:
    if spec["kind"] == "hop":
        return f"{HOPS} hops of {spec['bytes']} B"
    if spec["kind"] == "burst":
        return f"burst of {BURST} x {spec['bytes']} B"
    n = spec["matrix"]
    return (f"exchange of {4 * spec['rows'] * n} B every {spec['every']} mm {n}x{n}, "
            + ("waited at once" if spec["lag"] == 0 else "waited a period later"))


def _ops(spec: dict, prefix: str = "") -> list[tuple]:
    """The program as (name, ATen op or None for a placeholder, args, output shape, side): side 0
    runs on the pair's first device, 1 on its second. Every value is a float32 tensor; the order
    is the one both the executor and the simulator follow (a topological order)."""
    from devplace.execute.program import Ref

    kind = spec["kind"]
    if kind in ("hop", "burst"):
        shape = (max(spec["bytes"] // 4, 1),)
        ops = [(prefix + "x", None, (), shape, 0)]
        if kind == "hop":  # a chain alternating between the devices: one message at a time
            for k in range(HOPS + 1):
                ops.append((f"{prefix}hop{k}", "aten::neg.default", (Ref(ops[-1][0]),), shape, k % 2))
            return ops
        # values made back to back on side 0, taken in order by a chain on side 1
        ops += [(f"{prefix}send{k}", "aten::neg.default", (Ref(prefix + "x"),), shape, 0) for k in range(BURST)]
        ops.append((prefix + "take0", "aten::neg.default", (Ref(prefix + "send0"),), shape, 1))
        ops += [(f"{prefix}take{k}", "aten::add.Tensor", (Ref(f"{prefix}take{k - 1}"), Ref(f"{prefix}send{k}")),
                 shape, 1) for k in range(1, BURST)]
        return ops
    if kind != "exchange":
        raise ValueError(f"unknown synthetic program kind {kind!r}")
    # h <- h @ w on each side (w orthogonal: values keep their size); every `every` multiplies each
    # side sends the first `rows` rows of its h, and the other side writes them into its own h
    # right away (lag 0) or at its next exchange (lag 1)
    n, rows, every, lag = spec["matrix"], spec["rows"], spec["every"], spec["lag"]
    ops = [(f"{prefix}{v}{s}", None, (), (n, n), s) for s in (0, 1) for v in ("h", "w")]
    h = [prefix + "h0", prefix + "h1"]
    for t in range(1, CHAIN + 1):
        for s in (0, 1):
            ops.append((f"{prefix}mm{t}_{s}", "aten::mm.default", (Ref(h[s]), Ref(f"{prefix}w{s}")), (n, n), s))
            h[s] = ops[-1][0]
        if t % every:
            continue
        if t + lag * every <= CHAIN:
            ops += [(f"{prefix}emit{t}_{s}", "aten::slice.Tensor", (Ref(h[s]), 0, 0, rows), (rows, n), s)
                    for s in (0, 1)]
        sent = t - lag * every
        if sent >= every:
            for s in (0, 1):
                ops.append((f"{prefix}absorb{t}_{s}", "aten::slice_scatter.default",
                            (Ref(h[s]), Ref(f"{prefix}emit{sent}_{1 - s}"), 0, 0, rows), (n, n), s))
                h[s] = ops[-1][0]
    return ops


def _refs(args) -> list[str]:
    from devplace.execute.program import Ref

    return [a.name for a in args if isinstance(a, Ref)]


def synthetic_graph(spec: dict, op_costs_us=None, prefix: str = ""):
    """(the program's OpGraph, side per op): edge bytes are the tensors' bytes, op ``k`` costs
    ``op_costs_us[k]`` (0 if not given)."""
    from devplace.graph import GraphBuilder

    ops = _ops(spec, prefix)
    nbytes = {name: 4.0 * math.prod(shape) for name, _, _, shape, _ in ops}
    builder = GraphBuilder(["cpu"])
    for k, (name, _, args, _, _) in enumerate(ops):
        cost = 0.0 if op_costs_us is None else float(op_costs_us[k])
        builder.add_op(name, compute_us=cost, output_bytes=nbytes[name])
        for ref in _refs(args):
            builder.add_edge(ref, name, bytes=nbytes[ref])
    return builder.build(), np.array([side for *_, side in ops], dtype=np.int64)


def synthetic_program(spec: dict, prefix: str = "", seed: int = 0):
    """(Program, placeholder values) of the synthetic program ``spec``, values drawn from ``seed``."""
    import torch

    from devplace.execute.program import Instr, Program

    instrs, state = [], {}
    generator = torch.Generator().manual_seed(seed)
    for name, target, args, shape, _ in _ops(spec, prefix):
        stride = torch.empty(shape).stride()
        if target is None:
            instrs.append(Instr(name, "placeholder", name, shape=shape, dtype=torch.float32, stride=stride))
            value = torch.randn(shape, generator=generator)
            state[name] = torch.linalg.qr(value).Q.contiguous() if name[len(prefix)] == "w" else value
        else:
            instrs.append(Instr(name, "call_function", target, args, shape=shape, dtype=torch.float32, stride=stride,
                                inputs=tuple(dict.fromkeys(_refs(args)))))
    return Program(instrs, outputs={"loss": instrs[-1].name}, final={}), state


def _pair_name(pair) -> str:
    return f"cpu{pair[0]}-cpu{pair[1]}"


def measure_links(n_devices: int, *, quick: bool = False, rounds: int = 3, steps: int = 7, warmup: int = 1,
                  repeats: int = 7, timeout_s: float = 300.0, seed: int = 0) -> list[dict]:
    """Run every synthetic program over every device pair for real, all in one launch, in
    ``rounds`` rounds (every other one in reverse order: a burst of load elsewhere on the machine
    then hits no program alone) of ``steps`` steps after ``warmup``. One record per (pair,
    program): its description, each op's executed cost (us) and the median of its steps (us)."""
    from devplace.execute.costs import executed_costs_us
    from devplace.execute.distributed import run_distributed_many
    from devplace.execute.schedule import make_plan
    from devplace.placement import Placement

    records, jobs = [], []
    for i in range(n_devices):
        for j in range(i + 1, n_devices):
            for spec in link_programs(quick):
                label = program_label(spec)
                prefix = f"[{_pair_name((i, j))} {label}] "  # a failing rank's message names pair and program
                program, state = synthetic_program(spec, prefix, seed)
                graph, sides = synthetic_graph(spec, prefix=prefix)
                costs = executed_costs_us(program, graph, state, repeats=repeats)
                plan = make_plan(program, graph, Placement(devices=np.where(sides == 0, i, j)), n_devices)
                jobs.append((program, plan, state))
                records.append({"devices": [i, j], "program": label, "spec": spec,
                                "op_costs_us": [round(float(c), 3) for c in costs]})
    order = [k for r in range(rounds) for k in (range(len(jobs)) if r % 2 == 0 else reversed(range(len(jobs))))]
    if not order:
        return records
    results = run_distributed_many([jobs[k] for k in order], n_devices, steps=steps, warmup=warmup, timeout_s=timeout_s)
    times: dict[int, list[float]] = {}
    for k, (_, step_times) in zip(order, results):
        times.setdefault(k, []).extend(step_times)
    for k, record in enumerate(records):
        record["measured_us"] = statistics.median(times[k])
    return records


# ---------------------------------------------------------------------- fitting
# starting points of the fit, as multiples of the first guess of (latency, us per byte, send, recv)
FIT_STARTS = ((1.0, 1.0, 1.0, 1.0), (1.6, 1.0, 0.5, 0.4), (0.4, 1.0, 0.5, 1.6))


def fit_link(programs: list[dict], comm_model: str = "duplex") -> dict:
    """The four link figures for which the simulator gives the measured steps of ``programs``
    (records of one device pair, as ``measure_links`` makes them), by least squares on
    log(simulated / measured); with the fit's median absolute relative error and each program's
    simulated step."""
    from scipy.optimize import least_squares

    from devplace.cluster import uniform_cluster
    from devplace.sim import Simulator

    pair = _pair_name(programs[0]["devices"]) if programs else "?"
    graphs = [synthetic_graph(p["spec"], p["op_costs_us"]) for p in programs]
    measured = np.array([p.get("measured_us", float("nan")) for p in programs], dtype=np.float64)
    if not programs or not np.all(np.isfinite(measured) & (measured > 0)):
        raise DevplaceError(f"link {pair}: no measured program steps to fit the link to (got {measured.tolist()})")

    def simulated(figures: np.ndarray) -> np.ndarray:
        latency, us_per_byte, send, recv = (float(v) for v in figures)
        cluster = uniform_cluster(2, kind="cpu", latency_us=latency, bandwidth_bytes_per_us=1.0 / us_per_byte,
                                  comm_model=comm_model, send_overhead_us=send, recv_overhead_us=recv)
        return np.array([Simulator(g, cluster).step_time_us(sides) for g, sides in graphs])

    scale = _first_guess(programs, graphs, measured)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(simulated(x * scale) / measured)

    best = None
    for start in FIT_STARTS:  # the step time is piecewise linear in the figures: start from several splits
        fit = least_squares(residuals, np.array(start), bounds=([0.0, 1e-6, 0.0, 0.0], np.inf), diff_step=1e-3,
                            xtol=1e-6, ftol=1e-6, max_nfev=60)
        if best is None or fit.cost < best.cost:
            best = fit
    figures = best.x * scale
    sim = simulated(figures)
    if not np.all(np.isfinite(sim)):
        raise DevplaceError(f"link {pair}: the fit did not converge (simulated steps {sim.tolist()})")
    return {"latency_us": float(figures[0]), "bandwidth_bytes_per_us": 1.0 / float(figures[1]),
            "send_overhead_us": float(figures[2]), "recv_overhead_us": float(figures[3]),
            "median_abs_error": float(np.median(np.abs(sim - measured) / measured)), "simulated_us": sim.tolist()}


def _first_guess(programs: list[dict], graphs: list, measured: np.ndarray) -> np.ndarray:
    """Scale of the four figures from the hop chains: a hop's time beyond its op, split between
    latency and the overheads, and the growth of that time with the message size."""
    per_hop = {p["spec"]["bytes"]: (m - g.compute_us.sum()) / HOPS
               for p, (g, _), m in zip(programs, graphs, measured) if p["spec"]["kind"] == "hop"}
    if not per_hop:
        return np.array([100.0, 1e-3, 100.0, 100.0])
    small, large = min(per_hop), max(per_hop)
    hop_us = max(per_hop[small], 10.0)
    us_per_byte = (per_hop[large] - per_hop[small]) / (large - small) if large > small else 0.0
    return np.array([hop_us / 2, max(us_per_byte, 1e-5), hop_us / 2, hop_us / 2])


# ---------------------------------------------------------------------- the cluster
def _device_body(rank, world, settings, status):
    """One rank's device figures."""
    figures = _device_speed(settings["repeats"])
    figures["op_gap_us"] = _op_gap_us(settings["repeats"], rank, status)
    return (figures,)


def calibrate(n_devices: int = 2, *, quick: bool = False, repeats: int | None = None, name: str | None = None,
              timeout_s: float = 300.0, comm_model: str = "duplex", seed: int = 0):
    """Measure ``n_devices`` one-thread CPU processes joined by gloo; return a ``Cluster`` whose
    links are fitted for ``comm_model``. ``seed`` draws the synthetic programs' values."""
    from devplace.execute.distributed import launch

    repeats = repeats or (7 if quick else 21)
    done = launch(_device_body, [()] * n_devices, {"repeats": repeats}, timeout_s=timeout_s)
    programs = measure_links(n_devices, quick=quick, rounds=2 if quick else 3, steps=5 if quick else 7,
                             repeats=5 if quick else 7, timeout_s=timeout_s, seed=seed)
    spec, calibration = spec_from_measurements([done[r][0] for r in range(n_devices)], programs, n_devices, name,
                                               comm_model)
    return calibrated_cluster(spec, calibration)


def calibrated_cluster(spec: dict, calibration: dict):
    """The Cluster of ``spec_from_measurements``'s output, the measurements kept in its meta."""
    from devplace.cluster import cluster_from_dict

    cluster = cluster_from_dict(spec, default_name=spec["name"])
    return replace(cluster, meta={"calibration_spec": spec, "calibration": calibration})


def spec_from_measurements(figures: list[dict], programs: list[dict], n_devices: int, name: str | None,
                           comm_model: str = "duplex") -> tuple[dict, dict]:
    """(the cluster spec in the TOML layout, the calibration record) from each device's figures and
    the link programs' records (``measure_links``), the links fitted for ``comm_model``."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 / n_devices
    spec = {
        "name": name or f"calibrated-{platform.node() or 'host'}-{n_devices}cpu",
        "description": f"{n_devices} one-thread CPU processes with gloo, measured {time.strftime('%Y-%m-%d %H:%M')}",
        "comm_model": comm_model,
        "op_gap_us": round(statistics.median(f["op_gap_us"] for f in figures), 3),
        "devices": [{
            "name": "cpu", "kind": "cpu", "count": n_devices, "memory_gib": round(memory_gib, 3),
            "peak_tflops": round(statistics.median(f["peak_tflops"] for f in figures), 5),
            "memory_bandwidth_gbps": round(statistics.median(f["memory_bandwidth_gbps"] for f in figures), 3),
        }],
    }
    return _with_links(spec, figures, programs, comm_model)


def _with_links(spec: dict, figures: list[dict], programs: list[dict], comm_model: str) -> tuple[dict, dict]:
    """``spec`` with its links fitted for ``comm_model`` to ``programs``, and the calibration record."""
    by_pair: dict[tuple, list[dict]] = {}
    for p in programs:
        by_pair.setdefault(tuple(p["devices"]), []).append(p)
    fits = {pair: fit_link(records, comm_model) for pair, records in sorted(by_pair.items())}
    spec = {**spec, "comm_model": comm_model, "links": {}}
    if fits:
        spec["links"]["default"] = {k: round(statistics.median(f[k] for f in fits.values()), 3) for k in LINK_FIGURES}
        if len(fits) > 1:
            spec["links"]["pairs"] = [{"devices": [f"cpu{i}", f"cpu{j}"], **{k: round(f[k], 3) for k in LINK_FIGURES}}
                                      for (i, j), f in fits.items()]
    links = []
    for pair, fit in fits.items():
        records = [{**p, "simulated_us": s} for p, s in zip(by_pair[pair], fit["simulated_us"])]
        links.append({"devices": list(pair), **{k: fit[k] for k in LINK_FIGURES},
                      "median_abs_error": fit["median_abs_error"], "programs": records})
    return spec, {"devices": figures, "comm_model": comm_model, "links": links}


def refit(cluster, comm_model: str):
    """``cluster`` (made by ``calibrate`` in this process) with its links fitted for ``comm_model``
    from the program steps it measured: nothing is measured again."""
    spec, calibration = cluster.meta.get("calibration_spec"), cluster.meta.get("calibration")
    if spec is None or calibration is None:
        raise DevplaceError(f"cluster {cluster.name!r} has no calibration measurements to refit (a cluster loaded "
                            f"from a file keeps its figures): calibrate again")
    programs = [p for link in calibration["links"] for p in link["programs"]]
    return calibrated_cluster(*_with_links(spec, calibration["devices"], programs, comm_model))


def cluster_toml(cluster) -> str:
    """The cluster in the preset TOML format, with the calibration figures as comments."""
    spec = cluster.meta.get("calibration_spec")
    if spec is None:
        raise ValueError("cluster_toml needs a cluster made by calibrate()")
    return _to_toml(spec, cluster.meta.get("calibration", {}))


def _to_toml(spec: dict, cal: dict) -> str:
    def value(v):
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return repr(float(v)) if isinstance(v, float) else str(v)

    lines = ["# Measured by `devplace calibrate`: one-thread CPU processes joined by gloo. Links fitted so",
             "# that the simulator (comm_model, op_gap_us 0, ops costed as the executor runs them) gives",
             "# the measured steps of synthetic programs over each device pair (listed at the end)."]
    for key in ("name", "description", "comm_model", "op_gap_us"):
        lines.append(f"{key} = {value(spec[key])}")
    for dev in spec["devices"]:
        lines += ["", "[[devices]]"] + [f"{k} = {value(v)}" for k, v in dev.items()]
    links = spec.get("links", {})
    if "default" in links:
        lines += ["", "[links.default]"] + [f"{k} = {value(v)}" for k, v in links["default"].items()]
    for pair in links.get("pairs", []):
        lines += ["", "[[links.pairs]]"] + [f"{k} = {value(v)}" for k, v in pair.items()]
    lines += ["", "# Measurements behind the figures above:"]
    for r, dev in enumerate(cal.get("devices", [])):
        lines.append(f"# device {r}: " + ", ".join(f"{k} {v:.4g}" for k, v in dev.items()))
    for link in cal.get("links", []):
        lines.append(f"# link {_pair_name(link['devices'])}: median |error| {100 * link['median_abs_error']:.1f}% "
                     f"over {len(link['programs'])} programs, step measured / simulated (us):")
        lines += [f"#   {p['program']}: {p['measured_us']:.0f} / {p['simulated_us']:.0f} "
                  f"({100 * (p['simulated_us'] - p['measured_us']) / p['measured_us']:+.0f}%)"
                  for p in link["programs"]]
    return "\n".join(lines) + "\n"
