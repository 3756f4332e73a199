"""Round 54: what a received copy of a view or a weight takes on the device it arrives at.

A view, a parameter or an in-place op owns no new bytes where it runs (``output_bytes`` 0), so until round 54
the simulator charged its received copies nothing, though the executor allocates a buffer for every tensor it
receives. This re-simulates the saved ceiling placements of ``results/bound_ceilings`` (zoo rows at 30% memory,
``bound_ceilings.py``) under both comm models and writes, per row, the step time, each device's peak and the
transfers that send more bytes than their producer owns. Run it in two checkouts to compare the rules (the
simulator is deterministic). From the checkout's root:
    PYTHONPATH=$PWD python benchmarks/received_copies.py OUT.json"""
import dataclasses
import glob
import json
import subprocess
import sys

import numpy as np

sys.path.insert(0, "benchmarks")
from reproduce_papers import PRESET, RESULTS, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402

GIB = 2**30


def row(ceiling: dict) -> dict:
    graph = cached_graph(ceiling["zoo"])
    sequential = dp.load_cluster(PRESET).with_memory_fraction(ceiling["fraction"])
    placement = dp.Placement(np.array(ceiling["devices"]), priority=np.array(ceiling["priority"]))
    out = {"memory_GiB": round(float(sequential.memory_bytes[0]) / GIB, 3)}
    for model in ("sequential", "pipelined"):
        result = dp.simulate(graph, dataclasses.replace(sequential, comm_model=model), placement)
        beyond = result.transfer_bytes > graph.output_bytes[result.transfer_op]
        out[model] = {"step_ms": round(result.step_time_us / 1e3, 3),
                      "peak_GiB": np.round(result.peak_memory_bytes / GIB, 3).tolist(), "fits": bool(result.fits),
                      "transfers": len(result.transfer_op), "transfers_beyond_output": int(beyond.sum()),
                      "bytes_beyond_output_GiB": round(float((result.transfer_bytes - graph.output_bytes[
                          result.transfer_op])[beyond].sum()) / GIB, 3)}
    return out


def main() -> None:
    out = sys.argv[1]
    rows = {}
    for path in sorted(glob.glob(str(RESULTS / "bound_ceilings" / "ceiling_*_s0.json"))):
        ceiling = json.load(open(path))
        rows[ceiling["zoo"]] = row(ceiling)
        print(ceiling["zoo"], json.dumps(rows[ceiling["zoo"]]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    write_text_atomic(out, json.dumps({"commit": commit, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
