"""Measuring this machine's devices and links into a cluster that ``place`` and ``simulate`` accept.

One process per device (as the distributed executor runs them: one thread each, gloo on CPU):

- op speed per device: a matrix multiply gives ``peak_tflops``, a large elementwise add gives
  ``memory_bandwidth_gbps`` (what capture's roofline model reads);
- the executor's own cost per op, ``op_gap_us``: a chain of tiny ops run through the same
  interpreter, minus the ops' bare time;
- every device pair's link, in the two regimes the executor uses, for messages of several sizes:
  one transfer at a time (a chain of cheap ops alternating between the two devices, run by the
  ranks' interpreters; median per hop, the op's own time removed) and bursts (``BURST`` messages
  posted back to back with ``isend`` while the receiver, its receives posted ahead, takes them in
  order, as a rank does when it sends several values before its peer needs them). Both are fitted
  by least squares (relative residuals) to what the cluster's communication model predicts for
  ``k`` messages (``k = 1`` for a hop): ``duplex`` (the default) ``k * (b + a * bytes)``, each
  message holding the link for its latency; ``pipelined`` ``b + k * a * bytes``, the latency
  overlapping. ``latency_us = b``, ``bandwidth_bytes_per_us = 1 / a``. Duplex is the default:
  neither predicted real steps consistently better (BENCHMARKS.md, "Execution fidelity": 26%
  against 52% median error in one run, 64.5% against 56% in another), and duplex is what the
  placers plan with.

Device figures are the fastest of their repeats (what an op costs; on a shared machine slower
repeats time other processes' work); link figures are medians, because waiting for the peer to be
scheduled is part of what every transfer costs, and ``devplace run`` reports median steps too.

``calibrate(...)`` returns the Cluster; ``cluster_toml`` writes it in the preset format
(``devplace/clusters/*.toml``) with the raw samples kept under ``[calibration]``.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import numpy as np

SIZES_BYTES = (256, 4_096, 65_536, 262_144, 1_048_576, 4_194_304)
QUICK_SIZES_BYTES = (4_096, 262_144, 2_097_152)



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


def _measure_body(rank, world, settings, status):
    """One rank's part: its device figures, then hops and bursts with every other rank in turn."""
    repeats = settings["repeats"]
    figures = _device_speed(repeats)
    figures["op_gap_us"] = _op_gap_us(repeats, rank, status)
    links = {}
    for i in range(world):
        for j in range(i + 1, world):
            samples = []
            for size in settings["sizes"]:
                samples.append((size, _hop_us(rank, world, i, j, size, repeats, status), 1))
                samples.append((size, _burst_us(rank, i, j, size, repeats), BURST))
            if rank == i:
                links[(i, j)] = samples
    return figures, links


HOPS = 16
BURST = 16


