"""The ``devplace`` command line.

Every command answers bad input with one line on stderr and exit code 2 (no traceback; set
DEVPLACE_DEBUG=1 to see one), and writes its files through a temporary file and a rename, so a
failed command leaves nothing half-written.

One set of conventions: ``--json`` on every command prints machine-readable output; ``-o/--output``
is always the path a command writes; placer options are ``--option KEY=VALUE`` in ``place`` and
``--option ALGO.KEY=VALUE`` in ``compare``; ``-c/--cluster`` names the machine.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from devplace.errors import DevplaceError
from devplace.fileio import json_default

app = typer.Typer(
    name="devplace",
    help="Place a neural network's training step across devices: capture, simulate, place, run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# markup off: exception text, op and file names and cluster names are printed as they are (a "[/x]"
# in gloo's error text or a cluster name must neither crash the printer nor vanish); styling is
# added with Text objects (``styled``)
console = Console(markup=False)
err_console = Console(stderr=True, markup=False)

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


def styled(label: str, style: str, rest: str = "") -> Text:
    """``label`` in ``style``, then ``rest`` verbatim."""
    return Text.assemble((label, style), (" " + rest) if rest else "")


def friendly_errors(command: Callable) -> Callable:
    """Turn devplace's own errors into one line on stderr and a non-zero exit."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except DevplaceError as exc:
            if os.environ.get("DEVPLACE_DEBUG"):
                raise
            err_console.print(styled("error:", "bold red", str(exc)), highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            if os.environ.get("DEVPLACE_DEBUG"):
                raise
            err_console.print(styled("error:", "bold red", f"{exc.strerror}: {exc.filename}"), highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(130) from None
        except typer.Exit:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug: say so in one line, keep the trace on demand
            if os.environ.get("DEVPLACE_DEBUG"):
                raise
            err_console.print(
                styled("internal error", "bold red", f"({type(exc).__name__}: {exc}); "
                       f"rerun with DEVPLACE_DEBUG=1 for the traceback and report it"),
                highlight=False, soft_wrap=True,
            )
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper


def print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=json_default) + "\n")



def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.1f} us"


# ------------------------------------------------------------------ loading helpers
def is_model_target(target: str) -> bool:
    return target.startswith("zoo:") or (":" in target and target.split(":", 1)[0].endswith(".py"))


def load_graph_and_cluster(
    target: str, cluster: Optional[str], memory_fraction: Optional[float] = None, *, need_cluster: bool = True
):
    """The graph named by ``target`` and the cluster named by ``--cluster``.

    A graph file loads as it is; ``--cluster from-graph`` (the default for dnn-partitioning files)
    uses the devices that file declares. A model target (``zoo:NAME[:k=v]``, ``file.py:function``) is
    captured with roofline costs for the cluster's devices, so it needs ``--cluster``."""
    from devplace.cluster import load_cluster
    from devplace.io import load_graph
    from devplace.io.dnn_partitioning import cluster_for

    if is_model_target(target):
        if cluster in (None, "from-graph"):
            raise DevplaceError(
                f"the model target {target!r} needs --cluster NAME_OR_TOML: its devices set the roofline costs"
            )
        machine = load_cluster(cluster)
        from devplace.torchcapture import profile_target

        with err_console.status(f"capturing {target} with roofline costs for {machine.name} (can take a minute)"):
            graph = profile_target(target, cost="roofline", cluster=machine)
        err_console.print(f"captured {target}: {graph.n_ops} ops, {graph.n_edges} edges", highlight=False)
    else:
        graph = load_graph(target)
        if cluster in (None, "from-graph") and graph.meta.get("dnn_partitioning"):
            machine = cluster_for(graph)
        elif cluster in (None, "from-graph"):
            if need_cluster:
                raise DevplaceError(
                    "give --cluster NAME_OR_TOML (see `devplace clusters`); only dnn-partitioning graphs name their devices"
                )
            return graph, None
        else:
            machine = load_cluster(cluster)
    if memory_fraction is not None:
        machine = machine.with_memory_fraction(memory_fraction)
    return graph, machine


def parse_options(pairs: list[str]) -> dict:
    """``key=value`` pairs; values parsed as JSON where they can be (numbers, true/false)."""
    options = {}
    for pair in pairs:
        if "=" not in pair:
            raise DevplaceError(f"--option {pair!r} must look like key=value")
        key, value = pair.split("=", 1)
        if key.strip() == "seed":
            raise DevplaceError(f"--option {pair!r}: the seed is not a placer option, give it as --seed")
        try:
            options[key.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip().replace("-", "_")] = value
    return options


