"""``make demo``: compare every placer on a bundled graph and write a report.

The bundled graph is GNMT at layer granularity from the public dnn-partitioning benchmark (a real
profile: 192 ops, forward and backward), on the 6 accelerators its file declares. The report goes
to ``out/demo/report.html``.
"""

from __future__ import annotations

import sys

import devplace as dp
from devplace.cli import app


def main(argv: list[str] | None = None) -> int:
    graph = str(dp.example_path("gnmt_layers_training.json"))
    args = ["compare", graph, "--cluster", "from-graph", "--out", "out/demo", *(argv or [])]
    try:
        app(args, standalone_mode=False)
    except SystemExit as exc:  # typer.Exit inside standalone_mode=False still arrives here
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
