"""Chrome trace export: a simulated step as a timeline that opens in Perfetto or chrome://tracing.

One process row per device (ops), one per link direction in use (transfers), and a memory counter
per device.
"""

from __future__ import annotations

import json
from pathlib import Path


from devplace.fileio import json_default, write_text_atomic
from devplace.graph import ROLE_NAMES
from devplace.sim.result import SimResult


def chrome_trace(result: SimResult) -> dict:
    g, c = result.graph, result.cluster
    events: list[dict] = []
    for d, dev in enumerate(c.devices):
        events.append({"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"{dev.name} ({dev.kind})"}})
        events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": 0, "args": {"name": "compute"}})
        events.append({"ph": "M", "name": "thread_name", "pid": d, "tid": 1, "args": {"name": "receive"}})
    for op in range(g.n_ops):
        events.append({
            "ph": "X", "pid": int(result.devices[op]), "tid": 0,
            "name": g.names[op], "cat": ROLE_NAMES[g.role[op]],
            "ts": float(result.start_us[op]), "dur": float(result.finish_us[op] - result.start_us[op]),
            "args": {"kind": g.kinds[op], "output_bytes": float(g.output_bytes[op])},
        })
    for x in range(len(result.transfer_op)):
        src, dst = int(result.transfer_src[x]), int(result.transfer_dst[x])
        events.append({
            "ph": "X", "pid": dst, "tid": 1,
            "name": f"{g.names[result.transfer_op[x]]} from {c.devices[src].name}",
            "cat": "transfer",
            "ts": float(result.transfer_start_us[x]),
            "dur": float(result.transfer_end_us[x] - result.transfer_start_us[x]),
            "args": {"bytes": float(result.transfer_bytes[x])},
        })
    for d in range(c.n_devices):
        times, used = result.memory_timeline(d)
        for t, b in zip(times.tolist(), used.tolist()):
            events.append({"ph": "C", "pid": d, "name": "memory", "ts": t, "args": {"bytes": b}})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"step_time_us": result.step_time_us, "cluster": c.name},
    }


def write_chrome_trace(result: SimResult, path: "str | Path") -> None:
    write_text_atomic(path, json.dumps(chrome_trace(result), default=json_default))