def parse_scoped_options(pairs: list[str], specs: list[str]) -> dict[str, dict]:
    """``ALGO.key=value`` pairs -> options per row of ``specs``. ALGO is a row as written in
    ``--algos`` (``m-sct+opt``) or a placer, whose every row gets the option (``m-sct`` and
    ``m-sct+opt``); an ALGO with no row in this run is refused, naming the rows."""
    from devplace.portfolio import parse_algo

    placer_of = {spec: parse_algo(spec)[0] for spec in specs}
    options: dict[str, dict] = {spec: {} for spec in specs}
    for pair in pairs:
        scope, dot, rest = pair.partition(".")
        if not dot or "=" not in rest or "=" in scope:
            raise DevplaceError(f"--option {pair!r} must look like ALGO.key=value (e.g. m-sct.threshold=0.2)")
        rows = [spec for spec in specs if scope.strip() in (spec, placer_of[spec])]
        if not rows:
            raise DevplaceError(
                f"--option {pair!r} is for {scope!r}, which is not in this run: use one of {', '.join(specs)}"
            )
        for spec in rows:
            options[spec] |= parse_options([rest])
    return options


def check_seed(seed: int, flag: str = "--seed") -> None:
    if not 0 <= seed < 2**63:
        raise DevplaceError(f"{flag} {seed} must be a whole number from 0 to 2**63-1")


def check_has_ops(graph, target: str) -> None:
    if graph.n_ops == 0:
        raise DevplaceError(f"{target!r} has no ops: there is nothing to place")


