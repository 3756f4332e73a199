"""Everything ``devplace compare --output DIR`` writes, linked from one report.html that opens from disk."""

from __future__ import annotations

import csv
import html
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import matplotlib

from devplace.compare import Comparison
from devplace.errors import DevplaceError
from devplace.fileio import write_text_atomic
from devplace.report import plots
from devplace.sim.trace import write_chrome_trace

CSV_COLUMNS = [
    "algorithm", "step_time_us", "speedup_vs_single", "gap_to_bound", "placement_time_s", "max_peak_memory_bytes",
    "peak_memory_bytes_per_device",
    "bytes_moved", "devices_used", "oom", "error",
]


def _csv(comparison: Comparison) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for row in comparison.rows:
        data = row.to_dict()
        data["max_peak_memory_bytes"] = max(row.peak_memory_bytes) if row.peak_memory_bytes else ""
        data["peak_memory_bytes_per_device"] = ";".join(f"{b:.0f}" for b in row.peak_memory_bytes)
        writer.writerow(["" if data[k] is None else data[k] for k in CSV_COLUMNS])
    return buffer.getvalue()


# Every file a report may hold: a new report into a folder removes those the run does not rewrite,
# so a folder never mixes two runs (the user's other files there are left alone).
REPORT_FILES = ("comparison.csv", "comparison.json", "step_times.png", "best_placement.json", "best_trace.json",
                "best_timeline.png", "best_memory.png", "best_placement.png", "report.html")
TEMP_PREFIX = ".devplace-report-"


def write_report(comparison: Comparison, out_dir: "str | Path", title: str) -> Path:
    """Write tables, plots and report.html into ``out_dir``; returns the report's path.

    Everything is written into a fresh hidden folder beside ``out_dir`` first, then moved in, and
    the files of an earlier report that this one does not hold are removed: a failed run changes
    nothing, a finished one leaves exactly its own files. Temporary folders of runs that were killed
    are removed by the next run."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DevplaceError(f"cannot write the report into {str(out)!r}: it is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DevplaceError(f"cannot create the report folder {str(out)!r}: {exc.strerror}") from None
    _remove_stale_temporaries(out.parent)
    staging = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=out.parent))
    try:
        with matplotlib.rc_context({"text.parse_math": False}):  # a "$" in a cluster or op name is text
            written = _write_all(comparison, staging, title)
        for name in REPORT_FILES:
            if name not in written:
                (out / name).unlink(missing_ok=True)
        for name in written:
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / "report.html"


def _remove_stale_temporaries(folder: Path) -> None:
    """Remove report temporary folders whose process is gone (killed before it could clean up)."""
    for entry in folder.glob(f"{TEMP_PREFIX}*"):
        pid = entry.name[len(TEMP_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_all(comparison: Comparison, out: Path, title: str) -> list[str]:
    """Write the report's files into ``out`` (a fresh folder); their names."""
    rows = comparison.rows
    write_text_atomic(out / "comparison.csv", _csv(comparison))
    write_text_atomic(out / "comparison.json", json.dumps([r.to_dict() for r in rows], indent=2))
    plots.step_time_bars(rows, out / "step_times.png", title)
    files = {"step_times.png": "simulated step time per placer"}
    written = ["comparison.csv", "comparison.json", "step_times.png"]
    best = comparison.best
    if best is not None:
        result = comparison.results[best.algorithm]
        comparison.placements[best.algorithm].save(out / "best_placement.json", comparison.graph)
        write_chrome_trace(result, out / "best_trace.json")
        label = f"{best.algorithm} on {comparison.cluster.name}"
        plots.gantt(result, out / "best_timeline.png", f"timeline of the best placement: {label}")
        plots.memory_over_time(result, out / "best_memory.png", f"memory per device: {label}")
        plots.placement_picture(result, out / "best_placement.png", f"ops coloured by device: {label}")
        files |= {
            "best_timeline.png": "timeline of the best placement",
            "best_memory.png": "memory over time per device",
            "best_placement.png": "the placement",
        }
        written += ["best_placement.json", "best_trace.json", *list(files)[1:]]
    write_text_atomic(out / "report.html", _html(comparison, title, files))
    return written + ["report.html"]


def _bound_sentence(comparison: Comparison) -> str:
    """What "gap to bound" is measured against."""
    bound = comparison.lower_bound
    if bound is None:
        return "No certified lower bound: memory alone shows that no placement fits."
    return (f"Gap to bound: step time over a certified lower bound of {bound['best_us'] / 1e3:.3f} ms "
            f"({bound['best'].removesuffix('_us').replace('_', ' ')} bound, devplace.bounds), minus one: "
            f"no placement can be faster than the bound.")


def _path_sentence(comparison: Comparison) -> str:
    """What the best placement's step is made of (``SimResult.critical_path_split_us``)."""
    if comparison.best is None:
        return ""
    algorithm = comparison.best.algorithm
    return f" The best placement ({algorithm}): {comparison.results[algorithm].critical_path_sentence()}"


def _html(comparison: Comparison, title: str, images: dict[str, str]) -> str:
    g, c = comparison.graph, comparison.cluster
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in (
        "placer", "step time (ms)", "vs single", "gap to bound", "peak memory, max (GiB)", "moved (MiB)", "placed in (s)", "result"))
    body = []
    for row in sorted(comparison.rows, key=lambda r: (r.step_time_us is None, r.step_time_us or 0)):
        if row.error:
            cells = [row.algorithm, "-", "-", "-", "-", "-", "-", row.error]
        else:
            cells = [
                row.algorithm, f"{row.step_time_us / 1e3:.3f}",
                f"{row.speedup_vs_single:.2f}x" if row.speedup_vs_single else "-",
                f"{100 * row.gap_to_bound:.1f}%" if row.gap_to_bound is not None else "-",
                f"{max(row.peak_memory_bytes) / 2**30:.2f}", f"{row.bytes_moved / 2**20:.1f}",
                f"{row.placement_time_s:.2f}", "out of memory" if row.oom else "ok",
            ]
        best = comparison.best is not None and row is comparison.best
        body.append(f"<tr{' class=best' if best else ''}>" + "".join(f"<td>{esc(str(x))}</td>" for x in cells) + "</tr>")
    figures = "".join(
        f'<figure><img src="{esc(name)}" alt="{esc(caption)}"><figcaption>{esc(caption)}</figcaption></figure>'
        for name, caption in images.items()
    )
    links = ['<a href="comparison.csv">comparison.csv</a>', '<a href="comparison.json">comparison.json</a>']
    if comparison.best is not None:
        links += ['<a href="best_placement.json">best_placement.json</a>',
                  '<a href="best_trace.json">best_trace.json</a> (open in ui.perfetto.dev or chrome://tracing)']
    devices = ", ".join(f"{d.name} ({d.kind}, {d.memory_bytes / 2**30:.1f} GiB)" for d in c.devices)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
td:first-child, td:last-child, th:first-child {{ text-align: left; }}
tr.best {{ background: #e6f4e6; font-weight: bold; }} figure {{ margin: 1.5em 0; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>{esc(title)}</h1>
<p>Graph: {g.n_ops} ops, {g.n_edges} edges. Cluster <b>{esc(c.name)}</b>: {esc(devices)}; communication model {esc(c.comm_model)}.</p>
<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>
<p>{esc(_bound_sentence(comparison))}{esc(_path_sentence(comparison))}</p>
<p>Files: {' · '.join(links)}</p>
{figures}
<p><small>Step times are simulated by devplace (see docs/simulator.md).</small></p>
</body></html>
"""
