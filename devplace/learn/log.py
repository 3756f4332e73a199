"""The training log of a learning placer: one CSV row per update and a PNG curve beside it.

Columns: update, wall seconds since the run began, placements simulated so far, best step time
found so far (of placements that fit), mean step time of this update's samples, the fastest of them
that fits, mean entropy per decision, and the loss.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from devplace.fileio import write_bytes_atomic, write_text_atomic

COLUMNS = ("update", "wall_s", "samples", "best_step_us", "mean_step_us", "batch_best_step_us", "entropy", "loss")


def write_log(path: "str | Path", rows: list[dict], title: str) -> tuple[Path, Path]:
    """Write ``path`` (CSV) and ``path`` with suffix .png (best and mean step time against samples)."""
    path = Path(path)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({key: row[key] for key in COLUMNS} for row in rows)
    write_text_atomic(path, text.getvalue())
    curve = path.with_suffix(".png")
    write_bytes_atomic(curve, _curve_png(rows, title))
    return path, curve


def _curve_png(rows: list[dict], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    samples = [row["samples"] for row in rows]
    best = [row["best_step_us"] / 1e3 if math.isfinite(row["best_step_us"]) else math.nan for row in rows]
    axes.plot(samples, [row["mean_step_us"] / 1e3 for row in rows], color="0.6", lw=1, label="mean of the update's samples")
    axes.plot(samples, best, color="C0", lw=2, label="best that fits so far")
    axes.set_xlabel("simulated placements")
    axes.set_ylabel("step time (ms)")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=100)
    plt.close(figure)
    return out.getvalue()