# ------------------------------------------------------------------------ commands
@app.command()
@friendly_errors
def info(
    graph_path: str = typer.Argument(..., metavar="GRAPH", help="graph file (native or dnn-partitioning JSON) or model target"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="for a model target: the cluster whose devices set its costs"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Summarise an operator graph: ops, edges, roles, memory, compute."""
    import numpy as np

    graph, _ = load_graph_and_cluster(graph_path, cluster, need_cluster=False)
    summary = graph.summary()
    meta = graph.meta
    if "cost_model" in meta:
        summary["cost_model"] = meta["cost_model"]
    if meta.get("costed_for"):
        summary["costed_for"] = {kind: spec.get("model", "") for kind, spec in meta["costed_for"].items()}
    if meta.get("cost_notes"):
        summary["cost_notes"] = meta["cost_notes"]
    fallback = meta.get("flop_fallback_ops")
    if fallback is not None and "op_flops" in meta:
        flops = np.asarray(meta["op_flops"], dtype=float)
        guessed = np.isin(np.asarray(graph.kinds, dtype=object), list(fallback))
        summary["flop_fallback"] = {"kinds": fallback, "ops": int(guessed.sum()),
                                    "flops_share": float(flops[guessed].sum() / flops.sum()) if flops.sum() else 0.0}
    if as_json:
        print_json(summary)
        return
    table = Table(title=f"{graph_path}", show_header=False)
    table.add_row("ops", str(summary["ops"]))
    table.add_row("edges", str(summary["edges"]))
    table.add_row("roles", ", ".join(f"{k} {v}" for k, v in summary["roles"].items()))
    table.add_row("colocation groups", str(summary["colocation_groups"]))
    table.add_row("persistent memory", fmt_bytes(summary["persistent_bytes"]))
    table.add_row("output bytes (sum)", fmt_bytes(summary["output_bytes"]))
    for kind, total in summary["total_compute_us"].items():
        table.add_row(f"compute on one {kind}", fmt_us(total))
    if "cost_model" in summary:
        devices = ", ".join(f"{k}: {m or 'unnamed'}" for k, m in summary.get("costed_for", {}).items())
        table.add_row("costs", summary["cost_model"] + (f" for {devices}" if devices else ""))
    for note in summary.get("cost_notes", []):
        table.add_row("cost note", note)
    if summary["fixed_cost_edges"]:
        table.add_row("edges with fixed transfer time", str(summary["fixed_cost_edges"]))
    if summary["order_only_edges"]:
        table.add_row("order-only edges", str(summary["order_only_edges"]))
    if summary.get("flop_fallback", {}).get("ops"):
        est = summary["flop_fallback"]
        shown = ", ".join(est["kinds"][:10])
        table.add_row("FLOPs estimated from shapes", f"{est['ops']} ops, {est['flops_share']:.2%} of FLOPs ({shown})")
    console.print(table)


@app.command()
@friendly_errors
def clusters(as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """List the cluster presets (copy one's TOML to make your own)."""
    from devplace.cluster import load_cluster, preset_names

    presets = [load_cluster(name) for name in preset_names()]
    if as_json:
        print_json([c.to_dict() for c in presets])
        return
    table = Table(title="cluster presets")
    for column in ("name", "devices", "memory", "comm model", "description"):
        table.add_column(column)
    for c in presets:
        kinds: dict[str, int] = {}
        for dev in c.devices:
            kinds[dev.kind] = kinds.get(dev.kind, 0) + 1
        table.add_row(
            c.name,
            " + ".join(f"{n} x {k}" for k, n in kinds.items()),
            ", ".join(sorted({fmt_bytes(d.memory_bytes) for d in c.devices})),
            c.comm_model + (f", {c.op_gap_us:g} us/op gap" if c.op_gap_us else ""),
            c.description,
        )
    console.print(table)


@app.command()
@friendly_errors
def simulate(
    graph_path: str = typer.Argument(..., metavar="GRAPH", help="graph file or model target"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="preset name, TOML path, or from-graph"),
    placement_path: Path = typer.Option(..., "--placement", "-p", help="placement JSON (from `devplace place`)"),
    memory_fraction: Optional[float] = typer.Option(None, "--memory-fraction", help="scale every device's memory"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="write a Chrome/Perfetto trace here"),
):
    """Simulate one training step of GRAPH under a placement."""
    from devplace.placement import Placement
    from devplace.sim import simulate as run_simulation
    from devplace.sim import write_chrome_trace

    graph, target = load_graph_and_cluster(graph_path, cluster, memory_fraction)
    placement = Placement.load(placement_path)
    with warnings.catch_warnings(record=True) as caught:  # e.g. a split colocation group: simulated, said once
        warnings.simplefilter("always")
        result = run_simulation(graph, target, placement)
    for warning in caught:
        err_console.print(styled("warning:", "bold yellow", str(warning.message)), highlight=False, soft_wrap=True)
    if trace is not None:
        write_chrome_trace(result, trace)
    if as_json:
        print_json(result.to_dict())
        return
    table = Table(title=f"simulated step on {target.name}: {fmt_us(result.step_time_us)}")
    for column in ("device", "busy", "utilisation", "peak memory", "memory", "sent"):
        table.add_column(column, justify="right")
    sent = result.link_bytes.sum(axis=1)
    for d, dev in enumerate(target.devices):
        over = d in result.oom_devices
        table.add_row(
            dev.name,
            fmt_us(result.busy_us[d]),
            f"{100 * result.busy_us[d] / max(result.step_time_us, 1e-12):.0f}%",
            Text(fmt_bytes(result.peak_memory_bytes[d]), style="red" if over else ""),
            fmt_bytes(dev.memory_bytes),
            fmt_bytes(sent[d]),
        )
    console.print(table)
    console.print(result.critical_path_sentence(), highlight=False, soft_wrap=True)
    for line in result.overflow_report():
        console.print(styled("out of memory:", "red", line), highlight=False, soft_wrap=True)
    if trace is not None:
        console.print(f"trace written to {trace} (open it in https://ui.perfetto.dev)")


@app.command()
@friendly_errors
def algos(as_json: bool = typer.Option(False, "--json", help="print each placer with its options as JSON")):
    """List the placing algorithms and the options each takes (`place --option KEY=VALUE`)."""
    from devplace.portfolio import available

    placers = [info.describe() for info in available().values()]
    if as_json:
        print_json(placers)
        return
    table = Table(title="placers (options: place --option KEY=VALUE)", show_lines=True)
    table.add_column("name", no_wrap=True)
    table.add_column("what it does")
    table.add_column("options (type = default: help)")
    for placer in placers:
        options = Text("\n").join(styled(o["name"], "bold", f"({o['type']} = {o['default']!r}): {o['help']}")
                                   for o in placer["options"])
        table.add_row(placer["name"], placer["summary"], options or "-")
    console.print(table)


@app.command()
@friendly_errors
def place(
    graph_path: str = typer.Argument(..., metavar="GRAPH", help="graph file or model target"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="preset name, TOML path, or from-graph"),
    algo: str = typer.Option("m-sct", "--algo", "-a", help="placer name (see `devplace algos`)"),
    option: list[str] = typer.Option([], "--option", help="placer option KEY=VALUE (repeatable)"),
    seed: int = typer.Option(0, "--seed", help="seed for every random choice"),
    memory_fraction: Optional[float] = typer.Option(None, "--memory-fraction", help="scale every device's memory"),
    output: Path = typer.Option(..., "--output", "-o", help="where to write the placement JSON"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary"),
):
    """Place GRAPH on a cluster and write the placement."""
    from devplace.portfolio import place as run_placer
    from devplace.progress import showing_progress
    from devplace.sim import simulate as run_simulation

    check_seed(seed)
    graph, target = load_graph_and_cluster(graph_path, cluster, memory_fraction)
    check_has_ops(graph, graph_path)
    with showing_progress(err_console):
        placement = run_placer(graph, target, algo=algo, seed=seed, **parse_options(option))
    placement.save(output, graph)
    result = run_simulation(graph, target, placement)
    summary = {
        "algorithm": algo,
        "placement_time_s": placement.placement_time_s,
        "step_time_us": result.step_time_us,
        "peak_memory_bytes": result.peak_memory_bytes.tolist(),
        "ops_per_device": [int((placement.devices == d).sum()) for d in range(target.n_devices)],
        "output": str(output),
    }
    if as_json:
        print_json(summary)
        return
    console.print(
        f"{algo}: simulated step {fmt_us(result.step_time_us)}, placed in {placement.placement_time_s:.2f} s, "
        f"ops per device {summary['ops_per_device']}; written to {output}"
    )


def comparison_table(comparison, title: str) -> Table:
    """Rows fastest first: step time, speed-up over the best single device, peak memory of each
    device (the largest when there are more than 4), bytes moved between devices, placement time,
    and the start of the reason a row has no placement (``failure_notes`` gives all of it)."""
    peaks = [p for row in comparison.rows for p in row.peak_memory_bytes]
    unit, scale = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20)) if peaks and max(peaks) >= s), ("KiB", 2**10))
    few = comparison.cluster.n_devices <= 4
    table = Table(title=title)
    robust = any(row.robust_median_us is not None for row in comparison.rows)
    robust_columns = ("median", "worst", "rank now/med/worst") if robust else ()
    for column in ("placer", "step time", *robust_columns, "speed-up", "gap to bound",
                   f"peak {unit} per device" if few else f"peak {unit}, largest", "moved", "placed in", "note"):
        table.add_column(column, justify="left" if column in ("placer", "note") else "right", no_wrap=True,
                         min_width=None if column == "note" else max(len(column), 12 if column == "placer" else 10),
                         max_width=52 if column == "note" else None)
    ranks = comparison.ranks()
    for row in sorted(comparison.rows, key=lambda r: (r.step_time_us is None, r.step_time_us or 0)):
        if row.error:
            reason = row.error if len(row.error) <= 36 else row.error[:35] + "…"
            table.add_row(row.algorithm, "-", *("-" for _ in robust_columns), "-", "-", "-", "-", "-",
                          styled(f"{'out of memory' if row.oom else 'failed'}:", "red", reason))
            continue
        peak = (" ".join(f"{p / scale:.2f}" for p in row.peak_memory_bytes) if few
                else f"{max(row.peak_memory_bytes) / scale:.2f}")
        robust_cells = (fmt_us(row.robust_median_us), fmt_us(row.robust_worst_us),
                        "/".join("-" if r is None else str(r) for r in ranks[row.algorithm])) if robust else ()
        table.add_row(
            row.algorithm,
            fmt_us(row.step_time_us),
            *robust_cells,
            f"{row.speedup_vs_single:.2f}x" if row.speedup_vs_single else "-",
            f"{100 * row.gap_to_bound:.1f}%" if row.gap_to_bound is not None else "-",
            peak,
            fmt_bytes(row.bytes_moved),
            f"{row.placement_time_s:.2f} s",
            Text("out of memory", "red") if row.oom else Text("best", "green") if row is comparison.best else "",
        )
    return table


