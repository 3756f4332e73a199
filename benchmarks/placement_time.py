"""Placement time of m-TOPO, m-ETF and m-SCT, beside Baechi's own code (beomyeol/baechi
commit afe7278, timed on this project's machines) and Baechi's paper (Jeon et al., SoCC 2020).

Setting as Baechi's table: random layered DAGs of 1k, 5k and 20k ops on 4 devices with ample memory
(the baechi-4x2080 preset: sequential channels, 134 us + 0.1754 us/KB per transfer). For each run it
also simulates the step time against the best single device. Graph files (e.g. the zoo's GNMT) can be
added with ``--graph PATH``; they are placed on the same cluster unless they carry their own
(dnn-partitioning files). Writes ``benchmarks/results/placement_time.json``.

    .venv/bin/python benchmarks/placement_time.py [--sizes 1000 5000 20000] [--graph FILE ...]
        [--transform coplacement fusion] [--out FILE]

Issue 15's m-SCT timing (``--msct``): m-SCT, m-ETF and m-TOPO end to end on the random DAGs and the
captured GNMT, in this tree and, graph by graph in turn, in a checkout of the code before the change
(``--before DIR``), with a digest of each placement (equal digests: the same placement), m-SCT's LP
and list schedule alone, and the LP alone by window size; writes
``benchmarks/results/placement_time_msct.json``, whose table ``--msct-table`` prints:

    .venv/bin/python benchmarks/placement_time.py --msct --before /tmp/before [--repeats 3]
    .venv/bin/python benchmarks/placement_time.py --msct-table

Issue 4's GNMT table (``--gnmt``): the 4-layer GNMT of length 40 and 50 captured with roofline costs
for baechi-4x2080 (captured once into ``benchmarks/.cache/``, or given with ``--graph``), each
placer unfused and with co-placement + fusion, with ample memory and at 30% of it; medians of
``--repeats`` runs after a warm-up, wall and CPU time, the load average beside them. Writes
``benchmarks/results/placement_time_gnmt.json``:

    .venv/bin/python benchmarks/placement_time.py --gnmt [--graph FILE ...] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import devplace as dp
from devplace.cluster import load_cluster
from devplace.fileio import write_text_atomic
from devplace.graph import GraphBuilder, OpGraph

ALGOS = ("m-topo", "m-etf", "m-sct")
RESULTS = Path(__file__).parent / "results" / "placement_time.json"


def random_layered_dag(n_ops: int, *, seed: int = 0, max_inputs: int = 3) -> OpGraph:
    """About sqrt(n) layers of about sqrt(n) ops; each op reads 1-3 ops of the layer before it.

    Compute 10-1000 us, outputs 4 KB-1 MB: transfers cost about as much as an op, as in a real step."""
    rng = np.random.default_rng(seed)
    width = max(1, int(round(np.sqrt(n_ops))))
    b = GraphBuilder(["gpu"])
    layer_of = np.arange(n_ops) // width
    out_bytes = rng.uniform(4e3, 1e6, n_ops)
    for i in range(n_ops):
        b.add_op(f"op{i}", compute_us=float(rng.uniform(10, 1000)), output_bytes=float(out_bytes[i]),
                 persistent_bytes=float(rng.uniform(0, 1e5)))
    for i in range(width, n_ops):
        lo = (layer_of[i] - 1) * width
        for j in sorted(set(rng.integers(lo, lo + width, rng.integers(1, max_inputs + 1)).tolist())):
            b.add_edge(f"op{j}", f"op{i}", bytes=float(out_bytes[j]))
    return b.build()


def variant_suffix(transforms: list[str]) -> str:
    """``--transform`` names as a placer spec suffix (``+opt`` = co-placement + fusion, ``+fwd``)."""
    chosen = set(transforms)
    if len(chosen & {"coplacement", "fusion"}) == 1:
        raise SystemExit("--transform: coplacement and fusion go together (the ALGO+opt variant)")
    return ("+opt" if "fusion" in chosen else "") + ("+fwd" if "forward_only" in chosen else "")


def bench(name: str, graph: OpGraph, cluster, algos=ALGOS, transforms: tuple[str, ...] = ()) -> dict:
    row = {"graph": name, "transforms": sorted(transforms), "ops": graph.n_ops, "edges": graph.n_edges, "devices": cluster.n_devices,
           "comm_model": cluster.comm_model}
    try:
        single = dp.place(graph, cluster, algo="single")
        row["single_step_ms"] = dp.simulate(graph, cluster, single).step_time_us / 1e3
    except dp.DevplaceError as exc:
        row["single_step_ms"] = None
        row["single_error"] = str(exc)
    for algo in algos:
        began = time.perf_counter()
        try:
            placement = dp.place(graph, cluster, algo=algo + variant_suffix(transforms))
        except dp.DevplaceError as exc:
            row[algo] = {"error": str(exc), "placement_s": time.perf_counter() - began}
            continue
        result = dp.simulate(graph, cluster, placement)
        row[algo] = {
            "placement_s": round(placement.placement_time_s, 3),
            "step_ms": result.step_time_us / 1e3,
            "devices_used": int(len(np.unique(placement.devices))),
            "peak_gib": [round(x / 2**30, 3) for x in result.peak_memory_bytes],
        }
    print(json.dumps(row))
    return row


# ------------------------------------------------------------------------------ issue 4: GNMT
GNMT_TARGETS = {"gnmt-len40": "zoo:gnmt:layers=4,seq_len=40", "gnmt-len50": "zoo:gnmt:layers=4,seq_len=50"}
GNMT_RESULTS = Path(__file__).parent / "results" / "placement_time_gnmt.json"
CACHE = Path(__file__).parent / ".cache"
AMPLE = 4.0   # as reproduce_papers.py: 4 x 8 GiB per GPU, where memory binds no placer
BAECHI_GNMT = {   # Baechi (Jeon et al., SoCC 2020), table of the optimizations' effect on m-SCT:
    # ops, placement s and step s unoptimized, then optimized
    "gnmt-len40": {"ops": 18050, "placement_s": 275.1, "step_s": 0.580,
                   "opt_ops": 542, "opt_placement_s": 1.2, "opt_step_s": 0.212},
    "gnmt-len50": {"ops": 22340, "placement_s": 406.1, "step_s": 0.793,
                   "opt_ops": 706, "opt_placement_s": 2.4, "opt_step_s": 0.267},
}


def captured_gnmt(name: str) -> OpGraph:
    """The roofline GNMT for baechi-4x2080, captured once (about a minute) into benchmarks/.cache/."""
    path = CACHE / f"placement_time_{name}.json"
    if not path.exists():
        from devplace.torchcapture import profile_target

        graph = profile_target(GNMT_TARGETS[name], cost="roofline", cluster=load_cluster("baechi-4x2080"))
        path.parent.mkdir(parents=True, exist_ok=True)
        dp.save_graph(graph, path)
    return dp.load_graph(path)


def _timed(function):
    """(result, wall s, CPU s) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _median(runs: list[tuple[float, float]]) -> dict:
    return {"wall_s": round(statistics.median(w for w, _ in runs), 4),
            "cpu_s": round(statistics.median(c for _, c in runs), 4),
            "wall_runs_s": [round(w, 4) for w, _ in runs]}


