"""Short runs of one learner of devplace's variant with some options changed, to choose between them
(BENCHMARKS.md, "Learning placers", round 7).

Each variant is ``--algo`` on ``--model`` with ``learned_placers.learner_options(algo, "devplace", model)``
and the variant's changes (``key=value,...``; ``base``: none), seed 0, for ``--samples`` simulated
placements. The samples are seeded, so a variant's figures do not depend on the load; its seconds do.
Recorded per variant: the changes, samples, seconds, the warm start, the best sample, the best so far
after each quarter of the samples, and the load average at the start and the end.

    .venv/bin/python benchmarks/learner_variants.py --model gnmt4 --algo hp --samples 300 \\
        --variant base --variant carry_order=false --variant carry_order=false,module_alone_share=0.5

Writes ``benchmarks/results/learner_variants.json`` (keyed ``model/algo/samples/variant``, merged with
earlier runs) and prints one line per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from devplace.fileio import write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learned_placers import MODELS, best_at, graph_and_cluster, learner, learner_options  # noqa: E402
from reproduce_papers import RESULTS  # noqa: E402


def changes(variant: str) -> dict:
    """``key=value,...`` as options (JSON values: true, 0.5, ...; anything else a string); ``base``: none. A
    comma not followed by ``key=`` stays in the value (``init=expert,metis``).

    >>> changes("init=expert,metis,fresh_share=0")
    {'init': 'expert,metis', 'fresh_share': 0}
    """
    if variant == "base":
        return {}
    out = {}
    for pair in re.split(r",(?=\w+=)", variant):
        key, _, value = pair.partition("=")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gnmt4", choices=list(MODELS))
    parser.add_argument("--algo", default="hp", choices=("colocrl", "hp"))
    parser.add_argument("--samples", type=int, default=300, help="simulated placements per variant")
    parser.add_argument("--variant", action="append", default=[], help="key=value,... or base (repeatable)")
    args = parser.parse_args(argv)
    graph, cluster = graph_and_cluster(args.model)
    path = RESULTS / "learner_variants.json"
    for variant in args.variant or ["base"]:
        options = learner_options(args.algo, "devplace", args.model) | changes(variant)
        load_before = os.getloadavg()
        run = learner(graph, cluster, args.algo, args.samples, None, options)
        quarters = {n: best_at(run["curve"], n) for n in (args.samples // 4, args.samples // 2, 3 * args.samples // 4,
                                                         args.samples)} if "curve" in run else {}
        record = run | {"variant": variant, "changes": changes(variant), "by_samples": quarters,
                        "load_average": [load_before, os.getloadavg()],
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        results = json.loads(path.read_text()) if path.exists() else {}
        results[f"{args.model}/{args.algo}/{args.samples}/{variant}"] = record
        write_text_atomic(path, json.dumps(results, indent=1, default=float) + "\n")
        print(f"{variant}: best {run.get('best_step_us', float('nan')) / 1e3:.2f} ms after {run.get('samples')} "
              f"samples in {run['seconds']} s (start {run.get('init_step_us', float('nan')) / 1e3:.2f}; by samples "
              + ", ".join(f"{n}: {v / 1e3:.2f}" for n, v in quarters.items())
              + f"; load {load_before[0]:.1f}-{os.getloadavg()[0]:.1f}) {run.get('error', '')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
