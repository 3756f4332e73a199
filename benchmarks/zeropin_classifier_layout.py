"""Round 45 (benchmarks/rounds/how-far-from-optimal.md): GNMT's "8 GiB best by block, classifier weights tied" layout (gnmt_wavefront.json,
classifier and its weights on GPU 1) simulated on the graph before and after the fix: per-GPU peaks.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/zeropin_classifier_layout.py BEFORE.json AFTER.json
"""
import json
import sys
from pathlib import Path

import numpy as np

import devplace as dp
from devplace.placement import Placement

sys.path.insert(0, str(Path(__file__).parent))
from gnmt_wavefront import Layouts  # noqa: E402

saved = json.loads((Path(__file__).parent / "results" / "gnmt_wavefront.json").read_text())
layout = saved["block_descents"]["the 8 GiB best by block, classifier weights tied"]["layout"]
cluster = dp.load_cluster("baechi-4x2080")
for path in sys.argv[1:]:
    layouts = Layouts(dp.load_graph(path), cluster)
    devices = layouts.devices(layout)
    for name, priority in layouts.orders(devices):
        r = layouts.sim.run(Placement(devices=devices, priority=priority))
        print(f"{Path(path).name} {name:12s} step {r.step_time_us / 1e3:8.3f} ms  peaks GiB",
              np.round(r.peak_memory_bytes / 2**30, 3).tolist(), f"(classifier on GPU {layout['cls']})")