def time_placer(graph: OpGraph, cluster, algo: str, optimized: bool, repeats: int) -> dict:
    """Three timings of one placer, each the median of ``repeats`` runs after a warm-up run:

    - ``transform``: co-placement + fusion alone (``devplace.transforms.optimize``);
    - ``placer``: the placing algorithm alone, on the graph it sees (the fused one when optimized);
    - ``end_to_end``: the whole ``devplace.place`` call: transform, placer, expansion back to every
      op and the feasibility simulation (colocation and memory check on the original graph)."""
    from devplace.portfolio import available
    from devplace.transforms import optimize

    flags = {"coplacement": optimized, "fusion": optimized}
    spec = algo + ("+opt" if optimized else "")
    row: dict = {"algo": algo, "optimized": optimized}
    try:
        placement = dp.place(graph, cluster, algo=spec)           # warm-up (numba caches)
    except dp.DevplaceError as exc:
        return row | {"error": str(exc)}
    seen = optimize(graph, **flags).graph if optimized else graph
    function = available()[algo].function
    transform, placer, end_to_end = [], [], []
    for _ in range(repeats):
        if optimized:
            transform.append(_timed(lambda: optimize(graph, **flags))[1:])
        placer.append(_timed(lambda: function(seen, cluster, seed=0))[1:])
        placement, wall, cpu = _timed(lambda: dp.place(graph, cluster, algo=spec))
        end_to_end.append((wall, cpu))
    result = dp.simulate(graph, cluster, placement)
    row |= {"ops_placed": seen.n_ops, "placer": _median(placer), "end_to_end": _median(end_to_end),
            "step_ms": round(result.step_time_us / 1e3, 3),
            "devices_used": int(len(np.unique(placement.devices))),
            "peak_gib": [round(x / 2**30, 3) for x in result.peak_memory_bytes]}
    if optimized:
        row["transform"] = _median(transform)
    for key in ("lp_status", "lp_makespan_us", "favorite_children"):
        if key in placement.options:
            row[key] = placement.options[key]
    return row


