"""Library models captured with roofline costs: FLOPs left to shape estimates, and the optimizer step
in its three forms (per-parameter loop, foreach multi-tensor kernels, fused kernel).

For each model of the library-model test tier (tests/test_capture_models.py: Hugging Face
transformers and timm models built from small configs, random weights), on ``8xh100-nvlink``:
capture time, ops, total FLOPs, the share of FLOPs estimated from shapes, and for each update form
the update ops' share of the simulated one-device step.

    .venv/bin/python benchmarks/capture_library.py [--out benchmarks/results/capture_library.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_capture_models as library  # noqa: E402

import devplace as dp  # noqa: E402
from devplace.graph import Role  # noqa: E402
from devplace.fileio import write_text_atomic  # noqa: E402

CLUSTER = "8xh100-nvlink"
UPDATES = ("per-parameter", "foreach", "fused")


def measure(name: str) -> dict:
    cluster = dp.load_cluster(CLUSTER)
    row = {"model": name}
    for update in UPDATES:
        model, inputs, loss = library.MODELS[name]()
        started = time.perf_counter()
        g = dp.capture(model, inputs, loss, cluster=cluster, update=update)
        seconds = time.perf_counter() - started
        flops = np.asarray(g.meta["op_flops"])
        guessed = np.isin(np.asarray(g.kinds, dtype=object), g.meta["flop_fallback_ops"])
        step_us = dp.simulate(g, cluster, [0] * g.n_ops).step_time_us
        update_us = float(g.compute_us[g.role == Role.UPDATE, 0].sum())
        row[update] = {"ops": g.n_ops, "update_ops": int((g.role == Role.UPDATE).sum()),
                       "capture_s": round(seconds, 2), "step_us": round(step_us, 1),
                       "update_share": round(update_us / step_us, 4)}
        row["total_flops"] = float(flops.sum())
        row["estimated_flops_share"] = float(flops[guessed].sum() / flops.sum())
        row["estimated_kinds"] = g.meta["flop_fallback_ops"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/capture_library.json")
    args = parser.parse_args(argv)
    rows = []
    for name in library.MODELS:
        row = measure(name)
        rows.append(row)
        forms = ", ".join(f"{u} {row[u]['update_share']:.0%} of {row[u]['step_us']:.0f} us ({row[u]['capture_s']} s)"
                          for u in UPDATES)
        print(f"{name}: {row['foreach']['ops']} ops, {row['total_flops']:.3g} FLOPs, "
              f"estimated {row['estimated_flops_share']:.3%}; update: {forms}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps({"machine": platform.platform(), "torch": torch.__version__, "cluster": CLUSTER,
                                       "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
