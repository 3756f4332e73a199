"""``make demo``: compare every placer on a 4-layer GNMT and write a report.

GNMT as Baechi ran it (4 LSTM layers of 512 units, vocabulary 30000, batch 128, length 40; 24,787
ops) captured from PyTorch with roofline costs for the RTX 2080s of ``baechi-4x2080`` (Baechi's
testbed), then every placer, and Baechi's three with their optimizations (``+opt``), placed and
simulated on that cluster. 1.5-3 minutes on a shared 2-core machine (capture 25-45 s, sim-search's
up to 4 rounds of 2000 evaluations 60-140 s by the load, the rest ~20 s; BENCHMARKS.md "Demo"). The report goes to
``out/demo/report.html``.
"""

from __future__ import annotations

import sys

from devplace.cli import app

TARGET = "zoo:gnmt:layers=4,seq_len=40"
CLUSTER = "baechi-4x2080"


def main(argv: list[str] | None = None) -> int:
    args = ["compare", TARGET, "--cluster", CLUSTER, "--output", "out/demo", *(argv or [])]
    try:
        app(args, standalone_mode=False)
    except SystemExit as exc:  # typer.Exit inside standalone_mode=False still arrives here
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