MEMORY_SETTINGS = {"ample": AMPLE, "1.0": 1.0, "0.3": 0.3}


def gnmt_table(graphs: dict[str, OpGraph], repeats: int, out: Path, memory_settings=tuple(MEMORY_SETTINGS)) -> None:
    """Issue 4's figures for each graph, memory setting, placer and mode, written to ``out``."""
    from devplace.transforms import optimize

    base = load_cluster("baechi-4x2080")
    rows = []
    for name, graph in graphs.items():
        fused = optimize(graph, coplacement=True, fusion=True).graph
        for memory in memory_settings:
            cluster = base.with_memory_fraction(MEMORY_SETTINGS[memory])
            try:
                single = dp.simulate(graph, cluster, dp.place(graph, cluster, algo="single")).step_time_us / 1e3
            except dp.DevplaceError:
                single = None
            for optimized in (False, True):
                for algo in ALGOS:
                    load = os.getloadavg()[0]
                    row = {"graph": name, "ops": graph.n_ops, "fused_ops": fused.n_ops, "memory": memory,
                           "single_step_ms": single, "load_1min_before": round(load, 2)}
                    row |= time_placer(graph, cluster, algo, optimized, repeats)
                    row["load_1min_after"] = round(os.getloadavg()[0], 2)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count()},
        "cluster": f"baechi-4x2080; memory 'ample' = x{AMPLE}, '1.0' = the 8 GiB cards, '0.3' = 30% of each",
        "repeats": repeats, "baechi_m_sct": BAECHI_GNMT, "rows": rows,
    }, indent=1))


