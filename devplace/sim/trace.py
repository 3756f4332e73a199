"""Chrome trace export: a simulated step as a timeline that opens in Perfetto or chrome://tracing.

One process row per device (ops), one per link direction in use (transfers), and a memory counter
per device.

With ``measured`` (a run's timeline: ``devplace.execute.RunResult.timeline``, plain dicts) the file
holds two processes side by side on one time axis from the step's start: "simulated" (per device a
compute row of ops, a receive row of transfers, a memory counter) and "measured" (per device the
executed instructions, a receive row of the waits for values from other devices, named like the
simulated transfers, and a send row of the sends posted).
"""

from __future__ import annotations

import json
from pathlib import Path


from devplace.fileio import json_default, write_text_atomic
from devplace.graph import ROLE_NAMES
from devplace.sim.result import SimResult

SIMULATED_PID, MEASURED_PID = 0, 1
SIMULATED_ROWS = ("compute", "receive")
MEASURED_ROWS = {"ops": "compute", "waits": "receive", "sends": "send"}


def chrome_trace(result: SimResult, measured: dict | None = None) -> dict:
    """The trace of ``result`` alone (one process per device), or beside ``measured`` (see above)."""
    c = result.cluster
    if measured is None:
        devices = [(d, f"{dev.name} ({dev.kind})", SIMULATED_ROWS) for d, dev in enumerate(c.devices)]
        events = _names(devices, sort=False)
        events += _schedule(result, lambda d, row: (d, row), lambda d: (d, "memory"))
        other = {"step_time_us": result.step_time_us, "cluster": c.name}
    else:
        simulated_rows = [f"{dev.name} {row}" for dev in c.devices for row in SIMULATED_ROWS]
        measured_rows = [f"{_device_name(c, d)} {row}" for d in range(_n_devices(c, measured))
                         for row in MEASURED_ROWS.values()]
        events = _names([(SIMULATED_PID, "simulated", simulated_rows), (MEASURED_PID, "measured", measured_rows)])
        events += _schedule(result, lambda d, row: (SIMULATED_PID, d * len(SIMULATED_ROWS) + row),
                            lambda d: (SIMULATED_PID, f"memory {c.devices[d].name}"))
        events += _measured(result, measured)
        other = {"step_time_us": result.step_time_us, "cluster": c.name,
                 "measured_step_time_us": measured.get("step_time_us"),
                 "measured_device_end_us": measured.get("device_end_us")}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(result: SimResult, path: "str | Path", measured: dict | None = None) -> None:
    write_text_atomic(path, json.dumps(chrome_trace(result, measured), default=json_default))


def _names(processes, sort: bool = True) -> list[dict]:
    """Metadata events naming each (pid, process name, thread names by tid); ``sort``: and asking
    the viewer to keep them in that order."""
    events = []
    for pid, name, threads in processes:
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        if sort:
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        for tid, thread in enumerate(threads):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}})
            if sort:
                events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                               "args": {"sort_index": tid}})
    return events


def _schedule(result: SimResult, row_of, counter_of) -> list[dict]:
    """Op and transfer slices on ``row_of(device, 0 compute | 1 receive)`` -> (pid, tid), and the
    memory counter of each device at ``counter_of(device)`` -> (pid, name)."""
    g, c = result.graph, result.cluster
    events: list[dict] = []
    for op in range(g.n_ops):
        pid, tid = row_of(int(result.devices[op]), 0)
        events.append({
            "ph": "X", "pid": pid, "tid": tid,
            "name": g.names[op], "cat": ROLE_NAMES[g.role[op]],
            "ts": float(result.start_us[op]), "dur": float(result.finish_us[op] - result.start_us[op]),
            "args": {"kind": g.kinds[op], "output_bytes": float(g.output_bytes[op])},
        })
    for x in range(len(result.transfer_op)):
        src, dst = int(result.transfer_src[x]), int(result.transfer_dst[x])
        pid, tid = row_of(dst, 1)
        events.append({
            "ph": "X", "pid": pid, "tid": tid,
            "name": f"{g.names[result.transfer_op[x]]} from {c.devices[src].name}",
            "cat": "transfer",
            "ts": float(result.transfer_start_us[x]),
            "dur": float(result.transfer_end_us[x] - result.transfer_start_us[x]),
            "args": {"bytes": float(result.transfer_bytes[x])},
        })
    for d in range(c.n_devices):
        times, used = result.memory_timeline(d)
        pid, name = counter_of(d)
        for t, b in zip(times.tolist(), used.tolist()):
            events.append({"ph": "C", "pid": pid, "name": name, "ts": t, "args": {"bytes": b}})
    return events


def _measured(result: SimResult, measured: dict) -> list[dict]:
    """Slices of the measured timeline: instructions (graph ops with their simulated times in args;
    glue the graph leaves out as ``glue``), receive waits ``VALUE from DEVICE``, sends ``VALUE to DEVICE``."""
    g, c = result.graph, result.cluster
    events: list[dict] = []
    for row, (key, kind) in enumerate(MEASURED_ROWS.items()):
        for e in measured.get(key, ()):
            event = {"ph": "X", "pid": MEASURED_PID, "tid": int(e["device"]) * len(MEASURED_ROWS) + row,
                     "name": e["name"], "cat": "glue", "ts": float(e["start_us"]),
                     "dur": float(e["end_us"]) - float(e["start_us"]), "args": {}}
            if kind != "compute":
                event["name"] = f"{e['name']} {'from' if kind == 'receive' else 'to'} {_device_name(c, e['peer'])}"
                event["cat"] = "wait" if kind == "receive" else "send"
            elif e["name"] in g.index_of:
                op = g.index_of[e["name"]]
                event["cat"] = ROLE_NAMES[g.role[op]]
                event["args"] = {"simulated_start_us": float(result.start_us[op]),
                                 "simulated_dur_us": float(result.finish_us[op] - result.start_us[op]),
                                 "simulated_device": int(result.devices[op])}
            events.append(event)
    return events


def _n_devices(cluster, measured: dict) -> int:
    seen = [int(e["device"]) for key in MEASURED_ROWS for e in measured.get(key, ())]
    return max([cluster.n_devices - 1, *seen]) + 1


def _device_name(cluster, d: int) -> str:
    return cluster.devices[d].name if 0 <= d < cluster.n_devices else f"device {d}"