@app.command()
@friendly_errors
def compare(
    target: str = typer.Argument(..., metavar="TARGET", help="graph file or model target (zoo:NAME[:k=v,...])"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="preset name, TOML path, or from-graph"),
    memory_fraction: Optional[float] = typer.Option(None, "--memory-fraction", help="scale every device's memory (Baechi: 0.3)"),
    algos: Optional[str] = typer.Option(
        None, "--algos",
        help="comma-separated placers, each ALGO[+opt][+fwd] (+opt: co-placement + fusion; +fwd: forward-op "
             "placement); default: every placer plus m-topo+opt, m-etf+opt, m-sct+opt"),
    option: list[str] = typer.Option(
        [], "--option", help="placer option ALGO.KEY=VALUE for one placer's rows or one row (repeatable)"),
    seed: int = typer.Option(0, "--seed", help="seed for every random choice"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="folder for CSV/JSON, plots, trace and report.html"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON"),
    robust: int = typer.Option(
        0, "--robust", metavar="N", help="also simulate every placement under N perturbed cost models (op and link "
        "costs scaled by seeded log-normal factors, devplace.robust) and show the median and worst step time"),
    robust_seed: int = typer.Option(0, "--robust-seed", help="seed of the perturbed cost models"),
):
    """Run the placers on one model and compare their simulated step times."""
    from devplace.compare import compare as run_compare
    from devplace.compare import default_algos
    from devplace.progress import showing_progress
    from devplace.robust import check_count

    names = [a.strip() for a in algos.split(",") if a.strip()] if algos is not None else default_algos()
    if not names:
        raise DevplaceError(f"--algos {algos!r} names no placer: give comma-separated names (see `devplace algos`)")
    check_seed(seed)
    check_seed(robust_seed, "--robust-seed")
    check_count("--robust", robust)
    options = parse_scoped_options(option, names)  # a misspelt placer fails before a long capture
    status = err_console if as_json else console
    graph, machine = load_graph_and_cluster(target, cluster, memory_fraction)
    check_has_ops(graph, target)
    finished: list[str] = []
    with showing_progress(status):
        def progress(row):
            finished.append(row.algorithm)
            took = f"placed in {row.placement_time_s:.2f} s" if row.placement_time_s is not None else "no placement"
            step = fmt_us(row.step_time_us) if row.step_time_us else "-"
            status.print(f"  [{len(finished)}/{len(names)}] {row.algorithm}: {step} ({took})", highlight=False)

        comparison = run_compare(graph, machine, names, seed=seed, options=options, on_row=progress,
                                 robust=robust, robust_seed=robust_seed)
    if output is not None:
        from devplace.report import write_report

        with status.status(f"writing the report to {output}"):
            page = write_report(comparison, output, f"{target} on {machine.name}")
    if as_json:
        print_json([row.to_dict() for row in comparison.rows])
        return
    table = comparison_table(comparison, f"{target} on {machine.name} ({graph.n_ops} ops)")
    # piped output has no width: give the table room rather than cut every column to "…"
    (console if console.is_terminal else Console(width=max(console.width, 130), markup=False)).print(table)
    for row in comparison.rows:
        if row.error and len(row.error) > 36:
            console.print(styled(f"{row.algorithm}:", "bold", row.error), highlight=False, soft_wrap=True)
    if comparison.lower_bound is not None:
        bound = comparison.lower_bound
        console.print(f"gap to bound: over a certified lower bound of {fmt_us(bound['best_us'])} "
                      f"({bound['best'].removesuffix('_us').replace('_', ' ')}; devplace.bounds)", highlight=False)
    if output is not None:
        console.print(f"report written to {page}")


@app.command()
@friendly_errors
def profile(
    target: str = typer.Argument(..., help="zoo:NAME[:key=value,...] or path/to/file.py:function"),
    output: Path = typer.Option(..., "--output", "-o", help="where to write the graph JSON"),
    cost: str = typer.Option("roofline", "--cost", help="roofline (from --cluster's device specs, the default) or measured (time each op here)"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="cluster whose device specs the roofline model uses (needed for roofline)"),
    optimizer: str = typer.Option("adam", "--optimizer", help="optimizer whose update is captured"),
    as_json: bool = typer.Option(False, "--json", help="print the graph's summary as JSON"),
    update: str = typer.Option("foreach", "--update", help="how the optimizer step runs: foreach (multi-tensor "
                               "kernels, PyTorch's GPU default), fused or per-parameter"),
):
    """Capture a model's training step as an operator graph."""
    from devplace.torchcapture import profile_target
    from devplace.cluster import load_cluster
    from devplace.io import save_graph
    from devplace.progress import showing_progress

    if cost == "roofline" and cluster is None:
        raise DevplaceError("--cost roofline (the default) needs --cluster NAME_OR_TOML (see `devplace clusters`), "
                            "whose devices' peaks set the op times; or --cost measured to time every op here")
    with showing_progress(err_console):
        graph = profile_target(
            target, cost=cost, cluster=None if cluster is None else load_cluster(cluster), optimizer=optimizer,
            update=update,
        )
    save_graph(graph, output)
    summary = graph.summary()
    if as_json:
        print_json({**summary, "output": str(output)})
        return
    console.print(f"captured {summary['ops']} ops, {summary['edges']} edges ({summary['roles']}); written to {output}")
    for note in graph.meta.get("cost_notes", []):
        err_console.print(f"note: {note}", highlight=False)


@app.command()
@friendly_errors
def run(
    target: str = typer.Argument(..., help="zoo:NAME[:key=value,...] or path/to/file.py:function"),
    placement_path: Path = typer.Option(..., "--placement", "-p", help="placement JSON (from `devplace place`)"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="cluster to simulate on (default: calibrate now)"),
    backend: str = typer.Option("local", "--backend", "-b", help="local (one process) or distributed (one per device)"),
    steps: int = typer.Option(5, "--steps", help="measured steps (median reported) after warm-up"),
    warmup: int = typer.Option(1, "--warmup", help="steps run before measuring"),
    device: list[str] = typer.Option([], "--device", "-d", help="torch device per placement device, e.g. cuda:0 (repeatable)"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds without progress before a rank counts as hung"),
    check: bool = typer.Option(False, "--check", help="also compare loss and parameters with a one-device eager step"),
    cost: str = typer.Option("executed", "--cost", help="op times to simulate with: executed (timed through this "
                             "executor on the CPU, glue included) or measured (capture's)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="write a Chrome/Perfetto trace of the simulated "
                                         "step and the last measured step here"),
):
    """Run TARGET's training step for real under a placement; measured vs simulated step time."""
    from devplace.execute import eager_reference, max_difference, prepare
    from devplace.execute import run as execute
    from devplace.execute.distributed import under_torchrun

    from devplace.execute import BACKENDS

    # every option is checked before the capture, which takes seconds
    if backend not in BACKENDS:
        raise DevplaceError(f"unknown --backend {backend!r}: use {' or '.join(BACKENDS)}")
    if steps < 1 or warmup < 0:
        raise DevplaceError(f"--steps must be >= 1 and --warmup >= 0, not {steps} and {warmup}")
    if not 0 < timeout < 1e9:
        raise DevplaceError(f"--timeout must be a number of seconds > 0, not {timeout}")
    if cost not in ("executed", "measured"):
        raise DevplaceError(f"unknown --cost {cost!r}: use executed or measured")
    if cost == "executed" and any(not d.startswith("cpu") for d in device):
        raise DevplaceError("--cost executed times ops on the CPU: use --cost measured with other devices")
    from devplace.cluster import load_cluster
    from devplace.placement import Placement

    placement = Placement.load(placement_path)
    machine = None if cluster is None else load_cluster(cluster)
    prepared = prepare(target, cost=cost)
    if cluster is None and not (backend == "distributed" and under_torchrun()):
        err_console.print("no --cluster: calibrating this machine's devices and links first (about 15 s on 2 "
                          "devices, longer with more; `devplace calibrate -o C.toml` once, then --cluster C.toml)",
                          highlight=False, soft_wrap=True)
    result = execute(target, placement, cluster=machine, backend=backend, steps=steps, warmup=warmup,
                     devices=device or None, timeout_s=timeout, prepared=prepared, timeline=trace is not None)
    if result is None:  # a torchrun rank other than 0
        return
    if trace is not None:
        from devplace.sim import write_chrome_trace

        write_chrome_trace(result.simulation, trace, measured=result.timeline)
    summary = result.to_dict()
    if check:
        worst, error = max_difference(result.outputs, eager_reference(prepared))
        summary["check"] = {"worst_output": worst, "max_relative_difference": error}
    if as_json:
        print_json(summary)
        return
    console.print(
        f"{backend} on {result.n_devices} devices: measured step {fmt_us(result.measured_step_time_us)} "
        f"(median of {steps}), simulated {fmt_us(result.simulated_step_time_us)} "
        f"({100 * summary['relative_error']:+.0f}% off), loss {result.loss:.6g}, {result.n_transfers} transfers per step",
        highlight=False,
    )
    console.print(f"measured and simulated: {result.simulated_as}", highlight=False)
    if check:
        console.print(f"largest relative difference from an eager step: {error:.2e} ({worst})")
    if trace is not None:
        console.print(f"trace of the simulated and the last measured step written to {trace} "
                      f"(open it in https://ui.perfetto.dev)")


@app.command()
@friendly_errors
def calibrate(
    output: Path = typer.Option(..., "--output", "-o", help="where to write the cluster TOML"),
    devices: int = typer.Option(2, "--devices", "-n", help="number of one-thread CPU processes to measure"),
    quick: bool = typer.Option(False, "--quick", help="fewer synthetic programs and repeats"),
    name: Optional[str] = typer.Option(None, "--name", help="cluster name (default from the host name)"),
    as_json: bool = typer.Option(False, "--json", help="print the fitted figures as JSON"),
):
    """Measure this machine's devices and links into a cluster TOML for place and simulate."""
    import statistics

    from devplace.execute.calibrate import calibrate as measure
    from devplace.execute.calibrate import cluster_toml
    from devplace.fileio import write_text_atomic

    if devices < 1:
        raise DevplaceError("--devices must be at least 1")
    measured = measure(devices, quick=quick, name=name)
    write_text_atomic(output, cluster_toml(measured))
    spec = measured.meta["calibration_spec"]
    fits = [{k: v for k, v in link.items() if k != "programs"}
            | {"programs": [{k: p[k] for k in ("program", "measured_us", "simulated_us")} for p in link["programs"]]}
            for link in measured.meta["calibration"]["links"]]
    if as_json:
        print_json({**spec, "fits": fits, "output": str(output)})
        return
    link = spec["links"].get("default", {})
    console.print(
        f"{devices} devices: {spec['devices'][0]['peak_tflops'] * 1e3:.1f} GFLOP/s, "
        f"{spec['devices'][0]['memory_bandwidth_gbps']:.1f} GB/s, executor overhead {spec['op_gap_us']:.1f} us/op"
        + (f"; link latency {link['latency_us']:.0f} us, bandwidth {link['bandwidth_bytes_per_us']:.0f} B/us, "
           f"per message {link['send_overhead_us']:.0f} us on the sender and {link['recv_overhead_us']:.0f} us on "
           f"the receiver (median error {100 * statistics.median(f['median_abs_error'] for f in fits):.0f}% over "
           f"{sum(len(f['programs']) for f in fits)} synthetic programs)" if link else "")
        + f"; written to {output}"
    )


@app.command()
@friendly_errors
def families(
    build: Optional[str] = typer.Option(None, "--build", help="capture and cache these families: NAME[,NAME] or all"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="cache folder (default $DEVPLACE_CACHE/families, "
                                          "DEVPLACE_CACHE defaulting to ~/.cache/devplace)"),
    seed: int = typer.Option(0, "--seed", help="seed of the member sample and the split"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
):
    """List the graph families (training sets of the generalizing placers); --build captures them into the cache."""
    from devplace.progress import showing_progress
    from devplace.zoo import families as fam

    check_seed(seed)
    names = fam.family_names()
    if build is not None:
        names = names if build.strip() == "all" else [n.strip() for n in build.split(",") if n.strip()]
        for name in names:
            fam.members(name, seed)  # an unknown name fails before any capture
    rows = []
    for name in names:
        train, held_out = fam.split(name, seed)
        if build is not None:
            with showing_progress(err_console):
                graphs = fam.build(name, seed, output)
        else:
            graphs = []
        every = train + held_out
        row = {"family": name, "models": sorted({m.model for m in every}), "members": len(every), "train": len(train),
               "held_out": len(held_out), "cluster": fam.default_cluster(name).name,
               "cached": sum(fam.cache_path(m, output).is_file() for m in every)}
        if graphs:
            ops = sorted(g.n_ops for g in graphs)
            row["ops"] = {"min": ops[0], "median": ops[len(ops) // 2], "max": ops[-1]}
        rows.append(row)
    if as_json:
        print_json({"cache_dir": str(output if output is not None else fam.default_cache_dir()), "seed": seed,
                    "families": rows})
        return
    table = Table(title=f"graph families (seed {seed})")
    for column in ("family", "models", "members", "train / held out", "cached", "ops min-max", "cluster"):
        table.add_column(column)
    for r in rows:
        ops = f"{r['ops']['min']:,}-{r['ops']['max']:,}" if "ops" in r else ""
        table.add_row(r["family"], ", ".join(r["models"]), str(r["members"]), f"{r['train']} / {r['held_out']}",
                      str(r["cached"]), ops, r["cluster"])
    console.print(table)


# ------------------------------------------------------------------ train: learned placers' policies
train_app = typer.Typer(help="Train a learned placer's policy once, to place unseen graphs with it later.",
                        no_args_is_help=True)
app.add_typer(train_app, name="train")


@train_app.command("placeto")
@friendly_errors
def train_placeto(
    family: Optional[str] = typer.Option(None, "--family", help="zoo graph families to train on (NAME[,NAME]; their "
                                                                 "training splits)"),
    graph: list[str] = typer.Option([], "--graph", help="a graph file or model target to train on (repeatable)"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="preset name or TOML path: its device count is "
                                          "the policy's (default with --family: each family's own cluster)"),
    samples: int = typer.Option(20000, "--samples", help="simulated placements to train for"),
    seed: int = typer.Option(0, "--seed", help="seed for every random choice"),
    option: list[str] = typer.Option([], "--option", help="Placeto option KEY=VALUE (see `devplace algos`)"),
    output: Path = typer.Option(..., "--output", "-o", help="where to write the policy (.pt)"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON summary"),
):
    """Train a Placeto policy on graph families (or graphs) for a cluster; place with --algo placeto --option policy=FILE."""
    from devplace.learn.placeto import NAME, PlacetoOptions, train_policy
    from devplace.placers.options import parse_options as parse_placer_options
    from devplace.progress import showing_progress

    check_seed(seed)
    from devplace.cluster import load_cluster

    if graph and cluster is None:
        raise DevplaceError("give --cluster for --graph (only --family has default clusters: each family's own)")
    machine = load_cluster(cluster) if cluster is not None else None
    graphs, names, machines, skipped = [], [], [], []
    if family:
        from devplace.learn.placeto import family_graphs

        graphs, names, machines, skipped = family_graphs(family.split(","), machine)
        for target in skipped:
            err_console.print(f"placeto: skipping {target}: its step cannot fit the cluster")
    for target in graph:
        loaded, _ = load_graph_and_cluster(target, cluster)
        check_has_ops(loaded, target)
        graphs.append(loaded)
        names.append(target)
        machines.append(machine)
    if not graphs:
        raise DevplaceError("give --family NAME[,NAME] or --graph GRAPH to train on")
    options = parse_placer_options(PlacetoOptions, parse_options(option), NAME)
    with showing_progress(err_console):
        figures = train_policy(graphs, machines, output, samples=samples, seed=seed, options=options,
                               meta={"trained_on": names, "skipped_cannot_fit": skipped})
    if as_json:
        print_json(figures | {"output": str(output)})
        return
    console.print(f"placeto: trained on {len(graphs)} graphs for {figures['samples_simulated']} simulated placements "
                  f"({figures['updates']} episodes, {figures['train_s']:.0f} s); written to {output}")


@train_app.command("mars-encoder")
@friendly_errors
def train_mars_encoder(
    output: Path = typer.Option(..., "--output", "-o", help="where to write the encoder (.pt)"),
    graph: list[str] = typer.Option([], "--graph", help="pre-training graphs: a graph file, data:FILE "
                                    "(bundled), family:NAME (a graph family's training split) or a model target "
                                    "(repeatable; default: the shipped encoder's corpus)"),
    cluster: str = typer.Option("baechi-4x2080", "--cluster", "-c", help="devices model targets are captured for"),
    seed: int = typer.Option(0, "--seed", help="seed of the initial weights, corruptions and graph order"),
    epochs: int = typer.Option(200, "--epochs", help="passes over the graphs (one Adam step per graph each)"),
    hidden: int = typer.Option(64, "--hidden", help="embedding width"),
    max_units: int = typer.Option(1024, "--max-units", help="units per graph, as the mars placer's max_units"),
    as_json: bool = typer.Option(False, "--json", help="print the encoder's metadata as JSON"),
):
    """Pre-train Mars's graph encoder by Deep Graph Infomax on many operator graphs (no labels)."""
    from devplace.cluster import load_cluster
    from devplace.learn.encoder import DEFAULT_CORPUS, train_encoder

    check_seed(seed)
    for name, value in (("--epochs", epochs), ("--hidden", hidden), ("--max-units", max_units)):
        if value < 1:
            raise DevplaceError(f"{name} is {value}: use 1 or more")
    report = None if as_json else (lambda line: err_console.print(line, highlight=False))
    meta = train_encoder(output, graph or DEFAULT_CORPUS, cluster=load_cluster(cluster), seed=seed, epochs=epochs,
                         hidden=hidden, max_units=max_units, report=report)
    if as_json:
        print_json({**meta, "output": str(output)})
        return
    console.print(f"pre-trained on {len(meta['graphs'])} graphs, discriminator accuracy "
                  f"{100 * meta['train_accuracy']:.1f}%; written to {output}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