def gnmt_markdown(path: Path, before: Path | None = None) -> str:
    """The BENCHMARKS.md table from a ``--gnmt`` results file (and optionally an earlier run's)."""
    def load(p):
        return {(r["graph"].removeprefix("placement_time_"), r["memory"], r["algo"], r["optimized"]): r
                for r in json.loads(p.read_text())["rows"]}

    def seconds(row, part):
        if row is None or "error" in row:
            return "-"
        return f"{row[part]['cpu_s']:.3f} ({row[part]['wall_s']:.2f})"

    now, then = load(path), (load(before) if before else {})
    lines = ["| GNMT | memory | placer | ops placed | unfused: placer / end-to-end s | step ms "
             "| + co-placement + fusion: transform / placer / end-to-end s | step ms "
             "| before this change, end-to-end s: unfused / optimized |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (graph, memory, algo, optimized), plain in now.items():
        if optimized:
            continue
        fused = now.get((graph, memory, algo, True))
        if "error" in plain and (fused is None or "error" in fused):
            lines.append(f"| {graph} | {memory} | {algo} | {plain['ops']:,} / {plain['fused_ops']:,} "
                         f"| does not fit | | does not fit | | |")
            continue
        old = [then.get((graph, memory, algo, flag)) for flag in (False, True)]
        step = [f"{r['step_ms']:.0f}" if r and "error" not in r else "-" for r in (plain, fused)]
        lines.append(
            f"| {graph} | {memory} | {algo} | {plain['ops']:,} / {plain['fused_ops']:,} "
            f"| {seconds(plain, 'placer')} / {seconds(plain, 'end_to_end')} | {step[0]} "
            f"| {seconds(fused, 'transform')} / {seconds(fused, 'placer')} / {seconds(fused, 'end_to_end')} "
            f"| {step[1]} | {seconds(old[0], 'end_to_end')} / {seconds(old[1], 'end_to_end')} |")
    return "\n".join(lines)


# ------------------------------------------------------------- issue 15: m-SCT fast on any graph
MSCT_RESULTS = Path(__file__).parent / "results" / "placement_time_msct.json"


MSCT_ALGOS = ("m-sct", "m-etf", "m-topo")


def msct_graphs(names: list[str]) -> dict[str, OpGraph]:
    """``random-layered-N`` (the random layered DAG of N ops) or a GNMT_TARGETS name, by name."""
    return {name: random_layered_dag(int(name.rsplit("-", 1)[1])) if name.startswith("random-layered-")
            else captured_gnmt(name) for name in names}


def placement_digest(placement) -> str:
    """A short hash of a placement's devices and order: equal digests, equal placements."""
    data = np.ascontiguousarray(placement.devices, dtype=np.int64).tobytes()
    data += np.ascontiguousarray(placement.priority, dtype=np.float64).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def msct_parts(graph: OpGraph, cluster, repeats: int) -> dict:
    """m-SCT's two stages alone (median CPU s): the favorite-child LP and the list schedule."""
    from devplace.placers._listsched import op_times_us, run_list_schedule
    from devplace.placers._lp import round_favorites, solve_favorite_lp
    from devplace.placers.m_sct import lp_edge_us

    p, cost = op_times_us(graph, cluster).mean(axis=1), lp_edge_us(graph, cluster)
    lp = [_timed(lambda: solve_favorite_lp(graph, p, cost)) for _ in range(repeats)]
    favorite = round_favorites(graph.edge_src, graph.edge_dst, lp[-1][0][0], graph.n_ops)
    listed = [_timed(lambda: run_list_schedule(graph, cluster, algo="m-sct", favorite=favorite))
              for _ in range(repeats)]
    return {"lp_cpu_s": round(statistics.median(c for *_, c in lp), 4),
            "list_schedule_cpu_s": round(statistics.median(c for *_, c in listed), 4)}


def msct_rows(names: list[str], repeats: int) -> list[dict]:
    """m-SCT, m-ETF and m-TOPO end to end (``devplace.place``, ample memory) on the named graphs:
    median wall and CPU seconds of ``repeats`` runs after a warm-up, the load beside them, the
    placement's digest and step; for m-SCT also its LP's status and its two stages alone."""
    cluster = load_cluster("baechi-4x2080").with_memory_fraction(1000.0)
    for algo in MSCT_ALGOS:
        dp.place(random_layered_dag(50, seed=1), cluster, algo=algo)      # compile outside the timings
    rows = []
    for name, graph in msct_graphs(names).items():
        for algo in MSCT_ALGOS:
            load = os.getloadavg()[0]
            runs = [_timed(lambda: dp.place(graph, cluster, algo=algo)) for _ in range(repeats + 1)][1:]
            placement = runs[-1][0]
            row = {"graph": name, "algo": algo, "ops": graph.n_ops, "edges": graph.n_edges,
                   **_median([(wall, cpu) for _, wall, cpu in runs]),
                   "load_1min_before": round(load, 2), "load_1min_after": round(os.getloadavg()[0], 2),
                   "placement_sha256": placement_digest(placement),
                   "step_ms": round(dp.simulate(graph, cluster, placement).step_time_us / 1e3, 3)}
            if algo == "m-sct":
                row |= {"lp_status": placement.options["lp_status"],
                        "favorite_children": placement.options["favorite_children"],
                        **msct_parts(graph, cluster, repeats)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def lp_rows(n_ops: int, whole_ops: int) -> list[dict]:
    """The favorite-child LP alone (CPU s): on ``n_ops`` ops with today's windows and with the
    former 2,500-op windows, and on ``whole_ops`` ops solved whole and in today's windows."""
    from devplace.placers._listsched import op_times_us
    from devplace.placers._lp import solve_favorite_lp
    from devplace.placers.m_sct import lp_edge_us

    cluster = load_cluster("baechi-4x2080").with_memory_fraction(1000.0)
    rows = []
    for n, window_ops, label in ((n_ops, None, "windows by columns"), (n_ops, 2500, "2,500-op windows"),
                                 (whole_ops, None, "windows by columns"), (whole_ops, whole_ops, "whole")):
        graph = random_layered_dag(n)
        p, cost = op_times_us(graph, cluster).mean(axis=1), lp_edge_us(graph, cluster)
        (x, _, makespan, status), wall, cpu = _timed(lambda: solve_favorite_lp(graph, p, cost, window_ops=window_ops))
        rows.append({"ops": n, "windows": label, "status": status, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
                     "lp_makespan_us": makespan, "favorites": int((x <= 0.1).sum())})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def msct_table(before: Path | None, names: list[str], repeats: int, out: Path) -> None:
    """Issue 15's figures in this tree and, in a subprocess, in the ``before`` tree (a checkout of
    the code before the change), graph by graph in turn so both see the same load."""
    now, then = [], [] if before is not None else None
    for name in names:
        now += msct_rows([name], repeats)
        if before is not None:
            worker = subprocess.run(
                [sys.executable, __file__, "--msct-worker", json.dumps({"names": [name], "repeats": repeats})],
                env=os.environ | {"PYTHONPATH": str(before.resolve())}, capture_output=True, text=True, check=True)
            then += json.loads(worker.stdout.strip().splitlines()[-1])
    sizes = [int(n.rsplit("-", 1)[1]) for n in names if n.startswith("random-layered-")]
    lp = lp_rows(max(sizes), 5000) if sizes else []
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps({
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)},
        "cluster": "baechi-4x2080 with 1000x memory", "repeats": repeats,
        "before_tree": str(before) if before else None, "baechi_code_s": {"20000": 45.0},
        "now": now, "before": then, "lp": lp,
    }, indent=1))


