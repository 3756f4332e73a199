"""Does METIS keep its partition? Ops per device and step time against one device (BENCHMARKS.md, "METIS").

For library transformer models (tests/test_capture_models.py: built from configs, random weights,
nothing downloaded, captured with roofline costs), the zoo models of Baechi's table and the bundled
dnn-partitioning graphs: METIS's raw parts, the parts after its acyclic repair, the units the repair
moved, and the simulated step time of ``metis`` against ``single``, with ample memory (the preset's)
and with tight memory (every device at ``TIGHT`` of the one-device peak).

    .venv/bin/python benchmarks/metis_balance.py [--out benchmarks/results/metis_balance.json]

Run it from another checkout (``PYTHONPATH=that/checkout``) with ``--out`` to measure that code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from reproduce_papers import CACHE, PRESET, RESULTS, _baechi_cases, cached_graph  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.errors import OutOfMemoryError  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402

TIGHT = 0.4
LIBRARY = ["medium_bert", "medium_gpt2", "medium_t5", "mixtral"]


def library_graph(name: str):
    """A library model of the test tier, captured once for ``PRESET`` and cached."""
    path = CACHE / f"library_{name}.{dp.__version__}.json"
    if not path.exists():
        sys.path.insert(0, str(HERE.parent / "tests"))
        import test_capture_models as library

        model, inputs, loss = getattr(library, name)()
        CACHE.mkdir(parents=True, exist_ok=True)
        dp.save_graph(dp.capture(model, inputs, loss, cluster=PRESET), path)
    return dp.load_graph(path)


def cases() -> list[tuple[str, object, object]]:
    """(name, graph, cluster) for every graph measured."""
    from devplace.io.dnn_partitioning import cluster_for

    preset = dp.load_cluster(PRESET)
    out = [(f"library:{name}", library_graph(name), preset) for name in LIBRARY]
    out += [(target, cached_graph(target), preset)
            for target in dict.fromkeys(case["target"] for case in _baechi_cases())]
    for path in sorted(dp.example_path("gnmt_layers_training.json").parent.glob("*.json")):
        graph = dp.load_graph(path)
        out.append((path.name, graph, cluster_for(graph)))
    return out


def measure(graph, cluster) -> dict:
    one = dp.simulate(graph, cluster.with_memory_fraction(1e3), np.zeros(graph.n_ops, dtype=np.int64))
    peak = float(one.peak_memory_bytes[0])
    row = {"ops": graph.n_ops, "devices": cluster.n_devices, "single_step_us": round(one.step_time_us, 1)}
    raw = dp.place(graph, cluster, algo="metis", acyclic=False, check=False).devices
    row["raw_ops_per_device"] = np.bincount(raw, minlength=cluster.n_devices).tolist()
    for memory, scaled in (("ample", cluster),
                           ("tight", cluster.with_memory_fraction(TIGHT * peak / float(cluster.memory_bytes.max())))):
        try:
            p = dp.place(graph, scaled, algo="metis")          # checked: fits in simulation
            row[memory] = {"step_us": round(dp.simulate(graph, scaled, p).step_time_us, 1),
                           "ops_per_device": np.bincount(p.devices, minlength=cluster.n_devices).tolist(),
                           "units_moved_by_repair": p.options.get("units_moved_by_repair")}
        except OutOfMemoryError as exc:
            row[memory] = {"error": str(exc)[:160]}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(RESULTS / "metis_balance.json"))
    args = parser.parse_args(argv)
    results = {"load_average": round(os.getloadavg()[0], 1), "tight_fraction": TIGHT, "graphs": {}}
    for name, graph, cluster in cases():
        began = time.perf_counter()
        row = measure(graph, cluster)
        row["seconds"] = round(time.perf_counter() - began, 1)
        results["graphs"][name] = row
        print(name, json.dumps(row), flush=True)
        write_text_atomic(Path(args.out), json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
