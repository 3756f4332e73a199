"""Zoo capture figures: what each benchmark model's training step looks like as an OpGraph.

For every zoo model at its paper configuration (and GNMT also at length 50, batch 256 and
8 layers): parameters and their bytes, the captured graph's op and edge counts (per role),
capture time (trace, total), the persistent bytes (parameters, gradients, optimizer state) and the
simulated peak memory of the whole step on one device, and the capturing process's peak RSS.

Capture uses the roofline cost model on ``baechi-4x2080`` (no op is run for real) and Adam, as
Baechi's GNMT did. Each target is captured in its own subprocess, one after another, so memory is
returned between them and one failure does not stop the rest.

    .venv/bin/python benchmarks/zoo_capture.py                      # all DEFAULT_TARGETS
    .venv/bin/python benchmarks/zoo_capture.py zoo:gnmt:preset=small # chosen targets (merged in)

Writes ``benchmarks/results/zoo_capture.json`` (entries keyed by target; re-running a target
replaces its entry).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from devplace.fileio import write_text_atomic

RESULTS = Path(__file__).parent / "results" / "zoo_capture.json"
CLUSTER = "baechi-4x2080"

DEFAULT_TARGETS = [
    "zoo:mlp",
    "zoo:small_cnn",
    "zoo:resnet50",
    "zoo:inception_v3",
    "zoo:nasnet",
    "zoo:transformer",
    "zoo:rnnlm",
    "zoo:gnmt",                          # Baechi: 4 layers, 512 units, length 40, batch 128
    "zoo:gnmt:seq_len=50",               # Baechi's length-50 GNMT
    "zoo:gnmt:layers=2",                 # the Hierarchical Planner's 2- and 8-layer NMT depths
    "zoo:gnmt:layers=8",
    "zoo:transformer:layers=24",
]


def measure(target: str) -> dict:
    """Capture ``target`` in this process and return its figures."""
    import numpy as np
    import torch

    import devplace as dp
    from devplace import zoo
    from devplace.torchcapture import capture

    torch.set_num_threads(1)
    name, config = zoo.parse_target(target)
    built = time.perf_counter()
    zm = zoo.build(name, **config)
    build_s = time.perf_counter() - built
    params = list(zm.model.parameters())
    cluster = dp.load_cluster(CLUSTER)
    graph = capture(zm, optimizer="adam", cost="roofline", cluster=cluster, progress=False)
    one_device = dp.simulate(graph, cluster, np.zeros(graph.n_ops, dtype=np.int64))
    roles = graph.role_counts()
    return {
        "target": target,
        "model": name,
        "config": zm.config,
        "parameters": sum(p.numel() for p in params),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
        "ops": graph.n_ops,
        "edges": graph.n_edges,
        "ops_by_role": {k: int(v) for k, v in roles.items()},
        "build_seconds": round(build_s, 2),
        "capture_seconds": graph.meta["capture_seconds"],
        "persistent_bytes": float(graph.persistent_bytes.sum()),
        "peak_bytes_one_device": float(one_device.peak_memory_bytes[0]),
        "simulated_step_ms_one_device": round(one_device.step_time_us / 1e3, 3),
        "cluster": CLUSTER,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def markdown_table(results: dict) -> str:
    """The stored figures as the table in BENCHMARKS.md."""
    gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
    rows = ["| target | parameters | param GiB | ops (fwd/bwd/update/other) | edges | capture s | "
            "persistent GiB | peak GiB, one device | RSS MiB |",
            "|---|---|---|---|---|---|---|---|---|"]
    for target, e in results["entries"].items():
        if "error" in e:
            rows.append(f"| {target} | failed: {' '.join(e['error'])} |||||||| ")
            continue
        r = e["ops_by_role"]
        rows.append(
            f"| `{target}` | {e['parameters'] / 1e6:.1f} M | {gib(e['parameter_bytes'])} | {e['ops']:,} "
            f"({r['forward']:,}/{r['backward']:,}/{r['update']:,}/{r['other']:,}) | {e['edges']:,} | "
            f"{e['capture_seconds']['total']:.0f} | {gib(e['persistent_bytes'])} | "
            f"{gib(e['peak_bytes_one_device'])} | {e['max_rss_mib']:.0f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="zoo targets (default: the paper configurations)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one target, print JSON
    parser.add_argument("--table", action="store_true", help="print the stored results as a markdown table")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return
    if args.table:
        print(markdown_table(json.loads(RESULTS.read_text())))
        return
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"entries": {}}
    for target in args.targets or DEFAULT_TARGETS:
        print(f"{target} ...", end=" ", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--one", target], capture_output=True, text=True)
        if proc.returncode != 0:
            entry = {"target": target, "error": proc.stderr.strip().splitlines()[-1:]}
            print("FAILED", entry["error"])
        else:
            entry = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{entry['ops']} ops, capture {entry['capture_seconds']['total']} s, "
                  f"peak {entry['peak_bytes_one_device'] / 2**30:.2f} GiB, rss {entry['max_rss_mib']} MiB")
        results["entries"][target] = entry
        results["machine"] = {"python": platform.python_version(), "processor": platform.machine(),
                              "torch": __import__("torch").__version__}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(RESULTS, json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