def msct_markdown(path: Path) -> str:
    """The BENCHMARKS.md table from a ``--msct`` results file: CPU s (wall), now beside before."""
    results = json.loads(path.read_text())
    before = {(r["graph"], r["algo"]): r for r in results["before"] or []}

    def seconds(row):
        return f"{row['cpu_s']:.2f} ({row['wall_s']:.2f})" if row else "-"

    def parts(row):
        return f"{row['lp_cpu_s']:.2f} / {row['list_schedule_cpu_s']:.2f}" if row and "lp_cpu_s" in row else ""

    lines = ["| graph | ops | placer | now: CPU s (wall) | before | m-SCT's LP / list schedule CPU s: now "
             "| before | same placement | step ms | load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["now"]:
        old = before.get((row["graph"], row["algo"]))
        same = "-" if old is None else ("yes" if old["placement_sha256"] == row["placement_sha256"] else "NO")
        lines.append(f"| {row['graph']} | {row['ops']:,} | {row['algo']} | {seconds(row)} | {seconds(old)} "
                     f"| {parts(row)} | {parts(old)} | {same} | {row['step_ms']:.0f} "
                     f"| {row['load_1min_before']:.1f}-{row['load_1min_after']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 5000, 20000])
    parser.add_argument("--graph", nargs="*", default=[], help="graph files to place as well")
    parser.add_argument("--cluster", default="baechi-4x2080")
    parser.add_argument("--transform", nargs="*", default=[], choices=["coplacement", "fusion", "forward_only"],
                        help="Baechi's graph optimizations to apply before placing")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--gnmt", action="store_true", help="issue 4's GNMT table (see the module docstring)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure with --gnmt (median)")
    parser.add_argument("--memory", nargs="*", default=list(MEMORY_SETTINGS), choices=list(MEMORY_SETTINGS),
                        help="memory settings with --gnmt: ample (x4), 1.0 (8 GiB cards), 0.3 (Baechi's 30%%)")
    parser.add_argument("--table", nargs="*", type=Path, default=None, metavar="RESULTS [BEFORE]",
                        help="print the markdown table of a --gnmt results file (beside an earlier run's)")
    parser.add_argument("--msct", action="store_true",
                        help="issue 15: m-SCT end to end on the random DAGs (--sizes) and GNMT, beside --before")
    parser.add_argument("--before", type=Path, default=None,
                        help="with --msct: a checkout of the code before the change, timed in the same run")
    parser.add_argument("--msct-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--msct-table", nargs="?", type=Path, const=MSCT_RESULTS, default=None, metavar="RESULTS",
                        help="print the markdown table of a --msct results file")
    args = parser.parse_args()
    if args.msct_worker is not None:     # the --before side of --msct, in the before tree
        spec = json.loads(args.msct_worker)
        print(json.dumps(msct_rows(spec["names"], spec["repeats"])))
        return
    if args.msct:
        names = [f"random-layered-{n}" for n in args.sizes] + list(GNMT_TARGETS)
        msct_table(args.before, names, args.repeats, args.out or MSCT_RESULTS)
        return
    if args.msct_table is not None:
        print(msct_markdown(args.msct_table))
        return
    if args.table is not None:
        print(gnmt_markdown(*(args.table or [GNMT_RESULTS])))
        return
    if args.gnmt:
        graphs = {Path(p).stem.removeprefix("placement_time_"): dp.load_graph(p) for p in args.graph} or \
            {name: captured_gnmt(name) for name in GNMT_TARGETS}
        gnmt_table(graphs, args.repeats, args.out or GNMT_RESULTS, args.memory)
        return
    args.out = args.out or RESULTS
    cluster = load_cluster(args.cluster).with_memory_fraction(1000.0)   # ample memory
    transforms = tuple(args.transform)
    variant_suffix(transforms)   # refuse a combination no spec names before any work
    # compile once outside the timings, as a long-lived process would
    bench("warm-up", random_layered_dag(50, seed=1), cluster)
    rows = [bench(f"random-layered-{n}", random_layered_dag(n), cluster, transforms=transforms) for n in args.sizes]
    for path in args.graph:
        graph = dp.load_graph(path)
        graph_cluster = cluster
        if "dnn_partitioning" in graph.meta:
            from devplace.io.dnn_partitioning import cluster_for
            graph_cluster = cluster_for(graph)
        rows.append(bench(Path(path).name, graph, graph_cluster, transforms=transforms))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
        "cluster": args.cluster + " with 1000x memory (graph files with their own devices keep them)",
        "transforms": args.transform,
        "baechi_code_s": {"1000": [0.04, 0.48, 0.64], "5000": [0.28, 2.2, 3.3], "20000": [1.0, 8.4, 45.0]},
        "rows": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