def _burst_us(rank: int, i: int, j: int, size: int, repeats: int) -> float:
    """``BURST`` messages of ``size`` bytes from i to j posted at once; j has its receives posted
    ahead and waits for them in order (as a rank does). Median over ``repeats`` bursts."""
    import torch
    import torch.distributed as dist

    buffers = [torch.zeros(max(size // 4, 1)) for _ in range(BURST)]
    times = []
    for rep in range(repeats + 2):  # the first rounds set up the connections
        dist.barrier()
        t0 = time.perf_counter()
        if rank == i:
            for work in [dist.isend(b, dst=j, tag=k) for k, b in enumerate(buffers)]:
                work.wait()
        elif rank == j:
            for work in [dist.irecv(b, src=i, tag=k) for k, b in enumerate(buffers)]:
                work.wait()
        elapsed = torch.tensor([(time.perf_counter() - t0) * 1e6], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if rep >= 2:
            times.append(float(elapsed))
    return statistics.median(times)


def _hop_us(rank: int, world: int, i: int, j: int, size: int, repeats: int, status) -> float:
    """One transfer of ``size`` bytes from device i to j as the executor makes it: a chain of cheap
    ops alternating between the two ranks, run by their rank interpreters; time per hop, op removed."""
    import torch
    import torch.distributed as dist

    from devplace.execute.distributed import RankInterpreter
    from devplace.execute.program import Instr, Program, Ref
    from devplace.execute.schedule import make_plan
    from devplace.graph import GraphBuilder
    from devplace.placement import Placement

    shape = (max(size // 4, 1),)
    instrs = [Instr("x", "placeholder", "x", shape=shape, dtype=torch.float32, stride=(1,))]
    builder = GraphBuilder(["cpu"])
    builder.add_op("x", compute_us=0.0)
    for k in range(HOPS + 1):
        prev = "x" if k == 0 else f"hop{k - 1}"
        instrs.append(Instr(f"hop{k}", "call_function", "aten::neg.default", (Ref(prev),), shape=shape,
                            dtype=torch.float32, stride=(1,), inputs=(prev,)))
        builder.add_op(f"hop{k}", compute_us=0.0)
        builder.add_edge(prev, f"hop{k}", bytes=size)
    program = Program(instrs, outputs={"loss": f"hop{HOPS}"}, final={})
    devices = [i] + [i if k % 2 == 0 else j for k in range(HOPS + 1)]
    plan = make_plan(program, builder.build(), Placement(devices=devices), world)
    x = torch.zeros(shape)
    interp = RankInterpreter(program, plan, rank, torch.device("cpu"), {"x": x} if rank == i else {}, status=status)
    times = []
    for rep in range(repeats + 2):  # the first rounds set up the connections
        dist.barrier()
        t0 = time.perf_counter()
        interp.run()
        interp.finish_sends()
        elapsed = torch.tensor([(time.perf_counter() - t0) * 1e6], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if rep >= 2:
            times.append(float(elapsed))
    op_us = _fastest_us(lambda: torch.neg(x), repeats)
    return max(statistics.median(times) / HOPS - op_us, 0.0)


def fit_link(samples: list[tuple], comm_model: str = "duplex") -> dict:
    """Least-squares fit over (bytes, time_us[, k messages]) samples (k = 1 when left out) of
    ``time_us = k * (b + a * bytes)`` (each message holds the link: duplex, parallel, sequential) or
    ``b + k * a * bytes`` (``pipelined``); returns latency ``b``, bandwidth ``1 / a`` and R^2."""
    sizes = np.array([s[0] for s in samples], dtype=np.float64)
    times = np.array([s[1] for s in samples], dtype=np.float64)
    counts = np.array([s[2] if len(s) > 2 else 1 for s in samples], dtype=np.float64)
    per_message = np.ones_like(sizes) if comm_model == "pipelined" else counts
    design = np.stack([counts * sizes, per_message], axis=1)
    weight = 1.0 / np.maximum(times, 1e-3)  # relative errors: small messages fix the latency
    (a, b), *_ = np.linalg.lstsq(design * weight[:, None], times * weight, rcond=None)
    a = max(a, 1e-9)
    predicted = design @ np.array([a, b])
    total = float(((times - times.mean()) ** 2).sum())
    r2 = 1.0 - float(((times - predicted) ** 2).sum()) / total if total > 0 else 1.0
    return {"latency_us": max(float(b), 0.0), "bandwidth_bytes_per_us": 1.0 / float(a), "us_per_byte": float(a),
            "r2": r2, "sizes_bytes": sizes.tolist(), "times_us": times.tolist(), "messages": counts.astype(int).tolist()}


def calibrate(n_devices: int = 2, *, quick: bool = False, repeats: int | None = None, name: str | None = None,
              timeout_s: float = 300.0, comm_model: str = "duplex"):
    """Measure ``n_devices`` one-thread CPU processes joined by gloo; return a ``Cluster`` whose
    links are fitted for ``comm_model``."""
    from devplace.cluster import cluster_from_dict
    from devplace.execute.distributed import launch

    settings = {"repeats": repeats or (7 if quick else 21), "sizes": QUICK_SIZES_BYTES if quick else SIZES_BYTES}
    done = launch(_measure_body, [()] * n_devices, settings, timeout_s=timeout_s)
    spec, calibration = spec_from_measurements(done, n_devices, name, comm_model)
    cluster = cluster_from_dict(spec, default_name=spec["name"])
    cluster.meta["calibration_spec"] = spec
    cluster.meta["calibration"] = calibration
    return cluster


def spec_from_measurements(done: dict, n_devices: int, name: str | None,
                           comm_model: str = "duplex") -> tuple[dict, dict]:
    figures = [done[r][0] for r in range(n_devices)]
    fits = {pair: fit_link(samples, comm_model) for r in range(n_devices) for pair, samples in done[r][1].items()}
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
        "links": {},
    }
    calibration = {"devices": figures, "links": [{"devices": list(p), **f} for p, f in sorted(fits.items())]}
    if fits:
        spec["links"]["default"] = {
            "latency_us": round(statistics.median(f["latency_us"] for f in fits.values()), 3),
            "bandwidth_bytes_per_us": round(statistics.median(f["bandwidth_bytes_per_us"] for f in fits.values()), 3),
        }
        if len(fits) > 1:
            names = [f"cpu{i}" for i in range(n_devices)]
            spec["links"]["pairs"] = [
                {"devices": [names[i], names[j]], "latency_us": round(f["latency_us"], 3),
                 "bandwidth_bytes_per_us": round(f["bandwidth_bytes_per_us"], 3)}
                for (i, j), f in sorted(fits.items())
            ]
    return spec, calibration


def cluster_toml(cluster) -> str:
    """The cluster in the preset TOML format, with the calibration samples if it has them."""
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

    lines = ["# Measured by `devplace calibrate`: one-thread CPU processes joined by gloo.",
             "# Links fitted by least squares over single hops and bursts of messages in flight to what",
             "# comm_model predicts (duplex: messages * (latency_us + bytes / bandwidth_bytes_per_us))."]
    for key in ("name", "description", "comm_model", "op_gap_us"):
        lines.append(f"{key} = {value(spec[key])}")
    for dev in spec["devices"]:
        lines += ["", "[[devices]]"] + [f"{k} = {value(v)}" for k, v in dev.items()]
    links = spec.get("links", {})
    if "default" in links:
        lines += ["", "[links.default]"] + [f"{k} = {value(v)}" for k, v in links["default"].items()]
    for pair in links.get("pairs", []):
        lines += ["", "[[links.pairs]]"] + [f"{k} = {value(v)}" for k, v in pair.items()]
    lines += ["", "# Samples behind the figures above:"]
    for r, dev in enumerate(cal.get("devices", [])):
        lines.append(f"# device {r}: " + ", ".join(f"{k} {v:.4g}" for k, v in dev.items()))
    for link in cal.get("links", []):
        counts = link.get("messages", [1] * len(link["sizes_bytes"]))
        lines.append(f"# link {link['devices']}: R^2 {link['r2']:.4f}; messages x bytes -> us: " + ", ".join(
            f"{k} x {int(s)} -> {t:.1f}" for s, t, k in zip(link["sizes_bytes"], link["times_us"], counts)))
    return "\n".join(lines) + "\n"
