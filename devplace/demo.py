"""``make demo``: compare every placer on a bundled graph and show the table.

The bundled graph is GNMT at layer granularity from the public dnn-partitioning benchmark (a real
profile: 192 ops, forward and backward), on the 6 accelerators its file declares.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

import devplace as dp
from devplace.cli import fmt_bytes, fmt_us
from devplace.compare import compare
from devplace.io.dnn_partitioning import cluster_for


def main(argv: list[str] | None = None) -> int:
    console = Console()
    graph = dp.load_graph(dp.example_path("gnmt_layers_training.json"))
    cluster = cluster_for(graph)
    console.print(
        f"[bold]devplace demo[/]: GNMT training graph ({graph.n_ops} ops, {graph.n_edges} edges) "
        f"on {cluster.n_devices} accelerators of {fmt_bytes(cluster.devices[0].memory_bytes)}"
    )
    comparison = compare(graph, cluster, on_row=lambda row: console.print(f"  placed with {row.algorithm}"))
    table = Table(title="simulated training step per placer")
    for column in ("placer", "step time", "vs single", "peak memory (max)", "moved", "placed in", "note"):
        table.add_column(column, justify="right" if column not in ("placer", "note") else "left")
    for row in sorted(comparison.rows, key=lambda r: (r.step_time_us is None, r.step_time_us or 0)):
        if row.error:
            table.add_row(row.algorithm, "-", "-", "-", "-", "-", row.error[:70])
            continue
        table.add_row(
            row.algorithm,
            fmt_us(row.step_time_us),
            f"{row.speedup_vs_single:.2f}x" if row.speedup_vs_single else "-",
            fmt_bytes(max(row.peak_memory_bytes)),
            fmt_bytes(row.bytes_moved),
            f"{row.placement_time_s:.2f} s",
            "OUT OF MEMORY" if row.oom else "",
        )
    console.print(table)
    best = comparison.best
    if best is not None:
        console.print(f"best: [bold]{best.algorithm}[/] at {fmt_us(best.step_time_us)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
